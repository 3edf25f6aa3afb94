"""tcp_gemini's copy of the θ table in a real kernel: Debian's stock kernel under qemu, one boot.

The same table code serves tcp_fusion, tcp_gemini and tcp_dcvegas (fusion-kmod/cc_table.h);
this test drives GEMINI's copy the way the agent drives Fusion's, in the sender's network
namespace. The guest job (GUEST_JOB below):
  - loads tcp_gemini.ko; the namespace's net.gemini.* sysctls read the module parameters
    (the host's θ) until written, refuse a value outside region Θ' and keep one inside;
  - asks generic netlink family "gemini" (Fusion's ABI, fusion_uapi.h) to install a table
    whose profile has a θ outside Θ' (refused, with the parameter named, and nothing
    installed), then a table with one profile for 10.9.0.2/32 (ecn_k and
    delay_threshold_us changed), and reads it back;
  - runs one GEMINI flow to 10.9.0.2 (the rule) and one to 10.9.0.3 (the default), each
    reading its own F = 4K/(C·RTT_base + K) back through sock_diag while connected;
  - collects the flow records multicast on the family's "flows" group, and unloads.
So a per-destination θ is shown to take effect (each socket's F follows its profile's K) and
to be reported (each record carries the profile id, version and θ its flow ran), and an
out-of-range θ never reaches the module. The kernel log of the boot has no WARNING or trace.

Cost: one qemu boot and two flows of 4 MB, about as long as tests/test_lab_datapaths.py's
boot (lab tier). Needs what the other qemu lab tests need (lab/install-deps.sh).
"""

from __future__ import annotations

import pytest

from gemini_api.theta import SPECS_DIR, load_spec
from gemini_lab.host import KMOD_DIR, build_module
from gemini_lab.vm import LabError, find_kernel
from tests.labkit import run_guest_job

pytestmark = [pytest.mark.lab, pytest.mark.slow]

RULE_ADDR, DEFAULT_ADDR = "10.9.0.2", "10.9.0.3"
PROFILE_ID = 7
# the rule's θ: the defaults with K and T moved inside Θ' (F depends on K)
RULE_CHANGES = {"ecn_k": 200, "delay_threshold_us": 7000}
# the namespace's own default: one sysctl written, the rest the module parameters
SYSCTL_CHANGE = ("wan_decrease", 30)
CAPACITY_MBIT = 1000  # capacity_mbit's default: C in F
FLOW_BYTES = 4 * 1024 * 1024
EINVAL = 22

GUEST_JOB = r'''
import json, os, socket, struct, subprocess, sys, time

kmod_dir, plan_path, out_path = sys.argv[1:4]
plan = json.load(open(plan_path))
SND, RCV, PORT = "pt-snd", "pt-rcv", 5201


def sh(*cmd):
    p = subprocess.run(list(cmd), capture_output=True, text=True)
    return {"rc": p.returncode, "out": (p.stdout + p.stderr)[-2000:]}


def link():
    for ns in (SND, RCV):
        sh("ip", "netns", "del", ns)
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    steps = [
        sh("ip", "link", "add", "pts", "netns", SND, "type", "veth", "peer", "name", "ptr",
           "netns", RCV),
        sh("ip", "-n", SND, "addr", "add", "10.9.0.1/24", "dev", "pts"),
        sh("ip", "-n", RCV, "addr", "add", plan["rule_addr"] + "/24", "dev", "ptr"),
        sh("ip", "-n", RCV, "addr", "add", plan["default_addr"] + "/24", "dev", "ptr"),
        sh("ip", "-n", SND, "link", "set", "pts", "up"),
        sh("ip", "-n", RCV, "link", "set", "ptr", "up"),
    ]
    return [s for s in steps if s["rc"] != 0]


RECEIVER = """
import socket, sys
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("0.0.0.0", int(sys.argv[1])))
l.listen(4)
print("listening", flush=True)
for _ in range(int(sys.argv[2])):
    c, _ = l.accept()
    while c.recv(1 << 16):
        pass
    c.close()
"""

# In the sender's namespace: the sysctls, the family, two flows, the records.
SENDER = r"""
import json, os, socket, struct, sys, time
from pyroute2 import DiagSocket, GenericNetlinkSocket
from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from gemini_api.fusion_genl import fusion_msg

plan = json.loads(sys.argv[1])
names, port = plan["names"], plan["port"]
SYSCTL = "/proc/sys/net/gemini/"
out = {}


def read(name):
    return open(SYSCTL + name).read().strip()


def write(name, value):
    try:
        with open(SYSCTL + name, "w") as f:
            f.write(str(value))
        return 0
    except OSError as e:
        return e.errno


def request(sock, cmd, attrs):
    msg = fusion_msg()
    msg["cmd"], msg["version"], msg["attrs"] = cmd, 1, attrs
    try:
        return list(sock.nlm_request(msg, msg_type=sock.prid,
                                     msg_flags=NLM_F_REQUEST | NLM_F_ACK)), None
    except NetlinkError as e:
        return None, {"code": e.code, "msg": str(e)}


def table(theta, rule_addr):
    blob = struct.pack("=%dI" % len(names), *(theta[n] for n in names))
    return [
        ("FUSION_ATTR_PROFILE", {"attrs": [("FUSION_PROFILE_ATTR_ID", plan["profile_id"]),
                                           ("FUSION_PROFILE_ATTR_THETA", blob)]}),
        ("FUSION_ATTR_RULE", {"attrs": [("FUSION_RULE_ATTR_FAMILY", socket.AF_INET),
                                        ("FUSION_RULE_ATTR_ADDR", socket.inet_aton(rule_addr)),
                                        ("FUSION_RULE_ATTR_PREFIX_LEN", 32),
                                        ("FUSION_RULE_ATTR_PROFILE_ID", plan["profile_id"])]}),
    ]


def flow(addr):
    s = socket.socket()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"gemini")
    s.connect((addr, port))
    s.sendall(b"x" * plan["flow_bytes"])
    sport = s.getsockname()[1]
    diag = {}
    with DiagSocket() as ds:
        ds.bind()
        for m in ds.get_sock_stats(family=socket.AF_INET, extensions=(1 << 1) | (1 << 3)):
            if m["idiag_sport"] != sport:
                continue
            bbr, ti = m.get_attr("INET_DIAG_BBRINFO"), m.get_attr("INET_DIAG_INFO")
            diag = {"f": bbr.get("bbr_pacing_gain"), "rtt_base_us": bbr.get("bbr_min_rtt"),
                    "mss": ti.get("tcpi_snd_mss"), "cc": m.get_attr("INET_DIAG_CONG")}
    s.close()
    return {"sport": sport, "diag": diag}


out["sysctl_before"] = {n: read(n) for n in names}
name, value = plan["sysctl_change"]
out["sysctl_bad"] = [write(name, v) for v in plan["sysctl_bad"]]
out["sysctl_after_bad"] = read(name)
out["sysctl_ok"] = write(name, value)
out["sysctl_after"] = {n: read(n) for n in names}

nl = GenericNetlinkSocket()
nl.bind("gemini", fusion_msg)
nl.setsockopt(270, 11, 1)  # NETLINK_EXT_ACK: the module's reason for a refusal
records = GenericNetlinkSocket()
records.bind("gemini", fusion_msg)
records.add_membership("flows")

_, out["bad_table"] = request(nl, 1, table(plan["bad_theta"], plan["rule_addr"]))
replies, _ = request(nl, 2, [])
out["after_bad"] = {"version": replies[0].get_attr("FUSION_ATTR_VERSION"),
                    "profiles": len(replies[0].get_attrs("FUSION_ATTR_PROFILE"))}
replies, out["set_error"] = request(nl, 1, table(plan["rule_theta"], plan["rule_addr"]))
out["table_version"] = replies[0].get_attr("FUSION_ATTR_VERSION") if replies else None
replies, _ = request(nl, 2, [])
out["read_back"] = [
    {"id": p.get_attr("FUSION_PROFILE_ATTR_ID"),
     "theta": list(struct.unpack("=%dI" % len(names), p.get_attr("FUSION_PROFILE_ATTR_THETA")))}
    for p in replies[0].get_attrs("FUSION_ATTR_PROFILE")
]

out["flows"] = {addr: flow(addr) for addr in (plan["rule_addr"], plan["default_addr"])}
# each record is one datagram: read them straight from the socket (pyroute2's get() buffers
# what it read beyond the first message out of sight of a timeout)
raw = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 16, fileno=os.dup(records.fileno()))
raw.settimeout(1.0)
recs, deadline = [], time.time() + 120  # a loaded TCG guest tears sockets down slowly
while len(recs) < 2 and time.time() < deadline:
    try:
        m = fusion_msg(raw.recv(65536))
    except socket.timeout:
        continue
    m.decode()
    if m["cmd"] == 4:
        recs.append({
            "daddr": socket.inet_ntoa(m.get_attr("FUSION_ATTR_REC_DADDR")),
            "sport": m.get_attr("FUSION_ATTR_REC_SPORT"),
            "profile_id": m.get_attr("FUSION_ATTR_REC_PROFILE_ID"),
            "profile_version": m.get_attr("FUSION_ATTR_REC_PROFILE_VERSION"),
            "bytes_acked": m.get_attr("FUSION_ATTR_REC_BYTES_ACKED"),
            "theta": list(struct.unpack("=%dI" % len(names),
                                        m.get_attr("FUSION_ATTR_REC_THETA"))),
        })
raw.close()
out["records"] = recs
replies, _ = request(nl, 3, [])
out["stats"] = {k: replies[0].get_attr("FUSION_ATTR_STAT_" + k.upper())
                for k in ("flows", "records", "dropped", "nostate")}
nl.close()
records.close()
print(json.dumps(out), flush=True)
"""


def unload():
    for _ in range(20):  # sockets being torn down may hold the module for a moment
        r = sh("rmmod", "tcp_gemini")
        if r["rc"] == 0:
            return r
        time.sleep(0.5)
    return r


results = {"link_errors": link()}
results["insmod"] = sh("insmod", os.path.join(kmod_dir, "tcp_gemini.ko"))
results["root_sysctl"] = open("/proc/sys/net/gemini/ecn_k").read().strip()
rcv = subprocess.Popen(["ip", "netns", "exec", RCV, sys.executable, "-c", RECEIVER,
                        str(PORT), "2"], stdout=subprocess.PIPE, text=True)
rcv.stdout.readline()  # "listening"
sender_plan = dict(plan, port=PORT)
snd = subprocess.run(["ip", "netns", "exec", SND, sys.executable, "-c", SENDER,
                      json.dumps(sender_plan)], capture_output=True, text=True, timeout=300,
                     env=dict(os.environ, PYTHONPATH=plan["pythonpath"]))
rcv.wait(timeout=60)
results["sender_rc"], results["sender_err"] = snd.returncode, snd.stderr[-3000:]
try:
    results["sender"] = json.loads(snd.stdout.strip().splitlines()[-1])
except (IndexError, ValueError):
    results["sender_out"] = snd.stdout[-2000:]
results["root_sysctl_after"] = open("/proc/sys/net/gemini/ecn_k").read().strip()
results["rmmod"] = unload()
json.dump(results, open(out_path, "w"), indent=1)
'''


def _spec():
    return load_spec(SPECS_DIR / "gemini.toml")


def _plan() -> dict:
    spec = _spec()
    default = spec.default()
    name, value = SYSCTL_CHANGE
    lo, hi = spec.param(name).wide
    return {
        "names": [p.name for p in spec.params],
        "rule_theta": default | RULE_CHANGES,
        "bad_theta": default | {"ecn_k": spec.param("ecn_k").wide[1] + 1},
        "sysctl_change": [name, value],
        "sysctl_bad": [hi + 1, lo - 1],
        "rule_addr": RULE_ADDR,
        "default_addr": DEFAULT_ADDR,
        "profile_id": PROFILE_ID,
        "flow_bytes": FLOW_BYTES,
        "pythonpath": ":".join(str(KMOD_DIR.parent / d) for d in ("api", "agent", "lab")),
    }


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    try:
        kernel = find_kernel()
    except LabError as exc:
        pytest.skip(str(exc))
    try:
        build_module(kernel)  # W=1, every module; raises on any warning
    except LabError as exc:
        if "no headers" in str(exc):
            pytest.skip(str(exc))
        raise
    out = tmp_path_factory.mktemp("lab-datapath-profiles")
    return run_guest_job(out, kernel, GUEST_JOB, KMOD_DIR, _plan())


def _sender(lab: dict) -> dict:
    assert lab["guest_rc"] == 0 and lab["link_errors"] == [], lab["job_log"]
    assert lab["insmod"]["rc"] == 0, lab["insmod"]
    assert "sender" in lab, (lab.get("sender_err"), lab.get("sender_out"))
    return lab["sender"]


def _f(theta: dict[str, int], diag: dict) -> int:
    """GEMINI's F = 4K/(C·RTT_base + K) in 1/1024, as the module computes it."""
    k_bits = theta["ecn_k"] * diag["mss"] * 8
    return (4 * k_bits << 10) // (CAPACITY_MBIT * diag["rtt_base_us"] + k_bits)


def test_namespace_sysctls_follow_the_host_until_written_and_are_bounded(lab):
    s = _sender(lab)
    default = _spec().default()
    name, value = SYSCTL_CHANGE
    assert s["sysctl_before"] == {n: str(v) for n, v in default.items()}
    assert s["sysctl_bad"] == [EINVAL, EINVAL]
    assert s["sysctl_after_bad"] == str(default[name])
    assert s["sysctl_ok"] == 0
    assert s["sysctl_after"] == {n: str(v) for n, v in (default | {name: value}).items()}
    # the sender's namespace has its own: the host's (and other namespaces') stays
    assert lab["root_sysctl"] == lab["root_sysctl_after"] == str(default["ecn_k"])


def test_a_table_with_theta_outside_theta_prime_is_refused_and_installs_nothing(lab):
    s = _sender(lab)
    assert s["bad_table"]["code"] == EINVAL, s["bad_table"]
    assert "ecn_k outside region Theta'" in s["bad_table"]["msg"], s["bad_table"]
    assert s["after_bad"] == {"version": 0, "profiles": 0}


def test_the_table_installs_and_reads_back(lab):
    s = _sender(lab)
    assert s["set_error"] is None, s["set_error"]
    names = [p.name for p in _spec().params]
    rule_theta = _plan()["rule_theta"]
    assert s["read_back"] == [{"id": PROFILE_ID, "theta": [rule_theta[n] for n in names]}]


def test_each_flow_runs_its_destinations_theta(lab):
    """Per socket, through sock_diag: F follows the K of the flow's profile (K = 200 for the
    rule's destination, the default 50 elsewhere), so the table's θ is what the CC ran."""
    flows = _sender(lab)["flows"]
    plan = _plan()
    rule, dflt = flows[RULE_ADDR]["diag"], flows[DEFAULT_ADDR]["diag"]
    assert rule["cc"] == dflt["cc"] == "gemini"
    assert rule["rtt_base_us"] > 0 and dflt["rtt_base_us"] > 0
    assert rule["f"] == _f(plan["rule_theta"], rule)
    assert dflt["f"] == _f(_spec().default(), dflt)
    assert rule["f"] != _f(_spec().default(), rule)  # the two θ tell apart on this path


def test_each_flow_record_carries_the_theta_it_ran(lab):
    s = _sender(lab)
    plan = _plan()
    names = plan["names"]
    by_addr = {r["daddr"]: r for r in s["records"]}
    assert set(by_addr) == {RULE_ADDR, DEFAULT_ADDR}, s["records"]
    rule, dflt = by_addr[RULE_ADDR], by_addr[DEFAULT_ADDR]
    assert (rule["profile_id"], rule["profile_version"]) == (PROFILE_ID, s["table_version"])
    assert rule["theta"] == [plan["rule_theta"][n] for n in names]
    name, value = SYSCTL_CHANGE
    own_default = _spec().default() | {name: value}
    assert dflt["profile_id"] == 0
    assert dflt["theta"] == [own_default[n] for n in names]
    for addr, r in by_addr.items():
        assert r["sport"] == s["flows"][addr]["sport"]
        assert r["bytes_acked"] >= FLOW_BYTES
    assert s["stats"]["flows"] == s["stats"]["records"] == 2
    assert s["stats"]["dropped"] == s["stats"]["nostate"] == 0


def test_module_unloads_without_kernel_warning(lab):
    assert lab["rmmod"]["rc"] == 0, lab["rmmod"]
    assert lab["kernel_problems"] == [], lab["kernel_problems"]
