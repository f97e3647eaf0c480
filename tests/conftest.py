"""Shared fixtures. Anything that needs vLLM imports it lazily, so pure tests run without it."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def config_only_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A weightless model directory: enough for a scheduler driven by fake outputs."""
    from fairsched_plugin.sim.fake_engine import write_config_only_model

    return write_config_only_model(tmp_path_factory.mktemp("config-only-model"))


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The project's tiny random-weight model, built once into .cache (deterministic)."""
    from fairsched_plugin.model.tiny import build_tiny_model

    return build_tiny_model(Path(__file__).resolve().parent.parent / ".cache" / "tiny-model")


DEGRADED = "this step runs as stock vLLM would"


@pytest.fixture(autouse=True)
def _no_silent_fallback(request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture):
    """A step whose plugin work raised runs as stock vLLM (adapter/scheduler.py), which
    could let a scheduler test pass on stock behaviour: fail any test where that
    happens, unless it is marked ``degrades``."""
    yield
    if request.node.get_closest_marker("degrades") is not None:
        return
    fallbacks = [r.getMessage() for r in caplog.records
                 if r.name == "vllm.fairsched" and DEGRADED in r.getMessage()]
    assert not fallbacks, f"the plugin fell back to stock vLLM: {fallbacks[0]}"
