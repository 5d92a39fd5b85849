// The client against a real `cairn serve`: the Python client's tests, and
// a few of this client's own (a token, events after a run's end, a signal).

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  CairnClient,
  CairnError,
  eventProblems,
  isTerminal,
  type Event,
  type InputRequestedEvent,
  type RunState,
} from "cairn-client";

import { Server, skipServer, sleep } from "./server.js";

/** Waits until the run has `status`; its state then. */
async function waitFor(client: CairnClient, run: string, status: string): Promise<RunState> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const state = await client.getRun(run);
    if (state.status === status) return state;
    assert.ok(Date.now() < deadline, `run ${run} is ${state.status}, not ${status}`);
    await sleep(50);
  }
}

async function collect(it: AsyncIterable<Event>): Promise<Event[]> {
  const out: Event[] = [];
  for await (const ev of it) out.push(ev);
  return out;
}

function range(from: number, to: number): number[] {
  return Array.from({ length: to - from + 1 }, (_, i) => from + i);
}

/** Every event is of the contract, as the `Event` type declares it. */
function assertContract(events: Event[]): void {
  for (const ev of events) assert.deepEqual(eventProblems(ev), [], JSON.stringify(ev));
}

describe("against a real cairn serve", { skip: skipServer, timeout: 120_000 }, () => {
  let server: Server;
  let client: CairnClient;

  before(async () => {
    server = await Server.start();
    client = new CairnClient({ baseUrl: server.url });
  });

  after(async () => {
    await server?.close();
  });

  test("start, list, approve and follow a run", async () => {
    const run = await client.startRun("gated", undefined, { runId: "ts-gated" });
    assert.equal(run, "ts-gated");
    await waitFor(client, run, "waiting-approval");
    const listed = await client.listRuns({ status: "waiting-approval" });
    assert.deepEqual(
      listed.runs.map((r) => r.runId),
      [run],
    );
    assert.equal(listed.offset, 0);
    const decided = await client.approve(run, "gate", { by: "node-test", note: "fine" });
    assert.deepEqual(decided, { runId: run, nodeId: "gate", approved: true });

    const events = await collect(client.events(run));
    const seqs = events.map((e) => e.seq);
    assert.deepEqual(seqs, range(1, seqs.length));
    assert.equal(events[0]?.type, "RunStarted");
    const last = events[events.length - 1];
    assert.ok(last && isTerminal(last) && last.type === "RunFinished", JSON.stringify(last));
    const granted = events.find((e) => e.type === "ApprovalGranted");
    assert.ok(granted && granted.type === "ApprovalGranted");
    assert.equal(granted.nodeId, "gate");
    assert.equal(granted.decidedBy, "node-test");
    assert.equal(granted.note, "fine");
    assertContract(events);

    const state = await client.getRun(run);
    assert.equal(state.status, "finished");
    assert.deepEqual(state.output, { shipped: true });
    assert.equal(state.lastSeq, seqs[seqs.length - 1]);

    // After a seq: the rest only, and the stored page agrees.
    const tail = await collect(client.events(run, { after: seqs[seqs.length - 3] }));
    assert.deepEqual(
      tail.map((e) => e.seq),
      seqs.slice(-2),
    );
    const page = await client.eventsPage(run);
    assert.deepEqual(
      page.map((e) => e.seq),
      seqs,
    );
    const paged = await client.eventsPage(run, { after: 2, limit: 3 });
    assert.deepEqual(
      paged.map((e) => e.seq),
      [3, 4, 5],
    );

    const finished = await client.listRuns({ workflow: "gated", status: "finished" });
    assert.ok(finished.runs.some((r) => r.runId === run && r.status === "finished"));
  });

  test("answer a question (a wrong type refused) and cancel a run", async () => {
    const run = await client.startRun("asks");
    await waitFor(client, run, "waiting-input");
    const asked = (await client.eventsPage(run)).filter(
      (e): e is InputRequestedEvent => e.type === "InputRequested",
    );
    assert.equal(asked.length, 1);
    const requestId = asked[0]!.requestId;
    assert.equal(asked[0]!.prompt, "Which branch?");
    await assert.rejects(client.answer(run, requestId, 42), (e: unknown) => {
      assert.ok(e instanceof CairnError);
      assert.equal(e.status, 400);
      assert.ok(e.code.length > 0);
      return true;
    });
    // The question stayed open.
    assert.equal((await client.getRun(run)).status, "waiting-input");
    assert.deepEqual(await client.answer(run, requestId, "main", { by: "node-test" }), { runId: run, requestId });
    const state = await client.wait(run);
    assert.equal(state.status, "finished", JSON.stringify(state));
    const echo = state.nodes.find((n) => n.nodeId === "echo");
    assert.deepEqual(echo?.output, { branch: "main" });
    assert.equal(state.questions?.[requestId]?.answer, "main");
    assert.equal(state.questions?.[requestId]?.answeredBy, "node-test");

    const other = await client.startRun("gated");
    await waitFor(client, other, "waiting-approval");
    const cancelled = await client.cancel(other, { reason: "not today", by: "node-test" });
    assert.deepEqual(cancelled, { runId: other, mechanism: "immediate" });
    const end = await client.wait(other);
    assert.equal(end.status, "cancelled");
    const events = await client.eventsPage(other);
    const requested = events.find((e) => e.type === "RunCancelRequested");
    assert.ok(requested && requested.type === "RunCancelRequested");
    assert.equal(requested.reason, "not today");
    assert.equal(requested.requestedBy, "node-test");
    assert.equal(events[events.length - 1]?.type, "RunCancelled");
    assertContract(events);
  });

  test("errors carry the API's code", async () => {
    await assert.rejects(client.getRun("no-such-run"), (e: unknown) => {
      assert.ok(e instanceof CairnError);
      assert.equal(e.status, 404);
      assert.equal(e.code, "not_found");
      assert.match(e.message, /no-such-run/);
      return true;
    });
    await assert.rejects(client.startRun("no-such-workflow"), (e: unknown) => {
      assert.ok(e instanceof CairnError);
      assert.equal(e.status, 404);
      assert.equal(e.code, "workflow_not_found");
      return true;
    });
    // Following a run that does not exist is refused at once, not retried.
    const t0 = Date.now();
    await assert.rejects(collect(client.events("no-such-run")), (e: unknown) => {
      assert.ok(e instanceof CairnError);
      assert.equal(e.status, 404);
      assert.equal(e.code, "not_found");
      return true;
    });
    assert.ok(Date.now() - t0 < 5_000);

    const run = await client.startRun("gated", undefined, { runId: "ts-taken" });
    await assert.rejects(client.startRun("gated", undefined, { runId: "ts-taken" }), (e: unknown) => {
      assert.ok(e instanceof CairnError);
      assert.equal(e.status, 409);
      assert.equal(e.code, "conflict");
      return true;
    });
    await waitFor(client, run, "waiting-approval");
    // A node that is not waiting for approval.
    await assert.rejects(client.approve(run, "after"), (e: unknown) => {
      assert.ok(e instanceof CairnError);
      assert.equal(e.status, 409);
      return true;
    });
    // A bad parameter: the server names it, and the body is the API's shape.
    await assert.rejects(client.eventsPage(run, { limit: 0 }), (e: unknown) => {
      assert.ok(e instanceof CairnError);
      assert.equal(e.status, 400);
      assert.equal(e.code, "bad_request");
      assert.deepEqual(e.body, { error: { code: "bad_request", message: e.message } });
      return true;
    });
    await client.cancel(run);
    await client.wait(run);
    await assert.rejects(client.cancel(run), (e: unknown) => e instanceof CairnError && e.status === 409);
  });

  test("ids and node paths are escaped as one path segment", async () => {
    const run = await client.startRun("gated", undefined, { runId: "ts.dots:and-colons" });
    assert.equal(run, "ts.dots:and-colons");
    await waitFor(client, run, "waiting-approval");
    // Unescaped, `gate/../gate` would reach the server as `gate` and be
    // approved; escaped, it is one segment that names no node.
    await assert.rejects(client.approve(run, "gate/../gate"), (e: unknown) => {
      assert.ok(e instanceof CairnError);
      assert.equal(e.status, 404);
      assert.equal(e.code, "not_found");
      assert.match(e.message, /`gate\/\.\.\/gate`/);
      return true;
    });
    assert.equal((await client.getRun(run)).status, "waiting-approval");
    await client.approve(run, "gate");
    assert.equal((await client.wait(run)).status, "finished");
  });

  test("following after a run's end ends at once", async () => {
    const run = await client.startRun("gated");
    await waitFor(client, run, "waiting-approval");
    await client.approve(run, "gate");
    const state = await client.wait(run);
    const t0 = Date.now();
    assert.deepEqual(await collect(client.events(run, { after: state.lastSeq })), []);
    assert.ok(Date.now() - t0 < 2_000, "the follower asked again instead of ending");
  });

  test("follow goes on past the run's end until a signal or a break stops it", async () => {
    const run = await client.startRun("gated");
    await waitFor(client, run, "waiting-approval");
    await client.approve(run, "gate");
    const { lastSeq } = await client.wait(run);
    const seen: Event[] = [];
    const abort = new AbortController();
    let ended = false;
    const following = (async () => {
      for await (const ev of client.events(run, { follow: true, signal: abort.signal })) seen.push(ev);
    })().finally(() => (ended = true));
    try {
      const deadline = Date.now() + 10_000;
      while (seen.length < lastSeq && Date.now() < deadline) await sleep(20);
      assert.deepEqual(
        seen.map((e) => e.seq),
        range(1, lastSeq),
      );
      assert.equal(seen[seen.length - 1]?.type, "RunFinished");
      // Past the terminal event it waits for a resume's events.
      await sleep(300);
      assert.equal(ended, false, "a follower with follow ended at the run's end");
    } finally {
      abort.abort(new Error("enough"));
    }
    await assert.rejects(following, /enough/);

    // Breaking out ends the loop; the next call works.
    let n = 0;
    for await (const _ of client.events(run, { follow: true })) {
      if (++n === 3) break;
    }
    assert.equal(n, 3);
    assert.equal((await client.getRun(run)).status, "finished");

    // An ended run has nothing to resume.
    await assert.rejects(client.resume(run), (e: unknown) => {
      assert.ok(e instanceof CairnError);
      assert.equal(e.status, 409);
      assert.equal(e.code, "conflict");
      return true;
    });
  });

  test("following survives a server restart", async () => {
    // The server stops mid-run and starts again on the same port and
    // store: the follower reconnects from its last seq, every event once.
    const run = await client.startRun("gated");
    await waitFor(client, run, "waiting-approval");
    const seen: Event[] = [];
    const abort = new AbortController();
    let finished = false;
    const following = (async () => {
      for await (const ev of client.events(run, { signal: abort.signal })) seen.push(ev);
    })().finally(() => (finished = true));
    // Awaited below; a failing assertion must not leave it unhandled.
    following.catch(() => {});
    try {
      await sleep(500);
      const before = seen.length;
      assert.ok(before > 0, "the follower saw nothing before the restart");
      await server.stop();
      await sleep(300);
      assert.equal(finished, false, "the follower ended when the server stopped");
      await server.start();
      await waitFor(client, run, "waiting-approval");
      await client.approve(run, "gate", { by: "node-test" });
      const deadline = Date.now() + 60_000;
      while (!finished && Date.now() < deadline) await sleep(50);
      assert.ok(finished, "the follower never saw the end");
      assert.ok(seen.length > before);
    } finally {
      abort.abort(new Error("the test ended"));
    }
    await following;
    const seqs = seen.map((e) => e.seq);
    assert.deepEqual(seqs, range(1, seqs.length));
    assert.equal(seen[seen.length - 1]?.type, "RunFinished");
    const starts = seen.filter((e) => e.type === "RunStarted");
    assert.equal(starts.length, 2);
    assert.ok(starts[1]?.type === "RunStarted" && starts[1].resumed === true);
    assertContract(seen);
    const state = await client.getRun(run);
    assert.equal(state.status, "finished");
    assert.equal(state.lastSeq, seqs[seqs.length - 1]);
  });
});

describe("a server with a token", { skip: skipServer, timeout: 60_000 }, () => {
  let server: Server;

  before(async () => {
    server = await Server.start("s3cret-token");
  });

  after(async () => {
    await server?.close();
  });

  test("the token is sent as a bearer token", async () => {
    const anonymous = new CairnClient(server.url);
    await assert.rejects(anonymous.listRuns(), (e: unknown) => {
      assert.ok(e instanceof CairnError);
      assert.equal(e.status, 401);
      assert.equal(e.code, "unauthorized");
      return true;
    });
    const wrong = new CairnClient({ baseUrl: server.url, token: "nope" });
    await assert.rejects(collect(wrong.events("any")), (e: unknown) => e instanceof CairnError && e.status === 401);

    const client = new CairnClient({ baseUrl: `${server.url}/`, token: "s3cret-token" });
    const run = await client.startRun("gated");
    await waitFor(client, run, "waiting-approval");
    await client.approve(run, "gate");
    const events = await collect(client.events(run));
    assert.equal(events[events.length - 1]?.type, "RunFinished");
    assert.equal((await client.listRuns()).runs.length, 1);
  });
});
