"""Accuracy of a latency model in the chunked-prefill paper's Table 8 layout, plus plots.

Metrics: MAE, RMSE, MAPE; absolute-error percentiles P50/P90/P95/P99; the share of
predictions within 5 ms and within 10 ms. Added because LPRS cares which way a model
errs: the share of under-predictions (a batch predicted to fit that then overruns).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..extras import available, note_no_plots


def accuracy_metrics(measured_ms: np.ndarray, predicted_ms: np.ndarray) -> dict[str, float]:
    """Table 8's metrics for predictions of measured latencies (both in ms)."""
    measured = np.asarray(measured_ms, dtype=np.float64).reshape(-1)
    predicted = np.asarray(predicted_ms, dtype=np.float64).reshape(-1)
    if measured.shape != predicted.shape or measured.size == 0:
        raise ValueError(
            f"need as many predictions as measurements, at least one; got {predicted.size} "
            f"and {measured.size}"
        )
    error = predicted - measured
    absolute = np.abs(error)
    p50, p90, p95, p99 = np.percentile(absolute, [50, 90, 95, 99])
    positive = measured > 0
    return {
        "samples": int(measured.size),
        "mae_ms": float(absolute.mean()),
        "rmse_ms": float(np.sqrt(np.mean(error**2))),
        "mape_pct": float(100.0 * np.mean(absolute[positive] / measured[positive]))
        if positive.any() else float("nan"),
        "p50_ms": float(p50),
        "p90_ms": float(p90),
        "p95_ms": float(p95),
        "p99_ms": float(p99),
        "within_5ms": float(np.mean(absolute <= 5.0)),
        "within_10ms": float(np.mean(absolute <= 10.0)),
        "under_predicted": float(np.mean(error < 0)),
    }


def markdown_table(metrics: Mapping[str, float], title: str = "") -> str:
    """Table 8's layout: overall error | absolute-error percentiles | bounded-error ratio."""
    m = metrics
    lines = [f"**{title}** ({m['samples']} samples)", ""] if title else []
    lines += [
        "| MAE | RMSE | MAPE | P50 | P90 | P95 | P99 | <= 5 ms | <= 10 ms | under-predicted |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {m['mae_ms']:.2f} ms | {m['rmse_ms']:.2f} ms | {m['mape_pct']:.2f}% "
        f"| {m['p50_ms']:.2f} | {m['p90_ms']:.2f} | {m['p95_ms']:.2f} | {m['p99_ms']:.2f} "
        f"| {100 * m['within_5ms']:.2f}% | {100 * m['within_10ms']:.2f}% "
        f"| {100 * m['under_predicted']:.1f}% |",
        "",
        "Absolute-error percentiles in ms.",
    ]
    return "\n".join(lines) + "\n"


def plot_predictions(
    measured_ms: np.ndarray, predicted_ms: np.ndarray, out_dir: Path, title: str
) -> list[Path]:
    """``scatter.png`` (predicted against measured, with the diagonal) and
    ``error_hist.png`` (signed error, predicted - measured)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    measured = np.asarray(measured_ms, dtype=np.float64)
    predicted = np.asarray(predicted_ms, dtype=np.float64)
    paths = []

    figure = Figure(figsize=(5.5, 5))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.scatter(measured, predicted, s=4, alpha=0.4)
    low, high = min(measured.min(), predicted.min()), max(measured.max(), predicted.max())
    axes.plot([low, high], [low, high], color="black", linewidth=1, label="exact")
    axes.set(xlabel="measured batch latency (ms)", ylabel="predicted (ms)", title=title)
    axes.legend(loc="upper left")
    figure.tight_layout()
    paths.append(out_dir / "scatter.png")
    figure.savefig(paths[-1], dpi=120)

    figure = Figure(figsize=(6, 4))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.hist(predicted - measured, bins=60)
    axes.axvline(0.0, color="black", linewidth=1)
    axes.set(xlabel="prediction error, predicted - measured (ms)", ylabel="steps",
             title=title)
    figure.tight_layout()
    paths.append(out_dir / "error_hist.png")
    figure.savefig(paths[-1], dpi=120)
    return paths


def write_evaluation(
    out_dir: str | Path,
    measured_ms: np.ndarray,
    predicted_ms: np.ndarray,
    title: str,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """Write ``metrics.json`` (metrics plus ``extra``), ``report.md`` and the two plots to
    ``out_dir``; return the metrics."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = accuracy_metrics(measured_ms, predicted_ms)
    (out_dir / "metrics.json").write_text(
        json.dumps({"metrics": metrics, **(extra or {})}, indent=2) + "\n"
    )
    (out_dir / "report.md").write_text(f"# {title}\n\n" + markdown_table(metrics))
    if available("matplotlib"):
        plot_predictions(measured_ms, predicted_ms, out_dir, title)
    else:
        note_no_plots(f"evaluation {out_dir / 'report.md'}")
    return metrics
