"""The suite's table and plots, from its results file alone (so a committed results file
can be rendered again without rerunning anything).

Ratios are to stock's run on the same requests at the same rate: below 1 is better for
latencies, above 1 for throughput. Stock's own row gives its absolute figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..experiment.arms import STOCK
from . import published
from .routers import parse_fleet

Cell = dict[str, Any]
GroupKey = tuple[str, str, str, str, str]

COLUMNS = (("median TTFT", "ttft_p50"), ("mean TTFT", "ttft_mean"), ("P99 TTFT", "ttft_p99"),
           ("mean E2E", "e2e_mean"), ("output tok/s", "output_tps"), ("P99 TPOT", "tpot_p99"))


def group_key(item: dict[str, Any]) -> GroupKey:
    """Scenario, device, model, mode and fleet (``"1"``: one engine)."""
    return (item["scenario"], item["device"], item["model"], item["mode"],
            item.get("fleet", "1"))


def _shown(key: GroupKey) -> tuple[str, ...]:
    """A group's key as tables and plot names show it: a fleet's spec only where it is
    one."""
    return key if key[4] != "1" else key[:4]


def label(key: GroupKey) -> str:
    """A group's name in the tables."""
    return " · ".join(_shown(key))


def _stock(cells: Iterable[Cell]) -> dict[tuple[GroupKey, float], Cell]:
    return {(group_key(c), c["load"]): c for c in cells if c["arm"] == STOCK}


def ratio(cell: Cell, stock: Cell, metric: str, cls: str | None = None) -> float | None:
    """``cell``'s metric over stock's (a class's P99 TTFT with ``cls``)."""
    if cls is None:
        # A result written before a metric existed has none to compare.
        mine, base = cell["metrics"].get(metric), stock["metrics"].get(metric)
        if mine is None or base is None:
            return None
    else:
        a, b = cell["metrics"]["by_class"].get(cls), stock["metrics"]["by_class"].get(cls)
        if a is None or b is None:
            return None
        mine, base = a[metric], b[metric]
    return mine / base if base > 0 else None


def _fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _fmt_abs(metric: str, value: float) -> str:
    if metric == "output_tps":
        return f"{value:,.0f}"
    if metric == "tpot_p99":
        return f"{value * 1e3:.1f} ms"
    return f"{value * 1e3:,.0f} ms" if value < 1 else f"{value:,.2f} s"


def classes_of(cells: Iterable[Cell]) -> list[str]:
    seen: dict[str, None] = {}
    for c in cells:
        for name in c["metrics"]["by_class"]:
            seen.setdefault(name)
    return list(seen)


def _setting_line(group: dict[str, Any]) -> str:
    """The engine, the cache and loop settings, and stock's capacity (with the cache off
    too, where it is on)."""
    engine = group["engine"]
    cached = engine.get("enable_prefix_caching", False)
    fleet = group.get("fleet")
    if fleet:
        spec = parse_fleet(fleet)
        if spec.disaggregated:
            decode = " running stock vLLM" if spec.decode_arm else ""
            line = (f"{spec.engines} prefill and {spec.decode_engines} decode engine(s)"
                    f"{decode}, each pool behind {spec.router}, the KV cache handed over at "
                    f"{group['kv_bandwidth_gb_s']:g} GB/s per decode engine "
                    f"({group['requests']:,} requests); each engine: budget")
        else:
            line = (f"{spec.engines} engines behind {spec.router} ({group['requests']:,} "
                    f"requests); each engine: budget")
    else:
        line = "Budget"
    line += (f" {engine['max_num_batched_tokens']} tokens, {engine['max_num_seqs']} "
             f"sequences, max_model_len {engine['max_model_len']}, block "
             f"{engine['block_size']}, KV cache {engine['kv_cache_tokens']:,} tokens, prefix "
             f"cache {'on' if cached else 'off'}, "
             f"{'closed' if group.get('closed_loop') else 'open'}-loop arrivals. Stock's "
             f"capacity: **{group['capacity_rps']:.2f} req/s**")
    if "capacity_cache_off_rps" in group:
        line += f" ({group['capacity_cache_off_rps']:.2f} with the prefix cache off)"
    return line + "."


def group_table(group: dict[str, Any], cells: list[Cell]) -> list[str]:
    stock = _stock(cells)
    classes = classes_of(cells)
    hits = any("prefix_hit_rate" in c["metrics"] for c in cells)
    spread = any("balance" in c["metrics"] for c in cells)
    handoff = any(c["metrics"].get("handoff") for c in cells)
    fleet = group.get("fleet")
    lines = [f"### {group['scenario']} · {group['accelerator']} · {group['model']} · "
             f"{group['mode']}" + (f" · {fleet}" if fleet else ""), "",
             _setting_line(group), "",
             "| load (req/s) | arm | " + " | ".join(name for name, _ in COLUMNS)
             + " | " + " | ".join(f"P99 TTFT {c}" for c in classes)
             + (" | prefix hits" if hits else "")
             + (" | busiest engine's busy time / mean" if spread else "")
             + (" | hand-off wait mean / P99 (ms) | pull mean (ms)" if handoff else "")
             + " |",
             "|---|---|" + "---|" * (len(COLUMNS) + len(classes) + hits + spread
                                     + 2 * handoff)]
    for cell in cells:
        base = stock[(group_key(cell), cell["load"])]
        if cell["arm"] == STOCK:
            values = [_fmt_abs(m, cell["metrics"][m]) if m in cell["metrics"] else "-"
                      for _, m in COLUMNS]
            values += [_fmt_abs("ttft", cell["metrics"]["by_class"][c]["p99"])
                       if c in cell["metrics"]["by_class"] else "-" for c in classes]
        else:
            values = [_fmt_ratio(ratio(cell, base, m)) for _, m in COLUMNS]
            values += [_fmt_ratio(ratio(cell, base, "p99", c)) for c in classes]
        if hits:
            values.append(f"{cell['metrics']['prefix_hit_rate']:.1%}")
        if spread:
            values.append(f"{cell['metrics']['balance']['busy_max_over_mean']:.2f}")
        if handoff:
            moved = cell["metrics"]["handoff"]
            values += [f"{moved['wait_mean'] * 1e3:.0f} / {moved['wait_p99'] * 1e3:.0f}",
                       f"{moved['pull_mean'] * 1e3:.1f}"]
        lines.append(f"| {cell['load']:g}x ({cell['rate']:.2f}) | {cell['arm']} | "
                     + " | ".join(values) + " |")
    return lines


def _cell(results: dict[str, Any], key: GroupKey, load: float, arm: str) -> Cell | None:
    return next((c for c in results["cells"] if group_key(c) == key and c["load"] == load
                 and c["arm"] == arm), None)


def cells_of(results: dict[str, Any], *arms: str
             ) -> Iterator[tuple[GroupKey, float, Cell, tuple[Cell, ...]]]:
    """Per group and load, in the results' order, where every one of ``arms`` ran: the
    group, the load, stock's cell and the arms' cells."""
    stock = _stock(results["cells"])
    for group in results["groups"]:
        key = group_key(group)
        for load in results["plan"]["loads"]:
            cells = tuple(_cell(results, key, load, arm) for arm in arms)
            if all(cell is not None for cell in cells):
                yield key, load, stock[(key, load)], cells


def verdict_table(results: dict[str, Any], arm: str) -> list[str]:
    """One line per group and load: ``arm``'s median / P99 TTFT and mean E2E ratios."""
    stock = _stock(results["cells"])
    loads = results["plan"]["loads"]
    lines = ["| scenario · device · model · mode | "
             + " | ".join(f"{load:g}x" for load in loads) + " |",
             "|---|" + "---|" * len(loads)]
    for group in results["groups"]:
        key = group_key(group)
        row = []
        for load in loads:
            cell = _cell(results, key, load, arm)
            if cell is None:
                row.append("-")
                continue
            base = stock[(key, load)]
            row.append(" / ".join(_fmt_ratio(ratio(cell, base, m))
                                  for m in ("ttft_p50", "ttft_p99", "e2e_mean")))
        lines.append(f"| {label(key)} | " + " | ".join(row) + " |")
    return lines


LIMIT = "spf"
"""Shortest prompt first: the order that minimises mean waiting and ignores the tail."""


def target_table(results: dict[str, Any], arm: str) -> list[str]:
    """Per group and load: ``arm``'s mean TTFT and mean E2E against ``spf``'s (what the
    mean can still buy), its largest prompt class's P99 TTFT and its output throughput
    against stock's. Empty unless the results hold ``spf``."""
    if not any(c["arm"] == LIMIT for c in results["cells"]):
        return []
    lines = ["| scenario · device · model · mode | load | mean TTFT / spf's | "
             "mean E2E / spf's | P99 TTFT of the longest class / stock's | "
             "output tok/s / stock's |", "|---|---|---|---|---|---|"]
    for key, load, base, (mine, limit) in cells_of(results, arm, LIMIT):
        longest = classes_of([base])[-1]
        lines.append(
            f"| {label(key)} | {load:g}x | {_fmt_ratio(ratio(mine, limit, 'ttft_mean'))}"
            f" | {_fmt_ratio(ratio(mine, limit, 'e2e_mean'))} | {longest} "
            f"{_fmt_ratio(ratio(mine, base, 'p99', longest))} | "
            f"{_fmt_ratio(ratio(mine, base, 'output_tps'))} |")
    return lines


def queueing_table(results: dict[str, Any]) -> list[str]:
    """Per group and load, of stock's TTFT: the median time queued for the budget
    (arrival to the first step that schedules the request) against the median TTFT, and
    the queued share of the mean. Ordering can only shorten the queued part; where it is
    small, no order helps. Empty for results without the queueing figures."""
    cells = [c for c in results["cells"] if c["arm"] == STOCK and "queued_p50" in c["metrics"]]
    if not cells:
        return []
    lines = ["| scenario · device · model · mode | load | stock's median TTFT | "
             "median queued | queued share of mean TTFT |", "|---|---|---|---|---|"]
    for cell in cells:
        m = cell["metrics"]
        lines.append(f"| {label(group_key(cell))} | {cell['load']:g}x | "
                     f"{_fmt_abs('ttft', m['ttft_p50'])} | {_fmt_abs('ttft', m['queued_p50'])}"
                     f" | {m['queued_mean'] / m['ttft_mean']:.0%} |")
    return lines


def async_shift(results: dict[str, Any]) -> list[str]:
    """Where a group ran both sync and async: each arm's median and P99 TTFT ratio in
    both modes at every load."""
    stock = _stock(results["cells"])
    by_key = {group_key(g): g for g in results["groups"]}
    lines: list[str] = []
    for (scenario, device, model, mode, fleet) in by_key:
        if mode != "async" or (scenario, device, model, "sync", fleet) not in by_key:
            continue
        lines += [f"{scenario} · {device} · {model}: median / P99 TTFT against stock, "
                  "async then sync", "",
                  "| load | arm | async | sync |", "|---|---|---|---|"]
        for cell in results["cells"]:
            if (group_key(cell) != (scenario, device, model, "async", fleet)
                    or cell["arm"] == STOCK):
                continue
            twin = next(c for c in results["cells"] if c["arm"] == cell["arm"]
                        and c["load"] == cell["load"]
                        and group_key(c) == (scenario, device, model, "sync", fleet))
            pair = []
            for c in (cell, twin):
                base = stock[(group_key(c), c["load"])]
                pair.append(f"{_fmt_ratio(ratio(c, base, 'ttft_p50'))} / "
                            f"{_fmt_ratio(ratio(c, base, 'ttft_p99'))}")
            lines.append(f"| {cell['load']:g}x | {cell['arm']} | {pair[0]} | {pair[1]} |")
        lines.append("")
    return lines


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    default = meta["default_policy"]
    lines = ["# Scenario suite", "",
             f"`{meta['command']}` (vLLM {meta['vllm']}, commit {meta['commit']}, "
             f"{meta.get('wall_s', 0) / 60:.1f} min). Simulated: vLLM's scheduler and the "
             "plugin's, with an analytic step-time model per device (the scale check "
             "below). Loads are fractions of stock's capacity on each group.", "",
             f"## The default (`{default}`) against stock", "",
             "Median TTFT / P99 TTFT / mean E2E, as ratios to stock (below 1 is better).", ""]
    lines += verdict_table(results, default) + [""]
    targets = target_table(results, default)
    if targets:
        lines += ["Against the limit and per class: mean TTFT and mean E2E as ratios to `spf` "
                  "(shortest prompt first, the mean-optimal and tail-blind order) in the same "
                  "run; the longest prompt class's P99 TTFT and output throughput as ratios "
                  "to stock.", ""] + targets + [""]
    queueing = queueing_table(results)
    if queueing:
        lines += ["## Where ordering can help", "",
                  "Stock's TTFT split: time queued for the token budget (arrival to the "
                  "first step that schedules the request) and the rest (the prefill's own "
                  "steps). An order can only shorten the queued part.", ""] + queueing + [""]
    shift = async_shift(results)
    if shift:
        lines += ["", "## Sync against async", ""] + shift
    lines += ["## Every arm", "",
              "Stock's row: absolute figures; other rows: ratios to stock at the same load.",
              ""]
    for group in results["groups"]:
        cells = [c for c in results["cells"] if group_key(c) == group_key(group)]
        lines += group_table(group, cells) + [""]
    lines += ["## Scale: the step-time presets against published vLLM figures", "",
              published.report(), ""]
    return "\n".join(lines)


def plot(results: dict[str, Any], out: Path, load: float = 1.1) -> list[Path]:
    """Per group: the TTFT CDF of each arm at ``load``, and each arm's median against P99
    TTFT (ratios to stock) across loads."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    stock = _stock(results["cells"])
    written = []

    def save(fig: Any, ax: Any, xlabel: str, ylabel: str, title: str, name: str) -> None:
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(out / name)
        fig.savefig(written[-1], dpi=100)
        plt.close(fig)

    for group in results["groups"]:
        key = group_key(group)
        cells = [c for c in results["cells"] if group_key(c) == key]
        slug = "-".join(_shown(key))
        fig, ax = plt.subplots(figsize=(6, 4))
        for cell in (c for c in cells if c["load"] == load):
            ax.plot(cell["metrics"]["ttft_percentiles"], range(101), label=cell["arm"])
        save(fig, ax, "TTFT (s)", "requests (%)", f"{label(key)}, load {load:g}x",
             f"{slug}-ttft-cdf.png")
        fig, ax = plt.subplots(figsize=(6, 4))
        for arm in dict.fromkeys(c["arm"] for c in cells if c["arm"] != STOCK):
            points = [(ratio(c, stock[(key, c["load"])], "ttft_p50"),
                       ratio(c, stock[(key, c["load"])], "ttft_p99"), c["load"])
                      for c in cells if c["arm"] == arm]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=arm)
            for x, y, at in points:
                ax.annotate(f"{at:g}", (x, y), fontsize=6)
        ax.axhline(1, color="grey", lw=0.5)
        ax.axvline(1, color="grey", lw=0.5)
        save(fig, ax, "median TTFT / stock's", "P99 TTFT / stock's",
             f"{' · '.join(key)} (labels: load)", f"{slug}-median-p99.png")
    return written
