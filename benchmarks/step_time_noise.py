"""How repeatable one engine's step times are: the ceiling on any latency target's
"share of steps within 10 %".

Groups the steps of a predictor profile (``fairsched profile``) by batch shape, prefill
tokens in bins of 16 and decode tokens in bins of 4, and prints the share of steps within
10 % of their own group's median time. Even a predictor that knew each shape's typical time
exactly could not put more steps within 10 % of a target than this.

    .venv/bin/python benchmarks/step_time_noise.py benchmarks/results/2026-11-30-predictor-cpu/profile.csv.gz
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from fairsched_plugin.predictor.features import RAW_FEATURES
from fairsched_plugin.predictor.profiling import read_profile

PREFILL, DECODE = RAW_FEATURES.index("prefill_tokens"), RAW_FEATURES.index("decode_tokens")
MIN_GROUP = 5


def share_within(raw: np.ndarray, latency: np.ndarray, min_prefill: int = 0) -> tuple[float, int]:
    groups: dict[tuple[int, int], list[float]] = defaultdict(list)
    for row, ms in zip(raw, latency):
        groups[(int(row[PREFILL]) // 16, int(row[DECODE]) // 4)].append(ms)
    within: list[bool] = []
    for (prefill_bin, _), times in groups.items():
        if len(times) < MIN_GROUP or prefill_bin * 16 < min_prefill:
            continue
        median = float(np.median(times))
        within += [abs(t - median) <= 0.1 * median for t in times]
    return float(np.mean(within)), len(within)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path, help="profile CSV, or .csv.gz beside its meta")
    args = parser.parse_args()
    path = args.profile
    if path.suffix == ".gz":
        folder = Path(tempfile.mkdtemp())
        csv = folder / path.stem
        with gzip.open(path, "rb") as source, open(csv, "wb") as target:
            shutil.copyfileobj(source, target)
        meta = path.with_name("profile.meta.json")
        shutil.copy(meta, csv.with_name(csv.name + ".meta.json"))
        path = csv
    raw, latency, _meta = read_profile(path)
    for label, min_prefill in (("all steps", 0), ("steps with >= 64 prefill tokens", 64)):
        share, n = share_within(raw, latency, min_prefill)
        print(f"{label}: {n} steps in groups of >= {MIN_GROUP}; within 10 % of their "
              f"group's median: {share:.1%}")


if __name__ == "__main__":
    main()
