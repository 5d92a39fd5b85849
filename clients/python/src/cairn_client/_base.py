"""What the blocking and the asyncio clients share: the requests, as
data, and how an answer becomes a value or a [`CairnError`]."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, Optional
from urllib.parse import quote

import httpx

from ._errors import CairnError, StreamGaveUp
from ._sse import SseParser
from ._types import Event, is_terminal

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


class Follower:
    """Where following a run's events stands, for both clients: the last
    seq yielded, the failures in a row, and the parser of the stream now
    open. Each client opens the stream; this decides what to yield, when
    to stop, and how long to wait before opening it again."""

    def __init__(self, run_id: str, after: int, follow: bool) -> None:
        self.run_id = run_id
        self.after = after
        self.follow = follow
        self.failures = 0
        self.last_error: Optional[BaseException] = None
        self.parser = SseParser()
        self.done = False

    def request(self) -> Dict[str, Any]:
        """The stream's request, from the last seq yielded; a new parser."""
        self.parser = SseParser()
        return {
            "method": "GET",
            "url": stream_path(self.run_id),
            "params": stream_params(self.after, self.follow),
            "headers": {"Accept": "text/event-stream"},
        }

    def refused(self, resp: httpx.Response) -> None:
        """An answer that is no stream (its body read): a refusal raises
        at once; a server error counts as a failure."""
        if resp.status_code < 500:
            result(resp)
        raise CairnError(resp.status_code, "unavailable", resp.text)

    def line(self, line: str) -> Optional[Event]:
        """The event to yield for a line of the stream, if any; after a
        terminal one (unless following), `done` is set.

        A run's event resets the failures; one already yielded is dropped.
        The server's own messages count too: `end` says nothing more comes
        without `follow` (sent when `after` was already the run's end), so
        `done` is set rather than asking again forever; an `error` closes
        the stream and is kept as the failure's cause, without resetting
        the failures (a store that keeps failing ends in `StreamGaveUp`)."""
        msg = self.parser.feed(line)
        if msg is None:
            return None
        if msg.event == "end":
            if not self.follow:
                self.done = True
            return None
        if msg.event == "error":
            self.last_error = RuntimeError(f"the server cut the stream: {msg.data}")
            return None
        if msg.event != "message":
            return None
        ev = json.loads(msg.data)
        self.failures = 0
        seq = int(ev.get("seq", 0))
        if seq <= self.after:
            return None
        self.after = seq
        if not self.follow and is_terminal(ev):
            self.done = True
        return ev

    def failed(self, error: Optional[BaseException]) -> float:
        """The stream failed or ended before the run did: how long to wait
        before opening it again; [`StreamGaveUp`] past `MAX_RECONNECTS`. A
        refusal (4xx) raises as it is."""
        if isinstance(error, CairnError) and error.status < 500:
            raise error
        if error is not None:
            self.last_error = error
        self.failures += 1
        if self.failures > MAX_RECONNECTS:
            raise StreamGaveUp(self.run_id, self.after, self.last_error)
        return delay(self.failures)


def delay(failures: int) -> float:
    return RECONNECT_DELAYS[min(failures, len(RECONNECT_DELAYS)) - 1]
