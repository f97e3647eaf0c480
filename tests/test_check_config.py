"""``fairsched check-config``: the real command in a subprocess, its messages compared with
the ones start-up's own functions raise for the same input, and vLLM never imported."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fairsched_plugin.adapter.ascend import check_ascend_scheduler_settings
from fairsched_plugin.check_config import EXIT_OK, EXIT_REFUSED, EXIT_UNREADABLE
from fairsched_plugin.config import (KEYS, ConfigError, FairschedConfig, load_config,
                                     resolve_auto_switches)
from fairsched_plugin.predictor.profiling import ProfileError, ProfileWriter
from fairsched_plugin.predictor.runtime import LatencyPredictor, PredictorError

IMPORT_TIME = "import time:"


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    """Without ``-X importtime``'s lines."""
    modules: set[str] = field(repr=False)
    """Every module the command imported."""


def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Result:
    """``python -X importtime -m fairsched_plugin.cli check-config ARGS`` with no
    ``FAIRSCHED_*`` variable but those in ``env``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FAIRSCHED_")}
    environ.update(env or {})
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fairsched_plugin.cli", "check-config",
         *args],
        capture_output=True, text=True, env=environ, cwd=cwd, timeout=120)
    lines = done.stderr.splitlines(keepends=True)
    modules = {line.rsplit("|", 1)[1].strip() for line in lines
               if line.startswith(IMPORT_TIME)}
    stderr = "".join(line for line in lines if not line.startswith(IMPORT_TIME))
    result = Result(done.returncode, done.stdout, stderr, modules)
    engine = sorted(m for m in modules if m.split(".")[0] in ("vllm", "torch"))
    assert not engine, f"check-config imported {engine[:5]}"
    return result


def startup_message(additional: dict | None = None, **environ: str) -> str:
    """What start-up's configuration check raises for this input."""
    with pytest.raises(ConfigError) as caught:
        load_config(additional, environ)
    return str(caught.value)


def refused(result: Result, expected: str) -> None:
    assert result.returncode == EXIT_REFUSED, result
    assert result.stderr == expected + "\n"
    assert result.stdout == ""


def setting_lines(result: Result) -> list[str]:
    """The report's ``key = value (source)`` lines, spaces collapsed."""
    return [" ".join(line.split()) for line in result.stdout.splitlines()
            if line.startswith("  ") and " = " in line]


def test_a_good_config_prints_the_policy_and_every_changed_key():
    additional = {"fairsched": {"policy": "aging", "aging": {"alpha": 2},
                                "lprs.target_ms": 30}}
    result = run("--additional-config", json.dumps(additional))
    assert result.returncode == EXIT_OK, result
    assert setting_lines(result) == [
        "policy = aging (--additional-config)",
        "aging.alpha = 2 (--additional-config)",
        "lprs.target_ms = 30 (--additional-config)",
    ]
    config = load_config(additional, {})
    assert (config.policy, config.aging.alpha, config.lprs.target_ms) == ("aging", 2, 30)


def test_no_input_is_the_defaults():
    result = run()
    assert result.returncode == EXIT_OK, result
    assert setting_lines(result) == [
        f"policy = {load_config(None, {}).policy} (default)"]


def test_unknown_key():
    additional = {"fairsched": {"agin": {"alpha": 3}}}
    refused(run("--additional-config", json.dumps(additional)), startup_message(additional))


def test_a_near_miss_gets_the_key_it_meant_in_a_short_message():
    additional = {"fairsched": {"lprs": {"targt_ms": 30}}}
    result = run("--additional-config", json.dumps(additional))
    refused(result, startup_message(additional))
    assert "unknown key 'lprs.targt_ms'" in result.stderr
    assert "did you mean 'lprs.target_ms'?" in result.stderr
    assert len(result.stderr.splitlines()) < 5


def test_an_unknown_key_with_no_close_match_says_where_the_list_is():
    additional = {"fairsched": {"zzz_unrelated": 1}}
    result = run("--additional-config", json.dumps(additional))
    refused(result, startup_message(additional))
    assert "did you mean" not in result.stderr
    assert "docs/configuration.md" in result.stderr
    assert "fairsched check-config --list-keys" in result.stderr
    assert len(result.stderr.splitlines()) < 5


def test_list_keys_prints_every_key_and_variable():
    result = run("--list-keys")
    assert result.returncode == EXIT_OK, result
    assert result.stderr == ""
    for key in KEYS:
        assert f"  {key.path} ({key.env_name}): " in result.stdout
    assert "FAIRSCHED_CONFIG: " in result.stdout
    assert "FAIRSCHED_STRICT_VLLM: " in result.stdout


def test_wrong_type():
    additional = {"fairsched": {"aging": {"alpha": "fast"}}}
    refused(run("--additional-config", json.dumps(additional)), startup_message(additional))


def test_out_of_range():
    additional = {"fairsched": {"decode_share": 1.5}}
    refused(run("--additional-config", json.dumps(additional)), startup_message(additional))


def test_a_rule_between_keys():
    additional = {"fairsched": {"decode_share_max_tpot_ms": 100}}
    refused(run("--additional-config", json.dumps(additional)), startup_message(additional))


def test_environment_input_and_its_precedence():
    env = {"FAIRSCHED_POLICY": "aging", "FAIRSCHED_AGING_ALPHA": "2",
           "FAIRSCHED_CONFIG": json.dumps({"aging": {"beta": -2, "alpha": 5}})}
    additional = {"fairsched": {"aging": {"auto_factor": 0.5}}}
    result = run("--additional-config", json.dumps(additional), env=env)
    assert result.returncode == EXIT_OK, result
    assert setting_lines(result) == [
        "policy = aging (FAIRSCHED_POLICY)",
        "aging.alpha = 2 (FAIRSCHED_AGING_ALPHA)",
        "aging.beta = -2 (FAIRSCHED_CONFIG)",
        "aging.auto_factor = 0.5 (--additional-config)",
    ]


def test_bad_environment_variable():
    env = {"FAIRSCHED_AGING_ALPHA": "abc"}
    refused(run(env=env), startup_message(None, **env))
    env = {"FAIRSCHED_AGNG_ALPHA": "2"}
    result = run(env=env)
    refused(result, startup_message(None, **env))
    assert "did you mean FAIRSCHED_AGING_ALPHA?" in result.stderr


def test_file_input(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"fairsched": {"policy": "hrrn"}}))
    result = run("--file", str(good))
    assert result.returncode == EXIT_OK, result
    assert setting_lines(result) == [f"policy = hrrn (--file {good})"]
    bad = tmp_path / "bad.json"
    additional = {"fairsched": {"guarded_srpf": {"slack": 0}}}
    bad.write_text(json.dumps(additional))
    refused(run("--file", str(bad)), startup_message(additional))


def test_bad_json_and_a_missing_file_name_the_problem(tmp_path):
    result = run("--additional-config", '{"fairsched": {"policy": "aging"}')
    assert result.returncode == EXIT_UNREADABLE
    assert result.stderr.startswith("fairsched check-config: --additional-config is not "
                                    "valid JSON (")
    result = run("--additional-config", '["fairsched"]')
    assert result.returncode == EXIT_UNREADABLE
    assert "--additional-config must hold a JSON object" in result.stderr
    missing = tmp_path / "missing.json"
    result = run("--file", str(missing))
    assert result.returncode == EXIT_UNREADABLE
    assert result.stderr == f"fairsched check-config: --file {missing}: no such file\n"
    broken = tmp_path / "broken.json"
    broken.write_text("{fairsched: 1}")
    result = run("--file", str(broken))
    assert result.returncode == EXIT_UNREADABLE
    assert result.stderr.startswith(f"fairsched check-config: --file {broken} is not valid "
                                    "JSON (")


def test_bad_fairsched_config_variable_is_start_ups_error(tmp_path):
    env = {"FAIRSCHED_CONFIG": str(tmp_path / "nowhere.json")}
    refused(run(env=env), startup_message(None, **env))


def misplaced(result: Result, key: str, corrected: dict) -> None:
    """Refused for ``key`` outside the ``fairsched`` object, with the JSON to use."""
    assert result.returncode == EXIT_REFUSED, result
    assert result.stdout == ""
    assert f"outside its 'fairsched' object: {key!r}." in result.stderr
    assert f"put them under it: {json.dumps(corrected)}\n" in result.stderr
    assert len(result.stderr.splitlines()) == 2


def test_fairsched_keys_without_the_fairsched_object_are_refused():
    result = run("--additional-config", json.dumps({"policy": "aging"}))
    misplaced(result, "policy", {"fairsched": {"policy": "aging"}})


def test_a_section_outside_the_fairsched_object_is_refused_with_other_keys_kept():
    additional = {"lprs": {"target_ms": 30}, "fairsched": {"policy": "aging"},
                  "ascend_scheduler_config": {"enabled": False}}
    result = run("--additional-config", json.dumps(additional))
    misplaced(result, "lprs", {"ascend_scheduler_config": {"enabled": False},
                               "fairsched": {"policy": "aging", "lprs": {"target_ms": 30}}})


@pytest.mark.parametrize("additional", [
    {"fairsched_policy": "aging"}, {"FAIRSCHED": {"policy": "aging"}},
    {"fairsched.policy": "aging"}, {"Fairsched": {"policy": "aging"}},
], ids=lambda additional: next(iter(additional)))
def test_keys_spelt_like_fairsched_are_refused(additional):
    result = run("--additional-config", json.dumps(additional))
    misplaced(result, next(iter(additional)), {"fairsched": {"policy": "aging"}})


def test_a_misplaced_key_in_a_file_names_the_file(tmp_path):
    path = tmp_path / "fairsched.json"
    path.write_text(json.dumps({"policy": "aging"}))
    result = run("--file", str(path))
    assert result.returncode == EXIT_REFUSED, result
    assert result.stderr.startswith(f"fairsched: --file {path} has fairsched settings")


def test_other_components_keys_beside_the_fairsched_object_are_accepted():
    additional = {"fairsched": {"policy": "aging"},
                  "ascend_scheduler_config": {"enabled": False},
                  "torchair_graph_config": {"enabled": True, "graph_batch_sizes": [24]},
                  "enable_weight_nz_layout": True, "refresh": True}
    result = run("--additional-config", json.dumps(additional))
    assert result.returncode == EXIT_OK, result
    assert result.stderr == ""
    assert setting_lines(result) == ["policy = aging (--additional-config)"]


def test_start_up_warns_with_the_message_check_config_refuses_with(caplog):
    """Start-up keeps running (a deployment must not stop on an upgrade) without the
    misplaced keys, and says so in the words check-config uses."""
    additional = {"policy": "aging", "ascend_scheduler_config": {"enabled": False}}
    with caplog.at_level(logging.WARNING, logger="vllm.fairsched"):
        config = load_config(additional, {})
    assert config == resolve_auto_switches(FairschedConfig())
    warnings = [r for r in caplog.records
                if r.name == "vllm.fairsched" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "'policy'" in message
    assert json.dumps({"ascend_scheduler_config": {"enabled": False},
                       "fairsched": {"policy": "aging"}}) in message
    result = run("--additional-config", json.dumps(additional))
    assert result.stderr.splitlines()[0] == message


def test_vllm_ascend_scheduler_setting():
    additional = {"fairsched": {"policy": "aging"},
                  "scheduler_config": {"recompute_scheduler_enable": True}}
    with pytest.raises(ConfigError) as caught:
        check_ascend_scheduler_settings(additional)
    refused(run("--additional-config", json.dumps(additional)), str(caught.value))


def lprs(path: Path, **predictor: object) -> dict:
    return {"fairsched": {"lprs": {"enabled": True},
                          "predictor": {"path": str(path), **predictor}}}


def test_missing_latency_model(tmp_path):
    pytest.importorskip("onnxruntime")
    additional = lprs(tmp_path / "absent.onnx")
    config = load_config(additional, {})
    with pytest.raises(PredictorError) as caught:
        LatencyPredictor.from_config(config.predictor, None)
    refused(run("--additional-config", json.dumps(additional)), str(caught.value))


def test_latency_model_that_is_not_onnx(tmp_path):
    pytest.importorskip("onnxruntime")
    path = tmp_path / "model.onnx"
    path.write_text("not a model")
    additional = lprs(path)
    with pytest.raises(PredictorError) as caught:
        LatencyPredictor.from_config(load_config(additional, {}).predictor, None)
    refused(run("--additional-config", json.dumps(additional)), str(caught.value))


def test_a_good_latency_model_and_a_memory_provider_mismatch(tmp_path):
    pytest.importorskip("onnx")
    from linear_onnx import write_linear_model

    path = write_linear_model(tmp_path / "model.onnx", 5.0, 0.01, memory_provider="kv_cache")
    result = run("--additional-config", json.dumps(lprs(path)))
    assert result.returncode == EXIT_OK, result
    assert (f"latency model {path}: loads on CPUExecutionProvider, trained with memory "
            "provider 'kv_cache'") in result.stdout
    # An explicit memory provider is compared with the model's, as start-up does.
    additional = lprs(path)
    additional["fairsched"]["profile"] = {"memory": "nvml"}
    with pytest.raises(PredictorError) as caught:
        LatencyPredictor.from_config(load_config(additional, {}).predictor, "nvml")
    refused(run("--additional-config", json.dumps(additional)), str(caught.value))


def test_a_profile_that_cannot_be_appended_to(tmp_path):
    path = tmp_path / "profile.csv"
    path.write_text("step,something_else\n1,2\n")
    with pytest.raises(ProfileError) as caught:
        ProfileWriter(path, "kv_cache", {})
    additional = {"fairsched": {"profile": {"path": str(path)}}}
    refused(run("--additional-config", json.dumps(additional)), str(caught.value))
