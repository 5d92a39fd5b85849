// The raw event log. Unfiltered, row i is seq i+1 (a log has no gaps), so
// the list needs only the run's last seq: pages of events are fetched as
// they scroll into view and the least recently seen are forgotten, which
// keeps memory bounded at 100,000 events. Filtered (by type and node on the
// server, by text here), it gathers the matches page by page.

import { api, runPath } from './api.js';
import { h, fmtTime, brief, pretty } from './dom.js';
import { VirtualList } from './vlist.js';

const ROW = 26;
const PAGE = 500;
/** Pages kept in memory at most. */
const MAX_PAGES = 60;
/** Live events kept beside the pages at most. */
const MAX_LIVE = 5000;
/** Most matches a filter gathers. */
const MAX_MATCHES = 50_000;

export class EventLog {
  constructor({ runId, model, types }) {
    this.runId = runId;
    this.model = model;
    this.pages = new Map();
    this.loadingPages = new Set();
    this.live = new Map();
    this.filter = null;
    this.matches = [];
    this.selectedSeq = null;
    this.abort = new AbortController();

    const typeSel = h('select', { id: 'ev-type' }, h('option', { value: '' }, 'All types'),
      types.map((t) => h('option', { value: t }, t)));
    const node = h('input', { id: 'ev-node', type: 'search', placeholder: 'exact node id', autocomplete: 'off' });
    const text = h('input', { id: 'ev-text', type: 'search', placeholder: 'any text', autocomplete: 'off' });
    this.status = h('p', { class: 'muted', 'aria-live': 'polite' });
    const apply = () => this.setFilter({ type: typeSel.value, node: node.value.trim(), text: text.value.trim().toLowerCase() });
    const form = h('form', { class: 'filters', onsubmit: (e) => { e.preventDefault(); apply(); } },
      h('div', { class: 'field' }, h('label', { htmlFor: 'ev-type' }, 'Type'), typeSel),
      h('div', { class: 'field' }, h('label', { htmlFor: 'ev-node' }, 'Node'), node),
      h('div', { class: 'field' }, h('label', { htmlFor: 'ev-text' }, 'Text'), text),
      h('button', { type: 'submit' }, 'Filter'));
    typeSel.addEventListener('change', apply);
    this.list = new VirtualList({ rowHeight: ROW, label: 'Events', className: 'events', renderRow: (i) => this.row(i) });
    this.detail = h('pre', { class: 'event-detail', tabindex: '0', 'aria-label': 'The selected event' });
    this.detailBox = h('section', { class: 'detail', hidden: true, 'aria-label': 'Selected event' }, h('h3', null, 'Event'), this.detail);
    this.el = h('div', { class: 'eventlog' }, form, this.status, this.list.el, this.detailBox);
    this.list.setCount(model.lastSeq);
    // A live run is followed from its newest event; an ended one read from the start.
    if (!model.isTerminal()) requestAnimationFrame(() => this.list.scrollToEnd());
    this.describe();
  }

  /** The event of seq `seq`, if at hand; else its page is asked for. */
  event(seq) {
    const live = this.live.get(seq);
    if (live) return live;
    const p = Math.floor((seq - 1) / PAGE);
    const page = this.pages.get(p);
    if (page) {
      // Most recently used last.
      this.pages.delete(p);
      this.pages.set(p, page);
      const ev = page[seq - 1 - p * PAGE];
      if (ev) return ev;
      if (page.length < PAGE && !page.complete) this.pages.delete(p);
    }
    this.loadPage(p);
    return null;
  }

  async loadPage(p) {
    if (this.loadingPages.has(p)) return;
    this.loadingPages.add(p);
    try {
      const r = await api(runPath(this.runId, `/events?after=${p * PAGE}&limit=${PAGE}`), { signal: this.abort.signal });
      const page = r.events;
      page.complete = page.length === PAGE;
      this.pages.set(p, page);
      while (this.pages.size > MAX_PAGES) this.pages.delete(this.pages.keys().next().value);
      if (!this.filter) this.list.refresh();
    } catch {
      // The row stays a placeholder; scrolling asks again.
    } finally {
      this.loadingPages.delete(p);
    }
  }

  row(i) {
    const ev = this.filter ? this.matches[i] : this.event(i + 1);
    if (!ev) {
      return h('div', { role: 'listitem', class: 'evrow loading' }, h('span', { class: 'seq' }, String(i + 1)), '…');
    }
    const label = `${ev.seq} ${ev.type}${ev.nodeId ? ` ${ev.nodeId}` : ''}`;
    const b = h('button', {
      type: 'button', class: `evrow t-${ev.type}${ev.seq === this.selectedSeq ? ' selected' : ''}`,
      'data-seq': String(ev.seq), 'aria-label': label,
      onclick: () => this.select(ev),
    },
    h('span', { class: 'seq' }, String(ev.seq)),
    h('span', { class: 'time' }, fmtTime(ev.timestampMs)),
    h('span', { class: 'type' }, ev.type),
    h('span', { class: 'node' }, ev.nodeId || ''),
    h('span', { class: 'sum' }, summary(ev)));
    return h('div', { role: 'listitem' }, b);
  }

  select(ev) {
    this.selectedSeq = ev.seq;
    this.detailBox.hidden = false;
    this.detail.textContent = pretty(ev);
    this.list.refresh();
  }

  /** New events from the feed. */
  apply(events) {
    for (const ev of events) {
      this.live.set(ev.seq, ev);
      if (this.filter && this.matchesFilter(ev) && this.matches.length < MAX_MATCHES && this.filterDone) {
        this.matches.push(ev);
      }
    }
    while (this.live.size > MAX_LIVE) this.live.delete(this.live.keys().next().value);
    if (this.filter) this.list.setCount(this.matches.length, true);
    else this.list.setCount(this.model.lastSeq, true);
    this.describe();
  }

  describe() {
    if (this.filter) {
      this.status.textContent = `${this.matches.length} matching events${this.filterDone ? '' : ' so far…'}${this.matches.length >= MAX_MATCHES ? ' (the first ones only)' : ''}`;
    } else {
      this.status.textContent = `${this.model.lastSeq} events`;
    }
  }

  matchesFilter(ev) {
    const f = this.filter;
    if (f.type && ev.type !== f.type) return false;
    if (f.node && ev.nodeId !== f.node) return false;
    if (f.text && !JSON.stringify(ev).toLowerCase().includes(f.text)) return false;
    return true;
  }

  async setFilter(f) {
    this.abort.abort();
    this.abort = new AbortController();
    const signal = this.abort.signal;
    if (!f.type && !f.node && !f.text) {
      this.filter = null;
      this.list.setCount(this.model.lastSeq);
      this.list.refresh();
      this.describe();
      return;
    }
    this.filter = f;
    this.matches = [];
    this.filterDone = false;
    this.list.setCount(0);
    this.list.refresh();
    this.describe();
    let after = 0;
    let lastRead = 0;
    try {
      while (this.matches.length < MAX_MATCHES) {
        const q = new URLSearchParams({ after: String(after), limit: '5000' });
        if (f.type) q.set('type', f.type);
        if (f.node) q.set('node', f.node);
        const r = await api(runPath(this.runId, `/events?${q}`), { signal });
        for (const ev of r.events) {
          lastRead = ev.seq;
          if (this.matchesFilter(ev) && this.matches.length < MAX_MATCHES) this.matches.push(ev);
        }
        this.list.setCount(this.matches.length);
        this.describe();
        if (r.nextAfter === undefined) break;
        after = r.nextAfter;
      }
      // Live events the pages did not cover yet join, then every new one.
      for (const [seq, ev] of this.live) if (seq > lastRead && this.matchesFilter(ev)) this.matches.push(ev);
      this.filterDone = true;
      this.list.setCount(this.matches.length);
      this.describe();
    } catch (e) {
      if (e.name !== 'AbortError') this.status.textContent = e.message;
    }
  }

  destroy() {
    this.abort.abort();
    this.list.destroy();
  }
}

/** One line of what an event says beyond its type and node. */
function summary(ev) {
  const skip = new Set(['type', 'runId', 'seq', 'timestampMs', 'nodeId', 'iteration', 'attempt', 'chapter']);
  const parts = [];
  if (ev.iteration) parts.push(`pass ${ev.iteration}`);
  if (ev.attempt) parts.push(`attempt ${ev.attempt}`);
  for (const [k, v] of Object.entries(ev)) {
    if (skip.has(k)) continue;
    parts.push(`${k}=${brief(v, 80)}`);
    if (parts.length > 5) break;
  }
  return parts.join(' ');
}
