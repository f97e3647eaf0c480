"""Each arm's time and CPU to serve the same requests, in many short paired rounds.

A real-server A/B (``fairsched bench``) starts a fresh server per arm and repeat, so it
affords three repeats of minutes each, and it mixes the engine's own speed with Poisson
arrivals, the HTTP server and the client, all sharing two cores; at heavy load the plugin's
arms decoded 10% slower than stock in some runs and not in others, a difference the
``fcfs`` control showed too. Here every arm is started once and kept: each
round hands every arm the whole case, arms in an order that rotates every round, only one
arm working at a time, the prefix cache reset first, ``ignore_eos`` so each request
decodes its case's output length. Three ways to serve it:

* by default, the engine alone: a real vLLM engine (``vllm.LLM``, its engine core in its
  own process, as in a server) in a worker process per arm, given the whole case at once
  (``LLM.generate``): no arrivals, no server, no client;
* ``--arrivals``: the same engine alone, each request added at its case arrival time
  (prompts tokenized beforehand) and timed as the worker sees its outputs: arrivals as a
  server sees them, without the HTTP server, the API process and the client, so a
  difference between arms that shows with a server and not here lies on that path;
* ``--server``: a real OpenAI-compatible server per arm, the case replayed at its arrival
  times by the project's replay client, as ``fairsched bench`` does; with ``--client
  vllm-bench``, by ``vllm bench serve`` instead (vLLM's own client, its own Poisson
  arrivals at the case's mean rate, seeded by the round, so every arm of a round sees the
  same arrivals and each round new ones).

An arm that makes stock's decisions (``fcfs``) does stock's work step for step in the
first mode, so its time against stock's in the same round is what the plugin's machinery
costs per step; ``fcfs:trace_path=`` is the same without the per-step trace. Printed per
arm: the median over rounds of wall time and the engine core's CPU time, and the paired
ratios to the first arm (median and range, and the geometric mean with its 95% bootstrap
interval); for traced arms, the steps and the mean measured step time from the trace; with
``--server`` or ``--arrivals`` also median, mean and P99 TTFT, mean E2E and mean time per
output token.

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
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from fairsched_plugin.experiment.arms import Arm

WORKER = "worker"
INSTANCE = "#"
"""``stock#2``: a second instance of an arm. Each arm keeps its engine for the whole run,
and engines of the same arm differ among themselves by a few percent (memory layout), so
two instances of one arm measure that difference: the floor under any arm effect."""


def run_worker(args: argparse.Namespace) -> None:
    """One engine; reads ``run`` lines on stdin, answers each with a JSON line."""
    import psutil
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from fairsched_plugin.experiment.case_files import read_case

    case = read_case(args.case)
    kwargs: dict[str, Any] = {}
    if args.plugin:
        kwargs["scheduler_cls"] = "fairsched_plugin.FairScheduler"
    if args.enforce_eager:
        kwargs["enforce_eager"] = True
    llm = LLM(model=args.model, max_num_batched_tokens=args.max_num_batched_tokens,
              max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
              dtype="float32", **kwargs)
    prompts = [request.prompt for request in case]
    params = [SamplingParams(max_tokens=request.output_tokens, ignore_eos=True,
                             temperature=0.0) for request in case]
    me = psutil.Process()
    engines = me.children(recursive=True)

    warm = prompts[:64]
    llm.generate(warm, [SamplingParams(max_tokens=16, ignore_eos=True)] * len(warm),
                 use_tqdm=False)
    if args.arrivals:
        tokenizer = llm.get_tokenizer()
        token_ids = [tokenizer.encode(prompt) for prompt in prompts]
        for p in params:
            p.output_kind = RequestOutputKind.DELTA
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        llm.reset_prefix_cache()
        engine_cpu, own_cpu, start = _cpu_s(engines), _cpu_s([me]), time.perf_counter()
        if args.arrivals:
            figures = _serve_at_arrivals(llm.llm_engine, case, token_ids, params)
        else:
            outputs = llm.generate(prompts, params, use_tqdm=False)
            figures = {"wall_s": time.perf_counter() - start,
                       "output_tokens": sum(len(o.outputs[0].token_ids) for o in outputs)}
        print(json.dumps({
            **figures,
            "engine_cpu_s": _cpu_s(engines) - engine_cpu,
            "own_cpu_s": _cpu_s([me]) - own_cpu,
        }), flush=True)


def _serve_at_arrivals(engine: Any, case: list[Any], token_ids: list[list[int]],
                       params: list[Any]) -> dict[str, float]:
    """The case through vLLM's ``LLMEngine``, each request added once its arrival time has
    passed, stepped as a server's output loop would; the client-side times of every
    request, summarized as a replay's are.

    A request arriving while ``step()`` waits for the engine core's next output is added
    when it returns, one engine step late at most, alike for every arm."""
    from fairsched_plugin.bench.replay import RequestResult

    results = [RequestResult.for_case(request) for request in case]
    by_id = {result.id: result for result in results}  # outputs carry the id as given
    order = sorted(range(len(case)), key=lambda i: case[i].arrival_s)
    start = time.perf_counter()
    added = steps = 0
    while added < len(order) or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while added < len(order) and case[order[added]].arrival_s <= now:
            i = order[added]
            results[i].sent_s = now
            engine.add_request(results[i].id, {"prompt_token_ids": token_ids[i]}, params[i])
            added += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, case[order[added]].arrival_s - now))
            continue
        outputs = engine.step()
        now = time.perf_counter() - start  # one step's outputs arrive together
        steps += bool(outputs)
        for output in outputs:
            result = by_id[output.request_id]
            tokens = len(output.outputs[0].token_ids)
            if tokens and result.first_token_s is None:
                result.first_token_s = now
            result.output_tokens += tokens
            if output.finished:
                result.finish_s = now
    return {**_summary([result.to_json() for result in results], "the engine-alone worker",
                       "this log"),
            "output_steps": steps}


class ArmWorker:
    """A worker process serving one arm."""

    def __init__(self, spec: str, index: int, args: argparse.Namespace, out: Path,
                 stack: ExitStack) -> None:
        from fairsched_plugin.bench.server import server_env

        self.name = spec
        arm, env, self.trace = _arm_env(spec, out / f"trace-{index}.jsonl")
        self.plugin = bool(arm.engine_args)
        command = [sys.executable, __file__, WORKER, "--case", str(args.case),
                   "--model", args.model,
                   "--max-num-batched-tokens", str(args.max_num_batched_tokens),
                   "--max-num-seqs", str(args.max_num_seqs),
                   "--max-model-len", str(args.max_model_len)]
        if self.plugin:
            command.append("--plugin")
        if args.arrivals:
            command.append("--arrivals")
        if args.enforce_eager:
            command.append("--enforce-eager")
        self.log = open(out / f"worker-{index}.log", "w")
        self.process = subprocess.Popen(command, env=server_env(env), text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log)
        stack.callback(self.stop)
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
        mark = _trace_size(self.trace)
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        result = self._answer()
        result.update(_trace_steps(self.trace, mark))
        return result

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


class ArmServer:
    """A real OpenAI-compatible server serving one arm (``--server``): the same rounds
    through the HTTP server and a client (the project's replay client, or ``vllm bench
    serve``), so what the server path and the clients add comes back in."""

    def __init__(self, spec: str, index: int, args: argparse.Namespace, out: Path,
                 stack: ExitStack, case: list[Any]) -> None:
        from fairsched_plugin.bench.runner import DEV_MODE_ENV, EngineSettings, warm_up
        from fairsched_plugin.bench.server import running_server

        self.name = spec
        self.case = case
        self.client = args.client
        self.tokenizer = args.model
        self.bench_dir = out / f"vllm-bench-{index}"
        self.rounds = 0
        arm, env, self.trace = _arm_env(spec, out / f"trace-{index}.jsonl")
        env.update(DEV_MODE_ENV)
        engine = EngineSettings(max_num_batched_tokens=args.max_num_batched_tokens,
                                max_num_seqs=args.max_num_seqs,
                                max_model_len=args.max_model_len,
                                extra=("--enforce-eager",) if args.enforce_eager else ())
        self.server = stack.enter_context(running_server(
            args.model, out / f"server-{index}.log", [*engine.args(), *arm.engine_args],
            env=env))
        warm_up(self.server.base_url, self.server.model, self.case)

    def run(self) -> dict[str, Any]:
        """One round of the case through the client: its span, the server's CPU (the engine
        core's and the API server's own), median, mean and P99 TTFT, mean E2E and mean
        time per output token."""
        import psutil

        from fairsched_plugin.bench.runner import reset_prefix_cache

        reset_prefix_cache(self.server.base_url)
        api = psutil.Process(self.server.process.pid)
        engines = api.children(recursive=True)
        mark = _trace_size(self.trace)
        engine_cpu, own_cpu = _cpu_s(engines), _cpu_s([api])
        figures = self._vllm_bench() if self.client == "vllm-bench" else self._replay()
        self.rounds += 1
        return {
            **figures,
            "engine_cpu_s": _cpu_s(engines) - engine_cpu,
            "own_cpu_s": _cpu_s([api]) - own_cpu,
            **_trace_steps(self.trace, mark),
        }

    def _replay(self) -> dict[str, float]:
        """The case at its own arrival times, through the project's replay client."""
        from fairsched_plugin.bench.replay import replay

        result = replay(self.server.base_url, self.server.model, self.case, show_progress=False)
        return _summary([request.to_json() for request in result.requests],
                        f"arm {self.name}", str(self.server.log_path))

    def _vllm_bench(self) -> dict[str, float]:
        """The case's prompts and output lengths through ``vllm bench serve``, its Poisson
        arrivals seeded by the round; its span is the benchmark's duration."""
        from fairsched_plugin.bench import vllm_client

        self.bench_dir.mkdir(exist_ok=True)
        result = vllm_client.run(self.server.base_url, self.server.model, self.tokenizer,
                                 self.case, self.bench_dir, timeout_s=1800, seed=self.rounds)
        if result["completed"] != len(self.case):
            raise RuntimeError(f"arm {self.name}: vllm bench serve completed "
                               f"{result['completed']} of {len(self.case)} requests; see "
                               f"{self.bench_dir / 'vllm-bench.log'} and {self.server.log_path}")
        return {
            "wall_s": result["duration_s"],
            "output_tokens": result["output_tokens"],
            "ttft_p50_s": result["ttft_p50_ms"] / 1000,
            "ttft_mean_s": result["ttft_mean_ms"] / 1000,
            "ttft_p99_s": result["ttft_p99_ms"] / 1000,
            "e2e_mean_s": result["e2e_mean_ms"] / 1000,
            "tpot_mean_s": result["tpot_mean_ms"] / 1000,
        }


def _summary(requests: list[dict[str, Any]], who: str, log: str) -> dict[str, float]:
    """A round's figures from the client's record of every request; an error names the
    failed requests' errors and where to look."""
    from fairsched_plugin.experiment.metrics import summarize_run

    summary = summarize_run(requests)
    if summary["requests"]["failed"]:
        raise RuntimeError(f"{who}: {summary['requests']['failed']} requests failed "
                           f"({summary['requests']['errors']}); see {log}")
    latency = summary["latency"]
    return {
        "wall_s": summary["throughput"]["makespan_s"],
        "output_tokens": summary["throughput"]["output_tokens"],
        "ttft_p50_s": latency["ttft_s"]["p50"],
        "ttft_mean_s": latency["ttft_s"]["mean"],
        "ttft_p99_s": latency["ttft_s"]["p99"],
        "e2e_mean_s": latency["e2e_s"]["mean"],
        "tpot_mean_s": latency["tpot_s"]["mean"],
    }


def _cpu_s(processes: list[Any]) -> float:
    """User and system CPU seconds of these ``psutil`` processes so far."""
    return sum(sum(p.cpu_times()[:2]) for p in processes)


def _arm_env(spec: str, trace: Path) -> tuple[Arm, dict[str, str], Path | None]:
    """The arm ``spec`` names (an instance suffix dropped), the variables that start it
    as ``fairsched bench`` would, and the per-step trace it writes (None: none)."""
    from fairsched_plugin.experiment.arms import parse_arm
    from fairsched_plugin.bench.runner import arm_env

    arm = parse_arm(spec.partition(INSTANCE)[0])
    env = arm_env(arm, trace)
    path = env.get("FAIRSCHED_TRACE_PATH")
    return arm, env, Path(path) if path else None


def _trace_size(trace: Path | None) -> int:
    """Where the next round's records will start in the trace."""
    return trace.stat().st_size if trace is not None and trace.exists() else 0


def _trace_steps(trace: Path | None, mark: int) -> dict[str, float]:
    """The steps a plugin arm's trace recorded after byte ``mark``, and their mean time."""
    from fairsched_plugin.experiment.run_files import read_jsonl

    if trace is None or not trace.exists():
        return {}
    steps = read_jsonl(trace, offset=mark)
    return {"steps": len(steps),
            "mean_step_ms": 1000 * statistics.fmean(s["step_time_s"] for s in steps)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=[WORKER])
    parser.add_argument("--case", type=Path, help="a case file (JSONL)")
    parser.add_argument("--table", type=Path, metavar="RESULTS",
                        help="print the table of an earlier run's results.json and stop")
    parser.add_argument("--base", metavar="ARM",
                        help="with --table: pair the rounds with this arm instead of the "
                             "run's first (the default against the fcfs control, say)")
    parser.add_argument("--model", default=".cache/tiny-model")
    parser.add_argument("--arms", default="stock,fcfs,fcfs:trace_path=",
                        help="arms as fairsched bench names them; the first is the baseline; "
                             f"ARM{INSTANCE}N is another instance of ARM")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("runs/engine-aa"))
    parser.add_argument("--max-num-batched-tokens", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--server", action="store_true",
                        help="serve each arm from a real OpenAI-compatible server and replay "
                             "the case through a client (see --client)")
    parser.add_argument("--client", choices=["replay", "vllm-bench"], default="replay",
                        help="with --server: the client of every round (vllm-bench: "
                             "vllm bench serve, arrivals seeded by the round)")
    parser.add_argument("--arrivals", action="store_true",
                        help="engine alone, each request added at its arrival time, with "
                             "TTFT, E2E and TPOT as the worker sees them (no server, no client)")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="every engine skips torch.compile (vLLM's --enforce-eager): "
                             "engines start in about half the time; steps run slower")
    parser.add_argument("--plugin", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table:
        results = json.loads(args.table.read_text())
        if args.base is not None:
            if args.base not in results:
                parser.error(f"--base {args.base}: the run has arms {', '.join(results)}")
            results = {args.base: results.pop(args.base), **results}
        print_table(results)
        return
    if args.base is not None:
        parser.error("--base needs --table")
    if args.case is None:
        parser.error("--case is required")
    if args.client != "replay" and not args.server:
        parser.error("--client needs --server: the engine-alone mode has no client")
    if args.arrivals and args.server:
        parser.error("--arrivals is the engine-alone mode's; a server gets its arrivals "
                     "from the client")
    if args.mode == WORKER:
        run_worker(args)
        return
    from fairsched_plugin.experiment.case_files import read_case

    args.out.mkdir(parents=True, exist_ok=True)
    for old in [*args.out.glob("trace-*.jsonl"), *args.out.glob("*.log")]:
        old.unlink()
    arms: list[ArmWorker | ArmServer] = []
    case = read_case(args.case) if args.server else []
    with ExitStack() as stack:
        for index, spec in enumerate(args.arms.split(",")):
            arms.append(ArmServer(spec.strip(), index, args, args.out, stack, case)
                        if args.server
                        else ArmWorker(spec.strip(), index, args, args.out, stack))
            print(f"started {spec}", flush=True)
        results: dict[str, list[dict[str, Any]]] = {arm.name: [] for arm in arms}
        for round_ in range(args.rounds):
            shift = round_ % len(arms)
            for arm in arms[shift:] + arms[:shift]:
                result = arm.run()
                results[arm.name].append(result)
                print(f"round {round_ + 1} {arm.name}: {json.dumps(result)}", flush=True)
            # Every whole round on disk: a run that fails later keeps its paired rounds
            # for --table.
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


PAIRED_EXTRA = {"ttft_p50_s": "x median TTFT", "ttft_mean_s": "x mean TTFT",
                "ttft_p99_s": "x P99 TTFT",
                "e2e_mean_s": "x mean E2E", "tpot_mean_s": "x mean TPOT",
                "output_steps": "x steps with output"}
"""What a ``--server`` or ``--arrivals`` round also measures, shown as paired geometric
means (steps with output: ``--arrivals`` only, counted for every arm, stock included)."""


def print_table(results: dict[str, list[dict[str, Any]]]) -> None:
    base = next(iter(results))
    extra = [key for key in PAIRED_EXTRA if key in results[base][0]]
    print(f"\nmedian over {len(results[base])} rounds [range]; ratios paired by round "
          f"against {base}, and their geometric mean [95% bootstrap interval]")
    print("| arm | wall s | x wall | x wall, geometric mean | engine CPU s | x engine CPU "
          "| tok/s | steps | mean step ms |"
          + "".join(f" {PAIRED_EXTRA[key]}, geometric mean |" for key in extra))
    print("|---" * (9 + len(extra)) + "|")

    def cell(values: list[float], fmt: str) -> str:
        return (f"{statistics.median(values):{fmt}} "
                f"[{min(values):{fmt}}-{max(values):{fmt}}]")

    for name, runs in results.items():
        x_wall = [r["wall_s"] / b["wall_s"] for r, b in zip(runs, results[base])]
        x_cpu = [r["engine_cpu_s"] / b["engine_cpu_s"] for r, b in zip(runs, results[base])]
        mean, low, high = geomean_ci(x_wall)
        paired = ""
        for key in extra:
            m, lo, hi = geomean_ci([r[key] / b[key] for r, b in zip(runs, results[base])])
            paired += f" {m:.3f} [{lo:.3f}-{hi:.3f}] |"
        steps = [r["steps"] for r in runs if "steps" in r]
        step_ms = [r["mean_step_ms"] for r in runs if "mean_step_ms" in r]
        print(f"| {name} | {cell([r['wall_s'] for r in runs], '.1f')} | "
              f"{cell(x_wall, '.3f')} | {mean:.3f} [{low:.3f}-{high:.3f}] | "
              f"{cell([r['engine_cpu_s'] for r in runs], '.1f')} | {cell(x_cpu, '.3f')} | "
              f"{cell([r['output_tokens'] / r['wall_s'] for r in runs], '.0f')} | "
              f"{cell(steps, '.0f') if steps else '-'} | "
              f"{cell(step_ms, '.1f') if step_ms else '-'} |{paired}")


if __name__ == "__main__":
    main()
