"""The Helm chart installed for real: a kube-apiserver, etcd and kube-controller-manager built
from the Go module proxy (deploy/cluster/build.sh) and started on loopback
(deploy/cluster/start.sh).

What a control plane without kubelets and scheduler can show, and these tests check:
- every object of every value set accepted by the API server with strict field validation;
- the Pod Security admission verdicts (the agent pods refused by a `restricted` namespace with
  the true list of reasons, hostPort 9465 among them; Booster's, the migration's and the
  `helm test` pods accepted);
- Booster and the agents as two releases in namespaces of their own levels;
- hook order (the migration pod starts with its NetworkPolicy and URL Secret in place and no
  Deployment yet), a failed migration leaving no Deployment;
- upgrades that change nothing rewrite nothing (same generations, same Secret), rollback, and
  uninstall leaving the CloudNativePG Cluster;
- the staged rollout: the DaemonSet controller placing the main and canary tracks onto the
  Node objects (created here, labelled by stage) their labels select.

The test plays the kubelet for the migration and `helm test` pods only: it binds each to a
node and sets its phase through the API (Succeeded, or Failed for the failed-migration case).
On a second control plane with kube-scheduler and kwok (sigs.k8s.io/kwok, fake kubelets that
take pods through their life cycle without containers): `helm install --wait` with Booster's
replicas ready, its PodDisruptionBudget allowing one disruption, a rolling update completed,
and the agents' pods ready on their stages' nodes. Evictions against the PDB, what the
`helm test` Pod checks and anything a real container does are not exercised. Custom resources
are served from minimal CRDs (any field accepted): the operators' schemas are not checked.

Skips, naming what to run, without helm (deploy/install-tools.sh) or the control-plane binaries
(deploy/cluster/build.sh, about 20 min of CPU once; cached by version).
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
# GEMINI_HELM_CHART: another copy of the chart (e.g. an older commit's, to see a test fail on it).
CHART = Path(os.environ.get("GEMINI_HELM_CHART", ROOT / "deploy" / "helm" / "gemini"))
HELM = ROOT / "var" / "tools" / "bin" / "helm"
KUBERNETES_VERSION = "v1.34.2"
ETCD_VERSION = "v3.6.16"
CACHE = Path(os.environ.get("GEMINI_CACHE", "/var/cache/gemini"))
BIN = Path(
    os.environ.get(
        "GEMINI_CLUSTER_BIN", CACHE / f"cluster-{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}" / "bin"
    )
)
CI = CHART / "ci"
DEADLINE_S = 120.0

pytestmark = pytest.mark.tools

Doc = dict[str, Any]


def unavailable(why: str) -> None:
    """Skip without the control plane, or fail where it must be there (CI builds it and sets
    GEMINI_REQUIRE_CLUSTER=1, so a broken build cannot pass as a skipped test)."""
    if os.environ.get("GEMINI_REQUIRE_CLUSTER") == "1":
        pytest.fail(why)
    pytest.skip(why)


def need_binaries() -> None:
    missing = [
        n for n in ("etcd", "kube-apiserver", "kube-controller-manager") if not (BIN / n).is_file()
    ]
    if missing:
        unavailable(f"{', '.join(missing)} not built in {BIN}: run deploy/cluster/build.sh")
    if not HELM.is_file():
        unavailable(f"helm is not built in {HELM.parent}: run deploy/install-tools.sh")


class Api:
    """Just enough of a Kubernetes client: JSON over HTTPS with the admin token."""

    def __init__(self, server: str, token: str, ca: str) -> None:
        self.server, self.token = server, token
        self.context = ssl.create_default_context(cafile=ca)

    def call(
        self, method: str, path: str, body: Doc | None = None, content_type: str | None = None
    ) -> tuple[int, Doc]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type or "application/json")
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=30) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as error:
            body = error.read()
            try:
                return error.code, json.loads(body or b"{}")
            except json.JSONDecodeError:  # e.g. "404 page not found" before a group is served
                return error.code, {"message": body.decode(errors="replace")}

    def get(self, path: str) -> Doc | None:
        status, doc = self.call("GET", path)
        if status == 404:
            return None
        assert status == 200, (path, status, doc)
        return doc

    def items(self, path: str) -> list[Doc]:
        doc = self.get(path)
        return list(doc["items"]) if doc else []

    def create(self, path: str, body: Doc) -> Doc:
        status, doc = self.call("POST", path, body)
        assert status in (200, 201), (path, status, doc)
        return doc


def collection(doc: Doc, namespace: str) -> str:
    """The REST path of the collection `doc` belongs in."""
    api = doc["apiVersion"]
    base = f"/api/{api}" if "/" not in api else f"/apis/{api}"
    plural = {
        "NetworkPolicy": "networkpolicies",
        "Ingress": "ingresses",
        "PodDisruptionBudget": "poddisruptionbudgets",
    }.get(doc["kind"], doc["kind"].lower() + "s")
    return f"{base}/namespaces/{namespace}/{plural}"


def eventually(what: str, check: Any) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {DEADLINE_S:.0f} s: {what}"
        time.sleep(0.2)


class Cluster:
    def __init__(self, state: Path, env: dict[str, str]) -> None:
        self.state = state
        self.env = {
            **os.environ,
            "KUBECONFIG": env["KUBECONFIG"],
            "HELM_CACHE_HOME": str(state / "helm-cache"),
            "HELM_CONFIG_HOME": str(state / "helm-config"),
            "HELM_DATA_HOME": str(state / "helm-data"),
        }
        self.api = Api(
            env["GEMINI_CLUSTER_SERVER"], env["GEMINI_CLUSTER_TOKEN"], env["GEMINI_CLUSTER_CA"]
        )
        self.pids = [int(p) for p in env["GEMINI_CLUSTER_PIDS"].split()]
        # What the stand-in kubelet saw when each migration pod appeared, by namespace.
        self.seen: dict[str, list[Doc]] = {}
        self.fail_migrations: set[str] = set()
        self.stop = threading.Event()
        self.errors: list[str] = []

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(HELM), *args], env=self.env, capture_output=True, text=True, timeout=300
        )
        if check:
            assert result.returncode == 0, (result.stdout + result.stderr, self.errors)
        return result

    def namespace(self, name: str, level: str) -> None:
        self.api.create(
            "/api/v1/namespaces",
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": level}},
            },
        )
        # Pods are admitted only once the controller manager has made the default account.
        eventually(
            f"{name}/default ServiceAccount",
            lambda: self.api.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        )

    def kubelet(self) -> None:
        """Stand in for the kubelet for migration pods: note what exists when each appears,
        bind it to a node and end it (Succeeded, or Failed where a failure is wanted)."""
        done: set[str] = set()
        while not self.stop.is_set():
            try:
                self.kubelet_pass(done)
            except Exception as exc:  # reported by the tests that wait on it
                self.errors.append(repr(exc))
            self.stop.wait(0.1)

    def kubelet_pass(self, done: set[str]) -> None:
        pods = self.api.items(
            "/api/v1/pods?labelSelector=app.kubernetes.io%2Fcomponent+in+%28migrate%2Ctest%29"
        )
        for pod in pods:
            meta = pod["metadata"]
            ns = meta["namespace"]
            if meta["uid"] in done or pod["status"].get("phase") in ("Succeeded", "Failed"):
                continue
            done.add(meta["uid"])
            release = meta["labels"]["app.kubernetes.io/instance"]
            if meta["labels"]["app.kubernetes.io/component"] == "migrate":
                self.seen.setdefault(ns, []).append(self.snapshot(ns, release, pod))
            self.end_pod(pod, failed=ns in self.fail_migrations)

    def snapshot(self, ns: str, release: str, pod: Doc) -> Doc:
        fullname = release if "gemini" in release else f"{release}-gemini"
        refs = [
            e["valueFrom"]["secretKeyRef"]["name"]
            for e in pod["spec"]["containers"][0]["env"]
            if "secretKeyRef" in e.get("valueFrom", {})
        ]
        return {
            "policy": self.api.get(
                f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{fullname}-migrate"
            )
            is not None,
            "secrets": {
                r: self.api.get(f"/api/v1/namespaces/{ns}/secrets/{r}") is not None for r in refs
            },
            "deployment": self.api.get(
                f"/apis/apps/v1/namespaces/{ns}/deployments/{fullname}-booster"
            )
            is not None,
        }

    def end_pod(self, pod: Doc, failed: bool) -> None:
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        self.api.create(
            f"{path}/binding",
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": meta["name"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": "node-late"},
            },
        )
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        code = 1 if failed else 0
        container = pod["spec"]["containers"][0]
        status = {
            "phase": "Failed" if failed else "Succeeded",
            "startTime": now,
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {
                        "terminated": {
                            "exitCode": code,
                            "startedAt": now,
                            "finishedAt": now,
                            "reason": "Error" if failed else "Completed",
                        }
                    },
                }
            ],
        }
        current = self.api.get(path)
        assert current is not None
        current["status"] = {**current.get("status", {}), **status}
        code_, doc = self.api.call("PUT", f"{path}/status", current)
        assert code_ == 200, doc


def crd(group: str, kind: str, plural: str) -> Doc:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


@contextlib.contextmanager
def control_plane(kwok: bool) -> Iterator[Cluster]:
    """A control plane with three labelled nodes: without kwok the test's stand-in kubelet ends
    the pods that matter; with kwok, kube-scheduler places every pod and kwok's fake kubelets
    run them (annotated nodes)."""
    need_binaries()
    if kwok:
        missing = [n for n in ("kube-scheduler", "kwok") if not (BIN / n).is_file()]
        if missing:
            unavailable(f"{', '.join(missing)} not built in {BIN}: run deploy/cluster/build.sh")
    with tempfile.TemporaryDirectory(prefix="gemini-cluster-") as tmp:
        state = Path(tmp)
        started = subprocess.run(
            [str(ROOT / "deploy" / "cluster" / "start.sh"), str(state), str(BIN)]
            + (["kwok"] if kwok else []),
            capture_output=True,
            text=True,
            timeout=300,
        )
        env: dict[str, str] = {}
        if (state / "env").is_file():
            for line in (state / "env").read_text().splitlines():
                key, _, value = line.partition("=")
                env[key] = value.strip('"')
        try:
            assert started.returncode == 0, started.stderr
            c = Cluster(state, env)
            for group, kind, plural in (
                ("postgresql.cnpg.io", "Cluster", "clusters"),
                ("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
                ("monitoring.coreos.com", "PodMonitor", "podmonitors"),
                ("monitoring.coreos.com", "PrometheusRule", "prometheusrules"),
                ("cert-manager.io", "Certificate", "certificates"),
            ):
                c.api.create(
                    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                    crd(group, kind, plural),
                )
            for name, stage in (
                ("node-canary", "canary"),
                ("node-early", "early"),
                ("node-late", None),
            ):
                labels = {"kubernetes.io/hostname": name}
                if stage:
                    labels["gemini.io/rollout-stage"] = stage
                annotations = {"kwok.x-k8s.io/node": "fake"} if kwok else {}
                c.api.create(
                    "/api/v1/nodes",
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "metadata": {"name": name, "labels": labels, "annotations": annotations},
                    },
                )
            eventually(
                "the CRDs served",
                lambda: all(
                    c.api.get(f"/apis/{g}/v1")
                    for g in ("postgresql.cnpg.io", "monitoring.coreos.com", "cert-manager.io")
                ),
            )
            if kwok:
                yield c
            else:
                kubelet = threading.Thread(target=c.kubelet, daemon=True)
                kubelet.start()
                yield c
                c.stop.set()
                kubelet.join(timeout=10)
        finally:
            pids = env.get("GEMINI_CLUSTER_PIDS", "").split()
            for pid in reversed(pids):  # our own control plane, by its recorded process ids
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), 15)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with control_plane(kwok=False) as c:
        yield c


@pytest.fixture(scope="module")
def kwok_cluster() -> Iterator[Cluster]:
    with control_plane(kwok=True) as c:
        yield c


def render(c: Cluster, release: str, ns: str, *values: str) -> list[Doc]:
    result = c.helm("template", release, str(CHART), "-n", ns, *values)
    return [d for d in yaml.safe_load_all(result.stdout) if d]


# Booster alone with a chart-made URL Secret, in values the 0.2.0 chart took too.
BOOSTER_WITH_URL = [
    "--set", "agent.enabled=false", "--set", "database.external.existingSecret=",
    "--set", "database.external.url=postgresql+psycopg://gemini:secret@db:5432/gemini",
]  # fmt: skip
VALUE_SETS = {
    "defaults": [],
    "external-ingress-tls": ["-f", str(CI / "external-ingress-tls-values.yaml")],
    "cnpg-monitoring-staged": ["-f", str(CI / "cnpg-monitoring-staged-values.yaml")],
    "mutual-tls": ["-f", str(CI / "mutual-tls-values.yaml")],
    "booster-only": ["-f", str(CI / "booster-only-values.yaml")],
    "agent-only": ["-f", str(CI / "agent-only-values.yaml")],
}


def test_every_object_is_accepted_with_strict_field_validation(cluster: Cluster) -> None:
    cluster.namespace("strict", "privileged")
    for name, values in VALUE_SETS.items():
        for doc in render(cluster, "rel", "strict", *values):
            doc.get("metadata", {}).pop("namespace", None)
            path = collection(doc, "strict") + "?dryRun=All&fieldValidation=Strict"
            status, reply = cluster.api.call("POST", path, doc)
            assert status in (200, 201), (name, doc["kind"], doc["metadata"]["name"], reply)


def as_pod(template: Doc, name: str) -> Doc:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": template["metadata"].get("labels", {})},
        "spec": template["spec"],
    }


def test_admission_verdicts_are_the_ones_the_chart_documents(cluster: Cluster) -> None:
    """In a namespace enforcing `restricted`: Booster's, the migration's and the test pods are
    admitted; the agent pod is refused for exactly its documented grants (defect 2: hostPort
    9465 among them, which the API server adds to every host-network pod)."""
    cluster.namespace("restricted", "restricted")
    docs = render(cluster, "rel", "restricted")
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    for key in (("Deployment", "rel-gemini-booster"), ("Job", "rel-gemini-migrate")):
        pod = as_pod(by_kind[key]["spec"]["template"], key[1].lower() + "-pod")
        status, reply = cluster.api.call(
            "POST", "/api/v1/namespaces/restricted/pods?dryRun=All", pod
        )
        assert status == 201, (key, reply)
    test_pod = by_kind[("Pod", "rel-gemini-test")]
    test_pod["metadata"].pop("annotations")
    status, reply = cluster.api.call(
        "POST", "/api/v1/namespaces/restricted/pods?dryRun=All", test_pod
    )
    assert status == 201, reply
    # The agent pod, in a namespace enforcing `baseline`: refused for exactly its grants.
    cluster.namespace("baseline", "baseline")
    agent = as_pod(by_kind[("DaemonSet", "rel-gemini-agent")]["spec"]["template"], "agent")
    status, reply = cluster.api.call("POST", "/api/v1/namespaces/baseline/pods?dryRun=All", agent)
    assert status == 403, reply
    message = reply["message"]
    verdict = message.split('violates PodSecurity "baseline:latest": ', 1)[1]
    reasons = {reason.split(" (")[0] for reason in verdict.split("), ")}
    assert reasons == {
        "host namespaces",
        "hostPort",
        "hostPath volumes",
        "non-default capabilities",
    }, message
    assert 'hostPort (container "agent" uses hostPort 9465)' in message
    assert "host namespaces (hostNetwork=true)" in message


def helm_install(c: Cluster, release: str, ns: str, values: list[str]) -> None:
    c.helm("install", release, str(CHART), "-n", ns, *values, "--timeout", "120s")


def objects_of(c: Cluster, release: str, ns: str) -> dict[tuple[str, str], Doc]:
    manifest = c.helm("get", "manifest", release, "-n", ns).stdout
    found: dict[tuple[str, str], Doc] = {}
    for doc in yaml.safe_load_all(manifest):
        if doc:
            path = f"{collection(doc, ns)}/{doc['metadata']['name']}"
            live = c.api.get(path)
            assert live is not None, path
            found[(doc["kind"], doc["metadata"]["name"])] = live
    return found


def test_the_first_migration_runs_under_its_network_policy(cluster: Cluster) -> None:
    """Defect 3: the migration pod appears with its NetworkPolicy and URL Secret in place and
    no Deployment yet (with chart 0.2.0 the policy came 0.76 s after the pre-install Job)."""
    cluster.namespace("first", "restricted")
    helm_install(cluster, "gemini", "first", BOOSTER_WITH_URL)
    first = cluster.seen["first"][0]
    assert first["policy"] and all(first["secrets"].values()) and not first["deployment"], first
    cluster.helm("upgrade", "gemini", str(CHART), "-n", "first", *BOOSTER_WITH_URL)
    again = cluster.seen["first"][1]
    assert again["policy"] and all(again["secrets"].values()) and again["deployment"], again
    # `helm test` finds its Pod hook, admitted in this restricted namespace (its checks need a
    # running Booster: the stand-in kubelet ends the Pod as passed).
    result = cluster.helm("test", "gemini", "-n", "first")
    assert "TEST SUITE:     gemini-test" in result.stdout and "Succeeded" in result.stdout


def test_noop_upgrades_rewrite_nothing_then_rollback_and_uninstall(cluster: Cluster) -> None:
    """Defects 4 and 6: two upgrades that change nothing leave every object of the release as
    it was (same identity, generation; the URL Secret not deleted and recreated, as the 0.2.0
    chart's hook Secret was, nor the migrate NetworkPolicy rewritten: generation 1 → 3)."""
    cluster.namespace("booster", "restricted")
    values = BOOSTER_WITH_URL
    helm_install(cluster, "gemini", "booster", values)
    secret_path = "/api/v1/namespaces/booster/secrets/gemini-database"
    secret = cluster.api.get(secret_path)
    assert secret is not None
    before = objects_of(cluster, "gemini", "booster")
    for _ in range(2):
        cluster.helm("upgrade", "gemini", str(CHART), "-n", "booster", *values)
    assert len(cluster.seen["booster"]) == 3  # a migration per upgrade
    after_secret = cluster.api.get(secret_path)
    assert after_secret is not None
    assert after_secret["metadata"]["uid"] == secret["metadata"]["uid"]
    assert after_secret["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]
    after = objects_of(cluster, "gemini", "booster")
    assert before.keys() == after.keys()
    for key, doc in before.items():
        assert after[key]["metadata"]["uid"] == doc["metadata"]["uid"], key
        assert after[key]["metadata"].get("generation") == doc["metadata"].get("generation"), key
    cluster.helm("rollback", "gemini", "1", "-n", "booster")
    cluster.helm("uninstall", "gemini", "-n", "booster")
    assert cluster.api.get("/apis/apps/v1/namespaces/booster/deployments/gemini-booster") is None
    # The hook copies went with their successful Job: nothing of the release is left.
    left = [s["metadata"]["name"] for s in cluster.api.items("/api/v1/namespaces/booster/secrets")]
    assert not [name for name in left if name.startswith("gemini-")], left


def test_a_failed_migration_creates_no_deployment(cluster: Cluster) -> None:
    cluster.namespace("failing", "restricted")
    cluster.fail_migrations.add("failing")
    result = cluster.helm(
        "install",
        "gemini",
        str(CHART),
        "-n",
        "failing",
        *BOOSTER_WITH_URL,
        "--set",
        "migration.backoffLimit=0",
        "--timeout",
        "60s",
        check=False,
    )
    assert result.returncode != 0
    assert cluster.api.get("/apis/apps/v1/namespaces/failing/deployments/gemini-booster") is None


def test_cnpg_install_staged_rollout_and_uninstall_keeps_the_database(cluster: Cluster) -> None:
    """Defect 5 and the staged rollout: the main track on the `early` node only, the canary on
    the `canary` node only; `helm uninstall` leaves the CloudNativePG Cluster."""
    cluster.namespace("cnpg", "privileged")
    helm_install(cluster, "gemini", "cnpg", VALUE_SETS["cnpg-monitoring-staged"])
    assert cluster.seen["cnpg"][0]["policy"]

    def placed(ds: str) -> list[str] | None:
        pods = cluster.api.items(
            "/api/v1/namespaces/cnpg/pods?labelSelector=gemini.io%2Ftrack%3D" + ds
        )
        nodes = sorted(
            field["values"][0]
            for p in pods
            for term in p["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]["nodeSelectorTerms"]
            for field in term.get("matchFields", [])
        )
        return nodes or None

    assert eventually("main track placed", lambda: placed("main")) == ["node-early"]
    assert eventually("canary track placed", lambda: placed("canary")) == ["node-canary"]
    cluster.helm("uninstall", "gemini", "-n", "cnpg")
    kept = cluster.api.get("/apis/postgresql.cnpg.io/v1/namespaces/cnpg/clusters/gemini-pg")
    assert kept is not None
    assert cluster.api.get("/apis/apps/v1/namespaces/cnpg/daemonsets/gemini-agent") is None


def test_booster_and_agents_in_namespaces_of_their_own_levels(cluster: Cluster) -> None:
    """Defect 1: Booster in a `restricted` namespace, the agents in a `privileged` one; the
    DaemonSet controller creates agent pods there (in the restricted namespace the same
    DaemonSet gets none: FailedCreate)."""
    cluster.namespace("gemini", "restricted")
    cluster.namespace("gemini-agents", "privileged")
    helm_install(cluster, "gemini", "gemini", VALUE_SETS["booster-only"])
    helm_install(cluster, "agents", "gemini-agents", VALUE_SETS["agent-only"])
    assert cluster.api.items("/apis/apps/v1/namespaces/gemini/daemonsets") == []
    pods = eventually(
        "agent pods created",
        lambda: cluster.api.items(
            "/api/v1/namespaces/gemini-agents/pods?labelSelector=gemini.io%2Ftrack%3Dmain"
        ),
    )
    assert len(pods) == 2  # the canary and early nodes (stages [canary, early])
    cluster.namespace("all-in-restricted", "restricted")
    helm_install(cluster, "gemini", "all-in-restricted", [])

    def refused() -> list[str]:
        events = cluster.api.items("/api/v1/namespaces/all-in-restricted/events")
        return [e["message"] for e in events if e.get("reason") == "FailedCreate"]

    messages = eventually("the agent pods refused", refused)
    assert any('hostPort (container "agent" uses hostPort 9465)' in m for m in messages), messages


def test_pods_come_up_with_kwok_readiness_pdb_rolling_update_and_staged_agents(
    kwok_cluster: Cluster,
) -> None:
    """With kube-scheduler and kwok's fake kubelets: the migration Job succeeds, `helm install
    --wait` sees Booster's replicas ready and its PodDisruptionBudget allowing one disruption;
    an upgrade that changes the pods rolls them all; the agents' release has a ready pod on
    each node of its stages."""
    c = kwok_cluster
    c.namespace("live", "restricted")
    values = VALUE_SETS["booster-only"]
    c.helm("install", "gemini", str(CHART), "-n", "live", *values, "--wait", "--timeout", "120s")
    deploy_path = "/apis/apps/v1/namespaces/live/deployments/gemini-booster"
    deploy = c.api.get(deploy_path)
    assert deploy is not None and deploy["status"].get("readyReplicas") == 2, deploy
    pdb = c.api.get("/apis/policy/v1/namespaces/live/poddisruptionbudgets/gemini-booster")
    assert pdb is not None
    pdb_status = eventually("the PDB observed", lambda: pdb_ready(c))
    assert pdb_status["disruptionsAllowed"] == 1 and pdb_status["currentHealthy"] == 2
    c.helm(
        "upgrade", "gemini", str(CHART), "-n", "live", *values,
        "--set-string", "booster.podAnnotations.rev=2", "--wait", "--timeout", "120s",
    )  # fmt: skip
    deploy = c.api.get(deploy_path)
    assert deploy is not None
    status = deploy["status"]
    assert status["observedGeneration"] == deploy["metadata"]["generation"] == 2
    assert status.get("updatedReplicas") == status.get("readyReplicas") == 2, status
    c.namespace("live-agents", "privileged")
    c.helm(
        "install", "agents", str(CHART), "-n", "live-agents", *VALUE_SETS["agent-only"],
        "--wait", "--timeout", "120s",
    )  # fmt: skip
    ds = c.api.get("/apis/apps/v1/namespaces/live-agents/daemonsets/agents-gemini-agent")
    assert ds is not None
    assert ds["status"]["desiredNumberScheduled"] == ds["status"]["numberReady"] == 2, ds["status"]
    pods = c.api.items("/api/v1/namespaces/live-agents/pods")
    assert sorted(p["spec"]["nodeName"] for p in pods) == ["node-canary", "node-early"]


def pdb_ready(c: Cluster) -> Doc | None:
    pdb = c.api.get("/apis/policy/v1/namespaces/live/poddisruptionbudgets/gemini-booster")
    status = (pdb or {}).get("status", {})
    return status if status.get("currentHealthy") == 2 else None
