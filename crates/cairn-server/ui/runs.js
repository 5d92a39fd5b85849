// The list of runs, newest first, child runs under their parents:
// status, workflow, start, duration, progress, tokens, cost; filters by
// status and workflow; kept current by asking again every two seconds
// while the page is visible. Also the form that starts a run.

import { api } from './api.js';
import { h, badge, fmtDuration, fmtTime, fmtCount, fmtCost, fmtPercent, tokenSum, isTerminal } from './dom.js';

const STATUSES = ['running', 'waiting-approval', 'waiting-input', 'finished', 'failed', 'cancelled'];
const POLL_MS = 2000;

export class RunsView {
  constructor({ setConnection }) {
    this.setConnection = setConnection;
    this.limit = 100;
    this.rows = new Map();
    this.workflows = new Set();
    this.status = h('select', { id: 'runs-status' }, h('option', { value: '' }, 'Any status'),
      STATUSES.map((s) => h('option', { value: s }, s)));
    this.workflow = h('input', { id: 'runs-workflow', type: 'search', list: 'runs-workflows', placeholder: 'any', autocomplete: 'off' });
    this.datalist = h('datalist', { id: 'runs-workflows' });
    this.status.addEventListener('change', () => this.refresh());
    this.workflow.addEventListener('change', () => this.refresh());
    const filters = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter runs', onsubmit: (e) => { e.preventDefault(); this.refresh(); } },
      h('div', { class: 'field' }, h('label', { htmlFor: 'runs-status' }, 'Status'), this.status),
      h('div', { class: 'field' }, h('label', { htmlFor: 'runs-workflow' }, 'Workflow'), this.workflow, this.datalist),
      h('button', { type: 'submit' }, 'Filter'));
    this.tbody = h('tbody');
    this.note = h('p', { class: 'muted', 'aria-live': 'polite' });
    this.more = h('button', { type: 'button', hidden: true, onclick: () => { this.limit = Math.min(1000, this.limit + 100); this.refresh(); } }, 'Show more runs');
    this.el = h('section', { class: 'runs', 'aria-labelledby': 'runs-title' },
      h('h1', { id: 'runs-title' }, 'Runs'),
      this.startForm(),
      filters,
      h('div', { class: 'table-wrap' },
        h('table', { class: 'runs-table' },
          h('caption', { class: 'sr-only' }, 'Runs, newest first; child runs under their parents'),
          h('thead', null, h('tr', null,
            ['Status', 'Workflow', 'Run', 'Started', 'Duration', 'Progress', 'Tokens', 'Cost'].map((c) => h('th', { scope: 'col' }, c)))),
          this.tbody)),
      this.note, this.more);
    this.refresh();
    this.timer = setInterval(() => {
      if (!document.hidden) this.refresh();
    }, POLL_MS);
    this.tick = setInterval(() => this.tickDurations(), 1000);
  }

  startForm() {
    const name = h('input', { id: 'start-workflow', type: 'text', required: true, autocomplete: 'off', placeholder: 'hello' });
    const input = h('textarea', { id: 'start-input', rows: '3', spellcheck: 'false', placeholder: '{}' });
    const status = h('p', { class: 'form-status', role: 'status' });
    const form = h('form', { class: 'start' },
      h('div', { class: 'field' }, h('label', { htmlFor: 'start-workflow' }, 'Workflow name'), name,
        h('p', { class: 'hint' }, 'A workflow of the server’s workflows folder, by name.')),
      h('div', { class: 'field' }, h('label', { htmlFor: 'start-input' }, 'Input (JSON, optional)'), input),
      h('button', { type: 'submit', class: 'primary' }, 'Start the run'), status);
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      let value;
      try {
        value = input.value.trim() ? JSON.parse(input.value) : undefined;
      } catch {
        status.textContent = 'The input is not valid JSON.';
        input.setAttribute('aria-invalid', 'true');
        input.focus();
        return;
      }
      input.removeAttribute('aria-invalid');
      status.textContent = 'Starting…';
      try {
        const body = { workflow: name.value.trim() };
        if (value !== undefined) body.input = value;
        const r = await api('/v1/runs', { method: 'POST', body });
        location.hash = `#/runs/${encodeURIComponent(r.runId)}`;
      } catch (err) {
        status.textContent = err.message;
      }
    });
    return h('details', { class: 'start-box' }, h('summary', null, 'Start a run'), form);
  }

  async refresh() {
    const q = new URLSearchParams({ limit: String(this.limit) });
    if (this.status.value) q.set('status', this.status.value);
    if (this.workflow.value.trim()) q.set('workflow', this.workflow.value.trim());
    try {
      const r = await api(`/v1/runs?${q}`);
      if (this.destroyed) return;
      this.setConnection('live');
      this.render(r);
    } catch (e) {
      if (this.destroyed) return;
      this.setConnection(e.status === 0 ? 'offline' : 'live');
      this.note.textContent = e.message;
    }
  }

  /** Draws the rows, reusing each run's row so focus and scroll stay put. */
  render(r) {
    const runs = r.runs;
    for (const x of runs) {
      if (!this.workflows.has(x.workflow)) {
        this.workflows.add(x.workflow);
        this.datalist.append(h('option', { value: x.workflow }));
      }
    }
    const ids = new Set(runs.map((x) => x.runId));
    const kids = new Map();
    const top = [];
    for (const x of runs) {
      if (x.parentRunId && ids.has(x.parentRunId)) {
        if (!kids.has(x.parentRunId)) kids.set(x.parentRunId, []);
        kids.get(x.parentRunId).push(x);
      } else top.push(x);
    }
    const ordered = [];
    const walk = (x, depth) => {
      ordered.push([x, depth]);
      // Children in the order they started.
      for (const c of (kids.get(x.runId) || []).slice().reverse()) walk(c, depth + 1);
    };
    for (const x of top) walk(x, 0);
    const keep = new Set();
    let prev = null;
    for (const [x, depth] of ordered) {
      keep.add(x.runId);
      let row = this.rows.get(x.runId);
      if (!row) {
        row = this.row();
        this.rows.set(x.runId, row);
      }
      this.fill(row, x, depth);
      const want = prev ? prev.tr.nextSibling : this.tbody.firstChild;
      if (want !== row.tr) this.tbody.insertBefore(row.tr, want);
      prev = row;
    }
    for (const [id, row] of this.rows) {
      if (!keep.has(id)) {
        row.tr.remove();
        this.rows.delete(id);
      }
    }
    this.note.textContent = runs.length ? '' : 'No runs yet. Start one above, or with `cairn run`.';
    this.more.hidden = r.nextOffset === undefined || this.limit >= 1000;
  }

  row() {
    const cells = {};
    const tr = h('tr', null,
      ['status', 'workflow', 'run', 'started', 'duration', 'progress', 'tokens', 'cost'].map((k, i) => {
        const td = h('td', { 'data-label': ['Status', 'Workflow', 'Run', 'Started', 'Duration', 'Progress', 'Tokens', 'Cost'][i] });
        cells[k] = td;
        return td;
      }));
    const link = h('a', { class: 'run-link' });
    cells.run.append(link);
    const bar = h('progress', { max: '1', value: '0' });
    const pct = h('span', { class: 'pct' });
    cells.progress.append(bar, pct);
    return { tr, cells, link, bar, pct, data: null };
  }

  fill(row, x, depth) {
    const c = row.cells;
    row.data = x;
    row.tr.className = depth ? `child d-${Math.min(depth, 4)}` : '';
    row.tr.dataset.run = x.runId;
    row.tr.dataset.status = x.status;
    const status = x.status;
    if (c.status.dataset.v !== status) {
      c.status.dataset.v = status;
      c.status.replaceChildren(badge(status));
    }
    c.status.title = x.instance ? `driven by ${x.instance}` : '';
    c.status.dataset.instance = x.instance || '';
    c.workflow.textContent = x.workflow;
    const href = `#/runs/${encodeURIComponent(x.runId)}`;
    if (row.link.getAttribute('href') !== href) row.link.setAttribute('href', href);
    row.link.textContent = `${depth ? '↳ ' : ''}${x.runId}`;
    c.started.textContent = fmtTime(x.startedMs || x.createdMs);
    row.bar.value = x.progress || 0;
    row.bar.setAttribute('aria-label', `Progress of ${x.runId}`);
    row.pct.textContent = fmtPercent(x.progress);
    const t = tokenSum(x.tokens);
    c.tokens.textContent = t ? fmtCount(t) : '—';
    c.tokens.title = x.tokens ? `${x.tokens.input} in, ${x.tokens.output} out` : '';
    c.cost.textContent = fmtCost(x.costUsd) || '—';
    this.duration(row);
  }

  duration(row) {
    const x = row.data;
    const start = x.startedMs || x.createdMs;
    const end = x.endedMs || (isTerminal(x.status) ? x.updatedMs : Date.now());
    row.cells.duration.textContent = start ? fmtDuration(end - start) : '';
  }

  tickDurations() {
    for (const row of this.rows.values()) if (row.data && !isTerminal(row.data.status)) this.duration(row);
  }

  destroy() {
    this.destroyed = true;
    clearInterval(this.timer);
    clearInterval(this.tick);
  }
}
