//! Runs as shared work: on a store that offers claims
//! ([`cairn_store::Claims`], PostgreSQL), an engine with
//! [`crate::EngineOptions::queue`] queues the runs it is asked to start
//! (and the children its runs start), and drives the runs it claims.
//!
//! A queued run is a row and pinned files with no event. The instance
//! that claims it holds its lease from the claim on, and writes its
//! `RunStarted` as a resume of a run with an empty log does
//! ([`Engine::drive_with`]); a claimer that dies before that leaves the
//! run queued once its lease expires.

use std::sync::Arc;

use cairn_events::{ErrorInfo, EventKind, EventType, RunId, Scope};
use cairn_store::{EventQuery, RecordStatus, RunRecord, StoreError};
use cairn_workflow::Workflow;
use serde_json::Value;

use crate::driver::Mode;
use crate::{child, Engine, EngineError, Prepared, RunHandle, StartOptions};

/// What [`Engine::submit`] did with a run.
pub enum Submitted {
    /// Driven here, as [`Engine::start`] does.
    Started(RunHandle),
    /// Queued for an instance of the store to claim.
    Queued(RunId),
}

impl Submitted {
    /// The run's id.
    pub fn run_id(&self) -> &RunId {
        match self {
            Submitted::Started(h) => &h.run_id,
            Submitted::Queued(id) => id,
        }
    }
}

impl Engine {
    /// Whether this engine queues the runs it starts
    /// ([`crate::EngineOptions::queue`] on a store that offers claims).
    pub fn queues(&self) -> bool {
        self.inner.queue
    }

    /// Starts a run as this engine does: queued for the store's instances
    /// to claim when it [`Engine::queues`], else driven here
    /// ([`Engine::start`]). Options only a driver here can honour (an
    /// observer, a watch, a concurrency other than the workflow's, a
    /// trigger) drive
    /// the run here. Returns once the run is durable, queued or started.
    pub async fn submit(
        &self,
        wf: Workflow,
        input: Value,
        opts: StartOptions,
    ) -> Result<Submitted, EngineError> {
        // A trigger is written in `RunStarted`, which the claimer writes
        // from the run's row; the row has no place for it.
        let here = opts.observer.is_some()
            || opts.watch
            || opts.max_concurrency.is_some()
            || opts.trigger.is_some();
        if !self.queues() || here {
            return Ok(Submitted::Started(self.start(wf, input, opts).await?));
        }
        self.enqueue(wf, input, &opts, None)
            .await
            .map(Submitted::Queued)
    }

    /// Queues a run, the child of `parent` when there is one: its row
    /// (status `queued`) and pinned files, checked as a start checks them.
    pub(crate) async fn enqueue(
        &self,
        wf: Workflow,
        input: Value,
        opts: &StartOptions,
        parent: Option<&child::Lineage>,
    ) -> Result<RunId, EngineError> {
        let Prepared {
            run_id,
            rec,
            pinned,
            ..
        } = self
            .prepare(wf, input, opts, parent, RecordStatus::Queued)
            .await?;
        self.blocking(move |e| {
            let claims = e
                .backend()
                .claims()
                .expect("an engine queues only on a store that offers claims");
            claims.queue_run(&rec, pinned.as_ref())
        })
        .await?;
        Ok(run_id)
    }

    /// Claims up to `max` claimable runs (queued, or left by an instance
    /// that stopped or died; as many as this instance's share allows) and
    /// drives each: a queued run starts, another one resumes. Returns the runs now driven here. A run
    /// that cannot start here (a secret this instance cannot read, a
    /// workflow that no longer loads) fails, with why, rather than going
    /// back to the queue to fail on every instance in turn.
    pub async fn claim(&self, max: usize) -> Result<Vec<RunId>, EngineError> {
        if !self.queues() || self.closing() || max == 0 {
            return Ok(Vec::new());
        }
        let claimed = self
            .blocking(move |e| match e.backend().claims() {
                Some(c) => c.claim(max),
                None => Ok(Vec::new()),
            })
            .await?;
        let mut driven = Vec::new();
        for (run_id, lease) in claimed {
            let id = run_id.clone();
            let log = match self
                .blocking(move |e| e.journal().claimed_log(&id, lease))
                .await
            {
                Ok(log) => Arc::new(log),
                Err(e) => {
                    tracing::warn!(run = %run_id, error = %e, "cannot drive a claimed run; it goes back to the queue");
                    continue;
                }
            };
            match self
                .drive_with(
                    &run_id,
                    log.clone(),
                    StartOptions::default(),
                    Mode::Drive,
                    true,
                )
                .await
            {
                Ok(_) => driven.push(run_id),
                Err(EngineError::ShuttingDown) => {}
                // Never started: it fails here, with why.
                Err(e) if log.last_seq() == 0 => self.fail_unstarted(&log, e).await,
                // A run taken over that cannot go on here (it ended
                // meanwhile, a secret this instance cannot read): left
                // for the next look, here or elsewhere.
                Err(e) => {
                    tracing::warn!(run = %run_id, error = %e, "cannot go on with a claimed run");
                }
            }
        }
        Ok(driven)
    }

    /// Ends a claimed run that could not start: its `RunStarted` (when the
    /// log is still empty) and its `RunFailed` with why.
    async fn fail_unstarted(&self, log: &Arc<cairn_store::RunLog>, why: EngineError) {
        let run_id = log.run_id().clone();
        tracing::warn!(run = %run_id, error = %why, "a claimed run cannot start");
        let rec = {
            let id = run_id.clone();
            self.blocking(move |e| e.backend().get_run(&id)).await
        };
        let Ok(Some(rec)) = rec else { return };
        if log.last_seq() == 0 {
            let lineage = {
                let rec = rec.clone();
                self.blocking(move |e| e.lineage_of(&rec)).await
            };
            let (parent_run_id, parent_node_id, depth) = lineage.unwrap_or((None, None, 0));
            log.append(
                Scope::run(),
                EventKind::RunStarted {
                    workflow: rec.workflow.clone(),
                    workflow_hash: rec.workflow_hash.clone(),
                    input: Some(rec.input.clone()),
                    resumed: false,
                    parent_run_id,
                    parent_node_id,
                    depth,
                    forked_from: None,
                    trigger: None,
                    replay_of: None,
                },
            );
        }
        let written = log
            .append_durable(
                Scope::run(),
                EventKind::RunFailed {
                    error: ErrorInfo::new("start", why.to_string()),
                },
            )
            .await;
        if let Err(e) = written {
            tracing::warn!(run = %run_id, error = %e, "cannot record why a claimed run failed to start");
        }
    }

    /// A run's parent, the parent's node that started it and its depth,
    /// from the store: for a run whose `RunStarted` is written by whoever
    /// claims it (the starter knew them, but only the row is stored). The
    /// node is the one whose `DelegationStarted` names the run.
    pub(crate) fn lineage_of(
        &self,
        rec: &RunRecord,
    ) -> Result<(Option<RunId>, Option<String>, u32), StoreError> {
        let Some(parent) = rec.parent_run_id.clone() else {
            return Ok((None, None, 0));
        };
        let mut depth = 1;
        let mut at = self
            .backend()
            .get_run(&parent)?
            .and_then(|p| p.parent_run_id);
        while let Some(up) = at {
            depth += 1;
            if depth > crate::DEFAULT_MAX_DEPTH.max(self.inner.services.max_depth) + 1 {
                break;
            }
            at = self.backend().get_run(&up)?.and_then(|p| p.parent_run_id);
        }
        let started = self.backend().read_events(
            &parent,
            &EventQuery {
                types: vec![EventType::DelegationStarted],
                ..Default::default()
            },
        )?;
        let node = started
            .iter()
            .rev()
            .find_map(|stored| match stored.decode().ok()?.kind {
                EventKind::DelegationStarted { child_run_id, .. } if child_run_id == rec.run_id => {
                    stored.node_id.as_ref().map(|n| n.to_string())
                }
                _ => None,
            });
        Ok((Some(parent), node, depth))
    }
}
