"""The API server's side of the ``fairsched:`` metrics: the collector behind ``/metrics``
and the ``GET /fairsched`` live view, read from snapshot files written here by hand in
the format ``metrics.snapshot`` describes (two engines of one launch).

The collector is registered in a fresh ``prometheus_client`` registry and scraped as
Prometheus would be (rendered, then parsed). The live view runs in a real FastAPI app
with vLLM's arguments parsed by vLLM's own ``vllm serve`` parser; the engine client is a
stand-in that carries only ``vllm_config.instance_id``, the one thing the view reads from
it (a real ``VllmConfig`` needs a model, and the view never talks to the engine).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from prometheus_client.samples import Sample  # noqa: E402
from vllm.plugins.endpoint_plugins.interface import (  # noqa: E402
    attach_endpoint_plugins,
    init_endpoint_plugins_state,
)

from fairsched_plugin.metrics.exporter import METRIC_NAMES, register_collector  # noqa: E402
from fairsched_plugin.metrics.live_view import LiveView  # noqa: E402
from fairsched_plugin.metrics.snapshot import snapshot_path, write_snapshot  # noqa: E402

INSTANCE = "launch-1"
AGE_S = 5.0
ENGINE_CLIENT = SimpleNamespace(vllm_config=SimpleNamespace(instance_id=INSTANCE))
"""The stand-in engine client (see the module docstring)."""
FAIRSCHED = ("--scheduler-cls", "fairsched_plugin.FairScheduler")


@pytest.fixture(autouse=True)
def _no_fairsched_environment(monkeypatch):
    for name in list(os.environ):
        if name.startswith("FAIRSCHED_"):
            monkeypatch.delenv(name)


def _document(engine: int, **sections: object) -> dict:
    return {
        "version": 1, "time": time.time() - AGE_S, "engine": engine, "model_name": "tiny",
        "policy": {"name": "fcfs", "description": "FCFS", "settings": {}},
        "class_edges": [128, 1024],
        "wait_buckets": [0.1, 1.0, 10.0], "lateness_buckets": [0.5, 5.0],
        "error_buckets": [0.1, 1.0],
        "queue_wait": [], "abandoned": [], "reordered": 0, "failures": {},
        "queue": {klass: {"waiting": 0, "oldest_wait_s": 0.0}
                  for klass in ("short", "medium", "long")},
        "steps": 0,
        **sections,
    }


def _full() -> dict:
    """Engine 0: a guarded Aging policy with LPRS and APC, so every section is there."""
    return _document(
        0,
        policy={"name": "guarded-aging", "description": "Guarded Aging (alpha auto)",
                "settings": {"policy": "guarded-aging", "apc.enabled": "True"}},
        queue_wait=[{"class": "short", "tier": "0", "counts": [1, 2, 0, 3], "sum": 40.5},
                    {"class": "long", "tier": "1", "counts": [0, 0, 1, 0], "sum": 4.0}],
        abandoned=[{"class": "medium", "tier": "0", "count": 2}],
        reordered=3,
        overdue={"count": 2, "counts": [1, 1, 0], "sum": 1.5},
        alpha=250.0,
        tail_watch={"gain": 0.5, "step_backs": 3, "tail_ratio": 1.08},
        lprs={"falling_back": True, "fallback_steps": {"predictor_error": 1, "guard": 4},
              "error": {"counts": [5, 2, 1], "sum": 3.0}, "target_ms": 50.0,
              "bias_ms": 2.5, "model": "roofline of qwen3-8b on H100 SXM"},
        apc={"admitted": 7, "deferred": 2},
        failures={"the metrics": 1},
        queue={"short": {"waiting": 2, "prompt_tokens": 180, "oldest_wait_s": 1.5},
               "medium": {"waiting": 0, "oldest_wait_s": 0.0},
               "long": {"waiting": 0, "oldest_wait_s": 0.0}},
        steps=42,
    )


def _plain() -> dict:
    """Engine 1: FCFS, no guard, LPRS or APC; Aging's alpha not calibrated yet."""
    return _document(1, alpha=None, queue_wait=[
        {"class": "long", "tier": "0", "counts": [0, 1, 0, 0], "sum": 0.5}],
        queue={"short": {"waiting": 0, "oldest_wait_s": 0.0},
               "medium": {"waiting": 0, "oldest_wait_s": 0.0},
               "long": {"waiting": 1, "prompt_tokens": 3000, "oldest_wait_s": 0.25}},
        steps=7)


def _write(base: Path, *documents: dict) -> None:
    for document in documents:
        write_snapshot(snapshot_path(str(base), INSTANCE, document["engine"]), document)


def _registered(base: Path) -> CollectorRegistry:
    registry = CollectorRegistry()
    register_collector(SimpleNamespace(instance_id=INSTANCE), str(base), registry=registry)
    return registry


def _scrape(registry: CollectorRegistry) -> dict[str, list]:
    """Family name -> the parsed families (a name twice means a duplicated family)."""
    families: dict[str, list] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        families.setdefault(family.name, []).append(family)
    return families


def _samples(families: dict[str, list], name: str, **labels: str) -> list[Sample]:
    return [sample for group in families.values() for family in group
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()]


def _value(families: dict[str, list], name: str, **labels: str) -> float:
    (sample,) = _samples(families, name, **labels)
    return sample.value


def test_a_full_snapshot_exports_exactly_the_metric_names(tmp_path):
    _write(tmp_path, _full())
    families = _scrape(_registered(tmp_path))
    exposed = {family.name if family.type == "histogram" else sample.name
               for group in families.values() for family in group
               for sample in family.samples}
    assert exposed == set(METRIC_NAMES)


def test_the_guard_gain_and_its_step_backs_are_exported(tmp_path):
    _write(tmp_path, _full(), _plain())
    families = _scrape(_registered(tmp_path))
    assert _value(families, "fairsched:guard_gain", engine="0") == 0.5
    assert _value(families, "fairsched:guard_step_backs_total", engine="0") == 3
    assert not _samples(families, "fairsched:guard_gain", engine="1")  # no watch there


def test_bucket_counts_become_cumulative(tmp_path):
    _write(tmp_path, _full())
    families = _scrape(_registered(tmp_path))
    wait = "fairsched:queue_wait_seconds"
    short = {"engine": "0", "class": "short", "tier": "0"}
    buckets = {s.labels["le"]: s.value for s in _samples(families, wait + "_bucket", **short)}
    assert buckets == {"0.1": 1, "1.0": 3, "10.0": 3, "+Inf": 6}
    assert _value(families, wait + "_count", **short) == 6
    assert _value(families, wait + "_sum", **short) == 40.5
    lateness = {s.labels["le"]: s.value
                for s in _samples(families, "fairsched:overdue_lateness_seconds_bucket")}
    assert lateness == {"0.5": 1, "5.0": 2, "+Inf": 2}
    error = "fairsched:lprs_prediction_relative_error"
    assert _value(families, error + "_bucket", le="1.0") == 7
    assert _value(families, error + "_count") == 8


def test_counts_and_gauges_per_engine(tmp_path):
    _write(tmp_path, _full(), _plain())
    families = _scrape(_registered(tmp_path))
    for sample in _samples(families, "fairsched:scheduler_steps_total"):
        assert sample.labels.keys() == {"model_name", "engine"}
    assert _value(families, "fairsched:scheduler_steps_total", engine="0") == 42
    assert _value(families, "fairsched:scheduler_steps_total", engine="1") == 7
    assert _value(families, "fairsched:abandoned_requests_total", engine="0",
                  model_name="tiny", **{"class": "medium", "tier": "0"}) == 2
    assert _value(families, "fairsched:reordered_requests_total", engine="0") == 3
    assert _value(families, "fairsched:overdue_requests_total", engine="0") == 2
    assert _value(families, "fairsched:aging_alpha", engine="0") == 250
    assert _value(families, "fairsched:lprs_fallback_steps_total", reason="guard") == 4
    assert _value(families, "fairsched:lprs_falling_back", engine="0") == 1
    assert _value(families, "fairsched:lprs_bias_seconds", engine="0") == 0.0025
    model = next(s for s in _samples(families, "fairsched:lprs_model_info")
                 if s.labels["engine"] == "0")
    assert model.labels["source"] == "roofline of qwen3-8b on H100 SXM"
    assert _value(families, "fairsched:apc_decisions_total", outcome="admitted") == 7
    assert _value(families, "fairsched:plugin_failures_total", place="the metrics") == 1
    # Every class of every engine, the empty ones at 0; a waiting class's oldest wait
    # has grown by the snapshot's age.
    waiting = {(s.labels["engine"], s.labels["class"]): s.value
               for s in _samples(families, "fairsched:waiting_requests")}
    assert waiting == {("0", "short"): 2, ("0", "medium"): 0, ("0", "long"): 0,
                       ("1", "short"): 0, ("1", "medium"): 0, ("1", "long"): 1}
    work = {(s.labels["engine"], s.labels["class"]): s.value
            for s in _samples(families, "fairsched:waiting_prompt_tokens")}
    assert work == {("0", "short"): 180, ("0", "medium"): 0, ("0", "long"): 0,
                    ("1", "short"): 0, ("1", "medium"): 0, ("1", "long"): 3000}
    oldest = {(s.labels["engine"], s.labels["class"]): s.value
              for s in _samples(families, "fairsched:oldest_wait_seconds")}
    assert 1.5 + AGE_S <= oldest["0", "short"] < 1.5 + AGE_S + 60
    assert 0.25 + AGE_S <= oldest["1", "long"] < 0.25 + AGE_S + 60
    assert oldest["0", "medium"] == oldest["1", "short"] == 0
    age = _value(families, "fairsched:snapshot_age_seconds", engine="1")
    assert AGE_S <= age < AGE_S + 60


def test_the_policy_is_an_info_series(tmp_path):
    _write(tmp_path, _full(), _plain())
    families = _scrape(_registered(tmp_path))
    info = {s.labels["engine"]: s for s in _samples(families, "fairsched:policy_info")}
    assert info["0"].value == 1
    assert info["0"].labels == {
        "model_name": "tiny", "engine": "0", "policy": "guarded-aging",
        "description": "Guarded Aging (alpha auto)",
        "settings": '{"apc.enabled":"True","policy":"guarded-aging"}'}
    assert info["1"].labels["settings"] == "{}"


def test_absent_sections_give_no_series(tmp_path):
    _write(tmp_path, _plain())
    families = _scrape(_registered(tmp_path))
    for absent in ("fairsched:overdue_requests", "fairsched:overdue_lateness_seconds",
                   "fairsched:aging_alpha", "fairsched:lprs_fallback_steps",
                   "fairsched:lprs_falling_back", "fairsched:lprs_prediction_relative_error",
                   "fairsched:lprs_bias_seconds", "fairsched:lprs_model",
                   "fairsched:apc_decisions"):
        assert absent not in families
    # Always there, if empty: the names exist from an engine's first snapshot.
    assert families["fairsched:plugin_failures"][0].samples == []
    assert families["fairsched:abandoned_requests"][0].samples == []


def test_a_section_one_engine_lacks_has_only_the_other_s_series(tmp_path):
    _write(tmp_path, _full(), _plain())
    families = _scrape(_registered(tmp_path))
    for name in ("fairsched:aging_alpha", "fairsched:lprs_falling_back",
                 "fairsched:overdue_requests_total"):
        assert {s.labels["engine"] for s in _samples(families, name)} == {"0"}


def test_no_snapshot_yet_no_series(tmp_path):
    assert not any(name.startswith("fairsched:") for name in _scrape(_registered(tmp_path)))


def test_unreadable_and_malformed_files_are_skipped(tmp_path, caplog):
    _write(tmp_path, _full(), _plain())
    snapshot_path(str(tmp_path), INSTANCE, 2).write_text("{not json")
    broken = _document(3, queue_wait=[{"class": "short", "tier": "0", "counts": [1],
                                       "sum": 0.0}])
    _write(tmp_path, broken)
    families = _scrape(_registered(tmp_path))
    engines = {s.labels["engine"] for s in _samples(families, "fairsched:scheduler_steps_total")}
    assert engines == {"0", "1"}
    assert "skipping engine 3" in caplog.text


def test_registering_a_launch_again_replaces_its_collector(tmp_path):
    _write(tmp_path, _full(), _plain())
    registry = _registered(tmp_path)
    register_collector(SimpleNamespace(instance_id=INSTANCE), str(tmp_path), registry=registry)
    register_collector(SimpleNamespace(instance_id="another-launch"), str(tmp_path),
                       registry=registry)
    families = _scrape(registry)
    assert len(families["fairsched:scheduler_steps"]) == 1
    assert len(_samples(families, "fairsched:scheduler_steps_total")) == 2


# GET /fairsched


@pytest.fixture(scope="module")
def serve_parser():
    """``vllm serve``'s own argument parser: the Namespace vLLM hands to ``init_state``."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def _serve_args(serve_parser, *flags: str) -> Namespace:
    return serve_parser.parse_args(["--model", "tiny", *flags])


def _client(args: Namespace, engine_client: object = ENGINE_CLIENT) -> TestClient:
    app = FastAPI()
    plugin = LiveView()
    plugin.attach_router(app)
    asyncio.run(plugin.init_state(engine_client, app.state, args))
    return TestClient(app)


def _live_view_on(base: Path) -> str:
    return json.dumps({"fairsched": {"metrics": {"live_view": True, "dir": str(base)}}})


def test_the_additional_config_arrives_as_a_dict(serve_parser):
    """vLLM's CLI parses ``--additional-config`` (JSON, or dotted flags) into a dict."""
    expected = {"fairsched": {"metrics": {"live_view": True}}}
    assert _serve_args(serve_parser, "--additional-config",
                       '{"fairsched": {"metrics": {"live_view": true}}}'
                       ).additional_config == expected
    assert _serve_args(serve_parser, "--additional-config.fairsched.metrics.live_view",
                       "true").additional_config == expected
    assert _serve_args(serve_parser).additional_config == {}


def test_off_by_default_with_how_to_turn_it_on(serve_parser, tmp_path):
    _write(tmp_path, _full())
    response = _client(_serve_args(serve_parser, *FAIRSCHED)).get("/fairsched")
    assert response.status_code == 404
    body = response.json()
    assert body["enabled"] is False
    for hint in ('"live_view": true', "FAIRSCHED_METRICS_LIVE_VIEW=1", "VLLM_PLUGINS"):
        assert hint in body["error"]


@pytest.mark.parametrize("case", ["render-only server", "stock scheduler", "metrics off"])
def test_not_found_without_a_fairsched_engine(serve_parser, tmp_path, case):
    _write(tmp_path, _full())
    on = ("--additional-config", _live_view_on(tmp_path))
    if case == "render-only server":
        client = _client(_serve_args(serve_parser, *FAIRSCHED, *on), engine_client=None)
    elif case == "stock scheduler":
        client = _client(_serve_args(serve_parser, *on))
    else:
        client = _client(_serve_args(serve_parser, *FAIRSCHED, "--additional-config", json.dumps(
            {"fairsched": {"metrics": {"live_view": True, "enabled": False,
                                       "dir": str(tmp_path)}}})))
    response = client.get("/fairsched")
    assert response.status_code == 404
    assert response.json()["enabled"] is False


def test_the_engines_as_json(serve_parser, tmp_path):
    _write(tmp_path, _full(), _plain())
    client = _client(_serve_args(serve_parser, *FAIRSCHED, "--additional-config",
                                 _live_view_on(tmp_path)))
    response = client.get("/fairsched")
    assert response.status_code == 200
    body = response.json()
    assert body["enabled"] is True
    full, plain = body["engines"]
    assert (full["engine"], full["model_name"], full["policy"]) == (0, "tiny", "guarded-aging")
    assert full["description"] == "Guarded Aging (alpha auto)"
    assert full["settings"] == {"policy": "guarded-aging", "apc.enabled": "True"}
    assert AGE_S <= full["snapshot_age_s"] < AGE_S + 60
    assert full["snapshot_time"] == pytest.approx(time.time() - full["snapshot_age_s"], abs=60)
    assert full["queue"]["short"]["waiting"] == 2
    assert 1.5 + AGE_S <= full["queue"]["short"]["oldest_wait_s"] < 1.5 + AGE_S + 60
    assert full["queue"]["long"] == {"waiting": 0, "prompt_tokens": 0, "oldest_wait_s": 0.0}
    assert full["queue"]["short"]["prompt_tokens"] == 180
    assert full["alpha"] == 250.0
    assert full["lprs"]["fallback_steps"] == {"predictor_error": 1, "guard": 4}
    assert full["failures"] == {"the metrics": 1}
    assert full["counts"] == {"scheduled": 7, "abandoned": 2, "reordered": 3, "overdue": 2}
    assert plain["alpha"] is None and plain["lprs"] is None
    assert plain["counts"] == {"scheduled": 1, "abandoned": 0, "reordered": 0,
                               "overdue": None}
    assert client.post("/fairsched").status_code == 405


def test_the_environment_turns_it_on(serve_parser, tmp_path, monkeypatch):
    _write(tmp_path, _plain())
    monkeypatch.setenv("FAIRSCHED_METRICS_LIVE_VIEW", "1")
    monkeypatch.setenv("FAIRSCHED_METRICS_DIR", str(tmp_path))
    response = _client(_serve_args(serve_parser, *FAIRSCHED)).get("/fairsched")
    assert response.status_code == 200
    assert [engine["engine"] for engine in response.json()["engines"]] == [1]


def test_vllm_loads_it_only_when_vllm_plugins_names_fairsched(serve_parser, tmp_path,
                                                              monkeypatch):
    """Through vLLM's own discovery and wiring of endpoint plugins (the entry point)."""
    _write(tmp_path, _full())
    args = _serve_args(serve_parser, *FAIRSCHED, "--additional-config", _live_view_on(tmp_path))
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    app = FastAPI()
    attach_endpoint_plugins(app, ("generate",))
    assert app.state.endpoint_plugins == []
    monkeypatch.setenv("VLLM_PLUGINS", "fairsched")
    app = FastAPI()
    attach_endpoint_plugins(app, ("generate",))
    assert [type(plugin) for plugin in app.state.endpoint_plugins] == [LiveView]
    asyncio.run(init_endpoint_plugins_state(ENGINE_CLIENT, app.state, args))
    response = TestClient(app).get("/fairsched")
    assert response.status_code == 200
    assert response.json()["engines"][0]["policy"] == "guarded-aging"
