/**
 * Server-Sent Events, parsed by hand so that the client needs nothing but
 * `fetch`: `EventSource` cannot send an `Authorization` header, and Node
 * has none built in.
 *
 * `GET /v1/runs/{id}/events/stream` sends each event of the run as a
 * message whose `id` is its seq and whose `data` is the event's JSON; lines
 * that start with `:` are heartbeats; the stream's own news comes as named
 * messages (`end`, `error`, `shutdown`).
 *
 * @packageDocumentation
 */

/** One message of the stream. */
export interface SseMessage {
  /** Its `event:` name; `message` when it has none (a run's event). */
  event: string;
  /** Its `data:` lines, joined with `\n`. */
  data: string;
  /** Its `id:`, if it had one. */
  id?: string;
}

/**
 * Turns the stream's text into messages. Chunks may end anywhere, even
 * inside a line or between the `\r` and `\n` of a line's end.
 */
export class SseParser {
  private rest = "";
  private data: string[] = [];
  private event = "";
  private id: string | undefined;
  private afterCR = false;
  private first = true;

  /** Takes the next piece of decoded text; returns the messages it completes. */
  push(text: string): SseMessage[] {
    if (this.first && text.length > 0) {
      this.first = false;
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
    }
    if (this.afterCR && text.startsWith("\n")) text = text.slice(1);
    this.afterCR = false;
    const out: SseMessage[] = [];
    let start = 0;
    for (let i = 0; i < text.length; i++) {
      const c = text.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      const line = this.rest + text.slice(start, i);
      this.rest = "";
      if (c === 13) {
        if (i + 1 === text.length) this.afterCR = true;
        else if (text.charCodeAt(i + 1) === 10) i++;
      }
      start = i + 1;
      const msg = this.line(line);
      if (msg) out.push(msg);
    }
    this.rest += text.slice(start);
    return out;
  }

  /** Takes one line without its end; returns a message when the line ends one. */
  line(line: string): SseMessage | undefined {
    if (line === "") {
      const msg: SseMessage | undefined =
        this.data.length > 0
          ? { event: this.event || "message", data: this.data.join("\n"), ...(this.id !== undefined ? { id: this.id } : {}) }
          : undefined;
      this.data = [];
      this.event = "";
      return msg;
    }
    if (line.startsWith(":")) return undefined;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "data":
        this.data.push(value);
        break;
      case "event":
        this.event = value;
        break;
      case "id":
        // The event's JSON carries its seq too; the id is kept for callers.
        if (!value.includes("\0")) this.id = value;
        break;
      default:
        // `retry` and unknown fields change nothing here: reconnection
        // follows the client's own backoff.
        break;
    }
    return undefined;
  }
}
