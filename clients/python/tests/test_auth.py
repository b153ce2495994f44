"""The API key: ``api_key=`` and ``$TOOLRUN_API_KEY`` against a ``toolrun serve --api-keys``
(a missing or wrong key raises Unauthenticated; a tenant over its rate raises
ResourceExhausted with ``retry_after``)."""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, Tuple

import pytest

import toolrun
from conftest import Gateway, run_gateway, toolrun_binary

CONFIG = """\
sessions:
  workspace_size_mb: 64
auth:
  tenants:
    slow:
      limits: {calls_per_minute: 6, burst: 2}
"""


def _create_key(keys: Path, tenant: str) -> str:
    out = subprocess.run(
        [str(toolrun_binary()), "keys", "create", "--tenant", tenant, "--file", str(keys)],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


@pytest.fixture(scope="module")
def keyed() -> Iterator[Tuple[Gateway, str, str]]:
    """A gateway that needs keys, with a key of tenant ``team-a`` and one of ``slow``."""
    tmp = Path(tempfile.mkdtemp(prefix="toolrun-sdk-auth-")).resolve()
    keys = tmp / "keys.yaml"
    key, slow = _create_key(keys, "team-a"), _create_key(keys, "slow")
    with run_gateway(["--api-keys", str(keys)], config=CONFIG, tmp=tmp) as gw:
        yield gw, key, slow


def test_a_missing_or_wrong_key_raises_unauthenticated(
    keyed: Tuple[Gateway, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gw, key, _ = keyed
    monkeypatch.delenv("TOOLRUN_API_KEY", raising=False)
    for wrong in (None, key + "x"):
        with toolrun.Client(gw.address, api_key=wrong) as c:
            with pytest.raises(toolrun.Unauthenticated) as e:
                c.call("calculator", expression="1+1")
            assert "authentication required" in e.value.details
    # Control: the right key, as an argument and from the environment.
    with toolrun.Client(gw.address, api_key=key) as c:
        assert c.call("calculator", expression="6*7").output["value"] == 42
        assert [t.id for t in c.tools()]
    monkeypatch.setenv("TOOLRUN_API_KEY", key)
    with toolrun.Client(gw.address) as c:
        assert c.call("calculator", expression="2**10").output["formatted"] == "1024"


def test_the_async_client_sends_the_key_on_unary_and_streaming_calls(
    keyed: Tuple[Gateway, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gw, key, _ = keyed
    monkeypatch.delenv("TOOLRUN_API_KEY", raising=False)

    async def main() -> None:
        async with toolrun.AsyncClient(gw.address) as c:
            with pytest.raises(toolrun.Unauthenticated):
                await c.call("echo", message="hi")
        async with toolrun.AsyncClient(gw.address, api_key=key) as c:
            r = await c.call("echo", message="hi")
            assert r.ok, r
            events = [ev async for ev in c.stream("echo", message="streamed")]
            assert isinstance(events[-1], toolrun.Result) and events[-1].result.ok, events
            s = await c.create_session(approval_mode="all")
            assert s.id in [x.session_id for x in await c.list_sessions()]
            await s.close()

    asyncio.run(main())


def test_a_tenant_over_its_rate_gets_retry_after(keyed: Tuple[Gateway, str, str]) -> None:
    gw, key, slow = keyed
    with toolrun.Client(gw.address, api_key=slow) as c:
        for _ in range(2):
            assert c.call("calculator", expression="1").ok
        with pytest.raises(toolrun.ResourceExhausted) as e:
            c.call("calculator", expression="1")
        assert e.value.retry_after is not None and 0 < e.value.retry_after <= 10
    # Another tenant is not held to it.
    with toolrun.Client(gw.address, api_key=key) as c:
        for _ in range(10):
            assert c.call("calculator", expression="1").ok
