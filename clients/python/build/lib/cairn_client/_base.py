"""What the blocking and the asyncio clients share: the requests, as
data, and how an answer becomes a value or a [`CairnError`]."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional
from urllib.parse import quote

import httpx

from ._errors import CairnError

#: Seconds to wait between attempts to follow a run again, growing to the
#: last one.
RECONNECT_DELAYS = (0.1, 0.25, 0.5, 1.0, 2.0)

#: Failed attempts in a row after which following a run gives up.
MAX_RECONNECTS = 20


def seg(value: str) -> str:
    """A path segment, escaped (ids and node paths may hold `.` and `/`)."""
    return quote(value, safe="")


@dataclass
class Request:
    """One API call."""

    method: str
    path: str
    params: Dict[str, Any] = field(default_factory=dict)
    body: Optional[Dict[str, Any]] = None


def headers(token: Optional[str]) -> Dict[str, str]:
    h = {"Accept": "application/json"}
    if token:
        h["Authorization"] = f"Bearer {token}"
    return h


def result(resp: httpx.Response) -> Any:
    """The answer's JSON, or the error it carries."""
    if resp.status_code >= 400:
        try:
            body = resp.json()
            err = body.get("error", {})
            raise CairnError(resp.status_code, err.get("code", "unknown"), err.get("message", resp.text), body)
        except ValueError:
            raise CairnError(resp.status_code, "unknown", resp.text) from None
    if not resp.content:
        return None
    return resp.json()


def start_run(workflow: str, input: Any, run_id: Optional[str], max_concurrency: Optional[int]) -> Request:
    body: Dict[str, Any] = {"workflow": workflow}
    if input is not None:
        body["input"] = input
    if run_id is not None:
        body["runId"] = run_id
    if max_concurrency is not None:
        body["maxConcurrency"] = max_concurrency
    return Request("POST", "/v1/runs", body=body)


def list_runs(status: Optional[str], workflow: Optional[str], parent: Optional[str], limit: Optional[int], offset: Optional[int]) -> Request:
    params = {k: v for k, v in {"status": status, "workflow": workflow, "parent": parent, "limit": limit, "offset": offset}.items() if v is not None}
    return Request("GET", "/v1/runs", params=params)


def get_run(run_id: str) -> Request:
    return Request("GET", f"/v1/runs/{seg(run_id)}")


def events_page(run_id: str, after: int, limit: Optional[int]) -> Request:
    params: Dict[str, Any] = {"after": after}
    if limit is not None:
        params["limit"] = limit
    return Request("GET", f"/v1/runs/{seg(run_id)}/events", params=params)


def decide(run_id: str, node: str, approved: bool, note: Optional[str], by: Optional[str]) -> Request:
    return Request(
        "POST",
        f"/v1/runs/{seg(run_id)}/approvals/{seg(node)}",
        body={"approved": approved, "note": note, "by": by},
    )


def answer(run_id: str, request_id: str, value: Any, by: Optional[str]) -> Request:
    return Request("POST", f"/v1/runs/{seg(run_id)}/inputs/{seg(request_id)}", body={"value": value, "by": by})


def cancel(run_id: str, graceful: bool, reason: Optional[str], by: Optional[str]) -> Request:
    return Request("POST", f"/v1/runs/{seg(run_id)}/cancel", body={"graceful": graceful, "reason": reason, "by": by})


def resume(run_id: str, max_concurrency: Optional[int]) -> Request:
    body: Dict[str, Any] = {}
    if max_concurrency is not None:
        body["maxConcurrency"] = max_concurrency
    return Request("POST", f"/v1/runs/{seg(run_id)}/resume", body=body)


def stream_path(run_id: str) -> str:
    return f"/v1/runs/{seg(run_id)}/events/stream"


def stream_params(after: int, follow: bool) -> Dict[str, Any]:
    params: Dict[str, Any] = {"after": after}
    if follow:
        params["follow"] = "true"
    return params


def delay(failures: int) -> float:
    return RECONNECT_DELAYS[min(failures, len(RECONNECT_DELAYS)) - 1]
