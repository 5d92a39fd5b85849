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
//!
//! A lease whose holder is seen dead need not wait for its expiry: the
//! owner id names the holder's machine boot, PID namespace, pid and process
//! start time (see `holder.rs`), and a process on the same machine that
//! finds that process gone takes the lease over at once, by an update
//! conditional on that exact owner id (so of two such processes one wins),
//! and the fence refuses the dead holder's writes as after an expiry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use cairn_events::RunId;
use cairn_storage::{RunLease, StoreError};

use crate::db::Db;
use crate::holder::{Holder, Liveness};
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

/// The run's lease while it is live: its owner and how many seconds it has
/// left, on the database's clock.
const HOLDER: &str = "SELECT owner, \
     extract(epoch FROM expires_at - clock_timestamp())::float8 \
     FROM leases WHERE run_id = $1 AND expires_at >= clock_timestamp()";

/// Takes over a lease from the exact owner `$4` that was seen dead: a
/// concurrent taker (or a renewal, were it alive) changes the row, and then
/// this updates nothing.
const TAKE_OVER: &str =
    "UPDATE leases SET owner = $2, expires_at = clock_timestamp() + $3::float8 * interval '1 second' \
     WHERE run_id = $1 AND owner = $4 RETURNING run_id";

/// How many times a take is tried when the row changes under it.
const TAKE_TRIES: usize = 3;

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
    /// This backend's id in the `owner` column: random per backend, naming
    /// this process (see [`owner_id`]).
    owner: String,
    /// This process, to judge other owners by.
    me: Holder,
    ttl: Duration,
    held: Mutex<HashMap<RunId, Claim>>,
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
    pub(crate) fn new(ttl: Duration, instance: &str) -> Leases {
        let me = Holder::this_process();
        Leases {
            owner: owner_id(rand::random::<u64>(), &me, instance),
            me,
            ttl,
            held: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(1),
        }
    }

    /// This backend's owner id.
    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    pub(crate) fn ttl_secs(&self) -> f64 {
        self.ttl.as_secs_f64()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, Claim>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims `run` locally; `None` if this process holds or is taking it.
    pub(crate) fn reserve(&self, run: &RunId) -> Option<u64> {
        let mut held = self.lock();
        if held.contains_key(run) {
            return None;
        }
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        held.insert(run.clone(), Claim { token, live: false });
        Some(token)
    }

    pub(crate) fn set_live(&self, run: &str, token: u64, live: bool) {
        if let Some(c) = self.lock().get_mut(run).filter(|c| c.token == token) {
            c.live = live;
        }
    }

    pub(crate) fn forget(&self, run: &str, token: u64) {
        let mut held = self.lock();
        if held.get(run).is_some_and(|c| c.token == token) {
            held.remove(run);
        }
    }

    /// The leases to renew.
    fn live(&self) -> Vec<(RunId, u64)> {
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

/// An owner id: `<random> pid=<pid> start=<ticks> host=<boot>/<pid ns>
/// name=<hostname>`, readable in `psql` and by [`parse_owner`]. The random
/// part alone tells backends apart; the rest says who holds the lease.
pub(crate) fn owner_id(random: u64, me: &Holder, instance: &str) -> String {
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    format!(
        "{random:016x} pid={} start={} host={} instance={instance} name={}",
        me.pid,
        opt(me.start.map(|s| s.to_string())),
        opt(me.host.clone()),
        me.hostname
    )
}

/// The instance an owner id names (`instance=`, a checked name without
/// spaces); `None` for an id of a Cairn from before instance names.
pub(crate) fn owner_instance(owner: &str) -> Option<String> {
    let fields = owner.split_once(" name=").map_or(owner, |(f, _)| f);
    fields
        .split(' ')
        .skip(1)
        .find_map(|f| f.strip_prefix("instance="))
        .filter(|i| cairn_storage::check_instance_name(i).is_ok())
        .map(str::to_string)
}

/// Who an owner id names; fields it lacks (an id of an older Cairn, or an
/// unexpected one) stay unknown, and such a holder is never judged dead.
fn parse_owner(owner: &str) -> Holder {
    let mut holder = Holder {
        host: None,
        hostname: String::new(),
        pid: 0,
        start: None,
    };
    // The name comes last and may hold anything: it is the rest.
    let (fields, name) = match owner.split_once(" name=") {
        Some((f, n)) => (f, n),
        None => (owner, ""),
    };
    holder.hostname = name.to_string();
    for field in fields.split(' ').skip(1) {
        match field.split_once('=') {
            Some(("pid", v)) => holder.pid = v.parse().unwrap_or(0),
            Some(("start", v)) => holder.start = v.parse().ok(),
            Some(("host", v)) if v != "-" => holder.host = Some(v.to_string()),
            _ => {}
        }
    }
    holder
}

/// A run's lease; dropping it deletes its row.
pub(crate) struct PgLease {
    pub(crate) run_id: RunId,
    pub(crate) token: u64,
    /// Weak, so that a lease kept past its backend (or leaked) does not keep
    /// the backend's runtime alive: its row then expires like a dead
    /// process's.
    pub(crate) home: Weak<Shared>,
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
        run_id: &RunId,
    ) -> Result<Option<Box<dyn RunLease>>, StoreError> {
        let Some(token) = self.leases.reserve(run_id) else {
            return Ok(None);
        };
        let (db, leases) = (self.db.clone(), self.leases.clone());
        let run = run_id.clone();
        let got = self
            .bridge
            .run(async move { take(&db, &leases, &run).await });
        match got {
            Ok(true) => {
                self.leases.set_live(run_id, token, true);
                Ok(Some(Box::new(PgLease {
                    run_id: run_id.clone(),
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
    fn release(&self, run_id: &RunId, token: u64) {
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
            tracing::warn!(run = %run_id, error = %e, "could not release the run's lease; it expires by itself");
        }
        self.leases.forget(run_id, token);
    }

    /// `Backend::lease_holder`: the run's live lease, unless this process
    /// holds it or its holder is seen dead (a `try_lock_run` takes it then).
    pub(crate) fn lease_holder(
        &self,
        run_id: &RunId,
    ) -> Result<Option<cairn_storage::LeaseHolder>, StoreError> {
        let (db, run) = (self.db.clone(), run_id.clone());
        let Some((owner, left)) = self
            .bridge
            .run(async move { holder_row(&db, &run).await })?
        else {
            return Ok(None);
        };
        if owner == self.leases.owner() {
            return Ok(None);
        }
        let holder = parse_owner(&owner);
        let alive_here = match self.leases.me.judge(&holder) {
            Liveness::Dead => return Ok(None),
            Liveness::Alive => true,
            Liveness::Unknown => false,
        };
        Ok(Some(cairn_storage::LeaseHolder {
            holder: holder.describe(),
            expires_in: Some(Duration::from_secs_f64(left.max(0.0))),
            alive_here,
            instance: owner_instance(&owner),
        }))
    }

    /// `Backend::drivers`: one query for the whole list.
    pub(crate) fn drivers(&self, runs: &[RunId]) -> Result<HashMap<RunId, String>, StoreError> {
        if runs.is_empty() {
            return Ok(HashMap::new());
        }
        let db = self.db.clone();
        let ids: Vec<String> = runs.iter().map(|r| r.to_string()).collect();
        let rows = self.bridge.run(async move {
            let client = db.client().await?;
            let st = client
                .prepare_cached(DRIVERS)
                .await
                .map_err(|e| db.err(e))?;
            let rows = client.query(&st, &[&ids]).await.map_err(|e| db.err(e))?;
            Ok::<_, StoreError>(
                rows.iter()
                    .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
                    .collect::<Vec<_>>(),
            )
        })?;
        Ok(rows
            .into_iter()
            .filter_map(|(run, owner)| {
                let run = RunId::parse(&run).ok()?;
                let name = owner_instance(&owner).unwrap_or_else(|| parse_owner(&owner).describe());
                Some((run, name))
            })
            .collect())
    }
}

/// The live leases of a list of runs, with their owners.
const DRIVERS: &str = "SELECT run_id, owner FROM leases \
     WHERE run_id = ANY($1::text[]) AND expires_at >= clock_timestamp()";

/// Takes the run's lease in the database: free, expired or ours, or held by
/// a process this one sees dead (on this machine). Whoever holds it live,
/// or might, keeps it.
async fn take(db: &Db, leases: &Leases, run: &str) -> Result<bool, StoreError> {
    let (owner, ttl) = (leases.owner(), leases.ttl_secs());
    for _ in 0..TAKE_TRIES {
        if acquire(db, run, owner, ttl).await? {
            return Ok(true);
        }
        // Released or expired since: try again.
        let Some((held_by, _)) = holder_row(db, run).await? else {
            continue;
        };
        let holder = parse_owner(&held_by);
        if held_by == owner || leases.me.judge(&holder) != Liveness::Dead {
            return Ok(false);
        }
        if take_over(db, run, owner, ttl, &held_by).await? {
            tracing::info!(
                run,
                holder = %holder.describe(),
                "took over the run's lease from a process that is no longer running"
            );
            return Ok(true);
        }
        // Another process took it over (or it was released) meanwhile.
    }
    Ok(false)
}

/// The run's live lease: its owner id and the seconds it has left.
async fn holder_row(db: &Db, run: &str) -> Result<Option<(String, f64)>, StoreError> {
    let client = db.client().await?;
    let st = client.prepare_cached(HOLDER).await.map_err(|e| db.err(e))?;
    let row = client
        .query_opt(&st, &[&run])
        .await
        .map_err(|e| db.err(e))?;
    row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .transpose()
        .map_err(|e| db.err(e))
}

async fn take_over(
    db: &Db,
    run: &str,
    owner: &str,
    ttl_secs: f64,
    dead: &str,
) -> Result<bool, StoreError> {
    let client = db.client().await?;
    let st = client
        .prepare_cached(TAKE_OVER)
        .await
        .map_err(|e| db.err(e))?;
    let row = client
        .query_opt(&st, &[&run, &owner, &ttl_secs, &dead])
        .await
        .map_err(|e| db.err(e))?;
    Ok(row.is_some())
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
pub(crate) async fn heartbeat(db: Db, leases: Arc<Leases>, claimer: Arc<AtomicBool>) {
    let period = (leases.ttl / 3).max(MIN_RENEW_PERIOD);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if claimer.load(Ordering::SeqCst) {
            if let Err(e) = crate::claims::seen(&db, leases.owner()).await {
                tracing::warn!(error = %e, "could not tell the store this instance still claims runs");
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_ids_name_their_holder_and_odd_ones_name_nobody() {
        let me = Holder::this_process();
        let id = owner_id(0xabc, &me, "web-1");
        assert!(id.starts_with("0000000000000abc pid="), "{id}");
        assert_eq!(parse_owner(&id), me);
        assert_eq!(owner_instance(&id).as_deref(), Some("web-1"));
        let odd = Holder {
            host: Some("b/pid:[4]".into()),
            hostname: "a name= with spaces".into(),
            pid: 7,
            start: None,
        };
        assert_eq!(parse_owner(&owner_id(1, &odd, "w")), odd);
        assert_eq!(
            owner_instance(&owner_id(1, &odd, "w")).as_deref(),
            Some("w")
        );
        // An older Cairn's id, or garbage: nobody, so never judged dead.
        for other in ["4242-00000000deadbeef", "", "x pid=abc host=-", "x name="] {
            let h = parse_owner(other);
            assert_eq!((h.pid, h.host.as_deref()), (0, None), "{other}");
            assert_eq!(me.judge(&h), Liveness::Unknown, "{other}");
            assert_eq!(owner_instance(other), None, "{other}");
        }
    }
}
