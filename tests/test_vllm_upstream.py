"""vLLM's own scheduler tests pass against the plugin's classes, except the listed ones.

Why: vLLM's ``tests/v1/core/`` states what vLLM's scheduler promises (preemption, prefix
caching, KV connectors, spec decode, structured output, pause states, priority). The
harness (``tests/vllm_upstream/harness.py``) runs them on stock vLLM and with every
scheduler they build replaced by the plugin's class, under ``fcfs`` (must behave exactly as
stock), ``aging`` (the project's policy with the most state), ``guarded-aging`` (the
default: Aging inside the FCFS guard's deadline lanes) and ``aging+align`` (Aging
with chunk-end alignment, on by default on Ascend: the plan's chunk-rule path). Then, for
each configuration:

* every test that fails on stock is covered by an ``[[excluded]]`` entry of
  ``tests/vllm_upstream/differences.toml`` (with its reason), and every entry still matches
  a stock failure (so the exclusions cannot go stale or hide a plugin failure);
* nothing fails on the plugin that passes on stock, except the ``[[difference]]`` entries
  for that policy;
* every listed difference really fails on the plugin and passes on stock (a fixed bug
  makes this test fail until its entry is removed);
* the plugin run built plugin schedulers only, and ran the same tests as stock.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from vllm_upstream.harness import SuiteResult, run_suite  # noqa: E402

pytestmark = pytest.mark.slow

LISTS = Path(__file__).resolve().parent / "vllm_upstream" / "differences.toml"
CONFIGS: dict[str, tuple[str, dict[str, str]]] = {
    "fcfs": ("fcfs", {}),
    "aging": ("aging", {}),
    "guarded-aging": ("guarded-aging", {}),
    "aging+align": ("aging", {"FAIRSCHED_LPRS_ALIGN": "on"}),
}
"""Name in differences.toml -> (policy, further FAIRSCHED_* settings)."""
POLICIES = tuple(CONFIGS)


@dataclass(frozen=True)
class Lists:
    """``differences.toml``: exclusions (fail on stock) and differences (policy, test)."""

    excluded: list[dict[str, object]]
    differences: list[dict[str, str]]

    def excluded_tests(self) -> set[str]:
        return {test for entry in self.excluded for test in entry["tests"]}  # type: ignore[attr-defined]

    def listed(self, policy: str) -> dict[str, str]:
        return {d["test"]: d["reason"] for d in self.differences if d["policy"] in (policy, "*")}


def load_lists() -> Lists:
    data = tomllib.loads(LISTS.read_text())
    lists = Lists(data.get("excluded", []), data.get("difference", []))
    for entry in lists.excluded:
        assert set(entry) == {"tests", "reason"} and str(entry["reason"]).strip(), entry
    for entry in lists.differences:
        assert set(entry) == {"policy", "test", "reason"} and entry["reason"].strip(), entry
        assert entry["policy"] in (*POLICIES, "*"), entry
    return lists


@pytest.fixture(scope="module")
def stock() -> SuiteResult:
    return run_suite("stock")


def test_stock_failures_are_exactly_the_excluded(stock: SuiteResult) -> None:
    lists = load_lists()
    assert stock.built["stock"] > 0 and stock.built["plugin"] == 0, stock.built
    failing = stock.failing()
    excluded = lists.excluded_tests()
    unexplained = sorted(failing - excluded)
    assert not unexplained, (
        "tests that fail on stock vLLM without an [[excluded]] entry:\n"
        + "\n".join(f"{t} | {stock.messages.get(t, '')}" for t in unexplained)
    )
    stale = sorted(excluded - failing)
    assert not stale, f"[[excluded]] tests that do not fail on stock: {stale}"


@pytest.mark.parametrize("policy", POLICIES)
def test_plugin_fails_only_the_listed(stock: SuiteResult, policy: str) -> None:
    lists = load_lists()
    name, settings = CONFIGS[policy]
    plugin = run_suite("plugin", name, fairsched_env=settings)
    print(f"\nstock {stock.seconds:.0f} s {stock.counts()}; "
          f"plugin {policy} {plugin.seconds:.0f} s {plugin.counts()}")
    assert plugin.built["plugin"] > 0 and plugin.built["stock"] == 0, plugin.built
    assert set(plugin.outcomes) == set(stock.outcomes), "the two runs ran different tests"
    listed = lists.listed(policy)
    new_failures = plugin.failing() - stock.failing()
    unlisted = sorted(new_failures - set(listed))
    assert not unlisted, (
        f"pass on stock, fail under {policy} and are not listed in {LISTS.name}:\n"
        + "\n".join(f"{t} | {plugin.outcomes[t]} | {plugin.messages.get(t, '')}"
                    for t in unlisted)
    )
    stale = sorted(t for t in listed if t not in new_failures)
    assert not stale, (
        f"listed for {policy} but not (or no longer) a difference: each must pass on stock "
        "and fail on the plugin; remove fixed ones:\n"
        + "\n".join(f"{t} | stock {stock.outcomes.get(t)} | plugin {plugin.outcomes.get(t)}"
                    for t in stale)
    )
