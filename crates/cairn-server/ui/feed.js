// A run's live events over Server-Sent Events. It starts after a seq the
// page already has, takes each event once and in seq order (a duplicate is
// dropped, a gap makes it reconnect from its last seq so the server replays
// what is missing), reconnects from its last seq after any drop, and hands
// events over in batches, at most once per animation frame. Once the run
// has ended it holds no connection (browsers allow few per server): it
// looks now and then whether the run was resumed, and comes back if so.

import { api, auth, runPath } from './api.js';

/** The longest wait between two reconnection attempts. */
const MAX_BACKOFF_MS = 10_000;
/** How often an ended run is checked for a resume. */
const IDLE_POLL_MS = 5_000;

export class Feed {
  /**
   * `onBatch(events)` gets new events in seq order; `onState(state)` gets
   * `connecting`, `live`, `reconnecting`, `ended` (the run ended; no
   * connection is held) or `closed`.
   */
  constructor(runId, afterSeq, { onBatch, onState }) {
    this.runId = runId;
    this.last = afterSeq;
    this.onBatch = onBatch;
    this.onState = onState;
    this.queue = [];
    this.flushing = 0;
    this.source = null;
    this.backoff = 500;
    this.timer = 0;
    this.stopped = false;
    this.received = 0;
  }

  start() {
    this.open('connecting');
  }

  open(state) {
    this.close();
    if (this.stopped) return;
    this.onState(state);
    clearTimeout(this.timer);
    const url = runPath(this.runId, `/events/stream?after=${this.last}`);
    const es = new EventSource(url, { withCredentials: true });
    this.source = es;
    es.onopen = () => {
      this.backoff = 500;
      this.onState('live');
    };
    es.onmessage = (m) => this.take(m.data);
    // The server's own `error` event (a watcher that fell behind) carries
    // data; the browser's (a dropped connection) does not.
    es.addEventListener('error', (e) => {
      if (e.data !== undefined || es.readyState === EventSource.CLOSED) this.retry();
      else this.onState('reconnecting');
    });
    es.addEventListener('shutdown', () => this.retry());
    // The run ended: nothing more comes until someone resumes it.
    es.addEventListener('end', () => this.idle());
  }

  idle() {
    this.close();
    if (this.stopped) return;
    this.onState('ended');
    clearTimeout(this.timer);
    this.timer = setTimeout(async () => {
      try {
        if (!document.hidden) {
          // One event after ours, if any: a cheap question even for a big run.
          const page = await api(runPath(this.runId, `/events?after=${this.last}&limit=1`));
          if (page.events.length) {
            this.open('connecting');
            return;
          }
        }
      } catch {
        // Checked again at the next tick.
      }
      this.idle();
    }, IDLE_POLL_MS);
  }

  /** Reconnects at once if the feed is resting (after a resume, say). */
  wake() {
    if (!this.source && !this.stopped) this.open('connecting');
  }

  take(data) {
    let ev;
    try {
      ev = JSON.parse(data);
    } catch {
      return;
    }
    if (ev.seq <= this.last) return;
    if (ev.seq !== this.last + 1) {
      // Never expected from the server; reconnecting replays the gap.
      this.open('reconnecting');
      return;
    }
    this.last = ev.seq;
    this.received += 1;
    this.queue.push(ev);
    this.schedule();
  }

  schedule() {
    if (this.flushing) return;
    const flush = () => {
      this.flushing = 0;
      const batch = this.queue;
      this.queue = [];
      if (batch.length) this.onBatch(batch);
    };
    // Animation frames stop in a hidden tab; events still go in.
    this.flushing = document.hidden ? setTimeout(flush, 250) : requestAnimationFrame(flush);
  }

  /** Reconnects from the last seq, after a pause that grows while it fails. */
  retry() {
    this.close();
    if (this.stopped) return;
    this.onState('reconnecting');
    clearTimeout(this.timer);
    this.timer = setTimeout(async () => {
      try {
        // A closed stream may be a login that expired: ask once.
        const s = await api('/v1/session');
        if (s.tokenRequired && !s.authenticated) {
          auth.dispatchEvent(new Event('unauthorized'));
          return;
        }
      } catch {
        // Still unreachable: try again later.
        this.backoff = Math.min(this.backoff * 2, MAX_BACKOFF_MS);
        this.retry();
        return;
      }
      this.backoff = Math.min(this.backoff * 2, MAX_BACKOFF_MS);
      this.open('reconnecting');
    }, this.backoff);
  }

  close() {
    if (this.source) {
      this.source.onopen = null;
      this.source.onmessage = null;
      this.source.close();
      this.source = null;
    }
  }

  /** Ends the feed for good. */
  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    this.close();
    this.onState('closed');
  }
}
