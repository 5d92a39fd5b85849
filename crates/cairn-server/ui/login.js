// The login form, shown when the API answers 401: the token is posted
// once to `/v1/session`, which answers with an HttpOnly cookie. The page
// never keeps the token: not in storage, not in a cookie it can read, not
// in a variable once the request is sent.

import { api } from './api.js';
import { h } from './dom.js';

export class LoginView {
  /** `onDone()` once the browser has a session. */
  constructor({ onDone }) {
    const input = h('input', { id: 'login-token', type: 'password', name: 'token', required: true, autocomplete: 'current-password', spellcheck: 'false' });
    const status = h('p', { class: 'form-status', role: 'alert' });
    const submit = h('button', { type: 'submit', class: 'primary' }, 'Log in');
    const form = h('form', { class: 'login', 'aria-labelledby': 'login-title' },
      h('h1', { id: 'login-title' }, 'Log in'),
      h('p', null, 'This server needs its token. Your browser keeps a session cookie derived from it, never the token itself.'),
      h('div', { class: 'field' }, h('label', { htmlFor: 'login-token' }, 'Token'), input),
      submit, status);
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      if (!input.value) {
        status.textContent = 'Enter the token.';
        input.focus();
        return;
      }
      submit.disabled = true;
      status.textContent = '';
      status.classList.remove('error');
      try {
        await api('/v1/session', { method: 'POST', body: { token: input.value } });
        input.value = '';
        onDone();
      } catch (err) {
        input.value = '';
        status.textContent = err.status === 401 ? 'That token is wrong.' : err.message;
        status.classList.add('error');
        input.setAttribute('aria-invalid', 'true');
        input.focus();
      } finally {
        submit.disabled = false;
      }
    });
    this.el = h('section', { class: 'login-box' }, form);
    requestAnimationFrame(() => input.focus());
  }

  destroy() {}
}
