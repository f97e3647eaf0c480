"""Shared fixtures. Anything that needs vLLM imports it lazily, so pure tests run without it."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def config_only_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A weightless model directory: enough for a scheduler driven by fake outputs."""
    from fairsched_plugin.adapter.offline import write_config_only_model

    return write_config_only_model(tmp_path_factory.mktemp("config-only-model"))
