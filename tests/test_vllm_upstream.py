"""vLLM's own scheduler tests pass against the plugin's classes, except the listed ones.

Why: vLLM's ``tests/v1/core/`` states what vLLM's scheduler promises (preemption, prefix
caching, KV connectors, spec decode, structured output, pause states, priority). The
harness (``tests/vllm_upstream/harness.py``) runs them on stock vLLM and with every
scheduler they build replaced by the plugin's class, under ``fcfs`` (must behave exactly as
stock), ``guarded-srpf`` (the default as shipped: shortest remaining prefill first inside
the guard's deadlines, with LPRS and APC), ``aging`` (the project's policy with the most
state) and ``aging+align`` (Aging with chunk-end alignment, on by default on Ascend).
Then, for each configuration:

* every test that fails on stock is covered by an ``[[excluded]]`` entry of
  ``tests/vllm_upstream/differences.toml`` (with its reason), and every entry still matches
  a stock failure (so the exclusions cannot go stale or hide a plugin failure);
* nothing fails on the plugin that passes on stock, except the ``[[difference]]`` entries
  for that policy;
* every listed difference really fails on the plugin and passes on stock, except those
  marked ``may_pass`` (their outcome depends on wall-clock timing) (a fixed bug
  makes this test fail until its entry is removed);
* the plugin run built plugin schedulers only, and ran the same tests as stock.

The runs start two at a time ahead of the tests that check them (``paired_jobs``). Each
release in ``harness.UPSTREAM_VERSIONS`` runs its own tests (0.32.0, installed; 0.33.0
and 0.34.0 over their source overlays), under ``fcfs`` and the default; the newest also
under ``aging`` and ``aging+align``. An entry of
``differences.toml`` applies to the releases its ``vllm`` list names, or to every release
without one.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from paired_jobs import PairedJobs, selected  # noqa: E402
from vllm_upstream.harness import (  # noqa: E402
    DRAIN_TEST,
    UPSTREAM_VERSIONS,
    SuiteResult,
    run_suite,
)

pytestmark = pytest.mark.slow

LISTS = Path(__file__).resolve().parent / "vllm_upstream" / "differences.toml"
_ORDER_ONLY = {"FAIRSCHED_LPRS_ENABLED": "false", "FAIRSCHED_APC_ENABLED": "false"}
CONFIGS: dict[str, tuple[str, dict[str, str]]] = {
    "fcfs": ("fcfs", {}),
    "aging": ("aging", _ORDER_ONLY),
    "guarded-srpf": ("guarded-srpf", {}),
    "aging+align": ("aging", {"FAIRSCHED_LPRS_ALIGN": "on", **_ORDER_ONLY}),
}
"""Name in differences.toml -> (policy, further FAIRSCHED_* settings). ``guarded-srpf`` is
the shipped default as an operator gets it: the guard with its tail watch (arrival order
until its first judgement), LPRS and APC off without a fitted latency model; ``aging`` is the order alone, with vLLM's own chunks (LPRS and APC off), and
``aging+align`` its chunk ends aligned to the KV block (Ascend's default)."""
POLICIES = tuple(CONFIGS)
EVERY_RELEASE = ("fcfs", "guarded-srpf")
"""The control and the default run on every release; the other two on the newest only
(each run costs about a minute of CI)."""
RUNS = [(version, policy) for version in UPSTREAM_VERSIONS for policy in POLICIES
        if policy in EVERY_RELEASE or version == UPSTREAM_VERSIONS[-1]]
"""(release, configuration) pairs run."""


@dataclass(frozen=True)
class Lists:
    """``differences.toml``: exclusions (fail on stock) and differences (policy, test),
    each for the releases its ``vllm`` list names (all without one)."""

    excluded: list[dict[str, object]]
    differences: list[dict[str, object]]

    @staticmethod
    def _for(entry: dict[str, object], version: str) -> bool:
        return version in entry.get("vllm", UPSTREAM_VERSIONS)  # type: ignore[operator]

    def excluded_tests(self, version: str) -> set[str]:
        return {test for entry in self.excluded if self._for(entry, version)
                for test in entry["tests"]}  # type: ignore[attr-defined]

    def listed(self, policy: str, version: str) -> dict[str, str]:
        return {d["test"]: d["reason"] for d in self.differences  # type: ignore[misc]
                if d["policy"] in (policy, "*") and self._for(d, version)}

    def may_pass(self, policy: str, version: str) -> set[str]:
        """Listed differences whose outcome depends on wall-clock timing (``may_pass``):
        they may fail or pass, so they are not checked for staleness."""
        return {d["test"] for d in self.differences  # type: ignore[misc]
                if d.get("may_pass") and d["policy"] in (policy, "*")
                and self._for(d, version)}


def load_lists() -> Lists:
    data = tomllib.loads(LISTS.read_text())
    lists = Lists(data.get("excluded", []), data.get("difference", []))
    for entry in lists.excluded:
        assert set(entry) - {"vllm"} == {"tests", "reason"} and str(
            entry["reason"]).strip(), entry
    for entry in lists.differences:
        assert set(entry) - {"vllm", "may_pass"} == {"policy", "test", "reason"} and str(
            entry["reason"]).strip(), entry
        assert entry["policy"] in (*POLICIES, "*"), entry
    for entry in lists.excluded + lists.differences:
        assert set(entry.get("vllm", UPSTREAM_VERSIONS)) <= set(UPSTREAM_VERSIONS), entry
    return lists


def _run(key: tuple[str, ...]) -> SuiteResult:
    """``("stock", version)``, ``("plugin", version, configuration)`` or ``("drain",
    policy)``: one run of the harness."""
    if key[0] == "stock":
        return run_suite("stock", version=key[1])
    if key[0] == "plugin":
        name, settings = CONFIGS[key[2]]
        return run_suite("plugin", name, fairsched_env=settings, version=key[1])
    version = UPSTREAM_VERSIONS[-1]
    if key[1] == "stock":
        return run_suite("stock", files=(DRAIN_TEST,), version=version)
    return run_suite("plugin", key[1], files=(DRAIN_TEST,), version=version)


SUITES: PairedJobs[tuple[str, ...], SuiteResult] = PairedJobs(_run)
"""Each harness run, once per session, two at a time."""


def _needs(item: pytest.Item) -> list[tuple[str, ...]]:
    params = item.callspec.params
    if item.originalname == "test_newer_scheduler_paths_drain":
        return [("drain", params["policy"])]
    runs: list[tuple[str, ...]] = [("stock", params["version"])]
    if "policy" in params:
        runs.append(("plugin", params["version"], params["policy"]))
    return runs


@pytest.fixture(scope="module", autouse=True)
def _runs_in_pairs(request: pytest.FixtureRequest):
    SUITES.start(run for item in selected(request) for run in _needs(item))
    yield
    SUITES.close()


@pytest.mark.parametrize("version", UPSTREAM_VERSIONS)
def test_stock_failures_are_exactly_the_excluded(version: str) -> None:
    lists = load_lists()
    stock = SUITES.result(("stock", version))
    assert stock.built["stock"] > 0 and stock.built["plugin"] == 0, stock.built
    failing = stock.failing()
    excluded = lists.excluded_tests(version)
    unexplained = sorted(failing - excluded)
    assert not unexplained, (
        f"tests that fail on stock vLLM {version} without an [[excluded]] entry:\n"
        + "\n".join(f"{t} | {stock.messages.get(t, '')}" for t in unexplained)
    )
    stale = sorted(excluded - failing)
    assert not stale, f"[[excluded]] tests that do not fail on stock {version}: {stale}"


@pytest.mark.parametrize(("version", "policy"), RUNS)
def test_plugin_fails_only_the_listed(version: str, policy: str) -> None:
    lists = load_lists()
    stock = SUITES.result(("stock", version))
    plugin = SUITES.result(("plugin", version, policy))
    print(f"\nvLLM {version}: stock {stock.seconds:.0f} s {stock.counts()}; "
          f"plugin {policy} {plugin.seconds:.0f} s {plugin.counts()}")
    assert plugin.built["plugin"] > 0 and plugin.built["stock"] == 0, plugin.built
    assert set(plugin.outcomes) == set(stock.outcomes), "the two runs ran different tests"
    listed = lists.listed(policy, version)
    new_failures = plugin.failing() - stock.failing()
    unlisted = sorted(new_failures - set(listed))
    assert not unlisted, (
        f"pass on stock {version}, fail under {policy} and are not listed in {LISTS.name}:\n"
        + "\n".join(f"{t} | {plugin.outcomes[t]} | {plugin.messages.get(t, '')}"
                    for t in unlisted)
    )
    timing = lists.may_pass(policy, version)
    stale = sorted(t for t in listed if t not in new_failures and t not in timing)
    assert not stale, (
        f"listed for {policy} but not (or no longer) a difference: each must pass on stock "
        "and fail on the plugin; remove fixed ones:\n"
        + "\n".join(f"{t} | stock {stock.outcomes.get(t)} | plugin {plugin.outcomes.get(t)}"
                    for t in stale)
    )


@pytest.mark.parametrize("policy", ["stock", "aging", "guarded-srpf"])
def test_newer_scheduler_paths_drain(policy: str) -> None:
    """vLLM 0.34's asynchronous KV loads, parked reservations, failed loads and draft
    tokens, driven at random by vLLM's own mock connector (``drain_under_policy.py``):
    every request ends and the queues, reservations and KV pool drain, under stock and
    under two reordering policies."""
    result = SUITES.result(("drain", policy))
    print(f"\nvLLM {UPSTREAM_VERSIONS[-1]} drain under {policy}: {result.seconds:.0f} s {result.counts()}")
    assert result.built["plugin" if policy != "stock" else "stock"] >= 6, result.built
    assert result.counts() == {"passed": 6}, result.log[-4000:]
