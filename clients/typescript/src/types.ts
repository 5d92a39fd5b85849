/**
 * The API's bodies, named as in the OpenAPI document the server serves
 * (`GET /openapi.json`), and its events, as the event contract lists them.
 * These declarations vanish at run time, so `schema.ts` keeps their keys as
 * data, and the tests hold both to the document of a real server.
 *
 * @packageDocumentation
 */

/** A run's status as the log tells it (`RunStatusChanged`). */
export type RunStatus =
  | "running"
  | "waiting-approval"
  | "waiting-input"
  | "finished"
  | "failed"
  | "cancelled";

/**
 * What `GET /v1/runs?status=` filters on: a run's status, or `queued` for a
 * run of a shared store that no instance has claimed yet.
 */
export type RunFilterStatus = RunStatus | "queued";

/** Tokens of every model call so far, by kind. */
export interface TokenTotals {
  input: number;
  output: number;
  cacheRead: number;
  cacheWrite: number;
  reasoning: number;
}

/** One run as `GET /v1/runs` lists it: its record, and what its log says. */
export interface RunSummary {
  runId: string;
  workflow: string;
  /** A {@link RunFilterStatus}, or `pending` before the log has one. */
  status: string;
  createdMs: number;
  updatedMs: number;
  parentRunId?: string;
  /** When the run first started (its first `RunStarted`), Unix ms. */
  startedMs?: number;
  /** When it ended; absent while it runs or waits. */
  endedMs?: number;
  /** Finished, failed and skipped nodes over the nodes mounted so far, 0 to 1. */
  progress?: number;
  tokens?: TokenTotals;
  costUsd?: number;
  /** The instance that drives the run now, while one holds its lease. */
  instance?: string;
}

/** A page of runs, newest first. */
export interface RunList {
  runs: RunSummary[];
  limit: number;
  offset: number;
  /** The `offset` of the next page, when there is one. */
  nextOffset?: number;
}

/** Why something failed: the `error` of failure events and of a run's state. */
export interface ErrorInfo {
  kind: string;
  message: string;
  details?: unknown;
}

/** Where a forked run's log was copied from. */
export interface ForkedFrom {
  runId: string;
  /** The last of its events the fork's log copies. */
  seq: number;
}

/** The schedule or webhook that started a run nobody started by hand. */
export interface Trigger {
  kind: "schedule" | "webhook";
  /** The schedule's or the hook's name. */
  name: string;
  /** The due time a schedule fired for (Unix ms). */
  dueMs?: number;
  /** The webhook delivery's idempotency key. */
  deliveryId?: string;
}

/** The run a replay was made of (`cairn replay`). */
export interface ReplayOf {
  runId: string;
  /** What the original never asked went to the model or the person. */
  live?: boolean;
  /** Tools and commands ran (`real`) or answered from the record. */
  tools?: "real" | "recorded";
}

/** What a step that opens a conversation was asked. */
export interface StepPrompt {
  system?: string;
  user: string;
  /** Each tool offered, with the hash of its description and parameters. */
  tools: { name: string; hash: string }[];
}

/** A question asked of people, as a run's state keeps it. */
export interface Question {
  nodeId: string;
  iteration: number;
  prompt: string;
  /** The JSON Schema an answer must match. */
  schema?: unknown;
  /** The answer, once given. */
  answer?: unknown;
  answeredBy?: string;
}

/** A child run its parent started (a `workflow` node, a delegate). */
export interface ChildRun {
  runId: string;
  nodeId: string;
  iteration: number;
  /** The delegate's name, or `workflow` for a workflow node. */
  agent: string;
  /** The child's workflow file. */
  workflow: string;
  /** How it ended, as the parent's log says. */
  status?: string;
  /** The child's own status now. */
  state?: string;
}

/** A revert started and not finished. */
export interface OpenRevert {
  nodeId: string;
  iteration: number;
  attempt: number;
  snapshot: string;
}

/** One attempt of a node pass. */
export interface AttemptState {
  attempt: number;
  startedMs: number;
  endedMs?: number;
  status: "running" | "finished" | "failed" | "cancelled";
  error?: ErrorInfo;
  toolCalls: number;
}

/**
 * One node pass (`nodeId`, `iteration`) of a run's state. The OpenAPI
 * document leaves these objects open; the fields below are those the
 * server's fold of the log writes, each optional one only when it applies.
 */
export interface NodeState {
  nodeId: string;
  iteration: number;
  status:
    | "pending"
    | "running"
    | "retrying"
    | "waiting-approval"
    | "waiting-input"
    | "finished"
    | "failed"
    | "skipped"
    | "cancelled";
  chapter?: string;
  layerIndex?: number;
  /** The latest attempt number (0 before the first start). */
  attempt: number;
  attempts: AttemptState[];
  output?: unknown;
  durationMs?: number;
  error?: ErrorInfo;
  reason?: string;
  approvalMessage?: string;
  decision?: { approved: boolean; by?: string; note?: string };
  inputRequestId?: string;
  agent?: {
    step: number;
    model: string;
    toolCalls: number;
    inputTokens: number;
    outputTokens: number;
    costUsd?: number;
    lastLine: string;
  };
  scores?: Array<{
    scorerId: string;
    scorerName: string;
    status: string;
    score?: number;
    reason?: string;
    error?: ErrorInfo;
  }>;
  snapshots?: Array<{ attempt: number; snapshot: string }>;
  firstSeq: number;
}

/**
 * A run's state (`GET /v1/runs/{id}`): the server's fold of the run's log.
 * Optional fields are absent until the log sets them.
 */
export interface RunState {
  runId: string;
  /** The instance that drives the run now, while one holds its lease. */
  instance?: string;
  workflow: string;
  /** SHA-256 hex of the workflow file's text. */
  workflowHash?: string;
  input?: unknown;
  /**
   * A {@link RunStatus}; before the log has one, the store's: `queued` or
   * `pending`.
   */
  status: string;
  startedMs?: number;
  /** When the latest resume began; absent for a run never resumed. */
  resumedMs?: number;
  endedMs?: number;
  /** The run's output, once finished. */
  output?: unknown;
  /** Why it failed. */
  error?: ErrorInfo;
  /** The reason of a cancel asked for and not yet done. */
  cancelRequested?: string;
  /** Times it was resumed. */
  resumes: number;
  /** The seq of the last event folded. */
  lastSeq: number;
  frameNo: number;
  /** Nodes mounted so far. */
  mounted: number;
  tokens: TokenTotals;
  costUsd?: number;
  toolCalls: number;
  /** Each node pass, in the order they were mounted. */
  nodes: NodeState[];
  /** The questions asked of people, by request id. */
  questions?: Record<string, Question>;
  parentRunId?: string;
  parentNodeId?: string;
  /** How many parents it has. */
  depth: number;
  /** The child runs it started, in order. */
  children?: ChildRun[];
  /** The generation of the workflow it uses (reloads); absent for 0. */
  generation?: number;
  forkedFrom?: ForkedFrom;
  trigger?: Trigger;
  replayOf?: ReplayOf;
  /** Agent nodes a person asked to take over. */
  hijackRequested?: string[];
  openRevert?: OpenRevert;
  /** Finished, failed and skipped nodes over the nodes mounted so far, 0 to 1. */
  progress: number;
  /** Node passes by status. */
  counts: Record<string, number>;
}

/** A page of a run's log (`GET /v1/runs/{id}/events`). */
export interface EventsPage {
  runId: string;
  events: Event[];
  /** The `after` of the next page, when there is one. */
  nextAfter?: number;
}

/** The body of `POST /v1/runs`. */
export interface StartRunRequest {
  /** A workflow of the server's workflows folder, by name (never a path). */
  workflow: string;
  /** Checked against the workflow's input schema; `{}` when left out. */
  input?: unknown;
  runId?: string | null;
  maxConcurrency?: number | null;
}

/** What `POST /v1/runs` answers: the new run's id. */
export interface RunAccepted {
  runId: string;
}

/** The body of `POST /v1/runs/{id}/approvals/{node}`. */
export interface DecideRequest {
  approved: boolean;
  note?: string | null;
  by?: string | null;
}

/**
 * What a decision answers. The OpenAPI document requires none of its
 * fields, so neither does this type; the server sends them all.
 */
export interface Decided {
  runId?: string;
  nodeId?: string;
  approved?: boolean;
}

/** The body of `POST /v1/runs/{id}/inputs/{requestId}`. */
export interface AnswerRequest {
  /** The answer, checked against the question's schema. */
  value: unknown;
  by?: string | null;
}

/** What an answer answers (every field optional, as the document says). */
export interface Answered {
  runId?: string;
  requestId?: string;
}

/** The body of `POST /v1/runs/{id}/cancel`. */
export interface CancelRequest {
  /** Let running nodes finish (nothing new starts) instead of killing them now. */
  graceful?: boolean;
  reason?: string | null;
  by?: string | null;
}

/** What a cancel answers (every field optional, as the document says). */
export interface CancelAccepted {
  runId?: string;
  mechanism?: "immediate" | "graceful";
}

/** The body of `POST /v1/runs/{id}/resume`. */
export interface ResumeRequest {
  maxConcurrency?: number | null;
}

/** What a resume answers (every field optional, as the document says). */
export interface Resumed {
  runId?: string;
}

/** The `error` of an error body. */
export interface ApiErrorInfo {
  /** Stable and machine-readable: `not_found`, `conflict`, ... */
  code: string;
  /** For people. */
  message: string;
  /** Where each problem is, for some codes. */
  details?: unknown;
}

/** Every refusal's body: `{"error": {"code", "message", "details"?}}`. */
export interface ErrorBody {
  error: ApiErrorInfo;
}

// ---------------------------------------------------------------------------
// Events

/** The fields every event has. */
export interface EventEnvelope {
  /** The event type, from the contract's catalog. */
  type: string;
  /** The run whose log holds it. */
  runId: string;
  /** Its place in the run's log: from 1, +1 per event, across resumes. */
  seq: number;
  /** When it was appended, Unix ms. */
  timestampMs: number;
}

/** The envelope of one event type. */
interface Base<T extends string> extends EventEnvelope {
  type: T;
}

/** The fields of an event about one node pass. */
export interface NodeScope {
  /** The node's path (`review.fix` inside the group `review`). */
  nodeId: string;
  /** 0 outside loops; counts loop passes from 0. */
  iteration: number;
  /** The named stage the node belongs to, if any. */
  chapter?: string;
}

/** The fields of an event about one attempt of a node pass. */
export interface AttemptScope extends NodeScope {
  /** From 1. */
  attempt: number;
}

// Run lifecycle

/** A run started, or a resume of it did. */
export interface RunStartedEvent extends Base<"RunStarted"> {
  workflow: string;
  workflowHash: string;
  input?: unknown;
  /** Whether this start is a resume. */
  resumed: boolean;
  parentRunId?: string;
  parentNodeId?: string;
  depth: number;
  forkedFrom?: ForkedFrom;
  trigger?: Trigger;
  replayOf?: ReplayOf;
}

/** The run's status changed. */
export interface RunStatusChangedEvent extends Base<"RunStatusChanged"> {
  status: RunStatus;
}

/** Someone asked for the run to be cancelled. */
export interface RunCancelRequestedEvent extends Base<"RunCancelRequested"> {
  reason?: string;
  requestedBy?: string;
  mechanism: "immediate" | "graceful";
}

/** What the run did, just before it ends. */
export interface RunSummaryEvent extends Base<"RunSummary"> {
  durationMs: number;
  nodes: { finished: number; failed: number; skipped: number; cancelled: number };
  tokens: TokenTotals;
  costUsd?: number;
  /** Longest first. */
  timings: Array<{ nodeId: string; iteration: number; durationMs: number }>;
}

/** The run finished (terminal). */
export interface RunFinishedEvent extends Base<"RunFinished"> {
  output?: unknown;
  durationMs: number;
}

/** The run failed (terminal). */
export interface RunFailedEvent extends Base<"RunFailed"> {
  error: ErrorInfo;
}

/** The run was cancelled (terminal). */
export interface RunCancelledEvent extends Base<"RunCancelled"> {
  reason?: string;
}

// Plan

/** A new plan of the run was mounted. */
export interface FrameCommittedEvent extends Base<"FrameCommitted"> {
  frameNo: number;
  /** SHA-256 hex of the canonical XML of the mounted plan. */
  xmlHash: string;
  /** Nodes mounted. */
  mounted: number;
}

/** The first node of a layer started. */
export interface LayerStartedEvent extends Base<"LayerStarted"> {
  layerIndex: number;
  nodeCount: number;
}

/** Every node of a layer mounted so far has ended. */
export interface LayerFinishedEvent extends Base<"LayerFinished"> {
  layerIndex: number;
  durationMs: number;
  succeeded: number;
  failed: number;
  skipped: number;
  /**
   * Nodes cancelled (by a cancel, a failing run, or unmounted), counted
   * apart from the skipped ones. Servers send it; the contract's table
   * does not list it yet, and older logs lack it.
   */
  cancelled?: number;
}

/** A dependency edge was followed. */
export interface EdgeTraversedEvent extends Base<"EdgeTraversed"> {
  from: string;
  to: string;
  condition?: string;
}

/** A switch chose its branch. */
export interface BranchResolvedEvent extends Base<"BranchResolved">, NodeScope {
  /** The label chosen. */
  chosen: string;
  candidates: string[];
}

/** A named stage began. */
export interface ChapterStartedEvent extends Base<"ChapterStarted"> {
  chapter: string;
}

/** A named stage ended. */
export interface ChapterFinishedEvent extends Base<"ChapterFinished"> {
  chapter: string;
  status: string;
}

// Node lifecycle

/** A node pass was mounted; it comes first, once. */
export interface NodePendingEvent extends Base<"NodePending">, NodeScope {
  layerIndex?: number;
}

/** An attempt started. */
export interface NodeStartedEvent extends Base<"NodeStarted">, AttemptScope {
  /** The workspace snapshot taken before the attempt (40 hex). */
  snapshot?: string;
}

/** A long attempt is still alive. */
export interface NodeHeartbeatEvent extends Base<"NodeHeartbeat">, AttemptScope {
  elapsedMs: number;
  timeoutMs?: number;
  percentElapsed?: number;
}

/** Output of an attempt, streamed. */
export interface NodeOutputEvent extends Base<"NodeOutput">, AttemptScope {
  text: string;
  stream: "stdout" | "stderr" | "text" | "reasoning";
}

/** An attempt finished. */
export interface NodeFinishedEvent extends Base<"NodeFinished">, AttemptScope {
  durationMs: number;
  output?: unknown;
  cached?: boolean;
  /** The workspace snapshot taken after the attempt. */
  snapshot?: string;
}

/** An attempt failed; `willRetry` says whether another follows. */
export interface NodeFailedEvent extends Base<"NodeFailed">, AttemptScope {
  error: ErrorInfo;
  willRetry: boolean;
  snapshot?: string;
}

/** Another attempt comes (`attempt` is the upcoming one). */
export interface NodeRetryingEvent extends Base<"NodeRetrying">, AttemptScope {
  delayMs: number;
}

/** A node pass will not run. */
export interface NodeSkippedEvent extends Base<"NodeSkipped">, NodeScope {
  reason: string;
}

/** A node pass was cancelled (`unmounted` when a re-render removed it). */
export interface NodeCancelledEvent extends Base<"NodeCancelled">, NodeScope {
  attempt?: number;
  reason?: string;
}

/** A gate waits for a person's decision. */
export interface NodeWaitingApprovalEvent extends Base<"NodeWaitingApproval">, NodeScope {}

/** A node waits for a person's answer. */
export interface NodeWaitingInputEvent extends Base<"NodeWaitingInput">, NodeScope {
  requestId: string;
}

// People in the loop

/** A gate asks for approval. */
export interface ApprovalRequestedEvent extends Base<"ApprovalRequested">, NodeScope {
  message?: string;
}

/** A gate was approved. */
export interface ApprovalGrantedEvent extends Base<"ApprovalGranted">, NodeScope {
  decidedBy?: string;
  note?: string;
}

/** A gate was denied. */
export interface ApprovalDeniedEvent extends Base<"ApprovalDenied">, NodeScope {
  decidedBy?: string;
  note?: string;
}

/** A node asks a question; answer it with `answer(run, requestId, value)`. */
export interface InputRequestedEvent extends Base<"InputRequested">, NodeScope {
  requestId: string;
  prompt: string;
  /** The JSON Schema an answer must match. */
  schema?: unknown;
}

/** A question was answered. */
export interface InputReceivedEvent extends Base<"InputReceived">, NodeScope {
  requestId: string;
  answer: unknown;
  answeredBy?: string;
}

// Agents and tools

/** An agent's model call began. */
export interface AgentStepStartedEvent extends Base<"AgentStepStarted">, AttemptScope {
  step: number;
  model: string;
  /** The workspace before this step. */
  snapshot?: string;
  /** SHA-256 of the request in canonical form: what a replay matches it by. */
  requestHash?: string;
  /** On a step that opens a conversation: its prompts and tools. */
  prompt?: StepPrompt;
}

/** The model's whole answer to one step. */
export interface AgentMessage {
  text?: string;
  reasoning?: string;
  toolCalls: Array<{ id: string; name: string; args: unknown }>;
}

/** An agent's model call ended. */
export interface AgentStepFinishedEvent extends Base<"AgentStepFinished">, AttemptScope {
  step: number;
  /** How many tool calls the model asked for. */
  toolCalls: number;
  finishReason: string;
  message: AgentMessage;
}

/** A model call was tried again. */
export interface AgentGenerationRetriedEvent extends Base<"AgentGenerationRetried">, AttemptScope {
  step: number;
  reason: string;
}

/** The conversation was made shorter to fit the model's context window. */
export interface AgentContextCompactedEvent extends Base<"AgentContextCompacted">, AttemptScope {
  step: number;
  strategy: "truncate-tool-results" | "summarize";
  tokensBefore: number;
  tokensAfter: number;
  /** The summary that replaces the older turns. */
  message?: string;
}

/** A step waits for its share of a limit the model's agents share. */
export interface AgentWaitingEvent extends Base<"AgentWaiting">, AttemptScope {
  step: number;
  model: string;
  reason: "concurrency" | "requests_per_minute" | "tokens_per_minute";
  waitMs?: number;
}

/** A raw event of an external agent. */
export interface AgentEventEvent extends Base<"AgentEvent">, AttemptScope {
  engine: string;
  event: unknown;
}

/** One model call's tokens (never cumulative). */
export interface TokenUsageReportedEvent extends Base<"TokenUsageReported">, AttemptScope {
  provider: string;
  model: string;
  inputTokens: number;
  outputTokens: number;
  cacheReadTokens?: number;
  cacheWriteTokens?: number;
  reasoningTokens?: number;
  costUsd?: number;
}

/** A tool call began. */
export interface ToolCallStartedEvent extends Base<"ToolCallStarted">, AttemptScope {
  toolName: string;
  /** From 1 within the attempt. */
  toolSeq: number;
  idempotencyKey: string;
  sideEffect: boolean;
}

/** A tool call ended. */
export interface ToolCallFinishedEvent extends Base<"ToolCallFinished">, AttemptScope {
  toolName: string;
  toolSeq: number;
  status: "success" | "error";
  durationMs: number;
  error?: ErrorInfo;
}

/** A child run was started for a delegate or a workflow node. */
export interface DelegationStartedEvent extends Base<"DelegationStarted">, AttemptScope {
  childRunId: string;
  /** The delegate's name, or `workflow`. */
  agent: string;
  workflow: string;
}

/** A child run ended. */
export interface DelegationFinishedEvent extends Base<"DelegationFinished">, AttemptScope {
  childRunId: string;
  status: string;
}

// Runtime

/** An MCP server is being started. */
export interface McpServerStartingEvent extends Base<"McpServerStarting"> {
  server: string;
  command: string;
  args: string[];
}

/** An MCP server answered. */
export interface McpServerConnectedEvent extends Base<"McpServerConnected"> {
  server: string;
  toolCount: number;
  startMs: number;
}

/** A line an MCP server wrote to stderr. */
export interface McpServerStderrEvent extends Base<"McpServerStderr"> {
  server: string;
  message: string;
}

/** An MCP server went away. */
export interface McpServerDisconnectedEvent extends Base<"McpServerDisconnected"> {
  server: string;
  reason?: string;
}

/** A network access of an attempt, let through or blocked. */
export interface NetworkAccessEvent extends Base<"NetworkAccess">, AttemptScope {
  action: "allowed" | "blocked";
  target: string;
  reason: string;
}

/** Something the engine wants people to know. */
export interface DiagnosticEvent extends Base<"Diagnostic"> {
  level: "debug" | "info" | "warn" | "error";
  source: string;
  message: string;
  nodeId?: string;
}

// Workspace, reload, scoring

/** The files are being put back as they were before an attempt. */
export interface RevertStartedEvent extends Base<"RevertStarted">, AttemptScope {
  snapshot: string;
}

/** A revert ended. */
export interface RevertFinishedEvent extends Base<"RevertFinished">, AttemptScope {
  snapshot: string;
  success: boolean;
  error?: ErrorInfo;
}

/** The workflow's files changed. */
export interface WorkflowReloadDetectedEvent extends Base<"WorkflowReloadDetected"> {
  changedFiles: string[];
}

/** The run now uses the changed workflow. */
export interface WorkflowReloadedEvent extends Base<"WorkflowReloaded"> {
  generation: number;
  changedFiles: string[];
}

/** The changed workflow could not be loaded. */
export interface WorkflowReloadFailedEvent extends Base<"WorkflowReloadFailed"> {
  error: ErrorInfo;
  changedFiles: string[];
}

/** The change cannot be applied to a run under way. */
export interface WorkflowReloadUnsafeEvent extends Base<"WorkflowReloadUnsafe"> {
  reason: string;
  changedFiles: string[];
}

/** A scorer began on a node's output. */
export interface ScorerStartedEvent extends Base<"ScorerStarted">, NodeScope {
  scorerId: string;
  scorerName: string;
}

/** A scorer gave its score. */
export interface ScorerFinishedEvent extends Base<"ScorerFinished">, NodeScope {
  scorerId: string;
  scorerName: string;
  score: number;
  reason?: string;
}

/** A scorer failed (no score). */
export interface ScorerFailedEvent extends Base<"ScorerFailed">, NodeScope {
  scorerId: string;
  scorerName: string;
  error: ErrorInfo;
}

/** A person asked to take over an agent node (`nodeId` is a field here, not a scope). */
export interface RunHijackRequestedEvent extends Base<"RunHijackRequested"> {
  nodeId: string;
  requestedBy?: string;
}

/** A person took an agent's conversation, and handed it back or ended it. */
export interface RunHijackedEvent extends Base<"RunHijacked">, AttemptScope {
  engine: string;
  mode: "interactive";
  /** Handed back to the agent (true), or ended by the person. */
  resumed: boolean;
  cwd?: string;
}

/**
 * One event of a run's log: a union over `type`, so that a `switch` on
 * `event.type` narrows to the type's fields. Events are the contract's
 * JSON as stored; absent optional fields are left out, never `null`.
 */
export type Event =
  | RunStartedEvent
  | RunStatusChangedEvent
  | RunCancelRequestedEvent
  | RunSummaryEvent
  | RunFinishedEvent
  | RunFailedEvent
  | RunCancelledEvent
  | FrameCommittedEvent
  | LayerStartedEvent
  | LayerFinishedEvent
  | EdgeTraversedEvent
  | BranchResolvedEvent
  | ChapterStartedEvent
  | ChapterFinishedEvent
  | NodePendingEvent
  | NodeStartedEvent
  | NodeHeartbeatEvent
  | NodeOutputEvent
  | NodeFinishedEvent
  | NodeFailedEvent
  | NodeRetryingEvent
  | NodeSkippedEvent
  | NodeCancelledEvent
  | NodeWaitingApprovalEvent
  | NodeWaitingInputEvent
  | ApprovalRequestedEvent
  | ApprovalGrantedEvent
  | ApprovalDeniedEvent
  | InputRequestedEvent
  | InputReceivedEvent
  | AgentStepStartedEvent
  | AgentStepFinishedEvent
  | AgentGenerationRetriedEvent
  | AgentContextCompactedEvent
  | AgentWaitingEvent
  | AgentEventEvent
  | TokenUsageReportedEvent
  | ToolCallStartedEvent
  | ToolCallFinishedEvent
  | DelegationStartedEvent
  | DelegationFinishedEvent
  | McpServerStartingEvent
  | McpServerConnectedEvent
  | McpServerStderrEvent
  | McpServerDisconnectedEvent
  | NetworkAccessEvent
  | DiagnosticEvent
  | RevertStartedEvent
  | RevertFinishedEvent
  | WorkflowReloadDetectedEvent
  | WorkflowReloadedEvent
  | WorkflowReloadFailedEvent
  | WorkflowReloadUnsafeEvent
  | ScorerStartedEvent
  | ScorerFinishedEvent
  | ScorerFailedEvent
  | RunHijackRequestedEvent
  | RunHijackedEvent;

/** Every event type of the contract. */
export type EventType = Event["type"];

/** The event of one type: `EventOf<"NodeFailed">` is {@link NodeFailedEvent}. */
export type EventOf<T extends EventType> = Extract<Event, { type: T }>;

/** The events that end a run (until a resume's `RunStarted`). */
export type TerminalEvent = RunFinishedEvent | RunFailedEvent | RunCancelledEvent;
