"""The launch-time config check and metrics wiring: vLLM's EngineArgs, in the API
server's process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from prometheus_client import generate_latest  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.v1.metrics.prometheus import get_prometheus_registry  # noqa: E402

from fairsched_plugin.config import ConfigError  # noqa: E402
from fairsched_plugin.metrics.recorder import MetricsRecorder  # noqa: E402
from fairsched_plugin.metrics.snapshot import snapshot_path, write_snapshot  # noqa: E402
from fairsched_plugin.config import uses_fairsched  # noqa: E402
from fairsched_plugin.plugin import register  # noqa: E402


def test_uses_fairsched(monkeypatch):
    monkeypatch.delenv("FAIRSCHED_POLICY", raising=False)
    assert uses_fairsched("fairsched_plugin.FairScheduler")
    assert not uses_fairsched("vllm.v1.core.sched.scheduler.Scheduler")
    assert not uses_fairsched(None)
    monkeypatch.setenv("FAIRSCHED_POLICY", "aging")
    assert uses_fairsched(None)


def test_a_bad_key_fails_when_the_engine_config_is_built(config_only_model, monkeypatch):
    monkeypatch.delenv("FAIRSCHED_POLICY", raising=False)
    register()
    args = EngineArgs(model=str(config_only_model), skip_tokenizer_init=True,
                      scheduler_cls="fairsched_plugin.FairScheduler",
                      additional_config={"fairsched": {"agin": {"alpha": 3}}})
    with pytest.raises(ConfigError, match="agin"):
        args.create_engine_config()
    # Another scheduler class: fairsched's keys are not its business.
    args.scheduler_cls = None
    args.create_engine_config()


def _render_with_a_snapshot(metrics_dir: Path, instance_id: str, model_name: str) -> str:
    """vLLM's /metrics registry rendered while an engine's snapshot (the recorder's own
    document) lies where this launch's engine 0 would write it."""
    path = snapshot_path(str(metrics_dir), instance_id, 0)
    header = {"engine": 0, "model_name": model_name,
              "policy": {"name": "fcfs", "description": "FCFS", "settings": {}}}
    write_snapshot(path, MetricsRecorder((128, 1024)).snapshot(
        0.0, time.time(), header, {}, False, None, False, None))
    try:
        return generate_latest(get_prometheus_registry()).decode()
    finally:
        # The collector stays registered for the rest of the session: leave it nothing.
        path.unlink()


def test_a_fairsched_launch_serves_its_series_on_vllms_registry(config_only_model, tmp_path,
                                                                monkeypatch):
    monkeypatch.delenv("FAIRSCHED_POLICY", raising=False)
    register()
    args = EngineArgs(model=str(config_only_model), skip_tokenizer_init=True,
                      scheduler_cls="fairsched_plugin.FairScheduler",
                      additional_config={"fairsched": {"metrics": {"dir": str(tmp_path)}}})
    vllm_config = args.create_engine_config()
    text = _render_with_a_snapshot(tmp_path, vllm_config.instance_id, "fairsched-launch")
    assert 'fairsched:scheduler_steps_total{engine="0",model_name="fairsched-launch"} 0.0' in text


@pytest.mark.parametrize("launch", ["stock vLLM", "metrics off"])
def test_other_launches_register_nothing(config_only_model, tmp_path, monkeypatch, launch):
    """The metrics folder is set in the environment too, so a collector registered by
    mistake would find the snapshot."""
    monkeypatch.delenv("FAIRSCHED_POLICY", raising=False)
    monkeypatch.setenv("FAIRSCHED_METRICS_DIR", str(tmp_path))
    register()
    args = EngineArgs(model=str(config_only_model), skip_tokenizer_init=True)
    if launch == "metrics off":
        args.scheduler_cls = "fairsched_plugin.FairScheduler"
        args.additional_config = {"fairsched": {"metrics": {"enabled": False}}}
    vllm_config = args.create_engine_config()
    text = _render_with_a_snapshot(tmp_path, vllm_config.instance_id, "other-launch")
    assert 'model_name="other-launch"' not in text
