"""Starts a real ``toolrun serve`` (local sandbox) for the whole test session.

The binary is ``$TOOLRUN_BIN`` (default ``<repo>/target/debug/toolrun``; build it with
``cargo build -p toolrun -p toolrun-runner``). It must exist: the tests fail, never skip,
without it. The gateway runs on free ports with a temporary state dir and config, and must
run as root (the sandbox makes namespaces and cgroups; session workspaces are loop mounts).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import pytest

import toolrun

REPO = Path(__file__).resolve().parents[3]

# Small workspaces keep session creation cheap; a short approval timeout bounds a test that
# forgets to decide.
CONFIG = """\
sessions:
  workspace_size_mb: 64
  approval_timeout_seconds: 60
"""

READY_WITHIN_S = 90.0


@dataclass
class Gateway:
    """The running gateway: its gRPC address and its admin URL."""

    address: str
    admin: str
    state_dir: Path
    log: Path
    #: The configuration file it follows (custom tools reload when it changes).
    config: Path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _unmount_under(root: Path) -> None:
    """Detaches workspace mounts a crashed gateway left under ``root``."""
    prefix = f"{root}/"
    try:
        with open("/proc/self/mountinfo") as f:
            points = [line.split(" ")[4] for line in f]
    except OSError:
        return
    for mp in points:
        if mp.startswith(prefix):
            subprocess.run(["umount", "-l", mp], check=False)


def toolrun_binary() -> Path:
    """The ``toolrun`` binary under test (fails the test when missing)."""
    binary = Path(os.environ.get("TOOLRUN_BIN", REPO / "target" / "debug" / "toolrun"))
    if not binary.is_file() or not os.access(binary, os.X_OK):
        pytest.fail(
            f"toolrun binary not found at {binary}: build it with "
            "`cargo build -p toolrun -p toolrun-runner` or set TOOLRUN_BIN",
            pytrace=False,
        )
    return binary


@contextlib.contextmanager
def run_gateway(
    extra_args: Sequence[str] = (), config: str = CONFIG, tmp: Optional[Path] = None
) -> Iterator[Gateway]:
    """Runs ``toolrun serve`` with ``extra_args`` until the block ends."""
    binary = toolrun_binary()
    if os.geteuid() != 0:
        pytest.fail("the local sandbox needs root: run the SDK tests as root", pytrace=False)
    tmp = tmp or Path(tempfile.mkdtemp(prefix="toolrun-sdk-test-")).resolve()
    state = tmp / "state"
    state.mkdir()
    os.chmod(tmp, 0o755)
    os.chmod(state, 0o755)
    config_file = tmp / "toolrun.yaml"
    config_file.write_text(config)
    log = tmp / "serve.log"
    grpc_port, admin_port = _free_port(), _free_port()
    address = f"127.0.0.1:{grpc_port}"
    admin = f"http://127.0.0.1:{admin_port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                str(binary),
                "serve",
                "--listen",
                address,
                "--admin-listen",
                f"127.0.0.1:{admin_port}",
                "--mcp-listen",
                "off",
                "--config",
                str(config_file),
                "--state-dir",
                str(state),
                "--drain-timeout-ms",
                "1000",
                *extra_args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + READY_WITHIN_S
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"toolrun serve exited with {proc.returncode} before it was ready:\n"
                    + log.read_text(errors="replace"),
                    pytrace=False,
                )
            try:
                with urllib.request.urlopen(f"{admin}/readyz", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"toolrun serve not ready within {READY_WITHIN_S} s:\n"
                    + log.read_text(errors="replace"),
                    pytrace=False,
                )
            time.sleep(0.1)
        yield Gateway(address=address, admin=admin, state_dir=state, log=log, config=config_file)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        _unmount_under(state)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def gateway() -> Iterator[Gateway]:
    with run_gateway() as gw:
        yield gw


@pytest.fixture
def client(gateway: Gateway) -> Iterator[toolrun.Client]:
    """A synchronous client of the test gateway."""
    with toolrun.Client(gateway.address) as c:
        yield c


@pytest.fixture
def closed_port() -> str:
    """An address nothing listens on."""
    return f"127.0.0.1:{_free_port()}"
