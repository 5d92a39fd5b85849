// The page's entry point: finds out whether a login is needed, routes
// `#/` (the runs), `#/runs/{id}[/{view}]` (a run) and
// `#/compare/{original}/{replay}` (two runs side by side), shows the live
// connection's state, and swaps in the login form whenever the API says 401.

import { api, auth } from './api.js';
import { LoginView } from './login.js';
import { RunsView } from './runs.js';
import { RunView } from './run.js';
import { CompareView } from './compare.js';

const main = document.getElementById('main');
const conn = document.getElementById('conn');
const logout = document.getElementById('logout');

const CONN_TEXT = {
  connecting: 'Connecting…',
  live: 'Live',
  reconnecting: 'Reconnecting…',
  offline: 'Offline',
  ended: 'Run ended',
  closed: '',
};

let view = null;
let loggingIn = false;

function setConnection(state) {
  conn.textContent = CONN_TEXT[state] ?? state;
  conn.dataset.state = state;
}

function mount(v, title) {
  if (view) view.destroy();
  view = v;
  main.replaceChildren(v.el);
  document.title = title ? `${title} · Cairn` : 'Cairn';
}

/** Shows the view the address names. */
function route() {
  if (loggingIn) return;
  const hash = location.hash || '#/';
  // Other fragments (the skip link's) are not routes.
  if (!hash.startsWith('#/')) return;
  const parts = hash.slice(2).split('/').map(decodeURIComponent);
  if (parts[0] === 'runs' && parts[1]) {
    mount(new RunView({ runId: parts[1], tab: parts[2], setConnection }), parts[1]);
  } else if (parts[0] === 'compare' && parts[1] && parts[2]) {
    mount(new CompareView({ original: parts[1], replay: parts[2], setConnection }), `${parts[2]} against ${parts[1]}`);
  } else {
    mount(new RunsView({ setConnection }), 'Runs');
  }
}

function showLogin() {
  if (loggingIn) return;
  loggingIn = true;
  setConnection('closed');
  logout.hidden = true;
  mount(new LoginView({
    onDone: () => {
      loggingIn = false;
      session().then(route);
    },
  }), 'Log in');
}

/** Asks whether the browser has a session; shows Log out when it has one to end. */
async function session() {
  try {
    const s = await api('/v1/session');
    logout.hidden = !(s.tokenRequired && s.authenticated);
    return s;
  } catch {
    return null;
  }
}

auth.addEventListener('unauthorized', showLogin);
window.addEventListener('hashchange', route);
logout.addEventListener('click', async () => {
  try {
    await api('/v1/session', { method: 'DELETE' });
  } finally {
    showLogin();
  }
});
document.getElementById('skip').addEventListener('click', (e) => {
  e.preventDefault();
  main.focus();
});

session().then((s) => {
  if (s && s.tokenRequired && !s.authenticated) showLogin();
  else route();
});
