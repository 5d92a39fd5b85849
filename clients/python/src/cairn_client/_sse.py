"""Server-Sent Events, as `GET /v1/runs/{id}/events/stream` sends them:
each event's `id` is its seq and its `data` the event's JSON; lines that
start with `:` are heartbeats. Besides the run's events (`message`), the
server sends `end` (nothing more comes on this stream), `error` (the
watcher fell behind, or the store failed) and `shutdown` (the server is
stopping)."""

from __future__ import annotations

import json
from typing import Iterable, Iterator, List, NamedTuple, Optional

from ._types import Event


class Message(NamedTuple):
    """One message of the stream: its `event` name and its data's text."""

    event: str
    data: str


class SseParser:
    """Turns the stream's lines into messages, one at a time."""

    def __init__(self) -> None:
        self._data: List[str] = []
        self._event = "message"

    def feed(self, line: str) -> Optional[Message]:
        """Takes one line (without its end); returns a message when the
        line ends one."""
        if line == "":
            if not self._data:
                self._event = "message"
                return None
            msg = Message(self._event, "\n".join(self._data))
            self._data = []
            self._event = "message"
            return msg
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value
        # `id` and `retry` add nothing: the seq is in the data.
        return None


def parse(lines: Iterable[str]) -> Iterator[Event]:
    """The run's events of a whole stream's lines."""
    p = SseParser()
    for line in lines:
        msg = p.feed(line)
        if msg is not None and msg.event == "message":
            yield json.loads(msg.data)
