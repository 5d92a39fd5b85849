// The run's timeline: its sessions (a start, each resume), its chapters
// (ChapterStarted/Finished, the workflow's stages) and its layers
// (LayerStarted/Finished), each a bar on one time axis, live.

import { allEvents } from './api.js';
import { h, fmtDuration, fmtTime, statusText } from './dom.js';
import { VirtualList } from './vlist.js';

const TYPES = ['RunStarted', 'RunFinished', 'RunFailed', 'RunCancelled', 'ChapterStarted',
  'ChapterFinished', 'LayerStarted', 'LayerFinished'];
const ROW = 30;

export class Timeline {
  constructor({ runId, model }) {
    this.runId = runId;
    this.model = model;
    this.rows = [];
    this.open = new Map();
    this.lastSeq = 0;
    this.loading = true;
    this.buffer = [];
    this.abort = new AbortController();
    this.axis = h('p', { class: 'muted axis' });
    this.list = new VirtualList({ rowHeight: ROW, label: 'Timeline', className: 'timeline', renderRow: (i) => this.row(i) });
    this.el = h('div', { class: 'timeline-box' }, this.axis, this.list.el);
    this.load();
    // While the run goes on, open bars grow with the clock.
    this.tick = setInterval(() => {
      if (!this.model.isTerminal() && this.open.size) this.draw();
    }, 1000);
  }

  async load() {
    try {
      await allEvents(this.runId, { type: TYPES.join(',') }, (evs) => evs.forEach((e) => this.take(e)), this.abort.signal);
      this.loading = false;
      this.buffer.forEach((e) => this.take(e));
      this.buffer = [];
      this.draw();
    } catch (e) {
      if (e.name !== 'AbortError') this.axis.textContent = e.message;
    }
  }

  take(ev) {
    if (ev.seq <= this.lastSeq) return;
    this.lastSeq = ev.seq;
    const t = ev.timestampMs;
    switch (ev.type) {
      case 'RunStarted':
        this.begin(`run`, ev.resumed ? 'Resumed' : 'Run', 'run', t);
        break;
      case 'RunFinished':
      case 'RunFailed':
      case 'RunCancelled':
        this.end('run', t, ev.type.slice(3).toLowerCase());
        // A run's end closes what it left open.
        for (const key of [...this.open.keys()]) this.end(key, t, 'interrupted');
        break;
      case 'ChapterStarted':
        this.begin(`c:${ev.chapter}`, `Stage ${ev.chapter}`, 'chapter', t);
        break;
      case 'ChapterFinished':
        this.end(`c:${ev.chapter}`, t, ev.status);
        break;
      case 'LayerStarted':
        this.begin(`l:${ev.layerIndex}`, `Layer ${ev.layerIndex} · ${ev.nodeCount} node${ev.nodeCount === 1 ? '' : 's'}`, 'layer', t);
        break;
      case 'LayerFinished':
        this.end(`l:${ev.layerIndex}`, t, ev.failed ? 'failed' : 'finished',
          `${ev.succeeded} ok${ev.failed ? `, ${ev.failed} failed` : ''}${ev.skipped ? `, ${ev.skipped} skipped` : ''}`);
        break;
      default:
        break;
    }
  }

  begin(key, label, kind, t) {
    const row = { key, label, kind, start: t, end: undefined, status: 'running', note: '' };
    this.rows.push(row);
    this.open.set(key, row);
  }

  end(key, t, status, note = '') {
    const row = this.open.get(key);
    if (!row) return;
    row.end = t;
    row.status = status;
    row.note = note;
    this.open.delete(key);
  }

  apply(events) {
    let any = false;
    for (const ev of events) {
      if (!TYPES.includes(ev.type)) continue;
      if (this.loading) this.buffer.push(ev);
      else this.take(ev);
      any = true;
    }
    if (any && !this.loading) this.draw();
  }

  draw() {
    const first = this.rows.length ? this.rows[0].start : 0;
    const now = this.model.isTerminal() && this.model.endedMs ? this.model.endedMs : Date.now();
    const last = Math.max(now, ...this.rows.map((r) => r.end || now));
    this.t0 = first;
    this.span = Math.max(1, last - first);
    this.axis.textContent = this.rows.length
      ? `From ${fmtTime(first)} · ${fmtDuration(this.span)} · ${this.rows.length} bars`
      : 'No stages or layers yet.';
    this.list.setCount(this.rows.length);
    this.list.refresh();
  }

  row(i) {
    const r = this.rows[i];
    const end = r.end === undefined ? Date.now() : r.end;
    const left = ((r.start - this.t0) / this.span) * 100;
    const width = Math.max(0.3, ((end - r.start) / this.span) * 100);
    const bar = h('span', { class: `bar s-${r.status}`, 'aria-hidden': 'true' });
    bar.style.left = `${Math.min(99.7, left)}%`;
    bar.style.width = `${Math.min(width, 100 - Math.min(99.7, left))}%`;
    const text = `${r.label}: ${statusText(r.status)}, ${fmtDuration(end - r.start)}${r.note ? `, ${r.note}` : ''}`;
    return h('div', { role: 'listitem', class: `tl-row k-${r.kind}`, title: text },
      h('span', { class: 'tl-label' }, r.label),
      h('span', { class: 'tl-track' }, bar),
      h('span', { class: 'tl-dur' }, `${fmtDuration(end - r.start)}${r.note ? ` · ${r.note}` : ''}`),
      h('span', { class: 'sr-only' }, text));
  }

  destroy() {
    this.abort.abort();
    clearInterval(this.tick);
    this.list.destroy();
  }
}
