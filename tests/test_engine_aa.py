"""benchmarks/engine_aa.py's reading of a run: paired ratios, their interval, the table.

The engines themselves take minutes per arm and are not started here (the benchmark's
figures are in docs/engine-aa-s25); the analysis is checked on planted rounds whose ratios
are known."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from engine_aa import geomean_ci  # noqa: E402


def test_a_constant_ratio_has_no_spread() -> None:
    mean, low, high = geomean_ci([1.1] * 12)
    assert math.isclose(mean, 1.1) and math.isclose(low, 1.1) and math.isclose(high, 1.1)


def test_the_interval_holds_the_geometric_mean_and_narrows_with_rounds() -> None:
    ratios = [0.9, 1.2, 1.0, 1.1, 0.95, 1.05]
    mean, low, high = geomean_ci(ratios)
    assert math.isclose(mean, math.exp(sum(map(math.log, ratios)) / len(ratios)))
    assert low < mean < high
    _, low4, high4 = geomean_ci(ratios * 4)
    assert high4 - low4 < (high - low) * 0.7


def _round(wall: float, **extra: float) -> dict[str, float]:
    return {"wall_s": wall, "engine_cpu_s": 2 * wall, "own_cpu_s": 0.4,
            "output_tokens": 1000, **extra}


def test_table_pairs_each_round_with_the_first_arm(tmp_path: Path) -> None:
    # stock's rounds swing by 2x; the plugin's arm is 1.25x of stock in each round, so the
    # paired ratio is exact while the unpaired walls overlap.
    stock = [_round(w) for w in (4.0, 8.0, 6.0)]
    arm = [_round(1.25 * r["wall_s"], steps=100, mean_step_ms=50.0) for r in stock]
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"stock": stock, "fcfs": arm}))
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "engine_aa.py"), "--table", str(results)],
        capture_output=True, text=True, check=True, timeout=120).stdout
    rows = {line.split("|")[1].strip(): line for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| arm")}
    assert "| 1.250 [1.250-1.250] | 1.250 [1.250-1.250] |" in rows["fcfs"]
    assert "| 1.000 [1.000-1.000] | 1.000 [1.000-1.000] |" in rows["stock"]
    assert "| 100 [100-100] | 50.0 [50.0-50.0] |" in rows["fcfs"]
    assert rows["stock"].rstrip().endswith("| - | - |")
