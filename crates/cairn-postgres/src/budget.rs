//! The models' budgets every instance on the store shares
//! ([`cairn_storage::ModelBudgets`]): one row per model call in
//! `model_calls`, counted under a transaction-scoped advisory lock per
//! model, so that two instances deciding at once take turns.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cairn_storage::{BudgetLimits, BudgetWait, StoreError};

use crate::config::fnv1a;
use crate::db::Db;

/// How long the per-minute windows are.
const WINDOW_MS: i64 = 60_000;

/// How long to wait for a call in flight to end before looking again: no
/// instance is told when another's call ends.
const SLOT_POLL: Duration = Duration::from_millis(200);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Begins a call on the model `key` names if its limits allow it now.
pub(crate) async fn begin_call(
    db: &Db,
    key: &str,
    limits: BudgetLimits,
    estimate: u64,
    lease: Duration,
) -> Result<Result<u64, BudgetWait>, StoreError> {
    let mut client = db.client().await?;
    let tx = client.transaction().await.map_err(|e| db.err(e))?;
    let lock = fnv1a(format!("cairn model budget {key}").as_bytes()) as i64;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock])
        .await
        .map_err(|e| db.err(e))?;
    let now = now_ms();
    // What no window counts any more, and leases of calls whose process
    // died, go first.
    tx.execute(
        "DELETE FROM model_calls WHERE model_key = $1 AND started_ms <= $2 \
         AND (open_until_ms IS NULL OR open_until_ms <= $3)",
        &[&key, &(now - WINDOW_MS), &now],
    )
    .await
    .map_err(|e| db.err(e))?;
    let row = tx
        .query_one(
            "SELECT count(*) FILTER (WHERE open_until_ms > $2), \
                    count(*) FILTER (WHERE started_ms > $3), \
                    coalesce(sum(tokens) FILTER (WHERE started_ms > $3), 0)::bigint, \
                    min(started_ms) FILTER (WHERE started_ms > $3) \
             FROM model_calls WHERE model_key = $1",
            &[&key, &now, &(now - WINDOW_MS)],
        )
        .await
        .map_err(|e| db.err(e))?;
    let in_flight: i64 = row.try_get(0).map_err(|e| db.err(e))?;
    let begun: i64 = row.try_get(1).map_err(|e| db.err(e))?;
    let tokens: i64 = row.try_get(2).map_err(|e| db.err(e))?;
    let oldest: Option<i64> = row.try_get(3).map_err(|e| db.err(e))?;
    // The oldest call of the window leaving it is the first change that
    // may let this one through.
    let until_oldest_leaves =
        || oldest.map(|t| Duration::from_millis((t + WINDOW_MS - now).max(1) as u64));
    let wait = if limits
        .max_concurrency
        .is_some_and(|n| in_flight >= i64::from(n))
    {
        Some(BudgetWait {
            reason: "concurrency",
            wait: Some(SLOT_POLL),
        })
    } else if limits
        .requests_per_minute
        .is_some_and(|n| begun >= i64::from(n))
    {
        Some(BudgetWait {
            reason: "requests_per_minute",
            wait: until_oldest_leaves(),
        })
    } else if limits.tokens_per_minute.is_some_and(|n| {
        // One call larger than the whole budget goes alone.
        tokens > 0 && (tokens as u64).saturating_add(estimate) > n
    }) {
        Some(BudgetWait {
            reason: "tokens_per_minute",
            wait: until_oldest_leaves(),
        })
    } else {
        None
    };
    if let Some(w) = wait {
        tx.commit().await.map_err(|e| db.err(e))?;
        return Ok(Err(w));
    }
    let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 2);
    let id: i64 = tx
        .query_one(
            "INSERT INTO model_calls (model_key, started_ms, tokens, open_until_ms) \
             VALUES ($1, $2, $3, $4) RETURNING id",
            &[
                &key,
                &now,
                &(estimate.min(i64::MAX as u64) as i64),
                &now.saturating_add(lease_ms),
            ],
        )
        .await
        .and_then(|r| r.try_get(0))
        .map_err(|e| db.err(e))?;
    tx.commit().await.map_err(|e| db.err(e))?;
    Ok(Ok(id as u64))
}

/// Ends a call: no longer in flight, its tokens what it used. An unknown
/// id (already swept) is no error.
pub(crate) async fn end_call(db: &Db, id: u64, tokens: u64) -> Result<(), StoreError> {
    let Ok(id) = i64::try_from(id) else {
        return Ok(());
    };
    let client = db.client().await?;
    client
        .execute(
            "UPDATE model_calls SET open_until_ms = NULL, tokens = $2 WHERE id = $1",
            &[&id, &(tokens.min(i64::MAX as u64) as i64)],
        )
        .await
        .map_err(|e| db.err(e))?;
    Ok(())
}
