/**
 * The client of one `cairn serve`.
 *
 * @packageDocumentation
 */

import { CairnError, errorObject } from "./errors.js";
import { Follower } from "./follower.js";
import type {
  Answered,
  AnswerRequest,
  CancelAccepted,
  CancelRequest,
  DecideRequest,
  Decided,
  Event,
  EventsPage,
  Resumed,
  ResumeRequest,
  RunAccepted,
  RunFilterStatus,
  RunList,
  RunState,
  StartRunRequest,
} from "./types.js";

/** A `fetch` like the global one, for tests, proxies or other runtimes. */
export type FetchLike = (input: string, init?: RequestInit) => Promise<Response>;

/** How to reach the server. */
export interface ClientOptions {
  /** The server's address, e.g. `http://127.0.0.1:7700` (a path prefix is kept). */
  baseUrl: string;
  /** The server's token (`cairn serve --token`), sent as `Authorization: Bearer`. */
  token?: string | undefined;
  /** Used instead of the global `fetch`. */
  fetch?: FetchLike | undefined;
  /**
   * Longest wait for a call's answer, in ms (default 30 000). Following
   * events has no such limit, only one on silence: see
   * {@link STREAM_IDLE_TIMEOUT_MS}.
   */
  timeoutMs?: number | undefined;
}

/** What every call takes: a signal that abandons it. */
export interface CallOptions {
  signal?: AbortSignal | undefined;
}

/** Options of {@link CairnClient.startRun}. */
export interface StartRunOptions extends CallOptions {
  /** The run's id; the server makes one up without it. */
  runId?: string | undefined;
  /** Most nodes running at once. */
  maxConcurrency?: number | undefined;
}

/** Filters and page of {@link CairnClient.listRuns}. */
export interface ListRunsOptions extends CallOptions {
  status?: RunFilterStatus | undefined;
  workflow?: string | undefined;
  /** Only the child runs of this run. */
  parent?: string | undefined;
  /** 1 to 1000; the server's default is 50. */
  limit?: number | undefined;
  offset?: number | undefined;
}

/** Options of {@link CairnClient.eventsPage}. */
export interface EventsPageOptions extends CallOptions {
  /** Events with a seq greater than this (default 0). */
  after?: number | undefined;
  /** 1 to 10 000; the server's default is 1000. */
  limit?: number | undefined;
}

/** Options of {@link CairnClient.approve} and {@link CairnClient.deny}. */
export interface DecideOptions extends CallOptions {
  note?: string | undefined;
  /** Who decided, for the log. */
  by?: string | undefined;
}

/** Options of {@link CairnClient.answer}. */
export interface AnswerOptions extends CallOptions {
  /** Who answered, for the log. */
  by?: string | undefined;
}

/** Options of {@link CairnClient.cancel}. */
export interface CancelOptions extends CallOptions {
  /** Let running nodes finish (nothing new starts) instead of killing them now. */
  graceful?: boolean | undefined;
  reason?: string | undefined;
  by?: string | undefined;
}

/** Options of {@link CairnClient.resume}. */
export interface ResumeOptions extends CallOptions {
  maxConcurrency?: number | undefined;
}

/** Options of {@link CairnClient.events}. */
export interface EventsOptions extends CallOptions {
  /** Yield the events after this seq (default 0: all of them). */
  after?: number | undefined;
  /**
   * Go on across resumes instead of ending at the run's terminal event,
   * for as long as the caller reads (default false).
   */
  follow?: boolean | undefined;
}

/** Default of {@link ClientOptions.timeoutMs}. */
export const DEFAULT_TIMEOUT_MS = 30_000;

/**
 * Longest silence on an event stream before it is opened again: the server
 * sends a heartbeat every 15 s when idle, so a minute without a byte means
 * the connection is dead although no one closed it.
 */
export const STREAM_IDLE_TIMEOUT_MS = 60_000;

type Query = Record<string, string | number | boolean | undefined>;

/**
 * A client of one `cairn serve`.
 *
 * ```ts
 * const client = new CairnClient({ baseUrl: "http://127.0.0.1:7700" });
 * const run = await client.startRun("hello", { name: "Ada" });
 * for await (const event of client.events(run)) console.log(event.seq, event.type);
 * ```
 *
 * Every call but {@link CairnClient.events} answers once the server has
 * made its effect durable, or throws a {@link CairnError} that carries the
 * HTTP status and the API's stable error code.
 */
export class CairnClient {
  /** The server's address, without a trailing `/`. */
  readonly baseUrl: string;
  private readonly token: string | undefined;
  private readonly fetchImpl: FetchLike;
  private readonly timeoutMs: number;

  /** @param options - the server's address, or all the options */
  constructor(options: ClientOptions | string) {
    const o: ClientOptions = typeof options === "string" ? { baseUrl: options } : options;
    this.baseUrl = o.baseUrl.replace(/\/+$/, "");
    this.token = o.token;
    // Looked up at call time, so a global replaced later (a test's) is used.
    this.fetchImpl = o.fetch ?? ((input, init) => globalThis.fetch(input, init));
    this.timeoutMs = o.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  }

  /**
   * Starts a run of a workflow of the server's workflows folder, by name;
   * returns its id once the run is durable (on a shared store, queued for
   * an instance to claim).
   */
  async startRun(workflow: string, input?: unknown, options: StartRunOptions = {}): Promise<string> {
    const body: StartRunRequest = { workflow };
    if (input !== undefined) body.input = input;
    if (options.runId !== undefined) body.runId = options.runId;
    if (options.maxConcurrency !== undefined) body.maxConcurrency = options.maxConcurrency;
    const accepted = await this.call<RunAccepted>("POST", "/v1/runs", { body, signal: options.signal });
    return accepted.runId;
  }

  /** A page of runs, newest first. */
  listRuns(options: ListRunsOptions = {}): Promise<RunList> {
    const { status, workflow, parent, limit, offset, signal } = options;
    return this.call<RunList>("GET", "/v1/runs", { query: { status, workflow, parent, limit, offset }, signal });
  }

  /** A run's state, folded from its log. */
  getRun(runId: string, options: CallOptions = {}): Promise<RunState> {
    return this.call<RunState>("GET", `/v1/runs/${seg(runId)}`, { signal: options.signal });
  }

  /** The stored events after `after` (one page; the next starts after the last seq). */
  async eventsPage(runId: string, options: EventsPageOptions = {}): Promise<Event[]> {
    const { after = 0, limit, signal } = options;
    const page = await this.call<EventsPage>("GET", `/v1/runs/${seg(runId)}/events`, {
      query: { after, limit },
      signal,
    });
    return page.events;
  }

  /** Grants the approval gate `node` (its path inside groups). */
  approve(runId: string, node: string, options: DecideOptions = {}): Promise<Decided> {
    return this.decide(runId, node, true, options);
  }

  /** Denies the approval gate `node`; its `on_failure` decides what follows. */
  deny(runId: string, node: string, options: DecideOptions = {}): Promise<Decided> {
    return this.decide(runId, node, false, options);
  }

  /**
   * Answers the question `requestId` a node asked (an `InputRequested`
   * event's). An answer that breaks the question's schema is refused and
   * the question stays open.
   */
  answer(runId: string, requestId: string, value: unknown, options: AnswerOptions = {}): Promise<Answered> {
    const body: AnswerRequest = { value, by: options.by };
    return this.call<Answered>("POST", `/v1/runs/${seg(runId)}/inputs/${seg(requestId)}`, {
      body,
      signal: options.signal,
    });
  }

  /** Cancels a run; answers once the request is durable, before the run has stopped. */
  cancel(runId: string, options: CancelOptions = {}): Promise<CancelAccepted> {
    const body: CancelRequest = { graceful: options.graceful ?? false, reason: options.reason, by: options.by };
    return this.call<CancelAccepted>("POST", `/v1/runs/${seg(runId)}/cancel`, { body, signal: options.signal });
  }

  /**
   * Resumes a run that stopped before its end with nobody driving it (its
   * process crashed, or exited to wait for a person). A run that ended
   * (finished, failed or cancelled) has nothing to resume: 409 `conflict`.
   */
  resume(runId: string, options: ResumeOptions = {}): Promise<Resumed> {
    const body: ResumeRequest = {};
    if (options.maxConcurrency !== undefined) body.maxConcurrency = options.maxConcurrency;
    return this.call<Resumed>("POST", `/v1/runs/${seg(runId)}/resume`, { body, signal: options.signal });
  }

  /**
   * The run's events after seq `after`, live, until its end (or, with
   * `follow`, across resumes, for as long as the caller reads).
   *
   * A dropped connection (a server that restarted or stopped, a proxy
   * that timed out, a minute of silence) is opened again from the last seq
   * yielded, waiting 0.1 s and growing to 2 s between attempts: every event
   * comes once, in order, with no gap. After 20 failures in a row it
   * throws {@link StreamGaveUp}, which carries the last seq. A refusal (no
   * such run, a bad token) throws its {@link CairnError} at once.
   *
   * Breaking out of the loop closes the connection; so does `signal`,
   * which makes the loop throw its reason.
   */
  async *events(runId: string, options: EventsOptions = {}): AsyncGenerator<Event, void, undefined> {
    const { signal } = options;
    const f = new Follower(runId, options.after ?? 0, options.follow ?? false);
    while (true) {
      signal?.throwIfAborted();
      let error: unknown = undefined;
      const req = f.request();
      const conn = new AbortController();
      const unlink = link(signal, conn);
      let idle: ReturnType<typeof setTimeout> | undefined;
      // Silence counts only while waiting on the server, not while the
      // caller takes its time with an event.
      const watched = <T>(p: Promise<T>): Promise<T> => {
        idle = setTimeout(() => conn.abort(new Error("the event stream was silent too long")), STREAM_IDLE_TIMEOUT_MS);
        return p.finally(() => clearTimeout(idle));
      };
      try {
        const resp = await watched(
          this.fetchImpl(this.url(req.path, req.query), {
            method: "GET",
            headers: this.headers("text/event-stream"),
            signal: conn.signal,
          }),
        );
        if (resp.status >= 400) {
          const text = await watched(resp.text());
          if (resp.status < 500) throw refusal(resp.status, text);
          throw new CairnError(resp.status, "unavailable", text, text);
        }
        if (resp.body) {
          const reader = resp.body.getReader();
          const decoder = new TextDecoder();
          try {
            while (true) {
              const { value, done } = await watched(reader.read());
              if (done) break;
              for (const msg of f.push(decoder.decode(value, { stream: true }))) {
                const ev = f.message(msg);
                if (ev !== undefined) yield ev;
                if (f.done) return;
              }
            }
          } finally {
            // Also when the caller stops reading: the connection closes now.
            reader.cancel().catch(() => {});
          }
        }
      } catch (e) {
        if (signal?.aborted) throw signal.reason;
        // An event that is not JSON: reading it again would not help.
        if (e instanceof SyntaxError) throw e;
        error = e;
      } finally {
        clearTimeout(idle);
        unlink();
        conn.abort();
      }
      await sleep(f.failed(error), signal);
    }
  }

  /** Follows the run to its end; returns its final state. */
  async wait(runId: string, options: CallOptions = {}): Promise<RunState> {
    for await (const _ of this.events(runId, { signal: options.signal })) {
      // Only the end matters.
    }
    return this.getRun(runId, options);
  }

  private decide(runId: string, node: string, approved: boolean, options: DecideOptions): Promise<Decided> {
    const body: DecideRequest = { approved, note: options.note, by: options.by };
    return this.call<Decided>("POST", `/v1/runs/${seg(runId)}/approvals/${seg(node)}`, {
      body,
      signal: options.signal,
    });
  }

  private url(path: string, query?: Query): string {
    const params = new URLSearchParams();
    for (const [k, v] of Object.entries(query ?? {})) {
      if (v !== undefined) params.set(k, String(v));
    }
    const qs = params.toString();
    return `${this.baseUrl}${path}${qs ? `?${qs}` : ""}`;
  }

  private headers(accept: string, json = false): Record<string, string> {
    const h: Record<string, string> = { Accept: accept };
    // The server refuses every POST without it, even one with an empty body.
    if (json) h["Content-Type"] = "application/json";
    if (this.token) h["Authorization"] = `Bearer ${this.token}`;
    return h;
  }

  /** One call: its JSON answer, or the {@link CairnError} it carries. */
  private async call<T>(
    method: "GET" | "POST",
    path: string,
    opts: { query?: Query; body?: object; signal?: AbortSignal | undefined },
  ): Promise<T> {
    const conn = new AbortController();
    const unlink = link(opts.signal, conn);
    const timer = setTimeout(
      () => conn.abort(new DOMException(`no answer from ${this.baseUrl} within ${this.timeoutMs} ms`, "TimeoutError")),
      this.timeoutMs,
    );
    try {
      const resp = await this.fetchImpl(this.url(path, opts.query), {
        method,
        headers: this.headers("application/json", method === "POST"),
        // `undefined` fields are left out: the API reads them as absent.
        ...(method === "POST" ? { body: JSON.stringify(opts.body ?? {}) } : {}),
        signal: conn.signal,
      });
      const text = await resp.text();
      if (resp.status >= 400) throw refusal(resp.status, text);
      return (text ? JSON.parse(text) : undefined) as T;
    } catch (e) {
      // The reason given to abort, not the DOMException fetch wraps it in.
      if (conn.signal.aborted && !(e instanceof CairnError)) throw conn.signal.reason;
      throw e;
    } finally {
      clearTimeout(timer);
      unlink();
    }
  }
}

/** A path segment, escaped: ids and node paths may hold `.` and `/`. */
function seg(value: string): string {
  return encodeURIComponent(value);
}

/** The error an answer of status 400 or more carries. */
function refusal(status: number, text: string): CairnError {
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    return new CairnError(status, "unknown", text, text);
  }
  const err = errorObject(body);
  const code = typeof err?.["code"] === "string" ? err["code"] : "unknown";
  const message = typeof err?.["message"] === "string" ? err["message"] : text;
  return new CairnError(status, code, message, body);
}

/** Aborts `conn` when `signal` does; returns the unlinking. */
function link(signal: AbortSignal | undefined, conn: AbortController): () => void {
  if (!signal) return () => {};
  if (signal.aborted) {
    conn.abort(signal.reason);
    return () => {};
  }
  const onAbort = (): void => conn.abort(signal.reason);
  signal.addEventListener("abort", onAbort, { once: true });
  return () => signal.removeEventListener("abort", onAbort);
}

/** Waits `ms`, or until `signal` aborts (then throws its reason). */
function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
