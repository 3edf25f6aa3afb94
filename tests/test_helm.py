"""The Helm chart (deploy/helm/gemini), checked as a platform team would before installing it.

Every value set in VALUE_SETS is linted (`helm lint --strict`), rendered (`helm template`), and
each rendered object is (1) decoded strictly into the Kubernetes API's Go types with the Pod
Security evaluator run on every pod template (deploy/tools/manifestcheck), and (2) validated by
kubeconform against strict JSON schemas generated from Kubernetes v1.31's own OpenAPI document
(deploy/tools/openapi_schemas.py). kubeconform skips the custom resources, whose schemas belong
to their operators and are not generated here: ServiceMonitor, PodMonitor and PrometheusRule are
decoded strictly against the Prometheus operator's Go types by manifestcheck instead; cert-manager's
Certificate and CloudNativePG's Cluster are checked by neither (named in CRD_KINDS).

The tools are built from the Go module proxy by deploy/install-tools.sh into var/tools; without
them these tests skip and say which tool is missing. The remaining tests read the rendered
objects for the behaviour the chart promises (least privilege, staged rollout, hooks, identity).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from sqlalchemy import create_engine, make_url, text

from gemini_agent.config import AgentSettings
from gemini_booster.config import Settings
from gemini_booster.storage import database

ROOT = Path(__file__).resolve().parent.parent
# GEMINI_HELM_CHART: another copy of the chart (e.g. an older commit's, to see a test fail on it).
CHART = Path(os.environ.get("GEMINI_HELM_CHART", ROOT / "deploy" / "helm" / "gemini"))
TOOLS = ROOT / "var" / "tools"
BIN = TOOLS / "bin"
KUBE_VERSION = "1.31.3"
SCHEMAS = TOOLS / "schemas" / f"v{KUBE_VERSION}"
RELEASE, NAMESPACE = "rel", "gemini"
INSTALL_HINT = "run deploy/install-tools.sh"

VALUE_SETS: dict[str, list[str]] = {
    "defaults": [],
    "external-ingress-tls": ["-f", str(CHART / "ci" / "external-ingress-tls-values.yaml")],
    "cnpg-monitoring-staged": ["-f", str(CHART / "ci" / "cnpg-monitoring-staged-values.yaml")],
    "mutual-tls": ["-f", str(CHART / "ci" / "mutual-tls-values.yaml")],
    # Booster and the agents as two releases, each in a namespace of its own Pod Security level.
    "booster-only": ["-f", str(CHART / "ci" / "booster-only-values.yaml")],
    "agent-only": ["-f", str(CHART / "ci" / "agent-only-values.yaml")],
}
WITH_BOOSTER = sorted(set(VALUE_SETS) - {"agent-only"})
WITH_AGENT = sorted(set(VALUE_SETS) - {"booster-only"})
# Custom resources without a schema here: kubeconform skips them (see the module docstring).
CRD_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule", "Certificate", "Cluster")
# ... and the ones manifestcheck has no Go types for.
UNTYPED_CRDS = "cert-manager.io/v1/Certificate,postgresql.cnpg.io/v1/Cluster"

Doc = dict[str, Any]


def tool(name: str) -> Path:
    path = BIN / name
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.skip(f"{name} is not built in {BIN}: {INSTALL_HINT}")
    return path


def run(*args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], input=stdin, capture_output=True, text=True, timeout=120
    )


@cache
def rendered(value_set: str) -> str:
    helm = tool("helm")
    result = run(
        helm, "template", RELEASE, CHART, "--namespace", NAMESPACE,
        "--kube-version", KUBE_VERSION, *VALUE_SETS[value_set],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def objects(value_set: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all(rendered(value_set)) if d]


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def containers(doc: Doc) -> dict[str, Doc]:
    spec = doc["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


def env_of(container: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in container.get("env", [])}


@pytest.fixture(params=sorted(VALUE_SETS))
def value_set(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=WITH_BOOSTER)
def booster_set(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=WITH_AGENT)
def agent_set(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# ---- the tools' verdicts ------------------------------------------------------------------


def test_lint_strict(value_set: str) -> None:
    result = run(
        tool("helm"), "lint", "--strict", CHART, "--kube-version", KUBE_VERSION,
        "--namespace", NAMESPACE, *VALUE_SETS[value_set],
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def manifestcheck(manifests: str) -> tuple[int, list[Doc]]:
    result = run(tool("manifestcheck"), "-psa-version", "v1.31", "-unknown-ok", UNTYPED_CRDS,
                 stdin=manifests)  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, [json.loads(line) for line in result.stdout.splitlines()]


def kubeconform(manifests: str) -> subprocess.CompletedProcess[str]:
    if not (SCHEMAS / "deployment-apps-v1.json").is_file():
        pytest.skip(f"no Kubernetes {KUBE_VERSION} schemas in {SCHEMAS}: {INSTALL_HINT}")
    return run(
        tool("kubeconform"), "-strict", "-summary", "-output", "json",
        "-kubernetes-version", KUBE_VERSION,
        "-schema-location", f"{SCHEMAS}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
        "-skip", ",".join(CRD_KINDS), "-",
        stdin=manifests,
    )  # fmt: skip


def test_every_object_decodes_strictly(value_set: str) -> None:
    status, results = manifestcheck(rendered(value_set))
    failed = [r for r in results if not r["decoded"] and not r.get("skipped")]
    assert status == 0 and not failed, failed
    assert len(results) == len(objects(value_set))
    skipped = {f"{r['apiVersion']}/{r['kind']}" for r in results if r.get("skipped")}
    assert skipped <= set(UNTYPED_CRDS.split(","))


def test_every_object_validates_against_kubernetes_schemas(value_set: str) -> None:
    result = kubeconform(rendered(value_set))
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout)["summary"]
    crds = sum(1 for d in objects(value_set) if d["kind"] in CRD_KINDS)
    assert summary["invalid"] == 0 and summary["errors"] == 0, result.stdout
    assert summary["valid"] == len(objects(value_set)) - crds
    assert summary["skipped"] == crds


def test_checkers_refuse_a_misspelt_field_and_a_wrong_type() -> None:
    """The two checks above can fail: a typo and a wrongly typed value are caught by both."""
    good = rendered("defaults")
    typo = good.replace("  revisionHistoryLimit: 5\n", "  revisionHistoryLimt: 5\n", 1)
    wrong_type = good.replace("maxUnavailable: 1\n", "maxUnavailable: true\n", 1)
    assert typo != good and wrong_type != good
    for bad, field in ((typo, "revisionHistoryLimt"), (wrong_type, "maxUnavailable")):
        status, results = manifestcheck(bad)
        assert status == 1
        assert any(field in r.get("error", "") for r in results)
        result = kubeconform(bad)
        assert result.returncode == 1
        assert json.loads(result.stdout)["summary"]["invalid"] == 1


def test_values_schema_refuses_unknown_keys_and_bad_values() -> None:
    helm = tool("helm")
    base: list[str | Path] = [helm, "template", RELEASE, CHART, "--kube-version", KUBE_VERSION]
    for setting, named in (
        ("booster.replicaCnt=3", "replicaCnt"),
        ("agent.moduleLoader.mode=dkms", "agent.moduleLoader.mode"),
        ("booster.agentService.type=ExternalName", "booster.agentService.type"),
        ("agent.rollout.stages={bad label!}", "agent.rollout.stages.0"),
    ):
        result = run(*base, "--set", setting)
        assert result.returncode != 0
        assert named in result.stderr, result.stderr


def test_missing_database_and_issuer_are_named() -> None:
    helm = tool("helm")
    base: list[str | Path] = [helm, "template", RELEASE, CHART, "--kube-version", KUBE_VERSION]
    result = run(*base, "--set", "database.external.existingSecret=")
    assert "database.external.existingSecret" in result.stderr
    result = run(*base, "--set", "tls.enabled=true", "--set", "tls.certManager.enabled=true")
    assert "tls.certManager.issuerRef.name" in result.stderr


# ---- Booster ------------------------------------------------------------------------------


def test_booster_pods_meet_restricted_pod_security(booster_set: str) -> None:
    _, results = manifestcheck(rendered(booster_set))
    levels = {(r["kind"], r["name"]): r.get("podSecurity", {}).get("level") for r in results}
    assert levels[("Deployment", f"{RELEASE}-gemini-booster")] == "restricted"
    assert levels[("Job", f"{RELEASE}-gemini-migrate")] == "restricted"


def test_booster_deployment_is_safe_at_any_replica_count() -> None:
    docs = objects("external-ingress-tls")
    deploy = one(docs, "Deployment", f"{RELEASE}-gemini-booster")
    assert deploy["spec"]["replicas"] == 3
    assert deploy["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    booster = containers(deploy)["booster"]
    env = env_of(booster)
    # Each replica names itself in refit ownership records by its pod name.
    assert env["GEMINI_BOOSTER_REPLICA_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.name"
    )
    assert booster["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert booster["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert {m["mountPath"] for m in booster["volumeMounts"]} == {"/tmp", "/etc/gemini/tls"}
    pdb = one(docs, "PodDisruptionBudget", f"{RELEASE}-gemini-booster")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"]
    agents = one(docs, "Service", f"{RELEASE}-gemini-booster-agents")
    assert agents["spec"]["publishNotReadyAddresses"] is True
    assert agents["spec"]["type"] == "LoadBalancer"


def test_migration_hook_runs_before_new_pods_and_after_its_database(booster_set: str) -> None:
    docs = objects(booster_set)
    job = one(docs, "Job", f"{RELEASE}-gemini-migrate")
    assert containers(job)["migrate"]["args"] == ["migrate"]
    hooks = job["metadata"]["annotations"]["helm.sh/hook"].split(",")
    if booster_set == "cnpg-monitoring-staged":
        # The chart's own database cluster exists only after install.
        assert hooks == ["post-install", "pre-upgrade"]
    else:
        assert hooks == ["pre-install", "pre-upgrade"]
    # What the Job reads or runs under is made before it, in its own hook phase.
    for kind, name in needed_by_migration(docs, job):
        before_the_job(one(docs, kind, name), job)


def hook_of(doc: Doc) -> tuple[list[str], int] | None:
    annotations = doc["metadata"].get("annotations") or {}
    if "helm.sh/hook" not in annotations:
        return None
    return annotations["helm.sh/hook"].split(","), int(annotations.get("helm.sh/hook-weight", 0))


def before_the_job(doc: Doc, job: Doc) -> None:
    """`doc` exists when the migration Job starts: a hook of the same events, lower weight."""
    hook, job_hook = hook_of(doc), hook_of(job)
    assert hook and job_hook, f"{doc['kind']}/{doc['metadata']['name']} is not a hook"
    assert hook[0] == job_hook[0], (doc["metadata"]["name"], hook, job_hook)
    assert hook[1] < job_hook[1], (doc["metadata"]["name"], hook, job_hook)


def needed_by_migration(docs: list[Doc], job: Doc) -> list[tuple[str, str]]:
    """The chart's objects the Job's pod depends on: the URL Secret it reads (when the chart
    makes it) and the NetworkPolicies that select it."""
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    needed = [
        ("NetworkPolicy", d["metadata"]["name"])
        for d in docs
        if d["kind"] == "NetworkPolicy"
        and d["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    ]
    chart_secrets = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    for item in env_of(containers(job)["migrate"]).values():
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if ref and ref["name"] in chart_secrets:
            needed.append(("Secret", ref["name"]))
    return needed


def test_migration_runs_under_its_network_policy_from_the_first_install() -> None:
    """Defect 3 of issue #30: the migrate NetworkPolicy was an ordinary object, created after
    the pre-install Job (0.76 s later on a real API server), so the first migration ran
    unrestricted. Here: a hook of the Job's events with a lower weight."""
    for value_set in ("defaults", "external-ingress-tls", "cnpg-monitoring-staged"):
        docs = objects(value_set)
        job = one(docs, "Job", f"{RELEASE}-gemini-migrate")
        policy = one(docs, "NetworkPolicy", f"{RELEASE}-gemini-migrate")
        assert ("NetworkPolicy", policy["metadata"]["name"]) in needed_by_migration(docs, job)
        before_the_job(policy, job)


def test_database_url_secret_is_not_recreated_on_upgrade() -> None:
    """Defect 4: the chart-made URL Secret was a pre-upgrade hook, so Helm deleted and
    recreated it on every upgrade while the Deployment referenced it. Booster's Secret is now
    an ordinary object (patched in place); the migration hook reads a hook copy of its own."""
    url = "postgresql+psycopg://gemini:secret@db.internal:5432/gemini"
    result = run(
        tool("helm"), "template", RELEASE, CHART, "--namespace", NAMESPACE,
        "--kube-version", KUBE_VERSION, "--set", "database.external.existingSecret=",
        "--set", f"database.external.url={url}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    deploy = one(docs, "Deployment", f"{RELEASE}-gemini-booster")
    job = one(docs, "Job", f"{RELEASE}-gemini-migrate")
    url_env = "GEMINI_BOOSTER_DATABASE_URL"
    booster_ref = env_of(containers(deploy)["booster"])[url_env]["valueFrom"]["secretKeyRef"]
    booster_secret = one(docs, "Secret", booster_ref["name"])
    assert hook_of(booster_secret) is None  # an ordinary object: never deleted on upgrade
    assert booster_secret["stringData"][booster_ref["key"]] == url
    job_ref = env_of(containers(job)["migrate"])[url_env]["valueFrom"]["secretKeyRef"]
    assert job_ref["name"] != booster_ref["name"]
    job_secret = one(docs, "Secret", job_ref["name"])
    before_the_job(job_secret, job)
    assert job_secret["stringData"] == booster_secret["stringData"]
    # Deleted with the Job once the migration succeeds: no hook copy outlives the release.
    policy = job_secret["metadata"]["annotations"]["helm.sh/hook-delete-policy"].split(",")
    assert "hook-succeeded" in policy


def booster_env_names(docs: list[Doc]) -> set[str]:
    names: set[str] = set()
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            for container in containers(doc).values():
                names |= {n for n in env_of(container) if n.startswith("GEMINI_BOOSTER_")}
    return names


def test_booster_environment_names_real_settings(booster_set: str) -> None:
    """A misspelt GEMINI_BOOSTER_* variable would be ignored silently: each must be a setting."""
    fields = set(Settings.model_fields)
    names = booster_env_names(objects(booster_set))
    assert names
    unknown = {n for n in names if n.removeprefix("GEMINI_BOOSTER_").lower() not in fields}
    assert not unknown


@pytest.fixture
def empty_database(pg_admin_url: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()


def test_cloudnativepg_wiring_migrates_a_real_database(empty_database: str) -> None:
    """The CNPG value set's migration Job, as rendered, run against a real PostgreSQL.

    The Job's environment is resolved as the kubelet would: each secretKeyRef into the
    operator's <cluster>-app Secret gets that key's value (here this test database's), plain
    values are copied. Only PGSSLMODE is relaxed: the test server has no TLS.
    """
    job = one(objects("cnpg-monitoring-staged"), "Job", f"{RELEASE}-gemini-migrate")
    url = make_url(empty_database)
    app_secret = {
        "host": url.host or str(url.query["host"]),
        "port": str(url.port or 5432),
        "dbname": str(url.database),
        "username": str(url.username),
        "password": url.password or "",
    }
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    for name, item in env_of(containers(job)["migrate"]).items():
        if "value" in item:
            env[name] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            assert ref["name"] == f"{RELEASE}-gemini-pg-app"
            env[name] = str(app_secret[ref["key"]])
    assert env["GEMINI_BOOSTER_DATABASE_URL"] == "postgresql+psycopg://"
    assert env.pop("PGSSLMODE") == "require"
    env["TMPDIR"] = env["HOME"] = os.environ.get("TMPDIR", "/tmp")
    booster = ROOT / ".venv" / "bin" / "booster"
    result = subprocess.run(
        [str(booster), "migrate"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    engine = database.make_engine(empty_database)
    try:
        assert database.current_revision(engine) == database.head_revision()
    finally:
        engine.dispose()


# ---- the agent ----------------------------------------------------------------------------

AGENT_DS = f"{RELEASE}-gemini-agent"


def test_agent_has_the_least_privilege_that_writes_the_module(agent_set: str) -> None:
    for ds in (d for d in objects(agent_set) if d["kind"] == "DaemonSet"):
        pod = ds["spec"]["template"]["spec"]
        assert pod["hostNetwork"] is True
        assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert pod.get("automountServiceAccountToken") is False
        by_name = containers(ds)
        expected_caps = {"agent": ["NET_ADMIN"], "load-module": ["SYS_MODULE"]}
        assert set(by_name) == set(expected_caps)
        for name, container in by_name.items():
            sc = container["securityContext"]
            assert not sc.get("privileged", False)
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"] == {"drop": ["ALL"], "add": expected_caps[name]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        # Writable host paths: the net sysctls (for net.fusion.*), the spool; nothing else.
        writable = {
            volumes[m["name"]]["hostPath"]["path"]
            for c in by_name.values()
            for m in c["volumeMounts"]
            if "hostPath" in volumes[m["name"]] and not m.get("readOnly")
        }
        assert writable == {"/proc/sys/net", "/var/lib/gemini-agent"}
        agent_env = env_of(by_name["agent"])
        assert agent_env["GEMINI_AGENT_SYSCTL_ROOT"]["value"] == "/host/proc/sys/net/fusion"


def test_agent_pod_security_verdict_names_only_the_grants_it_needs(agent_set: str) -> None:
    """The agent is 'privileged' in Pod Security terms only for host network, its metrics port
    on the node, host paths and its two capabilities: never for a privileged container, host
    PID/IPC, or an unconfined seccomp profile.

    Defect 2 of issue #30: a real API server's verdict on the agent pods also named `hostPort
    (container "agent" uses hostPort 9465)` (it sets hostPort to containerPort in host-network
    pods), which this test did not expect; the chart now says hostPort itself and
    manifestcheck judges pods as the server stores them."""
    _, results = manifestcheck(rendered(agent_set))
    agents = [r for r in results if r["kind"] == "DaemonSet"]
    assert agents
    for r in agents:
        baseline = r["podSecurity"]["forbidden"]["baseline"]
        reasons = {reason.split(" (")[0] for reason in baseline}
        assert reasons == {
            "host namespaces",
            "hostPath volumes",
            "hostPort",
            "non-default capabilities",
        }
        assert "hostNetwork=true" in " ".join(baseline)
        assert 'container "agent" uses hostPort 9465' in " ".join(baseline)


def test_the_docs_list_the_true_admission_verdict() -> None:
    """The chart README's grants table names every reason the verdict gives (defect 2)."""
    readme = (CHART / "README.md").read_text()
    grants = readme[readme.index("| grant | why |") :]
    grants = grants[: grants.index("\n\n")]
    for grant in ("`hostNetwork`", "`hostPort` 9465", "hostPath", "`CAP_NET_ADMIN`"):
        assert grant in grants, grant


def test_agent_identity_is_the_node_and_its_own_token() -> None:
    ds = one(objects("defaults"), "DaemonSet", AGENT_DS)
    env = env_of(containers(ds)["agent"])
    assert env["GEMINI_AGENT_HOST_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["GEMINI_AGENT_CONFIG"]["value"] == "/etc/gemini/identity/agent.toml"
    assert "GEMINI_AGENT_TOKEN" not in env  # never one token for the fleet
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["identity"]["hostPath"] == {"path": "/etc/gemini", "type": "Directory"}
    secret_keys = {
        key
        for d in objects("defaults")
        if d["kind"] == "Secret"
        for key in {**d.get("data", {}), **d.get("stringData", {})}
    }
    assert secret_keys == {"operator-token"}  # no agent credential in the cluster


def test_agent_reads_the_token_file_the_node_bootstrap_writes(tmp_path: Path) -> None:
    """The identity file the chart points at is one the real agent settings read."""
    path = tmp_path / "agent.toml"
    path.write_text('token = "host-bound-secret"\n')
    env = {"GEMINI_AGENT_CONFIG": str(path), "GEMINI_AGENT_HOST_ID": "node-7"}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        settings = AgentSettings()
    assert settings.token.get_secret_value() == "host-bound-secret"
    assert settings.host_id == "node-7"


def agent_env_names(docs: list[Doc]) -> set[str]:
    return {
        name
        for doc in docs
        if doc["kind"] == "DaemonSet"
        for container in containers(doc).values()
        for name in env_of(container)
        if name.startswith("GEMINI_AGENT_") and name != "GEMINI_AGENT_CONFIG"
    }


def test_agent_environment_names_real_settings(agent_set: str) -> None:
    fields = set(AgentSettings.model_fields)
    names = agent_env_names(objects(agent_set))
    unknown = {n for n in names if n.removeprefix("GEMINI_AGENT_").lower() not in fields}
    assert names and not unknown


def test_agent_takes_the_sysctl_root_the_chart_mounts() -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GEMINI_AGENT_SYSCTL_ROOT", "/host/proc/sys/net/fusion")
        settings = AgentSettings()
    assert str(settings.sysctl_root) == "/host/proc/sys/net/fusion"


def test_module_loader_matches_its_mode() -> None:
    default = containers(one(objects("defaults"), "DaemonSet", AGENT_DS))["load-module"]
    script = default["args"][0]
    assert 'modprobe "$module"' in script and "insmod" not in script
    assert {"name": "modules", "mountPath": "/lib/modules", "readOnly": True} in default[
        "volumeMounts"
    ]
    staged = containers(one(objects("cnpg-monitoring-staged"), "DaemonSet", AGENT_DS))
    script = staged["load-module"]["args"][0]
    assert 'insmod "$ko"' in script and "modprobe" not in script
    assert "/opt/gemini/kmod/$release/$module.ko" in script
    assert 'echo fusion > "$sysctls/tcp_congestion_control"' in script


def node_terms(ds: Doc) -> list[Doc]:
    affinity = ds["spec"]["template"]["spec"].get("affinity")
    if not affinity:
        return []
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return list(terms["nodeSelectorTerms"])


def test_staged_rollout_by_node_label() -> None:
    docs = objects("cnpg-monitoring-staged")
    main = one(docs, "DaemonSet", AGENT_DS)
    canary = one(docs, "DaemonSet", f"{AGENT_DS}-canary")
    label = "gemini.io/rollout-stage"
    # The main track: the stages rolled out so far, minus the canary stage...
    assert node_terms(main) == [
        {
            "matchExpressions": [
                {"key": label, "operator": "In", "values": ["canary", "early"]},
                {"key": label, "operator": "NotIn", "values": ["canary"]},
            ]
        }
    ]
    # ... which runs the next version on its own.
    assert node_terms(canary) == [
        {"matchExpressions": [{"key": label, "operator": "In", "values": ["canary"]}]}
    ]
    assert containers(main)["agent"]["image"] == "gemini-agent:0.1.0"
    assert containers(canary)["agent"]["image"] == "gemini-agent:0.2.0"
    for ds in (main, canary):
        update = ds["spec"]["updateStrategy"]
        assert update["type"] == "RollingUpdate"
        assert update["rollingUpdate"]["maxSurge"] == 0  # one agent per node's host network
        assert update["rollingUpdate"]["maxUnavailable"] == "5%"
    # The two tracks select disjoint pods, so neither DaemonSet adopts the other's.
    assert (
        main["spec"]["selector"]["matchLabels"]["gemini.io/track"]
        != canary["spec"]["selector"]["matchLabels"]["gemini.io/track"]
    )
    # Without stages the agent goes to every node.
    assert node_terms(one(objects("defaults"), "DaemonSet", AGENT_DS)) == []


# ---- exposure, TLS, network policy --------------------------------------------------------


def test_ingress_speaks_grpc_over_tls_to_booster() -> None:
    docs = objects("external-ingress-tls")
    grpc_in = one(docs, "Ingress", f"{RELEASE}-gemini-grpc")
    # Booster serves TLS itself here, so the controller re-encrypts (GRPCS); h2 needs TLS.
    assert grpc_in["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"] == (
        "GRPCS"
    )
    assert grpc_in["spec"]["tls"][0]["hosts"] == ["booster-agents.example.net"]
    backend = grpc_in["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": f"{RELEASE}-gemini-booster-agents", "port": {"name": "grpc"}}
    cert = one(docs, "Certificate", f"{RELEASE}-gemini-booster")
    names = cert["spec"]["dnsNames"]
    assert f"{RELEASE}-gemini-booster-agents.{NAMESPACE}.svc" in names
    assert "booster-agents.example.net" in names and "booster.example.net" in names
    agent_env = env_of(containers(one(docs, "DaemonSet", AGENT_DS))["agent"])
    assert agent_env["GEMINI_AGENT_TLS_CA_FILE"]["value"] == "/etc/gemini/ca/ca.crt"


def test_mutual_tls_gives_booster_the_hosts_ca_and_each_agent_its_node_certificate() -> None:
    docs = objects("mutual-tls")
    booster = one(docs, "Deployment", f"{RELEASE}-gemini-booster")
    env = env_of(containers(booster)["booster"])
    assert env["GEMINI_BOOSTER_GRPC_TLS_CLIENT_CA_FILE"]["value"] == "/etc/gemini/client-ca/ca.crt"
    volumes = {v["name"]: v for v in booster["spec"]["template"]["spec"]["volumes"]}
    assert volumes["client-ca"]["secret"]["secretName"] == "gemini-hosts-ca"
    mounts = {m["name"]: m for m in containers(booster)["booster"]["volumeMounts"]}
    assert mounts["client-ca"]["mountPath"] == "/etc/gemini/client-ca"
    agent_env = env_of(containers(one(docs, "DaemonSet", AGENT_DS))["agent"])
    assert agent_env["GEMINI_AGENT_TLS_CERT_FILE"]["value"] == "/etc/gemini/identity/agent.crt"
    assert agent_env["GEMINI_AGENT_TLS_KEY_FILE"]["value"] == "/etc/gemini/identity/agent.key"
    # Without mutual TLS neither side is told about client certificates.
    plain = objects("external-ingress-tls")
    plain_booster = one(plain, "Deployment", f"{RELEASE}-gemini-booster")
    assert "GEMINI_BOOSTER_GRPC_TLS_CLIENT_CA_FILE" not in env_of(
        containers(plain_booster)["booster"]
    )
    assert "GEMINI_AGENT_TLS_CERT_FILE" not in env_of(
        containers(one(plain, "DaemonSet", AGENT_DS))["agent"]
    )


def test_an_incomplete_mutual_tls_setup_is_named() -> None:
    helm = tool("helm")
    base: list[str | Path] = [helm, "template", RELEASE, CHART, "--kube-version", KUBE_VERSION]
    result = run(*base, "--set", "tls.clientCaSecret=hosts-ca")
    assert result.returncode != 0 and "tls.clientCaSecret needs tls.enabled" in result.stderr
    result = run(*base, "--set", "agent.identity.certFile=agent.crt")
    assert "agent.identity.certFile and agent.identity.keyFile go together" in result.stderr
    result = run(
        *base, "--set", "agent.identity.certFile=a.crt", "--set", "agent.identity.keyFile=a.key"
    )
    assert "agent.identity.certFile needs tls.clientCaSecret" in result.stderr


def test_network_policy_admits_agents_and_limits_egress() -> None:
    docs = objects("cnpg-monitoring-staged")
    policy = one(docs, "NetworkPolicy", f"{RELEASE}-gemini-booster")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    ports = [rule["ports"][0]["port"] for rule in policy["spec"]["ingress"]]
    assert ports == ["grpc", "http"]
    # REST (and /metrics) from this namespace and the monitoring namespace only.
    rest_from = policy["spec"]["ingress"][1]["from"]
    assert rest_from == [
        {"podSelector": {}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
    ]
    egress_ports = sorted(p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"])
    assert egress_ports == [53, 53, 5432]
    db_rule = policy["spec"]["egress"][1]["to"][0]["podSelector"]["matchLabels"]
    assert db_rule == {"cnpg.io/cluster": f"{RELEASE}-gemini-pg"}


def test_image_tags_default_to_app_version() -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    deploy = one(objects("defaults"), "Deployment", f"{RELEASE}-gemini-booster")
    assert containers(deploy)["booster"]["image"] == f"gemini-booster:{app_version}"
    ds = one(objects("defaults"), "DaemonSet", AGENT_DS)
    assert containers(ds)["agent"]["image"] == f"gemini-agent:{app_version}"
    assert re.fullmatch(r"\d+\.\d+\.\d+", app_version)


# ---- issue #30: separate namespaces, data kept, no churn, helm's kube version, helm test --


def pod_levels(value_set: str) -> dict[tuple[str, str], str]:
    _, results = manifestcheck(rendered(value_set))
    return {
        (r["kind"], r["name"]): r["podSecurity"]["level"] for r in results if "podSecurity" in r
    }


def test_booster_and_agent_install_in_separate_namespaces() -> None:
    """Defect 1: no switch left either part out, so Booster's restricted namespace got the
    agents too (a real API server refused every agent pod while `helm install` said
    "deployed"). Now: a Booster-only release whose every pod meets `restricted`, and an
    agent-only release with nothing of Booster's in it."""
    booster_only = objects("booster-only")
    assert not [d for d in booster_only if d["kind"] in ("DaemonSet", "PodMonitor")]
    levels = pod_levels("booster-only")
    assert levels and set(levels.values()) == {"restricted"}, levels
    agent_only = objects("agent-only")
    assert {d["kind"] for d in agent_only} == {"DaemonSet", "PodMonitor"}
    assert set(pod_levels("agent-only").values()) == {"privileged"}
    env = env_of(containers(one(agent_only, "DaemonSet", AGENT_DS))["agent"])
    assert env["GEMINI_AGENT_BOOSTER_ADDRESS"]["value"] == (
        "gemini-booster-agents.gemini.svc:50051"
    )
    # The Booster release's alerts select the agents of the other release and namespace.
    rule = one(booster_only, "PrometheusRule", f"{RELEASE}-gemini")
    assert 'job="gemini-agents/agents-gemini-agent",namespace="gemini-agents"' in json.dumps(
        rule["spec"]
    ).replace('\\"', '"')
    # An agent-only release must be told where Booster is.
    result = run(
        tool("helm"), "template", RELEASE, CHART, "--set", "booster.enabled=false",
        "--kube-version", KUBE_VERSION,
    )  # fmt: skip
    assert result.returncode != 0 and "agent.boosterAddress" in result.stderr


def test_docs_say_how_to_split_namespaces_and_what_the_agents_need() -> None:
    for doc in (CHART / "README.md", ROOT / "docs" / "operating.md"):
        text = " ".join(doc.read_text().split())
        assert "pod-security.kubernetes.io/enforce=privileged" in text, doc
        assert "booster.enabled=false" in text and "agent.enabled=false" in text, doc


def test_uninstall_keeps_the_database_cluster() -> None:
    """Defect 5: `helm uninstall` deleted the CloudNativePG Cluster, and with it the data."""
    cluster = one(objects("cnpg-monitoring-staged"), "Cluster", f"{RELEASE}-gemini-pg")
    assert cluster["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    readme = " ".join((CHART / "README.md").read_text().split())
    assert "kubectl -n <namespace> delete clusters.postgresql.cnpg.io <release>-gemini-pg" in (
        readme
    )


def empty_lists(node: Any, path: str = "") -> list[str]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in empty_lists(v, f"{path}.{k}")]
    if isinstance(node, list):
        if not node:
            return [path]
        return [p for i, v in enumerate(node) for p in empty_lists(v, f"{path}[{i}]")]
    return []


def test_objects_render_as_the_server_stores_them(value_set: str) -> None:
    """Defect 6: the migrate NetworkPolicy's `ingress: []` is dropped by the API server (an
    omitempty list), so each upgrade's three-way merge put it back (generation 1 → 3 over two
    no-op upgrades). No rendered object carries an empty list."""
    for doc in objects(value_set):
        found = empty_lists(doc)
        assert not found, f"{doc['kind']}/{doc['metadata']['name']}: {found}"


def test_helm_templates_without_being_told_the_kube_version() -> None:
    """Defect 7: helm built by `go install` assumes Kubernetes v1.20.0 offline, below the
    chart's kubeVersion, so `helm template` and `helm lint` failed without --kube-version;
    deploy/install-tools.sh now stamps helm's own default (its client-go's minor)."""
    helm = tool("helm")
    result = run(helm, "template", RELEASE, CHART)
    assert result.returncode == 0, result.stderr
    result = run(helm, "lint", "--strict", CHART)
    assert result.returncode == 0, result.stdout + result.stderr


def test_helm_test_checks_readyz_and_grpc_health_as_a_restricted_pod(booster_set: str) -> None:
    """Defect 8: the chart had no `helm test`. Its Pod meets `restricted`, and names the REST
    Service's /readyz and the agents' Service for gRPC health, over TLS where the port has it."""
    docs = objects(booster_set)
    pod = one(docs, "Pod", f"{RELEASE}-gemini-test")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod_levels(booster_set)[("Pod", f"{RELEASE}-gemini-test")] == "restricted"
    env = env_of(pod["spec"]["containers"][0])
    assert env["GEMINI_TEST_READYZ_URL"]["value"] == (
        f"http://{RELEASE}-gemini-booster.{NAMESPACE}.svc:8080/readyz"
    )
    tls = any(d["kind"] == "Certificate" for d in docs) or booster_set == "mutual-tls"
    if booster_set == "mutual-tls":  # no client certificate given to the test
        assert "GEMINI_TEST_GRPC_TARGET" not in env
        assert "GEMINI_TEST_GRPC_SKIPPED" in env
    else:
        assert env["GEMINI_TEST_GRPC_TARGET"]["value"] == (
            f"{RELEASE}-gemini-booster-agents.{NAMESPACE}.svc:50051"
        )
        assert ("GEMINI_TEST_GRPC_CA_FILE" in env) == tls
    script = pod["spec"]["containers"][0]["args"][0]
    assert script == (CHART / "files" / "helm-test.py").read_text()


def test_helm_test_script_passes_a_serving_booster_and_fails_a_stopped_one(
    tmp_path: Path,
) -> None:
    """files/helm-test.py, run as the test Pod runs it, against a local REST /readyz and a
    gRPC health service: exit 0 while both answer, non-zero naming what failed otherwise."""
    import http.server
    import threading
    from concurrent import futures

    import grpc  # type: ignore[import-untyped]
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/readyz" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    script = CHART / "files" / "helm-test.py"
    env = {
        **os.environ,
        "GEMINI_TEST_READYZ_URL": f"http://127.0.0.1:{httpd.server_address[1]}/readyz",
        "GEMINI_TEST_GRPC_TARGET": f"127.0.0.1:{port}",
        "GEMINI_TEST_DEADLINE_S": "0",
    }
    try:
        python = str(ROOT / ".venv" / "bin" / "python")
        serving = health_pb2.HealthCheckResponse.SERVING
        servicer.set("gemini.booster.v1.Booster", serving)
        ok = subprocess.run([python, script], env=env, capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "ok: gRPC health" in ok.stdout and "ok: REST /readyz" in ok.stdout
        servicer.set("gemini.booster.v1.Booster", health_pb2.HealthCheckResponse.NOT_SERVING)
        bad = subprocess.run([python, script], env=env, capture_output=True, text=True, timeout=60)
        assert bad.returncode == 1 and "FAILED: gRPC health" in bad.stderr, bad.stderr
    finally:
        server.stop(None)
        httpd.shutdown()
