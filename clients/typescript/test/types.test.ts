// The declared bodies match the OpenAPI document a real server serves.
//
// Declarations vanish at run time, so the package keeps their keys as data
// (`SCHEMA_KEYS`, `EVENT_FIELDS`). The compile-time checks below hold those
// tables to the declarations (this file does not compile when they
// disagree); the tests hold them to the server's document.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  ENVELOPE_KEYS,
  EVENT_FIELDS,
  EVENT_TYPES,
  SCHEMA_KEYS,
  SCOPE_KEYS,
  TERMINAL,
  eventKeys,
  eventProblems,
  type AnswerRequest,
  type Answered,
  type ApiErrorInfo,
  type CancelAccepted,
  type CancelRequest,
  type ChildRun,
  type DecideRequest,
  type Decided,
  type ErrorBody,
  type ErrorInfo,
  type EventEnvelope,
  type EventOf,
  type EventType,
  type EventsPage,
  type ForkedFrom,
  type OpenRevert,
  type Question,
  type ReplayOf,
  type ResumeRequest,
  type Resumed,
  type RunAccepted,
  type RunFilterStatus,
  type RunList,
  type RunState,
  type RunSummary,
  type StartRunRequest,
  type TerminalEvent,
  type TokenTotals,
  type Trigger,
} from "cairn-client";

import { Server, skipServer } from "./server.js";

// ---------------------------------------------------------------------------
// Compile time: the tables are the declarations' keys.

type RequiredKeys<T> = { [K in keyof T]-?: {} extends Pick<T, K> ? never : K }[keyof T];
type OptionalKeys<T> = { [K in keyof T]-?: {} extends Pick<T, K> ? K : never }[keyof T];
type Equal<A, B> = (<G>() => G extends A ? 1 : 2) extends <G>() => G extends B ? 1 : 2 ? true : false;
/** Fails to compile, naming them, unless `T` (the names that disagree) is empty. */
type Assert<T extends never> = T;

interface Declared {
  TokenTotals: TokenTotals;
  RunSummary: RunSummary;
  RunList: RunList;
  RunState: RunState;
  ErrorInfo: ErrorInfo;
  ForkedFrom: ForkedFrom;
  Trigger: Trigger;
  ReplayOf: ReplayOf;
  Question: Question;
  ChildRun: ChildRun;
  OpenRevert: OpenRevert;
  EventEnvelope: EventEnvelope;
  EventsPage: EventsPage;
  StartRunRequest: StartRunRequest;
  RunAccepted: RunAccepted;
  DecideRequest: DecideRequest;
  Decided: Decided;
  AnswerRequest: AnswerRequest;
  Answered: Answered;
  CancelRequest: CancelRequest;
  CancelAccepted: CancelAccepted;
  ResumeRequest: ResumeRequest;
  Resumed: Resumed;
  ErrorBody: ErrorBody;
  ApiErrorInfo: ApiErrorInfo;
}

type Table = typeof SCHEMA_KEYS;
type SchemaMismatch =
  | {
      [N in keyof Table]: N extends keyof Declared
        ? Equal<RequiredKeys<Declared[N]>, Table[N]["required"][number]> extends true
          ? Equal<OptionalKeys<Declared[N]>, Table[N]["optional"][number]> extends true
            ? never
            : N
          : N
        : N;
    }[keyof Table]
  | Exclude<keyof Declared, keyof Table>;
export type SchemasMatch = Assert<SchemaMismatch>;

type Fields = typeof EVENT_FIELDS;
type ScopeOf<T extends EventType> = (typeof SCOPE_KEYS)[Fields[T]["scope"]];
type EventMismatch = {
  [T in EventType]: Equal<
    RequiredKeys<EventOf<T>>,
    (typeof ENVELOPE_KEYS)[number] | ScopeOf<T>["required"][number] | Fields[T]["required"][number]
  > extends true
    ? Equal<OptionalKeys<EventOf<T>>, ScopeOf<T>["optional"][number] | Fields[T]["optional"][number]> extends true
      ? never
      : T
    : T;
}[EventType];
export type EventsMatch = Assert<EventMismatch>;
export type EnvelopeIsEvents = Assert<Equal<keyof EventEnvelope, (typeof ENVELOPE_KEYS)[number]> extends true ? never : "EventEnvelope">;
export type TerminalMatches = Assert<
  Equal<(typeof TERMINAL)[number], TerminalEvent["type"]> extends true ? never : "TERMINAL"
>;

// Runtime lists of string unions, complete by construction (`satisfies`
// refuses a missing or an extra member).
const FILTER_STATUSES = Object.keys({
  queued: 1,
  running: 1,
  "waiting-approval": 1,
  "waiting-input": 1,
  finished: 1,
  failed: 1,
  cancelled: 1,
} satisfies Record<RunFilterStatus, 1>);
const TRIGGER_KINDS = Object.keys({ schedule: 1, webhook: 1 } satisfies Record<Trigger["kind"], 1>);
const MECHANISMS = Object.keys({ immediate: 1, graceful: 1 } satisfies Record<
  NonNullable<CancelAccepted["mechanism"]>,
  1
>);

// ---------------------------------------------------------------------------
// Run time: the tables are the server's document.

type Json = Record<string, any>;

/** Where each declared body is in the OpenAPI document. */
const WHERE: Record<keyof Table, string[]> = {
  TokenTotals: ["components", "schemas", "TokenTotals"],
  RunSummary: ["components", "schemas", "RunSummary"],
  RunList: ["paths", "/v1/runs", "get", "responses", "200", "content", "application/json", "schema"],
  RunState: ["components", "schemas", "RunState"],
  ErrorInfo: ["components", "schemas", "RunState", "properties", "error"],
  ForkedFrom: ["components", "schemas", "RunState", "properties", "forkedFrom"],
  Trigger: ["components", "schemas", "RunState", "properties", "trigger"],
  ReplayOf: ["components", "schemas", "RunState", "properties", "replayOf"],
  Question: ["components", "schemas", "RunState", "properties", "questions", "additionalProperties"],
  ChildRun: ["components", "schemas", "RunState", "properties", "children", "items"],
  OpenRevert: ["components", "schemas", "RunState", "properties", "openRevert"],
  EventEnvelope: ["components", "schemas", "Event"],
  EventsPage: ["paths", "/v1/runs/{id}/events", "get", "responses", "200", "content", "application/json", "schema"],
  StartRunRequest: ["paths", "/v1/runs", "post", "requestBody", "content", "application/json", "schema"],
  RunAccepted: ["paths", "/v1/runs", "post", "responses", "201", "content", "application/json", "schema"],
  DecideRequest: body("/v1/runs/{id}/approvals/{node}"),
  Decided: answer("/v1/runs/{id}/approvals/{node}", "200"),
  AnswerRequest: body("/v1/runs/{id}/inputs/{requestId}"),
  Answered: answer("/v1/runs/{id}/inputs/{requestId}", "200"),
  CancelRequest: body("/v1/runs/{id}/cancel"),
  CancelAccepted: answer("/v1/runs/{id}/cancel", "202"),
  ResumeRequest: body("/v1/runs/{id}/resume"),
  Resumed: answer("/v1/runs/{id}/resume", "202"),
  ErrorBody: ["components", "schemas", "Error"],
  ApiErrorInfo: ["components", "schemas", "Error", "properties", "error"],
};

function body(path: string): string[] {
  return ["paths", path, "post", "requestBody", "content", "application/json", "schema"];
}

function answer(path: string, status: string): string[] {
  return ["paths", path, "post", "responses", status, "content", "application/json", "schema"];
}

/** The schema at `where`, its `$ref`s followed. */
function schemaAt(doc: Json, where: string[]): Json {
  let node: any = doc;
  for (const step of where) {
    node = resolveRef(doc, node);
    assert.ok(node && step in node, `the document has no ${where.join(" > ")} (at ${step})`);
    node = node[step];
  }
  return resolveRef(doc, node);
}

function resolveRef(doc: Json, node: any): any {
  while (node && typeof node === "object" && typeof node.$ref === "string") {
    const path = (node.$ref as string).replace(/^#\//, "").split("/");
    node = path.reduce((n: any, k) => n?.[k.replace(/~1/g, "/").replace(/~0/g, "~")], doc);
  }
  return node;
}

const sorted = (xs: readonly string[]): string[] => [...xs].sort();

describe("the declarations match the server's OpenAPI document", { skip: skipServer, timeout: 60_000 }, () => {
  let server: Server;
  let doc: Json;

  before(async () => {
    server = await Server.start();
    const resp = await fetch(`${server.url}/openapi.json`);
    assert.equal(resp.status, 200);
    doc = (await resp.json()) as Json;
  });

  after(async () => {
    await server?.close();
  });

  for (const name of Object.keys(SCHEMA_KEYS) as (keyof Table)[]) {
    test(name, () => {
      const s = schemaAt(doc, WHERE[name]);
      const keys: { required: readonly string[]; optional: readonly string[] } = SCHEMA_KEYS[name];
      const properties = Object.keys(s["properties"] ?? {});
      const required: string[] = s["required"] ?? [];
      assert.deepEqual(sorted([...keys.required, ...keys.optional]), sorted(properties), `${name}: keys`);
      assert.deepEqual(sorted(keys.required), sorted(required), `${name}: required keys`);
    });
  }

  test("the event types are the document's, in its order", () => {
    const params: Json[] = schemaAt(doc, ["paths", "/v1/runs/{id}/events", "get"])["parameters"];
    const type = params.find((p) => p["name"] === "type");
    assert.ok(type, "GET /v1/runs/{id}/events has no `type` parameter");
    assert.deepEqual(EVENT_TYPES, resolveRef(doc, type["schema"])["items"]["enum"]);
  });

  test("the enumerations are the document's", () => {
    const params: Json[] = schemaAt(doc, ["paths", "/v1/runs", "get"])["parameters"];
    const status = params.find((p) => p["name"] === "status");
    assert.deepEqual(sorted(FILTER_STATUSES), sorted(status?.["schema"]?.["enum"] ?? []));
    assert.deepEqual(
      sorted(TRIGGER_KINDS),
      sorted(schemaAt(doc, [...WHERE.Trigger, "properties", "kind"])["enum"]),
    );
    assert.deepEqual(
      sorted(MECHANISMS),
      sorted(schemaAt(doc, [...WHERE.CancelAccepted, "properties", "mechanism"])["enum"]),
    );
  });
});

describe("the event table", () => {
  test("composes the envelope, the scope and the type's fields", () => {
    assert.deepEqual(eventKeys("NodeStarted"), {
      required: ["type", "runId", "seq", "timestampMs", "nodeId", "iteration", "attempt"],
      allowed: ["type", "runId", "seq", "timestampMs", "nodeId", "iteration", "attempt", "chapter", "snapshot"],
    });
    assert.equal(eventKeys("NoSuchEvent"), undefined);
    assert.equal(eventKeys("toString"), undefined);
    assert.equal(EVENT_TYPES.length, 58);
  });

  test("finds what is wrong with an event", () => {
    const ok = { type: "RunCancelled", runId: "r", seq: 3, timestampMs: 1 };
    assert.deepEqual(eventProblems(ok), []);
    assert.deepEqual(eventProblems({ ...ok, reason: "x" }), []);
    assert.deepEqual(eventProblems({ ...ok, nodeId: "a" }), ["RunCancelled has `nodeId`, which its type does not"]);
    assert.deepEqual(eventProblems({ type: "RunCancelled", runId: "r", timestampMs: 1 }), ["RunCancelled lacks `seq`"]);
    assert.deepEqual(eventProblems({ ...ok, type: "Nope" }), ['unknown event type "Nope"']);
    assert.deepEqual(eventProblems(null), ["not an object"]);
  });
});
