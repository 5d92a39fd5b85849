// One node's panel: its state and attempts, its output or error, and what
// it did, live: a command's output, an agent's conversation step by step
// (streamed text and reasoning, the tool calls of each step with their
// arguments and results, tokens and cost of each model call).

import { api, allEvents, runPath } from './api.js';
import { h, badge, fmtDuration, fmtCost, fmtCount, pretty, brief, throttle } from './dom.js';
import { templatePath } from './fold.js';

/** Most characters kept in one streamed block; older text is dropped first. */
const MAX_STREAM = 200_000;
/** Most instances offered in the instance picker. */
const MAX_INSTANCES = 2000;

export class NodePanel {
  /** `item`: the node as the plan has it (or null); `path`: its plan path. */
  constructor({ runId, model, item, path, onClose }) {
    this.runId = runId;
    this.model = model;
    this.item = item;
    this.path = path;
    this.abort = new AbortController();
    this.head = h('div', { class: 'node-head' });
    this.picker = h('div', { class: 'node-picker' });
    this.body = h('div', { class: 'node-body', 'aria-live': 'off' });
    this.el = h('section', { class: 'panel node-panel', 'aria-labelledby': 'node-title' },
      h('div', { class: 'panel-title' },
        h('h2', { id: 'node-title' }, path),
        h('button', { type: 'button', class: 'close', 'aria-label': 'Close the node panel', onclick: onClose }, '×')),
      this.head, this.picker, this.body);
    this.fetchCalls = throttle(() => this.loadToolCalls(), 500);
    this.choose(this.defaultInstance());
  }

  /** This node's passes: every instance and loop pass of its plan path. */
  passes() {
    const out = [];
    for (const n of this.model.nodes.values()) {
      if (n.nodeId === this.path || templatePath(n.nodeId) === this.path) out.push(n);
    }
    return out;
  }

  /** What to show first: something that needs someone or runs, else the latest. */
  defaultInstance() {
    const all = this.passes();
    const busy = all.find((n) => ['waiting-approval', 'waiting-input', 'running', 'retrying'].includes(n.status));
    if (busy) return busy;
    return all.sort((a, b) => (b.firstSeq || 0) - (a.firstSeq || 0))[0] || null;
  }

  /** Shows one pass: loads its events, then follows them live. */
  async choose(node) {
    this.abort.abort();
    this.abort = new AbortController();
    this.node = node;
    this.lastSeq = 0;
    this.loading = true;
    this.buffer = [];
    this.attempts = new Map();
    this.calls = new Map();
    this.results = new Map();
    this.body.replaceChildren();
    this.renderHead();
    this.renderPicker();
    if (!node) {
      this.body.append(h('p', { class: 'muted' }, 'This node has not started yet.'));
      return;
    }
    const signal = this.abort.signal;
    try {
      await allEvents(this.runId, { node: node.nodeId }, (events) => {
        for (const ev of events) this.take(ev);
      }, signal);
      this.loading = false;
      for (const ev of this.buffer) this.take(ev);
      this.buffer = [];
      if (this.hasTools) this.loadToolCalls();
    } catch (e) {
      if (e.name !== 'AbortError') this.body.append(h('p', { class: 'error', role: 'alert' }, e.message));
    }
  }

  renderHead() {
    const n = this.node;
    const it = this.item;
    const rows = [['Kind', it ? it.kind : '']];
    if (n) {
      rows.push(['Status', badge(n.status)]);
      if (n.iteration) rows.push(['Pass', String(n.iteration)]);
      rows.push(['Attempt', String(n.attempt || 0)]);
      if (n.durationMs !== undefined) rows.push(['Duration', fmtDuration(n.durationMs)]);
      if (n.chapter) rows.push(['Stage', n.chapter]);
      if (n.agent) {
        rows.push(['Model', n.agent.model]);
        rows.push(['Tokens', `${fmtCount(n.agent.inputTokens)} in · ${fmtCount(n.agent.outputTokens)} out`]);
        if (n.agent.costUsd !== undefined) rows.push(['Cost', fmtCost(n.agent.costUsd)]);
        rows.push(['Steps', String(n.agent.step)]);
        rows.push(['Tool calls', String(n.agent.toolCalls)]);
      }
    }
    if (it && it.needs && it.needs.length) rows.push(['Needs', it.needs.join(', ')]);
    if (it && it.handler) rows.push(['Runs if', it.handler]);
    if (it && it.cases) {
      rows.push(['Branches', it.cases.map((c) => `${c.label} → ${c.nodes.map((p) => p.split('.').pop()).join(', ')}`).join('; ')]);
      if (n && typeof n.output === 'string') rows.push(['Chose', n.output]);
    }
    const extra = [];
    if (n && n.status === 'waiting-approval') {
      extra.push(h('p', { class: 'callout' }, 'Waiting for approval: decide in “Waiting for you” above.'));
    }
    if (n && n.status === 'waiting-input') {
      extra.push(h('p', { class: 'callout' }, 'Waiting for an answer: answer in “Waiting for you” above.'));
    }
    if (n && n.error) extra.push(h('p', { class: 'error' }, `${n.error.kind}: ${n.error.message}`));
    if (n && n.reason) extra.push(h('p', { class: 'muted' }, `Reason: ${n.reason}`));
    if (n && n.decision) {
      extra.push(h('p', null, `${n.decision.approved ? 'Approved' : 'Denied'}${n.decision.by ? ` by ${n.decision.by}` : ''}${n.decision.note ? `: ${n.decision.note}` : ''}`));
    }
    if (n && n.output !== undefined && n.output !== null) {
      extra.push(h('details', { class: 'output', open: true }, h('summary', null, 'Output'),
        h('pre', null, clip(pretty(n.output)))));
    }
    this.head.replaceChildren(
      h('dl', { class: 'facts' }, rows.flatMap(([k, v]) => [h('dt', null, k), h('dd', null, v)])),
      ...extra);
  }

  renderPicker() {
    const all = this.passes();
    if (all.length <= 1) {
      this.picker.replaceChildren();
      return;
    }
    all.sort((a, b) => (a.firstSeq || 0) - (b.firstSeq || 0));
    const sel = h('select', {
      id: 'node-instance',
      onchange: () => this.choose(all[Number(sel.value)]),
    }, all.slice(0, MAX_INSTANCES).map((n, i) => h('option', {
      value: String(i), selected: n === this.node,
    }, `${n.nodeId}${n.iteration ? ` · pass ${n.iteration}` : ''} · ${n.status}`)));
    this.picker.replaceChildren(h('label', { htmlFor: 'node-instance' }, `Instance (${all.length})`), sel);
  }

  /** The run's state changed: redraws the head when it concerns this node. */
  update(changes) {
    if (!this.node) {
      const first = this.defaultInstance();
      if (first) this.choose(first);
      return;
    }
    const key = `${this.node.nodeId}\u0001${this.node.iteration || 0}`;
    if (changes.nodes.has(key)) {
      this.node = this.model.nodes.get(key) || this.node;
      this.renderHead();
    }
  }

  /** New events of the run: this node's are added to its story. */
  apply(events) {
    if (!this.node) return;
    for (const ev of events) {
      if (ev.nodeId !== this.node.nodeId) continue;
      if (this.loading) this.buffer.push(ev);
      else this.take(ev);
    }
  }

  attempt(n) {
    let a = this.attempts.get(n);
    if (a) return a;
    const list = h('ol', { class: 'steps' });
    const el = h('section', { class: 'attempt' }, h('h3', null, `Attempt ${n}`), list);
    a = { el, list, steps: new Map(), out: null, pending: [] };
    this.attempts.set(n, a);
    this.body.append(el);
    return a;
  }

  step(a, n) {
    let s = a.steps.get(n);
    if (s) return s;
    const title = h('h4', null, `Step ${n}`);
    const usage = h('p', { class: 'usage muted' });
    const tools = h('ul', { class: 'tools' });
    const el = h('li', { class: 'step' }, title, usage, tools);
    s = { el, title, usage, tools, text: null, reasoning: null };
    a.steps.set(n, s);
    a.list.append(el);
    a.current = s;
    return s;
  }

  /** A block of streamed text in `host`, made on first use. */
  stream(host, kind) {
    const pre = h('pre', { class: `stream ${kind}` });
    const block = kind === 'reasoning'
      ? h('details', { class: 'reasoning', open: true }, h('summary', null, 'Reasoning'), pre)
      : pre;
    host.before(block);
    return pre;
  }

  take(ev) {
    if (ev.seq <= this.lastSeq) return;
    if (this.node && (ev.iteration || 0) !== (this.node.iteration || 0)) return;
    this.lastSeq = ev.seq;
    const a = ev.attempt !== undefined ? this.attempt(ev.attempt) : null;
    switch (ev.type) {
      case 'AgentStepStarted': {
        const s = this.step(a, ev.step);
        s.title.textContent = `Step ${ev.step} · ${ev.model}`;
        break;
      }
      case 'NodeOutput': {
        if (!a) break;
        const s = a.current;
        if (s && (ev.stream === 'text' || ev.stream === 'reasoning')) {
          if (ev.stream === 'text') s.text = s.text || this.stream(s.tools, 'text');
          else s.reasoning = s.reasoning || this.stream(s.text || s.tools, 'reasoning');
          add(ev.stream === 'text' ? s.text : s.reasoning, ev.text);
        } else {
          if (!a.out) {
            a.out = h('pre', { class: 'stream output' });
            a.el.append(a.out);
          }
          const span = ev.stream === 'stderr' ? h('span', { class: 'stderr' }, ev.text) : document.createTextNode(ev.text);
          a.out.append(span);
          trim(a.out, ev.text.length);
        }
        break;
      }
      case 'TokenUsageReported': {
        const s = a && a.current;
        const line = `${fmtCount(ev.inputTokens)} tokens in · ${fmtCount(ev.outputTokens)} out${ev.reasoningTokens ? ` · ${fmtCount(ev.reasoningTokens)} reasoning` : ''}${ev.costUsd !== undefined ? ` · ${fmtCost(ev.costUsd)}` : ''} · ${ev.model}`;
        if (s) s.usage.textContent = line;
        break;
      }
      case 'AgentStepFinished': {
        const s = this.step(a, ev.step);
        const calls = (ev.message && ev.message.toolCalls) || [];
        s.usage.append(h('span', { class: 'finish' }, ` · ${ev.finishReason || 'done'}`));
        if (!s.text && ev.message && ev.message.text) add((s.text = this.stream(s.tools, 'text')), ev.message.text);
        for (const c of calls) {
          const li = this.toolItem(c.name, c.args);
          s.tools.append(li.el);
          a.pending.push(li);
        }
        break;
      }
      case 'AgentGenerationRetried': {
        const s = this.step(a, ev.step);
        s.usage.append(h('span', { class: 'warn' }, ` · retried: ${ev.reason}`));
        break;
      }
      case 'AgentWaiting': {
        const s = this.step(a, ev.step);
        const wait = ev.waitMs !== undefined ? ` ${(ev.waitMs / 1000).toFixed(1)} s` : '';
        s.usage.append(h('span', { class: 'warn' }, ` · waiting${wait} for ${ev.model}'s ${ev.reason.replaceAll('_', ' ')}`));
        break;
      }
      case 'AgentContextCompacted': {
        const s = this.step(a, ev.step);
        s.usage.append(h('span', { class: 'finish' }, ` · conversation compacted (${ev.strategy}): ${fmtCount(ev.tokensBefore)} → ${fmtCount(ev.tokensAfter)} tokens`));
        break;
      }
      case 'ToolCallStarted': {
        this.hasTools = true;
        const i = a.pending.findIndex((p) => p.name === ev.toolName);
        let li;
        if (i >= 0) li = a.pending.splice(i, 1)[0];
        else {
          li = this.toolItem(ev.toolName, undefined);
          (a.current ? a.current.tools : a.list).append(li.el);
        }
        li.status.textContent = 'running';
        li.el.className = 'tool s-running';
        this.calls.set(`${ev.attempt}/${ev.toolSeq}`, li);
        this.showResult(`${ev.attempt}/${ev.toolSeq}`);
        break;
      }
      case 'ToolCallFinished': {
        const li = this.calls.get(`${ev.attempt}/${ev.toolSeq}`);
        if (li) {
          li.status.textContent = `${ev.status} · ${fmtDuration(ev.durationMs)}`;
          li.el.className = `tool s-${ev.status === 'success' ? 'finished' : 'failed'}`;
          if (ev.error) li.el.append(h('p', { class: 'error' }, `${ev.error.kind}: ${ev.error.message}`));
        }
        if (!this.loading) this.fetchCalls();
        break;
      }
      case 'DelegationStarted': {
        const host = a ? (a.current ? a.current.tools : a.list) : this.body;
        host.append(h('li', { class: 'tool' }, 'Started child run ',
          h('a', { href: `#/runs/${encodeURIComponent(ev.childRunId)}` }, ev.childRunId), ` (${ev.workflow})`));
        break;
      }
      case 'NodeFailed':
        if (a) a.el.append(h('p', { class: 'error' }, `Failed: ${ev.error.kind}: ${ev.error.message}${ev.willRetry ? ' (will retry)' : ''}`));
        break;
      case 'NodeFinished':
        if (a) a.el.append(h('p', { class: 'muted' }, `Finished in ${fmtDuration(ev.durationMs)}${ev.cached ? ' (cached)' : ''}`));
        break;
      case 'ApprovalRequested':
        this.body.append(h('p', null, `Approval requested${ev.message ? `: ${ev.message}` : ''}`));
        break;
      case 'InputRequested':
        this.body.append(h('p', null, `Question: ${ev.prompt}`));
        break;
      case 'InputReceived':
        this.body.append(h('p', null, `Answered: ${brief(ev.answer)}`));
        break;
      default:
        break;
    }
  }

  toolItem(name, args) {
    const status = h('span', { class: 'muted' }, 'planned');
    const el = h('li', { class: 'tool' }, h('strong', null, name), ' ', status);
    if (args !== undefined) {
      el.append(h('details', null, h('summary', null, `Arguments: ${brief(args, 80)}`), h('pre', null, clip(pretty(args)))));
    }
    return { el, status, name };
  }

  async loadToolCalls() {
    if (!this.node) return;
    try {
      const q = `?iteration=${this.node.iteration || 0}`;
      const r = await api(runPath(this.runId, `/nodes/${encodeURIComponent(this.node.nodeId)}/tool-calls${q}`), { signal: this.abort.signal });
      for (const c of r.toolCalls) {
        this.results.set(`${c.attempt}/${c.toolSeq}`, c);
        this.showResult(`${c.attempt}/${c.toolSeq}`);
      }
    } catch {
      // The calls' results are extra: the events already tell the story.
    }
  }

  showResult(key) {
    const li = this.calls.get(key);
    const c = this.results.get(key);
    if (!li || !c || li.shown || c.status === 'running') return;
    li.shown = true;
    if (!li.el.querySelector('details')) {
      li.el.append(h('details', null, h('summary', null, `Arguments: ${brief(c.input, 80)}`), h('pre', null, clip(pretty(c.input)))));
    }
    if (c.output !== undefined) {
      li.el.append(h('details', null, h('summary', null, `Result: ${brief(c.output, 80)}`), h('pre', null, clip(pretty(c.output)))));
    }
  }

  destroy() {
    this.abort.abort();
  }
}

function clip(s) {
  return s.length > MAX_STREAM ? `${s.slice(0, MAX_STREAM)}\n…` : s;
}

function add(pre, text) {
  pre.append(document.createTextNode(text));
  trim(pre, text.length);
}

/** Keeps a streamed block under its bound, dropping its oldest text. */
function trim(pre, added) {
  pre.streamed = (pre.streamed || 0) + added;
  if (pre.streamed <= MAX_STREAM * 1.5) return;
  pre.textContent = `…${pre.textContent.slice(-MAX_STREAM)}`;
  pre.streamed = MAX_STREAM;
}
