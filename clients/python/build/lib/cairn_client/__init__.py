"""A client of Cairn's HTTP API (`cairn serve`): start runs, list and read
them, approve, answer, cancel and resume them, and follow a run's events
live, reconnecting from the last seq seen.

Blocking: [`Client`]; asyncio: [`AsyncClient`]. The bodies are typed
dictionaries named as in the OpenAPI document (`GET /openapi.json`).
"""

from ._errors import CairnError, StreamGaveUp
from ._types import TERMINAL, Event, RunList, RunState, RunSummary, TokenTotals, is_terminal
from .aio import AsyncClient
from .client import Client

__all__ = [
    "AsyncClient",
    "CairnError",
    "Client",
    "Event",
    "RunList",
    "RunState",
    "RunSummary",
    "StreamGaveUp",
    "TERMINAL",
    "TokenTotals",
    "is_terminal",
]
