// Small helpers shared by the views: building elements, and showing
// times, durations, tokens and money the same way everywhere.

const PROPS = new Set(['value', 'checked', 'disabled', 'hidden', 'selected', 'id', 'type', 'name',
  'title', 'placeholder', 'htmlFor', 'tabIndex', 'required', 'min', 'max', 'step', 'href']);

/**
 * An element: `h('button', {class: 'x', onclick: f, 'aria-label': 'y'}, 'text', child)`.
 * Keys starting with `on` add listeners; known properties are set as such,
 * anything else as an attribute. Children may be strings, nodes, arrays,
 * or null (skipped). Never sets inline styles (the page's policy forbids them).
 */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  if (props) {
    for (const [k, v] of Object.entries(props)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
      else if (PROPS.has(k)) el[k] = v;
      else el.setAttribute(k, v === true ? '' : String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : String(c));
  }
}

/** An SVG element with attributes. */
export function svg(tag, attrs = {}) {
  const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

/** Removes every child. */
export function clear(el) {
  el.replaceChildren();
  return el;
}

/** `1.2 s`, `3 min 4 s`, `2 h 5 min`; an empty string for no value. */
export function fmtDuration(ms) {
  if (ms === undefined || ms === null || !Number.isFinite(ms)) return '';
  if (ms < 0) ms = 0;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.floor(s % 60)} s`;
  const hr = Math.floor(m / 60);
  return `${hr} h ${m % 60} min`;
}

/** A time of day, with the date when it is not today. */
export function fmtTime(ms) {
  if (!ms) return '';
  const d = new Date(ms);
  const now = new Date();
  const time = d.toLocaleTimeString(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit', hourCycle: 'h23' });
  if (d.toDateString() === now.toDateString()) return time;
  return `${d.toLocaleDateString(undefined, { month: 'short', day: 'numeric' })} ${time}`;
}

/** `950`, `12.3k`, `4.1M`. */
export function fmtCount(n) {
  if (!n) return '0';
  if (n < 1000) return String(n);
  if (n < 1e6) return `${(n / 1e3).toFixed(n < 1e4 ? 1 : 0)}k`;
  return `${(n / 1e6).toFixed(1)}M`;
}

/** Tokens of a `TokenTotals`: input + output, as a count. */
export function tokenSum(t) {
  if (!t) return 0;
  return (t.input || 0) + (t.output || 0);
}

/** `$0.0123`; an empty string when unpriced. */
export function fmtCost(usd) {
  if (usd === undefined || usd === null) return '';
  if (usd === 0) return '$0';
  if (usd < 0.01) return `$${usd.toFixed(4)}`;
  return `$${usd.toFixed(2)}`;
}

/** `42%` of a 0..1 progress. */
export function fmtPercent(p) {
  return `${Math.floor((p || 0) * 100)}%`;
}

/** The words of a status for people (`waiting-approval` → `waiting for approval`). */
export function statusText(status) {
  switch (status) {
    case 'waiting-approval': return 'waiting for approval';
    case 'waiting-input': return 'waiting for input';
    case undefined: case null: case '': return 'pending';
    default: return status;
  }
}

/** A status badge. */
export function badge(status) {
  return h('span', { class: `badge s-${status || 'pending'}` }, statusText(status));
}

/** True for the statuses after which a run emits nothing until resumed. */
export function isTerminal(status) {
  return status === 'finished' || status === 'failed' || status === 'cancelled';
}

/** Short JSON for a line: at most `max` characters. */
export function brief(value, max = 160) {
  let s;
  try {
    s = typeof value === 'string' ? value : JSON.stringify(value);
  } catch {
    s = String(value);
  }
  if (s === undefined) return '';
  return s.length > max ? `${s.slice(0, max - 1)}…` : s;
}

/** Pretty JSON for a block. */
export function pretty(value) {
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

/** Calls `f` at most once per `ms`, the last call winning. */
export function throttle(f, ms) {
  let timer = null;
  let last = 0;
  return (...args) => {
    const wait = Math.max(0, last + ms - Date.now());
    clearTimeout(timer);
    timer = setTimeout(() => {
      last = Date.now();
      f(...args);
    }, wait);
  };
}
