"""The real engine, no server: each arm's time and CPU to serve the same burst of requests.

A real-server A/B mixes the engine's own speed with Poisson arrivals, the HTTP server and
the client, all sharing two cores; at heavy load the plugin's arms decoded 10% slower than
stock in some runs and not in others (``docs/results.md``, the A/A with and without the
per-step trace). This takes the arrivals, the server and the client away: every arm is a
real vLLM engine (``vllm.LLM``, its engine core in its own process, as in a server) in a
worker process of its own, started once; each round hands every arm the whole case at
once (``LLM.generate``, ``ignore_eos`` so each request decodes its case's output length,
the prefix cache reset first), arms in an order that rotates every round, only one arm
working at a time.

An arm that makes stock's decisions (``fcfs``) then does stock's work step for step, so
its time against stock's in the same round is what the plugin's machinery costs per step;
``fcfs:trace_path=`` is the same without the per-step trace. Printed per arm: the median
over rounds of wall time, the engine core's CPU time and the worker's own (output
processing), and of the paired ratio to the first arm; for traced arms, the steps and the
mean measured step time from the trace.

    fairsched workload build --name uniform --model-dir .cache/tiny-model --num-requests 300 \\
        --param rate_per_s=10 --rate-scale 8 --max-output-tokens 128 --out runs/engine-aa/case.jsonl
    .venv/bin/python benchmarks/engine_aa.py --case runs/engine-aa/case.jsonl \\
        --arms stock,fcfs,fcfs:trace_path= --rounds 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

WORKER = "worker"


def run_worker(args: argparse.Namespace) -> None:
    """One engine; reads ``run`` lines on stdin, answers each with a JSON line."""
    import psutil
    from vllm import LLM, SamplingParams

    from fairsched_plugin.bench.workloads import read_case

    case = read_case(args.case)
    kwargs: dict[str, Any] = {}
    if args.plugin:
        kwargs["scheduler_cls"] = "fairsched_plugin.FairScheduler"
    llm = LLM(model=args.model, max_num_batched_tokens=args.max_num_batched_tokens,
              max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
              dtype="float32", **kwargs)
    prompts = [request.prompt for request in case]
    params = [SamplingParams(max_tokens=request.output_tokens, ignore_eos=True,
                             temperature=0.0) for request in case]
    me = psutil.Process()
    engines = me.children(recursive=True)

    def cpu_s(processes: list[psutil.Process]) -> float:
        return sum(sum(p.cpu_times()[:2]) for p in processes)

    llm.generate(prompts[:64], [SamplingParams(max_tokens=16, ignore_eos=True)] * 64,
                 use_tqdm=False)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        llm.reset_prefix_cache()
        engine_cpu, own_cpu, start = cpu_s(engines), cpu_s([me]), time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        print(json.dumps({
            "wall_s": wall,
            "engine_cpu_s": cpu_s(engines) - engine_cpu,
            "own_cpu_s": cpu_s([me]) - own_cpu,
            "output_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        }), flush=True)


class ArmWorker:
    """A worker process serving one arm."""

    def __init__(self, spec: str, index: int, args: argparse.Namespace, out: Path) -> None:
        from fairsched_plugin.bench.arms import STOCK, parse_arm
        from fairsched_plugin.bench.server import server_env

        arm = parse_arm(spec)
        self.name = spec
        self.plugin = arm.name != STOCK
        env = dict(arm.env)
        if self.plugin:
            env.setdefault("FAIRSCHED_TRACE_PATH", str((out / f"trace-{index}.jsonl").resolve()))
        self.trace = Path(env["FAIRSCHED_TRACE_PATH"]) if env.get("FAIRSCHED_TRACE_PATH") else None
        command = [sys.executable, __file__, WORKER, "--case", str(args.case),
                   "--model", args.model,
                   "--max-num-batched-tokens", str(args.max_num_batched_tokens),
                   "--max-num-seqs", str(args.max_num_seqs),
                   "--max-model-len", str(args.max_model_len)]
        if self.plugin:
            command.append("--plugin")
        self.log = open(out / f"worker-{index}.log", "w")
        self.process = subprocess.Popen(command, env=server_env(env), text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log)
        self._answer()

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"arm {self.name}: worker exited; see {self.log.name}")

    def run(self) -> dict[str, Any]:
        """One pass of the whole case, with the trace's steps of that pass."""
        assert self.process.stdin is not None
        mark = self.trace.stat().st_size if self.trace and self.trace.exists() else 0
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        result = self._answer()
        if self.trace and self.trace.exists():
            with open(self.trace) as file:
                file.seek(mark)
                steps = [json.loads(line) for line in file if line.strip()]
            result["steps"] = len(steps)
            result["mean_step_ms"] = 1000 * statistics.fmean(s["step_time_s"] for s in steps)
        return result

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=[WORKER])
    parser.add_argument("--case", type=Path, help="a case file (JSONL)")
    parser.add_argument("--table", type=Path, metavar="RESULTS",
                        help="print the table of an earlier run's results.json and stop")
    parser.add_argument("--model", default=".cache/tiny-model")
    parser.add_argument("--arms", default="stock,fcfs,fcfs:trace_path=")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("runs/engine-aa"))
    parser.add_argument("--max-num-batched-tokens", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--plugin", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table:
        print_table(json.loads(args.table.read_text()))
        return
    if args.case is None:
        parser.error("--case is required")
    if args.mode == WORKER:
        run_worker(args)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for old in [*args.out.glob("trace-*.jsonl"), *args.out.glob("worker-*.log")]:
        old.unlink()
    arms: list[ArmWorker] = []
    try:
        for index, spec in enumerate(args.arms.split(",")):
            arms.append(ArmWorker(spec.strip(), index, args, args.out))
            print(f"started {spec}", flush=True)
        results: dict[str, list[dict[str, Any]]] = {arm.name: [] for arm in arms}
        for round_ in range(args.rounds):
            shift = round_ % len(arms)
            for arm in arms[shift:] + arms[:shift]:
                result = arm.run()
                results[arm.name].append(result)
                print(f"round {round_ + 1} {arm.name}: {json.dumps(result)}", flush=True)
    finally:
        for arm in arms:
            arm.stop()
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print_table(results)


def geomean_ci(ratios: list[float], draws: int = 10_000) -> tuple[float, float, float]:
    """The geometric mean of paired ratios and its 95% bootstrap interval: with rounds as
    noisy as these (one arm's wall time moves by 10% between rounds), the interval says how
    large a per-step cost the run could have missed."""
    logs = np.log(np.asarray(ratios))
    means = np.random.default_rng(0).choice(logs, (draws, len(logs))).mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(np.exp(logs.mean())), float(np.exp(low)), float(np.exp(high))


def print_table(results: dict[str, list[dict[str, Any]]]) -> None:
    base = next(iter(results))
    print(f"\nmedian over {len(results[base])} rounds [range]; ratios paired by round "
          f"against {base}, and their geometric mean [95% bootstrap interval]")
    print("| arm | wall s | x wall | x wall, geometric mean | engine CPU s | x engine CPU "
          "| tok/s | steps | mean step ms |")
    print("|---|---|---|---|---|---|---|---|---|")

    def cell(values: list[float], fmt: str) -> str:
        return (f"{statistics.median(values):{fmt}} "
                f"[{min(values):{fmt}}-{max(values):{fmt}}]")

    for name, runs in results.items():
        x_wall = [r["wall_s"] / b["wall_s"] for r, b in zip(runs, results[base])]
        x_cpu = [r["engine_cpu_s"] / b["engine_cpu_s"] for r, b in zip(runs, results[base])]
        mean, low, high = geomean_ci(x_wall)
        steps = [r["steps"] for r in runs if "steps" in r]
        step_ms = [r["mean_step_ms"] for r in runs if "mean_step_ms" in r]
        print(f"| {name} | {cell([r['wall_s'] for r in runs], '.1f')} | "
              f"{cell(x_wall, '.3f')} | {mean:.3f} [{low:.3f}-{high:.3f}] | "
              f"{cell([r['engine_cpu_s'] for r in runs], '.1f')} | {cell(x_cpu, '.3f')} | "
              f"{cell([r['output_tokens'] / r['wall_s'] for r in runs], '.0f')} | "
              f"{cell(steps, '.0f') if steps else '-'} | "
              f"{cell(step_ms, '.1f') if step_ms else '-'} |")


if __name__ == "__main__":
    main()
