//! `cairn doctor`: which walls of the process sandbox stand on this machine.

use crate::{EXIT_FAILED, EXIT_OK};

/// Prints one line per wall and a verdict; exit code 0 when every required
/// wall stands, 1 when processes would be refused.
pub fn doctor(json: bool) -> u8 {
    let report = cairn_sandbox::probe();
    let code = if report.sandbox_ok() {
        EXIT_OK
    } else {
        EXIT_FAILED
    };
    if json {
        let checks: Vec<serde_json::Value> = report
            .checks
            .iter()
            .map(|c| {
                serde_json::json!({
                    "name": c.name, "ok": c.ok, "required": c.required, "detail": c.detail,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "sandboxOk": report.sandbox_ok(), "checks": checks })
        );
        return code;
    }
    for c in &report.checks {
        let mark = match (c.ok, c.required) {
            (true, _) => "ok  ",
            (false, true) => "FAIL",
            (false, false) => "--  ",
        };
        println!("{mark} {:<34} {}", c.name, c.detail);
    }
    println!();
    if report.sandbox_ok() {
        println!(
            "verdict: the process sandbox works here; every process a node starts is confined."
        );
        EXIT_OK
    } else {
        println!(
            "verdict: the process sandbox cannot be built here; nodes that start processes will be refused ({}).",
            cairn_sandbox::OPT_OUT_HINT
        );
        EXIT_FAILED
    }
}
