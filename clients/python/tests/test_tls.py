"""TLS and mutual TLS: ``tls_ca=``, ``tls_cert=``, ``tls_key=`` against a ``toolrun serve
--tls-cert --tls-key --tls-client-ca`` (certificates made with the openssl CLI at test time).
A mapped client certificate is its tenant's; an unmapped one raises Unauthenticated; no
certificate fails the handshake. Each refusal beside its control."""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, Tuple

import pytest

import toolrun
from conftest import Gateway, run_gateway

CONFIG = """\
sessions:
  workspace_size_mb: 64
auth:
  tenants:
    calc-only:
      tools: [calculator]
      client_certs: [CN=sdk-agent]
"""


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _leaf(d: Path, ca: str, name: str, cn: str, ext: str) -> None:
    """``name.crt``/``name.key``: a P-256 certificate for ``cn`` signed by ``ca``."""
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d,
    )  # fmt: skip
    (d / f"{name}.ext").write_text(ext)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext",
        cwd=d,
    )  # fmt: skip


def _ca(d: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d,
    )  # fmt: skip


@pytest.fixture(scope="module")
def mtls() -> Iterator[Tuple[Gateway, Path]]:
    """A gateway requiring client certificates of ``ca``; ``sdk-agent`` maps to calc-only."""
    tmp = Path(tempfile.mkdtemp(prefix="toolrun-sdk-tls-")).resolve()
    pki = tmp / "pki"
    pki.mkdir()
    _ca(pki, "ca")
    _ca(pki, "other-ca")
    _leaf(pki, "ca", "server", "toolrun", "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
          "extendedKeyUsage=serverAuth\n")  # fmt: skip
    for name, ca, cn in [("agent", "ca", "sdk-agent"), ("stranger", "ca", "stranger"),
                         ("forged", "other-ca", "sdk-agent")]:  # fmt: skip
        _leaf(pki, ca, name, cn, "extendedKeyUsage=clientAuth\n")
    args = [
        "--tls-cert", str(pki / "server.crt"), "--tls-key", str(pki / "server.key"),
        "--tls-client-ca", str(pki / "ca.crt"),
    ]  # fmt: skip
    with run_gateway(args, config=CONFIG, tmp=tmp) as gw:
        yield gw, pki


def test_a_mapped_client_certificate_is_its_tenant(mtls: Tuple[Gateway, Path]) -> None:
    gw, pki = mtls
    with toolrun.Client(
        gw.address,
        tls_ca=pki / "ca.crt",
        tls_cert=pki / "agent.crt",
        tls_key=pki / "agent.key",
    ) as c:
        assert c.call("calculator", expression="6*7").output["value"] == 42
        # calc-only's tools: the calculator alone.
        assert [t.id for t in c.tools()] == ["calculator"]
    # PEM bytes instead of paths, an https:// address and the server name given.
    with toolrun.Client(
        f"https://{gw.address}",
        tls_ca=(pki / "ca.crt").read_bytes(),
        tls_cert=(pki / "agent.crt").read_bytes(),
        tls_key=(pki / "agent.key").read_bytes(),
        tls_server_name="localhost",
    ) as c:
        assert c.call("calculator", expression="2**10").output["formatted"] == "1024"


def test_unmapped_missing_and_untrusted_certificates_are_refused(
    mtls: Tuple[Gateway, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    gw, pki = mtls
    monkeypatch.delenv("TOOLRUN_API_KEY", raising=False)
    ca = pki / "ca.crt"
    with toolrun.Client(
        gw.address, tls_ca=ca, tls_cert=pki / "stranger.crt", tls_key=pki / "stranger.key"
    ) as c:
        with pytest.raises(toolrun.Unauthenticated) as e:
            c.call("calculator", expression="1")
        assert "not mapped to a tenant" in e.value.details
    for what, cert in [("no certificate", None), ("untrusted CA", "forged")]:
        tls = {"tls_cert": pki / f"{cert}.crt", "tls_key": pki / f"{cert}.key"} if cert else {}
        with toolrun.Client(gw.address, timeout=10, tls_ca=ca, **tls) as c:  # type: ignore[arg-type]
            with pytest.raises(toolrun.Unavailable):
                c.call("calculator", expression="1")
    # Control: the trusted agent certificate, from the environment this time.
    monkeypatch.setenv("TOOLRUN_TLS_CA", str(ca))
    monkeypatch.setenv("TOOLRUN_TLS_CERT", str(pki / "agent.crt"))
    monkeypatch.setenv("TOOLRUN_TLS_KEY", str(pki / "agent.key"))
    with toolrun.Client(gw.address) as c:
        assert c.call("calculator", expression="1+1").output["value"] == 2


def test_the_async_client_speaks_tls(mtls: Tuple[Gateway, Path]) -> None:
    gw, pki = mtls

    async def main() -> None:
        async with toolrun.AsyncClient(
            gw.address,
            tls_ca=pki / "ca.crt",
            tls_cert=pki / "agent.crt",
            tls_key=pki / "agent.key",
        ) as c:
            r = await c.call("calculator", expression="6*7")
            assert r.output["value"] == 42, r
        async with toolrun.AsyncClient(gw.address, timeout=10) as plain:
            with pytest.raises(toolrun.Unavailable):
                await plain.call("calculator", expression="1")

    asyncio.run(main())


def test_bad_tls_settings_are_refused_before_connecting() -> None:
    with pytest.raises(ValueError, match="go together"):
        toolrun.Client("127.0.0.1:1", tls_cert=b"x")
    with pytest.raises(ValueError, match="https://"):
        toolrun.Client("http://127.0.0.1:1", tls_ca=b"x")
