"""The blocking client."""

from __future__ import annotations

import time
from typing import Any, Iterator, Optional

import httpx

from . import _base as b
from ._errors import CairnError
from ._types import Event, RunList, RunState

#: Longest silence on an event stream before it is opened again: the
#: server sends a heartbeat every 15 s by default.
STREAM_READ_TIMEOUT = 60.0


class Client:
    """A client of one `cairn serve`.

    >>> client = Client("http://127.0.0.1:7700", token=None)
    >>> run = client.start_run("hello", {"name": "Ada"})
    >>> for event in client.events(run):
    ...     print(event["seq"], event["type"])
    """

    def __init__(self, url: str, token: Optional[str] = None, timeout: float = 30.0, transport: Optional[httpx.BaseTransport] = None) -> None:
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=b.headers(token), timeout=timeout, transport=transport)

    def close(self) -> None:
        """Closes the connections."""
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _call(self, req: b.Request) -> Any:
        resp = self._http.request(req.method, req.path, params=req.params or None, json=req.body)
        return b.result(resp)

    def start_run(self, workflow: str, input: Any = None, *, run_id: Optional[str] = None, max_concurrency: Optional[int] = None) -> str:
        """Starts a run of a workflow of the server's workflows folder, by
        name; returns its id once the run is durable (on a shared store,
        queued for an instance to claim)."""
        return self._call(b.start_run(workflow, input, run_id, max_concurrency))["runId"]

    def list_runs(self, *, status: Optional[str] = None, workflow: Optional[str] = None, parent: Optional[str] = None, limit: Optional[int] = None, offset: Optional[int] = None) -> RunList:
        """A page of runs, newest first."""
        return self._call(b.list_runs(status, workflow, parent, limit, offset))

    def get_run(self, run_id: str) -> RunState:
        """A run's state, folded from its log."""
        return self._call(b.get_run(run_id))

    def events_page(self, run_id: str, after: int = 0, limit: Optional[int] = None) -> list:
        """The stored events after `after` (one page)."""
        return self._call(b.events_page(run_id, after, limit))["events"]

    def approve(self, run_id: str, node: str, *, note: Optional[str] = None, by: Optional[str] = None) -> Event:
        """Grants the approval gate `node`; returns the decision's event."""
        return self._call(b.decide(run_id, node, True, note, by))

    def deny(self, run_id: str, node: str, *, note: Optional[str] = None, by: Optional[str] = None) -> Event:
        """Denies the approval gate `node`; returns the decision's event."""
        return self._call(b.decide(run_id, node, False, note, by))

    def answer(self, run_id: str, request_id: str, value: Any, *, by: Optional[str] = None) -> Event:
        """Answers the question `request_id` a node asked."""
        return self._call(b.answer(run_id, request_id, value, by))

    def cancel(self, run_id: str, *, graceful: bool = False, reason: Optional[str] = None, by: Optional[str] = None) -> Event:
        """Cancels a run; returns once the request is durable."""
        return self._call(b.cancel(run_id, graceful, reason, by))

    def resume(self, run_id: str, *, max_concurrency: Optional[int] = None) -> Any:
        """Resumes a run that stopped (crashed, failed or cancelled)."""
        return self._call(b.resume(run_id, max_concurrency))

    def events(self, run_id: str, after: int = 0, *, follow: bool = False) -> Iterator[Event]:
        """The run's events after seq `after`, live, until its end (or,
        with `follow`, across resumes, for as long as the caller reads).

        A dropped connection (a server that restarted or stopped, a proxy
        that timed out) is opened again from the last seq seen, on the
        same URL: every event comes once, in order, with no gap. After
        `MAX_RECONNECTS` failures in a row it raises [`StreamGaveUp`]."""
        f = b.Follower(run_id, after, follow)
        while True:
            error: Optional[BaseException] = None
            try:
                req = f.request()
                with self._http.stream(**req, timeout=httpx.Timeout(10.0, read=STREAM_READ_TIMEOUT)) as resp:
                    if resp.status_code >= 400:
                        resp.read()
                        f.refused(resp)
                    for line in resp.iter_lines():
                        ev = f.line(line)
                        if ev is not None:
                            yield ev
                        if f.done:
                            return
            except (CairnError, httpx.TransportError) as e:
                error = e
            time.sleep(f.failed(error))

    def wait(self, run_id: str) -> RunState:
        """Follows the run to its end; returns its final state."""
        for _ in self.events(run_id):
            pass
        return self.get_run(run_id)
