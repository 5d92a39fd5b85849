//! The backend conformance suite on PostgreSQL: each check on backends in
//! fresh schemas of the server named by `CAIRN_TEST_PG`: skipped (with a
//! line on stderr) when it is not set, failed when nothing answers there.

use cairn_postgres::testing as common;

// The macro makes one test per check, each calling `check(&factory)`; this
// factory expression returns from the test when there is no server, and
// otherwise is a closure owning the test's scratch schemas, which it drops
// once the check has returned (or keeps, if it failed).
cairn_storage::backend_conformance_tests!({
    let Some(scratch) = common::Scratch::new() else {
        return;
    };
    move || scratch.fresh()
});
