//! Cairn's event store on PostgreSQL: [`PgBackend`] implements
//! [`cairn_storage::Backend`], so the same journal runs over a database that
//! engines on several machines share.
//!
//! What differs from the SQLite backend:
//! - run leases are rows with an expiry on the database's clock, renewed by
//!   a heartbeat, and an append is refused ([`StoreError::LeaseHeld`]) for a run
//!   whose lease another process holds (the fence), see `lease.rs`;
//! - wake-ups travel by LISTEN/NOTIFY on a channel per schema, see
//!   `wake.rs`;
//! - the tables live in a schema of their choosing, created and migrated at
//!   open, see [`SCHEMA_VERSION`].
//!
//! Connections are plain TCP (or a Unix socket): this crate speaks no TLS.
//! A URL asking for `sslmode=require` fails to connect; reach a remote
//! server through a tunnel or a private network.

#![warn(missing_docs)]

mod budget;
mod claims;
mod config;
mod db;
mod events;
mod holder;
mod lease;
mod objects;
mod records;
mod rt;
mod runs;
mod schedules;
mod schema;
#[cfg(feature = "testing")]
pub mod testing;
mod tls;
mod wake;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use cairn_events::{NodePath, RunCommand, RunId};
use cairn_storage::{
    AsyncReads, Backend, BudgetLimits, BudgetWait, Claims, Cursor, EventLog, EventQuery,
    FireRecord, Fleet, GenerationRecord, Generations, Inbox, InboxEntry, LeaseHolder, Listener,
    ModelBudgets, NewRun, ProcessRecord, Processes, RunFilter, RunLease, RunRecord, Runs,
    ScheduleRecord, SnapshotObjects, StoreError, StoreFuture, StoredEvent, StoredObject,
    ToolCallRecord, ToolCalls, Topic, Wakeups,
};

pub use schema::SCHEMA_VERSION;

use config::Target;
use db::Db;
use lease::Leases;
use rt::Bridge;
use wake::Wake;

/// How a [`PgBackend`] is set up beyond its URL.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// The schema that holds the store's tables, created if missing: a
    /// plain identifier, `[a-z_][a-z0-9_]{0,62}`. `None` is `public`.
    /// Stores in different schemas of one database are independent, wake-ups
    /// included.
    pub schema: Option<String>,
    /// How long a run's lease outlives its holder's last renewal (renewals
    /// come every third of it): how long a run of a crashed process stays
    /// locked. Default 5 s.
    pub lease_ttl: Duration,
    /// The most connections the backend opens for queries (one more is kept
    /// for wake-ups). Default 4; 0 counts as 1.
    pub pool_size: usize,
    /// The name its leases give, for people asking who drives a run
    /// (`Leases::drivers`); checked by `cairn_storage::check_instance_name`.
    /// `None` is the host name and pid.
    pub instance: Option<String>,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            schema: None,
            lease_ttl: Duration::from_secs(5),
            pool_size: 4,
            instance: None,
        }
    }
}

/// Cairn's store in a PostgreSQL database.
///
/// The [`Backend`] methods are synchronous: each runs its queries on the
/// backend's own small runtime (threads named `cairn-pg`) and blocks the
/// calling thread until they are done. That is safe from any thread, but
/// called from inside an async task it blocks that task's worker thread
/// meanwhile, as any blocking call does: use `spawn_blocking` there, as the
/// journal does.
///
/// Dropping the backend stops its runtime, its lease heartbeat and its
/// connections (also when dropped inside another runtime). Leases still
/// alive then are not renewed any more and expire after the ttl.
pub struct PgBackend {
    shared: Arc<Shared>,
}

/// What the backend and its leases share.
pub(crate) struct Shared {
    /// The store's id, kept in its schema (see `Backend::store_id`).
    store_id: String,
    pub(crate) db: Db,
    pub(crate) leases: Arc<Leases>,
    /// This backend's instance name (`--instance-name`).
    instance: String,
    /// The advisory lock claimers of this schema take turns on.
    pub(crate) claim_lock: i64,
    /// Registered as a claimer ([`Claims::join`]): the heartbeat says so.
    claimer: Arc<std::sync::atomic::AtomicBool>,
    wake: Wake,
    /// Last, so that it stops once the rest is dropped.
    pub(crate) bridge: Bridge,
}

impl PgBackend {
    /// Opens the store at `url` (`postgres://user:password@host:port/db` or
    /// `postgresql://...`) in the `public` schema, with default options.
    pub fn open(url: &str) -> Result<PgBackend, StoreError> {
        PgBackend::open_with(url, PgOptions::default())
    }

    /// Opens the store at `url` as `opts` say: connects, creates or
    /// migrates the schema, and starts listening for wake-ups.
    ///
    /// Errors: [`StoreError::Open`] for a bad URL or schema name or a server
    /// that cannot be reached, [`StoreError::TooNew`] for a schema written by
    /// a newer Cairn, [`StoreError::Corrupt`] for a schema that holds tables
    /// of another program under Cairn's names.
    pub fn open_with(url: &str, opts: PgOptions) -> Result<PgBackend, StoreError> {
        let target = Target::parse(url, opts.schema.as_deref())?;
        let bridge = Bridge::new().map_err(|e| StoreError::Open {
            store: target.place.clone(),
            detail: format!("cannot start the client's threads: {e}"),
        })?;
        let db = Db::new(
            target.config.clone(),
            target.tls.clone(),
            opts.pool_size,
            target.place.clone(),
        )?;

        let (migrating, schema) = (db.clone(), target.schema.clone());
        let store_id = bridge.run(async move { schema::migrate(&migrating, &schema).await })?;

        let (wake_config, tls, channel, place) = (
            target.wake_config(),
            target.tls.clone(),
            target.channel(),
            target.place.clone(),
        );
        let wake = bridge.run(async move {
            Wake::start(wake_config, tls, channel)
                .await
                .map_err(|detail| StoreError::Open {
                    store: place,
                    detail: format!("cannot listen for wake-ups: {detail}"),
                })
        })?;

        let instance = opts
            .instance
            .clone()
            .unwrap_or_else(cairn_storage::default_instance_name);
        cairn_storage::check_instance_name(&instance).map_err(|detail| StoreError::Open {
            store: target.place.clone(),
            detail,
        })?;
        let leases = Arc::new(Leases::new(opts.lease_ttl, &instance));
        let claimer = Arc::new(std::sync::atomic::AtomicBool::new(false));
        bridge.handle().spawn(lease::heartbeat(
            db.clone(),
            leases.clone(),
            claimer.clone(),
        ));
        let claim_lock = config::fnv1a(format!("cairn claims {}", target.schema).as_bytes()) as i64;
        Ok(PgBackend {
            shared: Arc::new(Shared {
                store_id,
                db,
                leases,
                instance,
                claim_lock,
                claimer,
                wake,
                bridge,
            }),
        })
    }

    /// Runs a query function on the backend's runtime and waits for it.
    fn run<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(Db) -> Fut,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
        T: Send + 'static,
    {
        self.shared.bridge.run(f(self.shared.db.clone()))
    }
}

impl std::fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBackend")
            .field("store", &self.shared.db.place())
            .field("owner", &self.shared.leases.owner())
            .finish_non_exhaustive()
    }
}

impl EventLog for PgBackend {
    fn append(&self, batch: &[StoredEvent]) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let batch = batch.to_vec();
        let owner = self.shared.leases.owner().to_string();
        self.run(move |db| async move { events::append(&db, &owner, &[], &batch).await })
    }

    fn read_events(&self, run_id: &RunId, q: &EventQuery) -> Result<Vec<StoredEvent>, StoreError> {
        let (run, q) = (run_id.clone(), q.clone());
        self.run(move |db| async move { events::read(&db, &run, &q).await })
    }

    fn last_seq(&self, run_id: &RunId) -> Result<u64, StoreError> {
        let run = run_id.clone();
        self.run(move |db| async move { events::last_seq(&db, &run).await })
    }
}

impl AsyncReads for PgBackend {
    fn read_events_async(&self, run_id: &RunId, q: &EventQuery) -> StoreFuture<Vec<StoredEvent>> {
        let (db, run, q) = (self.shared.db.clone(), run_id.clone(), q.clone());
        self.shared
            .bridge
            .spawn(async move { events::read(&db, &run, &q).await })
    }

    fn last_seq_async(&self, run_id: &RunId) -> StoreFuture<u64> {
        let (db, run) = (self.shared.db.clone(), run_id.clone());
        self.shared
            .bridge
            .spawn(async move { events::last_seq(&db, &run).await })
    }

    fn get_run_async(&self, run_id: &RunId) -> StoreFuture<Option<RunRecord>> {
        let (db, run) = (self.shared.db.clone(), run_id.clone());
        self.shared
            .bridge
            .spawn(async move { runs::get(&db, &run).await })
    }

    fn list_runs_async(&self, f: &RunFilter) -> StoreFuture<Vec<RunRecord>> {
        let (db, f) = (self.shared.db.clone(), f.clone());
        self.shared
            .bridge
            .spawn(async move { runs::list(&db, &f).await })
    }
}

impl Runs for PgBackend {
    fn create_run(&self, rec: &RunRecord) -> Result<(), StoreError> {
        let rec = rec.clone();
        self.run(move |db| async move { runs::create(&db, &rec).await })
    }

    fn start_run(&self, start: &NewRun<'_>) -> Result<(), StoreError> {
        let record = start.record.cloned();
        let pinned = start.pinned.cloned();
        let first = start.first.clone();
        let owner = self.shared.leases.owner().to_string();
        self.run(move |db| async move {
            events::start_run(&db, &owner, record.as_ref(), pinned.as_ref(), &first).await
        })
    }

    fn get_run(&self, run_id: &RunId) -> Result<Option<RunRecord>, StoreError> {
        let run = run_id.clone();
        self.run(move |db| async move { runs::get(&db, &run).await })
    }

    fn list_runs(&self, f: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let f = f.clone();
        self.run(move |db| async move { runs::list(&db, &f).await })
    }

    fn delete_finished_before(&self, cutoff_ms: i64) -> Result<Vec<RunId>, StoreError> {
        let candidates =
            self.run(move |db| async move { runs::gc_candidates(&db, cutoff_ms).await })?;
        // A run being resumed right now holds its lease: leave it alone. The
        // leases taken here stay held until the deletion has committed.
        let mut leases = Vec::new();
        let mut ids = Vec::new();
        for id in candidates {
            if let Some(l) = cairn_storage::Leases::try_lock_run(self, &id)? {
                leases.push(l);
                ids.push(id);
            }
        }
        let deleted =
            self.run(move |db| async move { runs::delete_due(&db, &ids, cutoff_ms).await });
        drop(leases);
        deleted
    }
}

impl Generations for PgBackend {
    fn put_generation(&self, rec: &GenerationRecord) -> Result<(), StoreError> {
        let rec = rec.clone();
        self.run(move |db| async move { records::put_generation(&db, &rec).await })
    }

    fn generation(
        &self,
        run_id: &RunId,
        generation: u64,
    ) -> Result<Option<GenerationRecord>, StoreError> {
        let run = run_id.clone();
        self.run(move |db| async move { records::generation(&db, &run, generation).await })
    }
}

impl cairn_storage::Leases for PgBackend {
    fn try_lock_run(&self, run_id: &RunId) -> Result<Option<Box<dyn RunLease>>, StoreError> {
        self.shared.try_lock_run(run_id)
    }

    fn lease_holder(&self, run_id: &RunId) -> Result<Option<LeaseHolder>, StoreError> {
        self.shared.lease_holder(run_id)
    }

    fn drivers(
        &self,
        runs: &[RunId],
    ) -> Result<std::collections::HashMap<RunId, String>, StoreError> {
        self.shared.drivers(runs)
    }
}

impl ToolCalls for PgBackend {
    fn put_tool_call(&self, rec: &ToolCallRecord) -> Result<(), StoreError> {
        let rec = rec.clone();
        self.run(move |db| async move { records::put_tool_call(&db, &rec).await })
    }

    fn tool_calls(
        &self,
        run_id: &RunId,
        node_id: &NodePath,
        iteration: u32,
    ) -> Result<Vec<ToolCallRecord>, StoreError> {
        let (run, node) = (run_id.clone(), node_id.clone());
        self.run(move |db| async move { records::tool_calls(&db, &run, &node, iteration).await })
    }
}

impl Inbox for PgBackend {
    fn put_command(&self, run_id: &RunId, command: &RunCommand) -> Result<u64, StoreError> {
        let (run, command) = (run_id.clone(), command.clone());
        self.run(move |db| async move { records::put_command(&db, &run, &command).await })
    }

    fn pending_commands(&self, run_id: &RunId) -> Result<Vec<InboxEntry>, StoreError> {
        let run = run_id.clone();
        self.run(move |db| async move { records::pending_commands(&db, &run).await })
    }

    fn take_command(&self, id: u64, outcome: &str) -> Result<(), StoreError> {
        let outcome = outcome.to_string();
        self.run(move |db| async move { records::take_command(&db, id, &outcome).await })
    }
}

impl Processes for PgBackend {
    fn put_process(&self, rec: &ProcessRecord) -> Result<u64, StoreError> {
        let rec = rec.clone();
        self.run(move |db| async move { records::put_process(&db, &rec).await })
    }

    fn remove_process(&self, id: u64) -> Result<(), StoreError> {
        self.run(move |db| async move { records::remove_process(&db, id).await })
    }

    fn processes(&self, run_id: &RunId) -> Result<Vec<ProcessRecord>, StoreError> {
        let run = run_id.clone();
        self.run(move |db| async move { records::processes(&db, &run).await })
    }
}

impl Wakeups for PgBackend {
    fn notify(&self, topic: Topic<'_>) {
        self.shared.wake.notify(topic);
    }

    fn notify_sent(&self, topic: Topic<'_>) {
        let (shared, key) = (self.shared.clone(), topic.key());
        let _ = self.shared.bridge.run(async move {
            shared.wake.notify_sent(key).await;
            Ok::<(), StoreError>(())
        });
    }

    fn listen(&self, topic: Topic<'_>) -> Result<Box<dyn Listener>, StoreError> {
        Ok(self.shared.wake.listen(topic))
    }
}

impl Backend for PgBackend {
    fn append_with_calls(
        &self,
        calls: &[ToolCallRecord],
        batch: &[StoredEvent],
    ) -> Result<(), StoreError> {
        if batch.is_empty() && calls.is_empty() {
            return Ok(());
        }
        let (calls, batch) = (calls.to_vec(), batch.to_vec());
        let owner = self.shared.leases.owner().to_string();
        self.run(move |db| async move { events::append(&db, &owner, &calls, &batch).await })
    }

    fn store_id(&self) -> String {
        self.shared.store_id.clone()
    }

    fn model_budgets(&self) -> Option<&dyn ModelBudgets> {
        Some(self)
    }

    fn claims(&self) -> Option<&dyn Claims> {
        Some(self)
    }

    fn snapshot_objects(&self) -> Option<&dyn SnapshotObjects> {
        Some(self)
    }

    fn schedules(&self) -> Option<&dyn cairn_storage::Schedules> {
        Some(self)
    }
}

impl cairn_storage::Schedules for PgBackend {
    fn put_schedule(&self, rec: &ScheduleRecord, replace: bool) -> Result<bool, StoreError> {
        let rec = rec.clone();
        self.run(move |db| async move { schedules::put(&db, rec, replace).await })
    }

    fn get_schedule(&self, name: &str) -> Result<Option<ScheduleRecord>, StoreError> {
        let name = name.to_string();
        self.run(move |db| async move { schedules::get(&db, name).await })
    }

    fn list_schedules(&self) -> Result<Vec<ScheduleRecord>, StoreError> {
        self.run(move |db| async move { schedules::list(&db).await })
    }

    fn delete_schedule(&self, name: &str) -> Result<bool, StoreError> {
        let name = name.to_string();
        self.run(move |db| async move { schedules::delete(&db, name).await })
    }

    fn set_paused(&self, name: &str, paused: bool, cursor: Cursor) -> Result<bool, StoreError> {
        let name = name.to_string();
        self.run(move |db| async move { schedules::set_paused(&db, name, paused, cursor).await })
    }

    fn advance_schedule(
        &self,
        name: &str,
        expected: Cursor,
        new: Cursor,
        fires: &[FireRecord],
    ) -> Result<bool, StoreError> {
        let (name, fires) = (name.to_string(), fires.to_vec());
        self.run(move |db| async move { schedules::advance(&db, name, expected, new, fires).await })
    }

    fn update_fire(&self, fire: &FireRecord) -> Result<(), StoreError> {
        let fire = fire.clone();
        self.run(move |db| async move { schedules::update_fire(&db, fire).await })
    }

    fn fires(&self, name: &str, limit: usize) -> Result<Vec<FireRecord>, StoreError> {
        let name = name.to_string();
        self.run(move |db| async move { schedules::fires(&db, name, limit).await })
    }

    fn firing(&self) -> Result<Vec<FireRecord>, StoreError> {
        self.run(move |db| async move { schedules::firing(&db).await })
    }
}

impl SnapshotObjects for PgBackend {
    fn objects_held(&self, ids: &[[u8; 20]]) -> Result<Vec<[u8; 20]>, StoreError> {
        let ids = ids.to_vec();
        self.run(move |db| async move { objects::held(&db, &ids).await })
    }

    fn put_objects(&self, objects: &[StoredObject]) -> Result<(), StoreError> {
        let objects = objects.to_vec();
        self.run(move |db| async move { objects::put(&db, &objects).await })
    }

    fn get_objects(&self, ids: &[[u8; 20]]) -> Result<Vec<StoredObject>, StoreError> {
        let ids = ids.to_vec();
        self.run(move |db| async move { objects::get(&db, &ids).await })
    }

    fn retain_objects(
        &self,
        live: &std::collections::HashSet<[u8; 20]>,
        before_ms: i64,
    ) -> Result<(u64, u64, u64), StoreError> {
        let live = live.clone();
        self.run(move |db| async move { objects::retain(&db, &live, before_ms).await })
    }
}

impl Claims for PgBackend {
    fn queue_run(
        &self,
        rec: &RunRecord,
        pinned: Option<&GenerationRecord>,
    ) -> Result<(), StoreError> {
        let (rec, pinned) = (rec.clone(), pinned.cloned());
        self.run(move |db| async move { claims::queue_run(&db, &rec, pinned.as_ref()).await })?;
        self.notify(Topic::Queued);
        Ok(())
    }

    fn join(&self, capacity: usize) -> Result<(), StoreError> {
        let owner = self.shared.leases.owner().to_string();
        let name = self.shared.instance.clone();
        let capacity = i64::try_from(capacity).unwrap_or(i64::MAX);
        self.run(move |db| async move { claims::join(&db, &owner, &name, capacity).await })?;
        self.shared
            .claimer
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    fn leave(&self) -> Result<(), StoreError> {
        self.shared
            .claimer
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let owner = self.shared.leases.owner().to_string();
        self.run(move |db| async move { claims::leave(&db, &owner).await })
    }

    fn claim(&self, max: usize) -> Result<Vec<cairn_storage::Claimed>, StoreError> {
        self.shared.claim(max)
    }

    fn fleet(&self) -> Result<Fleet, StoreError> {
        let owner = self.shared.leases.owner().to_string();
        let ttl = self.shared.leases.ttl_secs();
        self.run(move |db| async move { claims::fleet(&db, &owner, ttl).await })
    }
}

impl ModelBudgets for PgBackend {
    fn begin_call(
        &self,
        key: &str,
        limits: &BudgetLimits,
        estimate: u64,
        lease: Duration,
    ) -> Result<Result<u64, BudgetWait>, StoreError> {
        let (key, limits) = (key.to_string(), *limits);
        self.run(
            move |db| async move { budget::begin_call(&db, &key, limits, estimate, lease).await },
        )
    }

    fn end_call(&self, id: u64, tokens: u64) -> Result<(), StoreError> {
        self.run(move |db| async move { budget::end_call(&db, id, tokens).await })
    }
}
