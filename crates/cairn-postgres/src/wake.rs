//! Wake-ups across processes through PostgreSQL's LISTEN/NOTIFY.
//!
//! Each backend keeps one connection of its own (not from the pool) that
//! LISTENs on the store's channel and also sends the backend's NOTIFYs,
//! whose payload is the topic's key. A notification wakes the in-process
//! listeners registered for its key. `notify` wakes this process's
//! listeners directly (without waiting for the round trip) and skips the
//! echo of its own NOTIFY, recognised by the sending session's pid, so that
//! one notify makes one wake-up here.
//!
//! If the connection drops it is made again, with backoff, and every
//! listener is woken: notifications sent meanwhile were lost. A wake-up
//! only says "look again", so a spurious one costs a read, and a lost one
//! waits for the listener's own slow poll.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, Client, Config, Notification, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

use cairn_storage::{Listener, Topic};

use crate::config::quote;

/// The first wait before connecting again; it doubles up to the maximum.
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// How soon a silently dead wake-up connection is noticed (TCP keepalive),
/// unless the URL chose otherwise: it only ever reads, so nothing else would.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);

/// What made the wake-up connection stop.
#[derive(Debug, thiserror::Error)]
enum LinkError {
    #[error("{}", crate::db::describe(.0))]
    Pg(#[from] tokio_postgres::Error),
    #[error("the server closed the connection")]
    Closed,
}

/// The in-process listeners, by topic key.
#[derive(Default)]
struct Registry {
    topics: Mutex<HashMap<String, Vec<Arc<Notify>>>>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Arc<Notify>>>> {
        self.topics.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, key: &str) -> Arc<Notify> {
        let n = Arc::new(Notify::new());
        self.lock()
            .entry(key.to_string())
            .or_default()
            .push(n.clone());
        n
    }

    fn remove(&self, key: &str, n: &Arc<Notify>) {
        let mut topics = self.lock();
        if let Some(list) = topics.get_mut(key) {
            list.retain(|x| !Arc::ptr_eq(x, n));
            if list.is_empty() {
                topics.remove(key);
            }
        }
    }

    /// Wakes every listener of `key`. `notify_one` keeps a permit for a
    /// listener that is not waiting right now, and only one: wake-ups that
    /// come between two waits make one.
    fn wake(&self, key: &str) {
        if let Some(list) = self.lock().get(key) {
            list.iter().for_each(|n| n.notify_one());
        }
    }

    fn wake_all(&self) {
        self.lock().values().flatten().for_each(|n| n.notify_one());
    }
}

/// One registration; unregisters when dropped.
struct PgListener {
    registry: Arc<Registry>,
    key: String,
    notify: Arc<Notify>,
}

impl Listener for PgListener {
    fn wait(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        // Cancel-safe: a `Notified` dropped after being chosen by
        // `notify_one` hands its permit back to the `Notify`.
        Box::pin(self.notify.notified())
    }
}

impl Drop for PgListener {
    fn drop(&mut self) {
        self.registry.remove(&self.key, &self.notify);
    }
}

/// The current wake-up connection, as `notify` uses it.
#[derive(Clone)]
struct Link {
    client: Arc<Client>,
    /// `SELECT pg_notify($1, $2)`, prepared on this connection.
    notify: Statement,
    /// The server pid of this session: notifications it sent are our own.
    pid: i32,
}

/// The wake-ups of one backend.
pub(crate) struct Wake {
    registry: Arc<Registry>,
    /// `None` while reconnecting: notifications then only wake this process.
    link: Arc<Mutex<Option<Link>>>,
    channel: String,
    handle: Handle,
}

impl Wake {
    /// Connects and LISTENs on `channel`, then keeps the connection (and
    /// makes it again when it drops) on the current runtime. Fails if the
    /// first connection does.
    pub(crate) async fn start(
        config: Config,
        tls: MakeRustlsConnect,
        channel: String,
    ) -> Result<Wake, String> {
        let mut config = config;
        if config.get_keepalives_idle() == Config::new().get_keepalives_idle() {
            config.keepalives_idle(KEEPALIVE_IDLE);
        }
        let session = Session::open(&config, &tls, &channel)
            .await
            .map_err(|e| e.to_string())?;
        let wake = Wake {
            registry: Arc::default(),
            link: Arc::new(Mutex::new(Some(session.link.clone()))),
            channel: channel.clone(),
            handle: Handle::current(),
        };
        let (registry, link) = (wake.registry.clone(), wake.link.clone());
        tokio::spawn(keep_listening(
            config, tls, channel, registry, link, session,
        ));
        Ok(wake)
    }

    /// Wakes this process's listeners of `topic` and sends a NOTIFY for
    /// the others. Never fails: errors are logged.
    pub(crate) fn notify(&self, topic: Topic<'_>) {
        let key = topic.key();
        self.registry.wake(&key);
        let link = self.link.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(link) = link else {
            tracing::debug!(topic = %key, "no wake-up connection; other processes will poll");
            return;
        };
        let channel = self.channel.clone();
        self.handle.spawn(async move {
            if let Err(e) = link.client.execute(&link.notify, &[&channel, &key]).await {
                tracing::warn!(topic = %key, error = %crate::db::describe(&e), "could not send a wake-up");
            }
        });
    }

    /// [`Wake::notify`] of the topic whose key is `key`, the NOTIFY sent by
    /// the time the future resolves.
    pub(crate) async fn notify_sent(&self, key: String) {
        self.registry.wake(&key);
        let link = self.link.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(link) = link else {
            tracing::debug!(topic = %key, "no wake-up connection; other processes will poll");
            return;
        };
        if let Err(e) = link
            .client
            .execute(&link.notify, &[&self.channel, &key])
            .await
        {
            tracing::warn!(topic = %key, error = %crate::db::describe(&e), "could not send a wake-up");
        }
    }

    /// Registers a listener of `topic`.
    pub(crate) fn listen(&self, topic: Topic<'_>) -> Box<dyn Listener> {
        let key = topic.key();
        let notify = self.registry.add(&key);
        Box::new(PgListener {
            registry: self.registry.clone(),
            key,
            notify,
        })
    }
}

type Messages = Pin<Box<dyn Stream<Item = Result<AsyncMessage, tokio_postgres::Error>> + Send>>;

/// One connection's life: LISTENing, then passing notifications on.
struct Session {
    link: Link,
    /// The connection itself, driven by reading its messages.
    messages: Messages,
    /// Notifications that came while the session was being set up.
    backlog: Vec<Notification>,
}

impl Session {
    async fn open(
        config: &Config,
        tls: &MakeRustlsConnect,
        channel: &str,
    ) -> Result<Session, LinkError> {
        let (client, mut connection) = config.connect(tls.clone()).await?;
        let mut messages: Messages = Box::pin(futures::stream::poll_fn(move |cx| {
            connection.poll_message(cx)
        }));
        let mut backlog = Vec::new();
        let setup = async {
            client
                .batch_execute(&format!("LISTEN {}", quote(channel)))
                .await?;
            let pid: i32 = client
                .query_one("SELECT pg_backend_pid()", &[])
                .await?
                .try_get(0)?;
            let notify = client.prepare("SELECT pg_notify($1, $2)").await?;
            Ok::<_, tokio_postgres::Error>((pid, notify))
        };
        let (pid, notify) = drive(&mut messages, setup, &mut backlog).await?;
        Ok(Session {
            link: Link {
                client: Arc::new(client),
                notify,
                pid,
            },
            messages,
            backlog,
        })
    }

    /// Passes notifications on until the connection ends; returns why.
    async fn pump(mut self, registry: &Registry) -> LinkError {
        for n in std::mem::take(&mut self.backlog) {
            self.dispatch(registry, &n);
        }
        loop {
            match self.messages.next().await {
                Some(Ok(AsyncMessage::Notification(n))) => self.dispatch(registry, &n),
                Some(Ok(_)) => {}
                Some(Err(e)) => return e.into(),
                None => return LinkError::Closed,
            }
        }
    }

    fn dispatch(&self, registry: &Registry, n: &Notification) {
        // Our own NOTIFY: `notify` already woke this process.
        if n.process_id() != self.link.pid {
            registry.wake(n.payload());
        }
    }
}

/// Runs `fut` (requests on the connection) while driving the connection,
/// which only makes progress while its messages are read.
async fn drive<T>(
    messages: &mut Messages,
    fut: impl Future<Output = Result<T, tokio_postgres::Error>>,
    backlog: &mut Vec<Notification>,
) -> Result<T, LinkError> {
    tokio::pin!(fut);
    loop {
        tokio::select! {
            out = &mut fut => return Ok(out?),
            msg = messages.next() => match msg {
                Some(Ok(AsyncMessage::Notification(n))) => backlog.push(n),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => return Err(LinkError::Closed),
            },
        }
    }
}

/// Keeps a wake-up connection for as long as the runtime runs.
async fn keep_listening(
    config: Config,
    tls: MakeRustlsConnect,
    channel: String,
    registry: Arc<Registry>,
    link: Arc<Mutex<Option<Link>>>,
    mut session: Session,
) {
    loop {
        let why = session.pump(&registry).await;
        *link.lock().unwrap_or_else(|p| p.into_inner()) = None;
        tracing::warn!(error = %why, "lost the wake-up connection to PostgreSQL; connecting again");
        session = reconnect(&config, &tls, &channel).await;
        *link.lock().unwrap_or_else(|p| p.into_inner()) = Some(session.link.clone());
        // Whatever was notified while we were away is lost: look again.
        registry.wake_all();
    }
}

async fn reconnect(config: &Config, tls: &MakeRustlsConnect, channel: &str) -> Session {
    let mut delay = RECONNECT_FIRST;
    loop {
        tokio::time::sleep(delay).await;
        match Session::open(config, tls, channel).await {
            Ok(s) => {
                tracing::info!("wake-up connection to PostgreSQL restored");
                return s;
            }
            Err(e) => {
                tracing::debug!(error = %e, retry_in = ?delay, "cannot connect for wake-ups yet");
                delay = (delay * 2).min(RECONNECT_MAX);
            }
        }
    }
}
