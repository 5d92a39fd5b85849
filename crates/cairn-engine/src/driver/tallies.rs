//! Layers and chapters: their totals as nodes mount, their start when the
//! first node in them starts, their end (with counts) when the last ends;
//! and the run's summary.

use super::*;

impl Driver {
    /// After a resume: layers and chapters the log shows started and not
    /// finished are open again, so they get their `LayerFinished` and
    /// `ChapterFinished` (at once when everything in them ended before the
    /// stop) and no second start.
    pub(super) fn reopen_tallies(&mut self) {
        let now_ms = crate::node::now_ms();
        for (&layer, &started_ms) in &self.state.open_layers {
            let t = self.layers.entry(layer).or_default();
            t.open = true;
            let ago = Duration::from_millis((now_ms - started_ms).max(0) as u64);
            t.started = Instant::now().checked_sub(ago).or(Some(Instant::now()));
        }
        for chapter in &self.state.open_chapters {
            self.chapters.entry(chapter.clone()).or_default().open = true;
        }
    }

    pub(super) fn open_tallies(&mut self, inst: &Inst) {
        let layer = inst.layer;
        let t = self.layers.entry(layer).or_default();
        if !t.open {
            t.open = true;
            t.started = Some(Instant::now());
            let node_count = t.total;
            self.emit(
                Scope::run(),
                EventKind::LayerStarted {
                    layer_index: layer,
                    node_count,
                },
            );
        }
        if let Some(stage) = &inst.spec.stage {
            let t = self.chapters.entry(stage.clone()).or_default();
            if !t.open {
                t.open = true;
                self.emit(
                    Scope::run(),
                    EventKind::ChapterStarted {
                        chapter: stage.clone(),
                    },
                );
            }
        }
    }

    pub(super) fn count_done(&mut self, inst: &Inst, status: NodeStatus) {
        let mut events = Vec::new();
        let t = self.layers.entry(inst.layer).or_default();
        t.done += 1;
        match status {
            NodeStatus::Finished => t.succeeded += 1,
            NodeStatus::Failed => t.failed += 1,
            NodeStatus::Cancelled => t.cancelled += 1,
            _ => t.skipped += 1,
        }
        if t.open && t.done >= t.total {
            t.open = false;
            events.push(EventKind::LayerFinished {
                layer_index: inst.layer,
                duration_ms: t.started.map_or(0, |s| s.elapsed().as_millis() as u64),
                succeeded: t.succeeded,
                failed: t.failed,
                skipped: t.skipped,
                cancelled: t.cancelled,
            });
        }
        if let Some(stage) = &inst.spec.stage {
            let t = self.chapters.entry(stage.clone()).or_default();
            t.done += 1;
            if status == NodeStatus::Failed {
                t.failed += 1;
            }
            if t.open && t.done >= t.total {
                t.open = false;
                events.push(EventKind::ChapterFinished {
                    chapter: stage.clone(),
                    status: if t.failed > 0 { "failed" } else { "finished" }.into(),
                });
            }
        }
        for e in events {
            self.emit(Scope::run(), e);
        }
    }

    pub(super) fn duration_ms(&self) -> u64 {
        self.state
            .started_ms
            .map_or(0, |s| (crate::node::now_ms() - s).max(0) as u64)
    }

    pub(super) fn summary(&self) -> EventKind {
        let mut nodes = NodeCounts::default();
        // The slowest nodes by index first: naming every node would copy
        // every path.
        let mut slowest: Vec<(u64, usize)> = Vec::new();
        for (i, n) in self.state.nodes.iter().enumerate() {
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
                node_id: self.state.nodes[i].node_id.to_string(),
                iteration: self.state.nodes[i].iteration,
                duration_ms: d,
            })
            .collect();
        // Agents log their model calls themselves: what this session's
        // calls add to what the log held when the driver started.
        let (session_tokens, session_usd) = self.spend.session();
        let mut tokens = self.state.tokens.clone();
        tokens.input += session_tokens.input;
        tokens.output += session_tokens.output;
        tokens.cache_read += session_tokens.cache_read;
        tokens.cache_write += session_tokens.cache_write;
        tokens.reasoning += session_tokens.reasoning;
        let cost_usd = match (self.state.cost_usd, session_usd) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        EventKind::RunSummary {
            duration_ms: self.duration_ms(),
            nodes,
            tokens,
            cost_usd,
            timings,
        }
    }
}
