// The stream's parser and the follower's rules, without a server: chunks
// cut anywhere, duplicates after a reconnection, when to stop, and when to
// give up. The client's `fetch` is replaced by one that serves scripted
// streams, so that each rule is seen through `events()` too.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  CairnClient,
  CairnError,
  Follower,
  MAX_RECONNECTS,
  RECONNECT_DELAYS_MS,
  SseParser,
  StreamGaveUp,
  reconnectDelay,
  type Event,
  type FetchLike,
} from "cairn-client";

function ev(seq: number, type = "NodeOutput"): string {
  return JSON.stringify({ type, runId: "r", seq, timestampMs: seq });
}

function frame(seq: number, type?: string): string {
  return `id: ${seq}\ndata: ${ev(seq, type)}\n\n`;
}

describe("SseParser", () => {
  test("reads messages cut anywhere, with any line end", () => {
    const text = `: heartbeat\r\n\r\nid: 1\r\ndata: {"a":\r\ndata: 1}\r\n\r\nevent: end\rdata: {"lastSeq":1}\r\r`;
    for (let cut = 0; cut <= text.length; cut++) {
      for (const size of [1, 2, 3, 7]) {
        const p = new SseParser();
        const got = [];
        got.push(...p.push(text.slice(0, cut)));
        for (let i = cut; i < text.length; i += size) got.push(...p.push(text.slice(i, i + size)));
        assert.deepEqual(
          got,
          [
            { event: "message", data: '{"a":\n1}', id: "1" },
            { event: "end", data: '{"lastSeq":1}', id: "1" },
          ],
          `cut at ${cut}, pieces of ${size}`,
        );
      }
    }
  });

  test("ignores comments, unknown fields and empty messages", () => {
    const p = new SseParser();
    assert.deepEqual(p.push("\uFEFF: hi\nretry: 10\nfoo: bar\n\nevent: x\n\ndata\n\n"), [{ event: "message", data: "" }]);
  });
});

describe("Follower", () => {
  const msg = (seq: number, type?: string) => ({ event: "message", data: ev(seq, type) });

  test("asks from the last seq yielded, and drops what it already yielded", () => {
    const f = new Follower("a/b.c", 2, false);
    assert.deepEqual(f.request(), { path: "/v1/runs/a%2Fb.c/events/stream", query: { after: "2" } });
    assert.equal(f.message(msg(2)), undefined);
    assert.equal(f.message(msg(3))?.seq, 3);
    assert.equal(f.message(msg(3)), undefined);
    assert.equal(f.message(msg(1)), undefined);
    assert.equal(f.message(msg(4))?.seq, 4);
    assert.equal(f.after, 4);
    assert.deepEqual(f.request().query, { after: "4" });
    assert.deepEqual(new Follower("r", 0, true).request().query, { after: "0", follow: "true" });
  });

  test("stops after a terminal event, unless following", () => {
    for (const type of ["RunFinished", "RunFailed", "RunCancelled"]) {
      const f = new Follower("r", 0, false);
      f.message(msg(1, "RunStatusChanged"));
      assert.equal(f.done, false);
      assert.equal(f.message(msg(2, type))?.type, type);
      assert.equal(f.done, true);
      const g = new Follower("r", 0, true);
      g.message(msg(2, type));
      assert.equal(g.done, false);
    }
  });

  test("the server's `end` stops it; `error` and `shutdown` do not", () => {
    const f = new Follower("r", 5, false);
    f.message({ event: "shutdown", data: '{"lastSeq":5}' });
    f.message({ event: "error", data: '{"error":{"code":"lagged","message":"behind"}}' });
    assert.equal(f.done, false);
    assert.match(String(f.lastError), /lagged: behind/);
    f.message({ event: "end", data: '{"lastSeq":5}' });
    assert.equal(f.done, true);
  });

  test("backs off 0.1 s to 2 s and gives up after 20 failures in a row", () => {
    const f = new Follower("r", 7, false);
    const waits: number[] = [];
    for (let i = 0; i < MAX_RECONNECTS; i++) waits.push(f.failed(new TypeError("fetch failed")));
    assert.deepEqual(waits.slice(0, 6), [100, 250, 500, 1000, 2000, 2000]);
    assert.deepEqual(RECONNECT_DELAYS_MS, [100, 250, 500, 1000, 2000]);
    assert.equal(reconnectDelay(99), 2000);
    assert.throws(
      () => f.failed(),
      (e: unknown) => {
        assert.ok(e instanceof StreamGaveUp);
        assert.equal(e.runId, "r");
        assert.equal(e.after, 7);
        assert.ok(e.cause instanceof TypeError);
        return true;
      },
    );
  });

  test("an event resets the failures; only an event does", () => {
    const f = new Follower("r", 0, false);
    for (let i = 0; i < MAX_RECONNECTS; i++) f.failed();
    f.message({ event: "shutdown", data: "{}" });
    assert.equal(f.failures, MAX_RECONNECTS);
    f.message(msg(1));
    assert.equal(f.failures, 0);
    // A duplicate is still a sign of life.
    for (let i = 0; i < 3; i++) f.failed();
    f.message(msg(1));
    assert.equal(f.failures, 0);
  });

  test("a refusal throws as it is; a server error is a failure", () => {
    const f = new Follower("r", 0, false);
    const refused = new CairnError(404, "not_found", "no run");
    assert.throws(() => f.failed(refused), (e) => e === refused);
    assert.equal(f.failed(new CairnError(503, "unavailable", "")), 100);
  });
});

/** A `fetch` that answers each stream request with the next script. */
function scripted(scripts: Array<(url: string) => Response | Error>): { fetch: FetchLike; urls: string[] } {
  const urls: string[] = [];
  const fetch: FetchLike = async (url) => {
    urls.push(url);
    const next = scripts.shift();
    if (!next) throw new Error("no more scripts");
    const r = next(url);
    if (r instanceof Error) throw r;
    return r;
  };
  return { fetch, urls };
}

/** A streamed answer whose body is `chunks`, one per read, then an error if `cut`. */
function stream(chunks: string[], cut = false): Response {
  const enc = new TextEncoder();
  const rest = [...chunks];
  const body = new ReadableStream<Uint8Array>({
    pull(c) {
      const next = rest.shift();
      if (next !== undefined) c.enqueue(enc.encode(next));
      else if (cut) c.error(new TypeError("terminated"));
      else c.close();
    },
  });
  return new Response(body, { status: 200, headers: { "content-type": "text/event-stream" } });
}

async function collect(it: AsyncIterable<Event>): Promise<number[]> {
  const out: number[] = [];
  for await (const e of it) out.push(e.seq);
  return out;
}

describe("events() over a scripted fetch", () => {
  test("reconnects from the last seq, with no gap and no duplicate", async () => {
    const { fetch, urls } = scripted([
      () => stream([frame(1), frame(2), "id: 3\ndata: {\"ty"], true),
      () => new TypeError("fetch failed"),
      () => new Response('{"error":{"code":"x","message":"down"}}', { status: 502 }),
      // A stream that ends cleanly before the run did is a failure too.
      () => stream([frame(3)]),
      // A server that replays from before the last seq (a proxy's cache, say).
      () => stream([frame(1), frame(2), frame(3), frame(4, "RunFinished"), frame(5)]),
    ]);
    const client = new CairnClient({ baseUrl: "http://cairn.test/api/", fetch });
    assert.deepEqual(await collect(client.events("r/1")), [1, 2, 3, 4]);
    assert.deepEqual(urls, [
      "http://cairn.test/api/v1/runs/r%2F1/events/stream?after=0",
      "http://cairn.test/api/v1/runs/r%2F1/events/stream?after=2",
      "http://cairn.test/api/v1/runs/r%2F1/events/stream?after=2",
      "http://cairn.test/api/v1/runs/r%2F1/events/stream?after=2",
      "http://cairn.test/api/v1/runs/r%2F1/events/stream?after=3",
    ]);
  });

  test("a refusal throws the API's error at once", async () => {
    const { fetch, urls } = scripted([
      () => new Response('{"error":{"code":"not_found","message":"no run `r`"}}', { status: 404 }),
    ]);
    const client = new CairnClient({ baseUrl: "http://cairn.test", fetch, token: "t" });
    await assert.rejects(collect(client.events("r")), (e: unknown) => {
      assert.ok(e instanceof CairnError);
      assert.equal(e.status, 404);
      assert.equal(e.code, "not_found");
      assert.equal(e.message, "no run `r`");
      return true;
    });
    assert.equal(urls.length, 1);
  });

  test("sends the token, the JSON type and the body; reads the answer", async () => {
    const seen: Array<{ url: string; init: RequestInit | undefined }> = [];
    const fetch: FetchLike = async (url, init) => {
      seen.push({ url, init });
      return new Response('{"runId":"x"}', { status: 201 });
    };
    const client = new CairnClient({ baseUrl: "http://cairn.test", token: "tok", fetch });
    assert.equal(await client.startRun("wf", { a: 1 }, { maxConcurrency: 2 }), "x");
    await client.listRuns({ status: "running", limit: 5 });
    const [post, get] = seen;
    assert.equal(post?.url, "http://cairn.test/v1/runs");
    assert.equal(post?.init?.method, "POST");
    assert.deepEqual(JSON.parse(String(post?.init?.body)), { workflow: "wf", input: { a: 1 }, maxConcurrency: 2 });
    const headers = post?.init?.headers as Record<string, string>;
    assert.equal(headers["Authorization"], "Bearer tok");
    assert.equal(headers["Content-Type"], "application/json");
    assert.equal(get?.url, "http://cairn.test/v1/runs?status=running&limit=5");
  });

  test("an answer that is not the API's error is `unknown`", async () => {
    const fetch: FetchLike = async () => new Response("<html>bad gateway</html>", { status: 502 });
    const client = new CairnClient({ baseUrl: "http://cairn.test", fetch });
    await assert.rejects(client.getRun("r"), (e: unknown) => {
      assert.ok(e instanceof CairnError);
      assert.equal(e.status, 502);
      assert.equal(e.code, "unknown");
      assert.equal(e.message, "<html>bad gateway</html>");
      return true;
    });
  });

  test("a signal stops a follower that waits to reconnect", async () => {
    const { fetch } = scripted(Array.from({ length: 50 }, () => () => new TypeError("fetch failed")));
    const client = new CairnClient({ baseUrl: "http://cairn.test", fetch });
    const stop = new AbortController();
    setTimeout(() => stop.abort(new Error("stop")), 300);
    const t0 = Date.now();
    await assert.rejects(collect(client.events("r", { signal: stop.signal })), /stop/);
    assert.ok(Date.now() - t0 < 2_000);
  });
});
