// A scrolling list that keeps in the DOM only the rows in view (plus a
// margin), every row the same height: 100,000 rows cost a few dozen elements.

import { h } from './dom.js';

/** Rows drawn beyond the visible ones, above and below. */
const OVERSCAN = 10;

export class VirtualList {
  /**
   * `renderRow(i)` makes row `i`'s element; `label` names the list for
   * assistive technology.
   */
  constructor({ rowHeight, renderRow, label, className = '' }) {
    this.rowHeight = rowHeight;
    this.renderRow = renderRow;
    this.count = 0;
    this.rows = new Map();
    this.sizer = h('div', { class: 'vlist-sizer', role: 'list', 'aria-label': label });
    this.el = h('div', { class: `vlist ${className}`, tabindex: '0', role: 'region', 'aria-label': label }, this.sizer);
    this.frame = 0;
    this.el.addEventListener('scroll', () => this.schedule(), { passive: true });
    this.resizeObserver = new ResizeObserver(() => this.schedule());
    this.resizeObserver.observe(this.el);
  }

  /** True when the view is at (or near) the end, so new rows should follow. */
  atEnd() {
    const el = this.el;
    return el.scrollHeight - el.scrollTop - el.clientHeight < this.rowHeight * 2;
  }

  /** Sets the number of rows; with `follow`, keeps the end in view. */
  setCount(n, follow = false) {
    const stick = follow && this.atEnd();
    this.count = n;
    this.sizer.style.height = `${n * this.rowHeight}px`;
    for (const i of [...this.rows.keys()]) {
      if (i >= n) {
        this.rows.get(i).remove();
        this.rows.delete(i);
      }
    }
    if (stick) this.el.scrollTop = this.el.scrollHeight;
    this.schedule();
  }

  /** Draws again the rows in view (their data changed), at once. */
  refresh() {
    const focused = [...this.rows].find(([, el]) => el.contains(document.activeElement));
    for (const el of this.rows.values()) el.remove();
    this.rows.clear();
    this.render();
    // The row that had focus keeps it in its new element.
    if (focused) {
      const el = this.rows.get(focused[0]);
      const target = el && (el.matches('button, a') ? el : el.querySelector('button, a'));
      if (target) target.focus({ preventScroll: true });
    }
  }

  /** Draws again one row, if it is in view. */
  refreshRow(i) {
    const old = this.rows.get(i);
    if (!old) return;
    const el = this.place(this.renderRow(i), i);
    old.replaceWith(el);
    this.rows.set(i, el);
  }

  /** Scrolls row `i` into view. */
  scrollTo(i) {
    const top = i * this.rowHeight;
    const el = this.el;
    if (top < el.scrollTop || top + this.rowHeight > el.scrollTop + el.clientHeight) {
      el.scrollTop = Math.max(0, top - el.clientHeight / 2);
    }
    this.render();
  }

  /** Scrolls to the last row. */
  scrollToEnd() {
    this.el.scrollTop = this.el.scrollHeight;
    this.render();
  }

  /** The first and one past the last row in view. */
  visible() {
    const el = this.el;
    const first = Math.max(0, Math.floor(el.scrollTop / this.rowHeight) - OVERSCAN);
    const height = el.clientHeight || 600;
    const last = Math.min(this.count, Math.ceil((el.scrollTop + height) / this.rowHeight) + OVERSCAN);
    return [first, last];
  }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.render();
    });
  }

  place(el, i) {
    el.style.transform = `translateY(${i * this.rowHeight}px)`;
    el.style.height = `${this.rowHeight}px`;
    el.classList.add('vrow');
    return el;
  }

  render() {
    const [first, last] = this.visible();
    for (const [i, el] of this.rows) {
      if (i < first || i >= last) {
        // A focused row scrolled away gives its focus back to the list.
        if (el.contains(document.activeElement)) this.el.focus({ preventScroll: true });
        el.remove();
        this.rows.delete(i);
      }
    }
    const frag = document.createDocumentFragment();
    for (let i = first; i < last; i++) {
      if (this.rows.has(i)) continue;
      const el = this.place(this.renderRow(i), i);
      this.rows.set(i, el);
      frag.append(el);
    }
    this.sizer.append(frag);
  }

  /** Stops watching the list's size. */
  destroy() {
    cancelAnimationFrame(this.frame);
    this.resizeObserver.disconnect();
  }
}
