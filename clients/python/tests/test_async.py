"""AsyncClient (grpc.aio) against the same real gateway; each test runs its own loop."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable, List, TypeVar

import pytest

import toolrun
from toolrun import ApprovalRequest, AsyncClient, Call, Result, Stdout

T = TypeVar("T")


def run(gateway: Any, body: Callable[[AsyncClient], Awaitable[T]], **kw: Any) -> T:
    """Runs ``body(client)`` in a fresh event loop with a client of the test gateway."""

    async def main() -> T:
        async with AsyncClient(gateway.address, **kw) as c:
            return await asyncio.wait_for(body(c), timeout=120)

    return asyncio.run(main())


def test_async_tools_and_calls(gateway) -> None:
    async def body(c: AsyncClient) -> None:
        tools = await c.tools()
        assert "calculator" in {t.id for t in tools}
        calc = next(t for t in tools if t.id == "calculator")
        assert calc.input_schema["properties"]["expression"]["type"] == "string"
        r = await c.call("calculator", expression="3*14")
        assert r.ok and r.output["value"] == 42
        r = await c.call("calculator", nope=1)
        assert not r.ok and r.code == "INVALID_ARGUMENTS"
        r = await c.call("nope")
        assert r.code == "UNKNOWN_TOOL"

    run(gateway, body)


def test_async_run_code_and_timeout(gateway) -> None:
    async def body(c: AsyncClient) -> None:
        r = await c.run_code("print('hello from async')")
        assert r.ok and r.output["stdout"] == "hello from async\n"
        r = await c.run_code("sleep 30", "bash", timeout=1)
        assert r.code == "TIMEOUT"

    run(gateway, body)


def test_async_concurrent_calls_overlap(gateway) -> None:
    async def body(c: AsyncClient) -> None:
        code = "import time\nt = time.time()\ntime.sleep(0.5)\nprint(t, time.time())"
        results = await asyncio.gather(*(c.run_code(code) for _ in range(2)))
        assert all(r.ok for r in results), results
        (s1, e1), (s2, e2) = (map(float, r.output["stdout"].split()) for r in results)
        # Both programs were running at the same moment.
        assert s1 < e2 and s2 < e1

    run(gateway, body)


def test_async_stream(gateway) -> None:
    async def body(c: AsyncClient) -> None:
        events: List[Any] = []
        code = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.2)\n"
        async for ev in c.stream("run_code", code=code, language="python"):
            events.append(ev)
        assert isinstance(events[-1], Result) and events[-1].result.ok
        chunks = [e for e in events if isinstance(e, Stdout)]
        assert len(chunks) >= 2
        assert "".join(e.text for e in chunks) == "0\n1\n2\n"

    run(gateway, body)


def test_async_call_many_order(gateway) -> None:
    async def body(c: AsyncClient) -> None:
        rs = await c.call_many(
            [
                Call("run_code", {"code": "sleep 0.3; echo a", "language": "bash"}),
                Call("calculator", {"expression": "2+2"}),
            ]
        )
        assert [r.tool for r in rs] == ["run_code", "calculator"]
        assert rs[0].output["stdout"] == "a\n" and rs[1].output["value"] == 4

    run(gateway, body)


def test_async_session_with_approvals_from_a_task(gateway) -> None:
    async def body(c: AsyncClient) -> None:
        async with await c.create_session(approval_mode="safe") as s:
            assert (await s.write_file("a.txt", "one\ntwo\n")).ok
            r = await s.read_file("a.txt")
            assert r.ok and r.output["totalLines"] == 2
            r = await s.grep("tw")
            assert r.ok and r.output["matches"][0]["line"] == 2

            decided: List[str] = []

            async def approver() -> None:
                async for a in c.watch_approvals(s.id):
                    if a.tool == "shell" and "deny-me" in a.arguments["command"]:
                        await c.deny(a.id, "no")
                    else:
                        await c.approve(a.id)
                    decided.append(a.tool)
                    if len(decided) == 2:
                        break

            task = asyncio.create_task(approver())
            ok = await s.shell("wc -l < a.txt")
            denied = await s.shell("echo deny-me")
            await asyncio.wait_for(task, 30)
            assert ok.ok and ok.output["stdout"].strip() == "2"
            assert denied.code == "APPROVAL_DENIED"
            assert decided == ["shell", "shell"]
            sid = s.id
        with pytest.raises(toolrun.SessionNotFound):
            await c.get_session(sid)
        r = await c.call("read_file", path="a.txt", session_id=sid)
        assert r.code == "SESSION_NOT_FOUND"

    run(gateway, body)


def test_async_stream_approval_request(gateway) -> None:
    async def body(c: AsyncClient) -> None:
        s = await c.create_session(approval_mode="none")
        try:
            kinds = []
            async for ev in s.stream("shell", command="echo hi"):
                kinds.append(type(ev).__name__)
                if isinstance(ev, ApprovalRequest):
                    pending = await s.approvals()
                    assert [a.id for a in pending] == [ev.approval.id]
                    await c.approve(ev.approval.id)
            assert kinds[0] == "ApprovalRequest" and kinds[-1] == "Result"
        finally:
            await s.close()

    run(gateway, body)


def test_async_transport_errors(gateway, closed_port: str) -> None:
    async def unreachable() -> None:
        async with AsyncClient(closed_port, timeout=10) as c:
            await c.call("echo")

    with pytest.raises(toolrun.Unavailable):
        asyncio.run(unreachable())

    async def body(c: AsyncClient) -> None:
        with pytest.raises(toolrun.DeadlineExceeded):
            await c.run_code("import time\ntime.sleep(20)")
        with pytest.raises(toolrun.InvalidArgument):
            await c.call_provider_tools("nobody", {})

    run(gateway, body, timeout=0.5)


def test_async_provider_tools(gateway) -> None:
    async def body(c: AsyncClient) -> None:
        message = {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": json.dumps({"expression": "7*6"})},
                }
            ],
        }
        out = await c.call_provider_tools("openai", message)
        assert out.messages[0]["tool_call_id"] == "call_1"
        assert out.results[0].output["value"] == 42

    run(gateway, body)
