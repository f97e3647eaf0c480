"""How fast the built-in latency model learns an engine, from a per-step trace.

Reads the JSON Lines trace a plugin arm writes (``fairsched bench`` or ``fairsched
simulate`` put one in each run's folder) and prints, per window of steps, the median
relative error ``|measured - predicted| / measured`` of the model's prediction for the
batch each step dispatched, the share of steps LPRS planned (its guard not holding it on
the token budget), and the first step from which every later window's median error stays
under ``--within``.

    python benchmarks/lprs_convergence.py runs/main/cpu-engine/.../trace.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path


def windows(path: Path, size: int) -> list[dict]:
    """Per ``size`` steps with a prediction: first step, median error, planned share."""
    rows = []
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            step = json.loads(line)
            predicted, measured = step.get("lprs_model_ms"), step.get("step_time_s")
            if predicted is None or measured is None or not math.isfinite(predicted):
                continue
            measured_ms = measured * 1000.0
            if measured_ms <= 0:
                continue
            rows.append((step["step"], abs(measured_ms - predicted) / measured_ms,
                         not step.get("lprs_guard", False)))
    out = []
    for start in range(0, len(rows) - size + 1, size):
        chunk = rows[start:start + size]
        out.append({"first_step": chunk[0][0],
                    "median_error": statistics.median(e for _s, e, _p in chunk),
                    "planned": sum(p for _s, _e, p in chunk) / size})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path, help="a plugin arm's trace.jsonl")
    parser.add_argument("--window", type=int, default=50, help="steps per line (default 50)")
    parser.add_argument("--within", type=float, default=0.25,
                        help="the error converged to (default 0.25)")
    args = parser.parse_args()
    rows = windows(args.trace, args.window)
    if not rows:
        parser.error(f"{args.trace}: no step with an LPRS prediction (LPRS off?)")
    print(f"{'from step':>9} {'median error':>12} {'LPRS planned':>12}")
    for row in rows:
        print(f"{row['first_step']:>9} {row['median_error']:>12.2f} {row['planned']:>12.0%}")
    settled = next((i for i in range(len(rows))
                    if all(r["median_error"] <= args.within for r in rows[i:])), None)
    print("converged: " + (f"from step {rows[settled]['first_step']} every window's median "
                           f"error <= {args.within:g}" if settled is not None
                           else f"no: a later window's median error exceeds {args.within:g}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
