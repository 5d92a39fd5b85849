"""A real `cairn serve` for the tests: the binary in `CAIRN_BIN`, else the
one cargo built (`target/release/cairn`, then `target/debug/cairn`), on a
free port, with a SQLite store and the tests' workflows in a temporary
folder."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]

WORKFLOWS = {
    "gated": """
name: gated
nodes:
  - id: gate
    approval: "ship?"
  - id: after
    needs: [gate]
    value: { shipped: true }
output: "{{ nodes.after.output }}"
""",
    "asks": """
name: asks
nodes:
  - id: q
    ask: "Which branch?"
    schema: { type: string }
  - id: echo
    needs: [q]
    value: { branch: "{{ nodes.q.output }}" }
""",
}


def cairn_bin() -> str:
    given = os.environ.get("CAIRN_BIN")
    if given:
        return given
    for profile in ("release", "debug"):
        p = ROOT / "target" / profile / "cairn"
        if p.exists():
            return str(p)
    pytest.skip("no cairn binary: build it (cargo build) or set CAIRN_BIN")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `cairn serve`, which the test may stop and start again on the
    same port and store."""

    def __init__(self, dir: Path) -> None:
        self.dir = dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        (dir / "workflows").mkdir()
        for name, text in WORKFLOWS.items():
            (dir / "workflows" / f"{name}.yaml").write_text(text)
        self.start()

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("CAIRN_TOKEN", "CAIRN_STORE", "CAIRN_LOG_DIR")}
        self.proc = subprocess.Popen(
            [cairn_bin(), "--store", str(self.dir / "cairn.db"), "serve", "--addr", f"127.0.0.1:{self.port}", "--workflows", str(self.dir / "workflows")],
            cwd=self.dir,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "serve.err", "ab"),
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError("cairn serve did not answer /healthz: " + (self.dir / "serve.err").read_text())

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)


@pytest.fixture
def server(tmp_path: Path):
    s = Server(tmp_path)
    yield s
    s.stop()
