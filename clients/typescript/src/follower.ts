/**
 * Where following a run's events stands, apart from any connection: the
 * last seq yielded, the failures in a row, and the parser of the stream now
 * open. The client opens the stream; this decides what to yield, when to
 * stop, and how long to wait before opening it again. Kept apart so that
 * its rules can be tested without a server, and read beside the Python
 * client's, which follows the same ones.
 *
 * @packageDocumentation
 */

import { CairnError, StreamGaveUp, errorObject } from "./errors.js";
import { isTerminal } from "./schema.js";
import { SseParser, type SseMessage } from "./sse.js";
import type { Event } from "./types.js";

/**
 * Milliseconds to wait before each attempt to open the stream again,
 * growing to the last, which repeats: quick enough for a server that
 * restarts, gentle on one that stays down.
 */
export const RECONNECT_DELAYS_MS: readonly number[] = [100, 250, 500, 1000, 2000];

/** Failed attempts in a row after which following a run gives up. */
export const MAX_RECONNECTS = 20;

/** The wait before attempt `failures` (counted from 1) to open the stream again. */
export function reconnectDelay(failures: number): number {
  const i = Math.min(Math.max(failures, 1), RECONNECT_DELAYS_MS.length) - 1;
  return RECONNECT_DELAYS_MS[i] as number;
}

/** Following one run's events: see the module's documentation. */
export class Follower {
  /** The last seq yielded (or the `after` asked for). */
  after: number;
  /** Failed attempts since the last event of the run arrived. */
  failures = 0;
  /** The last failure, told by {@link StreamGaveUp}. */
  lastError: unknown = undefined;
  /** Set once nothing more is to be yielded. */
  done = false;
  private parser = new SseParser();

  /**
   * @param runId - the run followed
   * @param after - yield the events after this seq
   * @param follow - go on across resumes instead of stopping at the run's end
   */
  constructor(
    readonly runId: string,
    after: number,
    readonly follow: boolean,
  ) {
    this.after = after;
  }

  /**
   * The stream's path and query, from the last seq yielded; the parser
   * starts anew, since a new connection starts a new stream.
   */
  request(): { path: string; query: Record<string, string> } {
    this.parser = new SseParser();
    const query: Record<string, string> = { after: String(this.after) };
    if (this.follow) query["follow"] = "true";
    return { path: `/v1/runs/${encodeURIComponent(this.runId)}/events/stream`, query };
  }

  /** The messages a piece of the stream's text completes. */
  push(text: string): SseMessage[] {
    return this.parser.push(text);
  }

  /**
   * The event to yield for a message, if any. A run's event resets the
   * failures; one already yielded (seq at or below `after`) is dropped, so
   * a reconnection never repeats one. After a terminal event (unless
   * following) `done` is set.
   *
   * Two of the server's own messages count too: `end` says that nothing
   * more comes on this stream without `follow` (sent when `after` was
   * already the run's end), so `done` is set rather than asking again
   * forever; an `error` (the watcher fell behind, or the store failed)
   * closes the stream and is kept as the failure's cause.
   */
  message(msg: SseMessage): Event | undefined {
    switch (msg.event) {
      case "message":
        break;
      case "end":
        if (!this.follow) this.done = true;
        return undefined;
      case "error":
        this.lastError = streamError(msg.data);
        return undefined;
      default:
        return undefined;
    }
    // Malformed JSON is no transport failure: it throws, as in the Python client.
    const ev = JSON.parse(msg.data) as Event;
    this.failures = 0;
    const seq = typeof ev.seq === "number" ? ev.seq : 0;
    if (seq <= this.after) return undefined;
    this.after = seq;
    if (!this.follow && isTerminal(ev)) this.done = true;
    return ev;
  }

  /**
   * The stream failed, or ended before the run did: how long to wait
   * before opening it again. A refusal (a `CairnError` below 500: no such
   * run, a bad token) throws as it is, since asking again changes nothing;
   * past {@link MAX_RECONNECTS} failures in a row, {@link StreamGaveUp}.
   */
  failed(error?: unknown): number {
    if (error instanceof CairnError && error.status < 500) throw error;
    if (error !== undefined) this.lastError = error;
    this.failures += 1;
    if (this.failures > MAX_RECONNECTS) {
      throw new StreamGaveUp(this.runId, this.after, this.lastError);
    }
    return reconnectDelay(this.failures);
  }
}

/** The cause an `error` message of the stream tells. */
function streamError(data: string): Error {
  try {
    const err = errorObject(JSON.parse(data));
    if (err) return new Error(`the server cut the stream: ${String(err["code"])}: ${String(err["message"])}`);
  } catch {
    // Told as it came.
  }
  return new Error(`the server cut the stream: ${data}`);
}
