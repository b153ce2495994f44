"""custom_tool_config: a Python function declared as a custom tool, run by a real gateway in
its sandbox (the test adds it to the gateway's configuration file, which the gateway
follows, and removes it afterwards)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List

import pytest

import toolrun
from toolrun import custom_tool_config, custom_tool_script

RELOAD_WITHIN_S = 15.0


def word_stats(text: str, top: int = 2) -> Dict[str, Any]:
    """Counts the words of a text.

    Args:
        text: The text.
        top: How many of the most common words to return.
    """
    import collections

    words = text.split()
    common = collections.Counter(words).most_common(top)
    return {"words": len(words), "top": [w for w, _ in common]}


def refuse(reason: str) -> List[int]:
    """Always fails, with the reason."""
    raise ValueError(f"refused: {reason}")


def _decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
    return fn


@_decorate
def decorated(n: int) -> int:
    """Doubles n."""
    return 2 * n


def test_the_entry_carries_the_definition_and_a_runnable_script() -> None:
    entry = custom_tool_config(word_stats, annotations={"read_only": True}, timeout_ms=5000)
    assert entry["name"] == "word_stats"
    assert entry["description"] == "Counts the words of a text."
    assert entry["input_schema"]["required"] == ["text"]
    assert entry["input_schema"]["properties"]["top"]["default"] == 2
    assert entry["output_schema"] == {"type": "object"}
    assert entry["annotations"] == {"read_only": True}
    assert entry["timeout_ms"] == 5000
    assert entry["implementation"]["language"] == "python"
    json.dumps(entry)
    # The script runs on its own: arguments on stdin, JSON on stdout (here, without a
    # sandbox, only to check the wrapper; the gateway test below runs it in one).
    out = subprocess.run(
        [sys.executable, "-c", entry["implementation"]["script"]],
        input=json.dumps({"text": "b a b", "top": 1}),
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout) == {"words": 3, "top": ["b"]}
    # Decorators are not carried into the sandbox.
    script = custom_tool_script(decorated)
    assert "@_decorate" not in script
    out = subprocess.run(
        [sys.executable, "-c", script], input='{"n": 21}', capture_output=True, text=True
    )
    assert out.stdout.strip() == "42"


def test_what_cannot_be_a_custom_tool_is_refused() -> None:
    with pytest.raises(TypeError, match="lambda"):
        custom_tool_config(lambda x: x)  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="source"):
        custom_tool_config(len)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown annotations"):
        custom_tool_config(word_stats, annotations={"readonly": True})
    with pytest.raises(ValueError, match="invalid tool name"):
        custom_tool_config(word_stats, name="word stats")

    async def coro(x: int) -> int:
        """Async."""
        return x

    with pytest.raises(TypeError, match="async"):
        custom_tool_config(coro)


def _listed(client: toolrun.Client, name: str) -> bool:
    return any(t.id == name for t in client.tools())


def _wait(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + RELOAD_WITHIN_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {RELOAD_WITHIN_S} s")
        time.sleep(0.1)


def test_a_declared_function_runs_in_the_gateways_sandbox(gateway: Any, client: toolrun.Client) -> None:
    entries = [
        custom_tool_config(word_stats, annotations={"read_only": True, "idempotent": True}),
        custom_tool_config(refuse),
    ]
    original = gateway.config.read_text()
    try:
        # JSON is YAML: the entries go into the file as one flow value.
        gateway.config.write_text(original + "custom_tools: " + json.dumps(entries) + "\n")
        _wait("word_stats listed", lambda: _listed(client, "word_stats"))
        definition = next(t for t in client.tools() if t.id == "word_stats")
        assert definition.side_effect == "pure"
        assert definition.sandbox_required

        r = client.call("word_stats", text="a b a c a", top=1)
        assert r.ok, r.error
        assert r.output == {"words": 5, "top": ["a"]}
        # The default comes from the function itself.
        r = client.call("word_stats", text="x y")
        assert r.ok and r.output == {"words": 2, "top": ["x", "y"]}, r
        # The gateway validates arguments against the function's schema before running.
        r = client.call("word_stats", text=5)
        assert not r.ok and r.error is not None
        assert r.error.code == "INVALID_ARGUMENTS"
        r = client.call("word_stats", text="a", extra=1)
        assert r.error is not None and r.error.code == "INVALID_ARGUMENTS"
        # A raising function is the tool's failure, with Python's message.
        r = client.call("refuse", reason="no")
        assert not r.ok and r.error is not None
        assert r.error.code == "EXECUTION_ERROR"
        assert "ValueError: refused: no" in r.error.message
    finally:
        gateway.config.write_text(original)
    _wait("word_stats removed", lambda: not _listed(client, "word_stats"))
    r = client.call("word_stats", text="a")
    assert r.error is not None and r.error.code == "UNKNOWN_TOOL"
