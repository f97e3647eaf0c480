"""The report: files written, tables laid out with hand-checked numbers, plots are real PNGs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from matplotlib.image import imread  # noqa: E402

from fairsched_plugin.experiment.report import (  # noqa: E402
    analyse_runs,
    render_markdown,
    write_report,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CLASSES = ("short", "short", "medium", "long")
PROMPTS = (10, 20, 300, 2000)
TRACE = [
    {"step": i, "t": 0.1 * i, "step_time_s": 0.05, "num_decodes": 2, "decode_tokens": 2,
     "num_prefills": 1, "prefill_tokens": 32, "prefill_chunks": [32],
     "num_running": 3, "num_waiting": 0}
    for i in range(8)
]


def repeat(ttft: float, e2e: float, category: str = "steady", failed: bool = False) -> dict:
    """Four requests sent 1 s apart, 4 output tokens each, all with the same TTFT and E2E,
    so every percentile of a repeat equals its TTFT (or E2E); makespan = 3 + e2e."""
    requests = [
        {"id": f"r{i}", "class": CLASSES[i], "tier": 0, "category": category,
         "prompt_tokens": PROMPTS[i], "target_output_tokens": 4, "arrival_s": float(i),
         "first_token_s": i + ttft, "finish_s": i + e2e, "output_tokens": 4, "error": None}
        for i in range(4)
    ]
    if failed:
        requests.append({**requests[0], "id": "lost", "first_token_s": None, "finish_s": None,
                         "output_tokens": 0, "error": "timeout"})
    return {"requests": requests, "trace": TRACE, "category": category, "meta": {}}


def runs() -> dict:
    return {
        # TTFT 1 s and 3 s -> 2000 ± 1000 ms; E2E 4 s and 6 s -> 5000 ± 1000 ms
        # output tok/s 16/7 = 2.286 and 16/9 = 1.778 -> 2.03 ± 0.25
        "fcfs": [repeat(1.0, 4.0, failed=True), repeat(3.0, 6.0)],
        # TTFT 500 ± 0 ms, E2E 3000 ± 0 ms, output tok/s 16/6 = 2.67; no trace
        "aging a=75": [{**repeat(0.5, 3.0), "trace": []}, {**repeat(0.5, 3.0), "trace": []}],
    }


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    write_report(out, runs(), baseline="fcfs", config={"requests": 4, "rate": 20.0})
    return out


def row(markdown: str, first_cell: str) -> list[str]:
    """Cells of the first table row that starts with ``first_cell``."""
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r}")


def row_last(markdown: str, first_cell: str) -> list[str]:
    """Cells of the last table row that starts with ``first_cell``."""
    return row("\n".join(reversed(markdown.splitlines())), first_cell)


def test_writes_every_file(report_dir: Path) -> None:
    names = {p.name for p in report_dir.iterdir()}
    assert names == {
        "report.json", "report.md", "e2e_cdf.png", "latency_bars.png", "tail_vs_baseline.png",
        "frontier.png", "ttft_frontier.png", "batch_efficiency.png",
    }


def test_pngs_are_legible_images(report_dir: Path) -> None:
    for png in report_dir.glob("*.png"):
        data = png.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000, png.name
        height, width = imread(png).shape[:2]
        assert width >= 800 and height >= 450, png.name  # >= 8 x 4.5 in at 100 dpi


def test_main_table(report_dir: Path) -> None:
    markdown = (report_dir / "report.md").read_text()
    header = row(markdown, "Arm")
    assert header[1:5] == ["TTFT P50 (ms)", "TTFT mean (ms)", "TTFT P95 (ms)", "TTFT P99 (ms)"]
    assert header[-2:] == ["Output tok/s", "Req/s"]
    fcfs = row(markdown, "fcfs")
    assert fcfs[1:5] == ["2000 ± 1000"] * 4
    assert fcfs[5:9] == ["5000 ± 1000"] * 4
    assert fcfs[9] == "2.03 ± 0.25"
    aging = row(markdown, "aging a=75")
    assert aging[1] == "500 ± 0"
    assert aging[9] == "2.67 ± 0.00"


def test_other_tables(report_dir: Path) -> None:
    markdown = (report_dir / "report.md").read_text()
    for title in ("the chunked-prefill paper's Table 4 layout",
                  "the chunked-prefill paper's Table 9 layout", "Per request class",
                  "the chunked-prefill paper's Table 10 layout",
                  "Ratios to the baseline arm (fcfs)"):
        assert title in markdown
    assert row(markdown, "P99")[1:3] == ["2000 ± 1000", "500 ± 0"]  # prefill E2E = TTFT
    assert row(markdown, "long")[:4] == ["long", "fcfs", "1", "2000 ± 1000"]
    assert row(markdown, "Jain index, normalised latency")[1:] == ["1.00 ± 0.00"] * 2
    assert row(markdown, "Failed requests per repeat")[1:] == ["0.5", "0"]
    assert row(markdown, "Avg batch size (seqs)")[1:] == ["3.00 ± 0.00", "-"]
    assert "- fcfs: 1 x `timeout`" in markdown
    # aging / fcfs: median TTFT 0.5 / 2 = 0.25, mean E2E 3 / 5 = 0.6,
    # output tok/s (16/6) / ((16/7 + 16/9) / 2) = 1.3125
    # The ratio table comes after the main one and before the repeat-by-repeat ratios.
    ratios = row_last(markdown.split("## 6b.")[0], "aging a=75")
    assert ratios == ["aging a=75", "0.25x", "0.25x", "0.25x", "0.60x", "0.60x", "1.31x"]
    assert "Per workload category" not in markdown  # one category only
    assert "- rate: `20.0`" in markdown
    assert "![E2E latency CDF per arm](e2e_cdf.png)" in markdown


def test_report_json(report_dir: Path) -> None:
    document = json.loads((report_dir / "report.json").read_text())
    assert document["config"] == {"requests": 4, "rate": 20.0}
    assert document["baseline"] == "fcfs"
    fcfs = document["arms"]["fcfs"]
    assert len(fcfs["repeats"]) == 2
    assert fcfs["repeats"][0]["summary"]["requests"]["failed"] == 1
    assert fcfs["aggregate"]["latency"]["ttft_s"]["mean"]["mean"] == pytest.approx(2.0)
    assert list(fcfs["by_category"]) == ["steady"]


def test_categories_tables() -> None:
    two = {
        "fcfs": [repeat(1.0, 4.0, "steady"), repeat(2.0, 8.0, "bursty")],
        "spf": [repeat(0.5, 3.0, "steady"), repeat(1.0, 7.0, "bursty")],
    }
    markdown = render_markdown(analyse_runs(two), baseline="fcfs")
    assert "the ordering-policies paper's Tables 2 and 3 layout" in markdown
    # output tok/s: fcfs steady 16/7 = 2.29, bursty 16/11 = 1.45, mean 1.87
    assert row(markdown, "steady")[:2] == ["steady", "2.29"]
    assert row(markdown, "Mean over categories")[1] == "1.87"
    # P95 E2E (ms): bursty fcfs 8 s, spf 7 s; mean over categories fcfs (4 + 8) / 2 = 6 s
    assert row_last(markdown, "bursty")[1:] == ["8000", "7000"]
    assert row_last(markdown, "Mean over categories")[1:] == ["6000", "5000"]


def test_category_falls_back_to_request_field() -> None:
    unnamed = {**repeat(1.0, 2.0, "flash-crowd"), "category": None}
    assert list(analyse_runs({"fcfs": [unnamed]})["fcfs"]["by_category"]) == ["flash-crowd"]


def test_main_only_and_baseline_checks() -> None:
    analysis = analyse_runs(runs())
    main = render_markdown(analysis, main_only=True)
    assert main.startswith("## 1. Main comparison") and "## 2." not in main
    with pytest.raises(ValueError, match="baseline arm 'stock'"):
        render_markdown(analysis, baseline="stock")
    with pytest.raises(ValueError, match="no repeats"):
        analyse_runs({"fcfs": []})


def test_seconds_when_latencies_are_long(tmp_path: Path) -> None:
    markdown = write_report(tmp_path, {"fcfs": [repeat(12.0, 40.0)]}).read_text()
    assert row(markdown, "Arm")[1] == "TTFT P50 (s)"
    assert row(markdown, "fcfs")[1] == "12.0"  # one repeat: no ± part


def test_no_batch_plot_without_any_trace(tmp_path: Path) -> None:
    write_report(tmp_path, {"fcfs": [{**repeat(1.0, 2.0), "trace": []}]})
    assert not (tmp_path / "batch_efficiency.png").exists()
    assert (tmp_path / "frontier.png").exists()


def test_several_categories_draw_the_per_category_tail_plot(tmp_path: Path) -> None:
    two = {
        "fifo": [repeat(1.0, 4.0, "steady"), repeat(2.0, 8.0, "bursty")],
        "spf": [repeat(0.5, 3.0, "steady"), repeat(1.0, 7.0, "bursty")],
    }
    write_report(tmp_path, two)
    markdown = (tmp_path / "report.md").read_text()
    assert "(tail_vs_baseline_by_category.png)" in markdown
    assert (tmp_path / "tail_vs_baseline_by_category.png").stat().st_size > 0
    single = {"fifo": [repeat(1.0, 4.0, "steady")], "spf": [repeat(0.5, 3.0, "steady")]}
    write_report(tmp_path / "one", single)
    assert not (tmp_path / "one" / "tail_vs_baseline_by_category.png").exists()


def test_control_section_and_deviation_plot_when_a_target_is_given(tmp_path: Path) -> None:
    steps = [{"step_time_s": t, "num_prefills": 1, "num_decodes": 1, "decode_tokens": 1,
              "prefill_tokens": 8, "prefill_chunks": [8]} for t in (0.050, 0.052, 0.090)]
    lprs_steps = [{**s, "lprs_target_ms": 50.0, "apc": {"accepted": 1, "warm_start": 1}}
                  for s in steps]
    runs = {
        "fcfs": [{**repeat(1.0, 2.0), "trace": steps}],
        "fcfs+lprs+apc": [{**repeat(1.0, 2.0), "trace": lprs_steps}],
    }
    markdown = write_report(tmp_path, runs, target_ms=50.0).read_text()
    assert "the chunked-prefill paper's Tables 9 and 10" in markdown
    assert row(markdown, "Steps within 10 % of target (share)")[1:] == ["0.667", "0.667"]
    assert row(markdown, "APC: interventions (all but accepted)")[1:] == ["-", "3"]
    assert (tmp_path / "target_deviation.png").stat().st_size > 0


def test_paired_ratios_pair_repeats_per_case_and_client():
    from fairsched_plugin.experiment.report import paired_ratios

    bench = {"ttft_p50_ms": 100.0, "ttft_mean_ms": 120.0, "ttft_p99_ms": 400.0,
             "e2e_mean_ms": 2000.0, "output_tokens_per_s": 50.0, "completed": 4,
             "tpot_mean_ms": 20.0, "tpot_p99_ms": 40.0}
    half = {**bench, "ttft_p50_ms": 50.0, "output_tokens_per_s": 55.0, "tpot_mean_ms": 30.0}
    data = {
        # repeat 1: TTFT 1 s; repeat 2: TTFT 3 s
        "stock": [{**repeat(1.0, 4.0), "vllm_bench": bench}, {**repeat(3.0, 6.0),
                                                                  "vllm_bench": bench}],
        # TTFT 0.5 s in both: 0.5x of repeat 1, 1/6 of repeat 2
        "new": [{**repeat(0.5, 4.0), "vllm_bench": half}, {**repeat(0.5, 6.0),
                                                               "vllm_bench": half}],
    }
    analysis = analyse_runs(data)
    replay = paired_ratios(analysis, "stock", "replay")["steady"]["new"]
    assert [r[0] for r in replay] == pytest.approx([0.5, 0.5 / 3])
    assert [r[3] for r in replay] == pytest.approx([1.0, 1.0])  # mean E2E unchanged
    vllm = paired_ratios(analysis, "stock", "vllm_bench")["steady"]["new"]
    assert vllm == [pytest.approx([0.5, 1.0, 1.0, 1.0, 1.1, 1.5, 1.0])] * 2
    markdown = render_markdown(analysis, baseline="stock")
    assert "| new | 0.33x [0.17-0.50] |" in markdown
    assert "vllm bench serve" in markdown and "| new | 0.50x [0.50-0.50] | 1.00x" in markdown
    # A report written before the TPOT columns existed: those ratios are unknown.
    for runs_ in analysis.values():
        for entry in runs_["repeats"]:
            entry["vllm_bench"].pop("tpot_mean_ms", None)
            entry["vllm_bench"].pop("tpot_p99_ms", None)
    vllm = paired_ratios(analysis, "stock", "vllm_bench")["steady"]["new"]
    assert [r[5:] for r in vllm] == [[None, None]] * 2


def test_no_vllm_bench_table_without_its_figures():
    from fairsched_plugin.experiment.report import paired_ratios

    assert paired_ratios(analyse_runs(runs()), "fcfs", "vllm_bench") == {}


def test_ttft_parts_only_for_arms_with_a_trace():
    data = runs()
    for rep in data["fcfs"]:
        for r in rep["requests"]:
            if r["first_token_s"] is not None:
                r["admitted_s"] = r["arrival_s"] + 0.2
                r["prefill_done_s"] = r["first_token_s"] - 0.1
    markdown = render_markdown(analyse_runs(data), baseline="fcfs")
    section = markdown.split("## 6c. Where TTFT goes")[1].split("##")[0]
    # fcfs: TTFT 2000 ± 1000 ms, queue 200, own prefill 1700 ± 1000, after 100; share 10%.
    assert "| steady | fcfs | 2000 ± 1000 | 200 ± 0 | 1700 ± 1000 | 100.0 ± 0.0 | 10% |" in section
    assert "aging a=75" not in section
