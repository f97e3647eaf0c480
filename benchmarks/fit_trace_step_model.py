"""Fit ``linear:BASE:PREFILL_PER_TOKEN:DECODE_PER_TOKEN`` (ms) to real per-step traces.

A diagnostic for the simulator's validation: it separates the error of the step-time
model from the error of the simulation. Least squares of the measured ``step_time_s``
on prefill and decode tokens per step.

    python benchmarks/fit_trace_step_model.py runs/main/runs/fcfs/r1/trace.jsonl
"""

from __future__ import annotations

import json
import sys

import numpy as np


def fit(paths: list[str]) -> tuple[np.ndarray, float, int]:
    rows = []
    for path in paths:
        with open(path) as file:
            for line in file:
                step = json.loads(line)
                if step.get("step_time_s") is not None:
                    rows.append((step["prefill_tokens"], step["decode_tokens"],
                                 step["step_time_s"] * 1e3))
    data = np.array(rows, dtype=float)
    x = np.c_[np.ones(len(data)), data[:, 0], data[:, 1]]
    coef, *_ = np.linalg.lstsq(x, data[:, 2], rcond=None)
    mae = float(np.mean(np.abs(x @ coef - data[:, 2])))
    return coef, mae, len(data)


if __name__ == "__main__":
    coef, mae, n = fit(sys.argv[1:])
    print(f"{n} steps, MAE {mae:.2f} ms")
    print(f"--step-model linear:{coef[0]:.3f}:{coef[1]:.4f}:{coef[2]:.4f}")
