//! Runs as shared work ([`cairn_storage::Claims`]): a queued run is a row
//! with status `queued` and no live lease; an instance claims some by
//! taking their leases, under a transaction-scoped advisory lock that
//! makes claimers take turns, so that each judges its share from the
//! loads the others' claims left.
//!
//! Claimers are rows of `instances` (owner id, name, capacity, last seen),
//! seen by the lease heartbeat; one not seen for a lease's ttl counts no
//! more (its runs' leases expire with it, and the failover takes them).
//! An instance's load is counted from the leases themselves, not from what
//! it says: a claim and the load it adds are one transaction.

use std::sync::Arc;

use cairn_events::RunId;
use cairn_storage::{
    fair_share, Fleet, GenerationRecord, InstanceLoad, RunLease, RunRecord, StoreError,
};
use tokio_postgres::error::SqlState;

use crate::db::Db;
use crate::lease::PgLease;
use crate::Shared;

/// The claimers seen within the ttl (`$1`, seconds), each with its load:
/// the runs whose live lease it holds that do not wait for a person.
const LOADS: &str = "SELECT i.owner, i.name, i.capacity, coalesce(d.n, 0) \
     FROM instances i LEFT JOIN ( \
       SELECT l.owner, count(*) AS n FROM leases l JOIN runs r ON r.run_id = l.run_id \
       WHERE l.expires_at > clock_timestamp() \
         AND r.status NOT IN ('waiting-approval', 'waiting-input') \
       GROUP BY l.owner) d ON d.owner = i.owner \
     WHERE i.seen_at > clock_timestamp() - $1::float8 * interval '1 second' \
     ORDER BY i.name, i.owner";

/// Claimable runs: queued, or not ended and driven by nobody (their
/// instance stopped and gave them back, or died and its lease expired: a
/// failover is a claim too, so the runs of a dead instance are shared as
/// new ones are). A claim whose claimer died before the run's first
/// event has an expired lease: the run is claimable again.
const CLAIMABLE: &str = "r.status IN ('queued', 'running', 'waiting-approval', 'waiting-input') \
     AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.run_id = r.run_id \
       AND l.expires_at > clock_timestamp())";

/// How many runs are claimable.
fn queued_query() -> String {
    format!("SELECT count(*) FROM runs r WHERE {CLAIMABLE}")
}

/// The oldest `$1` claimable runs, locked (a run being deleted, or claimed
/// by a writer that skipped the advisory lock, is skipped).
fn pick_query() -> String {
    format!(
        "SELECT r.run_id FROM runs r WHERE {CLAIMABLE} \
         ORDER BY r.created_ms, r.created_order LIMIT $1 FOR UPDATE OF r SKIP LOCKED"
    )
}

/// Takes the leases of `$1` for `$2`, where free or expired.
const TAKE: &str = "INSERT INTO leases (run_id, owner, expires_at) \
     SELECT unnest($1::text[]), $2, clock_timestamp() + $3::float8 * interval '1 second' \
     ON CONFLICT (run_id) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at \
     WHERE leases.expires_at < clock_timestamp() OR leases.owner = EXCLUDED.owner \
     RETURNING run_id";

const JOIN: &str = "INSERT INTO instances (owner, name, capacity, seen_at) \
     VALUES ($1, $2, $3, clock_timestamp()) \
     ON CONFLICT (owner) DO UPDATE SET capacity = EXCLUDED.capacity, seen_at = EXCLUDED.seen_at";

const LEAVE: &str = "DELETE FROM instances WHERE owner = $1";

/// Marks this instance seen, and forgets claimers gone for long (a
/// `kill -9` leaves its row behind).
const SEEN: &str =
    "WITH seen AS (UPDATE instances SET seen_at = clock_timestamp() WHERE owner = $1) \
     DELETE FROM instances WHERE seen_at < clock_timestamp() - interval '1 day'";

/// Writes a queued run's row and pinned files in one transaction.
pub(crate) async fn queue_run(
    db: &Db,
    rec: &RunRecord,
    pinned: Option<&GenerationRecord>,
) -> Result<(), StoreError> {
    let mut client = db.client().await?;
    let written = async {
        let tx = client.transaction().await?;
        crate::runs::insert(&tx, rec).await?;
        if let Some(g) = pinned {
            crate::records::insert_generation(&tx, g).await?;
        }
        tx.commit().await
    };
    written.await.map_err(|e| match e.code() {
        Some(&SqlState::UNIQUE_VIOLATION)
            if e.as_db_error().and_then(|d| d.table()) == Some("runs") =>
        {
            StoreError::RunExists(rec.run_id.to_string())
        }
        _ => db.err(e),
    })
}

pub(crate) async fn join(
    db: &Db,
    owner: &str,
    name: &str,
    capacity: i64,
) -> Result<(), StoreError> {
    let client = db.client().await?;
    client
        .execute(JOIN, &[&owner, &name, &capacity])
        .await
        .map_err(|e| db.err(e))?;
    Ok(())
}

pub(crate) async fn leave(db: &Db, owner: &str) -> Result<(), StoreError> {
    let client = db.client().await?;
    client
        .execute(LEAVE, &[&owner])
        .await
        .map_err(|e| db.err(e))?;
    Ok(())
}

/// The heartbeat's part: this instance is still here.
pub(crate) async fn seen(db: &Db, owner: &str) -> Result<(), StoreError> {
    let client = db.client().await?;
    let st = client.prepare_cached(SEEN).await.map_err(|e| db.err(e))?;
    client
        .execute(&st, &[&owner])
        .await
        .map_err(|e| db.err(e))?;
    Ok(())
}

/// The claimers and the queue, as one snapshot of `c`.
async fn fleet_in<C: tokio_postgres::GenericClient>(
    c: &C,
    owner: &str,
    ttl_secs: f64,
) -> Result<Fleet, tokio_postgres::Error> {
    let mut instances = Vec::new();
    for row in c.query(LOADS, &[&ttl_secs]).await? {
        let who: String = row.try_get(0)?;
        instances.push(InstanceLoad {
            me: who == owner,
            instance: row.try_get(1)?,
            capacity: row.try_get::<_, i64>(2)?.max(0) as u64,
            driving: row.try_get::<_, i64>(3)?.max(0) as u64,
        });
    }
    let queued: i64 = c.query_one(&queued_query(), &[]).await?.try_get(0)?;
    Ok(Fleet {
        instances,
        queued: queued.max(0) as u64,
    })
}

pub(crate) async fn fleet(db: &Db, owner: &str, ttl_secs: f64) -> Result<Fleet, StoreError> {
    let client = db.client().await?;
    fleet_in(&**client, owner, ttl_secs)
        .await
        .map_err(|e| db.err(e))
}

impl Shared {
    /// `Claims::claim`.
    pub(crate) fn claim(
        self: &Arc<Self>,
        max: usize,
    ) -> Result<Vec<cairn_storage::Claimed>, StoreError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let (db, leases, lock) = (self.db.clone(), self.leases.clone(), self.claim_lock);
        let got = self.bridge.run(async move {
            let owner = leases.owner().to_string();
            let ttl = leases.ttl_secs();
            let mut client = db.client().await?;
            let tx = client.transaction().await.map_err(|e| db.err(e))?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock])
                .await
                .map_err(|e| db.err(e))?;
            let fleet = fleet_in(&*tx, &owner, ttl).await.map_err(|e| db.err(e))?;
            let n = fair_share(&fleet.instances, fleet.queued).min(max as u64) as i64;
            if n == 0 {
                return Ok(Vec::new());
            }
            let picked: Vec<String> = tx
                .query(&pick_query(), &[&n])
                .await
                .map_err(|e| db.err(e))?
                .iter()
                .map(|r| r.try_get(0))
                .collect::<Result<_, _>>()
                .map_err(|e| db.err(e))?;
            // A run this process holds or is taking (a command applied to
            // it) is not claimed twice.
            let mut reserved = Vec::new();
            for run in picked {
                let Ok(id) = RunId::parse(&run) else { continue };
                if let Some(token) = leases.reserve(&id) {
                    reserved.push((id, token));
                }
            }
            let ids: Vec<&str> = reserved.iter().map(|(r, _)| r.as_str()).collect();
            let taken = async {
                let rows = tx.query(TAKE, &[&ids, &owner, &ttl]).await?;
                let taken: Vec<String> = rows
                    .iter()
                    .map(|r| r.try_get(0))
                    .collect::<Result<_, _>>()?;
                tx.commit().await?;
                Ok::<_, tokio_postgres::Error>(taken)
            }
            .await;
            match taken {
                Ok(taken) => Ok(reserved
                    .into_iter()
                    .filter_map(|(id, token)| {
                        if taken.iter().any(|t| t == id.as_str()) {
                            leases.set_live(&id, token, true);
                            Some((id, token))
                        } else {
                            leases.forget(&id, token);
                            None
                        }
                    })
                    .collect::<Vec<_>>()),
                Err(e) => {
                    for (id, token) in &reserved {
                        leases.forget(id, *token);
                    }
                    Err(db.err(e))
                }
            }
        })?;
        Ok(got
            .into_iter()
            .map(|(id, token)| {
                let lease: Box<dyn RunLease> = Box::new(PgLease {
                    run_id: id.clone(),
                    token,
                    home: Arc::downgrade(self),
                });
                (id, lease)
            })
            .collect())
    }
}
