//! Layers and chapters: their totals as nodes mount, their start when the
//! first node in them starts, their end (with counts) when the last ends;
//! and the run's summary.
//!
//! [`Tallies`] knows nothing of the log: it is told what mounted, started
//! and ended, and answers with the run-scoped events that follow
//! (`LayerStarted`, `LayerFinished`, `ChapterStarted`, `ChapterFinished`),
//! which the driver appends in the order given.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use cairn_events::{EventKind, NodeCounts, NodeStatus, NodeTiming, RunState, TokenTotals};

/// Most nodes a run's summary names in its `timings`.
const MAX_TIMINGS: usize = 20;

/// One layer's or chapter's counts. A chain of 100,000 nodes has as many
/// layers, so a tally is kept small (32 bytes): counts as `u32`, its start
/// as milliseconds from the tallies' epoch, [`NOT_STARTED`] before it.
#[derive(Debug, Clone, Copy)]
struct Tally {
    total: u32,
    succeeded: u32,
    failed: u32,
    skipped: u32,
    cancelled: u32,
    open: bool,
    /// When its first node started, in ms after [`Tallies::epoch`]
    /// (negative for a layer reopened after a resume); [`NOT_STARTED`]
    /// before (an `Option` would take 8 bytes more).
    started_ms: i64,
}

/// A tally's start before its first node started.
const NOT_STARTED: i64 = i64::MIN;

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            total: 0,
            succeeded: 0,
            failed: 0,
            skipped: 0,
            cancelled: 0,
            open: false,
            started_ms: NOT_STARTED,
        }
    }
}

impl Tally {
    /// How many of its nodes ended.
    fn done(&self) -> u64 {
        [self.succeeded, self.failed, self.skipped, self.cancelled]
            .iter()
            .map(|&n| u64::from(n))
            .sum()
    }

    /// Counts a node that ended with `status`.
    fn count(&mut self, status: NodeStatus) {
        let n = match status {
            NodeStatus::Finished => &mut self.succeeded,
            NodeStatus::Failed => &mut self.failed,
            NodeStatus::Cancelled => &mut self.cancelled,
            _ => &mut self.skipped,
        };
        *n = n.saturating_add(1);
    }

    /// Whether it is open and every node counted in it ended.
    fn closes(&self) -> bool {
        self.open && self.done() >= u64::from(self.total)
    }
}

/// The layers and chapters of a run.
#[derive(Debug)]
pub(super) struct Tallies {
    /// By layer index: layers are numbered from 0 by depth, so a vector
    /// holds them densely (a map of a chain's 100,000 layers took about
    /// 10 MB).
    layers: Vec<Tally>,
    chapters: HashMap<String, Tally>,
    /// What layers' starts are counted from.
    epoch: Instant,
}

impl Default for Tallies {
    fn default() -> Tallies {
        Tallies {
            layers: Vec::new(),
            chapters: HashMap::new(),
            epoch: Instant::now(),
        }
    }
}

impl Tallies {
    /// After a resume: layers and chapters the log shows started and not
    /// finished are open again, so they get their `LayerFinished` and
    /// `ChapterFinished` (at once when everything in them ended before the
    /// stop) and no second start. `open_layers` holds each layer's start
    /// (Unix ms), `now_ms` is now on the same clock.
    pub(super) fn reopen(
        &mut self,
        open_layers: &BTreeMap<u32, i64>,
        open_chapters: &BTreeSet<String>,
        now_ms: i64,
    ) {
        let since_epoch = self.since_epoch();
        for (&layer, &started_ms) in open_layers {
            let t = self.layer(layer);
            t.open = true;
            t.started_ms = since_epoch - (now_ms - started_ms).max(0);
        }
        for chapter in open_chapters {
            self.chapters.entry(chapter.clone()).or_default().open = true;
        }
    }

    /// Milliseconds since the epoch.
    fn since_epoch(&self) -> i64 {
        i64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// A node instance of `layer` (and `stage`) was mounted.
    pub(super) fn mounted(&mut self, layer: u32, stage: Option<&str>) {
        let t = self.layer(layer);
        t.total = t.total.saturating_add(1);
        if let Some(stage) = stage {
            let t = self.chapter(stage);
            t.total = t.total.saturating_add(1);
        }
    }

    /// The plan is mounted again from scratch (a reload): totals are
    /// counted again by its frame, what is open stays open.
    pub(super) fn recount(&mut self) {
        for t in self.layers.iter_mut().chain(self.chapters.values_mut()) {
            *t = Tally {
                open: t.open,
                started_ms: t.started_ms,
                ..Tally::default()
            };
        }
    }

    /// A node of `layer` (and `stage`) starts: the layer's and the
    /// chapter's start, when it is their first.
    pub(super) fn started(&mut self, layer: u32, stage: Option<&str>) -> Vec<EventKind> {
        let mut events = Vec::new();
        let now = self.since_epoch();
        let t = self.layer(layer);
        if !t.open {
            t.open = true;
            t.started_ms = now;
            events.push(EventKind::LayerStarted {
                layer_index: layer,
                node_count: u64::from(t.total),
            });
        }
        if let Some(stage) = stage {
            let t = self.chapter(stage);
            if !t.open {
                t.open = true;
                events.push(EventKind::ChapterStarted {
                    chapter: stage.to_string(),
                });
            }
        }
        events
    }

    /// A node of `layer` (and `stage`) ended with `status`: the layer's
    /// and the chapter's end, when it was their last.
    pub(super) fn ended(
        &mut self,
        layer: u32,
        stage: Option<&str>,
        status: NodeStatus,
    ) -> Vec<EventKind> {
        let mut events = Vec::new();
        let now = self.since_epoch();
        let t = self.layer(layer);
        t.count(status);
        if t.closes() {
            t.open = false;
            events.push(EventKind::LayerFinished {
                layer_index: layer,
                duration_ms: if t.started_ms == NOT_STARTED {
                    0
                } else {
                    (now - t.started_ms).max(0) as u64
                },
                succeeded: t.succeeded.into(),
                failed: t.failed.into(),
                skipped: t.skipped.into(),
                cancelled: t.cancelled.into(),
            });
        }
        if let Some(stage) = stage {
            let t = self.chapter(stage);
            t.count(status);
            if t.closes() {
                t.open = false;
                events.push(EventKind::ChapterFinished {
                    chapter: stage.to_string(),
                    status: if t.failed > 0 { "failed" } else { "finished" }.into(),
                });
            }
        }
        events
    }

    /// A layer's tally, made (with those before it) the first time.
    fn layer(&mut self, layer: u32) -> &mut Tally {
        let i = layer as usize;
        if i >= self.layers.len() {
            self.layers.resize(i + 1, Tally::default());
        }
        &mut self.layers[i]
    }

    /// A chapter's tally; the name is copied only the first time.
    fn chapter(&mut self, stage: &str) -> &mut Tally {
        if !self.chapters.contains_key(stage) {
            self.chapters.insert(stage.to_string(), Tally::default());
        }
        self.chapters.get_mut(stage).expect("inserted above")
    }
}

/// The run's `RunSummary`: its nodes' ends, its slowest passes, and its
/// tokens and cost, being the log's (`state`) plus what this session's
/// agents spent (`session`, which they logged themselves).
pub(super) fn summary(
    state: &RunState,
    session: (TokenTotals, Option<f64>),
    duration_ms: u64,
) -> EventKind {
    let mut nodes = NodeCounts::default();
    // The slowest nodes by index first: naming every node would copy
    // every path.
    let mut slowest: Vec<(u64, usize)> = Vec::new();
    for (i, n) in state.nodes.iter().enumerate() {
        match n.status {
            NodeStatus::Finished => nodes.finished += 1,
            NodeStatus::Failed => nodes.failed += 1,
            NodeStatus::Skipped => nodes.skipped += 1,
            NodeStatus::Cancelled => nodes.cancelled += 1,
            _ => {}
        }
        if let Some(d) = n.duration_ms {
            slowest.push((d, i));
            if slowest.len() >= 2 * MAX_TIMINGS {
                slowest.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
                slowest.truncate(MAX_TIMINGS);
            }
        }
    }
    slowest.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    slowest.truncate(MAX_TIMINGS);
    let timings = slowest
        .into_iter()
        .map(|(d, i)| NodeTiming {
            node_id: state.nodes[i].node_id.to_string(),
            iteration: state.nodes[i].iteration,
            duration_ms: d,
        })
        .collect();
    let (session_tokens, session_usd) = session;
    let mut tokens = state.tokens.clone();
    tokens.input += session_tokens.input;
    tokens.output += session_tokens.output;
    tokens.cache_read += session_tokens.cache_read;
    tokens.cache_write += session_tokens.cache_write;
    tokens.reasoning += session_tokens.reasoning;
    let cost_usd = match (state.cost_usd, session_usd) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    };
    EventKind::RunSummary {
        duration_ms,
        nodes,
        tokens,
        cost_usd,
        timings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::testing;
    use cairn_events::Scope;

    #[test]
    fn a_tally_fits_32_bytes() {
        // One per layer, and a chain has a layer per node.
        assert!(std::mem::size_of::<Tally>() <= 32);
    }

    fn names(events: &[EventKind]) -> Vec<&'static str> {
        events.iter().map(|e| e.type_name()).collect()
    }

    #[test]
    fn a_layer_starts_with_its_first_node_and_ends_with_its_last() {
        let mut t = Tallies::default();
        t.mounted(0, None);
        t.mounted(0, None);
        let started = t.started(0, None);
        assert_eq!(
            started,
            vec![EventKind::LayerStarted {
                layer_index: 0,
                node_count: 2
            }]
        );
        // The second node's start opens nothing.
        assert!(t.started(0, None).is_empty());
        assert!(t.ended(0, None, NodeStatus::Finished).is_empty());
        let ended = t.ended(0, None, NodeStatus::Skipped);
        match &ended[..] {
            [EventKind::LayerFinished {
                layer_index: 0,
                succeeded: 1,
                failed: 0,
                skipped: 1,
                cancelled: 0,
                ..
            }] => {}
            other => panic!("{other:?}"),
        }
        // A layer never started does not finish.
        t.mounted(1, None);
        assert!(t.ended(1, None, NodeStatus::Skipped).is_empty());
    }

    #[test]
    fn a_chapter_fails_when_a_node_in_it_failed() {
        let mut t = Tallies::default();
        t.mounted(0, Some("build"));
        t.mounted(1, Some("build"));
        assert_eq!(
            names(&t.started(0, Some("build"))),
            ["LayerStarted", "ChapterStarted"]
        );
        assert_eq!(
            names(&t.ended(0, Some("build"), NodeStatus::Failed)),
            ["LayerFinished"]
        );
        assert_eq!(names(&t.started(1, Some("build"))), ["LayerStarted"]);
        let ended = t.ended(1, Some("build"), NodeStatus::Finished);
        assert_eq!(names(&ended), ["LayerFinished", "ChapterFinished"]);
        assert_eq!(
            ended[1],
            EventKind::ChapterFinished {
                chapter: "build".into(),
                status: "failed".into()
            }
        );
    }

    #[test]
    fn a_reopened_layer_finishes_without_a_second_start() {
        let mut t = Tallies::default();
        t.reopen(
            &BTreeMap::from([(0, 1_000)]),
            &BTreeSet::from(["c".to_string()]),
            2_000,
        );
        t.mounted(0, Some("c"));
        assert!(t.started(0, Some("c")).is_empty());
        assert_eq!(
            names(&t.ended(0, Some("c"), NodeStatus::Finished)),
            ["LayerFinished", "ChapterFinished"]
        );
    }

    #[test]
    fn a_recount_keeps_what_is_open() {
        let mut t = Tallies::default();
        t.mounted(0, None);
        t.mounted(0, None);
        t.started(0, None);
        t.recount();
        t.mounted(0, None);
        // One node in the new plan's layer 0, which stayed open.
        assert_eq!(
            names(&t.ended(0, None, NodeStatus::Finished)),
            ["LayerFinished"]
        );
    }

    #[test]
    fn the_summary_counts_ends_and_names_the_slowest_first() {
        let mut state = RunState::new(cairn_events::RunId::parse("r").unwrap());
        let push = testing::apply;
        for (i, d) in [5u64, 50, 7].into_iter().enumerate() {
            let scope = Scope::node(format!("n{i}").as_str(), 0).with_attempt(1);
            push(
                &mut state,
                scope.clone(),
                EventKind::NodeStarted { snapshot: None },
            );
            push(
                &mut state,
                scope,
                EventKind::NodeFinished {
                    duration_ms: d,
                    output: None,
                    cached: None,
                    snapshot: None,
                },
            );
        }
        push(
            &mut state,
            Scope::node("s", 0),
            EventKind::NodeSkipped { reason: "x".into() },
        );
        let session = (
            TokenTotals {
                input: 3,
                ..TokenTotals::default()
            },
            Some(0.5),
        );
        let EventKind::RunSummary {
            duration_ms,
            nodes,
            tokens,
            cost_usd,
            timings,
        } = summary(&state, session, 99)
        else {
            panic!("not a summary");
        };
        assert_eq!(duration_ms, 99);
        assert_eq!((nodes.finished, nodes.skipped), (3, 1));
        assert_eq!(tokens.input, 3);
        assert_eq!(cost_usd, Some(0.5));
        let order: Vec<&str> = timings.iter().map(|t| t.node_id.as_str()).collect();
        assert_eq!(order, ["n1", "n2", "n0"]);
    }
}
