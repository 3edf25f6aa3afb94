"""gemini-lab: run Fusion and other CCs over emulated Table IV links in a real kernel.

gemini-lab run [--scenario ethernet ...] [--cc fusion --cc cubic ...] [--theta k=v ...]
gemini-lab bench        the Table IV comparison and CPU cost, written to benchmarks/results/
gemini-lab check        the acceptance plans (outcomes in UML, the module in qemu); exit 1
                        if any experiment fails
gemini-lab records      short fusion flows as fast as the guest makes them; records lost?
gemini-lab loop         Booster here + agent in the guest: the closed loop, plot in PNG
gemini-lab landscape    utility of fixed θ on the loop's paths (--theta k=v,k=v per cell)
gemini-lab tune         Booster tunes all of θ on scenarios (several = several contexts at once)
gemini-lab determinism  the same flows idle and with every host core busy, compared
gemini-lab abtest       an A/B experiment (cubic vs tuned fusion, crossover) over lab hosts
gemini-lab fairness     RTT fairness and cubic-friendliness, two flows on one bottleneck (UML)
gemini-lab cubic        Booster tunes CUBIC on a lossy path; tuned θ vs kernel defaults (crossover)
gemini-lab shortflows   completion time of 1 MB transfers and of a size mix, per CC and path (UML)
gemini-lab plannertune  Booster's planner tunes θ for long flows, one UML boot per round
gemini-lab evaluate     long flows: Booster-tuned θ beside default Fusion and the baselines (UML)
gemini-lab datapath-loop --datapath NAME   the closed loop for any kernel datapath
                        (gemini, dcvegas, cubic): tuned θ vs its kernel defaults (qemu)
gemini-lab datapath-signals  GEMINI's α, delay and ECN cuts by hop; DC-Vegas's cut and queue (UML)
gemini-lab datapath-tune --datapath NAME --scenario S --tuned P ...  Booster's planner tunes
                        any datapath's θ for long flows (plannertune generalised; UML); with
                        --heldout, GEMINI default vs tuned on a held-out cross-dc path; Gear
                        as its intra/cross pair behind the INT switch (--scenario gear-pair)
gemini-lab datapath-eval  GEMINI and DC-Vegas beside cubic, bbr, dctcp, reno, vegas on the
                        scaled datacenter, cross-dc and incast scenarios; G6 sweep, held out (UML)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gemini_api.theta import REGIONS, load_spec
from gemini_lab import (
    evaluation,
    fairness,
    plannertune,
    plans,
    recorded,
    report,
    scenario,
    shortflows,
)
from gemini_lab.host import BACKENDS, REPO, Backend, run_plan
from gemini_lab.vm import LabError

if TYPE_CHECKING:
    from gemini_booster.config import Settings
    from gemini_lab.cubic import CubicConfig

DEFAULT_OUT = REPO / "var" / "lab"
STALENESS_INTERVALS = 1.5  # tune: the agent falls back to the default θ this soon


def _command() -> str:
    """The command line as typed: each record names what produced it."""
    return " ".join(["gemini-lab", *sys.argv[1:]])


def _publish(text: str, record: Path | None, also: str = "") -> None:
    """Print ``text`` and, with ``--record``, write it there too (``also``: more to say)."""
    print(text)
    if record:
        record.write_text(text)
        print(f"recorded in {record}{also}")


def _set(given: dict[str, Any]) -> dict[str, Any]:
    """The options given on the command line (unset: the config's own defaults hold)."""
    return {k: v for k, v in given.items() if v is not None}


def _theta(pairs: list[str]) -> dict[str, int]:
    names, out = load_spec().names, {}
    for pair in filter(None, pairs):
        name, _, value = pair.partition("=")
        if name not in names:
            raise SystemExit(f"--theta {pair!r}: {name!r} is not one of {', '.join(names)}")
        if not value.lstrip("-").isdigit():
            raise SystemExit(f"--theta {pair!r}: expected name=integer (spec units)")
        out[name] = int(value)
    return out


def cmd_run(args: argparse.Namespace) -> dict:
    paths = [scenario.load(s) for s in args.scenario]
    experiments = [
        {
            "label": f"{p.name}/{cc}",
            "kind": "flow",
            "path": i,
            "cc": cc,
            "theta": _theta(args.theta) if cc == "fusion" else {},
            "duration_s": args.duration,
        }
        for i, p in enumerate(paths)
        for cc in args.cc
    ]
    return run_plan(
        {"paths": [p.to_dict() for p in paths], "experiments": experiments},
        args.out,
        backend=args.backend,
        progress=_progress,
    )


def _progress(label: str, result: dict) -> None:
    print(report.progress_line(label, result), flush=True)


def cmd_check(args: argparse.Namespace) -> int:
    """The network outcomes on the UML lab's simulated clock, then the module in Debian's
    stock kernel under qemu; a table each, then every failure, and 1 if there was one."""
    failed: list[str] = []
    acceptance: tuple[tuple[Backend, dict], ...] = (
        ("uml", plans.outcome_plan()),
        ("qemu", plans.module_plan()),
    )
    for backend, plan in acceptance:
        print(f"[{backend}] {len(plan['experiments'])} experiments", flush=True)
        out = args.out / f"check-{backend}"
        results = run_plan(plan, out, backend=backend, progress=_progress)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=1))
        print(report.table(results), flush=True)
        print(f"results: {out / 'results.json'}\n", flush=True)
        failed += [f"[{backend}] {line}" for line in report.failures(plan, results)]
    if failed:
        print(f"FAILED ({len(failed)}):\n" + "\n".join(failed))
        return 1
    print("all experiments passed")
    return 0


def _lab_settings(token: str, out: Path) -> Callable[[str], Settings]:
    """Booster's settings for a lab run, given its gRPC address: an embedded PostgreSQL of the
    run's own under ``out`` (a database kept from an earlier run keeps that run's bootstrap
    token, and would refuse this run's agent)."""
    from gemini_booster.config import Settings

    return lambda listen: Settings(
        grpc_listen=listen,
        http_port=0,
        refit_interval_s=2,
        data_dir=(out / "booster").resolve(),
        bootstrap_agent_token=token,
        allow_unbound_agent_tokens=True,  # the lab's guest hosts share one agent token
    )


def _agent_token() -> str:
    return "lab-agent-" + os.urandom(8).hex()


def cmd_loop(args: argparse.Namespace) -> None:
    from gemini_lab.loop import LoopConfig, run_loop

    token = _agent_token()
    cfg = LoopConfig(
        interval_s=args.interval,
        sigma=args.sigma,
        search_reports=args.search_reports,
        eval_reports=args.eval_reports,
    )
    result = run_loop(_lab_settings(token, args.out), args.port, token, args.out, cfg)
    for region, values in sorted(result.rounds.items()):
        print(f"{region:>8}: " + " ".join(f"{v:6.2f}" for v in values))
        print(
            f"{region:>8} with exploration off: "
            + " ".join(f"{v:6.2f}" for v in result.evaluation[region])
        )
    for region, trials in sorted(result.trials.items()):
        print(f"{region:>8} θ tried, in order (tuned parameters, flows, utility):")
        for t in trials:
            print(
                "          "
                + ", ".join(
                    f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in t.items()
                )
            )
    for region, theta in sorted(result.incumbents.items()):
        print(f"{region:>8} incumbent: {theta}")
    print(f"reports: {len(result.report_ids)}, duplicates: {result.duplicate_ids}")
    print(f"plot: {result.plot}")


def cmd_tune(args: argparse.Namespace) -> None:
    """One run per σ, each in its own directory; prints each run's summary and record."""
    from gemini_lab.loop import LoopConfig
    from gemini_lab.tune import initial_points, run_tune, summary_rows

    args.scenario = args.scenario or ["ethernet"]
    args.sigma = args.sigma or [0.1]
    command = _command()
    for sigma in args.sigma:
        token, out = _agent_token(), args.out / f"tune-sigma-{sigma:g}"
        cfg = LoopConfig(
            interval_s=args.interval,
            sigma=sigma,
            flow_bytes=args.flow_bytes,
            search_reports=args.rounds,
            eval_reports=args.eval_rounds,
            n_initial_points=args.initial_points or initial_points(len(args.scenario)),
            default_reports=args.default_rounds,
            staleness_s=STALENESS_INTERVALS * args.interval,
            duration_s=(args.rounds + 2 * args.eval_rounds + 10) * args.interval + 300,
        )
        result = run_tune(
            _lab_settings(token, out),
            args.port,
            token,
            out,
            args.scenario,
            args.region,
            cfg,
            command,
        )
        print(f"σ = {sigma:g}, {args.region} region")
        print("\n".join(summary_rows(result)))
        print(f"record: {out / 'tune.md'}, {result.record}; plot: {result.plot}", flush=True)


def cmd_landscape(args: argparse.Namespace) -> None:
    from gemini_lab.loop import landscape_plan, landscape_table

    thetas = [_theta(cell.split(",")) for cell in args.theta or [""]]
    results = run_plan(
        landscape_plan(thetas, args.flows, args.flow_bytes, args.sigma),
        args.out,
    )
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(landscape_table(results))


def cmd_fairness(args: argparse.Namespace) -> None:
    try:
        theta = recorded.load_theta(args.tuned_theta) if args.tuned_theta else None
    except ValueError as exc:
        raise SystemExit(f"--tuned-theta: {exc}") from exc
    cfg = fairness.FairnessConfig(
        parts=tuple(args.part or ["rtt", "friendliness"]),
        tuned_theta=theta,
        tuned_source=args.tuned_source,
        only=tuple(args.contender or ()),
        positions=tuple(args.position or fairness.POSITIONS),
        xs=tuple(args.rtt or fairness.RTT_XS_MS),
        buffers=tuple(args.buffer or fairness.BUFFERS_BDP),
        rtt_rate_mbit=args.rate,
        settings=args.settings,
        seed=args.seed,
        duration_s=args.duration,
        omit_s=args.omit,
    )
    _run_recorded(fairness.MEASUREMENT, cfg, args)


Config = TypeVar("Config")


def _run_recorded(
    measurement: recorded.Measurement[Config], cfg: Config, args: argparse.Namespace
) -> None:
    """A UML measurement's run (or ``--merge``), each experiment's line as it ends, then its
    table, written to ``--record`` unless ``--no-record``; the command line goes into it."""
    command = _command()
    record = None if args.no_record else args.record

    def progress(label: str, result: dict) -> None:
        print(measurement.progress_line(label, result), flush=True)

    print(measurement.run(cfg, args.out, command, record, progress, args.merge))


def _scenario_names(
    args: argparse.Namespace,
    default: tuple[str, ...],
    load: Callable[[str], scenario.Scenario] = scenario.load,
) -> tuple[str, ...]:
    """``--scenario`` names (or ``default``), each loaded once so a bad name fails first."""
    names = tuple(args.scenario or default)
    for name in names:
        load(name)
    return names


def cmd_shortflows(args: argparse.Namespace) -> None:
    try:
        theta = recorded.load_theta(args.tuned_theta) if args.tuned_theta else None
        fewer = tuple(shortflows.parse_fewer(f) for f in args.fewer or ())
        names = _scenario_names(args, shortflows.DEFAULT_SCENARIOS, shortflows.load_path)
    except (ValueError, scenario.ScenarioError) as exc:
        raise SystemExit(f"gemini-lab shortflows: {exc}") from exc
    cfg = shortflows.ShortConfig(
        scenarios=names,
        tuned_theta=theta,
        tuned_source=args.tuned_source,
        only=tuple(args.contender or ()),
        transfers=args.transfers,
        mix=args.mix,
        seed=args.seed,
        fewer=fewer,
    )
    _run_recorded(shortflows.MEASUREMENT, cfg, args)


def cmd_evaluate(args: argparse.Namespace) -> None:
    try:
        tuned = evaluation.Tuned.load(args.tuned)
        names = _scenario_names(args, evaluation.DEFAULT_SCENARIOS)
    except (OSError, ValueError, scenario.ScenarioError) as exc:
        raise SystemExit(f"gemini-lab evaluate: {exc}") from exc
    if args.runs < 1:
        raise SystemExit("gemini-lab evaluate: --runs must be at least 1")
    cfg = evaluation.EvalConfig(
        scenarios=names, tuned=tuned, runs=args.runs, cross=not args.no_cross
    )
    _run_recorded(evaluation.MEASUREMENT, cfg, args)


def _planner_config(
    args: argparse.Namespace, names: tuple[str, ...], **more: Any
) -> plannertune.TuneConfig:
    """The planner's rounds from the options plannertune and datapath-tune share (``more``:
    a subcommand's own), refused unless some hosts explore and some do not."""
    if not 0 < args.explorers < args.hosts or args.rounds < 1:
        raise SystemExit(f"gemini-lab {args.cmd}: need 0 < --explorers < --hosts and --rounds ≥ 1")
    return plannertune.TuneConfig(
        scenarios=names,
        sigma=args.sigma,
        rounds=args.rounds,
        hosts=args.hosts,
        explorers=args.explorers,
        seed=args.seed,
        **more,
    )


def cmd_plannertune(args: argparse.Namespace) -> None:
    try:
        names = _scenario_names(args, evaluation.DEFAULT_SCENARIOS)
    except scenario.ScenarioError as exc:
        raise SystemExit(f"gemini-lab plannertune: {exc}") from exc
    cfg = _planner_config(args, names, region=args.region)
    command = _command()
    history = plannertune.tune(cfg, args.out)
    text = plannertune.render(history, cfg, command)
    print(text)
    if not args.no_record:
        args.record.write_text(text)
        plannertune.write_tuned(history, cfg, command, args.tuned)


def _lab_booster(out: Path) -> tuple[str, Callable[[str], Settings]]:
    """An operator token of the run's own and Booster's settings for a run under ``out``
    (embedded PostgreSQL there), listening where the run says; hosts get tokens bound to them."""
    from gemini_booster.config import Settings

    operator = "lab-operator-" + os.urandom(8).hex()
    return operator, lambda listen: Settings(
        grpc_listen=listen,
        http_port=0,
        refit_interval_s=2,
        data_dir=(out / "booster").resolve(),
        bootstrap_operator_token=operator,
    )


def cmd_abtest(args: argparse.Namespace) -> None:
    """Booster here with an operator token of the run's own; hosts get tokens bound to them."""
    from gemini_lab.abtest import AbConfig, render, run_abtest

    out = args.out / "abtest"
    cfg = AbConfig(hosts=args.hosts, day_s=args.day_seconds, interval_s=args.interval)
    operator, settings = _lab_booster(out)
    result = run_abtest(
        settings,
        args.port,
        operator,
        out,
        cfg,
    )
    text = render(result, cfg, _command())
    _publish(text, args.record, f"; run record {result.record}")


def _cubic_config(args: argparse.Namespace, **more: Any) -> CubicConfig:
    """The closed loop's config from the options given (``more``: a subcommand's own)."""
    from gemini_lab.cubic import CubicConfig

    given = {
        "interval_s": args.interval,
        "day_s": args.day_seconds,
        "search_reports": args.search_reports,
        "flow_bytes": args.flow_bytes,
        **more,
    }  # unset: CubicConfig's defaults, the one place they are
    return CubicConfig(**_set(given))


def cmd_cubic(args: argparse.Namespace) -> None:
    """The check alone (fixed β, no Booster) with --check-only; else the whole run."""
    from gemini_lab import cubic

    command = _command()
    cfg = _cubic_config(args, check_flows=args.check_flows)
    out = args.out / "cubic"
    if args.render:
        result, cfg = cubic.from_record(args.render)
        print(cubic.render(result, cfg, args.render_command or command))
        return
    if args.check_only:
        plan = cubic.guest_plan(cfg, "", args.port)
        plan["experiments"] = plan["experiments"][:1]
        results = run_plan(plan, out, timeout_s=3600, backend=args.backend)
        print(f"Command: `{command}`\n")
        print("\n".join(cubic.check_table(results["experiments"].get("check"), cfg.sigma)))
        (out / "check.json").write_text(json.dumps(results, indent=1))
        return
    operator, settings = _lab_booster(out)
    result = cubic.run_cubic(
        settings,
        args.port,
        operator,
        out,
        cfg,
    )
    text = cubic.render(result, cfg, command)
    _publish(text, args.record, f"; run record {result.record}")


def cmd_datapath_loop(args: argparse.Namespace) -> None:
    """gemini_lab.cubic's closed loop for the datapath named (gemini_lab.datapath_loop)."""
    from gemini_lab import cubic, datapath_loop

    command = _command()
    cfg = datapath_loop.loop_config(args.datapath, _cubic_config(args))
    out = args.out / f"loop-{args.datapath}"
    operator, settings = _lab_booster(out)
    result = cubic.run_cubic(settings, args.port, operator, out, cfg)
    text = cubic.render(result, cfg, command)
    _publish(text, args.record, f"; run record {result.record}")


def cmd_datapath_signals(args: argparse.Namespace) -> None:
    from gemini_lab import datapath_signals

    command = _command()
    out = args.out / "datapath-signals"
    results = run_plan(datapath_signals.signals_plan(), out, backend="uml", progress=_progress)
    (out / "signals.json").write_text(json.dumps(results, indent=1))
    text = datapath_signals.render(results, command)
    _publish(text, args.record)


def _name_values(items: list[str] | None, option: str) -> tuple[tuple[str, int], ...]:
    """``NAME=INT`` options as pairs; a malformed one ends the command naming it."""
    out = []
    for kv in items or []:
        name, _, value = kv.partition("=")
        if not name or not value.lstrip("-").isdigit():
            raise SystemExit(f"gemini-lab datapath-tune: {option} {kv!r}: expected NAME=INTEGER")
        out.append((name, int(value)))
    return tuple(out)


def _heldout(cfg: plannertune.TuneConfig, theta: dict[str, int], out: Path) -> str:
    """The held-out boot of a datapath-tune: default against tuned where no θ was chosen
    (a Gear pair: gemini_lab.gear_tune's held-out port; else datapath_eval's paths)."""
    from gemini_lab import datapath_eval, gear_tune

    pair = cfg.round_kind() == plannertune.RoundKind.GEAR_PAIR
    plan = (
        gear_tune.heldout_plan(theta)
        if pair
        else datapath_eval.heldout_plan(theta, name=cfg.datapath)
    )
    held = run_plan(plan, out / "heldout", backend="uml", progress=_progress)
    (out / "heldout.json").write_text(json.dumps(held, indent=1))
    if pair:
        return gear_tune.heldout_table(held, theta, cfg.sigma)
    return datapath_eval.heldout_table(held, theta, cfg.datapath)


def cmd_datapath_tune(args: argparse.Namespace) -> None:
    command = _command()
    kind = plannertune.RoundKind(args.experiment) if args.experiment else None
    try:
        cfg = _planner_config(
            args,
            tuple(args.scenario),
            datapath=args.datapath,
            tuned=tuple(args.tuned or ()),
            pinned=_name_values(args.pin, "--pin"),
            time_scale=args.time_scale,
            module_extra=_name_values(args.extra, "--extra"),
            kind=kind,
            region=args.region,
        )
    except ValueError as exc:  # ThetaError, a kind that cannot run the datapath
        raise SystemExit(f"gemini-lab datapath-tune: {exc}") from exc
    out = args.out / f"datapath-tune-{args.datapath}"
    if args.heldout_only:  # a finished tuning's tuned.json: only the held-out boot
        tuned = json.loads(args.heldout_only.read_text())
        text = f"Command: `{command}`\n"
    else:
        history = plannertune.tune(cfg, out)
        text = plannertune.render(history, cfg, command)
        tuned = plannertune.tuned_theta(history)
        (out / "tuned.json").write_text(json.dumps(tuned, indent=1))
    if args.heldout or args.heldout_only:
        text += "\n" + _heldout(cfg, tuned[cfg.scenarios[0]], out)
    _publish(text, args.record)


def cmd_datapath_eval(args: argparse.Namespace) -> None:
    from gemini_lab import datapath_eval

    command = _command()
    text, _, _ = datapath_eval.run_eval(
        args.out / "datapath-eval",
        command,
        flow_s=args.flow_seconds,
        wan_s=args.wan_seconds,
        sweep=not args.no_sweep,
        only=args.only,
    )
    _publish(text, args.record)


def cmd_bench(args: argparse.Namespace) -> None:
    plan = plans.benchmark_plan(args.duration, cpu=args.backend == "qemu")
    results = run_plan(plan, args.out, backend=args.backend, progress=_progress)
    report.write_benchmark(results, _command())
    _show_results(results, args.out)


def cmd_records(args: argparse.Namespace) -> None:
    plan = plans.records_plan(args.flows, args.workers, args.burst)
    results = run_plan(plan, args.out, backend=args.backend, progress=_progress)
    report.write_records(results, _command())
    _show_results(results, args.out)


def cmd_flows(args: argparse.Namespace) -> None:
    args.scenario = args.scenario or ["ethernet"]
    args.cc = args.cc or ["fusion", "cubic"]
    _show_results(cmd_run(args), args.out)


def _show_results(results: dict, out: Path) -> None:
    """A plan's results as a table, and whole in ``out``/results.json."""
    print(report.table(results))
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nresults: {out / 'results.json'}")


def cmd_determinism(args: argparse.Namespace) -> None:
    from gemini_lab import determinism

    command = _command()
    print(determinism.run(args.repeats, args.duration, args.backend, args.out, command))


def cmd_check_exit(args: argparse.Namespace) -> None:
    sys.exit(cmd_check(args))


# --- options: what several studies share, once -------------------------------------------


def _out(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)


def _summary(p: argparse.ArgumentParser) -> None:
    """A study that prints a markdown summary and keeps its run under ``--out``."""
    p.add_argument("--record", type=Path, help="write the summary here (markdown)")
    _out(p)


def _recorded(p: argparse.ArgumentParser, record: Path) -> None:
    """A recorded UML measurement (gemini_lab.recorded): its record, or none, or a merge."""
    p.add_argument("--record", type=Path, default=record)
    p.add_argument("--no-record", action="store_true", help="print only")
    p.add_argument(
        "--merge", action="append", type=Path, help="render these results.json, run nothing"
    )
    _out(p)


def _backend(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="uml",
        help="uml: simulated clock, figures independent of host load (default); "
        "qemu: Debian's stock kernel under emulation",
    )
    _out(p)


def _closed_loop(p: argparse.ArgumentParser, port: int) -> None:
    """gemini_lab.cubic's closed loop (cubic, datapath-loop): unset options keep CubicConfig's."""
    p.add_argument("--day-seconds", type=int, help="a compressed day (divides 86400)")
    p.add_argument("--interval", type=float, help="the agent's reporting interval")
    p.add_argument("--search-reports", type=int, help="reports with exploration on day 0")
    p.add_argument("--flow-bytes", help="size of each flow")
    p.add_argument("--port", type=int, default=port)
    _summary(p)


def _tuned_theta(p: argparse.ArgumentParser, contenders: tuple[str, ...]) -> None:
    p.add_argument("--tuned-theta", help="fusion-tuned's θ: JSON (spec units) or a JSON file")
    p.add_argument("--tuned-source", default="given", help="where the tuned θ comes from")
    p.add_argument("--contender", action="append", choices=contenders, help="repeat; all")


def _scenarios(p: argparse.ArgumentParser, default: tuple[str, ...]) -> None:
    p.add_argument("--scenario", action="append", help="repeat; " + " ".join(default))


# --- each study's own options -------------------------------------------------------------


def opts_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", action="append", default=None)
    p.add_argument("--cc", action="append", default=None)
    p.add_argument("--theta", action="append", default=[], help="name=units, for fusion")
    p.add_argument("--duration", type=int, default=20)
    _backend(p)


def opts_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=int, default=30)
    _backend(p)


def opts_records(p: argparse.ArgumentParser) -> None:
    p.add_argument("--flows", type=int, default=10000)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument(
        "--burst",
        type=int,
        default=10000,
        help="flows opened first and then ended at once (0: skip)",
    )
    _backend(p)


def opts_loop(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--search-reports",
        type=int,
        default=32,
        help="reporting intervals of search (the host explores) ...",
    )
    p.add_argument(
        "--eval-reports",
        type=int,
        default=10,
        help="... then of evaluation (exploration off, the incumbent runs)",
    )
    p.add_argument("--interval", type=float, default=8)
    p.add_argument("--sigma", type=float, default=0.1)
    p.add_argument("--port", type=int, default=50151)
    _out(p)


def opts_landscape(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--theta",
        action="append",
        default=[],
        help="one cell: name=units[,name=units...] (others at the defaults)",
    )
    p.add_argument("--flows", type=int, default=6, help="flows per cell and path")
    p.add_argument("--flow-bytes", default="3M")
    p.add_argument("--sigma", type=float, default=0.1)
    _out(p)


def opts_tune(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scenario",
        action="append",
        default=None,
        help="a scenario (repeat: one context per scenario, all tuned at once); ethernet",
    )
    p.add_argument(
        "--sigma", action="append", type=float, default=None, help="repeat: a run per σ; 0.1"
    )
    p.add_argument("--region", choices=REGIONS, default="production", help="Θ or Θ′")
    p.add_argument("--rounds", type=int, default=30, help="reporting rounds of search ...")
    p.add_argument(
        "--eval-rounds", type=int, default=8, help="... then with exploration off (tuned θ)"
    )
    p.add_argument(
        "--default-rounds",
        type=int,
        default=8,
        help="... then on the default θ (Booster stopped: the agent falls back to it)",
    )
    p.add_argument("--initial-points", type=int, default=0, help="0: 6 per scenario")
    p.add_argument("--interval", type=float, default=8)
    p.add_argument("--flow-bytes", default="3M")
    p.add_argument("--port", type=int, default=50152)
    _out(p)


def opts_determinism(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--duration", type=int, default=20)
    _backend(p)


def opts_fairness(p: argparse.ArgumentParser) -> None:
    p.add_argument("--part", action="append", choices=("rtt", "friendliness"), default=None)
    _tuned_theta(p, fairness.CONTENDERS)
    p.add_argument("--rtt", action="append", type=float, help="x in ms (repeat); 10 20 40 80")
    p.add_argument("--buffer", action="append", type=float, help="BDPs (repeat); 0.5 1 2 4")
    p.add_argument("--rate", type=float, default=100.0, help="RTT fairness link, Mbit/s")
    p.add_argument("--settings", type=int, default=8, help="friendliness: random settings")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--duration", type=int, default=25, help="seconds per pair (simulated)")
    p.add_argument("--omit", type=int, default=5, help="seconds of each flow not counted")
    p.add_argument(
        "--position", action="append", choices=tuple(fairness.POSITIONS), help="repeat; both"
    )
    _recorded(p, REPO / "benchmarks/results/fairness.md")


def opts_shortflows(p: argparse.ArgumentParser) -> None:
    _scenarios(p, shortflows.DEFAULT_SCENARIOS)
    _tuned_theta(p, shortflows.CONTENDERS)
    p.add_argument("--transfers", type=int, default=20, help="1 MB transfers per path, CC")
    p.add_argument("--mix", type=int, default=40, help="size-mix transfers per path, CC")
    p.add_argument("--seed", type=int, default=1, help="of the size mix")
    p.add_argument(
        "--fewer", action="append", help="PATH=N_1MB,N_MIX: fewer transfers there (repeat)"
    )
    _recorded(p, shortflows.RESULTS_PATH)


def opts_plannertune(p: argparse.ArgumentParser) -> None:
    _scenarios(p, evaluation.DEFAULT_SCENARIOS)
    p.add_argument("--sigma", type=float, default=0.1)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--hosts", type=int, default=5, help="lab hosts per context")
    p.add_argument("--explorers", type=int, default=4, help="of them, exploring")
    p.add_argument("--seed", type=int, default=1, help="the policy id: the planner's draws")
    p.add_argument("--region", choices=("production", "wide"), default="production", help="Θ or Θ′")
    p.add_argument("--record", type=Path, default=plannertune.RESULTS_PATH)
    p.add_argument("--tuned", type=Path, default=evaluation.TUNED_PATH, help="θ written here")
    p.add_argument("--no-record", action="store_true", help="print only")
    _out(p)


def opts_evaluate(p: argparse.ArgumentParser) -> None:
    _scenarios(p, evaluation.DEFAULT_SCENARIOS)
    p.add_argument(
        "--tuned", type=Path, default=evaluation.TUNED_PATH, help="JSON: scenario → tuned θ"
    )
    p.add_argument("--runs", type=int, default=3, help="runs per path and CC")
    p.add_argument("--no-cross", action="store_true", help="no θ tuned on the other paths")
    _recorded(p, evaluation.RESULTS_PATH)


def opts_abtest(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hosts", type=int, default=4, help="lab hosts (namespaces with agents)")
    p.add_argument("--day-seconds", type=int, default=120, help="a compressed day")
    p.add_argument("--interval", type=float, default=8, help="the agents' reporting interval")
    p.add_argument("--port", type=int, default=50153)
    _summary(p)


def opts_cubic(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check-flows", type=int, help="flows per β of the check")
    p.add_argument("--check-only", action="store_true", help="only the check, no Booster")
    p.add_argument("--backend", choices=BACKENDS, default="qemu", help="for --check-only")
    p.add_argument("--render", type=Path, help="render this cubic.json again, run nothing")
    p.add_argument("--render-command", help="with --render: the command that made it")
    _closed_loop(p, port=50163)


def opts_datapath_loop(p: argparse.ArgumentParser) -> None:
    p.add_argument("--datapath", required=True, help="gemini or dcvegas (datapath_loop.LOOPS)")
    _closed_loop(p, port=50173)


def opts_datapath_tune(p: argparse.ArgumentParser) -> None:
    p.add_argument("--datapath", required=True)
    p.add_argument("--scenario", action="append", required=True, help="a context each")
    p.add_argument("--tuned", action="append", help="a searched parameter (default: all)")
    p.add_argument(
        "--time-scale", type=int, default=1, help="µs parameters' region and defaults × this"
    )
    p.add_argument("--pin", action="append", help="an unsearched parameter's value, name=value")
    p.add_argument("--extra", action="append", help="a non-θ module parameter, name=value")
    p.add_argument(
        "--experiment",
        choices=[k.value for k in plannertune.RoundKind],
        help="a round's experiment (default: the datapath's own; gear: gear_pair)",
    )
    p.add_argument("--region", choices=("production", "wide"), default="production", help="Θ or Θ′")
    p.add_argument("--sigma", type=float, default=0.1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--explorers", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--heldout", action="store_true", help="default vs tuned, held out")
    p.add_argument("--heldout-only", type=Path, help="a tuned.json: only the held-out boot")
    _summary(p)


def opts_datapath_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument("--flow-seconds", type=float, default=10, help="datacenter flows")
    p.add_argument("--wan-seconds", type=float, default=30, help="cross-dc flows")
    p.add_argument("--no-sweep", action="store_true", help="no G6 sweep, no held-out boot")
    p.add_argument("--only", help="only the experiments whose label starts with this")
    _summary(p)


@dataclass(frozen=True)
class Study:
    """One subcommand: its help line, its options and what it runs."""

    help: str
    options: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], None]


# the subcommands, in the order ``gemini-lab --help`` lists them
STUDIES: dict[str, Study] = {
    "run": Study("flows of the given CCs over the given scenarios", opts_run, cmd_flows),
    "bench": Study("Table IV comparison and CPU cost", opts_bench, cmd_bench),
    "check": Study("the acceptance plan", _out, cmd_check_exit),
    "records": Study("flow-record delivery under many short flows", opts_records, cmd_records),
    "loop": Study("Booster (embedded PostgreSQL) + agent in the guest", opts_loop, cmd_loop),
    "landscape": Study("utility of fixed θ on the loop's two paths", opts_landscape, cmd_landscape),
    "tune": Study("Booster tunes all seven parameters on scenarios", opts_tune, cmd_tune),
    "determinism": Study(
        "the same flows idle and with the host busy", opts_determinism, cmd_determinism
    ),
    "fairness": Study(
        "RTT fairness and cubic-friendliness (Figs. 7, 8)", opts_fairness, cmd_fairness
    ),
    "shortflows": Study(
        "1 MB and size-mix transfer times per CC (UML)", opts_shortflows, cmd_shortflows
    ),
    "plannertune": Study(
        "Booster's planner tunes θ for long flows (UML)", opts_plannertune, cmd_plannertune
    ),
    "evaluate": Study(
        "long flows: tuned θ, default Fusion, baselines (UML)", opts_evaluate, cmd_evaluate
    ),
    "abtest": Study("an A/B experiment over lab hosts, with a crossover", opts_abtest, cmd_abtest),
    "cubic": Study("Booster tunes CUBIC; tuned θ vs kernel defaults", opts_cubic, cmd_cubic),
    "datapath-loop": Study(
        "the closed loop for any kernel datapath", opts_datapath_loop, cmd_datapath_loop
    ),
    "datapath-signals": Study(
        "GEMINI's and DC-Vegas' signals (UML)", _summary, cmd_datapath_signals
    ),
    "datapath-tune": Study(
        "Booster's planner tunes any datapath (UML)", opts_datapath_tune, cmd_datapath_tune
    ),
    "datapath-eval": Study(
        "GEMINI and DC-Vegas beside the baselines (UML)", opts_datapath_eval, cmd_datapath_eval
    ),
}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gemini-lab", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, study in STUDIES.items():
        study.options(sub.add_parser(name, help=study.help))
    return ap


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        STUDIES[args.cmd].run(args)
    except LabError as exc:
        raise SystemExit(f"gemini-lab: {exc}") from exc


if __name__ == "__main__":
    main()
