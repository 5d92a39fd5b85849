// Two runs compared (`#/compare/{original}/{replay}`): where a replay
// parts from the run it replays, with the diff of the first request the
// original never made, and every node's outcome side by side. The server
// makes the comparison from the two logs (GET /v1/runs/{id}/compare/{other}).

import { api, ApiError } from './api.js';
import { h, badge, brief } from './dom.js';

export class CompareView {
  constructor({ original, replay, setConnection }) {
    this.original = original;
    this.replay = replay;
    setConnection('closed');
    this.body = h('div', { 'aria-live': 'polite' }, h('p', { class: 'muted' }, 'Comparing…'));
    const link = (id) => h('a', { href: `#/runs/${encodeURIComponent(id)}` }, id);
    this.el = h('section', { class: 'compare', 'aria-labelledby': 'compare-title' },
      h('h1', { id: 'compare-title' }, 'Two runs compared'),
      h('p', null, 'Run ', link(replay), ' against the run it replays, ', link(original), '.'),
      this.body);
    this.abort = new AbortController();
    this.load();
  }

  async load() {
    const path = `/v1/runs/${encodeURIComponent(this.original)}/compare/${encodeURIComponent(this.replay)}`;
    try {
      const r = await api(path, { signal: this.abort.signal });
      this.body.replaceChildren(...this.render(r));
    } catch (e) {
      if (e.name === 'AbortError') return;
      const text = e instanceof ApiError ? e.message : String(e);
      this.body.replaceChildren(h('p', { class: 'error', role: 'alert' }, text));
    }
  }

  render(r) {
    const out = [];
    out.push(h('p', { class: 'compare-summary' },
      `${r.stepsReplayed} model step${r.stepsReplayed === 1 ? '' : 's'} answered from the record, ${r.stepsNew} new. `,
      r.sameOutput ? 'The output is the same.' : 'The output differs.'));
    out.push(h('h2', null, 'Where they part'));
    if (!r.divergence) {
      out.push(h('p', { class: 'compare-same' }, 'Nowhere: the replay asked nothing the original did not.'));
    } else {
      out.push(...divergence(r.divergence, r.stopped));
    }
    out.push(h('h2', null, 'Node by node'));
    out.push(h('div', { class: 'table-wrap' },
      h('table', { class: 'compare-table' },
        h('caption', { class: 'sr-only' }, 'Each node of either run, its outcome in the original and in the replay'),
        h('thead', null, h('tr', null,
          ['Node', 'Original', 'Replay', ''].map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', null, r.nodes.map((n) => h('tr', { class: n.same ? 'same' : 'differs' },
          h('th', { scope: 'row' }, n.iteration ? `${n.nodeId} [${n.iteration}]` : n.nodeId),
          h('td', null, outcome(n.status.original, n.output.original, n.error.original)),
          h('td', null, outcome(n.status.replay, n.output.replay, n.error.replay)),
          h('td', null, n.same ? 'same' : h('strong', null, 'differs'))))))));
    out.push(h('h2', null, 'Output'));
    out.push(h('div', { class: 'compare-outputs' },
      h('div', null, h('h3', null, 'Original'), h('pre', null, json(r.output.original))),
      h('div', null, h('h3', null, 'Replay'), h('pre', null, json(r.output.replay)))));
    return out;
  }

  destroy() {
    this.abort.abort();
  }
}

function divergence(d, stopped) {
  const at = `${d.nodeId}${d.iteration ? ` [${d.iteration}]` : ''}${d.step ? `, step ${d.step}` : ''}`;
  const out = [h('p', { class: 'compare-divergence' },
    h('strong', null, `At ${at} (${d.kind}): `), d.message.replace(/\.?$/, '.'),
    stopped ? ' The replay stopped there.' : '')];
  const req = d.request;
  if (!req) return out;
  if (!req.originalFound) out.push(h('p', { class: 'muted' }, 'The original made no request at that place: it had answered already.'));
  if (req.system) out.push(h('h3', null, 'System prompt'), diffBlock(lineDiff(req.system.original || '', req.system.replay || '')));
  for (const m of req.messages) {
    const role = m.role.replay || m.role.original || 'message';
    out.push(h('h3', null, `Message ${m.index} (${role})`), diffBlock(m.diff));
  }
  const tools = [['added', req.toolsAdded], ['removed', req.toolsRemoved], ['changed', req.toolsChanged]]
    .filter(([, names]) => names.length)
    .map(([what, names]) => h('li', null, `Tools ${what}: ${names.join(', ')}`));
  if (tools.length) out.push(h('ul', null, tools));
  return out;
}

/** A diff's lines, each marked as the original's, the replay's or both. */
function diffBlock(text) {
  const lines = text.split('\n').filter((l, i, all) => l !== '' || i < all.length - 1);
  return h('pre', { class: 'diff' }, lines.map((l) => {
    const cls = l.startsWith('+') ? 'diff-add' : l.startsWith('-') ? 'diff-del' : 'diff-same';
    const label = l.startsWith('+') ? 'replay: ' : l.startsWith('-') ? 'original: ' : '';
    return h('span', { class: cls }, h('span', { class: 'sr-only' }, label), l, '\n');
  }));
}

/** A crude whole-text diff, for the system prompts (the server diffs messages). */
function lineDiff(a, b) {
  return [...a.split('\n').map((l) => `-${l}`), ...b.split('\n').map((l) => `+${l}`)].join('\n');
}

function outcome(status, output, error) {
  const detail = error ? `${error.kind}: ${error.message}` : output === null || output === undefined ? '' : brief(output, 120);
  return [badge(status === 'absent' ? undefined : status), status === 'absent' ? 'not in this run' : '', detail ? h('div', { class: 'muted' }, detail) : null];
}

function json(v) {
  return v === null || v === undefined ? '(none)' : JSON.stringify(v, null, 2);
}
