"""Drives a toolrun gateway's MCP endpoint with the official Python `mcp` client (pinned in
tests/run) and prints one JSON object that gateway/tests/mcp.rs asserts on.

    python client.py URL SCENARIO [ARG...]

Scenarios: list MODE, call, errors, versions, progress, cancel MODE SESSION, complete SESSION,
session SESSION, approval SESSION, http HOST ORIGIN, oversize. MODE is a protocol version
(2025-06-18, 2025-11-25, 2026-07-28) or `auto` (the client's own negotiation).
"""

import json
import sys
import time
from contextlib import asynccontextmanager

import anyio
import httpx2
import mcp.client.session as client_session
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

SESSION_META = "toolrun.dev/session_id"


def dump(model):
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


@asynccontextmanager
async def connect(url, mode="auto", headers=None):
    """A connected client at protocol `mode`; 2025-06-18 pins the handshake's version."""
    if mode in ("2025-06-18", "2025-11-25"):
        # The client's handshake always asks for its newest handshake version; ask for this one.
        client_session.LATEST_HANDSHAKE_VERSION = mode
        client_mode = "legacy"
    else:
        client_session.LATEST_HANDSHAKE_VERSION = "2025-11-25"
        client_mode = mode
    server = url
    if headers:
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=60.0))
        server = streamable_http_client(url, http_client=http)
    async with Client(server, mode=client_mode, read_timeout_seconds=60) as c:
        yield c


def leaf_errors(e):
    """The messages of the innermost exceptions (task groups wrap them)."""
    if isinstance(e, BaseExceptionGroup):
        return [m for sub in e.exceptions for m in leaf_errors(sub)]
    return [f"{type(e).__name__}: {e}"]


def result(r):
    return {
        "is_error": r.is_error,
        "structured": r.structured_content,
        "text": [b.text for b in r.content if getattr(b, "type", "") == "text"],
        "meta": r.meta,
    }


async def mcp_error(coro):
    try:
        r = await coro
        return {"raised": False, "result": result(r)}
    except MCPError as e:
        return {"raised": True, "code": e.code, "message": e.error.message, "data": e.error.data}


async def scenario_list(url, mode):
    async with connect(url, mode) as c:
        tools = await c.list_tools()
        return {"protocol_version": c.protocol_version, "tools": [dump(t) for t in tools.tools]}


async def scenario_call(url):
    async with connect(url) as c:
        calc = await c.call_tool("calculator", {"expression": "2 + 3 * 4"})
        echo = await c.call_tool("echo", {"x": [1, "a", {"b": None}]})
        return {"protocol_version": c.protocol_version, "calculator": result(calc), "echo": result(echo)}


async def scenario_errors(url):
    async with connect(url) as c:
        missing = await c.call_tool("calculator", {})
        wrong_type = await c.call_tool("calculator", {"expression": 5})
        div = await c.call_tool("calculator", {"expression": "1/0"})
        unknown = await mcp_error(c.call_tool("no_such_tool", {}))
        # The connection still serves.
        after = await c.call_tool("echo", {"still": "serving"})
        return {
            "missing": result(missing),
            "wrong_type": result(wrong_type),
            "division": result(div),
            "unknown": unknown,
            "after": result(after),
        }


async def scenario_versions(url):
    out = {}
    for mode in ["2025-06-18", "2025-11-25", "2026-07-28", "auto"]:
        async with connect(url, mode) as c:
            tools = await c.list_tools()
            echo = await c.call_tool("echo", {"mode": mode})
            out[mode] = {
                "protocol_version": c.protocol_version,
                "tools": len(tools.tools),
                "echo": result(echo),
            }
    return out


async def scenario_progress(url):
    code = (
        "import sys, time\n"
        "for i in range(3):\n"
        "    print(f'line {i}', flush=True)\n"
        "    time.sleep(0.3)\n"
        "print('oops', file=sys.stderr, flush=True)\n"
    )
    events = []

    async def on_progress(progress, total, message):
        events.append({"progress": progress, "total": total, "message": message, "t": time.monotonic()})

    async with connect(url) as c:
        t0 = time.monotonic()
        r = await c.call_tool("run_code", {"language": "python", "code": code}, progress_callback=on_progress)
        done = time.monotonic()
        for e in events:
            e["before_end_ms"] = round((done - e.pop("t")) * 1000)
        return {"protocol_version": c.protocol_version, "events": events, "result": result(r),
                "elapsed_ms": round((done - t0) * 1000)}


def late_program(name):
    return (
        "import time\n"
        "print('started', flush=True)\n"
        "time.sleep(5)\n"
        f"open('/workspace/{name}', 'w').write('written')\n"
        "print('wrote', flush=True)\n"
    )


async def scenario_cancel(url, mode, session):
    """Cancels a run_code that would write /workspace/late-MODE.txt after 5 s (the gateway
    notices a closed stream at its next 1 s keep-alive, or the one after: a loaded CI machine
    needs the margin), keeps the connection open past that, and reads the file through MCP."""
    name = f"late-{mode}.txt"
    started = anyio.Event()

    async def on_progress(progress, total, message):
        if "started" in (message or ""):
            started.set()

    outcome = {}
    async with connect(url, mode) as c:
        async def run():
            try:
                r = await c.call_tool(
                    "run_code",
                    {"language": "python", "code": late_program(name)},
                    progress_callback=on_progress,
                    meta={SESSION_META: session},
                )
                outcome["finished"] = result(r)
            except anyio.get_cancelled_exc_class():
                outcome["cancelled"] = True
                raise

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await started.wait()
                cancelled_at = time.monotonic()
                tg.cancel_scope.cancel()
        # Past the moment the program would have written the file, on the same connection.
        await anyio.sleep(6)
        read = await c.call_tool("read_file", {"path": name}, meta={SESSION_META: session})
        outcome.update(
            protocol_version=c.protocol_version,
            read=result(read),
            waited_ms=round((time.monotonic() - cancelled_at) * 1000),
        )
    return outcome


async def scenario_complete(url, session):
    """The control of `cancel`: the same program, not cancelled, writes its file."""
    async with connect(url) as c:
        r = await c.call_tool(
            "run_code", {"language": "python", "code": late_program("late-control.txt")},
            meta={SESSION_META: session},
        )
        read = await c.call_tool("read_file", {"path": "late-control.txt"}, meta={SESSION_META: session})
        return {"run": result(r), "read": result(read)}


async def scenario_session(url, session):
    out = {}
    async with connect(url) as c:
        out["write_meta"] = result(await c.call_tool(
            "write_file", {"path": "notes/a.txt", "content": "via _meta\n", "createDirs": True},
            meta={SESSION_META: session}))
        out["read_meta"] = result(await c.call_tool("read_file", {"path": "notes/a.txt"}, meta={SESSION_META: session}))
        out["no_session"] = result(await c.call_tool("read_file", {"path": "notes/a.txt"}))
        out["unknown_session"] = result(await c.call_tool(
            "read_file", {"path": "notes/a.txt"}, meta={SESSION_META: "no-such-session"}))
        out["conflict"] = result(await c.call_tool(
            "read_file", {"path": "notes/a.txt"}, meta={SESSION_META: "another"}))
    # The header, on every request of this connection.
    async with connect(url, headers={"toolrun-session-id": session}) as c:
        out["write_header"] = result(await c.call_tool(
            "write_file", {"path": "b.txt", "content": "via header\n"}))
        out["list_header"] = result(await c.call_tool("list_directory", {"path": "."}))
        out["conflict"] = result(await c.call_tool(
            "read_file", {"path": "b.txt"}, meta={SESSION_META: "another"}))
    # The URL, for clients that take nothing else.
    async with connect(f"{url}?session_id={session}") as c:
        out["read_url"] = result(await c.call_tool("read_file", {"path": "b.txt"}))
    return out


async def scenario_approval(url, session):
    """A call that needs approval waits; gateway/tests/mcp.rs approves it with
    `toolrun approve` (printed when it appears)."""
    seen = []

    async def on_progress(progress, total, message):
        seen.append(message)

    async with connect(url) as c:
        r = await c.call_tool(
            "run_code", {"language": "bash", "code": "echo approved-run"},
            progress_callback=on_progress, meta={SESSION_META: session},
        )
        return {"result": result(r), "progress": seen}


async def scenario_http(url, host, origin):
    """Connects with the given Host and Origin headers (`-` = the client's own)."""
    headers = {}
    if host != "-":
        headers["Host"] = host
    if origin != "-":
        headers["Origin"] = origin
    try:
        async with connect(url, "2025-11-25", headers=headers) as c:
            tools = await c.list_tools()
            return {"connected": True, "tools": len(tools.tools)}
    except Exception as e:  # the client's own error for a refused connection
        return {"connected": False, "error": "; ".join(leaf_errors(e))}


async def scenario_oversize(url):
    async with connect(url) as c:
        big = await mcp_error(c.call_tool("echo", {"blob": "x" * (5 * 1024 * 1024)}))
        after = await c.call_tool("echo", {"small": True})
        return {"big": big, "after": result(after)}


SCENARIOS = {
    "list": scenario_list,
    "call": scenario_call,
    "errors": scenario_errors,
    "versions": scenario_versions,
    "progress": scenario_progress,
    "cancel": scenario_cancel,
    "complete": scenario_complete,
    "session": scenario_session,
    "approval": scenario_approval,
    "http": scenario_http,
    "oversize": scenario_oversize,
}


def main():
    url, name, *args = sys.argv[1:]
    out = anyio.run(SCENARIOS[name], url, *args)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
