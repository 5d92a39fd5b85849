"""The API's bodies as typed dictionaries, named as in the OpenAPI document
(`GET /openapi.json`); `tests/test_types.py` holds them to it."""


import sys
from typing import Any, Dict, List, Optional

if sys.version_info >= (3, 11):
    from typing import NotRequired, TypedDict
else:  # pragma: no cover
    from typing_extensions import NotRequired, TypedDict


class TokenTotals(TypedDict):
    """Tokens a run used, by kind."""

    input: int
    output: int
    cacheRead: int
    cacheWrite: int
    reasoning: int


class RunSummary(TypedDict):
    """One run as `GET /v1/runs` lists it."""

    runId: str
    workflow: str
    status: str
    createdMs: int
    updatedMs: int
    parentRunId: NotRequired[str]
    startedMs: NotRequired[int]
    endedMs: NotRequired[int]
    progress: NotRequired[float]
    tokens: NotRequired[TokenTotals]
    costUsd: NotRequired[float]
    instance: NotRequired[str]


class RunList(TypedDict):
    """A page of runs."""

    runs: List[RunSummary]
    limit: int
    offset: int
    nextOffset: NotRequired[int]


class Event(TypedDict, total=False):
    """One event of the contract (`EVENTS.md`): `type`, `runId`, `seq` and
    `timestampMs` always, then the scope's and the type's fields."""

    type: str
    runId: str
    seq: int
    timestampMs: int
    nodeId: str
    iteration: int
    attempt: int


#: A run's state (`GET /v1/runs/{id}`): its status, nodes, output or error.
RunState = Dict[str, Any]

TERMINAL = ("RunFinished", "RunFailed", "RunCancelled")
"""The event types that end a run's stream (unless it is followed across
resumes)."""


def is_terminal(event: Event) -> bool:
    """Whether `event` ends its run."""
    return event.get("type") in TERMINAL


__all__ = [
    "TokenTotals",
    "RunSummary",
    "RunList",
    "Event",
    "RunState",
    "TERMINAL",
    "is_terminal",
    "Optional",
]
