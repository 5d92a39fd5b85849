"""The client against a real `cairn serve`."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from cairn_client import AsyncClient, CairnError, Client, is_terminal


def wait_for(client: Client, run: str, status: str) -> dict:
    deadline = time.monotonic() + 30
    while True:
        state = client.get_run(run)
        if state["status"] == status:
            return state
        assert time.monotonic() < deadline, state
        time.sleep(0.05)


def test_start_list_approve_and_follow(server) -> None:
    with Client(server.url) as client:
        run = client.start_run("gated", run_id="py-gated")
        assert run == "py-gated"
        wait_for(client, run, "waiting-approval")
        listed = client.list_runs(status="waiting-approval")
        assert [r["runId"] for r in listed["runs"]] == [run]
        client.approve(run, "gate", by="pytest", note="fine")
        events = list(client.events(run))
        seqs = [e["seq"] for e in events]
        assert seqs == list(range(1, len(seqs) + 1))
        assert events[0]["type"] == "RunStarted"
        assert is_terminal(events[-1]) and events[-1]["type"] == "RunFinished"
        assert any(e["type"] == "ApprovalGranted" for e in events)
        state = client.get_run(run)
        assert state["status"] == "finished"
        assert state["output"] == {"shipped": True}
        # After a seq: the rest only, and the stored page agrees.
        tail = list(client.events(run, after=seqs[-3]))
        assert [e["seq"] for e in tail] == seqs[-2:]
        # From the end itself: nothing, and the iterator ends.
        assert list(client.events(run, after=seqs[-1])) == []
        assert [e["seq"] for e in client.events_page(run)] == seqs


def test_answer_and_cancel(server) -> None:
    with Client(server.url) as client:
        run = client.start_run("asks")
        wait_for(client, run, "waiting-input")
        asked = [e for e in client.events_page(run) if e["type"] == "InputRequested"]
        with pytest.raises(CairnError) as bad:
            client.answer(run, asked[0]["requestId"], 42)
        assert bad.value.status == 400
        client.answer(run, asked[0]["requestId"], "main", by="pytest")
        state = client.wait(run)
        assert state["status"] == "finished", state
        echo = next(n for n in state["nodes"] if n["nodeId"] == "echo")
        assert echo["output"] == {"branch": "main"}

        other = client.start_run("gated")
        wait_for(client, other, "waiting-approval")
        client.cancel(other, reason="not today", by="pytest")
        assert client.wait(other)["status"] == "cancelled"


def test_errors_carry_the_apis_code(server) -> None:
    with Client(server.url) as client:
        with pytest.raises(CairnError) as missing:
            client.get_run("no-such-run")
        assert missing.value.status == 404
        assert missing.value.code
        with pytest.raises(CairnError) as unknown:
            client.start_run("no-such-workflow")
        assert 400 <= unknown.value.status < 500


def test_following_survives_a_server_restart(server) -> None:
    """The server stops mid-run and starts again on the same port and
    store: the follower reconnects from its last seq, every event once."""
    with Client(server.url) as client:
        run = client.start_run("gated")
        wait_for(client, run, "waiting-approval")
        seen = []

        def follow() -> None:
            for ev in client.events(run):
                seen.append(ev)

        t = threading.Thread(target=follow)
        t.start()
        time.sleep(0.5)
        server.stop()
        time.sleep(0.3)
        server.start()
        wait_for(client, run, "waiting-approval")
        client.approve(run, "gate", by="pytest")
        t.join(timeout=60)
        assert not t.is_alive(), "the follower never saw the end"
        seqs = [e["seq"] for e in seen]
        assert seqs == list(range(1, len(seqs) + 1)), seqs
        assert seen[-1]["type"] == "RunFinished"
        assert sum(1 for e in seen if e["type"] == "RunStarted") == 2


async def test_the_asyncio_client(server) -> None:
    async with AsyncClient(server.url) as client:
        run = await client.start_run("gated")
        deadline = time.monotonic() + 30
        while (await client.get_run(run))["status"] != "waiting-approval":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await client.approve(run, "gate")
        seqs = [e["seq"] async for e in client.events(run)]
        assert seqs == list(range(1, len(seqs) + 1))
        assert (await client.get_run(run))["status"] == "finished"
