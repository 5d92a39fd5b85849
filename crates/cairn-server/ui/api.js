// The server's HTTP API as the page uses it: JSON in and out with the
// session cookie, failures as ApiError, and a 401 announced on `auth` so
// the page can show its login form.

/** A refusal or failure of the API, in the API's own terms. */
export class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details;
  }
}

/** Fires `unauthorized` when a request needs a (new) login. */
export const auth = new EventTarget();

/** Calls the API: `body` is sent as JSON; the answer's JSON is returned. */
export async function api(path, { method = 'GET', body, signal } = {}) {
  const init = {
    method,
    credentials: 'same-origin',
    headers: { Accept: 'application/json' },
    signal,
  };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, 'network', 'The server cannot be reached.');
  }
  if (res.status === 204) return null;
  const text = await res.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!res.ok) {
    const e = (data && data.error) || {};
    if (res.status === 401 && path !== '/v1/session') {
      auth.dispatchEvent(new Event('unauthorized'));
    }
    throw new ApiError(res.status, e.code || 'http', e.message || `HTTP ${res.status}`, e.details);
  }
  return data;
}

/** The API path of a run, and of something under it. */
export function runPath(id, rest = '') {
  return `/v1/runs/${encodeURIComponent(id)}${rest}`;
}

/**
 * Every event of a query, page after page (`query` holds `type`, `node`);
 * `onPage` gets each page as it arrives. Stops early when `signal` aborts.
 */
export async function allEvents(runId, query, onPage, signal) {
  let after = 0;
  for (;;) {
    const q = new URLSearchParams({ ...query, after: String(after), limit: '5000' });
    const page = await api(runPath(runId, `/events?${q}`), { signal });
    onPage(page.events);
    if (page.nextAfter === undefined) return;
    after = page.nextAfter;
  }
}
