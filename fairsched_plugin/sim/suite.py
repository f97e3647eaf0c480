"""``fairsched suite``: every arm on every scenario, device and model, at loads set against
stock vLLM's measured capacity, in the simulator; one results file, one table, plots.

A *group* is a scenario on a device with a model in one scheduling mode, at ``vllm
serve``'s own defaults for that device (``devices``) and the scenario's context length.
For each group the suite finds stock's capacity (``capacity``), then runs every arm at
each load (a fraction of that capacity) on the same requests. A run is deterministic:
rerunning a cell gives the identical figures, which is how a test keeps the committed
results honest.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..experiment.arms import STOCK, parse_arm
from ..experiment.traces import at_rate
from ..config import ConfigError, FairschedConfig
from ..extras import available, note_no_plots
from ..user_files import output_dir
from . import no_harm
from ..predictor import analytic
from .capacity import Capacity, Runner, find_capacity
from .routers import DEFAULT_BANDWIDTH_GB_S, FLEET_SPEC, Fleet, parse_fleet
from .devices import DEVICES, serve_defaults
from ..predictor.hardware import MODEL_CONFIGS, accelerator, model_config
from .run_spec import RunSpec
from .scenarios import SCENARIOS, Scenario
from .engine_settings import SimSettings
from .step_models import AnalyticStepModel
from .suite_report import plot, render

LOADS = (0.5, 0.9, 1.0, 1.1, 1.3)
DEFAULT_POLICY = FairschedConfig().policy
DEFAULT_REVISION = 3
"""What the default policy's name meant when a results file was written: 3 is the guard
with its TTFT and TPOT watch, running prefills never overtaken, LPRS and APC only with a
fitted latency model; files without it ran revision 1, LPRS and APC on with the built-in
model, no watch, running prefills overtaken. (Revision 2, a TTFT-only watch, left no
committed file.)"""
ARMS = tuple(dict.fromkeys((STOCK, "fcfs", DEFAULT_POLICY, "guarded-aging", "hrrn", "preflow",
                            "spf")))
"""Stock, the plugin's ``fcfs`` (stock's order through the plugin: the control), the
default, the main alternatives, and ``spf`` (mean-optimal, tail-blind: the limit)."""
CLASS_EDGES = (("short", 0, 128), ("medium", 128, 1025), ("long", 1025, 32_768),
               ("32k+", 32_768, 1 << 40))
"""Prompt-length classes of the per-class tail: the project's short/medium/long, with
long-context prompts (32k tokens and more) apart."""


@dataclass(frozen=True)
class Plan:
    scenarios: tuple[str, ...]
    devices: tuple[str, ...]
    models: tuple[str, ...]
    modes: tuple[str, ...]
    """``async`` (vLLM's default on these devices) and/or ``sync``."""
    loads: tuple[float, ...]
    arms: tuple[str, ...]
    num_requests: int
    sync_also: tuple[tuple[str, str, str], ...] = ()
    """(scenario, device, model) groups also run sync, to show how far verdicts move."""
    fleets: tuple[str, ...] = ("1",)
    """One engine (``"1"``) and/or fleets of engines behind a router
    (``routers.FLEET_SPEC``, e.g. ``"4xvllm-dp"``, or disaggregated, ``"2p2d"``); a
    fleet of N engines (N in its larger pool) runs ``num_requests`` x N requests."""
    kv_bandwidth_gb_s: float = DEFAULT_BANDWIDTH_GB_S
    """A disaggregated fleet's KV link per decode engine."""
    min_requests: tuple[tuple[str, int], ...] = ()
    """(scenario, requests) for scenarios whose window must be longer than
    ``num_requests`` to saturate stock (``capacity.WindowTooSmall`` says how long)."""

    def requests_for(self, scenario: str) -> int:
        """The requests per engine a group of ``scenario`` runs."""
        return max(self.num_requests, dict(self.min_requests).get(scenario, 0))

    def groups(self) -> list[tuple[str, str, str, str, str]]:
        """Every combination; a ``sync_also`` group right after its async twin."""
        out = []
        for s in self.scenarios:
            for d in self.devices:
                for m in self.models:
                    for f in self.fleets:
                        out += [(s, d, m, mode, f) for mode in self.modes]
                        if (s, d, m) in self.sync_also and "sync" not in self.modes:
                            out.append((s, d, m, "sync", f))
        return out


QUICK = Plan(("azure-conv",), ("h100",), ("qwen3-8b",), ("async",), LOADS,
             (STOCK, "fcfs", DEFAULT_POLICY, "guarded-aging", "spf"), 2000)
FULL = Plan(("azure-conv", "long-context", "sharegpt"), ("h100", "a100-80gb", "ascend910b"),
            ("qwen3-8b", "llama-3-8b"), ("async",), LOADS, ARMS, 2000,
            sync_also=(("azure-conv", "h100", "qwen3-8b"),))
"""The quick suite's cells are the full suite's on the same requests: its figures are the
full suite's for that group."""
ORDERING_ONLY = f"{DEFAULT_POLICY}:tail_window=0:overtake_running=true"
"""The default's order as it was before the tail watch: the guard's slack fixed, and a
waiting request may take budget from a running prefill it ranks ahead of."""
NO_HARM = Plan(("azure-conv", "azure-code", "sharegpt", "long-context", "mooncake-conv",
                "mooncake-conv-nocache", "chat-sessions", "agent"),
               ("h100", "a100-80gb", "ascend910b"), ("qwen3-8b",), ("async",),
               LOADS, (STOCK, DEFAULT_POLICY, ORDERING_ONLY, "spf"), 1500,
               min_requests=(("sharegpt", 2500),))
"""The no-harm matrix: the default against stock on every packaged trace and scenario,
the prefix cache on and off, on each device preset, from half load to 1.3x capacity
(ShareGPT's Poisson arrivals need 2,500 requests to saturate stock on the H100);
``no-harm.md`` gives a tick or a cross per bound per cell (``no_harm``)."""


def group_settings(scenario: Scenario, device: str, model: AnalyticStepModel,
                   mode: str) -> SimSettings:
    """``vllm serve``'s defaults on ``device``, the scenario's context length, the KV cache
    the model leaves on the device."""
    defaults = serve_defaults(device)
    return SimSettings(
        max_num_batched_tokens=defaults.max_num_batched_tokens,
        max_num_seqs=defaults.max_num_seqs,
        max_model_len=scenario.max_model_len,
        block_size=defaults.block_size,
        kv_cache_tokens=analytic.kv_cache_tokens(model.config, model.accelerator),
        kv_bytes_per_token=model.config.kv_bytes_per_token,
        async_scheduling=mode == "async",
        enable_prefix_caching=scenario.prefix_caching,
    )


def run_metrics(requests: Sequence[dict[str, Any]], prefix_caching: bool = False
                ) -> dict[str, Any]:
    """What the table and the plots read of one run: TTFT and E2E statistics, output
    throughput, the P99 request's time per output token (requests with two or more
    output tokens), per-class TTFT, TTFT at every percentile (for the CDF), and the part of
    TTFT spent queueing for the budget (arrival to the first step that schedules the
    request; the rest is the prefill's own steps). With ``prefix_caching``, also the
    prefix cache's hit rate: the share of the served prompts' tokens found cached when
    each was admitted (an order that evicts more shows a lower one). ``prefill_tokens``:
    the prompt tokens the engine computed, recomputation after preemptions included
    (what a prefix cache saved is not computed)."""
    done = [r for r in requests if r["error"] is None and r["finish_s"] is not None]
    ttft = np.array([r["first_token_s"] - r["arrival_s"] for r in done])
    queued = np.array([r["first_scheduled_s"] - r["arrival_s"] for r in done])
    e2e = np.array([r["finish_s"] - r["arrival_s"] for r in done])
    span = max(r["finish_s"] for r in done) - min(r["arrival_s"] for r in done)
    tpot = [(r["finish_s"] - r["first_token_s"]) / (r["output_tokens"] - 1)
            for r in done if r["output_tokens"] > 1]
    by_class = {}
    for name, low, high in CLASS_EDGES:
        values = [t for t, r in zip(ttft, done) if low <= r["prompt_tokens"] < high]
        if values:
            by_class[name] = {"n": len(values), "p50": _r(np.percentile(values, 50)),
                              "p99": _r(np.percentile(values, 99))}
    return {
        "completed": len(done), "failed": len(requests) - len(done),
        "ttft_p50": _r(np.percentile(ttft, 50)), "ttft_mean": _r(ttft.mean()),
        "ttft_p99": _r(np.percentile(ttft, 99)), "e2e_mean": _r(e2e.mean()),
        "queued_p50": _r(np.percentile(queued, 50)), "queued_mean": _r(queued.mean()),
        "output_tps": _r(sum(r["output_tokens"] for r in done) / span),
        "tpot_p99": _r(np.percentile(tpot, 99)) if tpot else 0.0,
        "prefill_tokens": sum(r.get("prefill_tokens", 0) for r in requests),
        "by_class": by_class,
        "ttft_percentiles": [_r(v) for v in np.percentile(ttft, np.arange(101))],
        **({"prefix_hit_rate": _r(prefix_hit_rate(done))} if prefix_caching else {}),
    }


def prefix_hit_rate(done: Sequence[dict[str, Any]]) -> float:
    """The share of the served prompts' tokens the prefix cache held when each was
    admitted."""
    prompt = sum(r["prompt_tokens"] for r in done)
    return sum(r["cached_tokens"] or 0 for r in done) / prompt if prompt else 0.0


def _r(value: float) -> float:
    """Six significant digits: enough for every ratio, stable across JSON round trips."""
    return float(f"{float(value):.6g}")


@dataclass
class Results:
    plan: dict[str, Any]
    meta: dict[str, Any]
    groups: list[dict[str, Any]] = field(default_factory=list)
    cells: list[dict[str, Any]] = field(default_factory=list)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")


def run_cell(case: Sequence[Any], model: AnalyticStepModel, settings: SimSettings, arm: str,
             rate: float, closed_loop: bool = False, fleet: str = "1",
             kv_bandwidth_gb_s: float = DEFAULT_BANDWIDTH_GB_S) -> dict[str, Any]:
    """One arm at one rate (on every engine of ``fleet``): the run's metrics, and for a
    fleet how evenly its router spread the work (within each pool of a disaggregated
    one, which also reports its KV hand-offs)."""
    # vLLM and torch: only once a suite runs
    from .engine import simulate
    from .fleet import balance

    engines = parse_fleet(fleet)
    spec = RunSpec(parse_arm(arm), at_rate(case, rate), model, settings,
                   closed_loop=closed_loop)
    if engines.router is None:
        result = simulate(spec)
    else:
        result = fleet_runner_for(engines, kv_bandwidth_gb_s)(spec, False)
    metrics = run_metrics(result.run["requests"], settings.enable_prefix_caching)
    if engines.router is not None:
        metrics["balance"] = {k: _r(v) for k, v in balance(result.run).items()}
    if engines.disaggregated:
        metrics["handoff"] = handoff_metrics(result.run["requests"])
    return metrics


def fleet_runner_for(fleet: Fleet, kv_bandwidth_gb_s: float = DEFAULT_BANDWIDTH_GB_S
                     ) -> Runner:
    """The ``capacity.Runner`` of a fleet (engines behind a router, or disaggregated)."""
    from .disagg import disagg_runner
    from .fleet import fleet_runner

    if fleet.disaggregated:
        return disagg_runner(fleet, kv_bandwidth_gb_s)
    return fleet_runner(fleet.engines, fleet.router)


def handoff_metrics(requests: Sequence[dict[str, Any]]) -> dict[str, float]:
    """A disaggregated run's hand-offs: mean and P99 of the wait from the prefill's answer
    to the pull's start (the decode engine's admission and its link), and of the pull."""
    served = [r for r in requests if r.get("kv_transfer_s") is not None]
    if not served:
        return {}
    wait = np.array([r["kv_wait_s"] for r in served])
    pull = np.array([r["kv_transfer_s"] for r in served])
    return {"wait_mean": _r(float(wait.mean())), "wait_p99": _r(float(np.percentile(wait, 99))),
            "pull_mean": _r(float(pull.mean())), "pull_p99": _r(float(np.percentile(pull, 99)))}


def run_suite(plan: Plan, out: Path, progress: Callable[[str], None] = print) -> Results:
    """Run ``plan``; results.json is rewritten after every group (a stopped run keeps
    what it finished)."""
    out.mkdir(parents=True, exist_ok=True)
    results = Results(plan=asdict(plan), meta=_meta(out))
    groups = plan.groups()
    total_runs = len(groups) * len(plan.loads) * len(plan.arms)
    done_runs, run_s, started = 0, 0.0, time.perf_counter()
    cases: dict[tuple[str, int], list[Any]] = {}
    capacities: dict[tuple[Any, ...], Capacity] = {}
    """By requests and engine: open- and closed-loop replays of one case share theirs."""

    def capacity_of(scenario: Scenario, case: list[Any], model: AnalyticStepModel,
                    settings: SimSettings, key: tuple[str, ...]) -> Capacity:
        # A closed loop cannot overload the engine (each session waits for its answers):
        # the capacity is that of the same requests open loop, so open- and closed-loop
        # replays of one scenario run at the same rates. A fleet's is the fleet's own,
        # behind its router.
        # Stock runs every pool of a capacity search, so a fleet whose decode pool is
        # stock shares the fleet's.
        fleet = parse_fleet(key[-1])._replace(decode_arm=None)
        full_key = (scenario.build, *key[:-1], fleet, settings)
        if full_key not in capacities:
            capacities[full_key] = (
                find_capacity(case, model, settings) if fleet.router is None
                else find_capacity(case, model, settings,
                                   run=fleet_runner_for(fleet, plan.kv_bandwidth_gb_s)))
        return capacities[full_key]

    for g, (scenario_name, device, model_name, mode, fleet) in enumerate(groups, start=1):
        scenario = SCENARIOS[scenario_name]
        # A fleet of N engines gets N times the requests: the same span of the trace per
        # engine, so its capacity is measured over as long a window as one engine's (a
        # short window lets a fleet's many running decodes hide a growing backlog).
        spec = parse_fleet(fleet)
        size = plan.requests_for(scenario_name) * spec.size
        if (scenario_name, size) not in cases:
            cases[scenario_name, size] = scenario.build(size)
        case = cases[scenario_name, size]
        model = AnalyticStepModel(model_config(model_name), accelerator(device), device)
        settings = group_settings(scenario, device, model, mode)
        label = f"{scenario_name} / {device} / {model_name} / {mode}" + (
            f" / {fleet}" if fleet != "1" else "")
        progress(f"[group {g}/{len(groups)}] {label}: budget "
                 f"{settings.max_num_batched_tokens}, {settings.max_num_seqs} sequences; "
                 "finding stock's capacity")
        key = (device, model_name, mode, fleet)
        capacity = capacity_of(scenario, case, model, settings, key)
        progress(f"  capacity {capacity.rate:.2f} req/s")
        group = {
            "scenario": scenario_name, "device": device, "model": model_name, "mode": mode,
            "accelerator": model.accelerator.name, "step_model": model.description,
            "engine": asdict(settings), "closed_loop": scenario.closed_loop,
            "capacity_rps": _r(capacity.rate), "capacity": asdict(capacity),
            **({"fleet": fleet, "requests": size} if fleet != "1" else {}),
            **({"kv_bandwidth_gb_s": plan.kv_bandwidth_gb_s} if spec.disaggregated else {}),
        }
        if settings.enable_prefix_caching:
            without = capacity_of(scenario, case, model,
                                  replace(settings, enable_prefix_caching=False), key)
            progress(f"  capacity with the prefix cache off {without.rate:.2f} req/s")
            group["capacity_cache_off_rps"] = _r(without.rate)
        results.groups.append(group)
        for load in plan.loads:
            rate = _r(load * capacity.rate)  # as stored, so a rerun of the cell is exact
            for arm in plan.arms:
                run_start = time.perf_counter()
                metrics = run_cell(case, model, settings, arm, rate, scenario.closed_loop,
                                   fleet, plan.kv_bandwidth_gb_s)
                run_s += time.perf_counter() - run_start
                results.cells.append({"scenario": scenario_name, "device": device,
                                      "model": model_name, "mode": mode, "load": load,
                                      "rate": rate, "arm": arm, "metrics": metrics,
                                      **({"fleet": fleet} if fleet != "1" else {})})
                done_runs += 1
                elapsed = time.perf_counter() - started
                eta = run_s / done_runs * (total_runs - done_runs)
                progress(f"  load {load:g} ({rate:.2f} req/s) {arm}: median TTFT "
                         f"{metrics['ttft_p50'] * 1e3:.0f} ms, P99 "
                         f"{metrics['ttft_p99'] * 1e3:.0f} ms  [{done_runs}/{total_runs} runs, "
                         f"{elapsed / 60:.1f} min, runs alone about {eta / 60:.0f} min more]")
        results.meta["wall_s"] = round(time.perf_counter() - started, 1)
        results.save(out / "results.json")
    return results


def _meta(out: Path) -> dict[str, Any]:
    """The command, vLLM and the commit (marked when files outside ``out`` differ from it)."""
    import vllm

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=False).stdout.strip() or None
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no",
                                  "--", ".", f":(exclude){out}"],
                                 capture_output=True, text=True, check=False).stdout.strip()
        if commit and changed:
            commit += " with uncommitted changes"
    except OSError:
        commit = None
    return {"command": " ".join(["fairsched", *sys.argv[1:]]), "vllm": vllm.__version__,
            "commit": commit, "default_policy": DEFAULT_POLICY,
            "default_revision": DEFAULT_REVISION}


# -------------------------------------------------------------------------------- CLI


def _names(known: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(part.strip() for part in text.split(",") if part.strip())
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown) or text!r}; "
                                             f"choose from {', '.join(known)}")
        return names
    return parse


def _loads(text: str) -> tuple[float, ...]:
    try:
        loads = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--loads {text!r}: numbers, comma-separated")
    if not loads or any(not load > 0 for load in loads):
        raise argparse.ArgumentTypeError(f"--loads {text!r}: fractions of capacity > 0")
    return loads


def _fleets(text: str) -> tuple[str, ...]:
    specs = tuple(part.strip() for part in text.split(",") if part.strip())
    try:
        for spec in specs:
            parse_fleet(spec)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))
    if not specs:
        raise argparse.ArgumentTypeError(f"--fleets {text!r}: {FLEET_SPEC}, comma-separated")
    return specs


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    suite = subparsers.add_parser(
        "suite", help="every arm on production traces, GPU/NPU presets and loads set "
                      "against stock's capacity, simulated; results, table and plots",
        description="For each group (a scenario on a device with a model, in one "
                    "scheduling mode, at vllm serve's defaults for that device) finds stock "
                    "vLLM's capacity, then runs every arm at each load, a fraction of that "
                    "capacity, on the same requests. Writes results.json, suite.md and "
                    "plots to --out. Runs are deterministic: a rerun gives the same "
                    "figures.")
    suite.add_argument("--quick", action="store_true",
                       help=f"the quick suite: azure-conv on H100 with Qwen3-8B, async, "
                            f"{QUICK.num_requests} requests, arms "
                            f"{','.join(QUICK.arms)} (about 4 minutes); default: the full "
                            "suite (19 groups, 665 runs: about 100 minutes on one core)")
    suite.add_argument("--no-harm", action="store_true",
                       help="the no-harm matrix: every packaged trace and scenario on the "
                            "H100, A100 and 910B presets, arms stock, the default, its order "
                            "without the tail watch and spf, 1,500 requests a cell (options "
                            "given narrow it); writes no-harm.md beside suite.md")
    suite.add_argument("--scenarios", type=_names(list(SCENARIOS)),
                       help=f"subset of {','.join(SCENARIOS)} {_default(lambda p: p.scenarios)}")
    suite.add_argument("--devices", type=_names(list(DEVICES)),
                       help=f"subset of {','.join(DEVICES)} {_default(lambda p: p.devices)}")
    suite.add_argument("--models", type=_names(list(MODEL_CONFIGS)),
                       help="subset of qwen3-8b,llama-3-8b (or other presets) "
                            + _default(lambda p: p.models))
    suite.add_argument("--modes", type=_names(["async", "sync"]),
                       help="async (vLLM's default on these devices) and/or sync "
                            "(default: async, and the full suite also runs "
                            + ", ".join("/".join(g) for g in FULL.sync_also) + " sync)")
    suite.add_argument("--fleets", type=_fleets,
                       help=f"comma-separated: {FLEET_SPEC}; each group runs on each "
                            "(default: 1)")
    suite.add_argument("--kv-bandwidth", type=float, metavar="GB_S",
                       help="a disaggregated fleet's KV link per decode engine, GB/s "
                            f"(default {DEFAULT_BANDWIDTH_GB_S:g}: one 400 Gb/s RDMA NIC)")
    suite.add_argument("--loads", type=_loads,
                       help=f"fractions of stock's capacity (default {','.join(map(str, LOADS))})")
    suite.add_argument("--arms", help="comma-separated arms, stock always among them "
                                      + _default(lambda p: p.arms))
    suite.add_argument("--num-requests", type=int,
                       help=f"requests per scenario (default {FULL.num_requests})")
    suite.add_argument("--out", type=Path, default=Path("runs/suite"),
                       help="results.json, suite.md and plots/ go here")
    suite.add_argument("--render", action="store_true",
                       help="only render suite.md and plots from --out's results.json")
    suite.set_defaults(func=main)


def _default(field: Callable[[Plan], tuple[str, ...]]) -> str:
    """An option's default: the full suite's value, and the quick suite's."""
    return f"(default: {','.join(field(FULL))}; with --quick {','.join(field(QUICK))})"


def plan_from_args(args: argparse.Namespace) -> Plan:
    base = QUICK if args.quick else NO_HARM if args.no_harm else FULL
    arms = base.arms
    if args.arms:
        arms = tuple(a.strip() for a in args.arms.split(",") if a.strip())
        for arm in arms:
            parse_arm(arm)
        if STOCK not in arms:
            arms = (STOCK, *arms)
    num = base.num_requests if args.num_requests is None else args.num_requests
    if num < 2:
        raise ValueError("--num-requests: at least 2")
    return Plan(args.scenarios or base.scenarios, args.devices or base.devices,
                args.models or base.models, args.modes or base.modes,
                args.loads or base.loads, arms, num,
                sync_also=() if args.modes else base.sync_also,
                fleets=args.fleets or base.fleets,
                kv_bandwidth_gb_s=args.kv_bandwidth or base.kv_bandwidth_gb_s,
                min_requests=() if args.num_requests else base.min_requests)


def main(args: argparse.Namespace) -> int:
    results_path = args.out / "results.json"
    if not args.render:
        try:
            plan = plan_from_args(args)
            output_dir(args.out)
        except (ConfigError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        groups = plan.groups()
        print(f"suite: {len(groups)} group(s) x {len(plan.loads)} loads x {len(plan.arms)} "
              f"arms = {len(groups) * len(plan.loads) * len(plan.arms)} runs of "
              f"{plan.num_requests} requests (per engine on a fleet), plus a capacity search "
              "per group")
        run_suite(plan, args.out)
    elif not results_path.exists():
        print(f"error: no {results_path} to render", file=sys.stderr)
        return 2
    results = json.loads(results_path.read_text())
    (args.out / "suite.md").write_text(render(results))
    print(f"results: {results_path}\ntable: {args.out / 'suite.md'}")
    default = results["meta"]["default_policy"]
    if any(c["arm"] == default for c in results["cells"]):
        other = ORDERING_ONLY if any(c["arm"] == ORDERING_ONLY for c in results["cells"]) \
            else None
        (args.out / "no-harm.md").write_text(no_harm.render(results, default, other))
        print(f"no-harm check: {args.out / 'no-harm.md'}")
    if available("matplotlib"):
        plots = plot(results, args.out / "plots")
        print(f"plots: {len(plots)} in {args.out / 'plots'}")
    else:
        note_no_plots(f"table {args.out / 'suite.md'}")
    return 0
