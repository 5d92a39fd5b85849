"""The typed bodies match the OpenAPI document the server serves."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cairn_client import RunSummary, TokenTotals

if sys.version_info >= (3, 11):
    from typing import get_type_hints
else:  # pragma: no cover
    from typing_extensions import get_type_hints

OPENAPI = Path(__file__).resolve().parents[3] / "crates" / "cairn-api" / "src" / "openapi.json"


def schema(name: str) -> dict:
    return json.loads(OPENAPI.read_text())["components"]["schemas"][name]


def test_run_summary_is_the_documents() -> None:
    for td, name in ((RunSummary, "RunSummary"), (TokenTotals, "TokenTotals")):
        s = schema(name)
        assert set(get_type_hints(td)) == set(s["properties"]), name
        assert set(td.__required_keys__) == set(s.get("required", [])), name
