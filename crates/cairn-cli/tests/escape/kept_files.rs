//! Everything Cairn keeps (the store and its WAL, shared memory, journal,
//! locks and wake-up markers, the NDJSON mirrors, the workspace snapshot
//! repository) is out of every node's reach in every layout: the store in
//! the sandbox root itself (`--store cairn.db`), in a folder of the root
//! (`--store .cairn/cairn.db`), beside the root in a folder the workflow
//! shows read-only, and PostgreSQL with and without a mirror folder. A
//! command node and a `bash` call each try to list, read and write every
//! kept path; the host then checks that nothing of theirs arrived and that
//! what they were refused was really there.

use super::common::wait_exit;
use super::{ended, sandbox_available};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One way of keeping a store, and the paths it keeps.
struct Layout {
    name: &'static str,
    /// `--store ...` and the like.
    args: Vec<String>,
    /// Every path this layout keeps that a node must not reach.
    kept: Vec<PathBuf>,
    /// Paths the host checks hold something after the run, so that a node
    /// seeing them empty proves they were covered.
    full: Vec<PathBuf>,
    /// The PostgreSQL database, dropped at the end.
    pg: Option<(&'static str, String)>,
}

/// The temporary folders of one layout's run: `top/root` is the sandbox
/// root, `top/state` a folder beside it. Under the build's folder rather
/// than `/tmp`, so that the workflow can show `top` read-only (a private
/// `/tmp` would hide a store beside the root whatever Cairn does).
struct Place {
    _tmp: tempfile::TempDir,
    top: PathBuf,
    root: PathBuf,
}

impl Place {
    fn new() -> Place {
        let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let top = tmp.path().canonicalize().unwrap();
        let root = top.join("root");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(top.join("state")).unwrap();
        Place {
            _tmp: tmp,
            top,
            root,
        }
    }
}

/// The SQLite files of a store at `db` and the folders beside it.
fn sqlite_kept(db: &Path) -> Vec<PathBuf> {
    let dir = db.parent().unwrap();
    let mut kept = vec![db.to_path_buf()];
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        kept.push(p.into());
    }
    for sub in ["locks", "wake", "logs", "snapshots"] {
        kept.push(dir.join(sub));
    }
    kept
}

/// A shell script that tries each path and prints one `probe` line per
/// path: how many entries it lists, how many bytes it reads, whether a
/// write was refused. Then the root as `ls -la` shows it.
fn probe_script(kept: &[PathBuf]) -> String {
    let paths: Vec<String> = kept.iter().map(|p| format!("'{}'", p.display())).collect();
    format!(
        r#"for p in {}; do
  n=0; b=0; w=refused
  if [ -d "$p" ]; then
    n=$(ls -A "$p" 2>/dev/null | wc -l)
    touch "$p/cairn-probe" 2>/dev/null && w=wrote
    mkdir "$p/cairn-probe-dir" 2>/dev/null && w=wrote
  else
    b=$(head -c 4096 "$p" 2>/dev/null | wc -c)
    printf probe 2>/dev/null >> "$p" && w=appended
    b2=$(head -c 4096 "$p" 2>/dev/null | wc -c)
    [ "$b2" -gt "$b" ] && w=wrote
  fi
  echo "probe $p list=$n read=$b write=$w"
done
echo '--- ls -la of the root'
ls -la .
exit 0
"#,
        paths.join(" ")
    )
}

/// The workflow: a warm-up command (so the snapshot repository and the
/// mirror hold something), then the probe as a command and as a `bash`
/// call. `top` is shown read-only, so a store beside the root would be in
/// view if it were not hidden.
fn workflow(top: &Path, script: &str) -> String {
    let argv = serde_json::to_string(&["sh", "-c", script]).unwrap();
    format!(
        "name: kept\nsandbox:\n  read_only: [{top:?}]\nnodes:\n  - id: warm\n    command: [\"sh\", \"-c\", \"echo warm > warm.txt\"]\n  - id: c_probe\n    needs: [warm]\n    command: {argv}\n  - id: b_probe\n    needs: [c_probe]\n    tool: bash\n    args: {{ argv: {argv} }}\n",
        top = top.display().to_string()
    )
}

/// The stdout of a node's `NodeFinished`.
fn stdout_of(events: &[Value], node: &str) -> String {
    events
        .iter()
        .filter(|e| e["nodeId"] == node && e["type"] == "NodeFinished")
        .map(|e| match &e["output"] {
            Value::String(s) => s.clone(),
            o => o["stdout"].as_str().unwrap_or_default().to_string(),
        })
        .next()
        .unwrap_or_default()
}

/// Runs the layout's workflow; returns the run's events (read with
/// `cairn logs`, which works on every store).
fn run(place: &Place, layout: &Layout) -> Vec<Value> {
    let script = probe_script(&layout.kept);
    std::fs::write(place.root.join("k.yaml"), workflow(&place.top, &script)).unwrap();
    let cairn = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
        c.current_dir(&place.root)
            .args(&layout.args)
            .args(args)
            .env_remove("CAIRN_STORE")
            .env_remove("CAIRN_LOG_DIR")
            .stdin(Stdio::null());
        c
    };
    let mut child = cairn(&["run", "k.yaml", "--run-id", "k1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_exit(&mut child);
    let err = super::common::stderr_of(&mut child);
    assert!(
        status.success(),
        "{}: cairn run: {status}: {err}",
        layout.name
    );
    let out = cairn(&["logs", "k1", "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}: cairn logs: {}",
        layout.name,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// What of `layout`'s kept paths a node reached, as problems.
fn check(layout: &Layout, events: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    for node in ["c_probe", "b_probe"] {
        if ended(events, node) != "finished" {
            problems.push(format!("{}: {node} did not finish", layout.name));
            continue;
        }
        let out = stdout_of(events, node);
        for p in &layout.kept {
            let want = format!("probe {} list=0 read=0 write=", p.display());
            let line = out
                .lines()
                .find(|l| l.starts_with(&format!("probe {} ", p.display())));
            match line {
                Some(l) if l.starts_with(&want) && !l.ends_with("write=wrote") => {}
                Some(l) => problems.push(format!("{}: {node} reached it: {l}", layout.name)),
                None => problems.push(format!(
                    "{}: {node} did not probe {}",
                    layout.name,
                    p.display()
                )),
            }
        }
        if !problems.is_empty() {
            problems.push(format!("{}: {node} said:\n{out}", layout.name));
        }
    }
    // Nothing of the nodes' arrived in what Cairn keeps.
    for p in &layout.kept {
        for name in ["cairn-probe", "cairn-probe-dir"] {
            if p.join(name).exists() {
                problems.push(format!(
                    "{}: {} was created",
                    layout.name,
                    p.join(name).display()
                ));
            }
        }
        if p.to_string_lossy().ends_with("-journal") {
            let len = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
            if len != 0 {
                problems.push(format!(
                    "{}: the rollback journal {} was written",
                    layout.name,
                    p.display()
                ));
            }
        }
    }
    // What the nodes saw empty was not.
    for p in &layout.full {
        let full = if p.is_dir() {
            std::fs::read_dir(p).is_ok_and(|mut d| d.next().is_some())
        } else {
            std::fs::metadata(p).is_ok_and(|m| m.len() > 0)
        };
        if !full {
            problems.push(format!(
                "{}: {} holds nothing on the host, so its probe proves nothing",
                layout.name,
                p.display()
            ));
        }
    }
    problems
}

fn sqlite_layout(place: &Place, name: &'static str, store: &str) -> Layout {
    let db = place.root.join(store);
    let db = if Path::new(store).is_absolute() {
        PathBuf::from(store)
    } else {
        db
    };
    let dir = db.parent().unwrap().to_path_buf();
    let mut kept = sqlite_kept(&db);
    if dir != place.root && dir.starts_with(&place.root) {
        kept.insert(0, dir.clone());
    }
    Layout {
        name,
        args: vec!["--store".into(), store.into()],
        kept,
        full: vec![db, dir.join("logs"), dir.join("snapshots")],
        pg: None,
    }
}

fn check_layout(place: Place, layout: Layout) {
    let events = run(&place, &layout);
    let problems = check(&layout, &events);
    if let Some((server, db)) = &layout.pg {
        cairn_postgres::testing::drop_database(server, db);
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_store_in_the_root_itself_is_hidden_file_by_file() {
    if !sandbox_available() {
        return;
    }
    let place = Place::new();
    let layout = sqlite_layout(&place, "--store cairn.db", "cairn.db");
    check_layout(place, layout);
}

#[test]
fn a_store_folder_in_the_root_is_hidden_whole() {
    if !sandbox_available() {
        return;
    }
    let place = Place::new();
    let layout = sqlite_layout(&place, "--store .cairn/cairn.db", ".cairn/cairn.db");
    check_layout(place, layout);
}

#[test]
fn a_store_beside_the_root_is_hidden_though_its_folder_is_shown() {
    if !sandbox_available() {
        return;
    }
    let place = Place::new();
    let store = place.top.join("state/cairn.db").display().to_string();
    let layout = sqlite_layout(&place, "--store beside the root", &store);
    check_layout(place, layout);
}

/// A PostgreSQL store keeps its snapshot repository, and its mirrors unless
/// `--no-log`, in `.cairn` of the working folder (here the root).
fn pg_layout(place: &Place, name: &'static str, no_log: bool) -> Option<Layout> {
    let server = cairn_postgres::testing::server_or_skip()?;
    let db = format!(
        "cairn_kept_{}_{}",
        if no_log { "nolog" } else { "log" },
        std::process::id()
    );
    let url = cairn_postgres::testing::create_database(server, &db);
    let dot = place.root.join(".cairn");
    let mut args = vec!["--store".to_string(), url];
    let mut kept = vec![dot.clone(), dot.join("snapshots")];
    let mut full = vec![dot.join("snapshots")];
    if no_log {
        args.push("--no-log".into());
    } else {
        kept.push(dot.join("logs"));
        full.push(dot.join("logs"));
    }
    Some(Layout {
        name,
        args,
        kept,
        full,
        pg: Some((server, db)),
    })
}

#[test]
fn a_postgres_stores_mirrors_and_snapshots_are_hidden() {
    if !sandbox_available() {
        return;
    }
    let place = Place::new();
    let Some(layout) = pg_layout(&place, "PostgreSQL", false) else {
        return;
    };
    check_layout(place, layout);
}

#[test]
fn a_postgres_store_without_mirrors_still_hides_its_snapshots() {
    if !sandbox_available() {
        return;
    }
    let place = Place::new();
    let Some(layout) = pg_layout(&place, "PostgreSQL --no-log", true) else {
        return;
    };
    check_layout(place, layout);
}
