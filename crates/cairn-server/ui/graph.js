// The run's plan as a graph: layers as columns (a node sits one column
// right of the last sibling it needs), groups as boxes around their members
// (large ones collapsed until opened), every node coloured by its live
// state. Only the boxes in view are in the DOM, so 10,000 nodes cost what
// a screenful does.

import { h, svg, statusText, fmtDuration } from './dom.js';
import { templatePath } from './fold.js';

const NODE_W = 200;
const NODE_H = 48;
const GAP_X = 48;
const GAP_Y = 12;
const PAD = 12;
const HEAD = 48;
/** Groups with more members than this start collapsed. */
const COLLAPSE_OVER = 40;
/** The side of a cell of the index that finds the boxes in view. */
const CELL = 512;
/** Drawn beyond the visible area, in pixels. */
const MARGIN = 300;
/** Most edges drawn at once. */
const MAX_EDGES = 3000;

/** Which status a set of instances shows first: what needs someone, then what moves. */
const PRIORITY = ['waiting-approval', 'waiting-input', 'running', 'retrying', 'failed', 'pending',
  'cancelled', 'skipped', 'finished'];

/** The labels of the cases of switch `from` that enable `to`, or '' (not a switch's edge). */
function caseLabels(from, to) {
  if (!from || !from.cases) return '';
  return from.cases.filter((c) => c.nodes.includes(to)).map((c) => c.label).join(', ');
}

/** A plan from the nodes a run's state knows, for runs whose workflow cannot be read. */
function fallbackPlan(model) {
  const seen = new Map();
  const layerOf = new Map();
  for (const n of model.nodes.values()) {
    const p = templatePath(n.nodeId);
    const parts = p.split('.');
    for (let i = 1; i <= parts.length; i++) {
      const path = parts.slice(0, i).join('.');
      if (!seen.has(path)) {
        seen.set(path, {
          path, id: parts[i - 1], kind: i < parts.length ? 'group' : 'node', needs: [],
          parent: i > 1 ? parts.slice(0, i - 1).join('.') : undefined, depth: i - 1,
        });
      }
      if (i < parts.length) seen.get(path).kind = 'group';
    }
    if (n.layerIndex !== undefined) {
      const l = layerOf.get(p);
      if (l === undefined || n.layerIndex < l) layerOf.set(p, n.layerIndex);
    }
  }
  const nodes = [...seen.values()];
  for (const n of nodes) {
    n.layer = layerOf.get(n.path);
    if (n.kind === 'group') n.children = nodes.filter((c) => c.parent === n.path).map((c) => c.path);
  }
  return nodes;
}

export class Graph {
  /** `plan`: the nodes of `GET /v1/runs/{id}/plan`; `onSelect(path)` on a click. */
  constructor({ plan, model, onSelect }) {
    this.model = model;
    this.onSelect = onSelect;
    this.selected = null;
    this.items = new Map();
    this.roots = [];
    // Without a plan, the nodes the run has mounted so far stand in for it.
    this.fallback = plan.length === 0;
    const nodes = plan.length ? plan : fallbackPlan(model);
    for (const n of nodes) {
      this.items.set(n.path, { ...n, children: n.children || [] });
      if (!n.parent) this.roots.push(n.path);
    }
    this.instances = new Map();
    for (const n of model.nodes.values()) this.track(n);
    this.stats = new Map();
    this.collapsed = new Set();
    for (const it of this.items.values()) {
      if (it.children.length && this.descendants(it.path) > COLLAPSE_OVER) this.collapsed.add(it.path);
    }
    this.rendered = new Map();
    this.frame = 0;
    this.findAt = -1;

    this.edges = svg('svg', { class: 'edges', 'aria-hidden': 'true' });
    this.edgePath = svg('path', { class: 'edge' });
    this.edgeHot = svg('path', { class: 'edge hot' });
    // A handler's edges are dashed: it runs however its needs ended.
    this.edgeHandler = svg('path', { class: 'edge handler' });
    // A switch's edges carry the labels of the cases that take them.
    this.edgeLabels = svg('g', { class: 'edge-labels' });
    this.edges.append(this.edgePath, this.edgeHandler, this.edgeHot, this.edgeLabels);
    this.layer = h('div', { class: 'boxes' });
    this.canvas = h('div', { class: 'canvas' }, this.edges, this.layer);
    this.view = h('div', { class: 'graph-view', tabindex: '0', role: 'region', 'aria-label': 'Workflow graph' }, this.canvas);
    this.view.addEventListener('scroll', () => this.schedule(), { passive: true });
    this.resizeObserver = new ResizeObserver(() => this.schedule());
    this.resizeObserver.observe(this.view);

    const find = h('input', { type: 'search', id: 'graph-find', placeholder: 'node path', autocomplete: 'off' });
    const form = h('form', { class: 'graph-find', role: 'search', onsubmit: (e) => { e.preventDefault(); this.find(find.value); } },
      h('label', { htmlFor: 'graph-find' }, 'Find a node'), find, h('button', { type: 'submit' }, 'Find'));
    this.count = h('span', { class: 'muted' });
    this.el = h('div', { class: 'graph' },
      h('div', { class: 'graph-bar' }, form, this.count, legend()),
      this.view);
    this.layout();
  }

  /** Members of a group, at any depth. */
  descendants(path) {
    let n = 0;
    const stack = [...this.items.get(path).children];
    while (stack.length) {
      const p = stack.pop();
      n += 1;
      const it = this.items.get(p);
      if (it) stack.push(...it.children);
    }
    return n;
  }

  /** Records a node pass under its template path (the latest pass of each instance). */
  track(n) {
    const tp = templatePath(n.nodeId);
    let m = this.instances.get(tp);
    if (!m) {
      m = new Map();
      this.instances.set(tp, m);
    }
    const old = m.get(n.nodeId);
    if (!old || old.iteration <= n.iteration) m.set(n.nodeId, n);
    return tp;
  }

  /** The state a box shows: one instance's, or a summary of many. */
  stateOf(path) {
    const m = this.instances.get(path);
    if (!m || m.size === 0) return { status: 'none', total: 0, done: 0 };
    if (m.size === 1) {
      const n = m.values().next().value;
      return { status: n.status, total: 1, done: n.status === 'finished' ? 1 : 0, node: n };
    }
    let best = PRIORITY.length;
    let done = 0;
    for (const n of m.values()) {
      const p = PRIORITY.indexOf(n.status);
      if (p >= 0 && p < best) best = p;
      if (n.status === 'finished' || n.status === 'skipped') done += 1;
    }
    return { status: PRIORITY[best] || 'pending', total: m.size, done };
  }

  /** Counts over a group's members (cached until one of them changes). */
  groupStats(path) {
    let s = this.stats.get(path);
    if (s) return s;
    s = { total: 0, done: 0, active: 0, failed: 0 };
    const stack = [...this.items.get(path).children];
    while (stack.length) {
      const p = stack.pop();
      const it = this.items.get(p);
      if (!it) continue;
      if (it.children.length) {
        stack.push(...it.children);
        continue;
      }
      const st = this.stateOf(p);
      s.total += Math.max(1, st.total);
      s.done += st.done;
      if (st.status === 'failed') s.failed += 1;
      if (['running', 'retrying', 'waiting-approval', 'waiting-input'].includes(st.status)) s.active += 1;
    }
    this.stats.set(path, s);
    return s;
  }

  /** Places every box: columns by `needs` within each group, groups sized by their content. */
  layout() {
    this.boxes = [];
    this.boxOf = new Map();
    const size = this.place(this.roots, 0, 0);
    this.width = size.w + PAD * 2;
    this.height = size.h + PAD * 2;
    this.canvas.style.width = `${this.width}px`;
    this.canvas.style.height = `${this.height}px`;
    this.edges.setAttribute('width', this.width);
    this.edges.setAttribute('height', this.height);
    this.cells = new Map();
    this.boxes.forEach((b, i) => {
      for (let cx = Math.floor(b.x / CELL); cx <= Math.floor((b.x + b.w) / CELL); cx++) {
        for (let cy = Math.floor(b.y / CELL); cy <= Math.floor((b.y + b.h) / CELL); cy++) {
          // Big groups' outlines span many cells: only their header is indexed.
          if (b.open && cy > Math.floor((b.y + HEAD) / CELL)) break;
          const k = `${cx},${cy}`;
          let list = this.cells.get(k);
          if (!list) this.cells.set(k, (list = []));
          list.push(i);
        }
      }
    });
    this.count.textContent = `${this.items.size} nodes in the plan`;
    for (const el of this.rendered.values()) el.remove();
    this.rendered.clear();
    this.schedule();
  }

  /** Lays out sibling boxes at (x0, y0); returns the area they take. */
  place(paths, x0, y0) {
    const cols = this.columns(paths);
    const byCol = [];
    paths.forEach((p, i) => (byCol[cols[i]] = byCol[cols[i]] || []).push(p));
    let x = x0 + PAD;
    let maxH = 0;
    for (const col of byCol) {
      if (!col) continue;
      let y = y0 + PAD;
      let colW = NODE_W;
      for (const p of col) {
        const it = this.items.get(p);
        const open = it.children.length > 0 && !this.collapsed.has(p);
        const box = { path: p, x, y, w: NODE_W, h: NODE_H, group: it.children.length > 0, open, depth: it.depth || 0 };
        this.boxOf.set(p, this.boxes.length);
        this.boxes.push(box);
        if (open) {
          const inner = this.place(it.children, x, y + HEAD - PAD);
          box.w = Math.max(NODE_W, inner.w + PAD);
          box.h = HEAD + inner.h;
        }
        colW = Math.max(colW, box.w);
        y += box.h + GAP_Y;
      }
      maxH = Math.max(maxH, y - y0);
      x += colW + GAP_X;
    }
    return { w: x - x0 - GAP_X + PAD, h: maxH };
  }

  /** Each sibling's column: one right of the last sibling it needs. */
  columns(paths) {
    const index = new Map(paths.map((p, i) => [p, i]));
    const col = new Array(paths.length).fill(0);
    const hinted = paths.some((p) => this.items.get(p).layer !== undefined);
    if (hinted) {
      paths.forEach((p, i) => (col[i] = this.items.get(p).layer || 0));
      return compact(col);
    }
    // Kahn's order, so a chain of 10,000 nodes needs no deep recursion.
    const indeg = new Array(paths.length).fill(0);
    const out = paths.map(() => []);
    paths.forEach((p, i) => {
      for (const d of this.items.get(p).needs || []) {
        const j = index.get(d);
        if (j !== undefined) {
          indeg[i] += 1;
          out[j].push(i);
        }
      }
    });
    const queue = [];
    indeg.forEach((d, i) => d === 0 && queue.push(i));
    for (let q = 0; q < queue.length; q++) {
      const i = queue[q];
      for (const j of out[i]) {
        col[j] = Math.max(col[j], col[i] + 1);
        if (--indeg[j] === 0) queue.push(j);
      }
    }
    return col;
  }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.render();
    });
  }

  /** The boxes in (or near) view. */
  inView() {
    const v = this.view;
    const x0 = v.scrollLeft - MARGIN;
    const y0 = v.scrollTop - MARGIN;
    const x1 = v.scrollLeft + (v.clientWidth || 1200) + MARGIN;
    const y1 = v.scrollTop + (v.clientHeight || 800) + MARGIN;
    const found = new Set();
    for (let cx = Math.floor(Math.max(0, x0) / CELL); cx <= Math.floor(x1 / CELL); cx++) {
      for (let cy = Math.floor(Math.max(0, y0) / CELL); cy <= Math.floor(y1 / CELL); cy++) {
        for (const i of this.cells.get(`${cx},${cy}`) || []) found.add(i);
      }
    }
    // Open groups whose header is out of view but whose body is in it.
    for (const i of found) {
      let p = this.items.get(this.boxes[i].path).parent;
      while (p !== undefined && this.boxOf.has(p)) {
        found.add(this.boxOf.get(p));
        p = this.items.get(p).parent;
      }
    }
    return [...found].sort((a, b) => a - b);
  }

  render() {
    const visible = this.inView();
    const keep = new Set(visible.map((i) => this.boxes[i].path));
    for (const [p, el] of this.rendered) {
      if (!keep.has(p) && !el.contains(document.activeElement)) {
        el.remove();
        this.rendered.delete(p);
      }
    }
    const frag = document.createDocumentFragment();
    for (const i of visible) {
      const b = this.boxes[i];
      if (this.rendered.has(b.path)) continue;
      const el = this.box(b);
      this.rendered.set(b.path, el);
      frag.append(el);
    }
    this.layer.append(frag);
    this.drawEdges(visible);
    this.el.dataset.rendered = String(this.rendered.size);
  }

  drawEdges(visible) {
    let d = '';
    let hot = '';
    let dashed = '';
    const labels = [];
    let n = 0;
    const sel = this.selected;
    for (const i of visible) {
      const b = this.boxes[i];
      const it = this.items.get(b.path);
      const prefix = it.parent === undefined ? '' : `${it.parent}.`;
      for (const need of it.needs || []) {
        const from = need.startsWith(prefix) ? need : prefix + need;
        const j = this.boxOf.get(from);
        if (j === undefined || n++ > MAX_EDGES) continue;
        const a = this.boxes[j];
        const x1 = a.x + a.w;
        const y1 = a.y + (a.open ? HEAD / 2 : a.h / 2);
        const x2 = b.x;
        const y2 = b.y + (b.open ? HEAD / 2 : b.h / 2);
        const mx = (x1 + x2) / 2;
        const seg = `M${x1},${y1}C${mx},${y1} ${mx},${y2} ${x2},${y2}`;
        if (sel && (sel === b.path || sel === a.path)) hot += seg;
        else if (it.handler) dashed += seg;
        else d += seg;
        const cases = caseLabels(this.items.get(from), b.path);
        if (cases) {
          const text = svg('text', { class: 'edge-label', x: mx, y: (y1 + y2) / 2 - 4, 'text-anchor': 'middle' });
          text.textContent = cases;
          labels.push(text);
        }
      }
    }
    this.edgePath.setAttribute('d', d);
    this.edgeHandler.setAttribute('d', dashed);
    this.edgeHot.setAttribute('d', hot);
    this.edgeLabels.replaceChildren(...labels);
  }

  /** One box's element. */
  box(b) {
    const it = this.items.get(b.path);
    let el;
    if (b.group) {
      const st = this.stateOf(b.path);
      const gs = this.groupStats(b.path);
      const toggle = h('button', {
        type: 'button', class: 'toggle', 'aria-expanded': String(b.open),
        'aria-label': `${b.open ? 'Collapse' : 'Expand'} ${it.path}`,
        onclick: () => this.toggle(b.path),
      }, b.open ? '−' : '+');
      const name = h('button', { type: 'button', class: 'gname', onclick: () => this.select(b.path) },
        h('span', { class: 'dot', 'aria-hidden': 'true' }),
        h('span', { class: 'name' }, it.id),
        h('span', { class: 'meta' }, `${it.kind.replace('_', ' ')} · ${gs.done}/${gs.total} done`));
      name.setAttribute('aria-label', `${it.path}, ${it.kind}, ${statusText(st.status === 'none' ? null : st.status)}, ${gs.done} of ${gs.total} members done`);
      el = h('div', { class: `gbox ${b.open ? 'open' : 'shut'} s-${st.status}`, 'data-path': b.path, 'data-status': st.status },
        h('div', { class: 'ghead' }, toggle, name));
    } else {
      el = h('button', { type: 'button', class: 'gnode', 'data-path': b.path, onclick: () => this.select(b.path) });
      this.fill(el, b.path);
    }
    if (this.selected === b.path) el.classList.add('selected');
    // Members above their group's outline.
    el.style.zIndex = String(b.depth * 2 + (b.group ? 0 : 1));
    el.style.transform = `translate(${b.x}px, ${b.y}px)`;
    el.style.width = `${b.w}px`;
    el.style.height = `${b.h}px`;
    return el;
  }

  /** A node box's content and state. */
  fill(el, path) {
    const it = this.items.get(path);
    const st = this.stateOf(path);
    const status = st.status === 'none' ? 'not started' : statusText(st.status);
    let meta = `${it.kind.replace('_', ' ')} · ${status}`;
    if (st.total > 1) meta = `${it.kind} · ${st.done}/${st.total} done`;
    else if (it.cases && st.node && typeof st.node.output === 'string') meta = `switch · chose ${st.node.output}`;
    else if (st.node && st.node.durationMs !== undefined) meta += ` · ${fmtDuration(st.node.durationMs)}`;
    if (it.handler && st.total <= 1) meta = `if ${it.handler} · ${meta}`;
    el.className = `gnode s-${st.status}${this.selected === path ? ' selected' : ''}`;
    el.replaceChildren(
      h('span', { class: 'dot', 'aria-hidden': 'true' }),
      h('span', { class: 'name' }, it.id),
      h('span', { class: 'meta' }, meta));
    el.setAttribute('aria-label', `${it.path}, ${it.kind}, ${st.total > 1 ? `${st.done} of ${st.total} done` : status}`);
    el.dataset.status = st.status;
  }

  /** Folds what changed in a batch into the boxes in view. */
  update(changes) {
    const dirty = new Set();
    for (const key of changes.nodes) {
      const n = this.model.nodes.get(key);
      if (!n) continue;
      const tp = this.track(n);
      dirty.add(tp);
      let p = this.items.get(tp) && this.items.get(tp).parent;
      while (p !== undefined) {
        this.stats.delete(p);
        dirty.add(p);
        const it = this.items.get(p);
        p = it && it.parent;
      }
    }
    if (this.fallback && [...dirty].some((p) => !this.items.has(p))) {
      // A run whose plan is unknown: redrawn from its nodes as new ones appear.
      this.items.clear();
      for (const n of fallbackPlan(this.model)) this.items.set(n.path, { ...n, children: n.children || [] });
      this.roots = [...this.items.values()].filter((n) => !n.parent).map((n) => n.path);
      this.stats.clear();
      this.layout();
      return;
    }
    for (const p of dirty) {
      const el = this.rendered.get(p);
      if (!el) continue;
      const b = this.boxes[this.boxOf.get(p)];
      if (b && b.group) {
        const fresh = this.box(b);
        el.replaceWith(fresh);
        this.rendered.set(p, fresh);
      } else {
        this.fill(el, p);
      }
    }
  }

  toggle(path) {
    if (this.collapsed.has(path)) this.collapsed.delete(path);
    else this.collapsed.add(path);
    this.layout();
    requestAnimationFrame(() => {
      const el = this.rendered.get(path);
      const t = el && el.querySelector('.toggle');
      if (t) t.focus();
    });
  }

  select(path) {
    const old = this.rendered.get(this.selected);
    if (old) old.classList.remove('selected');
    this.selected = path;
    const el = this.rendered.get(path);
    if (el) el.classList.add('selected');
    this.drawEdges(this.inView());
    this.onSelect(path);
  }

  /** Scrolls to the next node whose path contains `text`, opening its groups, and focuses it. */
  find(text) {
    const q = text.trim().toLowerCase();
    if (!q) return;
    const paths = [...this.items.keys()];
    const start = this.findAt + 1;
    let hit = -1;
    for (let k = 0; k < paths.length; k++) {
      const i = (start + k) % paths.length;
      if (paths[i].toLowerCase().includes(q)) {
        hit = i;
        break;
      }
    }
    this.count.textContent = hit < 0 ? `No node matches “${text}”` : `${this.items.size} nodes in the plan`;
    if (hit < 0) return;
    this.findAt = hit;
    this.reveal(paths[hit], true);
  }

  /** Opens the groups around `path` and scrolls its box into view. */
  reveal(path, focus) {
    let p = this.items.get(path) && this.items.get(path).parent;
    let changed = false;
    while (p !== undefined) {
      if (this.collapsed.delete(p)) changed = true;
      p = this.items.get(p).parent;
    }
    if (changed) this.layout();
    const b = this.boxes[this.boxOf.get(path)];
    if (!b) return;
    this.view.scrollLeft = Math.max(0, b.x - this.view.clientWidth / 2 + b.w / 2);
    this.view.scrollTop = Math.max(0, b.y - this.view.clientHeight / 2 + b.h / 2);
    this.render();
    this.select(path);
    if (focus) {
      const el = this.rendered.get(path);
      const target = el && (el.matches('button') ? el : el.querySelector('.gname'));
      if (target) target.focus({ preventScroll: true });
    }
  }

  destroy() {
    cancelAnimationFrame(this.frame);
    this.resizeObserver.disconnect();
  }
}

/** Column numbers made dense (0, 1, 2, … with no empty column). */
function compact(cols) {
  const order = [...new Set(cols)].sort((a, b) => a - b);
  const to = new Map(order.map((c, i) => [c, i]));
  return cols.map((c) => to.get(c));
}

function legend() {
  const items = [['none', 'not started'], ['pending', 'pending'], ['running', 'running'],
    ['waiting-approval', 'waiting'], ['finished', 'finished'], ['failed', 'failed'], ['skipped', 'skipped']];
  return h('ul', { class: 'legend', 'aria-label': 'Colours of node states' },
    items.map(([s, label]) => h('li', { class: `s-${s}` }, h('span', { class: 'dot', 'aria-hidden': 'true' }), label)));
}
