"""The synchronous Client against a real gateway (conftest.py starts it)."""

from __future__ import annotations

import builtins
import json
import threading
import time
from typing import List, Optional

import pytest

import toolrun
from toolrun import (
    ApprovalRequest,
    Call,
    Client,
    Result,
    Stdout,
    ToolDefinition,
    ToolResult,
)


def test_tools_are_listed_with_parsed_schemas(client: Client) -> None:
    tools = client.tools()
    ids = {t.id for t in tools}
    assert {"calculator", "echo", "run_code", "read_file", "write_file", "shell"} <= ids
    calc = next(t for t in tools if t.id == "calculator")
    assert isinstance(calc, ToolDefinition)
    assert calc.category == "computation"
    assert calc.side_effect == "pure"
    assert calc.approval_policy == "never"
    assert calc.input_schema["type"] == "object"
    assert calc.input_schema["required"] == ["expression"]
    assert calc.input_schema["properties"]["expression"]["type"] == "string"
    assert calc.timeout_ms > 0
    assert calc.rendered is None
    shell = next(t for t in tools if t.id == "shell")
    assert shell.sandbox_required


def test_tools_rendered_for_a_provider(client: Client) -> None:
    tools = client.tools(format="openai")
    calc = next(t for t in tools if t.id == "calculator")
    assert calc.rendered["type"] == "function"
    assert calc.rendered["function"]["name"] == "calculator"
    assert calc.rendered["function"]["parameters"]["required"] == ["expression"]
    with pytest.raises(ValueError):
        client.tools(format="smoke-signals")


def test_calculator(client: Client) -> None:
    r = client.call("calculator", expression="2**10")
    assert isinstance(r, ToolResult)
    assert r.ok and r.error is None and r.code is None
    assert r.tool == "calculator"
    assert r.output == {"formatted": "1024", "value": 1024}
    assert json.loads(r.output_json) == r.output
    assert len(r.output_hash) == 64
    assert r.duration_us > 0
    assert r.call_id
    # The arguments as a mapping, and a chosen call id echoed back.
    r = client.call("calculator", {"expression": "6*7"}, call_id="mine-1")
    assert r.output["value"] == 42 and r.call_id == "mine-1"


def test_division_by_zero_is_data(client: Client) -> None:
    r = client.call("calculator", expression="1/0")
    assert not r.ok
    assert r.error is not None and r.error.code == "DIVISION_BY_ZERO"
    assert r.error.message


def test_bad_arguments_are_a_result_not_an_exception(client: Client) -> None:
    r = client.call("calculator", expresion="1+1")
    assert not r.ok
    assert r.code == "INVALID_ARGUMENTS"
    r = client.call("calculator", expression=42)
    assert r.code == "INVALID_ARGUMENTS"


def test_unknown_tool_is_a_result(client: Client) -> None:
    r = client.call("no_such_tool", x=1)
    assert not r.ok
    assert r.code == "UNKNOWN_TOOL"
    assert "calculator" in r.error.details["available"]


def test_run_code_python(client: Client) -> None:
    r = client.run_code("import sys\nprint(6*7)\nprint('oops', file=sys.stderr)")
    assert r.ok, r
    assert r.output["stdout"] == "42\n"
    assert r.output["stderr"] == "oops\n"
    assert r.output["exit_code"] == 0
    r = client.run_code(
        "console.log(process.argv.slice(2).join(','), process.env.X)",
        "javascript",
        args=["a", "b"],
        env={"X": "y"},
    )
    assert r.ok and r.output["stdout"] == "a,b y\n"
    r = client.run_code("import sys; print(sys.stdin.read().upper())", stdin="hi")
    assert r.output["stdout"] == "HI\n"


def test_run_code_failure_keeps_its_output(client: Client) -> None:
    r = client.run_code("echo out; echo err >&2; exit 3", "bash")
    assert not r.ok
    assert r.code == "EXECUTION_ERROR"
    assert r.output["stdout"] == "out\n" and r.output["exit_code"] == 3


def test_run_code_timeout(client: Client) -> None:
    start = time.monotonic()
    r = client.run_code("import time\ntime.sleep(30)", timeout=1)
    assert time.monotonic() - start < 10
    assert not r.ok
    assert r.code == "TIMEOUT"
    assert r.output["timed_out"] is True
    # The call's own timeout (seconds) bounds any tool the same way.
    r = client.call("run_code", code="import time\ntime.sleep(30)", language="python", timeout=0.5)
    assert r.code == "TIMEOUT"


def test_stream_yields_stdout_chunks_before_the_result(client: Client) -> None:
    code = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.3)\n"
    events = []
    arrivals: List[float] = []
    for ev in client.stream("run_code", code=code, language="python"):
        events.append(ev)
        arrivals.append(time.monotonic())
    assert isinstance(events[-1], Result)
    assert events[-1].result.ok
    chunks = [e for e in events[:-1] if isinstance(e, Stdout)]
    assert "".join(c.text for c in chunks) == "0\n1\n2\n"
    assert len(chunks) >= 2, events  # live output, not one blob at the end
    # The first chunk arrived well before the result (the program sleeps 0.9 s in all).
    assert arrivals[-1] - arrivals[events.index(chunks[0])] > 0.3
    assert events[-1].result.output["stdout"] == "0\n1\n2\n"
    # Only one Result, and it is last.
    assert sum(isinstance(e, Result) for e in events) == 1


def test_stream_of_a_failing_call_ends_with_its_result(client: Client) -> None:
    events = list(client.stream("calculator", expression="1/0"))
    assert len(events) == 1 and isinstance(events[0], Result)
    assert events[0].result.code == "DIVISION_BY_ZERO"


def test_call_many_keeps_request_order(client: Client) -> None:
    results = client.call_many(
        [
            Call(
                "run_code",
                {"code": "import time; time.sleep(0.5); print('slow')", "language": "python"},
            ),
            ("calculator", {"expression": "1+1"}),
            {"tool": "echo", "arguments": {"x": 1}, "call_id": "third"},
            ("nope", {}),
        ]
    )
    assert [r.tool for r in results] == ["run_code", "calculator", "echo", "nope"]
    assert results[0].output["stdout"] == "slow\n"
    assert results[1].output["value"] == 2
    assert results[2].output == {"x": 1} and results[2].call_id == "third"
    assert results[3].code == "UNKNOWN_TOOL"


def _approve_next(
    client: Client, session_id: str, decide: str, seen: list, count: int = 1
) -> threading.Thread:
    """A thread that waits for the session's next ``count`` approvals and decides them."""

    def run() -> None:
        for a in client.watch_approvals(session_id):
            seen.append(a)
            if decide == "approve":
                client.approve(a.id)
            else:
                client.deny(a.id, "not on a Friday")
            if len(seen) == count:
                break

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_session_files_shell_and_approvals(client: Client, gateway) -> None:
    with client.create_session(approval_mode="safe") as s:
        assert s.id.startswith("s-")
        assert s.info.approval_mode == "safe"
        assert s.info.workspace_path == "/workspace"

        r = s.write_file("notes/todo.txt", "alpha\nbeta\ngamma\n", create_dirs=True)
        assert r.ok, r
        assert r.output["created"] is True
        r = s.read_file("notes/todo.txt")
        assert r.ok and "beta" in r.output["content"]
        assert r.output["totalLines"] == 3
        r = s.grep("^b", "notes")
        assert r.ok and [m["text"] for m in r.output["matches"]] == ["beta"]
        r = s.glob("**/*.txt")
        assert r.ok and "notes/todo.txt" in json.dumps(r.output)
        r = s.list_directory("notes")
        assert r.ok and "todo.txt" in json.dumps(r.output)
        # edit writes, so it asks in "safe" mode: a thread watching the approvals lets it
        # run; the approval carries a diff preview.
        seen: list = []
        t = _approve_next(client, s.id, "approve", seen)
        r = s.edit("notes/todo.txt", "gamma", "delta")
        t.join(timeout=30)
        assert r.ok, r
        assert seen[0].tool == "edit" and seen[0].kind == "write"
        assert "delta" in seen[0].reason
        r = s.move_file("notes/todo.txt", "notes/done.txt")
        assert r.ok, r

        # shell asks too (execute).
        seen = []
        t = _approve_next(client, s.id, "approve", seen)
        r = s.shell("cat notes/done.txt | wc -l; pwd")
        t.join(timeout=30)
        assert r.ok, r
        assert r.output["stdout"] == "3\n/workspace\n"
        assert seen and seen[0].tool == "shell" and seen[0].kind == "execute"
        assert seen[0].session_id == s.id
        assert seen[0].arguments["command"].startswith("cat notes/done.txt")

        # A denial is the call's result: APPROVAL_DENIED, and nothing ran.
        seen = []
        t = _approve_next(client, s.id, "deny", seen)
        r = s.shell("touch ran-anyway")
        t.join(timeout=30)
        assert not r.ok
        assert r.code == "APPROVAL_DENIED"
        assert "not on a Friday" in r.error.message
        assert "ran-anyway" not in json.dumps(s.glob("*").output)

        # The session's workspace persists across calls, for programs too (run_code and
        # delete_file ask as well).
        seen = []
        t = _approve_next(client, s.id, "approve", seen, count=2)
        r = s.run_code("print(open('/workspace/notes/done.txt').read().split())")
        assert r.ok and r.output["stdout"] == "['alpha', 'beta', 'delta']\n"
        assert s.delete_file("notes/done.txt").ok
        t.join(timeout=30)
        assert [a.tool for a in seen] == ["run_code", "delete_file"]
        assert s.read_file("notes/done.txt").code == "FILE_NOT_FOUND"

        info = s.refresh()
        assert info.session_id == s.id
        assert any(x.session_id == s.id for x in client.list_sessions())
        sid = s.id
    # Leaving the block closed it.
    with pytest.raises(toolrun.SessionNotFound):
        client.get_session(sid)
    r = client.call("read_file", path="x", session_id=sid)
    assert r.code == "SESSION_NOT_FOUND"


def test_approve_with_modified_arguments(client: Client) -> None:
    s = client.create_session(approval_mode="none")
    try:
        done: list = []

        def run() -> None:
            for a in client.watch_approvals(s.id):
                d = client.approve(a.id, {"command": "echo changed"})
                done.append(d)
                break

        t = threading.Thread(target=run, daemon=True)
        t.start()
        r = s.shell("echo original")
        t.join(timeout=30)
        assert r.ok and r.output["stdout"] == "changed\n"
        assert done and done[0].approved
    finally:
        closed = s.close()
        assert closed.session.session_id == s.id
        assert closed.calls_cancelled == 0


def test_stream_reports_the_approval_request(client: Client) -> None:
    with client.create_session(approval_mode="none") as s:
        events = []
        for ev in s.stream("shell", command="echo streamed"):
            events.append(ev)
            if isinstance(ev, ApprovalRequest):
                assert client.approvals(s.id)[0].id == ev.approval.id
                client.approve(ev.approval.id)
        assert isinstance(events[0], ApprovalRequest)
        assert isinstance(events[-1], Result) and events[-1].result.ok
        assert "streamed" in "".join(e.text for e in events if isinstance(e, Stdout))


def test_unknown_session(client: Client) -> None:
    missing = "s-00000000000000000000000000000000"
    r = client.call("read_file", path="a.txt", session_id=missing)
    assert not r.ok and r.code == "SESSION_NOT_FOUND"
    with pytest.raises(toolrun.SessionNotFound) as e:
        client.get_session(missing)
    assert isinstance(e.value, toolrun.NotFound)
    with pytest.raises(toolrun.SessionNotFound):
        client.close_session(missing)
    with pytest.raises(toolrun.ApprovalNotFound):
        client.approve("ap-00000000000000000000000000000000")


def test_session_id_chosen_and_taken(client: Client) -> None:
    sid = f"sdk-test-{int(time.time() * 1000)}"
    with client.create_session(sid, approval_mode="all", idle_timeout_seconds=120) as s:
        assert s.id == sid and s.info.idle_timeout_seconds == 120
        assert s.info.approval_mode == "all"
        with pytest.raises(toolrun.AlreadyExists):
            client.create_session(sid)
        # "all": nothing asks.
        assert s.shell("echo free").output["stdout"] == "free\n"
        assert client.session(sid).id == sid


def test_closed_port_is_a_typed_connection_error(closed_port: str) -> None:
    with Client(closed_port, timeout=10) as c:
        with pytest.raises(toolrun.Unavailable) as e:
            c.call("echo", x=1)
    assert isinstance(e.value, toolrun.ToolrunError)
    assert isinstance(e.value, builtins.ConnectionError)
    assert toolrun.ConnectionError is toolrun.Unavailable


def test_deadline_is_a_typed_exception(gateway) -> None:
    with Client(gateway.address, timeout=0.5) as c:
        start = time.monotonic()
        with pytest.raises(toolrun.DeadlineExceeded) as e:
            c.run_code("import time\ntime.sleep(20)")
        assert time.monotonic() - start < 5
        assert isinstance(e.value, TimeoutError)
        # Quick calls still fit the deadline.
        assert c.call("calculator", expression="1+1").ok


def test_call_provider_tools_openai(client: Client) -> None:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "calculator", "arguments": "{not json"},
            },
            {
                "id": "call_c",
                "type": "function",
                "function": {"name": "echo", "arguments": '{"hello": "world"}'},
            },
        ],
    }
    out = client.call_provider_tools("openai", message)
    assert [m["tool_call_id"] for m in out.messages] == ["call_a", "call_b", "call_c"]
    assert all(m["role"] == "tool" for m in out.messages)
    assert json.loads(out.messages[0]["content"]) == {"formatted": "42", "value": 42}
    assert "INVALID_ARGUMENTS" in out.messages[1]["content"]
    assert [r.call_id for r in out.results] == ["call_a", "call_b", "call_c"]
    assert out.results[0].ok and out.results[0].output["value"] == 42
    assert out.results[1].code == "INVALID_ARGUMENTS"
    assert out.results[2].output == {"hello": "world"}
    # The whole API response is accepted too, as JSON text.
    response = {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}
    out2 = client.call_provider_tools("openai", json.dumps(response))
    assert [r.call_id for r in out2.results] == ["call_a", "call_b", "call_c"]


def test_call_provider_tools_refusals_are_typed(client: Client) -> None:
    with pytest.raises(toolrun.InvalidArgument):
        client.call_provider_tools("smoke-signals", {"role": "assistant"})
    with pytest.raises(toolrun.InvalidArgument):
        client.call_provider_tools("openai", "this is not json")


def test_anthropic_results_in_a_session(client: Client) -> None:
    with client.create_session(approval_mode="all") as s:
        assert s.write_file("a.txt", "hi from a file\n").ok
        message = {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Reading it."},
                {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.txt"}},
            ],
        }
        out = client.call_provider_tools("anthropic", message, session_id=s.id)
        assert out.results[0].ok and "hi from a file" in out.results[0].output["content"]
        msg = out.messages if isinstance(out.messages, dict) else out.messages[0]
        assert msg["role"] == "user"
        assert msg["content"][0]["type"] == "tool_result"
        assert msg["content"][0]["tool_use_id"] == "toolu_1"


def test_closing_a_session_cancels_its_running_call(client: Client) -> None:
    s = client.create_session(approval_mode="all")
    results: List[ToolResult] = []
    t = threading.Thread(
        target=lambda: results.append(s.run_code("import time\ntime.sleep(30)")), daemon=True
    )
    t.start()
    deadline = time.monotonic() + 20
    while s.refresh().calls_running == 0:
        assert time.monotonic() < deadline, "the call never started"
        time.sleep(0.05)
    closed = s.close()
    t.join(timeout=20)
    assert closed.calls_cancelled == 1
    assert results and results[0].code == "CANCELLED"


def test_leaving_a_stream_early_cancels_the_call(client: Client) -> None:
    with client.create_session(approval_mode="all") as s:
        code = "import time\nfor i in range(300):\n    print(i, flush=True)\n    time.sleep(0.1)\n"
        events = s.stream("run_code", code=code, language="python")
        first = next(iter(events))
        assert isinstance(first, Stdout) and first.text.startswith("0")
        events.close()  # type: ignore[attr-defined]
        # The program would run 30 s; the gateway kills it once the stream is gone.
        deadline = time.monotonic() + 10
        while s.refresh().calls_running != 0:
            assert time.monotonic() < deadline, "the call still runs after the stream closed"
            time.sleep(0.05)


def test_oversized_request_is_resource_exhausted(client: Client) -> None:
    with pytest.raises(toolrun.ResourceExhausted):
        client.call("echo", big="x" * (5 * 1024 * 1024))
    # The connection still serves calls.
    assert client.call("echo", small="y").output == {"small": "y"}
