"""Server-Sent Events, as `GET /v1/runs/{id}/events/stream` sends them:
each event's `id` is its seq and its `data` the event's JSON; lines that
start with `:` are heartbeats."""

from __future__ import annotations

import json
from typing import Iterable, Iterator, List, Optional

from ._types import Event


class SseParser:
    """Turns the stream's lines into events, one at a time."""

    def __init__(self) -> None:
        self._data: List[str] = []

    def feed(self, line: str) -> Optional[Event]:
        """Takes one line (without its end); returns an event when the
        line ends one."""
        if line == "":
            if not self._data:
                return None
            text = "\n".join(self._data)
            self._data = []
            return json.loads(text)
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
        # `id`, `event` and `retry` add nothing: the seq is in the data.
        return None


def parse(lines: Iterable[str]) -> Iterator[Event]:
    """The events of a whole stream's lines."""
    p = SseParser()
    for line in lines:
        ev = p.feed(line)
        if ev is not None:
            yield ev
