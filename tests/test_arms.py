"""Benchmark arms and the bench command's shared plugin settings: what each arm starts."""

from __future__ import annotations

import argparse

import pytest

from fairsched_plugin.experiment.arms import STOCK, parse_arm, parse_arms
from fairsched_plugin.experiment.cases import SEED002_CATEGORIES, plugin_settings, workload_names
from fairsched_plugin.config import ConfigError

SCHEDULER = ("--scheduler-cls", "fairsched_plugin.FairScheduler")


def test_stock_runs_vllms_own_scheduler():
    (arm,) = parse_arms("stock")
    assert (arm.name, arm.engine_args, arm.env) == (STOCK, (), {})


def test_policy_parameters_become_section_variables():
    (arm,) = parse_arms("aging-spf:rate=50")
    assert arm.engine_args == SCHEDULER
    assert arm.env == {"FAIRSCHED_POLICY": "aging-spf", "FAIRSCHED_AGING_SPF_RATE": "50"}


def test_switches_and_shared_settings():
    settings = {"FAIRSCHED_PREDICTOR_PATH": "/m.onnx", "FAIRSCHED_LPRS_TARGET_MS": "30"}
    fcfs, combined = parse_arms("fcfs,aging+lprs+apc:alpha=75", settings)
    assert fcfs.env == {**settings, "FAIRSCHED_POLICY": "fcfs"}
    assert combined.env == {**settings, "FAIRSCHED_POLICY": "aging",
                            "FAIRSCHED_LPRS_ENABLED": "true", "FAIRSCHED_APC_ENABLED": "true",
                            "FAIRSCHED_AGING_ALPHA": "75"}


@pytest.mark.parametrize(
    "text, settings, needle",
    [
        ("fcfs+turbo", None, "unknown arm"),
        ("nope", None, "unknown arm"),
        ("fcfs:predictor.device=h1000", None, "predictor.device"),  # before any server starts
        ("fcfs,fcfs", None, "distinct"),
        ("stock,fcfs", {"FAIRSCHED_SERVICE": "ranked"}, "stock"),
        ("spf", {"FAIRSCHED_MAX_BATCH_SIZE": "0"}, "max_batch_size"),
    ],
)
def test_bad_arms_fail_before_anything_starts(text, settings, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_arms(text, settings)


def test_set_turns_dotted_keys_into_variables_and_resolves_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert plugin_settings(["lprs.target_ms=30", "predictor.path=m.onnx"], "ranked", 16) == {
        "FAIRSCHED_LPRS_TARGET_MS": "30",
        "FAIRSCHED_PREDICTOR_PATH": str(tmp_path / "m.onnx"),
        "FAIRSCHED_SERVICE": "ranked",
        "FAIRSCHED_MAX_BATCH_SIZE": "16",
    }
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        plugin_settings(["lprs"])


def test_workload_lists_and_the_seed002_suite():
    assert workload_names("seed002") == list(SEED002_CATEGORIES)
    assert workload_names("low_load, uniform") == ["low_load", "uniform"]
    for bad in ("nope", "uniform,uniform", ","):
        with pytest.raises(argparse.ArgumentTypeError):
            workload_names(bad)


def test_arm_parameters_may_be_top_level_or_dotted_config_keys():
    arm = parse_arm("fcfs:decodes_first=true")
    assert arm.env["FAIRSCHED_DECODES_FIRST"] == "true"
    dotted = parse_arm("guarded-srpf:slack=2:apc.min_chunk=32")
    assert dotted.env["FAIRSCHED_GUARDED_SRPF_SLACK"] == "2"
    assert dotted.env["FAIRSCHED_APC_MIN_CHUNK"] == "32"


def test_an_arm_can_turn_the_trace_off():
    arm = parse_arm("fcfs:trace_path=")
    assert arm.env["FAIRSCHED_TRACE_PATH"] == ""
