// What waits for a person: each approval gate (Approve or Deny, with an
// optional note) and each open question (a form made from its schema,
// checked before it is sent). Forms stay as they are while the run moves,
// so typing is never lost; a decided item leaves once the run says so.

import { api, runPath } from './api.js';
import { h } from './dom.js';
import { schemaFields, validate } from './schema.js';

export class Decisions {
  constructor({ runId, model }) {
    this.runId = runId;
    this.model = model;
    this.items = new Map();
    this.list = h('div', { class: 'decision-list' });
    this.el = h('section', { class: 'decisions', 'aria-labelledby': 'decisions-title', hidden: true },
      h('h2', { id: 'decisions-title' }, 'Waiting for you'), this.list);
    this.update();
  }

  /** Adds what started waiting and removes what no longer does. */
  update() {
    const want = new Map();
    for (const n of this.model.openApprovals()) want.set(`gate:${n.nodeId}#${n.iteration || 0}`, () => this.gate(n));
    for (const [rid, q] of this.model.openQuestions()) want.set(`q:${rid}`, () => this.question(rid, q));
    for (const [k, el] of this.items) {
      if (!want.has(k)) {
        el.remove();
        this.items.delete(k);
      }
    }
    for (const [k, make] of want) {
      if (!this.items.has(k)) {
        const el = make();
        this.items.set(k, el);
        this.list.append(el);
      }
    }
    this.el.hidden = this.items.size === 0;
  }

  gate(n) {
    const id = `gate-${slug(n.nodeId)}-${n.iteration || 0}`;
    const note = h('textarea', { id: `${id}-note`, rows: '2' });
    const status = h('p', { class: 'form-status', role: 'status' });
    const send = async (approved, buttons) => {
      buttons.forEach((b) => (b.disabled = true));
      status.textContent = approved ? 'Approving…' : 'Denying…';
      try {
        const body = { approved };
        if (note.value.trim()) body.note = note.value.trim();
        await api(runPath(this.runId, `/approvals/${encodeURIComponent(n.nodeId)}`), { method: 'POST', body });
        status.textContent = approved ? 'Approved.' : 'Denied.';
      } catch (e) {
        status.textContent = e.message;
        status.classList.add('error');
        buttons.forEach((b) => (b.disabled = false));
      }
    };
    const approve = h('button', { type: 'button', class: 'primary', 'data-action': 'approve' }, 'Approve');
    const deny = h('button', { type: 'button', class: 'danger', 'data-action': 'deny' }, 'Deny');
    approve.addEventListener('click', () => send(true, [approve, deny]));
    deny.addEventListener('click', () => send(false, [approve, deny]));
    return h('article', { class: 'decision gate', 'aria-labelledby': `${id}-title`, 'data-node': n.nodeId },
      h('h3', { id: `${id}-title` }, `Approve ${n.nodeId}?`),
      n.approvalMessage ? h('p', { class: 'message' }, n.approvalMessage) : null,
      h('div', { class: 'field' }, h('label', { htmlFor: `${id}-note` }, 'Note (optional)'), note),
      h('div', { class: 'buttons' }, approve, deny),
      status);
  }

  question(requestId, q) {
    const id = `q-${slug(requestId)}`;
    const fields = schemaFields(q.schema, q.schema && q.schema.type === 'object' ? 'Answer' : q.prompt);
    const status = h('p', { class: 'form-status', role: 'status' });
    const summary = h('div', { class: 'error-summary', role: 'alert', tabindex: '-1', hidden: true });
    const submit = h('button', { type: 'submit', class: 'primary' }, 'Send answer');
    const form = h('form', { class: 'decision question', novalidate: true, 'aria-labelledby': `${id}-title`, 'data-request': requestId },
      h('h3', { id: `${id}-title` }, q.prompt),
      h('p', { class: 'muted' }, `Asked by ${q.nodeId}`),
      fields.el, summary, h('div', { class: 'buttons' }, submit), status);
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      const read = fields.read();
      let errors;
      if (read.error) errors = [read.error];
      else if (read.value === undefined || read.value === '') errors = [{ path: '', message: 'needs an answer' }];
      else errors = validate(q.schema, read.value);
      const rest = fields.show(errors);
      if (errors.length) {
        summary.hidden = false;
        summary.replaceChildren(h('p', null, 'The answer does not fit the question:'),
          h('ul', null, errors.map((x) => h('li', null, `${x.path ? x.path.slice(1).replaceAll('/', '.') : 'answer'} ${x.message}`))));
        const bad = form.querySelector('[aria-invalid="true"]');
        if (bad) bad.focus();
        else if (rest.length) summary.focus();
        return;
      }
      summary.hidden = true;
      submit.disabled = true;
      status.textContent = 'Sending…';
      try {
        await api(runPath(this.runId, `/inputs/${encodeURIComponent(requestId)}`), { method: 'POST', body: { value: read.value } });
        status.textContent = 'Answered.';
      } catch (err) {
        // The server checks the answer too; its reason is shown as is.
        status.textContent = err.message;
        status.classList.add('error');
        submit.disabled = false;
      }
    });
    return form;
  }
}

/** A string safe inside an element id. */
function slug(s) {
  return s.replace(/[^A-Za-z0-9_-]/g, '_');
}
