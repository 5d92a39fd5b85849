/**
 * The server refused a request. `code` is the API's stable, machine-readable
 * error code (`not_found`, `conflict`, `invalid_input`, ...): branch on it,
 * not on `message`, which is written for people and may change.
 */
export class CairnError extends Error {
  /** The HTTP status of the answer. */
  readonly status: number;
  /**
   * The error's stable code from the body's `{error: {code}}`; `unknown`
   * when the body is not the API's error shape (a proxy's page, say), and
   * `unavailable` for a server error met while following a run.
   */
  readonly code: string;
  /** The body as parsed JSON, else its text (empty when it had none). */
  readonly body: unknown;

  /**
   * @param status - the HTTP status
   * @param code - the API's error code
   * @param message - the error's message, for people
   * @param body - the whole answer's body
   */
  constructor(status: number, code: string, message: string, body?: unknown) {
    super(message);
    this.name = "CairnError";
    this.status = status;
    this.code = code;
    this.body = body;
  }

  /**
   * The body's `error.details`, when the server sent some: where each
   * problem of an invalid workflow is, or each violation of an input
   * schema.
   */
  get details(): unknown {
    const err = errorObject(this.body);
    return err?.["details"];
  }

  /** As `status code: message`, so a log line tells all three. */
  override toString(): string {
    return `${this.name}: ${this.status} ${this.code}: ${this.message}`;
  }
}

/**
 * Following a run's events failed more times in a row than the client
 * allows (the server stayed down, or kept cutting the stream). `after` is
 * the last seq yielded: pass it back to `events()` to follow on from there
 * without a gap.
 */
export class StreamGaveUp extends Error {
  /** The run that was followed. */
  readonly runId: string;
  /** The last seq yielded before giving up (or the `after` asked for). */
  readonly after: number;

  /**
   * @param runId - the run followed
   * @param after - the last seq yielded
   * @param cause - the last failure, when there was one
   */
  constructor(runId: string, after: number, cause?: unknown) {
    super(`following run ${runId} failed after seq ${after}: ${describe(cause)}`, { cause });
    this.name = "StreamGaveUp";
    this.runId = runId;
    this.after = after;
  }
}

/** The `error` object of an API error body, if the body is one. */
export function errorObject(body: unknown): Record<string, unknown> | undefined {
  if (typeof body !== "object" || body === null) return undefined;
  const err = (body as Record<string, unknown>)["error"];
  if (typeof err !== "object" || err === null) return undefined;
  return err as Record<string, unknown>;
}

function describe(cause: unknown): string {
  if (cause === undefined) return "the stream kept ending before the run did";
  if (cause instanceof Error) {
    // fetch hides the socket's error (ECONNREFUSED, ...) in `cause`.
    const inner = (cause as { cause?: unknown }).cause;
    return inner instanceof Error ? `${cause.message} (${inner.message})` : cause.message;
  }
  return String(cause);
}
