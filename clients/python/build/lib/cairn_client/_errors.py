"""What the client raises."""

from __future__ import annotations

from typing import Any, Optional


class CairnError(Exception):
    """The server refused a request: its HTTP status and the error's stable
    `code` and `message` (the API's `{"error": {"code", "message"}}`)."""

    def __init__(self, status: int, code: str, message: str, body: Any = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.body = body


class StreamGaveUp(Exception):
    """Following a run's events failed more times in a row than allowed;
    `after` is the last seq seen, to follow on from."""

    def __init__(self, run_id: str, after: int, cause: Optional[BaseException]) -> None:
        super().__init__(f"following run {run_id} failed after seq {after}: {cause}")
        self.run_id = run_id
        self.after = after
        self.__cause__ = cause
