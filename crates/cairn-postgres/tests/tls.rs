//! TLS to PostgreSQL with libpq's `sslmode` and `sslrootcert`, against two
//! clusters this test makes with `initdb` and starts on free ports: one
//! that takes only TLS connections (its `pg_hba.conf` rejects the others),
//! with a certificate from the test authority in `testdata/tls/` for
//! `localhost` and 127.0.0.1 (and listening on 127.0.0.2 too, a name the
//! certificate does not carry), and one without TLS. The server on 5432
//! that the other tests use is left as it is.
//!
//! Needs PostgreSQL's server programs; without them the test says it was
//! skipped, unless `CAIRN_TEST_PG` is set (as in CI), where it fails.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn_postgres::PgBackend;
use cairn_store::prelude::*;
use cairn_store::{StoreError, Topic};

const CA: &str = include_str!("../../../testdata/tls/ca.pem");
const LEAF: &str = include_str!("../../../testdata/tls/leaf.pem");
const LEAF_KEY: &str = include_str!("../../../testdata/tls/leaf.key");
const STRANGER: &str = include_str!("../../../testdata/tls/stranger.pem");

/// PostgreSQL's server programs: `pg_config --bindir`, else the newest of
/// Debian's `/usr/lib/postgresql/<version>/bin`.
fn server_bin() -> Option<PathBuf> {
    let has_initdb = |d: &Path| d.join("initdb").is_file().then(|| d.to_path_buf());
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if let Some(d) = has_initdb(&dir) {
            return Some(d);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            Some((v, has_initdb(&e.path().join("bin"))?))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, d)| d)
}

/// The user the server runs as: PostgreSQL refuses root, so as root the
/// `postgres` account's ids; otherwise our own (`None`).
fn server_user() -> Option<(u32, u32)> {
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = std::ffi::CString::new("postgres").unwrap();
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !pw.is_null(),
        "running as root, and there is no `postgres` account to run the test clusters as"
    );
    Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A cluster of our own, stopped (and its files removed) when dropped.
struct Cluster {
    port: u16,
    server: Child,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn start(bin: &Path, tls: bool) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let user = server_user();
        let as_server = |cmd: &mut Command| {
            if let Some((uid, gid)) = user {
                cmd.uid(uid).gid(gid);
            }
            // The server goes with the test, even if the test is killed.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                    Ok(())
                });
            }
        };
        let own = |p: &Path| {
            if let Some((uid, gid)) = user {
                std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
            }
        };
        own(dir.path());
        let data = dir.path().join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .args([
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "--auth=trust",
            ])
            .args(["--no-sync", "--no-instructions"])
            .stdout(Stdio::null());
        as_server(&mut initdb);
        let out = initdb.output().unwrap();
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut args: Vec<String> = vec![
            "-D".into(),
            data.to_str().unwrap().into(),
            "-c".into(),
            format!("unix_socket_directories={}", dir.path().display()),
            "-c".into(),
            "fsync=off".into(),
        ];
        let hba = if tls {
            let (cert, key) = (dir.path().join("server.pem"), dir.path().join("server.key"));
            std::fs::write(&cert, LEAF).unwrap();
            std::fs::write(&key, LEAF_KEY).unwrap();
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
            own(&cert);
            own(&key);
            args.extend([
                "-c".into(),
                "listen_addresses=127.0.0.1,127.0.0.2".into(),
                "-c".into(),
                "ssl=on".into(),
                "-c".into(),
                format!("ssl_cert_file={}", cert.display()),
                "-c".into(),
                format!("ssl_key_file={}", key.display()),
            ]);
            "local all all trust\n\
             hostnossl all all 0.0.0.0/0 reject\n\
             hostssl all all 127.0.0.0/8 trust\n"
        } else {
            args.extend([
                "-c".into(),
                "listen_addresses=127.0.0.1".into(),
                "-c".into(),
                "ssl=off".into(),
            ]);
            "local all all trust\nhost all all 127.0.0.0/8 trust\n"
        };
        std::fs::write(data.join("pg_hba.conf"), hba).unwrap();
        own(&data.join("pg_hba.conf"));
        // A port taken between our look and the server's bind: try another.
        for _ in 0..5 {
            let port = free_port();
            let mut cmd = Command::new(bin.join("postgres"));
            cmd.args(&args)
                .args(["-p", &port.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            as_server(&mut cmd);
            let mut server = cmd.spawn().unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Ok(Some(_)) = server.try_wait() {
                    break;
                }
                let ready = Command::new(bin.join("pg_isready"))
                    .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q"])
                    .status()
                    .is_ok_and(|s| s.success());
                if ready {
                    return Cluster {
                        port,
                        server,
                        _dir: dir,
                    };
                }
                assert!(
                    Instant::now() < deadline,
                    "the test cluster did not start in 30 s"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!("the test cluster did not start on any of five ports");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        unsafe { libc::kill(self.server.id() as i32, libc::SIGTERM) };
        let _ = self.server.wait();
    }
}

/// Opens a store and uses both kinds of connection: the pool (the schema's
/// migration, a read) and the wake-up connection (a LISTEN that hears a
/// NOTIFY sent through the pool).
fn open(url: &str) -> Result<(), StoreError> {
    let b = PgBackend::open(url)?;
    let run = cairn_events::RunId::parse("tls").unwrap();
    let _ = b.last_seq(&run)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut l = b.listen(Topic::Inbox("tls")).unwrap();
        b.notify(Topic::Inbox("tls"));
        tokio::time::timeout(Duration::from_secs(10), l.wait())
            .await
            .expect("the wake-up connection hears its store");
    });
    Ok(())
}

fn refused(url: &str, because: &[&str]) {
    let err = open(url).expect_err(url).to_string();
    eprintln!("refused as expected: {url}: {err}");
    assert!(
        because.iter().any(|b| err.contains(b)),
        "{url}: expected one of {because:?} in: {err}"
    );
}

#[test]
fn sslmodes_mean_what_libpq_means() {
    let Some(bin) = server_bin() else {
        assert!(
            std::env::var_os("CAIRN_TEST_PG").is_none(),
            "PostgreSQL's server programs (initdb) were not found, and CAIRN_TEST_PG is set: \
             CI must install them"
        );
        eprintln!("skipped: PostgreSQL's server programs (initdb) were not found");
        return;
    };
    let files = tempfile::tempdir().unwrap();
    let ca = files.path().join("ca.pem");
    let stranger = files.path().join("stranger.pem");
    std::fs::write(&ca, CA).unwrap();
    std::fs::write(&stranger, STRANGER).unwrap();
    let (ca, stranger) = (ca.display(), stranger.display());

    let tls = Cluster::start(&bin, true);
    let url = |host: &str, query: &str| {
        format!("postgres://postgres@{host}:{}/postgres?{query}", tls.port)
    };
    // The cluster takes TLS only, so every success below was encrypted.
    refused(
        &url("127.0.0.1", "sslmode=disable"),
        &["no encryption", "pg_hba.conf"],
    );
    open(&url("127.0.0.1", "")).expect("prefer, the default, uses the server's TLS");
    open(&url("127.0.0.1", "sslmode=prefer")).expect("prefer");
    open(&url("127.0.0.1", "sslmode=require"))
        .expect("require encrypts without checking the certificate");
    open(&url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .expect("verify-full by name, with the authority as root");
    open(&url(
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .expect("verify-full by address, which the certificate carries");
    open(&url(
        "127.0.0.2",
        &format!("sslmode=verify-ca&sslrootcert={ca}"),
    ))
    .expect("verify-ca does not compare the name");
    refused(
        &url(
            "127.0.0.2",
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ),
        &["NotValidForName", "not valid for name"],
    );
    refused(
        &url(
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={stranger}"),
        ),
        &["UnknownIssuer", "unknown issuer"],
    );
    refused(
        &url(
            "localhost",
            &format!("sslmode=verify-ca&sslrootcert={stranger}"),
        ),
        &["UnknownIssuer", "unknown issuer"],
    );
    // With a root given, require checks the chain as libpq does.
    refused(
        &url(
            "localhost",
            &format!("sslmode=require&sslrootcert={stranger}"),
        ),
        &["UnknownIssuer", "unknown issuer"],
    );
    // The machine's roots do not hold the test authority.
    refused(
        &url("localhost", "sslmode=verify-full"),
        &["UnknownIssuer", "unknown issuer", "certificate"],
    );
    refused(
        &url(
            "localhost",
            "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
        ),
        &["/nonexistent/ca.pem"],
    );
    // libpq's key=value form.
    open(&format!(
        "host=localhost port={} user=postgres dbname=postgres sslmode=verify-full sslrootcert='{ca}'",
        tls.port
    ))
    .expect("key=value with verify-full");

    let plain = Cluster::start(&bin, false);
    let url = |query: &str| {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?{query}",
            plain.port
        )
    };
    refused(&url("sslmode=require"), &["TLS", "tls", "SSL", "ssl"]);
    refused(
        &url(&format!("sslmode=verify-full&sslrootcert={ca}")),
        &["TLS", "tls", "SSL", "ssl"],
    );
    open(&url("")).expect("prefer falls back to plain text");
    open(&url("sslmode=disable")).expect("disable");
}
