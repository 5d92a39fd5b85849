// The Activity view: one line per meaningful action of the run and of the
// child runs it started (indented under the delegation that started them),
// from `GET /v1/runs/{id}/activity`, fetched again as the run moves.

import { api, runPath } from './api.js';
import { h, fmtTime, fmtDuration, statusText } from './dom.js';
import { VirtualList } from './vlist.js';

const ROW = 30;

export class Activity {
  constructor({ runId }) {
    this.runId = runId;
    this.entries = [];
    this.depth = new Map([[runId, 0]]);
    this.abort = new AbortController();
    this.note = h('p', { class: 'muted', 'aria-live': 'polite' }, 'Loading…');
    this.list = new VirtualList({ rowHeight: ROW, label: 'Activity', className: 'activity', renderRow: (i) => this.row(i) });
    this.el = h('div', { class: 'activity-box' }, this.note, this.list.el);
    // Each load folds the whole log on the server: on a big live run the
    // view is asked again less often, never more than a fifth of the time.
    this.cost = 0;
    this.refetch = () => {
      if (this.timer) return;
      this.timer = setTimeout(() => { this.timer = null; this.load(); }, Math.max(1500, this.cost * 5));
    };
    this.load();
  }

  async load() {
    const t0 = performance.now();
    try {
      const r = await api(runPath(this.runId, '/activity'), { signal: this.abort.signal });
      this.cost = performance.now() - t0;
      this.entries = r.activity;
      for (const e of this.entries) {
        if (!this.depth.has(e.runId) && e.delegatedBy) {
          this.depth.set(e.runId, (this.depth.get(e.delegatedBy.runId) || 0) + 1);
        }
      }
      this.note.textContent = `${this.entries.length} actions`;
      // Later loads follow the newest entries if the reader is there.
      this.list.setCount(this.entries.length, this.loaded);
      this.loaded = true;
      this.list.refresh();
    } catch (e) {
      if (e.name !== 'AbortError') this.note.textContent = e.message;
    }
  }

  /**
   * New events: the view is folded on the server, so it is asked again (at
   * most every 1.5 s, or five times as long as the last load took), or
   * once shown again if its tab is hidden.
   */
  apply(events) {
    if (!events.some((e) => e.type !== 'NodeHeartbeat')) return;
    if (this.el.offsetParent === null) this.stale = true;
    else this.refetch();
  }

  /** Its tab is shown again. */
  shown() {
    if (this.stale) {
      this.stale = false;
      this.load();
    }
  }

  row(i) {
    const e = this.entries[i];
    const depth = this.depth.get(e.runId) || 0;
    const dur = e.endedMs ? fmtDuration(e.endedMs - e.startedMs) : '';
    const tip = [e.title, e.reasoning && `why: ${e.reasoning}`, e.error].filter(Boolean).join('\n');
    const el = h('div', { role: 'listitem', class: `act s-${e.status} d-${Math.min(depth, 6)}`, title: tip },
      h('span', { class: 'time' }, fmtTime(e.startedMs)),
      h('span', { class: 'kind' }, e.kind),
      h('span', { class: 'title' }, depth ? '↳ ' : '', e.title,
        e.reasoning ? h('span', { class: 'why' }, ` — ${e.reasoning}`) : null),
      h('span', { class: 'status' }, statusText(e.status)),
      h('span', { class: 'dur' }, dur));
    el.append(e.runId === this.runId
      ? h('span', { class: 'child' })
      : h('a', { class: 'child', href: `#/runs/${encodeURIComponent(e.runId)}`, title: e.runId }, e.runId));
    return el;
  }

  destroy() {
    clearTimeout(this.timer);
    this.abort.abort();
    this.list.destroy();
  }
}
