//! Wake-ups between processes that share a SQLite store on one machine.
//!
//! SQLite has no LISTEN/NOTIFY, so the store brings its own: each listener
//! binds a datagram socket in Linux's abstract namespace (no file to clean
//! up: the kernel drops the name with the socket) and leaves a marker file
//! named after it in `<store dir>/wake/<store>/<topic>/`, so that a notifier can find
//! it. A notification is one empty datagram to every listener of the topic;
//! a listener that died is found by the refused send and its marker removed.
//!
//! A wake-up carries nothing but "look again": the data is always in the
//! store, so a lost or forged datagram costs a read, never correctness.
//! Abstract sockets belong to a network namespace, so a node's sandbox with
//! a namespace of its own cannot reach them.

use std::collections::HashSet;
use std::future::Future;
use std::io::ErrorKind;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use cairn_storage::{Listener, StoreError, Topic};

static NEXT_LISTENER: AtomicU64 = AtomicU64::new(1);

/// The wake-up registry of one store.
#[derive(Debug, Clone)]
pub(crate) struct WakeDir {
    dir: PathBuf,
    /// Tells stores apart in the machine-wide abstract namespace.
    store_tag: String,
}

impl WakeDir {
    /// The registry of the store whose database is `db`, kept in `dir`.
    pub(crate) fn new(db: &Path, dir: PathBuf) -> WakeDir {
        let canonical = db
            .parent()
            .and_then(|p| std::fs::canonicalize(p).ok())
            .map(|p| p.join(db.file_name().unwrap_or_default()))
            .unwrap_or_else(|| db.to_path_buf());
        WakeDir {
            dir,
            store_tag: short_hash(canonical.as_os_str().as_encoded_bytes()),
        }
    }

    fn topic_dir(&self, topic: Topic<'_>) -> (String, PathBuf) {
        let tag = short_hash(topic.key().as_bytes());
        // Stores that share a folder keep their markers apart.
        let dir = self.kind_dir(topic).join(&tag);
        (tag, dir)
    }

    /// The folder of every topic of `topic`'s kind. Kinds are kept apart so
    /// that [`WakeDir::notify_all`] lists only its own: every run's driver
    /// listens to its inbox, while a run's events have listeners only when
    /// another process watches it.
    fn kind_dir(&self, topic: Topic<'_>) -> PathBuf {
        let kind = match topic {
            Topic::Inbox(_) => "inbox",
            Topic::Events(_) => "events",
        };
        self.dir.join(&self.store_tag).join(kind)
    }

    fn address(&self, topic_tag: &str, name: &str) -> std::io::Result<SocketAddr> {
        let abstract_name = format!("cairn/{}/{topic_tag}/{name}", self.store_tag);
        SocketAddr::from_abstract_name(abstract_name.as_bytes())
    }

    /// Wakes every listener of `topic`. Best effort: a failure only delays
    /// a listener until its own fallback poll.
    pub(crate) fn notify(&self, topic: Topic<'_>) {
        let (tag, dir) = self.topic_dir(topic);
        self.wake_dir(&tag, &dir);
    }

    /// Wakes the listeners of every topic: one listing of the store's
    /// registry finds the topics anyone listens to, instead of one failed
    /// open per topic, which a commit of a thousand runs would pay a
    /// thousand times.
    pub(crate) fn notify_all(&self, topics: &[Topic<'_>]) {
        if topics.len() < 2 {
            topics.iter().for_each(|t| self.notify(*t));
            return;
        }
        // One folder per kind: `topics` are of one kind, or listed by kind.
        let mut listed: Vec<(PathBuf, HashSet<std::ffi::OsString>)> = Vec::new();
        for &topic in topics {
            let kind = self.kind_dir(topic);
            let listened = match listed.iter().position(|(k, _)| *k == kind) {
                Some(i) => &listed[i].1,
                None => {
                    let names = std::fs::read_dir(&kind)
                        .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
                        .unwrap_or_default();
                    listed.push((kind, names));
                    &listed[listed.len() - 1].1
                }
            };
            if listened.is_empty() {
                continue;
            }
            let (tag, dir) = self.topic_dir(topic);
            if listened.contains(std::ffi::OsStr::new(&tag)) {
                self.wake_dir(&tag, &dir);
            }
        }
    }

    fn wake_dir(&self, tag: &str, dir: &Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            // No listener ever registered: the common case, one syscall.
            return;
        };
        let Ok(sock) = UnixDatagram::unbound() else {
            return;
        };
        let _ = sock.set_nonblocking(true);
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Ok(addr) = self.address(tag, name) else {
                continue;
            };
            match sock.send_to_addr(&[], &addr) {
                Ok(_) => {}
                // Nobody bound the name: the listener's process died.
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                    let _ = std::fs::remove_file(entry.path());
                }
                // A full queue already holds a wake-up for it.
                Err(_) => {}
            }
        }
    }

    /// Registers a listener of `topic`.
    pub(crate) fn listen(&self, topic: Topic<'_>) -> Result<Box<dyn Listener>, StoreError> {
        let (tag, dir) = self.topic_dir(topic);
        std::fs::create_dir_all(&dir).map_err(|e| StoreError::io(&dir, e))?;
        let name = format!(
            "{}-{}",
            std::process::id(),
            NEXT_LISTENER.fetch_add(1, Ordering::Relaxed)
        );
        let addr = self
            .address(&tag, &name)
            .map_err(|e| StoreError::io(&dir, e))?;
        let sock = UnixDatagram::bind_addr(&addr).map_err(|e| StoreError::io(&dir, e))?;
        sock.set_nonblocking(true)
            .map_err(|e| StoreError::io(&dir, e))?;
        let marker = dir.join(&name);
        // The last listener of a topic removes its folder when it goes; one
        // doing so between our `create_dir_all` and this write leaves no
        // folder to write in, so make it again.
        let mut tries = 0;
        while let Err(e) = std::fs::write(&marker, b"") {
            tries += 1;
            if e.kind() != ErrorKind::NotFound || tries > 3 {
                return Err(StoreError::io(&marker, e));
            }
            std::fs::create_dir_all(&dir).map_err(|e| StoreError::io(&dir, e))?;
        }
        Ok(Box::new(SocketListener {
            std: Some(sock),
            tokio: None,
            marker,
        }))
    }
}

fn short_hash(bytes: &[u8]) -> String {
    hex_prefix(&Sha256::digest(bytes), 12)
}

fn hex_prefix(bytes: &[u8], n: usize) -> String {
    bytes.iter().take(n).map(|b| format!("{b:02x}")).collect()
}

/// A registered listener; unregisters itself when dropped.
struct SocketListener {
    /// The socket until the first wait, which needs a runtime to register it.
    std: Option<UnixDatagram>,
    tokio: Option<tokio::net::UnixDatagram>,
    marker: PathBuf,
}

impl Listener for SocketListener {
    fn wait(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if self.tokio.is_none() {
                let Some(std) = self.std.take() else {
                    return std::future::pending().await;
                };
                match tokio::net::UnixDatagram::from_std(std) {
                    Ok(s) => self.tokio = Some(s),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot watch for wake-ups; falling back to polling");
                        return std::future::pending().await;
                    }
                }
            }
            let sock = self.tokio.as_ref().expect("set above");
            let mut buf = [0u8; 16];
            if sock.recv(&mut buf).await.is_err() {
                return std::future::pending().await;
            }
            // Several wake-ups that queued meanwhile ask for one look.
            while sock.try_recv(&mut buf).is_ok() {}
        })
    }
}

impl Drop for SocketListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.marker);
        // A topic is usually one run's: without this, every run would leave
        // an empty folder behind for good. Fails, harmlessly, while another
        // listener's marker is there.
        if let Some(dir) = self.marker.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
