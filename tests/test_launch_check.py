"""The launch-time config check: vLLM's EngineArgs, in the API server's process."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm.engine.arg_utils import EngineArgs  # noqa: E402

from fairsched_plugin.config import ConfigError  # noqa: E402
from fairsched_plugin.plugin import register, uses_fairsched  # noqa: E402


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
