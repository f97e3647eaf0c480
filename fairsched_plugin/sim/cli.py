"""``fairsched simulate``: ``fairsched bench`` without a server.

The same workload, arm and report options as ``bench``; the engine is vLLM's real
scheduler on a virtual clock with a step-time model (``--step-model``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..experiment.arms import ARMS_HELP, parse_arms
from ..experiment.cases import (
    workload_names,
    add_sampling_arguments,
    build_cases,
    load_pool,
    plugin_settings,
    workload_label,
    write_cases,
)
from ..experiment.case_files import case_summary, read_case
from ..experiment.report import analyse_runs, render_markdown, write_report
from ..experiment.traces import add_trace_arguments, check_trace_arguments, trace_cases_from_args
from ..experiment.workload_cli import add_pool_arguments
from ..experiment.workloads import WORKLOADS
from ..cli_types import positive_float, positive_int
from ..config import ConfigError
from ..model.tiny import DEFAULT_MODEL_DIR
from ..predictor.runtime import PredictorError
from ..user_files import output_dir
from ..predictor import analytic
from .engine_settings import (
    SimSettings,
    SimulationStalled,
    add_limit_arguments,
    describe,
    resolve_limits,
    settings_record,
)
from ..predictor.hardware import PresetError
from .routers import DEFAULT_BANDWIDTH_GB_S, ROUTERS, Fleet, parse_fleet
from .step_models import AnalyticStepModel, OnnxStepModel, StepModel, parse_step_model

if TYPE_CHECKING:
    from .matrix import Cases

MIB = 1 << 20


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Workload, engine and step-model options shared by ``simulate`` and ``tune``."""
    case = parser.add_mutually_exclusive_group(required=True)
    case.add_argument("--workload", type=workload_names, metavar="NAME[,NAME...]",
                      help="generate these workloads: " + ", ".join(WORKLOADS)
                           + " or 'seed002'")
    case.add_argument("--case", type=Path, help="replay this case file (JSONL)")
    add_trace_arguments(parser, case)
    parser.add_argument("--step-model", required=True, metavar="SPEC",
                        help="how long a step takes: onnx:PATH (a latency model from "
                             "'fairsched train'), analytic:ACCEL:MODEL[:field=value...] (an "
                             "accelerator preset and a model preset or config.json, "
                             "field=value overriding an accelerator field, e.g. "
                             "analytic:h100:qwen3-8b:step_overhead_s=0.002) or "
                             "linear:BASE_MS:PER_TOKEN_MS[:DECODE_MS_PER_TOKEN] (a base "
                             "plus a cost per scheduled token; decode tokens at their own "
                             "cost when the third field is given)")
    add_sampling_arguments(parser, seed_help="workload seed: arrivals and the pairs drawn "
                                             "(repeat r uses seed + r)")
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR,
                        help="tokenizer for building a ShareGPT pool (not with --pool)")
    parser.add_argument("--pool", type=Path,
                        help="ShareGPT pair pool (JSONL; default: built from --model-dir)")
    add_limit_arguments(parser)
    parser.add_argument("--kv-cache-tokens", type=positive_int,
                        help="KV cache size in tokens (default: from the analytic model's "
                             "device memory, or the ONNX model's training memory features, "
                             "else 2^20)")
    parser.add_argument("--kv-bytes-per-token", type=positive_int,
                        help="bytes of K and V per token (default: from the analytic model, "
                             "else 4096, the tiny CPU model in float32)")
    parser.add_argument("--prefix-caching", action="store_true",
                        help="turn vLLM's prefix cache on (prompts share cached blocks where "
                             "the trace names them: Mooncake's hash_ids, a log's block_hashes "
                             "or session turns; other prompts never share one)")
    parser.add_argument("--max-virtual-s", type=positive_float, default=86_400.0,
                        help="stop and name the unfinished requests past this virtual time")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="plugin config for every plugin arm, dotted key")
    add_pool_arguments(parser)


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    sim = subparsers.add_parser(
        "simulate", help="bench's workloads, arms and report on vLLM's real scheduler with "
                         "a virtual clock and a step-time model (no server)",
        description="Runs bench's workloads and arms on vLLM's real scheduler classes, "
                    "fed fake model outputs, on a virtual clock whose steps take what "
                    "--step-model says; writes bench's report to --out. A simulation is "
                    "deterministic: only --repeat's workload seeds vary.")
    sim.add_argument("--arms", "--policies", dest="arms", default="stock,fcfs,aging",
                     help=ARMS_HELP)
    sim.add_argument("--repeat", type=positive_int, default=1,
                     help="workload seeds seed..seed+N-1 (a simulation itself never varies)")
    sim.add_argument("--closed-loop", action="store_true",
                     help="a session's later turns arrive their recorded think time after "
                          "the previous turn's answer, not at their recorded times (open "
                          "loop, the default)")
    sim.add_argument("--out", type=Path, default=Path("runs/simulate"),
                     help="directory for the cases, runs and report")
    sim.add_argument("--no-trace", action="store_true",
                     help="keep no per-step trace (faster, less memory; no batch tables)")
    sim.add_argument("--engines", type=positive_int, default=1,
                     help="simulate a fleet of this many engines behind --router, each "
                          "with the engine settings given (default: 1, no router)")
    sim.add_argument("--router", choices=ROUTERS,
                     help="how a fleet routes each request: round-robin, vllm-dp (vLLM's "
                          "data-parallel balancer), llm-d (llm-d's default endpoint "
                          "scorers: prefix 3, queue 2, KV 2) or llm-d-work (llm-d with the "
                          "queue read as the plugin's waiting prompt tokens); default "
                          "round-robin")
    sim.add_argument("--disagg", type=_disaggregated, metavar="PpDd[xROUTER][:stock]",
                     help="simulate disaggregated prefill: P prefill and D decode engines, "
                          "each pool behind ROUTER (default round-robin), the KV cache "
                          "pulled by the decode engine over --kv-bandwidth; :stock runs "
                          "stock vLLM on the decode pool (e.g. 2p2dxllm-d)")
    sim.add_argument("--kv-bandwidth", type=positive_float, metavar="GB_S",
                     default=DEFAULT_BANDWIDTH_GB_S,
                     help="with --disagg: each decode engine's KV link in GB/s (default "
                          f"{DEFAULT_BANDWIDTH_GB_S:g}: one 400 Gb/s RDMA NIC)")
    sim.add_argument("--target-ms", type=positive_float,
                     help="score every arm's step times against this latency target in ms "
                          "(default: no target)")
    add_engine_arguments(sim)
    sim.set_defaults(func=main)


def settings_from_args(args: argparse.Namespace, model: StepModel
                       ) -> tuple[SimSettings, dict[str, str]]:
    """Engine settings and where each came from: limits given or the device's
    (``engine_settings``); the KV cache follows the step model unless given."""
    limits, sources = resolve_limits(args, model)
    kv_tokens, kv_bytes = 1 << 20, 4096
    if isinstance(model, AnalyticStepModel):
        kv_bytes = model.config.kv_bytes_per_token
        kv_tokens = analytic.kv_cache_tokens(model.config, model.accelerator)
    elif isinstance(model, OnnxStepModel) and model.reserved_mb:
        kv_bytes = args.kv_bytes_per_token or kv_bytes
        kv_tokens = int(model.reserved_mb * MIB // kv_bytes)
    settings = SimSettings(
        **limits,
        kv_cache_tokens=args.kv_cache_tokens or kv_tokens,
        kv_bytes_per_token=args.kv_bytes_per_token or kv_bytes,
        enable_prefix_caching=args.prefix_caching,
        max_virtual_s=args.max_virtual_s,
    )
    return settings, sources


def case_loader(args: argparse.Namespace):
    """Cases per repeat: the case file or the trace every time, or the workloads built
    with seed + r."""
    check_trace_arguments(args)
    if args.case or args.trace:
        fixed = {args.case.stem: read_case(args.case)} if args.case else (
            trace_cases_from_args(args))
        return lambda r: fixed
    pool = load_pool(args)

    def build(r: int) -> Cases:
        return build_cases(pool, argparse.Namespace(**{**vars(args), "seed": args.seed + r}))

    return build


def main(args: argparse.Namespace) -> int:
    try:
        arms = parse_arms(args.arms, plugin_settings(args.set))
        model = parse_step_model(args.step_model)
        output_dir(args.out)  # before a pool is tokenized, which takes minutes
        cases_for = case_loader(args)
        first = cases_for(0)
        settings, sources = settings_from_args(args, model)
        fleet = fleet_of(args)
        write_cases(args.out, first)
    except (ConfigError, PresetError, PredictorError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # vLLM and torch load here, once the arguments and inputs are known to be good.
    from .matrix import run_matrix

    print(f"step model: {model.description}")
    print(describe(settings, sources))
    started = time.perf_counter()
    try:
        runs, timing = run_matrix(arms, lambda r: first if r == 0 else cases_for(r), model,
                                  settings, repeat=args.repeat, out_dir=args.out,
                                  trace=not args.no_trace, progress=print,
                                  closed_loop=args.closed_loop, fleet=fleet,
                                  kv_bandwidth_gb_s=args.kv_bandwidth)
    except SimulationStalled as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except (ConfigError, ValueError) as exc:  # vLLM's own config checks are ValueErrors
        print(f"error: {exc}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - started
    config = simulation_config(args, arms, first, model, settings, sources, fleet)
    config["simulator_time"] = {
        "wall_s": round(elapsed, 2), "steps": timing.steps,
        "vllm_schedule_s": round(timing.schedule_s, 2),
        "vllm_update_s": round(timing.update_s, 2),
        "step_model_s": round(timing.step_model_s, 2),
    }
    config["prefill_work"] = prefill_work(runs)
    (args.out / "config.json").write_text(json.dumps(config, indent=2))
    report = write_report(args.out, runs, config=config, target_ms=args.target_ms)
    print(render_markdown(analyse_runs(runs), main_only=True))
    print("\n" + prefill_work_lines(config["prefill_work"]))
    if fleet is not None:
        print(fleet_balance_lines(runs))
    print(f"simulated in {elapsed:.1f} s; report: {report}")
    return 0


def _disaggregated(text: str) -> Fleet:
    try:
        fleet = parse_fleet(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))
    if not fleet.disaggregated:
        raise argparse.ArgumentTypeError(f"--disagg {text!r}: PpDd[xROUTER][:stock], e.g. "
                                         "1p1d or 2p2dxllm-d")
    return fleet


def fleet_of(args: argparse.Namespace) -> Fleet | None:
    """The fleet ``--disagg``, or ``--engines`` and ``--router``, ask for (round robin
    unless named); None for one engine with no router."""
    if args.disagg is not None:
        if args.engines != 1 or args.router:
            raise ValueError("--disagg names its own pools and router: drop --engines and "
                             "--router")
        return args.disagg
    if args.engines == 1 and not args.router:
        return None
    return Fleet(args.engines, args.router or "round-robin")


def prefill_work(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per arm, over its runs: the prompt tokens the engine computed (recomputation after
    preemptions included) and the share of the served prompts' tokens the prefix cache
    held when each was admitted."""
    from .suite import prefix_hit_rate

    out = {}
    for arm, arm_runs in runs.items():
        done = [r for run in arm_runs for r in run["requests"] if r["error"] is None]
        out[arm] = {
            "prefill_tokens": sum(r.get("prefill_tokens", 0) for run in arm_runs
                                  for r in run["requests"]),
            "prefix_hit_rate": round(prefix_hit_rate(done), 6),
        }
    return out


def prefill_work_lines(work: dict[str, dict[str, float]]) -> str:
    """The prefill work table: tokens computed, as a ratio to the first arm's, and the
    prefix cache's hit rate."""
    first = next(iter(work.values()))["prefill_tokens"] or 1
    lines = ["| Arm | prefill tokens computed | / first arm's | prefix-cache hit rate |",
             "|---|---|---|---|"]
    for arm, w in work.items():
        lines.append(f"| {arm} | {w['prefill_tokens']:,} | {w['prefill_tokens'] / first:.3f} "
                     f"| {w['prefix_hit_rate']:.1%} |")
    return "\n".join(lines)


def fleet_balance_lines(runs: dict[str, list[dict[str, Any]]]) -> str:
    """Per arm, how the fleet's router spread the work (first run of each arm)."""
    from .fleet import balance

    lines = []
    for arm, arm_runs in runs.items():
        fleet = arm_runs[0]["meta"]["fleet"]
        spread = balance(arm_runs[0])
        requests = "/".join(str(e["requests"]) for e in fleet["engines"])
        pools = [e.get("pool") for e in fleet["engines"]]
        shape = (f"{pools.count('prefill')} prefill and {pools.count('decode')} decode engines"
                 if "decode" in pools else f"{len(pools)} engines")
        lines.append(f"{arm}: {shape} behind {fleet['router']}; "
                     f"requests per engine {requests}; busiest engine "
                     f"{spread['busy_max_over_mean']:.2f}x the mean busy time, "
                     f"{spread['prompt_max_over_mean']:.2f}x the mean prompt tokens")
    return "\n".join(lines)


def simulation_config(args: argparse.Namespace, arms: list, cases: Cases, model: StepModel,
                      settings: SimSettings, sources: dict[str, str],
                      fleet: Fleet | None) -> dict[str, Any]:
    """What ``config.json`` records of the run; ``fleet``: as :func:`fleet_of` gave it."""
    return {
        "command": " ".join(["fairsched", *sys.argv[1:]]),
        "simulated": True,
        "step_model": model.description,
        "arms": [arm.name for arm in arms],
        "workload": workload_label(args),
        "case": {name: case_summary(case) for name, case in cases.items()},
        "plugin_settings": plugin_settings(args.set),
        "engine": settings_record(settings, sources),
        "arrivals": ("closed loop: a session's later turns a think time after the previous "
                     "answer" if args.closed_loop else "open loop: every request at its "
                     "recorded time"),
        "repeat": args.repeat,
        "fleet": fleet._asdict() if fleet is not None else None,
        **({"kv_bandwidth_gb_s": args.kv_bandwidth}
           if fleet is not None and fleet.disaggregated else {}),
    }
