//! Runs: the list (`GET /v1/runs`) and one run's state (`GET /v1/runs/{id}`,
//! `cairn status --json`).

use cairn_events::{RunId, RunState, TokenTotals};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// `GET /v1/runs`: a page of runs, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunList {
    /// The runs of this page.
    pub runs: Vec<RunSummary>,
    /// The page's size, as asked (or the default).
    pub limit: usize,
    /// How many runs come before this page.
    pub offset: usize,
    /// The offset of the next page; absent on the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<usize>,
}

/// A run as a list shows it: its record, and from its state when it
/// started and ended, its progress, tokens and cost. Those are absent for a
/// run whose log cannot be read: one damaged run must not hide the others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    /// The run's id.
    pub run_id: RunId,
    /// Its workflow's name.
    pub workflow: String,
    /// The store's status of the run (`pending` before its first event).
    pub status: String,
    /// When it was created, Unix ms.
    pub created_ms: i64,
    /// When its status or log last changed, Unix ms.
    pub updated_ms: i64,
    /// The run that started it, for a child run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<RunId>,
    /// Finished, failed and skipped nodes over the nodes mounted so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<f64>,
    /// Tokens of every model call so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenTotals>,
    /// When the run first started (its first `RunStarted`), Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<i64>,
    /// When it ended, Unix ms; absent while it runs or waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<i64>,
    /// What its model calls cost, where priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// The instance that drives it now, while one holds its lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
}

impl RunSummary {
    /// A run known only by its record (see [`RunMeta`]): what a list shows
    /// when its log cannot be read.
    pub fn new(run_id: &RunId, meta: &RunMeta<'_>, created_ms: i64, updated_ms: i64) -> Self {
        RunSummary {
            run_id: run_id.clone(),
            workflow: meta.workflow.to_string(),
            status: meta.status.to_string(),
            created_ms,
            updated_ms,
            parent_run_id: meta.parent_run_id.cloned(),
            progress: None,
            tokens: None,
            started_ms: None,
            ended_ms: None,
            cost_usd: None,
            instance: None,
        }
    }

    /// Adds what a list shows of the run's state.
    pub fn with_state(mut self, st: &RunState) -> Self {
        self.progress = Some(st.progress());
        self.tokens = Some(st.tokens.clone());
        self.started_ms = st.started_ms;
        self.ended_ms = st.ended_ms;
        self.cost_usd = st.cost_usd;
        self
    }
}

/// What a run's state as the API shows it takes from the store's record
/// of the run (the server and the CLI map their own record into it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunMeta<'a> {
    /// The workflow's name.
    pub workflow: &'a str,
    /// The store's status: what the run shows before its log has one.
    pub status: &'a str,
    /// The run that started it, for a child run.
    pub parent_run_id: Option<&'a RunId>,
}

/// A run's state as `GET /v1/runs/{id}` answers it and `cairn status
/// --json` prints it: the reducer's fold of the run's log (every field of
/// [`RunState`] that is set), plus `progress`, `counts` (nodes by status),
/// the workflow's name, the store's status before the log has one, and
/// the parent run of a child run.
///
/// Held as JSON, not as fields of its own: it is the reducer's state,
/// whose fields are the events crate's to define, and a group's output in
/// it can nest deeper than a typed copy could be read back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunDetail(Value);

impl RunDetail {
    /// The one builder of a run's state as the API shows it.
    pub fn new(st: &RunState, meta: &RunMeta<'_>) -> RunDetail {
        let mut v = state_value(st);
        v["progress"] = json!(st.progress());
        v["counts"] = json!(st.counts());
        v["workflow"] = json!(meta.workflow);
        if v.get("status").is_none() {
            v["status"] = json!(meta.status);
        }
        if let Some(p) = meta.parent_run_id {
            v["parentRunId"] = json!(p.as_str());
        }
        RunDetail(v)
    }

    /// Names the instance that drives the run now (none: nobody does).
    pub fn with_instance(&mut self, instance: Option<String>) {
        if let Some(name) = instance {
            self.0["instance"] = json!(name);
        }
    }

    /// Gives each child run listed in the state (`children`) the status its
    /// own record has now (`state`), as `status_of` finds it: the parent's
    /// log says how a child ended, not how one that runs is doing (waiting
    /// for a person, say). A child `status_of` does not find, or whose id
    /// is no run id, is left as is.
    pub fn with_child_states(&mut self, mut status_of: impl FnMut(&RunId) -> Option<String>) {
        let Some(children) = self.0.get_mut("children").and_then(Value::as_array_mut) else {
            return;
        };
        for c in children {
            let Some(id) = c["runId"].as_str().and_then(|t| RunId::parse(t).ok()) else {
                continue;
            };
            if let Some(status) = status_of(&id) {
                c["state"] = json!(status);
            }
        }
    }

    /// The run's id.
    pub fn run_id(&self) -> &str {
        self.0["runId"].as_str().unwrap_or("")
    }

    /// The run's status (`running`, `waiting-approval`, `finished`, ...).
    pub fn status(&self) -> &str {
        self.0["status"].as_str().unwrap_or("")
    }

    /// The state as JSON.
    pub fn as_value(&self) -> &Value {
        &self.0
    }

    /// The state as JSON, owned.
    pub fn into_value(self) -> Value {
        self.0
    }
}

impl From<Value> for RunDetail {
    /// A state read from elsewhere (a server's answer), taken as it is.
    fn from(v: Value) -> Self {
        RunDetail(v)
    }
}

impl std::fmt::Display for RunDetail {
    /// The state as compact JSON.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::ops::Index<&str> for RunDetail {
    type Output = Value;

    /// A field of the state, or `null`.
    fn index(&self, key: &str) -> &Value {
        &self.0[key]
    }
}

/// A run's state as a JSON value. Through text, since outputs are kept as
/// JSON text and turning text into a value directly is bound by
/// serde_json's limit of 128 levels, which a group's output can pass.
fn state_value(st: &RunState) -> Value {
    let text = serde_json::to_string(st).expect("a RunState serializes to JSON");
    let mut de = serde_json::Deserializer::from_str(&text);
    de.disable_recursion_limit();
    Deserialize::deserialize(&mut de).expect("JSON this process wrote reads back")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta<'a>(status: &'a str, parent: Option<&'a RunId>) -> RunMeta<'a> {
        RunMeta {
            workflow: "w",
            status,
            parent_run_id: parent,
        }
    }

    /// The fields the API adds come after the state's own, except those
    /// the state already has, which keep their place.
    #[test]
    fn a_run_detail_is_the_state_then_what_the_api_adds() {
        let mut st = RunState::new(cairn_events::RunId::parse("r1").unwrap());
        let p1 = RunId::parse("p1").unwrap();
        let fresh = RunDetail::new(&st, &meta("pending", Some(&p1)));
        let keys: Vec<&String> = fresh.as_value().as_object().unwrap().keys().collect();
        let tail = &keys[keys.len() - 5..];
        assert_eq!(
            tail,
            ["progress", "counts", "workflow", "status", "parentRunId"]
        );
        assert_eq!((fresh.run_id(), fresh.status()), ("r1", "pending"));

        st.workflow = Some("from-the-log".into());
        st.status = Some(cairn_events::RunStatus::Finished);
        let ended = RunDetail::new(&st, &meta("running", None));
        let keys: Vec<&String> = ended.as_value().as_object().unwrap().keys().collect();
        assert_eq!(&keys[..2], ["runId", "workflow"]);
        assert_eq!(ended["workflow"], "w", "the record names the workflow");
        assert_eq!(ended.status(), "finished", "the log's status wins");
        assert!(ended.as_value().get("parentRunId").is_none());
    }

    #[test]
    fn child_runs_get_their_own_status_where_known() {
        let mut v = RunDetail::from(json!({
            "runId": "r1",
            "children": [{"runId": "c1", "status": "finished"}, {"runId": "c2"}, {"runId": "../x"}, {}]
        }));
        v.with_child_states(|id| (id.as_str() != "c1").then(|| "waiting-approval".to_string()));
        assert_eq!(
            v["children"],
            json!([
                {"runId": "c1", "status": "finished"},
                {"runId": "c2", "state": "waiting-approval"},
                {"runId": "../x"},
                {}
            ])
        );
    }

    /// A list's run, field for field in the order the API has always sent.
    #[test]
    fn a_run_summary_keeps_its_wire_order() {
        let st = RunState::new(cairn_events::RunId::parse("r1").unwrap());
        let (r1, p1) = (RunId::parse("r1").unwrap(), RunId::parse("p1").unwrap());
        let s = RunSummary::new(&r1, &meta("running", Some(&p1)), 1, 2).with_state(&st);
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"runId":"r1","workflow":"w","status":"running","createdMs":1,"updatedMs":2,"parentRunId":"p1","progress":0.0,"tokens":{"input":0,"output":0,"cacheRead":0,"cacheWrite":0,"reasoning":0}}"#
        );
    }
}
