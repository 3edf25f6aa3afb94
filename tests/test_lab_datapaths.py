"""tcp_gemini and tcp_dcvegas in a real kernel: Debian's stock kernel under qemu, one boot.

For each module the guest job (GUEST_JOB below) checks:
  - an out-of-range θ given at load time (insmod name=value) makes the load fail;
  - the module loads and `net.ipv4.tcp_available_congestion_control` lists its CC;
  - every θ parameter under /sys/module/tcp_<name>/parameters refuses a write just outside
    region Θ' (and a non-number), and keeps an in-range write (read back), as does GEMINI's
    non-θ capacity_mbit; the defaults read back as the spec's;
  - a flow with that CC carries data between two network namespaces over a shaped link
    (20 Mbit/s with CE marking at 1 ms of queue, as fq_codel's ce_threshold does, 5 ms on
    the ACK path), sender and receiver both running it; GEMINI negotiates ECN end to end
    and reports α through ss, DC-Vegas runs without ECN;
  - the module unloads;
and the kernel log of the whole boot has no WARNING, BUG, oops or trace.

The modules are built here with W=1 against the guest kernel's headers, or taken from
$GEMINI_LAB_KMOD_DIR (e.g. var/trixie/out from fusion-kmod/build-in-trixie.sh build, with
GEMINI_LAB_KERNEL_ROOT=var/trixie/kernel to boot Debian 13's 6.12). Needs what the other qemu
lab tests need (lab/install-deps.sh); without it the tests skip and say what is missing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gemini_api.theta import SPECS_DIR, ThetaSpec, load_spec
from gemini_lab.host import KMOD_DIR, build_module
from gemini_lab.vm import LabError, find_kernel
from tests.labkit import run_guest_job

pytestmark = [pytest.mark.lab, pytest.mark.slow]

MODULES = ("gemini", "dcvegas")
KMOD_DIR_ENV = "GEMINI_LAB_KMOD_DIR"
TCPI_OPT_ECN = 8  # struct tcp_info's tcpi_options: ECN was negotiated
FLOW_S = 4.0
# GEMINI's non-θ parameter: default, an in-range value, and values outside its bounds
CAPACITY = {"name": "capacity_mbit", "default": 1000, "ok": 100, "bad": [0, 1000001]}
# GEMINI with T at its floor (100 µs): any queue at all is WAN congestion, so delay cuts happen
DELAY_VARIANT = {"label": "delay-variant", "set": {"delay_threshold_us": 100}}
H_UNITS_PER_GBIT_BIT = 10_000_000  # h in 1/100 packet = H · C[Mbit/s] · RTT[µs] / 1e7

GUEST_JOB = r'''
import json, os, socket, subprocess, sys, time

kmod_dir, plan_path, out_path = sys.argv[1:4]
plan = json.load(open(plan_path))
SND, RCV, ADDR, PORT = "dp-snd", "dp-rcv", "10.9.0.2", 5201


def sh(*cmd):
    p = subprocess.run(list(cmd), capture_output=True, text=True)
    return {"rc": p.returncode, "out": (p.stdout + p.stderr)[-2000:]}


def write(path, value):
    """errno of writing value to a sysfs file, 0 when it took."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, str(value).encode())
        return 0
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)


def read(path):
    with open(path) as f:
        return f.read().strip()


def check_params(name, params):
    base = f"/sys/module/tcp_{name}/parameters"
    result = {}
    for p in params:
        path = f"{base}/{p['name']}"
        result[p["name"]] = {
            "default": read(path),
            "refused": [write(path, v) for v in p["bad"] + ["abc"]],
            "after_refused": read(path),
            "ok_errno": write(path, p["ok"]),
            "ok_read": read(path),
        }
        write(path, p["default"])
    return result


def link():
    for ns in (SND, RCV):
        sh("ip", "netns", "del", ns)
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    steps = [
        sh("ip", "link", "add", "dps", "netns", SND, "type", "veth", "peer", "name", "dpr",
           "netns", RCV),
        sh("ip", "-n", SND, "addr", "add", "10.9.0.1/24", "dev", "dps"),
        sh("ip", "-n", RCV, "addr", "add", ADDR + "/24", "dev", "dpr"),
        sh("ip", "-n", SND, "link", "set", "dps", "up"),
        sh("ip", "-n", RCV, "link", "set", "dpr", "up"),
        sh("tc", "-n", SND, "qdisc", "add", "dev", "dps", "root", "handle", "1:", "tbf",
           "rate", "20mbit", "burst", "3000", "latency", "200ms"),
        sh("tc", "-n", SND, "qdisc", "add", "dev", "dps", "parent", "1:1", "handle", "10:",
           "fq_codel", "ce_threshold", "1ms", "ecn", "target", "100ms", "interval", "1s"),
        sh("tc", "-n", RCV, "qdisc", "add", "dev", "dpr", "root", "netem", "delay", "5ms"),
    ]
    return [s for s in steps if s["rc"] != 0]


RECEIVER = """
import json, socket, sys
cc = sys.argv[1].encode()
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc)
l.bind((sys.argv[2], int(sys.argv[3])))
l.listen(1)
print("listening", flush=True)
c, _ = l.accept()
n = 0
while True:
    d = c.recv(1 << 16)
    if not d:
        break
    n += len(d)
used = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\\0")[0].decode()
print(json.dumps({"received": n, "cc": used}), flush=True)
"""

SENDER = """
import json, socket, subprocess, sys, time
cc, addr, port, dur = sys.argv[1].encode(), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
s = socket.socket()
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc)
s.connect((addr, port))
buf, sent, end = b"x" * 65536, 0, time.time() + dur
while time.time() < end:
    sent += s.send(buf)
ss = subprocess.run(["ss", "-tin", "dst", addr], capture_output=True, text=True).stdout
info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
used = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\\0")[0].decode()
# sock_diag without VEGASINFO: tcp_info, the CC's name, and GEMINI's BBR-format record
from pyroute2 import DiagSocket
diag = {}
with DiagSocket() as ds:
    ds.bind()
    for m in ds.get_sock_stats(family=socket.AF_INET, extensions=INFO | CONG):
        bbr, ti = m.get_attr("INET_DIAG_BBRINFO"), m.get_attr("INET_DIAG_INFO")
        if m.get_attr("INET_DIAG_CONG") == cc.decode() and bbr is not None:
            diag = {k: bbr.get(k) for k in BBR_FIELDS}
            diag["snd_mss"], diag["min_rtt"] = ti.get("tcpi_snd_mss"), ti.get("tcpi_min_rtt")
s.close()
out = {"sent": sent, "options": info[5], "ss": ss, "cc": used, "diag": diag}
print(json.dumps(out), flush=True)
"""
SENDER = "INFO, CONG = 1 << 1, 1 << 3\nBBR_FIELDS = %r\n" % (
    ("bbr_bw_lo", "bbr_bw_hi", "bbr_min_rtt", "bbr_pacing_gain", "bbr_cwnd_gain"),
) + SENDER


def flow(name, duration):
    rcv = subprocess.Popen(["ip", "netns", "exec", RCV, sys.executable, "-c", RECEIVER, name,
                            ADDR, str(PORT)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    rcv.stdout.readline()  # "listening"
    snd = subprocess.run(["ip", "netns", "exec", SND, sys.executable, "-c", SENDER, name, ADDR,
                          str(PORT), str(duration)], capture_output=True, text=True,
                         timeout=120)
    out, _ = rcv.communicate(timeout=60)
    result = {"sender_rc": snd.returncode, "sender_err": snd.stderr[-2000:]}
    try:
        result["sender"] = json.loads(snd.stdout.strip().splitlines()[-1])
        result["receiver"] = json.loads(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        result["receiver_out"] = out[-2000:]
    return result


def unload(name):
    for _ in range(20):  # sockets being torn down may hold the module for a moment
        r = sh("rmmod", f"tcp_{name}")
        if r["rc"] == 0:
            return r
        time.sleep(0.5)
    return r


sh("modprobe", "sch_fq_codel")
results = {"link_errors": link()}
for m in plan["modules"]:
    name, ko = m["name"], os.path.join(kmod_dir, f"tcp_{m['name']}.ko")
    first = m["params"][0]
    r = {"insmod_bad": sh("insmod", ko, f"{first['name']}={first['bad'][0]}")}
    r["insmod"] = sh("insmod", ko)
    r["available"] = read("/proc/sys/net/ipv4/tcp_available_congestion_control").split()
    r["params"] = check_params(name, m["params"] + m["extra"])
    r["flow"] = flow(name, plan["flow_s"])
    for v in m["variants"]:  # θ set for one more flow, then back to the defaults
        base = f"/sys/module/tcp_{name}/parameters"
        r[v["label"]] = {"set": {k: write(f"{base}/{k}", x) for k, x in v["set"].items()}}
        r[v["label"]]["flow"] = flow(name, plan["flow_s"])
        for p in m["params"]:
            write(f"{base}/{p['name']}", p["default"])
    r["rmmod"] = unload(name)
    r["loaded_after_rmmod"] = os.path.isdir(f"/sys/module/tcp_{name}")
    results[name] = r
    json.dump(results, open(out_path, "w"), indent=1)
json.dump(results, open(out_path, "w"), indent=1)
'''


def _spec(name: str) -> ThetaSpec:
    return load_spec(SPECS_DIR / f"{name}.toml")


def _in_range(lo_hi: tuple[int, int], default: int) -> int:
    """A value of the production region other than the default, so that a write shows."""
    lo, hi = lo_hi
    return hi if hi != default else lo


def _plan() -> dict:
    modules = []
    for name in MODULES:
        spec = _spec(name)
        params = [
            {
                "name": p.name,
                "default": p.default,
                "ok": _in_range(p.production, p.default),
                "bad": [p.wide[1] + 1] + ([p.wide[0] - 1] if p.wide[0] > 0 else []),
            }
            for p in spec.params
        ]
        extra = [CAPACITY] if name == "gemini" else []
        variants = [DELAY_VARIANT] if name == "gemini" else []
        modules.append({"name": name, "params": params, "extra": extra, "variants": variants})
    return {"modules": modules, "flow_s": FLOW_S}


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    try:
        kernel = find_kernel()
    except LabError as exc:
        pytest.skip(str(exc))
    given = os.environ.get(KMOD_DIR_ENV)
    if given:
        kmod_dir = Path(given).resolve()
    else:
        try:
            build_module(kernel)  # W=1, all three modules; raises on any warning
        except LabError as exc:
            if "no headers" in str(exc):
                pytest.skip(str(exc))
            raise
        kmod_dir = KMOD_DIR
    for name in MODULES:
        assert (kmod_dir / f"tcp_{name}.ko").is_file(), f"no tcp_{name}.ko in {kmod_dir}"
    out = tmp_path_factory.mktemp("lab-datapaths")
    return run_guest_job(out, kernel, GUEST_JOB, kmod_dir, _plan())


def _module(lab: dict, name: str) -> dict:
    assert name in lab, f"the guest job stopped before {name}:\n{lab['job_log']}"
    return lab[name]


def test_the_guest_job_ran_to_its_end_on_a_working_link(lab):
    assert lab["guest_rc"] == 0, lab["job_log"]
    assert lab["link_errors"] == []


@pytest.mark.parametrize("name", MODULES)
def test_module_loads_and_is_an_available_congestion_control(lab, name):
    r = _module(lab, name)
    assert r["insmod"]["rc"] == 0, r["insmod"]
    assert name in r["available"]


@pytest.mark.parametrize("name", MODULES)
def test_an_out_of_range_theta_at_load_time_fails_the_load(lab, name):
    assert _module(lab, name)["insmod_bad"]["rc"] != 0


@pytest.mark.parametrize("name", MODULES)
def test_parameters_refuse_writes_outside_theta_prime_and_keep_writes_inside(lab, name):
    got = _module(lab, name)["params"]
    plan = next(m for m in _plan()["modules"] if m["name"] == name)
    assert set(got) == {p["name"] for p in plan["params"] + plan["extra"]}
    einval = 22
    for p in plan["params"] + plan["extra"]:
        r = got[p["name"]]
        assert r["default"] == str(p["default"]), p["name"]
        assert r["refused"] == [einval] * (len(p["bad"]) + 1), (p["name"], r)
        assert r["after_refused"] == str(p["default"]), p["name"]
        assert (r["ok_errno"], r["ok_read"]) == (0, str(p["ok"])), p["name"]


@pytest.mark.parametrize("name", MODULES)
def test_a_flow_with_the_module_carries_data(lab, name):
    f = _module(lab, name)["flow"]
    assert f["sender_rc"] == 0, f
    assert "sender" in f and "receiver" in f, f
    assert f["sender"]["cc"] == name and f["receiver"]["cc"] == name
    assert f["receiver"]["received"] > 1_000_000, f  # 20 Mbit/s for seconds, under emulation
    assert f["receiver"]["received"] <= f["sender"]["sent"]


def test_gemini_negotiates_ecn_and_reports_alpha(lab):
    f = _module(lab, "gemini")["flow"]["sender"]
    assert f["options"] & TCPI_OPT_ECN, f
    info = re.search(r"dctcp:\(ce_state:(\d+),alpha:(\d+),ab_ecn:(\d+),ab_tot:(\d+)\)", f["ss"])
    assert info, f["ss"]
    assert 0 <= int(info.group(2)) <= 1024


def _gemini_diag(flow: dict) -> dict:
    diag = flow["sender"]["diag"]
    assert diag, flow["sender"]
    return diag


def test_gemini_exports_rtt_base_f_and_h_as_its_equations_give(lab):
    """F = 4K/(C·RTT_base + K) and h = H·C·RTT_base within [h_min, h_max], in the module's
    fixed point, from the RTT_base it reports (C = capacity_mbit's default, θ the defaults)."""
    diag = _gemini_diag(_module(lab, "gemini")["flow"])
    theta = _spec("gemini").default()
    base_us, mss = diag["bbr_min_rtt"], diag["snd_mss"]
    assert 0 < base_us <= diag["min_rtt"]
    bdp_bits = CAPACITY["default"] * base_us
    k_bits = theta["ecn_k"] * mss * 8
    assert diag["bbr_pacing_gain"] == (4 * k_bits << 10) // (bdp_bits + k_bits)
    h = bdp_bits * theta["increase_h"] // H_UNITS_PER_GBIT_BIT
    assert diag["bbr_cwnd_gain"] == min(max(h, theta["increase_min"]), theta["increase_max"])


def test_gemini_cuts_on_ecn_marks(lab):
    """The link marks CE from 1 ms of queue: the receiver echoes it and the sender cuts."""
    cuts = _gemini_diag(_module(lab, "gemini")["flow"])["bbr_bw_hi"]
    assert cuts & 0xFFFF >= 1, cuts


def test_gemini_cuts_on_delay_when_the_threshold_is_below_the_queue(lab):
    variant = _module(lab, "gemini")["delay-variant"]
    assert variant["set"] == {"delay_threshold_us": 0}  # errno 0: the write took
    cuts = _gemini_diag(variant["flow"])["bbr_bw_hi"]
    assert cuts >> 16 >= 1, cuts
    assert variant["flow"]["receiver"]["received"] > 1_000_000


def test_dcvegas_runs_without_ecn(lab):
    f = _module(lab, "dcvegas")["flow"]["sender"]
    assert not f["options"] & TCPI_OPT_ECN, f
    assert re.search(r"dctcp:\(ce_state:0,alpha:\d+,", f["ss"]), f["ss"]


@pytest.mark.parametrize("name", MODULES)
def test_module_unloads(lab, name):
    r = _module(lab, name)
    assert r["rmmod"]["rc"] == 0, r["rmmod"]
    assert not r["loaded_after_rmmod"]


def test_no_kernel_warning(lab):
    assert lab["kernel_problems"] == [], lab["kernel_problems"]
