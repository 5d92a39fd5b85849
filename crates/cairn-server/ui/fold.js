// The run as the page shows it: the server's state (`GET /v1/runs/{id}`,
// folded by the one reducer) brought forward by the events that arrive
// after it, for the fields the page draws. Each batch says what changed so
// that views redraw only that.

/** The key of one node pass. */
export function nodeKey(nodeId, iteration) {
  return `${nodeId}\u0001${iteration || 0}`;
}

/** A node path with its `for_each` element indices removed: `a[3].b` → `a.b`. */
export function templatePath(nodeId) {
  return nodeId.replace(/\[\d+\]/g, '');
}

const DONE = new Set(['finished', 'failed', 'skipped']);

/**
 * The event types `RunModel.applyOne` leaves alone: the page draws them
 * from the server's state, or other views read them from the log. Every
 * event type of the contract is either a `case` of `applyOne` or named
 * here; a test of the server (`ui.rs`) fails on one that is neither, so
 * a new event type is decided here too.
 */
export const IGNORED_EVENTS = new Set([
  'RunSummary',
  'FrameCommitted',
  'LayerStarted',
  'LayerFinished',
  'EdgeTraversed',
  'BranchResolved',
  'ChapterStarted',
  'ChapterFinished',
  'NodeHeartbeat',
  'NodeOutput',
  'AgentStepFinished',
  'AgentGenerationRetried',
  'AgentContextCompacted',
  'AgentWaiting',
  'AgentEvent',
  'ToolCallFinished',
  'McpServerStarting',
  'McpServerConnected',
  'McpServerStderr',
  'McpServerDisconnected',
  'NetworkAccess',
  'Diagnostic',
  'RevertStarted',
  'RevertFinished',
  'WorkflowReloadDetected',
  'WorkflowReloaded',
  'WorkflowReloadFailed',
  'WorkflowReloadUnsafe',
  'ScorerStarted',
  'ScorerFinished',
  'ScorerFailed',
  'RunHijackRequested',
  'RunHijacked',
]);

/** What a batch of events changed. */
export class Changes {
  constructor() {
    this.run = false;
    this.nodes = new Set();
    this.decisions = false;
    this.children = false;
  }
}

export class RunModel {
  /** From `GET /v1/runs/{id}`'s answer. */
  constructor(state) {
    this.runId = state.runId;
    this.workflow = state.workflow;
    this.status = state.status;
    this.startedMs = state.startedMs;
    this.endedMs = state.endedMs;
    this.lastSeq = state.lastSeq || 0;
    this.tokens = { ...(state.tokens || {}) };
    this.costUsd = state.costUsd;
    this.error = state.error;
    this.output = state.output;
    this.parentRunId = state.parentRunId;
    this.trigger = state.trigger;
    this.replayOf = state.replayOf;
    this.instance = state.instance;
    this.cancelRequested = state.cancelRequested;
    this.children = (state.children || []).map((c) => ({ ...c }));
    this.questions = new Map(Object.entries(state.questions || {}));
    this.nodes = new Map();
    this.done = 0;
    for (const n of state.nodes || []) {
      const node = { ...n };
      this.nodes.set(nodeKey(n.nodeId, n.iteration), node);
      if (DONE.has(node.status)) this.done += 1;
    }
  }

  /** Finished, failed and skipped node passes over all of them (as the reducer counts). */
  progress() {
    if (this.nodes.size === 0) return this.isTerminal() ? 1 : 0;
    return this.done / this.nodes.size;
  }

  isTerminal() {
    return this.status === 'finished' || this.status === 'failed' || this.status === 'cancelled';
  }

  /** Gates waiting for a decision. */
  openApprovals() {
    const out = [];
    for (const n of this.nodes.values()) if (n.status === 'waiting-approval') out.push(n);
    return out;
  }

  /** Questions not answered yet, as [requestId, question]. */
  openQuestions() {
    return [...this.questions].filter(([, q]) => q.answer === undefined);
  }

  node(ev, changes) {
    if (ev.nodeId === undefined) return null;
    const key = nodeKey(ev.nodeId, ev.iteration);
    let n = this.nodes.get(key);
    if (!n) {
      n = { nodeId: ev.nodeId, iteration: ev.iteration || 0, status: 'pending', attempt: 0, attempts: [], firstSeq: ev.seq };
      this.nodes.set(key, n);
      changes.run = true;
    }
    if (ev.chapter !== undefined) n.chapter = ev.chapter;
    changes.nodes.add(key);
    return n;
  }

  setStatus(n, status) {
    if (DONE.has(n.status)) this.done -= 1;
    n.status = status;
    if (DONE.has(status)) this.done += 1;
  }

  /** Folds a batch of events (in seq order, after `lastSeq`). */
  apply(events) {
    const c = new Changes();
    for (const ev of events) {
      if (ev.seq <= this.lastSeq) continue;
      this.lastSeq = ev.seq;
      this.applyOne(ev, c);
    }
    return c;
  }

  applyOne(ev, c) {
    const t = ev.timestampMs;
    switch (ev.type) {
      case 'RunStarted':
        if (!ev.resumed) this.startedMs = t;
        if (ev.trigger) this.trigger = ev.trigger;
        if (ev.replayOf) this.replayOf = ev.replayOf;
        if (this.startedMs === undefined) this.startedMs = t;
        this.status = 'running';
        this.endedMs = undefined;
        this.error = undefined;
        c.run = true;
        break;
      case 'RunStatusChanged':
        this.status = ev.status;
        c.run = true;
        break;
      case 'RunCancelRequested':
        this.cancelRequested = ev.reason || '';
        c.run = true;
        break;
      case 'RunFinished':
        this.status = 'finished';
        this.output = ev.output;
        this.endedMs = t;
        c.run = true;
        break;
      case 'RunFailed':
        this.status = 'failed';
        this.error = ev.error;
        this.endedMs = t;
        c.run = true;
        break;
      case 'RunCancelled':
        this.status = 'cancelled';
        this.endedMs = t;
        c.run = true;
        break;
      case 'TokenUsageReported': {
        const tk = this.tokens;
        tk.input = (tk.input || 0) + (ev.inputTokens || 0);
        tk.output = (tk.output || 0) + (ev.outputTokens || 0);
        tk.cacheRead = (tk.cacheRead || 0) + (ev.cacheReadTokens || 0);
        tk.cacheWrite = (tk.cacheWrite || 0) + (ev.cacheWriteTokens || 0);
        tk.reasoning = (tk.reasoning || 0) + (ev.reasoningTokens || 0);
        if (ev.costUsd !== undefined) this.costUsd = (this.costUsd || 0) + ev.costUsd;
        const n = this.node(ev, c);
        if (n) {
          const a = (n.agent = n.agent || { step: 0, model: '', toolCalls: 0, inputTokens: 0, outputTokens: 0 });
          a.inputTokens += ev.inputTokens || 0;
          a.outputTokens += ev.outputTokens || 0;
          if (ev.costUsd !== undefined) a.costUsd = (a.costUsd || 0) + ev.costUsd;
        }
        c.run = true;
        break;
      }
      case 'AgentStepStarted': {
        const n = this.node(ev, c);
        const a = (n.agent = n.agent || { step: 0, model: '', toolCalls: 0, inputTokens: 0, outputTokens: 0 });
        a.step = ev.step;
        a.model = ev.model;
        break;
      }
      case 'ToolCallStarted': {
        const n = this.node(ev, c);
        if (n && n.agent) n.agent.toolCalls += 1;
        break;
      }
      case 'NodePending': {
        const n = this.node(ev, c);
        if (ev.layerIndex !== undefined) n.layerIndex = ev.layerIndex;
        this.setStatus(n, 'pending');
        break;
      }
      case 'NodeStarted': {
        const n = this.node(ev, c);
        this.setStatus(n, 'running');
        n.attempt = ev.attempt || 1;
        n.error = undefined;
        n.attempts = [...(n.attempts || []), { attempt: n.attempt, startedMs: t, status: 'running', toolCalls: 0 }];
        break;
      }
      case 'NodeFinished': {
        const n = this.node(ev, c);
        this.setStatus(n, 'finished');
        n.output = ev.output;
        n.durationMs = ev.durationMs;
        closeAttempt(n, t, 'finished');
        break;
      }
      case 'NodeFailed': {
        const n = this.node(ev, c);
        this.setStatus(n, ev.willRetry ? 'retrying' : 'failed');
        n.error = ev.error;
        closeAttempt(n, t, 'failed');
        break;
      }
      case 'NodeRetrying':
        this.setStatus(this.node(ev, c), 'retrying');
        break;
      case 'NodeSkipped': {
        const n = this.node(ev, c);
        this.setStatus(n, 'skipped');
        n.reason = ev.reason;
        break;
      }
      case 'NodeCancelled': {
        const n = this.node(ev, c);
        this.setStatus(n, 'cancelled');
        if (ev.reason !== undefined) n.reason = ev.reason;
        closeAttempt(n, t, 'cancelled');
        break;
      }
      case 'NodeWaitingApproval':
        this.setStatus(this.node(ev, c), 'waiting-approval');
        c.decisions = true;
        break;
      case 'ApprovalRequested': {
        const n = this.node(ev, c);
        if (ev.message !== undefined) n.approvalMessage = ev.message;
        c.decisions = true;
        break;
      }
      case 'ApprovalGranted':
      case 'ApprovalDenied': {
        const n = this.node(ev, c);
        n.decision = { approved: ev.type === 'ApprovalGranted', by: ev.decidedBy, note: ev.note };
        if (n.status === 'waiting-approval') this.setStatus(n, 'running');
        c.decisions = true;
        break;
      }
      case 'InputRequested': {
        if (!this.questions.has(ev.requestId)) {
          this.questions.set(ev.requestId, {
            nodeId: ev.nodeId, iteration: ev.iteration || 0, prompt: ev.prompt, schema: ev.schema,
          });
        }
        const n = this.node(ev, c);
        this.setStatus(n, 'waiting-input');
        n.inputRequestId = ev.requestId;
        c.decisions = true;
        break;
      }
      case 'NodeWaitingInput': {
        const n = this.node(ev, c);
        this.setStatus(n, 'waiting-input');
        n.inputRequestId = ev.requestId;
        c.decisions = true;
        break;
      }
      case 'InputReceived': {
        const q = this.questions.get(ev.requestId);
        if (q) {
          q.answer = ev.answer;
          q.answeredBy = ev.answeredBy;
        }
        const n = this.node(ev, c);
        const open = [...this.questions.values()].some(
          (x) => x.answer === undefined && x.nodeId === ev.nodeId && x.iteration === (ev.iteration || 0),
        );
        if (n && n.status === 'waiting-input' && !open) this.setStatus(n, 'running');
        c.decisions = true;
        break;
      }
      case 'DelegationStarted':
        if (!this.children.some((x) => x.runId === ev.childRunId)) {
          this.children.push({
            runId: ev.childRunId, nodeId: ev.nodeId, iteration: ev.iteration || 0,
            agent: ev.agent, workflow: ev.workflow,
          });
          c.children = true;
        }
        break;
      case 'DelegationFinished': {
        const ch = this.children.find((x) => x.runId === ev.childRunId);
        if (ch) {
          ch.status = ev.status;
          ch.state = ev.status;
          c.children = true;
        }
        break;
      }
      default:
        // IGNORED_EVENTS, and types newer than this page.
        break;
    }
  }
}

function closeAttempt(n, t, status) {
  const a = n.attempts && n.attempts[n.attempts.length - 1];
  if (a && a.status === 'running') {
    a.status = status;
    a.endedMs = t;
  }
}
