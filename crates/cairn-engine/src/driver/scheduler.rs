//! The scheduler of the plan: what is mounted (the plan, the shape of its
//! groups, the frames), and what may start (each instance's needs not yet
//! ended, the instances to look at, those ready to start, the members of a
//! group's pass not yet ended).
//!
//! [`Scheduler`] reads the run state only through what the driver passes
//! (a node's status, whether a need ended), and answers with decisions
//! (a frame to commit, a check's verdict, a group whose pass ended); the
//! driver appends the events and carries the decisions out.

use std::collections::VecDeque;
use std::sync::Arc;

use cairn_events::{EventKind, NodeStatus, Output};
use serde_json::Value;

use super::context::node_ctx_entry;
use super::{Driver, Mode, ROUND_SLICE};
use crate::node::NodeError;
use crate::plan::{self, Inst, Key, KeyMap, KeySet, Paths, Plan, Shape, SpecTree};
use cairn_events::Scope;
use cairn_workflow::{NeedsEnded, NodeKind, SwitchSpec};
use std::time::Instant;

/// A new frame of the plan, to commit.
pub(super) struct Frame {
    /// Its `FrameCommitted`.
    pub event: EventKind,
    /// Instances that appeared, in mount order.
    pub added: Vec<Key>,
    /// Instances that went, in their old mount order.
    pub removed: Vec<Arc<Inst>>,
}

/// What a look at a pending instance decided.
#[derive(Debug)]
pub(super) enum Check {
    /// Nothing now: a need has not ended, it is queued or not pending, or
    /// the run stops.
    Wait,
    /// A need ended without finishing: it is skipped, for this reason.
    Blocked(String),
    /// Its needs finished; its `if` decides whether it starts.
    Condition(Arc<Inst>, String),
    /// Its needs finished: it may start.
    Ready,
}

/// The plan of a run and what may start in it.
pub(super) struct Scheduler {
    tree: SpecTree,
    shape: Shape,
    /// Every instance path mounted so far, shared by each render.
    paths: Paths,
    plan: Plan,
    frame_no: u64,
    /// The instances waiting for each instance's end.
    dependents: Dependents,
    /// How many of each mounted instance's needs have not ended, so that a
    /// join is looked at in full once, not once per finished need; only
    /// for instances waiting for two or more. One waiting for a single need
    /// is not counted: it is only ever looked at once that need ends (from
    /// its `dependents`), and most instances of a large plan wait for one.
    unmet: KeyMap<usize>,
    /// How many members of each running group's pass have not ended.
    group_remaining: KeyMap<usize>,
    /// Instances to look at.
    check_queue: VecDeque<Key>,
    /// Instances that may start, in order.
    ready: VecDeque<Key>,
    /// Pending nodes already in `ready`, so a node checked once per finished
    /// dependency is queued once (a `VecDeque::contains` would be quadratic).
    queued: KeySet,
}

impl Scheduler {
    /// The scheduler of a run of the workflow `tree`, whose log holds
    /// `frame_no` frames; nothing is mounted until the first render.
    pub(super) fn new(tree: SpecTree, frame_no: u64) -> Scheduler {
        Scheduler {
            tree,
            shape: Shape::default(),
            paths: Paths::default(),
            plan: Plan::default(),
            frame_no,
            dependents: Default::default(),
            unmet: Default::default(),
            group_remaining: Default::default(),
            check_queue: VecDeque::new(),
            ready: VecDeque::new(),
            queued: Default::default(),
        }
    }

    /// The mounted instance `key`.
    pub(super) fn inst(&self, key: &Key) -> Option<&Arc<Inst>> {
        self.plan.insts.get(key)
    }

    /// The mounted plan.
    pub(super) fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The workflow's spec nodes.
    pub(super) fn tree(&self) -> &SpecTree {
        &self.tree
    }

    /// The mounted instances' keys in mount order, as a list of their own
    /// (the walks that use it change the plan as they go).
    pub(super) fn keys(&self) -> Vec<Key> {
        self.plan.order.iter().map(|i| i.key.clone()).collect()
    }

    /// Renders the whole plan again (a run's start, a resume): the new
    /// frame, when the plan changed.
    pub(super) fn render(&mut self, workflow: &str) -> Option<Frame> {
        let plan = plan::render(&self.tree, workflow, &self.shape, &mut self.paths);
        if plan.xml_hash == self.plan.xml_hash {
            return None;
        }
        let added: Vec<Key> = plan
            .order
            .iter()
            .filter(|i| !self.plan.insts.contains_key(&i.key))
            .map(|i| i.key.clone())
            .collect();
        let old = std::mem::replace(&mut self.plan, plan);
        let removed: Vec<Arc<Inst>> = old
            .order
            .iter()
            .filter(|i| !self.plan.insts.contains_key(&i.key))
            .cloned()
            .collect();
        drop(old);
        Some(self.frame(added, removed))
    }

    /// Mounts again what the shape change of one group instance (its
    /// start, a loop's next pass) changed: that group's subtree. The new
    /// frame, when the plan changed.
    pub(super) fn render_group(&mut self, workflow: &str, group: &Key) -> Option<Frame> {
        let before = std::mem::take(&mut self.plan.xml_hash);
        let change = plan::rerender_group(
            &self.tree,
            workflow,
            &self.shape,
            &mut self.paths,
            &mut self.plan,
            group,
        );
        let Some(change) = change else {
            self.plan.xml_hash = before;
            return self.render(workflow);
        };
        if self.plan.xml_hash == before {
            return None;
        }
        Some(self.frame(change.added, change.removed))
    }

    /// Mounts the plan of a new definition (`tree`, a reload) from scratch:
    /// groups in progress keep their pass and list, groups that ended
    /// (`ended`) are mounted without their members, and what was derived
    /// from the old plan is derived again from the new one by its frame.
    /// Always a new frame: the plan's definitions changed even when its
    /// shape did not. Retries due and attempts to continue stay ready.
    pub(super) fn remount(
        &mut self,
        tree: SpecTree,
        workflow: &str,
        ended: impl Fn(&Key) -> bool,
    ) -> Frame {
        self.tree = tree;
        let ended: Vec<Key> = self
            .shape
            .started_groups
            .iter()
            .filter(|k| ended(k))
            .cloned()
            .collect();
        for k in &ended {
            self.shape.started_groups.remove(k);
            self.shape.loop_pass.remove(k);
            self.shape.lists.remove(k);
        }
        self.dependents.clear();
        self.unmet.clear();
        self.group_remaining.clear();
        self.check_queue.clear();
        let queued = std::mem::take(&mut self.queued);
        self.ready.retain(|k| !queued.contains(k));
        let old = std::mem::take(&mut self.plan);
        let plan = plan::render(&self.tree, workflow, &self.shape, &mut self.paths);
        let added: Vec<Key> = plan.order.iter().map(|i| i.key.clone()).collect();
        let removed: Vec<Arc<Inst>> = old
            .order
            .iter()
            .filter(|i| !plan.insts.contains_key(&i.key))
            .cloned()
            .collect();
        drop(old);
        self.plan = plan;
        self.frame(added, removed)
    }

    /// The next frame: the plan as it is now.
    fn frame(&mut self, added: Vec<Key>, removed: Vec<Arc<Inst>>) -> Frame {
        self.frame_no += 1;
        Frame {
            event: EventKind::FrameCommitted {
                frame_no: self.frame_no,
                xml_hash: self.plan.xml_hash.clone(),
                mounted: self.plan.order.len() as u64,
            },
            added,
            removed,
        }
    }

    /// Counts an instance a frame mounted, whose status is `status` and
    /// which has ended for its dependents and its group when `done`.
    /// `need_ended` says whether one of its needs has (a need that has
    /// ended has nothing left to tell), given the mounted instances. A
    /// pending instance with every need ended is queued for a look; one
    /// with unmet needs is queued when the last of them ends.
    pub(super) fn mounted(
        &mut self,
        inst: &Arc<Inst>,
        status: NodeStatus,
        done: bool,
        need_ended: impl Fn(&Key, &plan::Insts) -> bool,
    ) {
        let key = &inst.key;
        let mut unmet = 0;
        for (i, dep) in inst.needs.iter().enumerate() {
            if need_ended(dep, &self.plan.insts) {
                continue;
            }
            unmet += 1;
            self.dependents.add(inst, i);
        }
        if unmet > 1 {
            self.unmet.insert(key.clone(), unmet);
        }
        if let Some(parent) = inst.parent() {
            if !done {
                *self.group_remaining.entry(parent.clone()).or_default() += 1;
            }
        }
        if !done && status == NodeStatus::Pending && unmet == 0 {
            self.check_queue.push_back(key.clone());
        }
    }

    /// Looks at the pending instance `key`: may it start? `status` is each
    /// instance's status in the run state; `stopping` says the run is
    /// being cancelled or fails.
    pub(super) fn check(
        &self,
        key: &Key,
        status: impl Fn(&Key) -> Option<NodeStatus>,
        chosen: impl Fn(&Key) -> Option<String>,
        stopping: bool,
    ) -> Check {
        let Some(inst) = self.plan.insts.get(key) else {
            return Check::Wait;
        };
        if status(key) != Some(NodeStatus::Pending) || self.queued.contains(key) {
            return Check::Wait;
        }
        if self.unmet.get(key).is_some_and(|&n| n > 0) {
            return Check::Wait;
        }
        let mut blocked_by = None;
        for dep in &inst.needs {
            match status(dep) {
                Some(NodeStatus::Finished) => {}
                Some(s) if s.is_done() => {
                    blocked_by.get_or_insert((&dep.0, s));
                }
                _ => return Check::Wait,
            }
        }
        // A node in a branch a switch did not choose is skipped, handler
        // or not: the branch decides first.
        if let Some(reason) = self.branch_not_taken(inst, &chosen) {
            if stopping {
                return Check::Wait;
            }
            return Check::Blocked(reason);
        }
        // A handler's `if` is asked however its needs ended, and while the
        // run stops: that is what it is for.
        let handler = self.is_handler(inst);
        if stopping && !handler {
            return Check::Wait;
        }
        if let Some((dep, s)) = blocked_by.filter(|_| !handler) {
            return Check::Blocked(format!("dependency `{dep}` {}", s.as_str()));
        }
        match &inst.spec.if_ {
            Some(cond) => Check::Condition(inst.clone(), cond.clone()),
            None => Check::Ready,
        }
    }

    /// Why `inst` is skipped when a switch it needs chose a branch that
    /// does not list it (`chosen` is a finished switch's label).
    fn branch_not_taken(
        &self,
        inst: &Inst,
        chosen: &impl Fn(&Key) -> Option<String>,
    ) -> Option<String> {
        for dep in &inst.needs {
            let Some(sw) = self.plan.insts.get(dep) else {
                continue;
            };
            let NodeKind::Switch(spec) = &sw.spec.kind else {
                continue;
            };
            if !spec.lists(&inst.spec.id) {
                continue;
            }
            let label = chosen(dep)?;
            if !spec.branch(&label).contains(&inst.spec.id) {
                return Some(format!("branch {} chose {label}", sw.spec.id));
            }
        }
        None
    }

    /// Whether `inst` is a failure handler (its `if` calls a status
    /// function) or inside one: it may start while the run stops.
    pub(super) fn is_handler(&self, inst: &Inst) -> bool {
        if inst.spec.handler {
            return true;
        }
        let mut parent = inst.parent();
        while let Some(p) = parent {
            let Some(group) = self.plan.insts.get(p) else {
                return false;
            };
            if group.spec.handler {
                return true;
            }
            parent = group.parent();
        }
        false
    }

    /// The next instance to look at.
    pub(super) fn next_check(&mut self) -> Option<Key> {
        let key = self.check_queue.pop_front()?;
        shrink_drained_queue(&mut self.check_queue);
        Some(key)
    }

    /// Whether instances wait to be looked at.
    pub(super) fn has_checks(&self) -> bool {
        !self.check_queue.is_empty()
    }

    /// `key` is not to be looked at (a resume continues its attempt).
    pub(super) fn withdraw_check(&mut self, key: &Key) {
        self.check_queue.retain(|k| k != key);
    }

    /// The pending instance `key` may start, after those before it.
    pub(super) fn enqueue(&mut self, key: Key) {
        self.queued.insert(key.clone());
        self.ready.push_back(key);
    }

    /// `key`'s next attempt (a retry, a rerun, an attempt to continue)
    /// starts when its turn comes.
    pub(super) fn requeue(&mut self, key: Key) {
        self.ready.push_back(key);
    }

    /// The next instance that may start, taken.
    pub(super) fn next_ready(&mut self) -> Option<Key> {
        let key = self.ready.pop_front()?;
        shrink_drained_queue(&mut self.ready);
        self.queued.remove(&key);
        shrink_drained_set(&mut self.queued);
        Some(key)
    }

    /// Whether the next instance that may start is one that `pred` picks.
    pub(super) fn next_ready_is(&self, pred: impl Fn(&Key) -> bool) -> bool {
        self.ready.front().is_some_and(pred)
    }

    /// Whether an instance may start.
    pub(super) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// The instances that may start that `pred` picks, taken, in order.
    pub(super) fn take_ready_if(&mut self, pred: impl Fn(&Key) -> bool) -> Vec<Key> {
        let taken: Vec<Key> = self.ready.iter().filter(|k| pred(k)).cloned().collect();
        self.ready.retain(|k| !pred(k));
        for key in &taken {
            self.queued.remove(key);
        }
        taken
    }

    /// The failure handlers (and members of their groups) that may start,
    /// taken, in order.
    pub(super) fn take_ready_handlers(&mut self) -> Vec<Key> {
        let handlers: KeySet = self
            .ready
            .iter()
            .filter(|k| self.plan.insts.get(k).is_some_and(|i| self.is_handler(i)))
            .cloned()
            .collect();
        if handlers.is_empty() {
            return Vec::new();
        }
        self.take_ready_if(|k| handlers.contains(k))
    }

    /// The run stops: nothing more starts.
    pub(super) fn stop(&mut self) {
        self.ready.clear();
        self.queued.clear();
    }

    /// The instance of `inst` ended (for its dependents and its group): the
    /// dependents whose last need it was are queued for a look, and its
    /// group's pass counts it. Returns the group whose pass that ended.
    pub(super) fn ended(&mut self, inst: &Inst) -> Option<Key> {
        // An ended node's dependents and a ready node's count are not
        // needed again: dropped, so a long run's maps hold only what waits.
        match self.dependents.take(&inst.key) {
            Some(Waiting::One { dependent, .. }) => self.need_ended(dependent.key.clone()),
            Some(Waiting::Many(many)) => {
                for d in many.1 {
                    self.need_ended(d);
                }
            }
            None => {}
        }
        let parent = inst.parent()?;
        let r = self.group_remaining.get_mut(parent)?;
        *r = r.saturating_sub(1);
        (*r == 0).then(|| parent.clone())
    }

    /// One of the dependent `d`'s needs ended: it is queued for a look
    /// when that was the last.
    fn need_ended(&mut self, d: Key) {
        if let Some(n) = self.unmet.get_mut(&d) {
            *n = n.saturating_sub(1);
            let left = *n;
            if left <= 1 {
                // Down to one need: no longer counted (see `unmet`).
                self.unmet.remove(&d);
                shrink_drained(&mut self.unmet);
            }
            if left > 0 {
                return;
            }
        }
        self.check_queue.push_back(d);
    }

    /// Whether the group instance `key` has started (its members are
    /// mounted).
    pub(super) fn group_started(&self, key: &Key) -> bool {
        self.shape.started_groups.contains(key)
    }

    /// The loop `key` starts, or is taken up after a resume, at `pass`.
    pub(super) fn enter_loop(&mut self, key: &Key, pass: u32) {
        self.shape.loop_pass.insert(key.clone(), pass);
        self.shape.started_groups.insert(key.clone());
    }

    /// The `for_each` `key` starts over `items`.
    pub(super) fn enter_for_each(&mut self, key: &Key, items: Vec<Value>) {
        self.shape.lists.insert(key.clone(), Arc::new(items));
        self.shape.started_groups.insert(key.clone());
    }

    /// The loop `key`'s current pass.
    pub(super) fn loop_pass(&self, key: &Key) -> u32 {
        self.shape.loop_pass.get(key).copied().unwrap_or(0)
    }

    /// The loop `key` goes on to its next pass (mounted by the next
    /// render of it).
    pub(super) fn next_pass(&mut self, key: &Key) {
        let pass = self.loop_pass(key);
        self.shape.loop_pass.insert(key.clone(), pass + 1);
    }

    /// How many elements the `for_each` `key` runs over.
    pub(super) fn list_len(&self, key: &Key) -> usize {
        self.shape.lists.get(key).map_or(0, |l| l.len())
    }

    /// How many members of the group `key`'s pass have not ended.
    pub(super) fn remaining(&self, key: &Key) -> usize {
        self.group_remaining.get(key).copied().unwrap_or(0)
    }
}

/// The instances waiting for one instance's end. Most instances have one
/// dependent, which is held with the place of the need it waits for: the
/// need's key is read from the dependent, so an entry is 16 bytes and the
/// table holds no copy of the key (a map of keys to vectors took about 95
/// bytes per node of a chain, with the vector's own allocation).
enum Waiting {
    /// One dependent, waiting for its `need`th need.
    One { dependent: Arc<Inst>, need: u32 },
    /// Two or more, waiting for the need `.0` (boxed: rare, and the
    /// entry stays small).
    Many(Box<(Key, Vec<Key>)>),
}

impl Waiting {
    /// The instance they wait for.
    fn need(&self) -> &Key {
        match self {
            Waiting::One { dependent, need } => &dependent.needs[*need as usize],
            Waiting::Many(many) => &many.0,
        }
    }
}

/// Every [`Waiting`] entry, found by the key of the instance waited for.
#[derive(Default)]
struct Dependents {
    table: hashbrown::HashTable<Waiting>,
    /// aHash, keyed per process (see [`KeyMap`]).
    hasher: ahash::RandomState,
}

impl Dependents {
    fn hash(hasher: &ahash::RandomState, key: &Key) -> u64 {
        hasher.hash_one(key)
    }

    /// `dependent` waits for its need at place `need`.
    fn add(&mut self, dependent: &Arc<Inst>, need: usize) {
        let key = &dependent.needs[need];
        let hasher = &self.hasher;
        let entry = self.table.entry(
            Self::hash(hasher, key),
            |w| w.need() == key,
            |w| Self::hash(hasher, w.need()),
        );
        match entry {
            hashbrown::hash_table::Entry::Vacant(e) => {
                e.insert(Waiting::One {
                    dependent: dependent.clone(),
                    need: u32::try_from(need).expect("fewer than 2^32 needs"),
                });
            }
            hashbrown::hash_table::Entry::Occupied(mut e) => {
                let w = e.get_mut();
                match w {
                    Waiting::One {
                        dependent: first, ..
                    } => {
                        let first = first.key.clone();
                        *w = Waiting::Many(Box::new((
                            key.clone(),
                            vec![first, dependent.key.clone()],
                        )));
                    }
                    Waiting::Many(many) => many.1.push(dependent.key.clone()),
                }
            }
        }
    }

    /// Takes what waits for `key`, giving back most of the table's room
    /// once it has drained (see [`shrink_drained`]).
    fn take(&mut self, key: &Key) -> Option<Waiting> {
        let found = self
            .table
            .find_entry(Self::hash(&self.hasher, key), |w| w.need() == key)
            .ok()?;
        let (waiting, _) = found.remove();
        let table = &mut self.table;
        if table.capacity() > SHRINK_FROM && table.len() < table.capacity() / 4 {
            let hasher = &self.hasher;
            table.shrink_to(table.len() * 2, |w| Self::hash(hasher, w.need()));
        }
        Some(waiting)
    }

    fn clear(&mut self) {
        self.table.clear();
    }
}

/// Below this many slots a drained map or queue keeps its room.
const SHRINK_FROM: usize = 1024;

/// Gives back most of a map's room once it has drained to a quarter of it.
/// A frame that mounts 100,000 instances fills the scheduler's maps at
/// once, they drain as the run goes, and a hash map otherwise keeps its
/// largest table to the end, beside everything the run has grown since.
/// Each shrink at least halves the table, so the moves cost a constant
/// per entry over the run.
fn shrink_drained<V>(map: &mut KeyMap<V>) {
    if map.capacity() > SHRINK_FROM && map.len() < map.capacity() / 4 {
        map.shrink_to(map.len() * 2);
    }
}

/// [`shrink_drained`] for a set.
fn shrink_drained_set(set: &mut KeySet) {
    if set.capacity() > SHRINK_FROM && set.len() < set.capacity() / 4 {
        set.shrink_to(set.len() * 2);
    }
}

/// [`shrink_drained`] for a queue.
fn shrink_drained_queue(queue: &mut VecDeque<Key>) {
    if queue.capacity() > SHRINK_FROM && queue.len() < queue.capacity() / 4 {
        queue.shrink_to(queue.len() * 2);
    }
}

impl Driver {
    /// Checks queued nodes, at most a slice of them; true when none is left.
    pub(super) fn process_checks(&mut self) -> bool {
        for _ in 0..ROUND_SLICE {
            let Some(key) = self.sched.next_check() else {
                return true;
            };
            self.check(&key);
        }
        !self.sched.has_checks()
    }

    /// Looks at a pending node: skipped, failed (its `if` does not
    /// render), or queued to start.
    fn check(&mut self, key: &Key) {
        let state = &self.state;
        let verdict = self.sched.check(
            key,
            |k| state.node(&k.0, k.1).map(|n| n.status),
            |k| {
                let n = state.node(&k.0, k.1)?;
                if n.status != NodeStatus::Finished {
                    return None;
                }
                n.output
                    .as_ref()
                    .and_then(|o| o.to_value().as_str().map(str::to_string))
            },
            self.ending.stopping(),
        );
        match verdict {
            Check::Wait => {}
            Check::Blocked(reason) => self.skip(key, reason),
            Check::Condition(inst, cond) => self.check_condition(key, &inst, &cond),
            Check::Ready => self.sched.enqueue(key.clone()),
        }
    }

    /// A node whose needs finished (a handler's: ended) starts if its
    /// condition holds.
    fn check_condition(&mut self, key: &Key, inst: &Inst, cond: &str) {
        // Each context is dropped before anything updates `nodes`, which
        // would otherwise copy the whole map.
        let holds = {
            let mut ctx = self.context_for(inst, inst.key.1);
            if inst.spec.handler {
                ctx = ctx.with_status(self.needs_ended(inst));
            }
            self.templates.eval_bool_in(cond, &ctx)
        };
        match holds {
            Ok(true) => self.sched.enqueue(key.clone()),
            Ok(false) => self.skip(key, format!("condition `{cond}` is false")),
            Err(e) => {
                let scope = self.node_scope(key).with_attempt(1);
                self.emit(scope, EventKind::NodeStarted { snapshot: None });
                let err = NodeError::fatal("template", format!("if: {e}"));
                self.fail_attempt(key, inst, 1, err);
            }
        }
    }

    /// How `inst`'s needs ended, for the status functions of its `if`.
    fn needs_ended(&self, inst: &Inst) -> NeedsEnded {
        let status = |k: &Key| self.status_of(k);
        NeedsEnded {
            success: inst
                .needs
                .iter()
                .all(|d| status(d) == Some(NodeStatus::Finished)),
            failure: inst.needs.iter().any(|d| self.ended_by_failure(d)),
            cancelled: self.ending.is_cancelling()
                || inst
                    .needs
                    .iter()
                    .any(|d| status(d) == Some(NodeStatus::Cancelled)),
        }
    }

    /// Whether `key` failed, or did not finish because something before it
    /// failed: skipped or cancelled with a need that ended so, or cancelled
    /// by the run's failure. A handler after a chain hears of a failure at
    /// its start, as GitHub Actions' `failure()` does.
    fn ended_by_failure(&self, key: &Key) -> bool {
        let mut seen = KeySet::default();
        let mut todo = vec![key.clone()];
        while let Some(k) = todo.pop() {
            if !seen.insert(k.clone()) {
                continue;
            }
            match self.status_of(&k) {
                Some(NodeStatus::Failed) => return true,
                Some(NodeStatus::Cancelled) if self.ending.failing() => return true,
                Some(NodeStatus::Skipped | NodeStatus::Cancelled) => {
                    if let Some(inst) = self.sched.inst(&k) {
                        todo.extend(inst.needs.iter().cloned());
                    }
                }
                _ => {}
            }
        }
        false
    }

    fn skip(&mut self, key: &Key, reason: String) {
        let scope = self.node_scope(key);
        self.emit(scope, EventKind::NodeSkipped { reason });
        self.node_done(key);
    }

    /// Leaf attempts that may start now: the run's concurrency less the
    /// attempts running that do not wait at a gate.
    fn leaf_slots(&self) -> usize {
        let running = self.attempts.count();
        let busy = running - self.gates.approval_count().min(running);
        self.concurrency.saturating_sub(busy)
    }

    /// Emits `NodeStarted` for what may start now, at most a slice of
    /// nodes and until the log's backlog is full; leaf attempts are spawned
    /// by the caller once those events are durable. Returns false when it
    /// stopped early with nodes still ready.
    pub(super) fn start_ready(&mut self, to_spawn: &mut Vec<(Key, u32)>) -> bool {
        if self.ending.shutting_down() {
            return true;
        }
        if self.ending.stopping() {
            // Also when only applying commands: a cancel or a denial of a
            // run nobody drives runs its handlers, as in a driven run.
            self.start_handlers(to_spawn);
            return true;
        }
        if self.mode == Mode::Apply {
            // Nothing new starts; gates that waited wait again.
            self.continue_resumed(to_spawn);
            return true;
        }
        let mut slice = ROUND_SLICE;
        let mut budget = self.leaf_slots().saturating_sub(to_spawn.len());
        // Leaves past the concurrency budget stay queued; so does a group
        // behind them, which waits for a slot like a leaf would.
        while budget > 0 || self.sched.next_ready_is(|k| self.attempts.is_resumed(k)) {
            if slice == 0 || (self.backlog_full() && self.sched.has_ready()) {
                return false;
            }
            slice -= 1;
            let Some(key) = self.sched.next_ready() else {
                break;
            };
            let Some(inst) = self.sched.inst(&key).cloned() else {
                continue;
            };
            if let Some(attempt) = self.attempts.take_resumed(&key) {
                // A person-in-the-loop attempt continues where it stood.
                to_spawn.push((key, attempt));
                continue;
            }
            let attempt = self.state.node(&key.0, key.1).map_or(0, |n| n.attempt) + 1;
            budget -= self.start(key, &inst, attempt, to_spawn);
        }
        true
    }

    /// The run stops: of what may start, only failure handlers (and the
    /// members of their groups) do, whatever the concurrency.
    fn start_handlers(&mut self, to_spawn: &mut Vec<(Key, u32)>) {
        if self.run_cancel.is_cancelled() {
            // The stop cancelled what ran then; the handlers that start
            // now run under a token of their own, or they would be
            // cancelled as they start. A later immediate cancel stops them.
            let stopped = std::mem::replace(
                &mut self.run_cancel,
                tokio_util::sync::CancellationToken::new(),
            );
            self.stopped.get_or_insert(stopped);
        }
        for key in self.sched.take_ready_handlers() {
            let Some(inst) = self.sched.inst(&key).cloned() else {
                continue;
            };
            if let Some(attempt) = self.attempts.take_resumed(&key) {
                to_spawn.push((key, attempt));
                continue;
            }
            let attempt = self.state.node(&key.0, key.1).map_or(0, |n| n.attempt) + 1;
            self.start(key, &inst, attempt, to_spawn);
        }
    }

    /// A driver that only applies commands continues the attempts a resume
    /// took up (gates), and starts nothing new.
    fn continue_resumed(&mut self, to_spawn: &mut Vec<(Key, u32)>) {
        let attempts = &self.attempts;
        for key in self.sched.take_ready_if(|k| attempts.is_resumed(k)) {
            let attempt = self.attempts.take_resumed(&key).unwrap_or(1);
            to_spawn.push((key, attempt));
        }
    }

    /// Starts attempt `attempt` of `inst`: a leaf that can change files
    /// after its snapshot, any other leaf once its `NodeStarted` is durable
    /// (in `to_spawn`), a group or a value node at once. Returns the leaf
    /// slots it takes.
    fn start(
        &mut self,
        key: Key,
        inst: &Inst,
        attempt: u32,
        to_spawn: &mut Vec<(Key, u32)>,
    ) -> usize {
        let is_group = inst.spec.kind.children().is_some();
        let leaf = !is_group && !matches!(inst.spec.kind, NodeKind::Value(_) | NodeKind::Switch(_));
        if leaf && self.changes_files(inst) {
            // Starts once the root's snapshot is taken (`snapshotted`).
            self.begin_snapshot(key, attempt);
            return 1;
        }
        let scope = self.node_scope(&key).with_attempt(attempt);
        let opened = self.tallies.started(inst.layer, inst.spec.stage.as_deref());
        self.emit_run(opened);
        self.emit(scope, EventKind::NodeStarted { snapshot: None });
        if attempt == 1 {
            self.traverse_edges(&key, inst);
        }
        if is_group {
            self.start_group(&key, inst, attempt);
            return 0;
        }
        if let NodeKind::Value(v) = &inst.spec.kind {
            self.finish_value(&key, inst, attempt, v);
            return 0;
        }
        if let NodeKind::Switch(sw) = &inst.spec.kind {
            self.resolve_switch(&key, inst, attempt, sw);
            return 0;
        }
        to_spawn.push((key, attempt));
        1
    }

    /// A group started: its members mount, and a pass with none ends at
    /// once.
    fn start_group(&mut self, key: &Key, inst: &Inst, attempt: u32) {
        match self.enter_group(key, false) {
            Ok(()) => {
                self.rerender_group(key);
                if self.sched.remaining(key) == 0 {
                    self.finish_group_pass(key);
                }
            }
            Err(e) => self.fail_attempt(key, inst, attempt, e),
        }
    }

    /// A value node touches nothing outside the log, so it ends in the
    /// round it starts in and takes no slot: a chain of them shares one
    /// commit instead of paying one per node. Its `NodeFinished` still
    /// commits with (never before) anything that follows from it.
    fn finish_value(&mut self, key: &Key, inst: &Inst, attempt: u32, v: &Output) {
        let t0 = Instant::now();
        let rendered = if self.is_templated(inst) {
            let ctx = self.context_for(inst, inst.key.1);
            self.templates
                .render_value_in(&v.value(), &ctx)
                .map(Output::from)
        } else {
            // The spec's own output, shared by every instance of it.
            Ok(v.clone())
        };
        match rendered {
            Ok(output) => {
                let scope = self.node_scope(key).with_attempt(attempt);
                self.emit(
                    scope,
                    EventKind::NodeFinished {
                        duration_ms: t0.elapsed().as_millis() as u64,
                        output: Some(output),
                        cached: None,
                        snapshot: None,
                    },
                );
                self.node_done(key);
            }
            Err(e) => {
                let err = NodeError::fatal("template", e.to_string());
                self.fail_attempt(key, inst, attempt, err);
            }
        }
    }

    /// A switch touches nothing outside the log either: its expression
    /// chooses a label in the round it starts in, `BranchResolved` says
    /// which, and the label is its output. The nodes of the other branches
    /// are skipped as they are looked at ([`Scheduler::check`]).
    fn resolve_switch(&mut self, key: &Key, inst: &Inst, attempt: u32, sw: &SwitchSpec) {
        let t0 = Instant::now();
        let value = {
            let ctx = self.context_for(inst, inst.key.1);
            self.templates.eval_in(&sw.on, &ctx)
        };
        let chosen = value
            .map_err(|e| NodeError::fatal("template", format!("switch.on: {e}")))
            .and_then(|v| crate::kinds::switch::choose(sw, &v));
        let scope = self.node_scope(key).with_attempt(attempt);
        match chosen {
            Ok(label) => {
                self.emit(
                    scope.clone(),
                    EventKind::BranchResolved {
                        chosen: label.clone(),
                        candidates: sw.labels(),
                    },
                );
                self.emit(
                    scope,
                    EventKind::NodeFinished {
                        duration_ms: t0.elapsed().as_millis() as u64,
                        output: Some(Output::from(Value::String(label))),
                        cached: None,
                        snapshot: None,
                    },
                );
                self.node_done(key);
            }
            Err(e) => self.fail_attempt(key, inst, attempt, e),
        }
    }

    /// The edges into a node that starts its first attempt.
    pub(super) fn traverse_edges(&mut self, key: &Key, inst: &Inst) {
        for dep in &inst.needs {
            self.emit(
                Scope::run(),
                EventKind::EdgeTraversed {
                    from: dep.0.to_string(),
                    to: key.0.to_string(),
                    condition: inst.spec.if_.clone(),
                },
            );
            // A join of 100,000 needs appends as many edges at once.
            self.ease_backlog_now();
        }
    }

    /// Bookkeeping once a node instance can no longer change: its scorers
    /// start, templates see its output, its layer counts it, its
    /// dependents are looked at, and its group's pass ends with its last
    /// member.
    pub(super) fn node_done(&mut self, key: &Key) {
        if self.start_scorers(key) {
            // Held for a blocking scorer: this runs again when it ends.
            return;
        }
        let Some(inst) = self.sched.inst(key).cloned() else {
            return;
        };
        let status = self.status_of(key).unwrap_or(NodeStatus::Failed);
        if let Some(n) = self.state.node(&key.0, key.1) {
            let replaced = self.nodes_ctx.insert(&key.0, node_ctx_entry(n));
            // Templates read a node's latest pass, and a loop's output is
            // built from its current pass: the output of the pass this one
            // replaces has no reader left in this process (the log keeps
            // it). Loops nested in loops would otherwise hold every pass's
            // outputs, each level's holding the levels below.
            if let Some(old) = replaced.filter(|old| old.iteration != key.1) {
                self.state.drop_output(&key.0, old.iteration);
            }
        }
        self.count_done(&inst, status);
        let Some(parent) = self.sched.ended(&inst) else {
            return;
        };
        let goes_on = !self.ending.stopping()
            || self
                .sched
                .inst(&parent)
                .is_some_and(|g| self.sched.is_handler(g));
        if self.status_of(&parent) == Some(NodeStatus::Running) && goes_on {
            self.finish_group_pass(&parent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::testing::{key, tree_of};
    use std::collections::HashMap;

    const CHAIN: &str = r#"
name: chain
nodes:
  - id: a
    value: 1
  - id: b
    needs: [a]
    value: 2
  - id: c
    needs: [a, b]
    if: "nodes.b.output == 2"
    value: 3
"#;

    const EACH: &str = r#"
name: each
nodes:
  - id: list
    value: [1, 2]
  - id: each
    needs: [list]
    for_each: "nodes.list.output"
    nodes:
      - id: say
        value: "{{ item }}"
  - id: after
    needs: [each]
    value: 0
"#;

    fn scheduler(yaml: &str) -> Scheduler {
        Scheduler::new(tree_of(yaml), 0)
    }

    /// Mounts a frame the way the driver does: every instance pending.
    fn mount(s: &mut Scheduler, frame: &Frame, status: &HashMap<Key, NodeStatus>) {
        for k in &frame.added {
            let inst = s.inst(k).unwrap().clone();
            let st = status.get(k).copied().unwrap_or(NodeStatus::Pending);
            s.mounted(&inst, st, st.is_done(), |d, _| {
                status.get(d).is_some_and(|s| s.is_done())
            });
        }
    }

    #[test]
    fn a_chain_starts_one_node_at_a_time() {
        let mut s = scheduler(CHAIN);
        let frame = s.render("chain").expect("a first frame");
        assert!(matches!(
            frame.event,
            EventKind::FrameCommitted {
                frame_no: 1,
                mounted: 3,
                ..
            }
        ));
        assert!(s.render("chain").is_none(), "nothing changed");
        let mut status = HashMap::new();
        mount(&mut s, &frame, &status);
        // Only `a` has no need.
        assert_eq!(s.next_check(), Some(key("a")));
        assert!(!s.has_checks());
        let look = |s: &Scheduler, k: &str, st: &HashMap<Key, NodeStatus>| {
            s.check(
                &key(k),
                |k| Some(st.get(k).copied().unwrap_or(NodeStatus::Pending)),
                |_| None,
                false,
            )
        };
        assert!(matches!(look(&s, "a", &status), Check::Ready));
        s.enqueue(key("a"));
        assert!(matches!(look(&s, "a", &status), Check::Wait), "queued");
        assert_eq!(s.next_ready(), Some(key("a")));
        status.insert(key("a"), NodeStatus::Finished);
        let a = s.inst(&key("a")).unwrap().clone();
        assert_eq!(s.ended(&a), None);
        // `c` needs `b` too: only `b` is looked at.
        assert_eq!(s.next_check(), Some(key("b")));
        assert!(!s.has_checks());
        status.insert(key("b"), NodeStatus::Finished);
        let b = s.inst(&key("b")).unwrap().clone();
        s.ended(&b);
        assert_eq!(s.next_check(), Some(key("c")));
        match look(&s, "c", &status) {
            Check::Condition(inst, cond) => {
                assert_eq!(inst.key, key("c"));
                assert_eq!(cond, "nodes.b.output == 2");
            }
            other => panic!("{other:?}"),
        }
        // Nothing starts once the run stops.
        let stopping = s.check(
            &key("c"),
            |k| Some(status.get(k).copied().unwrap_or(NodeStatus::Pending)),
            |_| None,
            true,
        );
        assert!(matches!(stopping, Check::Wait));
    }

    #[test]
    fn a_need_that_failed_skips_its_dependents() {
        let mut s = scheduler(CHAIN);
        let frame = s.render("chain").unwrap();
        let status = HashMap::from([(key("a"), NodeStatus::Failed)]);
        mount(&mut s, &frame, &status);
        // `b`'s only need ended already: it is looked at at once.
        assert_eq!(s.next_check(), Some(key("b")));
        let verdict = s.check(
            &key("b"),
            |k| Some(status.get(k).copied().unwrap_or(NodeStatus::Pending)),
            |_| None,
            false,
        );
        match verdict {
            Check::Blocked(reason) => assert_eq!(reason, "dependency `a` failed"),
            other => panic!("{other:?}"),
        }
    }

    const BRANCHES: &str = r#"
name: branches
nodes:
  - id: a
    value: bug
  - id: route
    needs: [a]
    switch:
      on: "nodes.a.output"
      cases: { bug: [fix], feature: [plan] }
  - id: fix
    needs: [route]
    value: 1
  - id: plan
    needs: [route]
    value: 2
  - id: notify
    needs: [a]
    if: "failure()"
    value: 3
"#;

    #[test]
    fn a_switch_skips_the_branches_it_did_not_choose() {
        let mut s = scheduler(BRANCHES);
        let frame = s.render("branches").unwrap();
        let status = HashMap::from([
            (key("a"), NodeStatus::Finished),
            (key("route"), NodeStatus::Finished),
        ]);
        mount(&mut s, &frame, &status);
        let look = |k: &str| {
            s.check(
                &key(k),
                |k| Some(status.get(k).copied().unwrap_or(NodeStatus::Pending)),
                |k| (k == &key("route")).then(|| "bug".to_string()),
                false,
            )
        };
        assert!(matches!(look("fix"), Check::Ready));
        match look("plan") {
            Check::Blocked(reason) => assert_eq!(reason, "branch route chose bug"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_handler_is_asked_however_its_needs_ended_and_while_the_run_stops() {
        let mut s = scheduler(BRANCHES);
        let frame = s.render("branches").unwrap();
        let status = HashMap::from([(key("a"), NodeStatus::Failed)]);
        mount(&mut s, &frame, &status);
        let inst = s.inst(&key("notify")).unwrap().clone();
        assert!(s.is_handler(&inst));
        assert!(!s.is_handler(s.inst(&key("fix")).unwrap()));
        for stopping in [false, true] {
            let verdict = s.check(
                &key("notify"),
                |k| Some(status.get(k).copied().unwrap_or(NodeStatus::Pending)),
                |_| None,
                stopping,
            );
            match verdict {
                Check::Condition(_, cond) => assert_eq!(cond, "failure()"),
                other => panic!("{other:?}"),
            }
        }
        // A plain dependent waits for the run's end while it stops.
        let verdict = s.check(
            &key("route"),
            |k| Some(status.get(k).copied().unwrap_or(NodeStatus::Pending)),
            |_| None,
            true,
        );
        assert!(matches!(verdict, Check::Wait));
    }

    #[test]
    fn a_for_each_mounts_its_elements_and_ends_its_pass_with_the_last() {
        let mut s = scheduler(EACH);
        let frame = s.render("each").unwrap();
        let mut status = HashMap::new();
        mount(&mut s, &frame, &status);
        let each = key("each");
        assert!(!s.group_started(&each));
        s.enter_for_each(&each, vec![1.into(), 2.into()]);
        assert!(s.group_started(&each));
        assert_eq!(s.list_len(&each), 2);
        status.insert(key("list"), NodeStatus::Finished);
        status.insert(each.clone(), NodeStatus::Running);
        let frame = s.render_group("each", &each).expect("the elements mount");
        let added: Vec<String> = frame.added.iter().map(|k| k.0.to_string()).collect();
        assert_eq!(added, ["each[0].say", "each[1].say"]);
        assert!(matches!(
            frame.event,
            EventKind::FrameCommitted { frame_no: 2, .. }
        ));
        mount(&mut s, &frame, &status);
        assert_eq!(s.remaining(&each), 2);
        let first = s.inst(&frame.added[0]).unwrap().clone();
        let second = s.inst(&frame.added[1]).unwrap().clone();
        assert_eq!(s.ended(&first), None);
        assert_eq!(s.ended(&second), Some(each.clone()));
        assert_eq!(s.remaining(&each), 0);
    }

    #[test]
    fn a_drained_map_gives_its_room_back() {
        let mut m: KeyMap<usize> = KeyMap::default();
        for i in 0..5000 {
            m.insert(key(&format!("n{i}")), i);
        }
        let full = m.capacity();
        for i in 0..4990 {
            m.remove(&key(&format!("n{i}")));
            shrink_drained(&mut m);
        }
        assert_eq!(m.len(), 10);
        assert!(m.capacity() < full / 4, "{} of {full}", m.capacity());
        assert_eq!(m.get(&key("n4995")), Some(&4995));
    }

    #[test]
    fn the_ready_queue_keeps_its_order_and_empties_on_a_stop() {
        let mut s = scheduler(CHAIN);
        let frame = s.render("chain").unwrap();
        mount(&mut s, &frame, &HashMap::new());
        s.enqueue(key("a"));
        s.requeue(key("b"));
        s.enqueue(key("c"));
        assert!(s.next_ready_is(|k| k.0 == "a"));
        let taken = s.take_ready_if(|k| k.0 != "a");
        assert_eq!(taken, [key("b"), key("c")]);
        assert!(s.has_ready());
        s.stop();
        assert!(!s.has_ready());
        assert_eq!(s.next_ready(), None);
    }

    #[test]
    fn a_remount_keeps_a_running_loop_and_drops_an_ended_one() {
        const LOOPS: &str = r#"
name: loops
nodes:
  - id: l1
    loop:
      until: "false"
      max_iterations: 3
      nodes:
        - id: x
          value: 1
  - id: l2
    loop:
      until: "false"
      max_iterations: 3
      nodes:
        - id: y
          value: 1
"#;
        let mut s = scheduler(LOOPS);
        let frame = s.render("loops").unwrap();
        mount(&mut s, &frame, &HashMap::new());
        let (l1, l2) = (key("l1"), key("l2"));
        s.enter_loop(&l1, 0);
        s.enter_loop(&l2, 0);
        s.next_pass(&l1);
        assert_eq!(s.loop_pass(&l1), 1);
        s.render("loops").unwrap();
        let tree = s.tree().clone();
        let frame = s.remount(tree, "loops", |k| *k == l2);
        assert!(s.group_started(&l1) && !s.group_started(&l2));
        assert_eq!(s.loop_pass(&l1), 1);
        let added: Vec<String> = frame.added.iter().map(|k| k.0.to_string()).collect();
        assert_eq!(added, ["l1", "l1.x", "l2"]);
        assert!(frame.removed.iter().any(|i| i.key.0 == "l2.y"));
    }
}
