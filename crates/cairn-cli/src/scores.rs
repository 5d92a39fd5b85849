//! `cairn scores`: what the nodes' scorers said across the runs in the
//! store, per workflow, node and scorer, and per generation of the file.

use std::io::Write;

use cairn_api::{ScoreReport, ScorerStats};
use cairn_store::{aggregate_scores, ScoreFilter};

use crate::cli::{Global, ScoresArgs};
use crate::format::datetime_ms;
use crate::store;

/// `cairn scores`.
pub async fn scores(g: &Global, a: ScoresArgs) -> anyhow::Result<u8> {
    let report = if let Some(url) = &g.server {
        crate::remote::client(url, g)?
            .scores(a.workflow.as_deref(), a.node.as_deref())
            .await
            .map_err(crate::remote::client_error)?
    } else if g.store_exists() {
        let j = store::open(g, false)?;
        let filter = ScoreFilter {
            workflow: a.workflow.clone(),
            node: a.node.clone(),
        };
        let report = aggregate_scores(j.backend().as_ref(), &filter);
        j.close();
        // The store's report is the API's, field for field (`GET
        // /v1/scores` serves it): read as the API's, one type to show.
        serde_json::from_value(serde_json::to_value(report?)?)?
    } else {
        // No store yet means no runs, so no scores.
        ScoreReport::default()
    };
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
        return Ok(crate::EXIT_OK);
    }
    if report.workflows.is_empty() {
        writeln!(out, "no scores")?;
        return Ok(crate::EXIT_OK);
    }
    for (i, wf) in report.workflows.iter().enumerate() {
        if i > 0 {
            writeln!(out)?;
        }
        writeln!(out, "{}", wf.workflow)?;
        table(&mut out, "  all generations", &wf.scorers)?;
        for gen in &wf.generations {
            let title = format!(
                "  generation {} ({} run{}, {} to {})",
                &gen.workflow_hash[..gen.workflow_hash.len().min(12)],
                gen.runs,
                if gen.runs == 1 { "" } else { "s" },
                datetime_ms(gen.first_run_ms),
                datetime_ms(gen.last_run_ms),
            );
            table(&mut out, &title, &gen.scorers)?;
        }
    }
    Ok(crate::EXIT_OK)
}

/// One table of scorers under a title.
fn table(out: &mut impl Write, title: &str, rows: &[ScorerStats]) -> std::io::Result<()> {
    writeln!(out, "{title}")?;
    writeln!(
        out,
        "    {:<24} {:<16} {:>5} {:>6} {:>6} {:>6} {:>6} {:>6}",
        "NODE", "SCORER", "N", "FAILED", "MEAN", "MIN", "MAX", "STDDEV"
    )?;
    let num = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |x| format!("{x:.3}"));
    for s in rows {
        writeln!(
            out,
            "    {:<24} {:<16} {:>5} {:>6} {:>6} {:>6} {:>6} {:>6}",
            s.node_id,
            s.scorer_id,
            s.count,
            s.failed,
            num(s.mean),
            num(s.min),
            num(s.max),
            num(s.stddev)
        )?;
    }
    Ok(())
}
