"""The no-harm check: does an arm stay within stock vLLM's figures in every suite cell?

A default earns its place only if it does no harm anywhere before it gains somewhere.
Each bound is a ratio to stock's run on the same requests at the same load (prefix-cache
hit rate: a difference), checked per cell of a suite's results file, so a committed
results file can be judged again without rerunning anything. ``spf`` (shortest prompt
first, mean-optimal and tail-blind) is shown beside: what ordering could still buy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .suite_report import LIMIT, Cell, _cell, _stock, cells_of, group_key, label, ratio


@dataclass(frozen=True)
class Bound:
    name: str
    limit: float
    measure: Callable[[Cell, Cell], float | None]
    """The cell's figure against stock's (None: not measured in that cell)."""
    at_most: bool = True
    """True: the figure must be <= limit; False: >= limit."""

    def holds(self, value: float) -> bool:
        return value <= self.limit if self.at_most else value >= self.limit


def _worst_class(cell: Cell, stock: Cell) -> float | None:
    """The largest P99 TTFT ratio over the prompt classes both runs served."""
    ratios = [ratio(cell, stock, "p99", name) for name in cell["metrics"]["by_class"]]
    ratios = [r for r in ratios if r is not None]
    return max(ratios) if ratios else None


def _hit_rate_drop(cell: Cell, stock: Cell) -> float | None:
    mine = cell["metrics"].get("prefix_hit_rate")
    base = stock["metrics"].get("prefix_hit_rate")
    return None if mine is None or base is None else mine - base


BOUNDS = (
    Bound("median TTFT", 1.00, lambda c, s: ratio(c, s, "ttft_p50")),
    Bound("P99 TTFT", 1.02, lambda c, s: ratio(c, s, "ttft_p99")),
    Bound("worst class P99", 1.05, _worst_class),
    Bound("mean E2E", 1.00, lambda c, s: ratio(c, s, "e2e_mean")),
    Bound("P99 TPOT", 1.02, lambda c, s: ratio(c, s, "tpot_p99")),
    Bound("throughput", 0.99, lambda c, s: ratio(c, s, "output_tps"), at_most=False),
    Bound("prefill computed", 1.01, lambda c, s: ratio(c, s, "prefill_tokens")),
    Bound("hit rate - stock's", -0.01, _hit_rate_drop, at_most=False),
)
"""Ratios to stock in the same run, as the default must meet them."""


def check(cell: Cell, stock: Cell) -> list[tuple[Bound, float | None]]:
    """Each bound's figure in one cell (None where the cell does not measure it)."""
    return [(bound, bound.measure(cell, stock)) for bound in BOUNDS]


def failures(results: dict[str, Any], arm: str) -> list[tuple[str, float, str, float]]:
    """Every (group, load, bound, figure) where ``arm`` misses a bound."""
    stock = _stock(results["cells"])
    out = []
    for cell in results["cells"]:
        if cell["arm"] != arm:
            continue
        base = stock[(group_key(cell), cell["load"])]
        for bound, value in check(cell, base):
            if value is not None and not bound.holds(value):
                out.append((label(group_key(cell)), cell["load"], bound.name, value))
    return out


def no_harm_table(results: dict[str, Any], arm: str) -> list[str]:
    """One row per group and load: each bound's figure with a tick or a cross, and
    ``spf``'s median / P99 TTFT beside; then how many cells pass every bound."""
    header = ("| group | load | " + " | ".join(
        f"{b.name} {'<=' if b.at_most else '>='} {b.limit:g}" for b in BOUNDS)
        + " | spf median / P99 |")
    lines = [header, "|---|---|" + "---|" * (len(BOUNDS) + 1)]
    passed = total = 0
    for key, load, base, (cell,) in cells_of(results, arm):
        marks = []
        ok = True
        for bound, value in check(cell, base):
            if value is None:
                marks.append("-")
                continue
            holds = bound.holds(value)
            ok &= holds
            marks.append(f"{_figure(value, bound)} {'✓' if holds else '✗'}")
        limit = _cell(results, key, load, LIMIT)
        spf = ("-" if limit is None else
               " / ".join(f"{ratio(limit, base, m) or 0:.2f}"
                          for m in ("ttft_p50", "ttft_p99")))
        lines.append(f"| {label(key)} | {load:g}x | " + " | ".join(marks) + f" | {spf} |")
        passed += ok
        total += 1
    lines += ["", f"`{arm}` meets every bound in {passed} of {total} cells."]
    return lines


def _figure(value: float, bound: Bound) -> str:
    """Two decimals; a figure outside the bound with as many more (up to four) as it
    takes not to read as the limit itself."""
    for digits in (2, 3, 4):
        text = f"{value:.{digits}f}"
        if bound.holds(value) or text != f"{bound.limit:.{digits}f}":
            return text
    return text


def excess(bound: Bound, value: float) -> float:
    """How far ``value`` lies past ``bound`` (0 within it)."""
    return max(0.0, value - bound.limit if bound.at_most else bound.limit - value)


def crossings_beside(results: dict[str, Any], arm: str, other: str) -> list[str]:
    """Each cell where ``arm`` crosses a bound: the figures it crosses with, ``other``'s
    figures for the same bounds, and the largest excess of each arm over any bound in that
    cell, so a reader sees whether ``arm`` gave up a gain rather than a bound there."""
    lines = ["| group | load | crossed | `" + arm + "` | `" + other + "` | "
             "largest excess: " + arm + " / " + other + " |", "|---|---|---|---|---|---|"]
    worse = total = 0
    for key, load, base, (mine, theirs) in cells_of(results, arm, other):
        rival_figures = dict(check(theirs, base))
        figures = [(bound, value, rival_figures[bound])
                   for bound, value in check(mine, base)
                   if value is not None and rival_figures[bound] is not None]
        crossed = [row for row in figures if not row[0].holds(row[1])]
        if not crossed:
            continue
        total += 1
        own = max(excess(bound, value) for bound, value, _o in figures)
        rival = max(excess(bound, value) for bound, _v, value in figures)
        worse += own > rival
        lines.append(
            f"| {label(key)} | {load:g}x | {', '.join(b.name for b, _v, _o in crossed)} | "
            + ", ".join(_figure(v, b) for b, v, _o in crossed) + " | "
            + ", ".join(_figure(o, b) for b, _v, o in crossed)
            + f" | {own:.3f} / {rival:.3f} |")
    if total == 0:
        return []
    return lines + ["", f"`{arm}` crosses further than `{other}` in {worse} of these "
                        f"{total} cells."]


def render(results: dict[str, Any], arm: str, other: str | None = None) -> str:
    """The no-harm page of a suite's results: the bounds, then the table; with ``other``
    (an arm of the same results), each cell ``arm`` crosses in, beside ``other``."""
    meta = results["meta"]
    beside = [] if other is None else crossings_beside(results, arm, other)
    if beside:
        beside = ["", f"## Where `{arm}` crosses, beside `{other}`", "", *beside]
    return "\n".join([
        f"# No harm: `{arm}` against stock vLLM", "",
        f"`{meta['command']}` (vLLM {meta['vllm']}, commit {meta['commit']}). Each figure "
        "is a ratio to stock's run on the same requests at the same load (the hit rate: "
        "a difference); ✓ within the bound, ✗ outside it, - not measured in that cell "
        "(the hit rate is measured only with the prefix cache on). `spf` (shortest "
        "prompt first, mean-optimal and tail-blind) beside: what ordering can buy.", "",
        *no_harm_table(results, arm), *beside, ""])
