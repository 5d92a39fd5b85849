// One run's page: its header (status, progress, tokens, cost, duration,
// Cancel and Resume), what waits for a person, and its views (graph,
// timeline, activity, events) beside the selected node's panel. It loads
// the run's state (which carries its last seq) and plan, draws, then
// follows the events after that seq, so a page opened mid-run misses
// nothing and repeats nothing.

import { api, runPath } from './api.js';
import { h, badge, fmtDuration, fmtTime, fmtCount, fmtCost, fmtPercent, tokenSum, isTerminal } from './dom.js';
import { RunModel } from './fold.js';
import { Feed } from './feed.js';
import { Graph } from './graph.js';
import { Timeline } from './timeline.js';
import { Activity } from './activity.js';
import { EventLog } from './events.js';
import { NodePanel } from './node.js';
import { Decisions } from './decisions.js';

const TABS = [['graph', 'Graph'], ['timeline', 'Timeline'], ['activity', 'Activity'], ['events', 'Events']];

export class RunView {
  /** `setConnection(state)` shows the live connection's state in the page's header. */
  constructor({ runId, tab, setConnection }) {
    this.runId = runId;
    this.tab = TABS.some(([k]) => k === tab) ? tab : 'graph';
    this.setConnection = setConnection;
    this.views = new Map();
    this.panel = null;
    this.el = h('section', { class: 'run', 'aria-busy': 'true' }, h('p', { class: 'muted' }, 'Loading the run…'));
    this.load();
  }

  async load() {
    let state;
    let plan;
    let types;
    try {
      [state, plan, types] = await Promise.all([
        api(runPath(this.runId)),
        api(runPath(this.runId, '/plan')),
        eventTypes(),
      ]);
    } catch (e) {
      this.el.replaceChildren(h('h1', null, 'Run ', this.runId), h('p', { class: 'error', role: 'alert' }, e.message),
        h('p', null, h('a', { href: '#/' }, 'All runs')));
      this.el.removeAttribute('aria-busy');
      return;
    }
    if (this.destroyed) return;
    this.model = new RunModel(state);
    this.plan = plan.nodes;
    this.types = types;
    this.build();
    this.el.removeAttribute('aria-busy');
    // First render of the run: what the page's speed is measured by.
    requestAnimationFrame(() => {
      performance.mark('cairn:run-rendered');
      this.el.dataset.rendered = 'true';
    });
    this.feed = new Feed(this.runId, this.model.lastSeq, {
      onBatch: (events) => this.apply(events),
      onState: (s) => this.setConnection(s),
    });
    this.feed.start();
    this.clock = setInterval(() => this.renderDuration(), 1000);
  }

  build() {
    const m = this.model;
    this.title = h('h1', { id: 'run-title' }, m.workflow || 'Run', ' ', h('span', { class: 'run-id' }, m.runId));
    this.facts = h('dl', { class: 'facts run-facts' });
    this.progress = h('progress', { max: '1', value: '0', 'aria-label': 'Progress' });
    this.cancelBtn = h('button', { type: 'button', class: 'danger', 'aria-haspopup': 'true' }, 'Cancel run…');
    this.confirm = h('div', { class: 'confirm', hidden: true, role: 'group', 'aria-label': 'Confirm cancel' },
      h('span', null, 'Cancel this run?'),
      h('button', { type: 'button', class: 'danger', onclick: () => this.cancel() }, 'Yes, cancel it'),
      h('button', { type: 'button', onclick: () => this.showConfirm(false) }, 'Keep it running'));
    this.cancelBtn.addEventListener('click', () => this.showConfirm(true));
    this.resumeBtn = h('button', { type: 'button', onclick: () => this.resume() }, 'Resume');
    this.actionStatus = h('p', { class: 'form-status', role: 'status' });
    this.links = h('p', { class: 'links' });
    const head = h('header', { class: 'run-head' },
      h('p', { class: 'crumbs' }, h('a', { href: '#/' }, 'Runs'), ' / ', m.runId),
      this.title, this.facts, this.progress,
      h('div', { class: 'actions' }, this.cancelBtn, this.resumeBtn, this.confirm),
      this.actionStatus, this.links);

    this.decisions = new Decisions({ runId: this.runId, model: m });

    this.tablist = h('div', { class: 'tabs', role: 'tablist', 'aria-label': 'Views of the run' });
    this.tabButtons = new Map();
    for (const [key, label] of TABS) {
      const b = h('button', {
        type: 'button', role: 'tab', id: `tab-${key}`, 'aria-controls': `panel-${key}`,
        'aria-selected': String(key === this.tab), tabindex: key === this.tab ? '0' : '-1',
        onclick: () => this.show(key),
      }, label);
      b.addEventListener('keydown', (e) => this.tabKeys(e, key));
      this.tabButtons.set(key, b);
      this.tablist.append(b);
    }
    this.tabPanels = new Map();
    const panels = TABS.map(([key]) => {
      const p = h('div', { class: 'tabpanel', role: 'tabpanel', id: `panel-${key}`, 'aria-labelledby': `tab-${key}`, hidden: key !== this.tab });
      this.tabPanels.set(key, p);
      return p;
    });
    this.side = h('div', { class: 'side' });
    this.el.replaceChildren(head, this.decisions.el,
      h('div', { class: 'run-body' }, h('div', { class: 'views' }, this.tablist, ...panels), this.side));
    this.renderHead();
    this.show(this.tab, false);
  }

  /** The view of `key`, made on first use. */
  view(key) {
    let v = this.views.get(key);
    if (v) return v;
    const common = { runId: this.runId, model: this.model };
    if (key === 'graph') v = new Graph({ plan: this.plan, model: this.model, onSelect: (p) => this.select(p) });
    else if (key === 'timeline') v = new Timeline(common);
    else if (key === 'activity') v = new Activity(common);
    else v = new EventLog({ ...common, types: this.types });
    this.views.set(key, v);
    this.tabPanels.get(key).append(v.el);
    return v;
  }

  show(key, focus = true) {
    this.tab = key;
    for (const [k, b] of this.tabButtons) {
      b.setAttribute('aria-selected', String(k === key));
      b.tabIndex = k === key ? 0 : -1;
      this.tabPanels.get(k).hidden = k !== key;
    }
    const v = this.view(key);
    if (v.shown) v.shown();
    if (focus) this.tabButtons.get(key).focus();
    const want = `#/runs/${encodeURIComponent(this.runId)}/${key}`;
    if (location.hash !== want) history.replaceState(null, '', want);
  }

  /** Arrow keys move between tabs (the usual tab-list keys). */
  tabKeys(e, key) {
    const i = TABS.findIndex(([k]) => k === key);
    let j = null;
    if (e.key === 'ArrowRight') j = (i + 1) % TABS.length;
    else if (e.key === 'ArrowLeft') j = (i - 1 + TABS.length) % TABS.length;
    else if (e.key === 'Home') j = 0;
    else if (e.key === 'End') j = TABS.length - 1;
    if (j === null) return;
    e.preventDefault();
    this.show(TABS[j][0]);
  }

  select(path) {
    if (this.panel) this.panel.destroy();
    const item = this.plan.find((n) => n.path === path) || null;
    this.panel = new NodePanel({ runId: this.runId, model: this.model, item, path, onClose: () => this.closePanel() });
    this.side.replaceChildren(this.panel.el);
  }

  closePanel() {
    if (this.panel) this.panel.destroy();
    this.panel = null;
    this.side.replaceChildren();
    const graph = this.views.get('graph');
    if (graph && graph.selected) {
      const el = graph.rendered.get(graph.selected);
      const target = el && (el.matches('button') ? el : el.querySelector('.gname'));
      if (target) target.focus();
    }
  }

  /** A batch of new events: folded, then each view takes what concerns it. */
  apply(events) {
    const changes = this.model.apply(events);
    if (changes.run || changes.children) this.renderHead();
    if (changes.decisions) this.decisions.update();
    const graph = this.views.get('graph');
    if (graph && changes.nodes.size) graph.update(changes);
    for (const [key, v] of this.views) if (key !== 'graph') v.apply(events);
    if (this.panel) {
      this.panel.update(changes);
      this.panel.apply(events);
    }
    this.el.dataset.lastSeq = String(this.model.lastSeq);
  }

  renderHead() {
    const m = this.model;
    const p = m.progress();
    this.progress.value = p;
    this.progress.setAttribute('aria-label', `Progress ${fmtPercent(p)}`);
    this.duration = h('dd', { class: 'duration' });
    const tokens = tokenSum(m.tokens);
    this.facts.replaceChildren(
      h('dt', null, 'Status'), h('dd', { class: 'status' }, badge(m.status)),
      h('dt', null, 'Progress'), h('dd', null, `${fmtPercent(p)} of ${m.nodes.size} nodes`),
      h('dt', null, 'Started'), h('dd', null, fmtTime(m.startedMs) || '—'),
      h('dt', null, 'Duration'), this.duration,
      h('dt', null, 'Tokens'), h('dd', { title: `${m.tokens.input || 0} in, ${m.tokens.output || 0} out` }, fmtCount(tokens)),
      h('dt', null, 'Cost'), h('dd', null, fmtCost(m.costUsd) || '—'),
      h('dt', null, 'Driven by'), h('dd', { class: 'instance' }, (!isTerminal(m.status) && m.instance) || '—'));
    this.renderDuration();
    const ended = isTerminal(m.status);
    this.cancelBtn.disabled = ended;
    // A run that ended has nothing to resume (the server answers 409), nor
    // has one an instance drives: only a run left stopped part-way.
    this.resumeBtn.disabled = ended || Boolean(m.instance);
    if (ended) this.showConfirm(false);
    const links = [];
    if (m.parentRunId) links.push('Child of ', h('a', { href: `#/runs/${encodeURIComponent(m.parentRunId)}` }, m.parentRunId), '. ');
    if (m.trigger) links.push(triggerText(m.trigger), '. ');
    if (m.replayOf) {
      const o = encodeURIComponent(m.replayOf.runId);
      links.push('Replay of ', h('a', { href: `#/runs/${o}` }, m.replayOf.runId), ' (',
        h('a', { href: `#/compare/${o}/${encodeURIComponent(m.runId || this.runId)}`, class: 'compare-link' }, 'compare the two'), '). ');
    }
    if (m.children.length) {
      links.push('Child runs: ');
      m.children.forEach((c, i) => links.push(i ? ', ' : '', h('a', { href: `#/runs/${encodeURIComponent(c.runId)}` }, c.runId), ` (${c.workflow}${c.status ? `, ${c.status}` : ''})`));
    }
    if (m.error) links.push(h('span', { class: 'error' }, ` ${m.error.kind}: ${m.error.message}`));
    this.links.replaceChildren(...links);
    this.el.dataset.status = m.status || '';
  }

  renderDuration() {
    const m = this.model;
    if (!m || !this.duration) return;
    const end = m.endedMs || (isTerminal(m.status) ? m.startedMs : Date.now());
    this.duration.textContent = m.startedMs ? fmtDuration(end - m.startedMs) : '—';
  }

  showConfirm(on) {
    this.confirm.hidden = !on;
    this.cancelBtn.hidden = on;
    this.cancelBtn.setAttribute('aria-expanded', String(on));
    if (on) this.confirm.querySelector('button').focus();
    else if (document.activeElement && this.confirm.contains(document.activeElement)) this.cancelBtn.focus();
  }

  async cancel() {
    this.actionStatus.textContent = 'Cancelling…';
    try {
      await api(runPath(this.runId, '/cancel'), { method: 'POST', body: { reason: 'cancelled from the web page' } });
      this.actionStatus.textContent = 'Cancel requested.';
    } catch (e) {
      this.actionStatus.textContent = e.message;
    }
    this.showConfirm(false);
  }

  async resume() {
    this.actionStatus.textContent = 'Resuming…';
    try {
      await api(runPath(this.runId, '/resume'), { method: 'POST', body: {} });
      this.actionStatus.textContent = 'Resumed.';
      if (this.feed) this.feed.wake();
    } catch (e) {
      this.actionStatus.textContent = e.message;
    }
  }

  destroy() {
    this.destroyed = true;
    if (this.feed) this.feed.stop();
    clearInterval(this.clock);
    for (const v of this.views.values()) v.destroy();
    if (this.panel) this.panel.destroy();
  }
}

let knownTypes = null;

/** The contract's event types, as the API document lists them for its filter (asked once). */
function eventTypes() {
  if (!knownTypes) {
    knownTypes = api('/openapi.json').then((doc) => {
      const params = doc.paths['/v1/runs/{id}/events'].get.parameters;
      return params.find((p) => p.name === 'type').schema.items.enum;
    }).catch(() => {
      knownTypes = null;
      return [];
    });
  }
  return knownTypes;
}

/** What started a run that no person started: a schedule's due time or a webhook's delivery. */
function triggerText(t) {
  if (t.kind === 'schedule') {
    const due = t.dueMs === undefined ? '' : ` (due ${fmtTime(t.dueMs)})`;
    return `Started by schedule ${t.name}${due}`;
  }
  const delivery = t.deliveryId ? ` (delivery ${t.deliveryId})` : '';
  return `Started by webhook ${t.name}${delivery}`;
}
