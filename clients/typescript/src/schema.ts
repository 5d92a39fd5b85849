/**
 * The keys of the declarations in `types.ts`, as data. Types vanish at run
 * time; these tables do not, so a test can hold them to the OpenAPI
 * document a real server serves and to the events it sends, and a
 * compile-time test holds them to the declarations.
 *
 * @packageDocumentation
 */

import type { EventType, TerminalEvent } from "./types.js";

/** The required and optional keys of one body. */
export interface Keys {
  readonly required: readonly string[];
  readonly optional: readonly string[];
}

/**
 * The keys of each body that the OpenAPI document describes, by the name
 * of its declaration in `types.ts`.
 */
export const SCHEMA_KEYS = {
  TokenTotals: {
    required: ["input", "output", "cacheRead", "cacheWrite", "reasoning"],
    optional: [],
  },
  RunSummary: {
    required: ["runId", "workflow", "status", "createdMs", "updatedMs"],
    optional: ["parentRunId", "startedMs", "endedMs", "progress", "tokens", "costUsd", "instance"],
  },
  RunList: {
    required: ["runs", "limit", "offset"],
    optional: ["nextOffset"],
  },
  RunState: {
    required: [
      "runId",
      "workflow",
      "status",
      "resumes",
      "lastSeq",
      "frameNo",
      "mounted",
      "tokens",
      "toolCalls",
      "nodes",
      "depth",
      "progress",
      "counts",
    ],
    optional: [
      "instance",
      "workflowHash",
      "input",
      "startedMs",
      "resumedMs",
      "endedMs",
      "output",
      "error",
      "cancelRequested",
      "costUsd",
      "questions",
      "parentRunId",
      "parentNodeId",
      "children",
      "generation",
      "forkedFrom",
      "trigger",
      "replayOf",
      "hijackRequested",
      "openRevert",
    ],
  },
  ErrorInfo: { required: ["kind", "message"], optional: ["details"] },
  ForkedFrom: { required: ["runId", "seq"], optional: [] },
  Trigger: { required: ["kind", "name"], optional: ["dueMs", "deliveryId"] },
  ReplayOf: { required: ["runId"], optional: ["live", "tools"] },
  Question: {
    required: ["nodeId", "iteration", "prompt"],
    optional: ["schema", "answer", "answeredBy"],
  },
  ChildRun: {
    required: ["runId", "nodeId", "iteration", "agent", "workflow"],
    optional: ["status", "state"],
  },
  OpenRevert: { required: ["nodeId", "iteration", "attempt", "snapshot"], optional: [] },
  EventEnvelope: { required: ["type", "runId", "seq", "timestampMs"], optional: [] },
  EventsPage: { required: ["runId", "events"], optional: ["nextAfter"] },
  StartRunRequest: { required: ["workflow"], optional: ["input", "runId", "maxConcurrency"] },
  RunAccepted: { required: ["runId"], optional: [] },
  DecideRequest: { required: ["approved"], optional: ["note", "by"] },
  Decided: { required: [], optional: ["runId", "nodeId", "approved"] },
  AnswerRequest: { required: ["value"], optional: ["by"] },
  Answered: { required: [], optional: ["runId", "requestId"] },
  CancelRequest: { required: [], optional: ["graceful", "reason", "by"] },
  CancelAccepted: { required: [], optional: ["runId", "mechanism"] },
  ResumeRequest: { required: [], optional: ["maxConcurrency"] },
  Resumed: { required: [], optional: ["runId"] },
  ErrorBody: { required: ["error"], optional: [] },
  ApiErrorInfo: { required: ["code", "message"], optional: ["details"] },
} as const satisfies Record<string, Keys>;

/** Which fields beyond the envelope an event's scope adds. */
export type Scope = "run" | "node" | "attempt";

/** One event type's scope and own fields. */
export interface EventFields extends Keys {
  readonly scope: Scope;
}

/**
 * Every event type of the contract, in the contract's order, with its
 * scope and its own fields. Node-scoped events add `nodeId` and
 * `iteration` (and `chapter` inside a named stage); attempt-scoped events
 * add `attempt` too.
 */
export const EVENT_FIELDS = {
  RunStarted: {
    scope: "run",
    required: ["workflow", "workflowHash", "resumed", "depth"],
    optional: ["input", "parentRunId", "parentNodeId", "forkedFrom", "trigger", "replayOf"],
  },
  RunStatusChanged: { scope: "run", required: ["status"], optional: [] },
  RunCancelRequested: { scope: "run", required: ["mechanism"], optional: ["reason", "requestedBy"] },
  RunSummary: {
    scope: "run",
    required: ["durationMs", "nodes", "tokens", "timings"],
    optional: ["costUsd"],
  },
  RunFinished: { scope: "run", required: ["durationMs"], optional: ["output"] },
  RunFailed: { scope: "run", required: ["error"], optional: [] },
  RunCancelled: { scope: "run", required: [], optional: ["reason"] },

  FrameCommitted: { scope: "run", required: ["frameNo", "xmlHash", "mounted"], optional: [] },
  LayerStarted: { scope: "run", required: ["layerIndex", "nodeCount"], optional: [] },
  LayerFinished: {
    scope: "run",
    required: ["layerIndex", "durationMs", "succeeded", "failed", "skipped"],
    optional: ["cancelled"],
  },
  EdgeTraversed: { scope: "run", required: ["from", "to"], optional: ["condition"] },
  BranchResolved: { scope: "node", required: ["chosen", "candidates"], optional: [] },
  ChapterStarted: { scope: "run", required: ["chapter"], optional: [] },
  ChapterFinished: { scope: "run", required: ["chapter", "status"], optional: [] },

  NodePending: { scope: "node", required: [], optional: ["layerIndex"] },
  NodeStarted: { scope: "attempt", required: [], optional: ["snapshot"] },
  NodeHeartbeat: {
    scope: "attempt",
    required: ["elapsedMs"],
    optional: ["timeoutMs", "percentElapsed"],
  },
  NodeOutput: { scope: "attempt", required: ["text", "stream"], optional: [] },
  NodeFinished: {
    scope: "attempt",
    required: ["durationMs"],
    optional: ["output", "cached", "snapshot"],
  },
  NodeFailed: { scope: "attempt", required: ["error", "willRetry"], optional: ["snapshot"] },
  NodeRetrying: { scope: "attempt", required: ["delayMs"], optional: [] },
  NodeSkipped: { scope: "node", required: ["reason"], optional: [] },
  NodeCancelled: { scope: "node", required: [], optional: ["attempt", "reason"] },
  NodeWaitingApproval: { scope: "node", required: [], optional: [] },
  NodeWaitingInput: { scope: "node", required: ["requestId"], optional: [] },

  ApprovalRequested: { scope: "node", required: [], optional: ["message"] },
  ApprovalGranted: { scope: "node", required: [], optional: ["decidedBy", "note"] },
  ApprovalDenied: { scope: "node", required: [], optional: ["decidedBy", "note"] },
  InputRequested: { scope: "node", required: ["requestId", "prompt"], optional: ["schema"] },
  InputReceived: { scope: "node", required: ["requestId", "answer"], optional: ["answeredBy"] },

  AgentStepStarted: {
    scope: "attempt",
    required: ["step", "model"],
    optional: ["snapshot", "requestHash", "prompt"],
  },
  AgentStepFinished: {
    scope: "attempt",
    required: ["step", "toolCalls", "finishReason", "message"],
    optional: [],
  },
  AgentGenerationRetried: { scope: "attempt", required: ["step", "reason"], optional: [] },
  AgentContextCompacted: {
    scope: "attempt",
    required: ["step", "strategy", "tokensBefore", "tokensAfter"],
    optional: ["message"],
  },
  AgentWaiting: { scope: "attempt", required: ["step", "model", "reason"], optional: ["waitMs"] },
  AgentEvent: { scope: "attempt", required: ["engine", "event"], optional: [] },
  TokenUsageReported: {
    scope: "attempt",
    required: ["provider", "model", "inputTokens", "outputTokens"],
    optional: ["cacheReadTokens", "cacheWriteTokens", "reasoningTokens", "costUsd"],
  },
  ToolCallStarted: {
    scope: "attempt",
    required: ["toolName", "toolSeq", "idempotencyKey", "sideEffect"],
    optional: [],
  },
  ToolCallFinished: {
    scope: "attempt",
    required: ["toolName", "toolSeq", "status", "durationMs"],
    optional: ["error"],
  },
  DelegationStarted: {
    scope: "attempt",
    required: ["childRunId", "agent", "workflow"],
    optional: [],
  },
  DelegationFinished: { scope: "attempt", required: ["childRunId", "status"], optional: [] },

  McpServerStarting: { scope: "run", required: ["server", "command", "args"], optional: [] },
  McpServerConnected: { scope: "run", required: ["server", "toolCount", "startMs"], optional: [] },
  McpServerStderr: { scope: "run", required: ["server", "message"], optional: [] },
  McpServerDisconnected: { scope: "run", required: ["server"], optional: ["reason"] },
  NetworkAccess: { scope: "attempt", required: ["action", "target", "reason"], optional: [] },
  Diagnostic: { scope: "run", required: ["level", "source", "message"], optional: ["nodeId"] },

  RevertStarted: { scope: "attempt", required: ["snapshot"], optional: [] },
  RevertFinished: { scope: "attempt", required: ["snapshot", "success"], optional: ["error"] },
  WorkflowReloadDetected: { scope: "run", required: ["changedFiles"], optional: [] },
  WorkflowReloaded: { scope: "run", required: ["generation", "changedFiles"], optional: [] },
  WorkflowReloadFailed: { scope: "run", required: ["error", "changedFiles"], optional: [] },
  WorkflowReloadUnsafe: { scope: "run", required: ["reason", "changedFiles"], optional: [] },
  ScorerStarted: { scope: "node", required: ["scorerId", "scorerName"], optional: [] },
  ScorerFinished: {
    scope: "node",
    required: ["scorerId", "scorerName", "score"],
    optional: ["reason"],
  },
  ScorerFailed: { scope: "node", required: ["scorerId", "scorerName", "error"], optional: [] },
  RunHijackRequested: { scope: "run", required: ["nodeId"], optional: ["requestedBy"] },
  RunHijacked: { scope: "attempt", required: ["engine", "mode", "resumed"], optional: ["cwd"] },
} as const satisfies Record<EventType, EventFields>;

/** The keys every event has. */
export const ENVELOPE_KEYS = ["type", "runId", "seq", "timestampMs"] as const;

/** The keys each scope adds beyond the envelope. */
export const SCOPE_KEYS = {
  run: { required: [], optional: [] },
  node: { required: ["nodeId", "iteration"], optional: ["chapter"] },
  attempt: { required: ["nodeId", "iteration", "attempt"], optional: ["chapter"] },
} as const satisfies Record<Scope, Keys>;

/** Every event type of the contract, in the contract's order. */
export const EVENT_TYPES = Object.keys(EVENT_FIELDS) as EventType[];

/** The event types that end a run's stream (unless it is followed across resumes). */
export const TERMINAL: readonly TerminalEvent["type"][] = ["RunFinished", "RunFailed", "RunCancelled"];

/** Whether `event` ends its run (until a resume starts it again). */
export function isTerminal(event: { type: string }): event is TerminalEvent {
  return (TERMINAL as readonly string[]).includes(event.type);
}

/**
 * Every key an event of `type` may have, and those it must have, from the
 * envelope, its scope and its own fields; `undefined` for a type the
 * contract does not list.
 */
export function eventKeys(type: string): { required: string[]; allowed: string[] } | undefined {
  if (!Object.prototype.hasOwnProperty.call(EVENT_FIELDS, type)) return undefined;
  const own: EventFields = EVENT_FIELDS[type as EventType];
  const scope: Keys = SCOPE_KEYS[own.scope];
  const required = [...ENVELOPE_KEYS, ...scope.required, ...own.required];
  return { required, allowed: [...required, ...scope.optional, ...own.optional] };
}

/**
 * What is wrong with `value` as an event of the contract, or an empty list:
 * a type the contract does not list, a missing required field, or a field
 * its type does not have.
 */
export function eventProblems(value: unknown): string[] {
  if (typeof value !== "object" || value === null) return ["not an object"];
  const ev = value as Record<string, unknown>;
  const keys = eventKeys(String(ev["type"]));
  if (!keys) return [`unknown event type ${JSON.stringify(ev["type"])}`];
  const problems: string[] = [];
  for (const k of keys.required) {
    if (!(k in ev)) problems.push(`${ev["type"]} lacks \`${k}\``);
  }
  for (const k of Object.keys(ev)) {
    if (!keys.allowed.includes(k)) problems.push(`${ev["type"]} has \`${k}\`, which its type does not`);
  }
  return problems;
}
