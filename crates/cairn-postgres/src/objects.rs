//! Workspace snapshot objects in the database
//! ([`cairn_storage::SnapshotObjects`]): one row per object, its id the
//! primary key, so that a second write of an object is a no-op and
//! machines that share the store share its snapshots. Bodies are kept
//! uncompressed: PostgreSQL compresses large values itself (TOAST).

use std::collections::HashSet;

use cairn_storage::{StoreError, StoredObject};

use crate::db::Db;

const HELD: &str = "SELECT id FROM snapshot_objects WHERE id = ANY($1::bytea[])";

const PUT: &str = "INSERT INTO snapshot_objects (id, kind, body, stored_ms) \
     SELECT i, k, b, $4 FROM unnest($1::bytea[], $2::text[], $3::bytea[]) AS t(i, k, b) \
     ON CONFLICT (id) DO NOTHING";

const GET: &str = "SELECT id, kind, body FROM snapshot_objects WHERE id = ANY($1::bytea[])";

/// Deletes, in one statement, what is neither live nor recent; returns
/// each deleted body's length.
const PRUNE: &str = "DELETE FROM snapshot_objects \
     WHERE stored_ms < $2 AND NOT (id = ANY($1::bytea[])) RETURNING octet_length(body)";

const COUNT: &str = "SELECT count(*) FROM snapshot_objects";

fn id_of(bytes: &[u8]) -> Option<[u8; 20]> {
    bytes.try_into().ok()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub(crate) async fn held(db: &Db, ids: &[[u8; 20]]) -> Result<Vec<[u8; 20]>, StoreError> {
    let client = db.client().await?;
    let ids: Vec<&[u8]> = ids.iter().map(|i| i.as_slice()).collect();
    let st = client.prepare_cached(HELD).await.map_err(|e| db.err(e))?;
    let rows = client.query(&st, &[&ids]).await.map_err(|e| db.err(e))?;
    Ok(rows
        .iter()
        .filter_map(|r| id_of(r.get::<_, &[u8]>(0)))
        .collect())
}

pub(crate) async fn put(db: &Db, objects: &[StoredObject]) -> Result<(), StoreError> {
    if objects.is_empty() {
        return Ok(());
    }
    let client = db.client().await?;
    let ids: Vec<&[u8]> = objects.iter().map(|o| o.id.as_slice()).collect();
    let kinds: Vec<&str> = objects.iter().map(|o| o.kind.as_str()).collect();
    let bodies: Vec<&[u8]> = objects.iter().map(|o| o.body.as_slice()).collect();
    let st = client.prepare_cached(PUT).await.map_err(|e| db.err(e))?;
    client
        .execute(&st, &[&ids, &kinds, &bodies, &now_ms()])
        .await
        .map_err(|e| db.err(e))?;
    Ok(())
}

pub(crate) async fn get(db: &Db, ids: &[[u8; 20]]) -> Result<Vec<StoredObject>, StoreError> {
    let client = db.client().await?;
    let ids: Vec<&[u8]> = ids.iter().map(|i| i.as_slice()).collect();
    let st = client.prepare_cached(GET).await.map_err(|e| db.err(e))?;
    let rows = client.query(&st, &[&ids]).await.map_err(|e| db.err(e))?;
    Ok(rows
        .iter()
        .filter_map(|r| {
            Some(StoredObject {
                id: id_of(r.get::<_, &[u8]>(0))?,
                kind: r.get(1),
                body: r.get(2),
            })
        })
        .collect())
}

pub(crate) async fn retain(
    db: &Db,
    live: &HashSet<[u8; 20]>,
    before_ms: i64,
) -> Result<(u64, u64, u64), StoreError> {
    let client = db.client().await?;
    let live: Vec<&[u8]> = live.iter().map(|i| i.as_slice()).collect();
    let rows = client
        .query(PRUNE, &[&live, &before_ms])
        .await
        .map_err(|e| db.err(e))?;
    let bytes: i64 = rows.iter().map(|r| r.get::<_, i32>(0) as i64).sum();
    let kept: i64 = client
        .query_one(COUNT, &[])
        .await
        .map_err(|e| db.err(e))?
        .get(0);
    Ok((rows.len() as u64, bytes.max(0) as u64, kept.max(0) as u64))
}
