"""The Grafana dashboard (examples/grafana-fairsched.json) queries only series that exist.

Every ``fairsched:`` name in a panel's query must be one the exporter exposes
(``metrics.exporter.METRIC_NAMES``, a histogram's with its ``_bucket``, ``_sum``,
``_count``), and every ``vllm:`` name one the installed vLLM defines, read from the source
of the modules that define its metrics (without importing vLLM) with the type each is
created as, so a gauge queried with ``_total`` or a counter with ``_bucket`` fails too.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from fairsched_plugin.metrics.exporter import METRIC_NAMES

DASHBOARD = Path(__file__).resolve().parent.parent / "examples" / "grafana-fairsched.json"
SERIES = re.compile(r"(?:vllm|fairsched):[a-zA-Z0-9_:]*")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
VLLM_METRIC_MODULES = ("v1/metrics/loggers.py", "v1/metrics/perf.py",
                       "v1/spec_decode/metrics.py")
_CREATED = re.compile(
    r"\b(_gauge_cls|_counter_cls|_histogram_cls|Gauge|Counter|Histogram)\(\s*"
    r'name="(vllm:[A-Za-z0-9_:]+)"')
_LITERAL = re.compile(r'"(vllm:[A-Za-z0-9_:]+)"')


def _exposed(name: str, kind: str | None) -> set[str]:
    """The sample names prometheus_client exposes for a metric created as ``kind``
    (None: created from a name held elsewhere, type unknown: any of them)."""
    counter = {name.removesuffix("_total") + "_total"}
    histogram = {name + suffix for suffix in HISTOGRAM_SUFFIXES}
    if kind is None:
        return {name} | counter | histogram
    kind = kind.strip("_").removesuffix("_cls").lower()
    return {"gauge": {name}, "counter": counter, "histogram": histogram}[kind]


def vllm_series() -> set[str]:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    root = Path(spec.submodule_search_locations[0])
    series: set[str] = set()
    for module in VLLM_METRIC_MODULES:
        source = (root / module).read_text(encoding="utf-8")
        typed = {name: kind for kind, name in _CREATED.findall(source)}
        for name, kind in typed.items():
            series |= _exposed(name, kind)
        for name in set(_LITERAL.findall(source)) - typed.keys():
            series |= _exposed(name, None)
    return series


def fairsched_series() -> set[str]:
    """``METRIC_NAMES``, and a histogram's samples (its name there has no suffix)."""
    return set(METRIC_NAMES) | {name + suffix for name in METRIC_NAMES
                                for suffix in HISTOGRAM_SUFFIXES}


def unknown_series(expr: str, known: set[str]) -> list[str]:
    return [name for name in SERIES.findall(expr) if name not in known]


def _expressions(panels: list[dict]) -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every target, rows' nested panels included."""
    out = []
    for panel in panels:
        out += [(panel["title"], target["expr"]) for target in panel.get("targets", [])]
        out += _expressions(panel.get("panels", []))
    return out


@pytest.fixture(scope="module")
def known() -> set[str]:
    return vllm_series() | fairsched_series()


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def test_every_panel_queries_series_that_exist(dashboard: dict, known: set[str]):
    expressions = _expressions(dashboard["panels"])
    assert len(expressions) >= 20
    wrong = {(title, name) for title, expr in expressions
             for name in unknown_series(expr, known)}
    assert not wrong, f"panels query series nobody exports: {sorted(wrong)}"


def test_the_check_catches_a_series_that_does_not_exist(known: set[str]):
    assert unknown_series("rate(vllm:time_to_first_token_seconds_bucket[5m])", known) == []
    assert unknown_series("rate(fairsched:queue_wait_seconds_bucket[5m])", known) == []
    assert unknown_series("fairsched:policy_info", known) == []
    for wrong in ("vllm:gpu_cache_usage_perc",  # vLLM's V0 name
                  "vllm:num_requests_waiting_total",  # a gauge has no _total
                  "vllm:prompt_tokens_bucket",  # a counter has no buckets
                  "fairsched:queue_wait_seconds_total",
                  "fairsched:abandoned_requests",  # a counter is queried with _total
                  "fairsched:policy"):
        assert unknown_series(f"sum(rate({wrong}[5m]))", known) == [wrong]


def test_the_dashboard_shows_fairsched_beside_vllm(dashboard: dict):
    queried = {name for _title, expr in _expressions(dashboard["panels"])
               for name in SERIES.findall(expr)}
    assert {"vllm:time_to_first_token_seconds_bucket", "vllm:num_requests_waiting",
            "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
            "vllm:request_queue_time_seconds_bucket"} <= queried
    # Every exported fairsched series has a panel.
    assert {name.removesuffix("_bucket") for name in queried
            if name.startswith("fairsched:")} == set(METRIC_NAMES)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert "label_values(vllm:num_requests_running, model_name)" in json.dumps(
        variables["model_name"]["query"])
