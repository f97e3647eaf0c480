"""Metrics of one benchmark run, and their spread over repeats.

A run is what one policy arm produced on one workload: per-request results from the replay
client and (optionally) the scheduler's per-step trace. Everything here is pure numpy so the
same numbers can be recomputed from saved JSON anywhere.

Inputs
------
Request results: one mapping per request, times in seconds on the client's clock relative to
the run start: ``id``, ``class`` ("short" | "medium" | "long"), ``tier``, ``category``,
``prompt_tokens``, ``target_output_tokens``, ``arrival_s`` (when it was sent),
``first_token_s`` (None if no token came), ``finish_s`` (None if it failed),
``output_tokens`` (tokens received), ``error`` (None or a message) and optionally
``admitted_s`` and ``prefill_done_s`` (from the server trace, when the join worked).

Trace records: one mapping per engine step: ``step``, ``t``, ``step_time_s`` (None when not
measured), ``num_decodes``, ``decode_tokens``, ``num_prefills``, ``prefill_tokens``,
``prefill_chunks`` (list of chunk sizes), ``num_running``, ``num_waiting``. The trace is
taken as given: the caller cuts it to the steps of this run.

Definitions
-----------
- A request is *completed* when ``error`` is None and ``finish_s`` is set; every other request
  is *failed*, counted per error message ("unfinished" when no message was recorded) and left
  out of every latency, throughput and fairness number.
- TTFT = first_token_s - arrival_s.
- E2E = finish_s - arrival_s.
- Prefill E2E = prefill_done_s - arrival_s where the trace gave ``prefill_done_s``, else TTFT
  (TTFT is the prefill end plus one step and the streaming delay, so it is an upper bound).
  ``prefill_e2e_source`` says which: "trace" (all completed requests), "ttft" (none),
  "mixed", or "none" (no completed request).
- TPOT = (finish_s - first_token_s) / (output_tokens - 1), only for output_tokens > 1.
- Queue vs execution: queue_s = admitted_s - arrival_s, the time until the engine first
  took the request from its waiting queue, where the trace gave ``admitted_s``; without a
  trace the client cannot see admission and queue_s is TTFT (waiting *and* the whole
  prefill *and* one step: an upper bound). execution_s = E2E - queue_s.
- Where TTFT goes (trace only, else None): queue_s (waiting to be admitted, for the token
  budget or a running slot: the only part a prefill order can shorten), prefill_s =
  prefill_done_s - admitted_s (the request's own chunks and the steps between them), and
  after_prefill_s = first_token_s - prefill_done_s (the last step's sampling, detokenising
  and streaming).
- Latency statistics: count, mean, p50, p80, p90, p95, p99 (numpy linear interpolation) and
  max over completed requests; all None when count is 0.
- Throughput: makespan = last finish_s of a completed request - first arrival_s of any
  request. Output tokens/s, input (prompt) tokens/s and requests/s count completed requests
  only and divide by the makespan; None when no request completed.
- Fairness: Jain's index J = (sum x)^2 / (n * sum x^2) over the *normalised latency*
  x_i = E2E_i / max(output_tokens_i, 1) (seconds per generated token) of the completed
  requests. Normalising by the work a request asked for removes the legitimate difference
  between a 5-token and a 500-token answer, so J = 1 means every request waited the same per
  token of output and J -> 1/n means one request bore all the delay. It is independent of any
  other arm (unlike a slowdown against the best latency seen in the run). Also reported:
  the maximum wait (max TTFT) and the TTFT P99/P50 ratio (how far the tail is from the median).
- Batch efficiency (trace): steps; average batch size (num_decodes + num_prefills per step);
  average scheduled tokens per step (decode_tokens + prefill_tokens); average measured step
  time (steps that have one); steps per completed request; average prefill chunk size (over
  all chunks of all steps); average prefill sequences per step. All None, steps 0, when the
  trace is empty or missing.
"""

from __future__ import annotations

import math

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

Request = Mapping[str, Any]
TraceRecord = Mapping[str, Any]

LATENCY_METRICS = ("ttft_s", "e2e_s", "prefill_e2e_s", "tpot_s", "queue_s", "execution_s",
                   "prefill_s", "after_prefill_s")
PERCENTILES = (50, 80, 90, 95, 99)
STAT_KEYS = ("mean", *(f"p{p}" for p in PERCENTILES), "max")
CLASS_ORDER = ("short", "medium", "long")
UNFINISHED = "unfinished"


def is_completed(request: Request) -> bool:
    """A request counts as served only if it finished without an error."""
    return request.get("error") is None and request.get("finish_s") is not None


def request_latencies(request: Request) -> dict[str, float | None]:
    """Every latency of one request (module definitions); None where an input is missing."""
    arrival = request["arrival_s"]
    first = request.get("first_token_s")
    finish = request.get("finish_s")
    prefill_done = request.get("prefill_done_s")
    admitted = request.get("admitted_s")
    tokens = request.get("output_tokens") or 0
    ttft = _minus(first, arrival)
    e2e = _minus(finish, arrival)
    decode_time = _minus(finish, first)
    queue = _minus(admitted, arrival) if admitted is not None else ttft
    return {
        "ttft_s": ttft,
        "e2e_s": e2e,
        "prefill_e2e_s": _minus(prefill_done, arrival) if prefill_done is not None else ttft,
        "tpot_s": decode_time / (tokens - 1) if decode_time is not None and tokens > 1 else None,
        "queue_s": queue,
        "execution_s": _minus(e2e, queue),
        "prefill_s": _minus(prefill_done, admitted),
        "after_prefill_s": _minus(first, prefill_done),
    }


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else float(a) - float(b)


def latency_stats(values: Sequence[float]) -> dict[str, float | int | None]:
    """count, mean, percentiles and max of one latency; None (not 0) when there is no data."""
    if len(values) == 0:
        return {"count": 0, **dict.fromkeys(STAT_KEYS)}
    data = np.asarray(values, dtype=float)
    percentiles = np.percentile(data, PERCENTILES)
    return {
        "count": int(data.size),
        "mean": float(data.mean()),
        **{f"p{p}": float(v) for p, v in zip(PERCENTILES, percentiles)},
        "max": float(data.max()),
    }


def jain_index(values: Sequence[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all equal, 1/n at the extreme."""
    data = np.asarray(values, dtype=float)
    square_sum = float(np.sum(data * data))
    if data.size == 0 or square_sum == 0.0:
        return None
    return float(np.sum(data) ** 2 / (data.size * square_sum))


def summarize_run(
    requests: Sequence[Request],
    trace: Sequence[TraceRecord] | None = None,
    target_ms: float | None = None,
) -> dict[str, Any]:
    """All metrics of one run as a JSON-serialisable dict.

    Schema (``Stats`` = the dict of :func:`latency_stats`, one per name in LATENCY_METRICS)::

        requests:   {total, completed, failed, errors: {message: count}}
        throughput: {makespan_s, output_tokens, input_tokens,
                     output_tokens_per_s, input_tokens_per_s, requests_per_s}
        latency:    {ttft_s, e2e_s, prefill_e2e_s, tpot_s, queue_s, execution_s: Stats}
        prefill_e2e_source: "trace" | "ttft" | "mixed" | "none"
        by_class:   {class: {requests, completed, latency: {...as above}}}
        by_tier:    {str(tier): {requests, completed, latency: {...}}}
        fairness:   {jain_normalised_latency, normalised_latency_mean_s_per_token,
                     max_ttft_s, ttft_p99_over_p50}
        batch:      {steps, avg_batch_size, avg_tokens_per_step, avg_step_time_s,
                     steps_per_request, avg_prefill_chunk_tokens, avg_prefill_seqs_per_step}
        control:    see :func:`latency_control` (step times against ``target_ms``, or the
                    LPRS target the trace records; absent without either)
        apc:        see :func:`apc_interventions` (absent without APC in the trace)
    """
    completed = [r for r in requests if is_completed(r)]
    latencies = [request_latencies(r) for r in completed]
    latency = _latency_block(latencies)
    return {
        "requests": _request_counts(requests, completed),
        "throughput": _throughput(requests, completed),
        "latency": latency,
        "prefill_e2e_source": _prefill_e2e_source(completed),
        "by_class": _grouped(requests, "class", _class_rank),
        "by_tier": _grouped(requests, "tier", int),
        "fairness": _fairness(completed, latencies, latency["ttft_s"]),
        "batch": batch_efficiency(trace or [], len(completed)),
        **_control_blocks(trace or [], target_ms),
    }


def _control_blocks(trace: Sequence[TraceRecord], target_ms: float | None) -> dict[str, Any]:
    blocks: dict[str, Any] = {}
    if trace and (target_ms is not None or any("lprs_target_ms" in s for s in trace)):
        blocks["control"] = latency_control(trace, target_ms)
    if any("apc" in s for s in trace):
        blocks["apc"] = apc_interventions(trace)
    return blocks


WITHIN = 0.10
"""A step is on target when its measured time is within 10 % of the target (Table 9)."""


def _timed_against(trace: Sequence[TraceRecord], target_ms: float | None,
                   prefill_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Measured step times (ms) and the target each is judged against: ``target_ms`` for
    every step, or else each step's own LPRS target (the automatic one follows the latency
    model); steps without a finite target (not predicted yet) are left out."""
    times, targets = [], []
    for s in trace:
        if s.get("step_time_s") is None or (prefill_only and not s.get("num_prefills")):
            continue
        target = target_ms if target_ms is not None else s.get("lprs_target_ms")
        if target is not None and 0.0 < target < math.inf:
            times.append(s["step_time_s"] * 1000.0)
            targets.append(target)
    return np.array(times), np.array(targets)


def latency_control(trace: Sequence[TraceRecord], target_ms: float | None = None
                    ) -> dict[str, Any]:
    """How closely measured step times follow a latency target (the chunked-prefill paper's Table
    9):
    ``target_ms`` for every step, or each step's own LPRS target (``target_ms`` is then
    their median and ``target_fixed`` false).

    ``within_10pct`` counts every step; ``within_10pct_prefill`` only steps that scheduled
    prefill work, the only steps a chunk rule can shape (a decode-only step takes what its
    decodes take). Deviations are (measured - target) / target. ``prediction_mae_ms``
    compares the trace's predicted batch time (LPRS arms) with the measured one;
    ``guard_steps`` counts steps the guard handed to the token budget because predictions
    disagreed with measured times, ``clamped_steps`` those whose batch had features outside
    the model's training range.
    """
    times, targets = _timed_against(trace, target_ms)
    prefill, prefill_targets = _timed_against(trace, target_ms, prefill_only=True)
    deviation = (times - targets) / targets
    pairs = [(s["lprs_predicted_ms"], s["step_time_s"] * 1000.0) for s in trace
             if s.get("lprs_predicted_ms") is not None and s.get("step_time_s") is not None
             and np.isfinite(s["lprs_predicted_ms"])]
    return {
        "target_ms": (target_ms if target_ms is not None
                      else float(np.median(targets)) if len(targets) else None),
        "target_fixed": target_ms is not None,
        "steps": int(len(times)),
        "within_10pct": _share(np.abs(deviation) <= WITHIN),
        "within_10pct_prefill": _share(
            np.abs((prefill - prefill_targets) / prefill_targets) <= WITHIN),
        "over_10pct": _share(deviation > WITHIN),
        "deviation_p50": float(np.median(deviation)) if len(deviation) else None,
        "abs_deviation_mean_ms": (float(np.mean(np.abs(times - targets))) if len(times)
                                  else None),
        "prediction_mae_ms": (float(np.mean([abs(p - m) for p, m in pairs])) if pairs else None),
        "fallback_steps": sum(1 for s in trace if s.get("lprs_fallback")),
        "guard_steps": sum(1 for s in trace if s.get("lprs_guard")),
        "clamped_steps": sum(1 for s in trace if s.get("lprs_clamped")),
    }


def step_deviations(trace: Sequence[TraceRecord], target_ms: float | None = None) -> np.ndarray:
    """(measured - target) / target of every judged step (:func:`latency_control`'s
    targets), for the deviation histogram."""
    times, targets = _timed_against(trace, target_ms)
    return (times - targets) / targets


def apc_interventions(trace: Sequence[TraceRecord]) -> dict[str, Any]:
    """APC's outcomes summed over the run; interventions = everything but accepting the
    proposed chunk (holding back, warm-starting or forcing a prefill)."""
    totals: dict[str, int] = {}
    for step in trace:
        for outcome, count in (step.get("apc") or {}).items():
            totals[outcome] = totals.get(outcome, 0) + count
    totals["interventions"] = sum(v for k, v in totals.items() if k != "accepted")
    return totals


def _share(flags: np.ndarray) -> float | None:
    return float(np.mean(flags)) if len(flags) else None


def _latency_block(latencies: Sequence[Mapping[str, float | None]]) -> dict[str, dict]:
    return {
        metric: latency_stats([row[metric] for row in latencies if row[metric] is not None])
        for metric in LATENCY_METRICS
    }


def _request_counts(requests: Sequence[Request], completed: Sequence[Request]) -> dict:
    errors: dict[str, int] = {}
    for request in requests:
        if not is_completed(request):
            message = request.get("error") or UNFINISHED
            errors[message] = errors.get(message, 0) + 1
    return {
        "total": len(requests),
        "completed": len(completed),
        "failed": len(requests) - len(completed),
        "errors": dict(sorted(errors.items(), key=lambda item: (-item[1], item[0]))),
    }


def _throughput(requests: Sequence[Request], completed: Sequence[Request]) -> dict:
    output_tokens = sum(int(r["output_tokens"]) for r in completed)
    input_tokens = sum(int(r["prompt_tokens"]) for r in completed)
    makespan = None
    if completed:
        makespan = max(float(r["finish_s"]) for r in completed) - min(
            float(r["arrival_s"]) for r in requests
        )

    def rate(amount: int) -> float | None:
        return amount / makespan if makespan else None

    return {
        "makespan_s": makespan,
        "output_tokens": output_tokens,
        "input_tokens": input_tokens,
        "output_tokens_per_s": rate(output_tokens),
        "input_tokens_per_s": rate(input_tokens),
        "requests_per_s": rate(len(completed)),
    }


def _prefill_e2e_source(completed: Sequence[Request]) -> str:
    joined = sum(r.get("prefill_done_s") is not None for r in completed)
    if not completed:
        return "none"
    if joined == len(completed):
        return "trace"
    return "ttft" if joined == 0 else "mixed"


def _class_rank(name: Any) -> tuple:
    return (CLASS_ORDER.index(name), name) if name in CLASS_ORDER else (len(CLASS_ORDER), name)


def _grouped(requests: Sequence[Request], key: str, rank: Callable[[Any], Any]) -> dict:
    """Counts and latency stats per value of ``key``; JSON keys are strings, ordered by rank."""
    groups: dict[Any, list[Request]] = {}
    for request in requests:
        groups.setdefault(request[key], []).append(request)
    summary = {}
    for value in sorted(groups, key=rank):
        completed = [r for r in groups[value] if is_completed(r)]
        summary[str(value)] = {
            "requests": len(groups[value]),
            "completed": len(completed),
            "latency": _latency_block([request_latencies(r) for r in completed]),
        }
    return summary


def _fairness(
    completed: Sequence[Request],
    latencies: Sequence[Mapping[str, float | None]],
    ttft: Mapping[str, float | int | None],
) -> dict:
    normalised = [
        row["e2e_s"] / max(int(r["output_tokens"]), 1) for r, row in zip(completed, latencies)
    ]
    p50, p99 = ttft["p50"], ttft["p99"]
    return {
        "jain_normalised_latency": jain_index(normalised),
        "normalised_latency_mean_s_per_token": float(np.mean(normalised)) if normalised else None,
        "max_ttft_s": ttft["max"],
        "ttft_p99_over_p50": p99 / p50 if p50 else None,
    }


def batch_efficiency(trace: Sequence[TraceRecord], completed: int) -> dict:
    """How full and how fast the engine's steps were, from the scheduler trace."""
    if not trace:
        return {
            "steps": 0,
            "avg_batch_size": None,
            "avg_tokens_per_step": None,
            "avg_step_time_s": None,
            "steps_per_request": None,
            "avg_prefill_chunk_tokens": None,
            "avg_prefill_seqs_per_step": None,
        }
    step_times = [s["step_time_s"] for s in trace if s.get("step_time_s") is not None]
    chunks = [chunk for s in trace for chunk in s.get("prefill_chunks") or ()]
    return {
        "steps": len(trace),
        "avg_batch_size": _mean([s["num_decodes"] + s["num_prefills"] for s in trace]),
        "avg_tokens_per_step": _mean([s["decode_tokens"] + s["prefill_tokens"] for s in trace]),
        "avg_step_time_s": _mean(step_times),
        "steps_per_request": len(trace) / completed if completed else None,
        "avg_prefill_chunk_tokens": _mean(chunks),
        "avg_prefill_seqs_per_step": _mean([s["num_prefills"] for s in trace]),
    }


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def aggregate_repeats(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mirror of the summaries' structure with each numeric leaf replaced by its spread.

    Each leaf becomes ``{"n", "mean", "min", "max", "spread"}`` over the repeats that have a
    number there (None leaves are skipped), with spread = (max - min) / |mean| (None when the
    mean is 0). Strings are dropped. Repeat-to-repeat noise of a whole server run is large, so
    every comparison should carry its spread.
    """
    return _aggregate_node(list(summaries)) or {}


def _aggregate_node(nodes: list[Any]) -> dict[str, Any] | None:
    mappings = [node for node in nodes if isinstance(node, Mapping)]
    if mappings:
        keys = dict.fromkeys(key for mapping in mappings for key in mapping)
        children = {key: _aggregate_node([m[key] for m in mappings if key in m]) for key in keys}
        return {key: child for key, child in children.items() if child is not None} or None
    numbers = [float(n) for n in nodes if isinstance(n, (int, float)) and not isinstance(n, bool)]
    return _spread(numbers) if numbers else None


def _spread(values: Sequence[float]) -> dict[str, float | int | None]:
    mean = float(np.mean(values))
    low, high = min(values), max(values)
    return {
        "n": len(values),
        "mean": mean,
        "min": low,
        "max": high,
        "spread": (high - low) / abs(mean) if mean else None,
    }
