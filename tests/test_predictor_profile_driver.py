"""``fairsched profile``: the phase plan, the row counter, and (slow) a real server run."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from fairsched_plugin.bench.profile import PHASES, ROUND_RATES, RowCounter, phase_plan
from fairsched_plugin.experiment.workloads import WORKLOADS


def test_every_round_runs_every_phase_at_the_round_rate():
    plan = list(itertools.islice(phase_plan(), 3 * len(PHASES)))
    assert [phase for _, phase, _ in plan] == list(PHASES) * 3
    for round_index, phase, rate in plan:
        assert rate == phase.rate * ROUND_RATES[round_index]
    assert {phase.workload for phase in PHASES} <= set(WORKLOADS)


def test_row_counter_counts_complete_rows_after_the_header(tmp_path):
    path = tmp_path / "p.csv"
    counter = RowCounter(path)
    assert counter.count() == 0
    path.write_text("step,a\n1,2\n2,")
    assert counter.count() == 1  # the second row is still being written
    with open(path, "a") as file:
        file.write("3\n3,4\n")
    assert counter.count() == 3


@pytest.mark.slow
def test_profile_drives_a_server_until_enough_samples(tiny_model: Path, tmp_path: Path):
    pytest.importorskip("vllm")
    from fairsched_plugin.cli import main
    from fairsched_plugin.predictor.profiling import read_profile

    out = tmp_path / "profile.csv"
    pool = Path(__file__).resolve().parent.parent / ".cache" / "sharegpt-pool.jsonl"
    code = main([
        "profile", "--out", str(out), "--samples", "300", "--model-dir", str(tiny_model),
        "--pool", str(pool), "--max-model-len", "2048", "--max-prompt-tokens", "1024",
        "--max-output-tokens", "64", "--phase-requests", "16", "--timeout", "300",
        "--engine-arg=--enforce-eager",
    ])
    assert code == 0
    raw, latency, meta = read_profile(out)
    assert len(raw) >= 300
    assert meta["memory_provider"] == "kv_cache"  # a CPU engine has nothing else
    assert (latency > 0).all() and (raw[:, 2] >= 1).all()  # every step had a request
    assert (raw[:, 0] + raw[:, 1] <= 256).all()  # within the token budget
    assert raw[:, 0].max() > 0 and raw[:, 1].max() > 0  # prefills and decodes were seen
    assert np.all(raw[:, 7] + raw[:, 8] == pytest.approx(raw[0, 7] + raw[0, 8], rel=1e-4))
    assert out.with_name(out.name + ".server.log").stat().st_size > 0
