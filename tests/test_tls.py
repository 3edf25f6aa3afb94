"""TLS on the agent port: an agent that trusts Booster's CA reports over TLS; one that speaks
plaintext, or trusts another CA, is refused and keeps its report spooled. Mutual TLS: the
client certificate's Common Name is the host, and the agent presents its own."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest
from pydantic import SecretStr, ValidationError
from sqlalchemy import text

from gemini_agent.config import AgentSettings
from gemini_agent.metrics import AgentMetrics
from gemini_agent.reporter import Reporter, open_channel
from gemini_agent.spool import Spool
from gemini_api.v1 import booster_pb2_grpc as pb_grpc
from gemini_booster.models import PolicyCreate
from gemini_booster.service.app import BoosterServer
from gemini_booster.storage import credentials as token_store
from gemini_booster.storage import policies as policy_store

from .conftest import agent_md, make_settings
from .test_agent import _report, _settings

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _new_key(name: str) -> tuple[str, ...]:
    """``openssl req``'s options for a fresh P-256 key in <name>.key, Common Name ``name``."""
    return (
        *("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
        *("-keyout", f"{name}.key", "-subj", f"/CN={name}"),
    )


def make_ca(d: Path, name: str) -> Path:
    _openssl("req", "-x509", *_new_key(name), "-out", f"{name}.pem", "-days", "1", cwd=d)
    return d / f"{name}.pem"


def _signed_cert(d: Path, ca: str, name: str, *extra: str) -> tuple[Path, Path]:
    """A key and a certificate with Common Name ``name`` signed by ``ca``: (cert, key) paths."""
    _openssl("req", *_new_key(name), "-out", f"{name}.csr", cwd=d)
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.pem",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-out",
        f"{name}.pem",
        "-days",
        "1",
        *extra,
        cwd=d,
    )
    return d / f"{name}.pem", d / f"{name}.key"


def make_server_cert(d: Path, ca: str) -> tuple[Path, Path]:
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    return _signed_cert(d, ca, "booster", "-extfile", "san.ext")


@pytest.fixture
def tls_booster(tmp_path, db_url):
    ca = make_ca(tmp_path, "booster-ca")
    cert, key = make_server_cert(tmp_path, "booster-ca")
    server = BoosterServer(
        make_settings(db_url, grpc_tls_cert_file=cert, grpc_tls_key_file=key)
    ).start()
    policy_store.create_policy(server.engine, PolicyCreate(name="default"), actor="test")
    server.booster.reload_policies()
    try:
        yield server, ca
    finally:
        server.stop()


def _reporter(tmp_path: Path, target: str, name: str, ca: Path | None) -> Reporter:
    """A reporter over TLS, with test_agent's deadline (a 2 s one failed a CI run under load:
    the first send's handshake and ingest took longer)."""
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


def make_client_cert(d: Path, ca: str, host: str) -> tuple[bytes, bytes]:
    """A client certificate for ``host`` (its Common Name) signed by ``ca``: (cert, key) PEM."""
    cert, key = _signed_cert(d, ca, host)
    return cert.read_bytes(), key.read_bytes()


@pytest.fixture
def mtls_booster(tmp_path, db_url):
    """Booster asking agents for a client certificate signed by "hosts-ca", with no fleet-wide
    token allowed: (server, Booster's CA, a fleet-wide token, host-b's bound token)."""
    server_ca = make_ca(tmp_path, "booster-ca")
    cert, key = make_server_cert(tmp_path, "booster-ca")
    client_ca = make_ca(tmp_path, "hosts-ca")
    settings = make_settings(
        db_url,
        bootstrap_agent_token=None,
        allow_unbound_agent_tokens=False,
        grpc_tls_cert_file=cert,
        grpc_tls_key_file=key,
        grpc_tls_client_ca_file=client_ca,
    )
    server = BoosterServer(settings).start()
    try:
        policy_store.create_policy(server.engine, PolicyCreate(name="default"), actor="test")
        server.booster.reload_policies()
        fleet = token_store.create_token(server.engine, "fleet", "agent", "test")
        bound_b = token_store.create_token(server.engine, "b-1", "agent", "test", host_id="host-b")
        server.booster.tokens_changed()  # as REST does: written behind the replica's back
        yield server, server_ca, fleet, bound_b
    finally:
        server.stop()


def test_mutual_tls_binds_the_host_to_the_client_certificate(tmp_path, mtls_booster) -> None:
    """With a client CA, the certificate's Common Name is the host an agent speaks for: a
    fleet-wide (unbound) token plus host-a's certificate reports as host-a only; a token bound
    to another host is refused with it; no certificate, no handshake."""
    server, server_ca, fleet, bound_b = mtls_booster
    chain, private = make_client_cert(tmp_path, "hosts-ca", "host-a")

    def stub(with_cert: bool) -> pb_grpc.BoosterStub:
        creds = grpc.ssl_channel_credentials(
            server_ca.read_bytes(),
            private_key=private if with_cert else None,
            certificate_chain=chain if with_cert else None,
        )
        return pb_grpc.BoosterStub(grpc.secure_channel(f"127.0.0.1:{server.grpc_port}", creds))

    def code(call, token: str) -> grpc.StatusCode:
        try:
            call(metadata=agent_md(token), timeout=10)
        except grpc.RpcError as e:
            return e.code()
        return grpc.StatusCode.OK

    a = stub(with_cert=True)
    as_host = {h: _report(i) for i, h in enumerate(("host-a", "host-b"))}
    for h, req in as_host.items():
        req.host_id = h
    assert code(lambda **kw: a.ReportAggregates(as_host["host-a"], **kw), fleet) == (
        grpc.StatusCode.OK
    )
    assert code(lambda **kw: a.ReportAggregates(as_host["host-b"], **kw), fleet) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    assert code(lambda **kw: a.ReportAggregates(as_host["host-b"], **kw), bound_b) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    anonymous = stub(with_cert=False)
    assert code(lambda **kw: anonymous.ReportAggregates(as_host["host-a"], **kw), fleet) == (
        grpc.StatusCode.UNAVAILABLE
    )
    assert _stored(server) == 1


def test_the_agent_presents_its_client_certificate(tmp_path, mtls_booster) -> None:
    """The agent's own channel (tls_cert_file, tls_key_file) completes the handshake and
    reports as its host; the same agent without them is refused and keeps its report."""
    server, server_ca, fleet, _ = mtls_booster
    cert, key = _signed_cert(tmp_path, "hosts-ca", "host-a")
    target = f"127.0.0.1:{server.grpc_port}"

    def reporter(name: str, **tls: Path) -> Reporter:
        settings = _settings(tmp_path / name, target, tls_ca_file=server_ca, **tls)
        settings = settings.model_copy(update={"host_id": "host-a", "token": SecretStr(fleet)})
        return Reporter(settings, Spool(tmp_path / name / "spool", 1 << 20), AgentMetrics())

    anonymous = reporter("anonymous")
    anonymous.submit(_report(0))
    assert anonymous.drain() == 0 and len(anonymous.spool) == 1
    with_cert = reporter("with-cert", tls_cert_file=cert, tls_key_file=key)
    req = _report(1)
    req.host_id = "host-a"
    with_cert.submit(req)
    assert with_cert.drain() == 1 and len(with_cert.spool) == 0
    assert _stored(server) == 1


def test_a_renewed_client_certificate_is_used_without_a_restart(tmp_path, mtls_booster) -> None:
    """The agent's certificate files are rewritten under it (a renewal by the node's
    bootstrap): a certificate Booster does not trust keeps the report spooled; a half-written
    renewal (a new certificate beside the old key) keeps the current channel and is counted;
    once the matching key is in place the same reporter sends, on a channel rebuilt from the
    files."""
    server, server_ca, fleet, _ = mtls_booster
    make_ca(tmp_path, "other-ca")
    stale_cert, stale_key = _signed_cert(tmp_path, "other-ca", "host-a-stale")
    good_cert, good_key = _signed_cert(tmp_path, "hosts-ca", "host-a")
    cert, key = tmp_path / "agent-cert.pem", tmp_path / "agent-key.pem"
    shutil.copy(stale_cert, cert)
    shutil.copy(stale_key, key)
    settings = _settings(
        tmp_path / "agent",
        f"127.0.0.1:{server.grpc_port}",
        tls_ca_file=server_ca,
        tls_cert_file=cert,
        tls_key_file=key,
    ).model_copy(update={"host_id": "host-a", "token": SecretStr(fleet)})
    metrics = AgentMetrics()
    reporter = Reporter(settings, Spool(tmp_path / "agent" / "spool", 1 << 20), metrics)
    req = _report(0)
    req.host_id = "host-a"
    reporter.submit(req)
    assert reporter.drain() == 0 and len(reporter.spool) == 1  # Booster refuses the handshake

    def reloads(outcome: str) -> float:
        value = metrics.registry.get_sample_value(
            "gemini_agent_tls_reloads_total", {"outcome": outcome}
        )
        return value or 0.0

    shutil.copy(good_cert, cert)  # the key is not rewritten yet
    reporter.next_attempt = 0.0
    assert reporter.drain() == 0 and len(reporter.spool) == 1
    assert reloads("unusable") == 1 and reloads("reloaded") == 0
    shutil.copy(good_key, key)
    reporter.next_attempt = 0.0
    assert reporter.drain() == 1 and len(reporter.spool) == 0
    assert reloads("reloaded") == 1
    assert _stored(server) == 1


@pytest.mark.parametrize(
    "tls,says",
    [
        ({"tls_cert_file": Path("c.pem")}, "set tls_cert_file and tls_key_file together"),
        (
            {"tls_cert_file": Path("c.pem"), "tls_key_file": Path("k.pem")},
            "a client certificate needs tls_ca_file",
        ),
    ],
)
def test_an_incomplete_client_certificate_is_refused(tls, says) -> None:
    with pytest.raises(ValidationError, match=says):
        AgentSettings(**tls)


def test_an_unreadable_certificate_file_is_named(tmp_path) -> None:
    ca = make_ca(tmp_path, "booster-ca")
    settings = AgentSettings(tls_ca_file=ca, tls_cert_file=tmp_path / "absent.pem", tls_key_file=ca)
    absent = tmp_path / "absent.pem"
    with pytest.raises(ValueError, match=f"cannot read tls_cert_file {absent}: No such file"):
        open_channel(settings)


def test_a_renewed_serving_certificate_is_used_without_a_restart(tmp_path, db_url, caplog):
    """The files rewritten as cert-manager renews them: new connections get the new pair; a
    broken rewrite keeps the previous pair in service and is logged."""
    serving = tmp_path / "serving"
    serving.mkdir()
    pairs = {}
    for name in ("first", "second"):
        d = tmp_path / name
        d.mkdir()
        pairs[name] = make_ca(d, f"{name}-ca"), *make_server_cert(d, f"{name}-ca")

    def install(name: str) -> None:
        _, cert, key = pairs[name]
        for src, dst in ((key, "tls.key"), (cert, "tls.crt")):
            (serving / f".{dst}").write_bytes(src.read_bytes())
            (serving / f".{dst}").replace(serving / dst)

    install("first")
    cert, key = serving / "tls.crt", serving / "tls.key"
    server = BoosterServer(make_settings(db_url, grpc_tls_cert_file=cert, grpc_tls_key_file=key))
    server.start()
    try:
        policy_store.create_policy(server.engine, PolicyCreate(name="default"), actor="test")
        server.booster.reload_policies()
        target = f"127.0.0.1:{server.grpc_port}"

        def sends(name: str, trusting: str) -> bool:
            reporter = _reporter(tmp_path, target, name, pairs[trusting][0])
            reporter.submit(_report(len(name)))
            return reporter.drain() == 1

        assert sends("before", "first")
        install("second")
        assert sends("after", "second")
        assert not sends("stale", "first")
        caplog.set_level(logging.ERROR, logger="gemini_booster.service.tls")
        cert.write_text("-----BEGIN CERTIFICATE-----\ntruncated\n")
        assert sends("kept", "second")
        assert "still serving the previous one" in caplog.text
    finally:
        server.stop()
