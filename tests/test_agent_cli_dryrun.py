"""gemini-agent's start banner and dry run: the banner says what the agent is, whom it talks to
and as whom, never the token; a dry run prints the θ it would write (sysctls, the destination
table, per place) and writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys

from gemini_agent.config import AgentSettings
from gemini_agent.daemon import Agent
from gemini_agent.dryrun import banner, would_write
from gemini_agent.writeback import Kernel, table_datapath
from gemini_api.datapaths import Apply, registry
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster.models import PolicyCreate
from gemini_booster.service.app import BoosterServer
from gemini_booster.storage import policies as policy_store
from tests.conftest import AGENT, free_port, make_settings
from tests.sysctls import fusion_sysctls, theta_in

SPEC = load_spec()
SECRET = "gmn_secret_value_never_shown"


def _agent(tmp_path, target: str = "127.0.0.1:1", **kw) -> tuple[Agent, object]:
    table = tmp_path / "geo.csv"
    table.write_text("prefix,region,isp\n10.1.0.0/16,eu,fiber\n10.2.0.0/16,us,cable\n")
    root = fusion_sysctls(tmp_path)
    settings = AgentSettings(
        host_id="web-17",
        policy="default",
        booster_address=target,
        token=AGENT,
        spool_dir=tmp_path / "spool",
        geo_csv=table,
        apply_to_kernel=False,
        sysctl_root=root,
        rpc_deadline_s=5,
        metrics_listen=f"127.0.0.1:{free_port()}",
        **kw,
    )
    return Agent(settings, kernel=Kernel(root, use_netlink=False)), root


def test_the_banner_names_identity_and_target_never_the_token(tmp_path):
    s = AgentSettings(
        host_id="web-17",
        booster_address="booster.example:50051",
        token=SECRET,
        spool_dir=tmp_path,
        apply_to_kernel=False,
    )
    text = "\n".join(banner(s, "1.2.3"))
    assert text.startswith("gemini-agent 1.2.3 starting")
    for shown in ("web-17", "booster.example:50051", "plaintext", "DRY RUN", table_datapath().name):
        assert shown in text, shown
    assert SECRET not in text
    s = AgentSettings(spool_dir=tmp_path)
    assert "token       NONE: Booster refuses every call" in "\n".join(banner(s, "1"))


def test_a_dry_run_shows_the_table_and_sysctls_it_would_write(tmp_path):
    """Booster's answer (built here) → the exact θ per place and the default's sysctls; a θ
    outside the spec is refused in the dry run as it would be when applying."""
    agent, root = _agent(tmp_path)
    rank = agent.ranked_places()
    eu = SPEC.default() | {"mult_decrease": 60}
    bad = SPEC.default() | {"mult_decrease": SPEC.limits["mult_decrease"][1] + 1}
    resp = pb.GetParametersResponse(
        target_cc=table_datapath().cc,
        default_theta=pb.Theta(**SPEC.default()),
        parameters=[pb.ContextParameters(theta=pb.Theta(**t)) for t in (eu, bad)][: len(rank)],
    )
    lines = would_write(agent, resp, rank, rank)
    text = "\n".join(lines)
    assert f"{root}/mult_decrease = {SPEC.default()['mult_decrease']}" in text
    first = rank[0]
    assert f"{first.region}/{first.isp}" in text and "mult_decrease=60" in text
    assert "1 places" in text  # the refused θ leaves its place on the default
    assert "rule 10." in text and "profile 2:" in text
    assert "experiment: none" in text and "module parameters" not in text
    assert theta_in(root) == SPEC.default()  # nothing written


def test_a_dry_run_of_a_host_wide_datapath_shows_its_module_parameters(tmp_path):
    """A policy of a host-wide datapath: its module parameters, and no destination table."""
    agent, root = _agent(tmp_path)
    host = next(d for d in registry() if d.apply is Apply.MODULE_PARAMS)
    theta = host.spec.default()
    resp = pb.GetParametersResponse(
        target_cc=host.cc,
        default_datapath_theta=pb.DatapathTheta(datapath=host.name, values=theta),
    )
    rank = agent.ranked_places()
    text = "\n".join(would_write(agent, resp, rank, rank))
    name, value = next(iter(theta.items()))
    assert f"{host.spec.target}/{name} = {value}" in text
    assert "θ per destination" not in text and str(root) not in text


def test_a_dry_run_against_booster_prints_once_and_writes_nothing(tmp_path, db_url, capsys):
    server = BoosterServer(make_settings(db_url)).start()
    try:
        policy_store.create_policy(server.engine, PolicyCreate(name="default"), actor="test")
        server.booster.reload_policies()
        agent, root = _agent(tmp_path, f"127.0.0.1:{server.grpc_port}")
        agent.refresh_theta()
        out = capsys.readouterr().out
        assert out.startswith("dry run: would write")
        assert f"{root}/mult_decrease = " in out and "θ per destination (2 places" in out
        agent.refresh_theta()  # the same answer: not printed again
        assert capsys.readouterr().out == ""
        assert theta_in(root) == SPEC.default()
    finally:
        server.stop()


def test_run_prints_the_banner_first(tmp_path):
    """Even where the agent then stops (no Fusion module here), the banner came first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEMINI_AGENT_")}
    env |= {
        "GEMINI_AGENT_TOKEN": SECRET,
        "GEMINI_AGENT_HOST_ID": "web-17",
        "GEMINI_AGENT_APPLY_TO_KERNEL": "false",
        "GEMINI_AGENT_SPOOL_DIR": str(tmp_path / "spool"),
        "GEMINI_AGENT_METRICS_LISTEN": f"127.0.0.1:{free_port()}",
    }
    out = subprocess.run(
        [sys.executable, "-m", "gemini_agent.cli", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stderr.startswith("gemini-agent "), out.stderr
    assert "host id     web-17" in out.stderr and "DRY RUN" in out.stderr
    assert SECRET not in out.stderr + out.stdout
