"""Side-by-side report of scheduling-policy arms: markdown tables, PNG plots and one JSON file.

A run of a single server is noisy (docs/benchmark.md), so every arm is a list of repeats and every
number in the tables is the mean over repeats with half the repeat range beside it. The table
layouts follow the papers so results can be read against them: the chunked-prefill paper's Tables 4,
9 and 10 (mean/P95 per policy, latency quantiles, scheduling dynamics) and the ordering-policies
paper's Tables 2 and 3 (throughput and P95 latency per policy and workload category), Figures 2 and
4 (latency-throughput frontier, tails normalised to the baseline) and Figure 5 (batch efficiency).

Plots are drawn on plain ``Figure`` objects with the Agg canvas: no display, no pyplot state.
Without matplotlib (the ``bench`` extra) the report is written without them.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fairsched_plugin.experiment.metrics import (
    CLASS_ORDER,
    aggregate_repeats,
    is_completed,
    request_latencies,
    step_deviations,
    summarize_run,
)
from fairsched_plugin.extras import available, note_no_plots

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

Runs = Mapping[str, Sequence[Mapping[str, Any]]]
Stat = Mapping[str, Any]
"""One aggregated leaf: ``{"n", "mean", "min", "max", "spread"}`` (see aggregate_repeats)."""

PNG_DPI = 100
DEFAULT_CATEGORY = "default"
MISSING = "-"


# ---------------------------------------------------------------- analysis


def analyse_runs(runs: Runs, target_ms: float | None = None) -> dict[str, dict[str, Any]]:
    """Per arm: every repeat's summary, their aggregate, and an aggregate per workload
    category. With ``target_ms`` every arm's step times are scored against that latency
    target (else only LPRS arms, against the target their trace records)."""
    analysis = {}
    for arm, repeats in runs.items():
        if not repeats:
            raise ValueError(f"arm {arm!r} has no repeats")
        entries = [
            {
                "category": _category(repeat),
                "meta": repeat.get("meta") or {},
                "summary": summarize_run(repeat["requests"], repeat.get("trace"), target_ms),
                **({"vllm_bench": repeat["vllm_bench"]} if "vllm_bench" in repeat else {}),
            }
            for repeat in repeats
        ]
        categories = dict.fromkeys(entry["category"] for entry in entries)
        analysis[arm] = {
            "repeats": entries,
            "aggregate": aggregate_repeats([entry["summary"] for entry in entries]),
            "by_category": {
                category: aggregate_repeats(
                    [e["summary"] for e in entries if e["category"] == category]
                )
                for category in categories
            },
        }
    return analysis


def _category(repeat: Mapping[str, Any]) -> str:
    """The repeat's workload name; else the category its requests carry."""
    if repeat.get("category"):
        return str(repeat["category"])
    names = sorted({str(r["category"]) for r in repeat["requests"] if r.get("category")})
    return "+".join(names) or DEFAULT_CATEGORY


def _stat(node: Any, *path: str) -> Stat | None:
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def _mean(node: Any, *path: str) -> float | None:
    stat = _stat(node, *path)
    return None if stat is None else stat["mean"]


def _ratio(value: float | None, reference: float | None) -> float | None:
    return value / reference if value is not None and reference else None


# ---------------------------------------------------------------- formatting


def _time_unit(seconds: Iterable[float | None]) -> tuple[str, float]:
    """Seconds once any value reaches 10 s, else milliseconds: keeps the numbers short."""
    largest = max((v for v in seconds if v is not None), default=0.0)
    return ("s", 1.0) if largest >= 10.0 else ("ms", 1000.0)


def _decimals(value: float) -> int:
    magnitude = abs(value)
    return 0 if magnitude >= 100 else 1 if magnitude >= 10 else 2 if magnitude >= 1 else 3


def _number(value: float) -> str:
    return f"{value:.{_decimals(value)}f}"


def _cell(stat: Stat | None, scale: float = 1.0) -> str:
    """``mean ± (max-min)/2`` over repeats; just the mean for a single repeat."""
    if stat is None:
        return MISSING
    mean = stat["mean"] * scale
    if stat["n"] < 2:
        return _number(mean)
    digits = _decimals(mean)
    half_range = (stat["max"] - stat["min"]) * scale / 2
    return f"{mean:.{digits}f} ± {half_range:.{digits}f}"


def _count(stat: Stat | None) -> str:
    return MISSING if stat is None else f"{round(stat['mean'], 1):g}"


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- markdown

MAIN_LATENCY = (
    ("TTFT P50", ("latency", "ttft_s", "p50")),
    ("TTFT mean", ("latency", "ttft_s", "mean")),
    ("TTFT P95", ("latency", "ttft_s", "p95")),
    ("TTFT P99", ("latency", "ttft_s", "p99")),
    ("E2E P50", ("latency", "e2e_s", "p50")),
    ("E2E mean", ("latency", "e2e_s", "mean")),
    ("E2E P95", ("latency", "e2e_s", "p95")),
    ("E2E P99", ("latency", "e2e_s", "p99")),
)
SEED000_TABLE4 = (
    ("Mean E2E", ("latency", "e2e_s", "mean")),
    ("P95 E2E", ("latency", "e2e_s", "p95")),
    ("Mean TTFT", ("latency", "ttft_s", "mean")),
    ("P95 TTFT", ("latency", "ttft_s", "p95")),
)
QUANTILES = (("Mean", "mean"), ("P50", "p50"), ("P80", "p80"), ("P90", "p90"),
             ("P95", "p95"), ("P99", "p99"), ("Max", "max"))
CLASS_COLUMNS = (
    ("Mean TTFT", ("ttft_s", "mean")),
    ("P95 TTFT", ("ttft_s", "p95")),
    ("Mean E2E", ("e2e_s", "mean")),
    ("P95 E2E", ("e2e_s", "p95")),
)
EFFICIENCY_ROWS = (
    # (label, path, scale, is a count)
    ("Completed requests per repeat", ("requests", "completed"), 1.0, True),
    ("Failed requests per repeat", ("requests", "failed"), 1.0, True),
    ("Jain index, normalised latency", ("fairness", "jain_normalised_latency"), 1.0, False),
    ("Normalised latency (ms/token)",
     ("fairness", "normalised_latency_mean_s_per_token"), 1000.0, False),
    ("Max TTFT (s)", ("fairness", "max_ttft_s"), 1.0, False),
    ("TTFT P99 / P50", ("fairness", "ttft_p99_over_p50"), 1.0, False),
    ("Engine steps", ("batch", "steps"), 1.0, True),
    ("Avg batch size (seqs)", ("batch", "avg_batch_size"), 1.0, False),
    ("Avg scheduled tokens / step", ("batch", "avg_tokens_per_step"), 1.0, False),
    ("Avg step time (ms)", ("batch", "avg_step_time_s"), 1000.0, False),
    ("Steps per request", ("batch", "steps_per_request"), 1.0, False),
    ("Avg prefill chunk (tokens)", ("batch", "avg_prefill_chunk_tokens"), 1.0, False),
    ("Avg prefill seqs / step", ("batch", "avg_prefill_seqs_per_step"), 1.0, False),
)
RATIO_COLUMNS = (
    ("Median TTFT", ("latency", "ttft_s", "p50")),
    ("Mean TTFT", ("latency", "ttft_s", "mean")),
    ("P99 TTFT", ("latency", "ttft_s", "p99")),
    ("Mean E2E", ("latency", "e2e_s", "mean")),
    ("P99 E2E", ("latency", "e2e_s", "p99")),
    ("Output tok/s", ("throughput", "output_tokens_per_s")),
)


def render_markdown(
    analysis: Mapping[str, Mapping[str, Any]],
    *,
    baseline: str | None = None,
    config: Mapping[str, Any] | None = None,
    figures: Sequence[tuple[str, str]] = (),
    main_only: bool = False,
) -> str:
    """The report as markdown; ``main_only`` gives just the main table (for a terminal).

    ``analysis`` is what :func:`analyse_runs` returns; ``figures`` are (file name, caption).
    """
    baseline = _checked_baseline(analysis, baseline)
    if main_only:
        return _main_section(analysis)
    sections = [
        _header(analysis, baseline, config),
        _main_section(analysis),
        _seed000_table4_section(analysis),
        _quantile_section(analysis),
        _class_section(analysis),
        _efficiency_section(analysis),
        _ratio_section(analysis, baseline),
        _paired_ratio_section(analysis, baseline),
        _ttft_parts_section(analysis),
    ]
    if len(_categories(analysis)) > 1:
        sections.append(_category_section(analysis))
    if any("control" in a["aggregate"] or "apc" in a["aggregate"] for a in analysis.values()):
        sections.append(_control_section(analysis))
    if figures:
        sections.append(
            "## Figures\n\n" + "\n\n".join(f"![{caption}]({name})" for name, caption in figures)
        )
    return "\n\n".join(sections) + "\n"


def _checked_baseline(analysis: Mapping[str, Any], baseline: str | None) -> str:
    if not analysis:
        raise ValueError("no arms to report")
    baseline = next(iter(analysis)) if baseline is None else baseline
    if baseline not in analysis:
        raise ValueError(f"baseline arm {baseline!r} is not one of {list(analysis)}")
    return baseline


def _categories(analysis: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return list(dict.fromkeys(c for arm in analysis.values() for c in arm["by_category"]))


def _header(analysis: Mapping[str, Any], baseline: str, config: Mapping[str, Any] | None) -> str:
    repeats = ", ".join(f"{arm}: {len(a['repeats'])}" for arm, a in analysis.items())
    lines = [
        "# Scheduling policy comparison",
        "",
        f"- Arms (runs: repeats x workload categories): {repeats}",
        f"- Baseline arm: {baseline}",
        f"- Workload categories: {', '.join(_categories(analysis))}",
    ]
    lines += [
        f"- {key}: `{json.dumps(value, default=str)}`" for key, value in (config or {}).items()
    ]
    lines += [
        "",
        "Each value is the mean over repeats ± half the range between the best and worst repeat. "
        "Latencies are over completed requests; failed requests are counted in section 4. "
        "TTFT = first token - send time, E2E = last token - send time (client clock); "
        "throughput counts completed requests over first send to last finish. "
        "Definitions: `fairsched_plugin.experiment.metrics`.",
    ]
    return "\n".join(lines)


def _latency_table(
    analysis: Mapping[str, Mapping[str, Any]],
    columns: Sequence[tuple[str, tuple[str, ...]]],
    extra: Sequence[tuple[str, tuple[str, ...]]] = (),
) -> str:
    """Rows = arms; latency columns in one auto-chosen unit, then ``extra`` columns as-is."""
    aggregates = {arm: a["aggregate"] for arm, a in analysis.items()}
    unit, scale = _time_unit(
        _mean(agg, *path) for agg in aggregates.values() for _, path in columns
    )
    headers = ["Arm", *(f"{label} ({unit})" for label, _ in columns), *(l for l, _ in extra)]
    rows = [
        [arm]
        + [_cell(_stat(agg, *path), scale) for _, path in columns]
        + [_cell(_stat(agg, *path)) for _, path in extra]
        for arm, agg in aggregates.items()
    ]
    return _table(headers, rows)


def _main_section(analysis: Mapping[str, Mapping[str, Any]]) -> str:
    extra = (
        ("Output tok/s", ("throughput", "output_tokens_per_s")),
        ("Req/s", ("throughput", "requests_per_s")),
    )
    return "## 1. Main comparison\n\n" + _latency_table(analysis, MAIN_LATENCY, extra)


def _seed000_table4_section(analysis: Mapping[str, Mapping[str, Any]]) -> str:
    return (
        "## 2. Mean and P95 latency per arm (the chunked-prefill paper's Table 4 layout)\n\n"
        + _latency_table(analysis, SEED000_TABLE4)
    )


def _quantile_section(analysis: Mapping[str, Mapping[str, Any]]) -> str:
    aggregates = {arm: a["aggregate"] for arm, a in analysis.items()}
    metrics = (("Prefill E2E", "prefill_e2e_s"), ("Request E2E", "e2e_s"))
    unit, scale = _time_unit(
        _mean(agg, "latency", metric, key)
        for agg in aggregates.values() for _, metric in metrics for _, key in QUANTILES
    )
    headers = ["Quantile"] + [
        f"{name} {arm} ({unit})" for name, _ in metrics for arm in aggregates
    ]
    rows = [
        [label] + [
            _cell(_stat(agg, "latency", metric, key), scale)
            for _, metric in metrics for agg in aggregates.values()
        ]
        for label, key in QUANTILES
    ]
    sources = "; ".join(
        f"{arm}: {'/'.join(sorted({e['summary']['prefill_e2e_source'] for e in a['repeats']}))}"
        for arm, a in analysis.items()
    )
    return (
        "## 3. Latency quantiles (the chunked-prefill paper's Table 9 layout)\n\n"
        + _table(headers, rows)
        + f"\n\nPrefill E2E source (trace = engine prefill end, ttft = TTFT stand-in): {sources}."
    )


def _class_section(analysis: Mapping[str, Mapping[str, Any]]) -> str:
    aggregates = {arm: a["aggregate"] for arm, a in analysis.items()}
    classes = sorted(
        {c for agg in aggregates.values() for c in agg.get("by_class", {})},
        key=lambda c: (CLASS_ORDER.index(c) if c in CLASS_ORDER else len(CLASS_ORDER), c),
    )
    unit, scale = _time_unit(
        _mean(agg, "by_class", c, "latency", *path)
        for agg in aggregates.values() for c in classes for _, path in CLASS_COLUMNS
    )
    headers = ["Class", "Arm", "Completed", *(f"{label} ({unit})" for label, _ in CLASS_COLUMNS)]
    rows = [
        [c, arm, _count(_stat(agg, "by_class", c, "completed"))]
        + [_cell(_stat(agg, "by_class", c, "latency", *path), scale) for _, path in CLASS_COLUMNS]
        for c in classes
        for arm, agg in aggregates.items()
    ]
    return "## 4. Per request class\n\n" + _table(headers, rows)


def _metric_table(analysis: Mapping[str, Mapping[str, Any]], spec: Sequence[tuple]) -> str:
    """One row per ``(label, path, scale, is a count)`` of ``spec``, one column per arm."""
    aggregates = {arm: a["aggregate"] for arm, a in analysis.items()}
    rows = [
        [label] + [
            _count(_stat(agg, *path)) if is_count else _cell(_stat(agg, *path), scale)
            for agg in aggregates.values()
        ]
        for label, path, scale, is_count in spec
    ]
    return _table(["Metric", *aggregates], rows)


def _efficiency_section(analysis: Mapping[str, Mapping[str, Any]]) -> str:
    text = (
        "## 5. Fairness and batch efficiency (the chunked-prefill paper's Table 10 layout)\n\n"
        + _metric_table(analysis, EFFICIENCY_ROWS)
        + "\n\nJain index over E2E / output tokens per completed request: 1 = every request "
        "waited the same per generated token. Batch rows come from the scheduler trace "
        f"({MISSING} where there was none)."
    )
    errors = _error_lines(analysis)
    return text + ("\n\nFailed requests, summed over repeats:\n\n" + errors if errors else "")


def _error_lines(analysis: Mapping[str, Mapping[str, Any]]) -> str:
    lines = []
    for arm, a in analysis.items():
        totals: dict[str, int] = {}
        for entry in a["repeats"]:
            for message, count in entry["summary"]["requests"]["errors"].items():
                totals[message] = totals.get(message, 0) + count
        lines += [f"- {arm}: {count} x `{message}`" for message, count in totals.items()]
    return "\n".join(lines)


def _ratio_section(analysis: Mapping[str, Mapping[str, Any]], baseline: str) -> str:
    reference = analysis[baseline]["aggregate"]
    rows = []
    for arm, a in analysis.items():
        ratios = [
            _ratio(_mean(a["aggregate"], *path), _mean(reference, *path))
            for _, path in RATIO_COLUMNS
        ]
        rows.append([arm] + [MISSING if r is None else f"{r:.2f}x" for r in ratios])
    return (
        f"## 6. Ratios to the baseline arm ({baseline})\n\n"
        + _table(["Arm", *(label for label, _ in RATIO_COLUMNS)], rows)
        + "\n\nRatio of repeat means. Below 1 is better for latency, above 1 for throughput."
    )


PAIRED_COLUMNS = (
    # (label, path in a repeat's summary, key in its vllm_bench figures, scale for display)
    ("Median TTFT", ("latency", "ttft_s", "p50"), "ttft_p50_ms"),
    ("Mean TTFT", ("latency", "ttft_s", "mean"), "ttft_mean_ms"),
    ("P99 TTFT", ("latency", "ttft_s", "p99"), "ttft_p99_ms"),
    ("Mean E2E", ("latency", "e2e_s", "mean"), "e2e_mean_ms"),
    ("Output tok/s", ("throughput", "output_tokens_per_s"), "output_tokens_per_s"),
    ("Mean TPOT", ("latency", "tpot_s", "mean"), "tpot_mean_ms"),
    ("P99 TPOT", ("latency", "tpot_s", "p99"), "tpot_p99_ms"),
)


def paired_ratios(
    analysis: Mapping[str, Mapping[str, Any]], baseline: str, client: str
) -> dict[str, dict[str, list[list[float | None]]]]:
    """Per case (category), per arm: for each of :data:`PAIRED_COLUMNS`, the ratio to the
    baseline of each repeat, repeat r against the baseline's repeat r (the runs next to
    each other in the interleaved order). ``client`` is ``replay`` (the project's client)
    or ``vllm_bench``; a case that client did not run is left out."""

    def figures(entry: Mapping[str, Any]) -> list[float | None] | None:
        if client == "replay":
            return [_stat(entry["summary"], *path) for _l, path, _k in PAIRED_COLUMNS]
        bench = entry.get("vllm_bench")
        # .get: reports written before a column existed lack its key.
        return None if bench is None else [bench.get(key) for _l, _p, key in PAIRED_COLUMNS]

    out: dict[str, dict[str, list[list[float | None]]]] = {}
    for category in _categories(analysis):
        reference = [figures(e) for e in analysis[baseline]["repeats"]
                     if e["category"] == category]
        for arm, a in analysis.items():
            own = [figures(e) for e in a["repeats"] if e["category"] == category]
            pairs = [(x, y) for x, y in zip(own, reference) if x is not None and y is not None]
            if pairs:
                out.setdefault(category, {})[arm] = [
                    [_ratio(mine, ref) for mine, ref in zip(x, y)] for x, y in pairs
                ]
    return out


def _median_and_range(values: Sequence[float | None]) -> str:
    """The typical repeat's ratio with the range of all repeats: ``0.52x [0.47-0.60]``."""
    known = sorted(v for v in values if v is not None)
    if not known:
        return MISSING
    median = float(np.median(known))
    if len(known) == 1:
        return f"{median:.2f}x"
    return f"{median:.2f}x [{known[0]:.2f}-{known[-1]:.2f}]"


def _paired_ratio_section(analysis: Mapping[str, Mapping[str, Any]], baseline: str) -> str:
    parts = [
        f"## 6b. Ratios to {baseline} per case and client, repeat by repeat",
        "Each repeat of an arm against the baseline's repeat run next to it; the cell is the "
        "median over repeats with the range in brackets. Below 1 is better for latency, "
        "above 1 for throughput.",
    ]
    headers = ["Arm", *(label for label, _p, _k in PAIRED_COLUMNS)]
    for client, title in (("replay", "fairsched replay client"),
                          ("vllm_bench", "vllm bench serve (Poisson at the case's mean rate)")):
        for category, arms in paired_ratios(analysis, baseline, client).items():
            rows = [
                [arm, *(_median_and_range([r[i] for r in repeats])
                        for i in range(len(PAIRED_COLUMNS)))]
                for arm, repeats in arms.items()
            ]
            parts.append(f"**{category}**, {title}:\n\n" + _table(headers, rows))
    return "\n\n".join(parts)


TTFT_PARTS = (
    ("TTFT", "ttft_s"),
    ("queue (admission)", "queue_s"),
    ("own prefill", "prefill_s"),
    ("after prefill", "after_prefill_s"),
)


def _ttft_parts_section(analysis: Mapping[str, Mapping[str, Any]]) -> str:
    """Mean TTFT split by the scheduler's trace into the wait for admission (what a prefill
    order can shorten), the request's own prefill, and what follows it; arms without a
    trace (stock vLLM) have no split."""
    rows = []
    for category in _categories(analysis):
        for arm, a in analysis.items():
            agg = a["by_category"].get(category)
            if _mean(agg, "latency", "prefill_s", "mean") is None:
                continue
            cells = [_cell(_stat(agg, "latency", key, "mean"), 1000.0) for _l, key in TTFT_PARTS]
            share = _ratio(_mean(agg, "latency", "queue_s", "mean"),
                           _mean(agg, "latency", "ttft_s", "mean"))
            rows.append([category, arm, *cells, MISSING if share is None else f"{share:.0%}"])
    if not rows:
        return "## 6c. Where TTFT goes\n\nNo arm has a scheduler trace to split TTFT with."
    headers = ["Case", "Arm", *(f"{label} mean (ms)" for label, _k in TTFT_PARTS),
               "queue share"]
    return (
        "## 6c. Where TTFT goes\n\n"
        "From the scheduler's trace: the wait to be admitted (for the token budget or a "
        "running slot), the request's own prefill chunks, and the step that samples its "
        "first token plus streaming. Only the first part depends on the prefill order.\n\n"
        + _table(headers, rows)
    )


def _category_section(analysis: Mapping[str, Mapping[str, Any]]) -> str:
    categories = _categories(analysis)
    throughput = ("throughput", "output_tokens_per_s")
    p95 = ("latency", "e2e_s", "p95")
    unit, scale = _time_unit(
        _mean(a["by_category"].get(c), *p95) for a in analysis.values() for c in categories
    )
    return "\n\n".join([
        "## 7. Per workload category (the ordering-policies paper's Tables 2 and 3 layout)",
        "Output throughput (tokens/s), higher is better:",
        _category_table(analysis, categories, throughput, 1.0),
        f"P95 E2E latency ({unit}), lower is better:",
        _category_table(analysis, categories, p95, scale),
    ])


CONTROL_ROWS = (
    # (label, path, scale, is a count)
    ("Latency target (ms)", ("control", "target_ms"), 1.0, False),
    ("Steps within 10 % of target (share)", ("control", "within_10pct"), 1.0, False),
    ("Prefill steps within 10 % of target (share)", ("control", "within_10pct_prefill"), 1.0,
     False),
    ("Steps over target by > 10 % (share)", ("control", "over_10pct"), 1.0, False),
    ("Median deviation from target", ("control", "deviation_p50"), 1.0, False),
    ("Mean |step time - target| (ms)", ("control", "abs_deviation_mean_ms"), 1.0, False),
    ("Predicted vs measured step MAE (ms)", ("control", "prediction_mae_ms"), 1.0, False),
    ("LPRS fallback steps", ("control", "fallback_steps"), 1.0, True),
    ("LPRS steps handed to the token budget by the guard", ("control", "guard_steps"), 1.0,
     True),
    ("LPRS steps with features outside the model's training range",
     ("control", "clamped_steps"), 1.0, True),
    ("APC: held back, activity cap", ("apc", "blocked_by_cap"), 1.0, True),
    ("APC: held back, minimum chunk", ("apc", "blocked_by_min_chunk"), 1.0, True),
    ("APC: warm starts", ("apc", "warm_start"), 1.0, True),
    ("APC: forced by the deferral bound", ("apc", "forced"), 1.0, True),
    ("APC: interventions (all but accepted)", ("apc", "interventions"), 1.0, True),
)


def _control_section(analysis: Mapping[str, Mapping[str, Any]]) -> str:
    return (
        "## 8. Latency control and active prefill control "
        "(the chunked-prefill paper's Tables 9 and 10)\n\n"
        + _metric_table(analysis, CONTROL_ROWS)
        + "\n\nStep time = the scheduler's measured batch time. A decode-only step cannot be "
        "shaped by chunk choice, so the share is also given over steps that scheduled prefill "
        f"work. APC counts are per run. {MISSING}: not applicable to the arm."
    )


def _category_table(
    analysis: Mapping[str, Mapping[str, Any]],
    categories: Sequence[str],
    path: tuple[str, ...],
    scale: float,
) -> str:
    """Rows = categories, columns = arms, last row the mean over categories (the ordering-policies
    paper style)."""
    rows = [
        [category]
        + [_cell(_stat(a["by_category"].get(category), *path), scale) for a in analysis.values()]
        for category in categories
    ]
    overall = []
    for a in analysis.values():
        means = [m for c in categories if (m := _mean(a["by_category"].get(c), *path)) is not None]
        overall.append(_number(float(np.mean(means)) * scale) if means else MISSING)
    rows.append(["Mean over categories", *overall])
    return _table(["Category", *analysis], rows)


# ---------------------------------------------------------------- plots


def _figure(
    columns: int = 1, width: float = 8.0, height: float = 5.0, rows: int = 1
) -> tuple[Figure, list[Axes]]:
    """A figure and its axes, row by row."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=PNG_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure, list(figure.subplots(rows, columns, squeeze=False).flat)


def _colors(arms: Iterable[str]) -> dict[str, str]:
    return {arm: f"C{i % 10}" for i, arm in enumerate(arms)}


def _error_bar(
    stats: Sequence[Stat | None], scale: float
) -> tuple[list[float], list[list[float]]]:
    """Bar heights (means) and asymmetric error bars reaching the min and max repeat.

    Clamped at 0: the mean of equal floats can land a rounding error outside [min, max].
    """
    means = [np.nan if s is None else s["mean"] * scale for s in stats]
    below = [0.0 if s is None else max(s["mean"] - s["min"], 0.0) * scale for s in stats]
    above = [0.0 if s is None else max(s["max"] - s["mean"], 0.0) * scale for s in stats]
    return means, [below, above]


def _grouped_bars(
    ax: Axes, groups: Sequence[str], stats: Mapping[str, Sequence[Stat | None]],
    colors: Mapping[str, str], scale: float = 1.0,
) -> None:
    """One cluster per group, one coloured bar per arm in each cluster."""
    width = 0.8 / len(stats)
    x = np.arange(len(groups))
    for i, (arm, arm_stats) in enumerate(stats.items()):
        means, errors = _error_bar(arm_stats, scale)
        offset = (i - (len(stats) - 1) / 2) * width
        ax.bar(x + offset, means, width, yerr=errors, capsize=3, color=colors[arm], label=arm)
    ax.set_xticks(x, groups)
    ax.grid(axis="y", alpha=0.3)


def _relative(stat: Stat | None, reference: float | None) -> Stat | None:
    if stat is None or not reference:
        return None
    return {key: stat[key] / reference for key in ("mean", "min", "max")}


def _e2e_samples(repeats: Sequence[Mapping[str, Any]]) -> np.ndarray:
    return np.array([
        request_latencies(r)["e2e_s"]
        for repeat in repeats for r in repeat["requests"] if is_completed(r)
    ])


def _plot_e2e_cdf(path: Path, runs: Runs, colors: Mapping[str, str]) -> None:
    figure, (ax,) = _figure()
    for arm, repeats in runs.items():
        samples = np.sort(_e2e_samples(repeats))
        if samples.size:
            # Start at (first sample, 0) so each curve rises from the axis.
            x = np.concatenate([samples[:1], samples])
            fraction = np.arange(samples.size + 1) / samples.size
            ax.step(x, fraction, where="post", color=colors[arm], label=arm)
    ax.set_xlabel("E2E latency (s)")
    ax.set_ylabel("Fraction of completed requests")
    ax.set_title("E2E latency CDF (all repeats pooled; left is better)")
    ax.grid(alpha=0.3)
    ax.legend()
    figure.savefig(path)


def _plot_latency_bars(path: Path, analysis: Mapping[str, Any], colors: Mapping[str, str]) -> None:
    figure, axes = _figure(columns=2, width=10.0)
    aggregates = {arm: a["aggregate"] for arm, a in analysis.items()}
    for ax, (name, metric) in zip(axes, (("TTFT", "ttft_s"), ("E2E", "e2e_s"))):
        stats = {arm: [_stat(agg, "latency", metric, k) for k in ("mean", "p95")]
                 for arm, agg in aggregates.items()}
        unit, scale = _time_unit(s["mean"] for row in stats.values() for s in row if s)
        _grouped_bars(ax, ["Mean", "P95"], stats, colors, scale)
        ax.set_ylabel(f"{name} ({unit})")
        ax.set_title(name)
    axes[0].legend()
    figure.suptitle("Mean and P95 latency per arm (error bars: min to max over repeats)")
    figure.savefig(path)


def _plot_tail_ratios(
    path: Path, analysis: Mapping[str, Any], baseline: str, colors: Mapping[str, str]
) -> None:
    figure, axes = _figure(columns=2, width=10.0)
    reference = analysis[baseline]["aggregate"]
    for ax, (name, metric) in zip(axes, (("TTFT", "ttft_s"), ("E2E", "e2e_s"))):
        stats = {
            arm: [_relative(_stat(a["aggregate"], "latency", metric, k),
                          _mean(reference, "latency", metric, k)) for k in ("p95", "p99")]
            for arm, a in analysis.items()
        }
        _grouped_bars(ax, ["P95", "P99"], stats, colors)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_ylabel(f"{name} relative to {baseline}")
        ax.set_title(f"{name} tail")
    axes[0].legend()
    figure.suptitle(f"P95 and P99 latency normalised to {baseline} (below 1.0 is better)")
    figure.savefig(path)


def _plot_category_tail_ratios(
    path: Path, analysis: Mapping[str, Any], baseline: str, colors: Mapping[str, str]
) -> None:
    """The ordering-policies paper's Figure 4: P95 and P99 E2E latency of each arm over the
    baseline's, per workload category and as the geometric mean over categories."""
    categories = _categories(analysis)
    groups = [*categories, "geo-mean"]
    figure, axes = _figure(width=max(10.0, 0.3 * len(groups) * len(analysis)), height=7.0,
                           rows=2)
    reference = analysis[baseline]["by_category"]
    for ax, quantile in zip(axes, ("p95", "p99")):
        stats: dict[str, list[Stat | None]] = {}
        for arm, a in analysis.items():
            ratios = [
                _relative(_stat(a["by_category"].get(c), "latency", "e2e_s", quantile),
                          _mean(reference.get(c), "latency", "e2e_s", quantile))
                for c in categories
            ]
            means = [r["mean"] for r in ratios if r is not None and r["mean"] > 0]
            geo = float(np.exp(np.mean(np.log(means)))) if means else None
            summary = None if geo is None else {"n": len(means), "mean": geo, "min": geo,
                                                 "max": geo, "spread": 0.0}
            stats[arm] = [*ratios, summary]
        _grouped_bars(ax, groups, stats, colors)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_ylabel(f"{quantile.upper()} E2E / {baseline}")
        ax.tick_params(axis="x", labelrotation=15)
    axes[0].legend(ncol=min(len(analysis), 5), fontsize="small")
    figure.suptitle(f"P95 and P99 E2E latency normalised to {baseline}, per workload category "
                    "(below 1.0 is better)")
    figure.savefig(path)


def _plot_deviation_histogram(
    path: Path, runs: Runs, analysis: Mapping[str, Any], colors: Mapping[str, str]
) -> None:
    """The chunked-prefill paper's Table 9's companion: where measured step times fall around the
    target."""
    figure, axes = _figure(width=9.0, height=5.0)
    ax = axes[0]
    bins = np.linspace(-1.0, 2.0, 61)
    for arm, repeats in runs.items():
        summaries = [e["summary"] for e in analysis[arm]["repeats"]]
        targets = [s["control"]["target_ms"] if s["control"].get("target_fixed", True) else None
                   for s in summaries if "control" in s]
        if not targets:
            continue
        deviations = np.concatenate([step_deviations(r.get("trace") or [], t)
                                     for r, t in zip(repeats, targets)])
        if not len(deviations):
            continue
        ax.hist(np.clip(deviations, bins[0], bins[-1]), bins=bins, histtype="step",
                linewidth=1.5, color=colors[arm], label=arm, density=True)
    ax.axvspan(-0.1, 0.1, color="green", alpha=0.1, label="within 10 %")
    ax.set_xlabel("(measured step time - target) / target (clipped to [-1, 2])")
    ax.set_ylabel("density of steps")
    ax.legend()
    figure.suptitle("Step-time deviation from the latency target")
    figure.savefig(path)


def _labelled_points(
    ax: Axes, points: Mapping[str, tuple[Stat | None, Stat | None]], baseline: str,
    colors: Mapping[str, str], x_scale: float, y_scale: float,
) -> None:
    """One point per arm with min-max error bars; the baseline is a star with guide lines."""
    for arm, (x_stat, y_stat) in points.items():
        if x_stat is None or y_stat is None:
            continue
        (x,), x_err = _error_bar([x_stat], x_scale)
        (y,), y_err = _error_bar([y_stat], y_scale)
        is_baseline = arm == baseline
        ax.errorbar(x, y, xerr=x_err, yerr=y_err, fmt="*" if is_baseline else "o",
                    markersize=14 if is_baseline else 8, color=colors[arm], capsize=3)
        ax.annotate(f"{arm} (baseline)" if is_baseline else arm, (x, y),
                    xytext=(6, 6), textcoords="offset points", fontsize=10)
        if is_baseline:
            ax.axvline(x, color="grey", linestyle=":", linewidth=1)
            ax.axhline(y, color="grey", linestyle=":", linewidth=1)
    ax.margins(0.15)  # room for the labels of the outermost points
    ax.grid(alpha=0.3)


def _plot_frontier(
    path: Path, analysis: Mapping[str, Any], baseline: str, colors: Mapping[str, str]
) -> None:
    figure, (ax,) = _figure()
    aggregates = {arm: a["aggregate"] for arm, a in analysis.items()}
    points = {arm: (_stat(agg, "throughput", "output_tokens_per_s"),
                    _stat(agg, "latency", "e2e_s", "p95")) for arm, agg in aggregates.items()}
    unit, scale = _time_unit(y["mean"] for _, y in points.values() if y)
    _labelled_points(ax, points, baseline, colors, 1.0, scale)
    ax.set_xlabel("Output throughput (tokens/s)")
    ax.set_ylabel(f"P95 E2E latency ({unit})")
    ax.set_title("Latency-throughput frontier (lower right is better)")
    figure.savefig(path)


def _plot_ttft_frontier(
    path: Path, analysis: Mapping[str, Any], baseline: str, colors: Mapping[str, str]
) -> None:
    figure, (ax,) = _figure()
    aggregates = {arm: a["aggregate"] for arm, a in analysis.items()}
    points = {arm: (_stat(agg, "latency", "ttft_s", "p50"), _stat(agg, "latency", "ttft_s", "p99"))
              for arm, agg in aggregates.items()}
    unit, scale = _time_unit(s["mean"] for pair in points.values() for s in pair if s)
    _labelled_points(ax, points, baseline, colors, scale, scale)
    ax.set_xlabel(f"Median TTFT ({unit})")
    ax.set_ylabel(f"P99 TTFT ({unit})")
    ax.set_title("TTFT frontier: median vs P99 (lower left is better)")
    figure.savefig(path)


def _plot_batch_efficiency(
    path: Path, analysis: Mapping[str, Any], colors: Mapping[str, str]
) -> None:
    figure, axes = _figure(columns=3, width=12.0, height=4.5)
    panels = (
        ("Average batch size (seqs)", "avg_batch_size", 1.0),
        ("Average step time (ms)", "avg_step_time_s", 1000.0),
        ("Steps per completed request", "steps_per_request", 1.0),
    )
    arms = list(analysis)
    for ax, (label, key, scale) in zip(axes, panels):
        stats = [_stat(analysis[arm]["aggregate"], "batch", key) for arm in arms]
        means, errors = _error_bar(stats, scale)
        ax.bar(arms, means, yerr=errors, capsize=3, color=[colors[arm] for arm in arms])
        ax.tick_params(axis="x", labelrotation=20)
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylabel(label)
        ax.set_title(label.split(" (")[0])
    figure.suptitle("Batch efficiency from the scheduler trace (error bars: min to max)")
    figure.savefig(path)


def _write_figures(
    out_dir: Path, runs: Runs, analysis: Mapping[str, Any], baseline: str
) -> list[tuple[str, str]]:
    """Draw every plot; the batch plot only when some arm has a trace."""
    colors = _colors(analysis)
    figures = [
        ("e2e_cdf.png", "E2E latency CDF per arm"),
        ("latency_bars.png", "Mean and P95 TTFT and E2E per arm"),
        ("tail_vs_baseline.png", f"P95 and P99 normalised to {baseline}"),
        ("frontier.png", "Latency-throughput frontier"),
        ("ttft_frontier.png", "TTFT frontier (median vs P99)"),
    ]
    _plot_e2e_cdf(out_dir / figures[0][0], runs, colors)
    _plot_latency_bars(out_dir / figures[1][0], analysis, colors)
    _plot_tail_ratios(out_dir / figures[2][0], analysis, baseline, colors)
    _plot_frontier(out_dir / figures[3][0], analysis, baseline, colors)
    _plot_ttft_frontier(out_dir / figures[4][0], analysis, baseline, colors)
    if len(_categories(analysis)) > 1:
        figures.append(("tail_vs_baseline_by_category.png",
                        f"P95 and P99 E2E normalised to {baseline} per category "
                         "(the ordering-policies paper's Fig. 4)"))
        _plot_category_tail_ratios(out_dir / figures[-1][0], analysis, baseline, colors)
    if any("control" in a["aggregate"] for a in analysis.values()):
        figures.append(("target_deviation.png", "Step-time deviation from the latency target"))
        _plot_deviation_histogram(out_dir / figures[-1][0], runs, analysis, colors)
    traced = (_mean(a["aggregate"], "batch", "avg_batch_size") for a in analysis.values())
    if any(value is not None for value in traced):
        figures.append(("batch_efficiency.png", "Batch efficiency per arm"))
        _plot_batch_efficiency(out_dir / figures[-1][0], analysis, colors)
    return figures


# ---------------------------------------------------------------- entry point


def write_report(
    out_dir: str | Path,
    runs: Runs,
    *,
    baseline: str | None = None,
    config: Mapping[str, Any] | None = None,
    target_ms: float | None = None,
) -> Path:
    """Analyse ``runs`` (arm -> repeats) and write report.json, report.md and the PNG plots.

    Each repeat is ``{"requests": [...], "trace": [...], "category": str, "meta": {...}}``
    (trace, category and meta optional). ``baseline`` defaults to the first arm. Returns the
    path of report.md.
    """
    analysis = analyse_runs(runs, target_ms)
    baseline = _checked_baseline(analysis, baseline)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if available("matplotlib"):
        figures = _write_figures(out, runs, analysis, baseline)
    else:
        figures = []
        note_no_plots(f"report {out / 'report.md'}")
    document = {"config": dict(config or {}), "baseline": baseline, "arms": analysis}
    (out / "report.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    markdown = out / "report.md"
    markdown.write_text(
        render_markdown(analysis, baseline=baseline, config=config, figures=figures)
    )
    return markdown


def read_report(path: str | Path) -> dict[str, Any]:
    """A report.json that :func:`write_report` wrote, or its gzipped copy (``.json.gz``, as
    the docs commit them)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as file:
        return json.load(file)
