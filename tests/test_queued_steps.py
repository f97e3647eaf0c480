"""benchmarks/queued_steps.py on a simulated run, where every number is known exactly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fairsched_plugin.experiment.case_files import WorkloadRequest

ROOT = Path(__file__).resolve().parents[1]


def _case(path: Path) -> Path:
    """A burst of short and long prompts that queues behind a 64-token budget."""
    rows = []
    for i in range(40):
        prompt = 300 if i % 4 == 0 else 20
        rows.append(WorkloadRequest(id=f"q{i:02d}", arrival_s=0.005 * i, prompt="x",
                                    prompt_tokens=prompt, output_tokens=12, tier=0,
                                    request_class="medium" if prompt == 300 else "short",
                                    category="queued"))
    path.write_text("".join(r.to_json() + "\n" for r in rows))
    return path


def _rows(output: str) -> dict[tuple[str, str], list[str]]:
    rows = {}
    for line in output.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[(cells[0], cells[1])] = cells[2:]
    return rows


def test_stock_and_fcfs_queue_alike_and_the_fit_explains_every_step(tmp_path: Path) -> None:
    from fairsched_plugin.cli import main

    out = tmp_path / "sim"
    assert main(["simulate", "--arms", "stock,fcfs,aging:alpha=1",
                 "--case", str(_case(tmp_path / "case.jsonl")),
                 "--step-model", "linear:2:0.1:0.3", "--max-num-batched-tokens", "64",
                 "--max-num-seqs", "16", "--out", str(out)]) == 0
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "queued_steps.py"), str(out / "report.json")],
        capture_output=True, text=True, check=True)
    rows = _rows(result.stdout)
    assert set(rows) == {("stock", "1"), ("fcfs", "1"), ("aging:alpha=1", "1")}
    # fcfs makes stock's decisions: the same steps, so the same figures.
    assert rows[("fcfs", "1")] == rows[("stock", "1")]
    assert int(rows[("stock", "1")][0]) > 0
    # Shortest-first admits short prompts sooner: more decodes share each queued step's
    # budget and the prefill rate that drains the queue falls.
    stock, aging = rows[("stock", "1")], rows[("aging:alpha=1", "1")]
    assert float(aging[1]) > float(stock[1])
    assert float(aging[4].replace(",", "")) < float(stock[4].replace(",", ""))
    # The simulated step times are the linear model itself: nothing is left unexplained.
    assert {cells[-1] for cells in rows.values()} <= {"+0.0", "-0.0"}
