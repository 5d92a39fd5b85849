//! Run leases across processes and machines: a row per leased run, with an
//! owner and an expiry on the database's clock.
//!
//! A backend takes a run's lease when the row is absent, expired, or
//! already its own, and renews all it holds every third of the ttl in one
//! statement. A process that dies (even by SIGKILL) stops renewing: its rows
//! expire after the ttl and another process may take them. A process that
//! only stalls may find, when it wakes, that another took its run over; the
//! fence in `append` (see [`fenced_run`]) then refuses its writes, so two
//! processes never interleave events of one run.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use cairn_store::{validate_run_id, RunLease, StoreError};

use crate::db::Db;
use crate::Shared;

/// The shortest renewal period, whatever the ttl.
const MIN_RENEW_PERIOD: Duration = Duration::from_millis(10);

/// Takes the lease if it is free, expired, or ours already (a release that
/// failed leaves our row behind). Whoever holds it live keeps it.
const ACQUIRE: &str = "INSERT INTO leases (run_id, owner, expires_at) \
     VALUES ($1, $2, clock_timestamp() + $3::float8 * interval '1 second') \
     ON CONFLICT (run_id) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at \
     WHERE leases.expires_at < clock_timestamp() OR leases.owner = EXCLUDED.owner \
     RETURNING run_id";

const RELEASE: &str = "DELETE FROM leases WHERE run_id = $1 AND owner = $2";

/// Extends every lease of ours among `$2`, locking the rows in run order
/// (as the fence does) so that it never deadlocks with an append; returns
/// the runs still ours.
const RENEW: &str =
    "UPDATE leases SET expires_at = clock_timestamp() + $3::float8 * interval '1 second' \
     WHERE owner = $1 AND run_id IN (SELECT run_id FROM leases \
     WHERE owner = $1 AND run_id = ANY($2::text[]) ORDER BY run_id FOR UPDATE) \
     RETURNING run_id";

/// Locks the batch's lease rows (shared, in run order) and tells whether one
/// is held live by another owner.
const FENCE: &str = "SELECT run_id, owner <> $2 AND expires_at > clock_timestamp() \
     FROM leases WHERE run_id = ANY($1::text[]) ORDER BY run_id FOR SHARE";

/// The leases this backend holds or is taking, as this process knows them.
///
/// Kept here as well as in the table because the table cannot tell two
/// leases of one owner apart: a second `try_lock_run` of a run held in this
/// process must fail without asking the database.
pub(crate) struct Leases {
    /// This backend's id in the `owner` column, random per backend.
    owner: String,
    ttl: Duration,
    held: Mutex<HashMap<String, Claim>>,
    /// Tells apart successive leases of one run, so that a late heartbeat
    /// or release of an old one never touches a newer one.
    next_token: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
struct Claim {
    token: u64,
    /// Taken in the database (and not being released): the heartbeat
    /// renews it.
    live: bool,
}

impl Leases {
    /// An empty set for a new owner.
    pub(crate) fn new(ttl: Duration) -> Leases {
        Leases {
            owner: format!("{}-{:016x}", std::process::id(), rand::random::<u64>()),
            ttl,
            held: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(1),
        }
    }

    /// This backend's owner id.
    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    fn ttl_secs(&self) -> f64 {
        self.ttl.as_secs_f64()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Claim>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims `run` locally; `None` if this process holds or is taking it.
    fn reserve(&self, run: &str) -> Option<u64> {
        let mut held = self.lock();
        if held.contains_key(run) {
            return None;
        }
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        held.insert(run.to_string(), Claim { token, live: false });
        Some(token)
    }

    fn set_live(&self, run: &str, token: u64, live: bool) {
        if let Some(c) = self.lock().get_mut(run).filter(|c| c.token == token) {
            c.live = live;
        }
    }

    fn forget(&self, run: &str, token: u64) {
        let mut held = self.lock();
        if held.get(run).is_some_and(|c| c.token == token) {
            held.remove(run);
        }
    }

    /// The leases to renew.
    fn live(&self) -> Vec<(String, u64)> {
        self.lock()
            .iter()
            .filter(|(_, c)| c.live)
            .map(|(r, c)| (r.clone(), c.token))
            .collect()
    }

    /// Forgets a lease the renewal found gone, unless it was released
    /// meanwhile; says whether it was forgotten.
    fn lost(&self, run: &str, token: u64) -> bool {
        let mut held = self.lock();
        if held.get(run).is_some_and(|c| c.token == token && c.live) {
            held.remove(run);
            return true;
        }
        false
    }
}

/// A run's lease; dropping it deletes its row.
struct PgLease {
    run_id: String,
    token: u64,
    /// Weak, so that a lease kept past its backend (or leaked) does not keep
    /// the backend's runtime alive: its row then expires like a dead
    /// process's.
    home: Weak<Shared>,
}

impl RunLease for PgLease {}

impl Drop for PgLease {
    fn drop(&mut self) {
        if let Some(home) = self.home.upgrade() {
            home.release(&self.run_id, self.token);
        }
    }
}

impl Shared {
    /// `Backend::try_lock_run`.
    pub(crate) fn try_lock_run(
        self: &Arc<Self>,
        run_id: &str,
    ) -> Result<Option<Box<dyn RunLease>>, StoreError> {
        validate_run_id(run_id)?;
        let Some(token) = self.leases.reserve(run_id) else {
            return Ok(None);
        };
        let db = self.db.clone();
        let run = run_id.to_string();
        let owner = self.leases.owner().to_string();
        let ttl = self.leases.ttl_secs();
        let got = self
            .bridge
            .run(async move { acquire(&db, &run, &owner, ttl).await });
        match got {
            Ok(true) => {
                self.leases.set_live(run_id, token, true);
                Ok(Some(Box::new(PgLease {
                    run_id: run_id.to_string(),
                    token,
                    home: Arc::downgrade(self),
                })))
            }
            other => {
                self.leases.forget(run_id, token);
                other.map(|_| None)
            }
        }
    }

    /// Deletes the lease's row, then forgets it here: in this order, a
    /// `try_lock_run` that follows the drop finds the run free in both
    /// places. If the delete fails the row expires by itself (nothing
    /// renews it any more).
    fn release(&self, run_id: &str, token: u64) {
        self.leases.set_live(run_id, token, false);
        let db = self.db.clone();
        let run = run_id.to_string();
        let owner = self.leases.owner().to_string();
        let done = self.bridge.run(async move {
            let client = db.client().await?;
            let st = client
                .prepare_cached(RELEASE)
                .await
                .map_err(|e| db.err(e))?;
            client
                .execute(&st, &[&run, &owner])
                .await
                .map_err(|e| db.err(e))
        });
        if let Err(e) = done {
            tracing::warn!(run = run_id, error = %e, "could not release the run's lease; it expires by itself");
        }
        self.leases.forget(run_id, token);
    }
}

async fn acquire(db: &Db, run: &str, owner: &str, ttl_secs: f64) -> Result<bool, StoreError> {
    let client = db.client().await?;
    let st = client
        .prepare_cached(ACQUIRE)
        .await
        .map_err(|e| db.err(e))?;
    let row = client
        .query_opt(&st, &[&run, &owner, &ttl_secs])
        .await
        .map_err(|e| db.err(e))?;
    Ok(row.is_some())
}

/// The fence, inside an append's transaction: the first run of `runs` whose
/// lease another owner holds live, if any.
///
/// The rows are locked (shared) until the append commits, so a takeover
/// (which updates the row) waits for the append, and the new holder's
/// `last_seq` sees its events. Once the takeover committed, the old
/// holder's appends find the new owner here and are refused.
pub(crate) async fn fenced_run(
    tx: &deadpool_postgres::Transaction<'_>,
    owner: &str,
    runs: &[&str],
) -> Result<Option<String>, tokio_postgres::Error> {
    let st = tx.prepare_cached(FENCE).await?;
    for row in tx.query(&st, &[&runs, &owner]).await? {
        if row.try_get::<_, bool>(1)? {
            return Ok(Some(row.try_get(0)?));
        }
    }
    Ok(None)
}

/// Renews this backend's leases every third of the ttl, for as long as the
/// backend's runtime runs. A lease found taken over (or deleted) is logged
/// and forgotten: its holder's appends are fenced off from then on.
pub(crate) async fn heartbeat(db: Db, leases: Arc<Leases>) {
    let period = (leases.ttl / 3).max(MIN_RENEW_PERIOD);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let held = leases.live();
        if held.is_empty() {
            continue;
        }
        let runs: Vec<&str> = held.iter().map(|(r, _)| r.as_str()).collect();
        let kept = match renew(&db, &leases, &runs).await {
            Ok(kept) => kept,
            Err(e) => {
                // Keep them: they may still be ours, and the fence guards
                // the case where they are not.
                tracing::warn!(error = %e, "could not renew the run leases");
                continue;
            }
        };
        for (run, token) in &held {
            if !kept.iter().any(|k| k == run) && leases.lost(run, *token) {
                tracing::warn!(
                    run = %run,
                    "the run's lease was lost (it expired and another process took it); \
                     this process can no longer write the run"
                );
            }
        }
    }
}

async fn renew(db: &Db, leases: &Leases, runs: &[&str]) -> Result<Vec<String>, StoreError> {
    let client = db.client().await?;
    let st = client.prepare_cached(RENEW).await.map_err(|e| db.err(e))?;
    let rows = client
        .query(&st, &[&leases.owner(), &runs, &leases.ttl_secs()])
        .await
        .map_err(|e| db.err(e))?;
    rows.iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()
        .map_err(|e| db.err(e))
}
