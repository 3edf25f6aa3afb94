"""TLS on the agent port: an agent that trusts Booster's CA reports over TLS; one that speaks
plaintext, or trusts another CA, is refused and keeps its report spooled."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import text

from gemini_agent.metrics import AgentMetrics
from gemini_agent.reporter import Reporter
from gemini_agent.spool import Spool
from gemini_booster.models import PolicyCreate
from gemini_booster.service.app import BoosterServer
from gemini_booster.storage import repository as repo

from .conftest import make_settings
from .test_agent import _report, _settings

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(d: Path, name: str) -> Path:
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-days",
        "1",
        "-subj",
        f"/CN={name}",
        cwd=d,
    )
    return d / f"{name}.pem"


def make_server_cert(d: Path, ca: str) -> tuple[Path, Path]:
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=booster",
        cwd=d,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        f"{ca}.pem",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "san.ext",
        cwd=d,
    )
    return d / "server.pem", d / "server.key"


@pytest.fixture
def tls_booster(tmp_path, db_url):
    ca = make_ca(tmp_path, "booster-ca")
    cert, key = make_server_cert(tmp_path, "booster-ca")
    server = BoosterServer(
        make_settings(db_url, grpc_tls_cert_file=cert, grpc_tls_key_file=key)
    ).start()
    repo.create_policy(server.engine, PolicyCreate(name="default"), actor="test")
    server.booster.reload_policies()
    try:
        yield server, ca
    finally:
        server.stop()


def _reporter(tmp_path: Path, target: str, name: str, ca: Path | None) -> Reporter:
    settings = _settings(tmp_path / name, target, tls_ca_file=ca)
    return Reporter(settings, Spool(tmp_path / name / "spool", 1 << 20), AgentMetrics())


def _stored(server: BoosterServer) -> int:
    with server.engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM reports")).scalar_one()


def test_agent_reports_over_tls_and_untrusted_clients_are_refused(tmp_path, tls_booster):
    server, ca = tls_booster
    target = f"127.0.0.1:{server.grpc_port}"

    plain = _reporter(tmp_path, target, "plain", None)
    plain.submit(_report(0))
    assert plain.drain() == 0 and len(plain.spool) == 1

    other = _reporter(tmp_path, target, "other", make_ca(tmp_path, "other-ca"))
    other.submit(_report(1))
    assert other.drain() == 0 and len(other.spool) == 1
    assert _stored(server) == 0

    trusted = _reporter(tmp_path, target, "trusted", ca)
    trusted.submit(_report(2))
    assert trusted.drain() == 1 and len(trusted.spool) == 0
    assert _stored(server) == 1
