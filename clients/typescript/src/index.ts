/**
 * A client of Cairn's HTTP API (`cairn serve`): start runs, list and read
 * them, approve, deny, answer, cancel and resume them, and follow a run's
 * events live, reconnecting from the last seq seen. It needs nothing but
 * `fetch`.
 *
 * ```ts
 * import { CairnClient } from "cairn-client";
 *
 * const client = new CairnClient({ baseUrl: "http://127.0.0.1:7700" });
 * const run = await client.startRun("hello", { name: "Ada" });
 * for await (const event of client.events(run)) console.log(event.seq, event.type);
 * ```
 *
 * @packageDocumentation
 */

export {
  CairnClient,
  DEFAULT_TIMEOUT_MS,
  STREAM_IDLE_TIMEOUT_MS,
  type AnswerOptions,
  type CallOptions,
  type CancelOptions,
  type ClientOptions,
  type DecideOptions,
  type EventsOptions,
  type EventsPageOptions,
  type FetchLike,
  type ListRunsOptions,
  type ResumeOptions,
  type StartRunOptions,
} from "./client.js";
export { CairnError, StreamGaveUp } from "./errors.js";
export { Follower, MAX_RECONNECTS, RECONNECT_DELAYS_MS, reconnectDelay } from "./follower.js";
export {
  ENVELOPE_KEYS,
  EVENT_FIELDS,
  EVENT_TYPES,
  SCHEMA_KEYS,
  SCOPE_KEYS,
  TERMINAL,
  eventKeys,
  eventProblems,
  isTerminal,
  type EventFields,
  type Keys,
  type Scope,
} from "./schema.js";
export { SseParser, type SseMessage } from "./sse.js";
export type * from "./types.js";
