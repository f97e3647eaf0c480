"""``load_config``: sources, precedence and every error path. Never reads os.environ:
each call passes ``environ=`` explicitly."""

from __future__ import annotations

import json
import logging
import math
import re

import pytest

from fairsched_plugin.config import (
    resolve_auto_switches,
    CONFIG_ENV,
    AgingConfig,
    ConfigError,
    KEYS,
    FairschedConfig,
    accepted_keys,
    load_config,
    misplaced_keys,
)
from fairsched_plugin.policies import (
    AgingPolicy,
    FCFSPolicy,
    GuardedSRPF,
    make_policy,
)

def _loaded(*args, **fields) -> FairschedConfig:
    """The config these fields load as: LPRS and APC's "auto" resolved for the policy."""
    return resolve_auto_switches(FairschedConfig(*args, **fields))


DEFAULTS = _loaded()
"""The defaults as loaded: LPRS and APC's "auto" resolved for the default policy."""


def load(additional=None, **env):
    return load_config(additional_config=additional, environ=env)


def fs(section):
    """The ``--additional-config`` dict for one ``fairsched`` section."""
    return {"fairsched": section}


# --------------------------------------------------------------------------- defaults


def test_defaults():
    config = load()
    assert config == _loaded(policy="guarded-srpf",
                                     aging=AgingConfig(alpha="auto", beta=-1.0))
    assert config.policy == "guarded-srpf"
    assert (config.guarded_srpf.slack, config.guarded_srpf.window_s,
            config.guarded_srpf.size_allowance) == (1.15, 0.0, 1.0)
    assert (config.guarded_aging.slack, config.guarded_aging.window_s,
            config.guarded_aging.auto_factor, config.guarded_aging.size_allowance) == (
        1.25, 0.0, 0.25, 0.0)
    assert config.decodes_first is False
    assert config.aging.alpha == "auto"
    assert config.aging.beta == -1.0


def test_defaults_with_empty_sources():
    assert load({}) == DEFAULTS
    assert load(fs({})) == DEFAULTS
    assert load({"other_plugin": {"x": 1}}) == DEFAULTS
    assert load(fs(None)) == DEFAULTS


def test_unrelated_environment_is_ignored():
    assert load(PATH="/usr/bin", VLLM_FOO="1", fairsched_policy="fcfs") == DEFAULTS


def test_explicit_environ_ignores_process_environment(monkeypatch):
    import os

    for name in [n for n in os.environ if n.startswith("FAIRSCHED_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("FAIRSCHED_POLICY", "fcfs")
    assert load_config(environ={}).policy == "guarded-srpf"
    # And without environ= it reads os.environ.
    assert load_config().policy == "fcfs"


def test_make_policy_from_config():
    assert isinstance(make_policy(load()), GuardedSRPF)
    policy = make_policy(load(fs({"policy": "aging"})))
    assert isinstance(policy, AgingPolicy)
    # Aging's default alpha is automatic: uncalibrated (arrival order) until measured.
    assert (policy.alpha, policy.beta) == (None, -1.0)
    assert isinstance(make_policy(load(fs({"policy": "fcfs"}))), FCFSPolicy)
    guarded = make_policy(load(FAIRSCHED_POLICY="guarded-srpf",
                               FAIRSCHED_GUARDED_SRPF_SLACK="2.5"))
    assert isinstance(guarded, GuardedSRPF) and guarded.guard.slack == 2.5
    aging = make_policy(load(fs({"policy": "aging", "aging": {"alpha": 2, "beta": -0.5}})))
    assert (aging.alpha, aging.beta) == (2.0, -0.5)


# --------------------------------------------------------------------------- additional-config


def test_additional_config_nested():
    config = load(fs({"policy": "fcfs", "aging": {"alpha": 5, "beta": -2.5}}))
    assert config == _loaded(policy="fcfs", aging=AgingConfig(alpha=5.0, beta=-2.5))
    assert isinstance(config.aging.alpha, float)


def test_additional_config_partial_section_keeps_other_defaults():
    config = load(fs({"aging": {"beta": -3}}))
    assert config.aging == AgingConfig(alpha="auto", beta=-3.0)
    assert config.policy == "guarded-srpf"


def test_policy_name_is_normalised():
    assert load(fs({"policy": "  FCFS "})).policy == "fcfs"
    assert load(FAIRSCHED_POLICY="Aging").policy == "aging"


# --------------------------------------------------------------------------- environment


def test_env_vars():
    config = load(FAIRSCHED_POLICY="fcfs", FAIRSCHED_AGING_ALPHA="12.5", FAIRSCHED_AGING_BETA="-2")
    assert config == _loaded(policy="fcfs", aging=AgingConfig(alpha=12.5, beta=-2.0))


def test_env_vars_numeric_forms():
    assert load(FAIRSCHED_AGING_ALPHA=" 1e3 ").aging.alpha == 1000.0
    assert load(FAIRSCHED_AGING_ALPHA="7").aging.alpha == 7.0


def test_fairsched_config_inline_json():
    config = load(FAIRSCHED_CONFIG='{"policy": "fcfs", "aging": {"alpha": 3}}')
    assert config == _loaded(policy="fcfs", aging=AgingConfig(alpha=3.0, beta=-1.0))


def test_fairsched_config_inline_json_with_whitespace():
    assert load(FAIRSCHED_CONFIG='  \n{"aging": {"beta": -4}}\n').aging.beta == -4.0


def test_fairsched_config_file(tmp_path):
    path = tmp_path / "fairsched.json"
    path.write_text(json.dumps({"policy": "fcfs", "aging": {"alpha": 9, "beta": -0.25}}))
    config = load(FAIRSCHED_CONFIG=str(path))
    assert config == _loaded(policy="fcfs", aging=AgingConfig(alpha=9.0, beta=-0.25))
    # Surrounding whitespace in the variable is tolerated.
    assert load(FAIRSCHED_CONFIG=f"  {path}  ") == config


# --------------------------------------------------------------------------- precedence


def test_precedence_defaults_lt_config_env_lt_vars_lt_additional_config(tmp_path):
    env = {
        CONFIG_ENV: '{"policy": "fcfs", "aging": {"alpha": 1, "beta": -1.5}}',
        "FAIRSCHED_AGING_ALPHA": "2",
        "FAIRSCHED_AGING_BETA": "-2.5",
    }
    # FAIRSCHED_CONFIG alone.
    only_json = load_config(environ={CONFIG_ENV: env[CONFIG_ENV]})
    assert only_json == _loaded("fcfs", aging=AgingConfig(1.0, -1.5))
    # Per-key variables override FAIRSCHED_CONFIG, key by key.
    assert load_config(environ=env) == _loaded("fcfs", aging=AgingConfig(2.0, -2.5))
    assert load_config(environ={**env, "FAIRSCHED_AGING_BETA": "-9"}).aging.beta == -9.0
    # --additional-config beats both, key by key; keys it does not name keep lower sources.
    config = load_config(fs({"aging": {"alpha": 3}}), environ=env)
    assert config == _loaded("fcfs", aging=AgingConfig(3.0, -2.5))
    config = load_config(fs({"policy": "aging"}), environ=env)
    assert config == _loaded("aging", aging=AgingConfig(2.0, -2.5))
    # Keys nobody sets keep their defaults.
    assert load_config(environ={"FAIRSCHED_AGING_BETA": "-3"}).aging.alpha == "auto"


def test_precedence_with_config_file(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"aging": {"alpha": 4}}')
    assert load_config(environ={CONFIG_ENV: str(path)}).aging.alpha == 4.0
    both = {CONFIG_ENV: str(path), "FAIRSCHED_AGING_ALPHA": "5"}
    assert load_config(environ=both).aging.alpha == 5.0


# --------------------------------------------------------------------------- errors


def _error(additional=None, **env) -> str:
    with pytest.raises(ConfigError) as info:
        load(additional, **env)
    assert isinstance(info.value, ValueError)  # ConfigError is a ValueError
    return str(info.value)


def _names_all_keys(message: str) -> None:
    for needle in ("policy", "FAIRSCHED_POLICY", "aging.alpha", "FAIRSCHED_AGING_ALPHA",
                   "aging.beta", "FAIRSCHED_AGING_BETA", "trace_path", "FAIRSCHED_TRACE_PATH",
                   "aging.auto_factor", "FAIRSCHED_AGING_AUTO_FACTOR"):
        assert needle in message, (needle, message)


def test_accepted_keys_lists_every_key():
    text = accepted_keys()
    _names_all_keys(text)
    assert "one of fcfs, aging, fifo, tier, spf, lpf, srtf, aging-spf, estf, af-lcb, guarded-srpf" in text
    assert len(text.splitlines()) == len(KEYS)


NO_CLOSE_NAME = ("no accepted name is close to it; the list is in docs/configuration.md "
                 "and from fairsched check-config --list-keys")


def test_unknown_key_top_level():
    message = _error(fs({"polcy": "fcfs"}))
    assert message == ("fairsched config: unknown key 'polcy' in --additional-config "
                       "'fairsched'; did you mean 'policy'?")


def test_unknown_key_nested():
    message = _error(fs({"aging": {"gamma": 1}}))
    assert message.endswith("unknown key 'aging.gamma' in --additional-config 'fairsched'; "
                            "did you mean 'aging.alpha'?")


def test_unknown_key_in_fairsched_config():
    message = _error(FAIRSCHED_CONFIG='{"aging": {"alhpa": 1}}')
    assert message == (f"fairsched config: unknown key 'aging.alhpa' in {CONFIG_ENV}; "
                       "did you mean 'aging.alpha'?")


@pytest.mark.parametrize(("section", "suggested"), [
    ({"agin": {"alpha": 3}}, "'aging'"),                      # a misspelt section
    ({"targt_ms": 30}, "'lprs.target_ms'"),                   # a key outside its section
    ({"apc": {"target_ms": 30}}, "'lprs.target_ms'"),         # under the wrong section
    ({"slak": 1}, "'guarded_aging.slack' or 'guarded_srpf.slack'"),  # in two sections
])
def test_unknown_key_suggests_by_the_whole_name_or_its_last_part(section, suggested):
    assert _error(fs(section)).endswith(f"; did you mean {suggested}?")


def test_unknown_key_with_nothing_close_points_at_the_list():
    message = _error(fs({"zzz_unrelated": 1}))
    assert message == ("fairsched config: unknown key 'zzz_unrelated' in --additional-config "
                       f"'fairsched'; {NO_CLOSE_NAME}")


def test_unknown_environment_variable():
    message = _error(FAIRSCHED_AGING_GAMMA="1")
    assert message == ("fairsched config: unknown environment variable FAIRSCHED_AGING_GAMMA; "
                       "did you mean FAIRSCHED_AGING_ALPHA?")
    # The variables that are not keys are suggested too.
    assert _error(FAIRSCHED_STRICT_VLM="1").endswith("did you mean FAIRSCHED_STRICT_VLLM?")
    # The shared prefix does not make every variable look close.
    assert _error(FAIRSCHED_FOO="1").endswith(f"FAIRSCHED_FOO; {NO_CLOSE_NAME}")


@pytest.mark.parametrize(
    ("value", "shown"),
    [(True, "True"), (False, "False"), ([1.0], "[1.0]"), ({"x": 1}, None), (None, "None"),
     ("fast", "'fast'"), ("", "''")],
)
def test_wrong_type_for_alpha_in_additional_config(value, shown):
    message = _error(fs({"aging": {"alpha": value}}))
    if shown is None:
        # A mapping where a number belongs: the path is not a section.
        assert "aging.alpha" in message
        return
    assert "aging.alpha from --additional-config 'fairsched'" in message
    assert "must be a finite number > 0" in message
    assert f"got {shown}" in message


@pytest.mark.parametrize("text", ["fast", "", "1,5", "0x10", "true"])
def test_non_numeric_env_var(text):
    message = _error(FAIRSCHED_AGING_ALPHA=text)
    assert "aging.alpha from FAIRSCHED_AGING_ALPHA must be a finite number > 0" in message
    assert f"got {text!r}" in message


def test_wrong_type_in_fairsched_config():
    message = _error(FAIRSCHED_CONFIG='{"aging": {"beta": "-1x"}}')
    assert "aging.beta from FAIRSCHED_CONFIG must be a finite number < 0" in message
    assert "got '-1x'" in message


@pytest.mark.parametrize("value", [1, True, ["fcfs"], None])
def test_wrong_type_for_policy(value):
    message = _error(fs({"policy": value}))
    assert "policy from --additional-config 'fairsched' must be one of fcfs, aging" in message
    assert f"got {value!r}" in message


@pytest.mark.parametrize(
    "value", [0, -0.0, -1, -1e-9, "0", math.nan, math.inf, "nan", "inf", "-inf"]
)
def test_alpha_out_of_range(value):
    if isinstance(value, str):
        message = _error(FAIRSCHED_AGING_ALPHA=value)
        assert "aging.alpha from FAIRSCHED_AGING_ALPHA" in message
    else:
        message = _error(fs({"aging": {"alpha": value}}))
        assert "aging.alpha from --additional-config 'fairsched'" in message
    assert "must be a finite number > 0" in message
    assert f"got {value!r}" in message


@pytest.mark.parametrize("value", [0, 0.0, 1, 1e-9, "0", "2.5", math.nan, -math.inf, "NaN"])
def test_beta_out_of_range(value):
    if isinstance(value, str):
        message = _error(FAIRSCHED_AGING_BETA=value)
        assert "aging.beta from FAIRSCHED_AGING_BETA" in message
    else:
        message = _error(fs({"aging": {"beta": value}}))
        assert "aging.beta from --additional-config 'fairsched'" in message
    assert "must be a finite number < 0" in message
    assert f"got {value!r}" in message


def test_json_nan_literal_rejected():
    message = _error(FAIRSCHED_CONFIG='{"aging": {"alpha": NaN}}')
    assert "aging.alpha from FAIRSCHED_CONFIG must be a finite number > 0" in message


@pytest.mark.parametrize(
    "source", ["additional", "env", "json"],
)
def test_unknown_policy(source):
    if source == "additional":
        message = _error(fs({"policy": "sjf"}))
        assert "from --additional-config 'fairsched'" in message
    elif source == "env":
        message = _error(FAIRSCHED_POLICY="sjf")
        assert "from FAIRSCHED_POLICY" in message
    else:
        message = _error(FAIRSCHED_CONFIG='{"policy": "sjf"}')
        assert "from FAIRSCHED_CONFIG" in message
    assert "policy" in message
    assert "must be one of fcfs, aging" in message
    assert "got 'sjf'; did you mean 'spf'?" in message


def test_a_name_with_no_close_choice_gets_no_suggestion():
    assert _error(fs({"policy": "round-robin"})).endswith("got 'round-robin'")
    assert _error(fs({"predictor": {"provider": "tensorrt"}})).endswith("got 'tensorrt'")


@pytest.mark.parametrize("section", ["aging", 5, ["policy", "fcfs"], True])
def test_non_object_additional_config_section(section):
    message = _error({"fairsched": section})
    assert "--additional-config 'fairsched' must be a JSON object" in message
    assert f"got {section!r}" in message


@pytest.mark.parametrize(
    "text", ['{"policy": ', '{"policy": fcfs}', "{'policy': 'fcfs'}", '{"policy": "fcfs",}'],
)
def test_bad_inline_json(text):
    message = _error(FAIRSCHED_CONFIG=text)
    assert message.startswith(f"{CONFIG_ENV}: not valid JSON")


def test_bad_json_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"policy": "fcfs"')
    message = _error(FAIRSCHED_CONFIG=str(path))
    assert message.startswith(f"{CONFIG_ENV}: not valid JSON")


@pytest.mark.parametrize("content", ["[1, 2]", '"fcfs"', "3", "null"])
def test_config_file_holding_a_non_object(tmp_path, content):
    path = tmp_path / "list.json"
    path.write_text(content)
    message = _error(FAIRSCHED_CONFIG=str(path))
    assert message.startswith(f"{CONFIG_ENV}: must hold a JSON object, got ")


def test_missing_config_file(tmp_path):
    missing = tmp_path / "nope" / "fairsched.json"
    message = _error(FAIRSCHED_CONFIG=str(missing))
    assert CONFIG_ENV in message
    assert "neither a JSON object nor a readable UTF-8 file" in message
    assert repr(str(missing)) in message


def test_config_env_pointing_at_a_directory(tmp_path):
    message = _error(FAIRSCHED_CONFIG=str(tmp_path))
    assert "neither a JSON object nor a readable UTF-8 file" in message


def test_inline_non_object_json_is_not_taken_for_json():
    # Only text starting with "{" is read inline; anything else is a path.
    message = _error(FAIRSCHED_CONFIG="[1, 2]")
    assert "neither a JSON object nor a readable UTF-8 file: '[1, 2]'" in message


def test_error_in_lower_source_is_not_masked_by_a_higher_one():
    # Every source is validated, even for keys a later source overrides.
    message = _error(fs({"aging": {"alpha": 2}}), FAIRSCHED_AGING_ALPHA="-1")
    assert "FAIRSCHED_AGING_ALPHA" in message


def test_huge_integer_alpha_raises_config_error():
    with pytest.raises(ConfigError, match=r"aging\.alpha"):
        load(FAIRSCHED_CONFIG='{"aging": {"alpha": 1' + "0" * 400 + "}}")


def test_config_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"policy": "fcfs\xe9"}')
    message = _error(FAIRSCHED_CONFIG=str(path))
    assert "neither a JSON object nor a readable UTF-8 file" in message


def test_section_given_as_a_scalar_names_the_section():
    message = _error(fs({"aging": 5}))
    assert message == "fairsched config: 'aging' in --additional-config 'fairsched' must be a JSON object"


def test_trace_path_keeps_its_case_and_policy_is_case_insensitive():
    config = load(FAIRSCHED_TRACE_PATH=" /Runs/Trace.JSONL ", FAIRSCHED_POLICY="FCFS")
    assert config.trace_path == "/Runs/Trace.JSONL"
    assert config.policy == "fcfs"


def test_example_config_file_is_valid():
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "examples" / "fairsched.json"
    config = load(FAIRSCHED_CONFIG=str(example))
    assert config.policy == "guarded-srpf" and config.guarded_srpf.slack == 1.15
    assert config.trace_path == "fairsched-trace.jsonl"


# --------------------------------------------------------------------------- new kinds


def test_int_and_bool_keys_from_env_and_json():
    config = load(fs({"max_batch_size": 8, "predictor": {"allow_memory_mismatch": True}}),
                  FAIRSCHED_ESTF_MIN_SAMPLES="3", FAIRSCHED_PREDICTOR_THREADS="2")
    assert (config.max_batch_size, config.estf.min_samples, config.predictor.threads) == (8, 3, 2)
    assert config.predictor.allow_memory_mismatch is True
    assert load(FAIRSCHED_PREDICTOR_ALLOW_MEMORY_MISMATCH="off").predictor.allow_memory_mismatch \
        is False


@pytest.mark.parametrize(
    "section, needle",
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_batch_size": 2.5}, "max_batch_size"),
        ({"max_batch_size": True}, "max_batch_size"),
        ({"service": "round-robin"}, "service"),
        ({"predictor": {"allow_memory_mismatch": "maybe"}}, "predictor.allow_memory_mismatch"),
        ({"predictor": {"provider": "tpu"}}, "predictor.provider"),
        ({"af_lcb": {"kv_threshold": 1.0}}, "af_lcb.kv_threshold"),
        ({"aging_spf": {"rate": 0}}, "aging_spf.rate"),
        ({"profile": {"memory": "gpu"}}, "profile.memory"),
    ],
)
def test_new_keys_reject_bad_values(section, needle):
    assert needle in _error(fs(section))


# --------------------------------------------------------------------------- LPRS guard


def test_lprs_guard_defaults_and_sources():
    lprs = load().lprs
    assert (lprs.guard_window, lprs.guard_max_error, lprs.guard_recover_error,
            lprs.guard_min_fill) == (16, 1.0, 0.5, 0.5)
    lprs = load(fs({"lprs": {"guard_window": 0, "guard_min_fill": 0}}),
                FAIRSCHED_LPRS_GUARD_MAX_ERROR="2", FAIRSCHED_LPRS_GUARD_RECOVER_ERROR="2").lprs
    assert (lprs.guard_window, lprs.guard_max_error, lprs.guard_recover_error,
            lprs.guard_min_fill) == (0, 2.0, 2.0, 0.0)


@pytest.mark.parametrize(("section", "message"), [
    ({"guard_window": -1}, "lprs.guard_window .* must be an integer >= 0"),
    ({"guard_window": 2.5}, "lprs.guard_window .* must be an integer >= 0"),
    ({"guard_max_error": 0}, "lprs.guard_max_error .* must be a finite number > 0"),
    ({"guard_recover_error": -0.5}, "lprs.guard_recover_error .* must be a finite number > 0"),
    ({"guard_min_fill": 1.5}, r"lprs.guard_min_fill .* must be a number in \[0, 1\]"),
    ({"guard_max_error": 0.4}, "lprs.guard_recover_error must be at most lprs.guard_max_error"),
])
def test_lprs_guard_values_are_checked(section, message):
    with pytest.raises(ConfigError, match=message):
        load(fs({"lprs": section}))


# ------------------------------------------------------- keys outside the fairsched object


@pytest.mark.parametrize(("additional", "inside"), [
    ({"policy": "aging"}, {"policy": "policy"}),
    ({"Policy": "aging"}, {"Policy": "policy"}),
    ({"lprs": {"target_ms": 30}}, {"lprs": "lprs"}),
    ({"lprs.target_ms": 30}, {"lprs.target_ms": "lprs.target_ms"}),
    ({"lprs_target_ms": 30}, {"lprs_target_ms": "lprs.target_ms"}),
    ({"FAIRSCHED": {"policy": "aging"}}, {"FAIRSCHED": ""}),
    ({"Fair_Sched": {"policy": "aging"}}, {"Fair_Sched": ""}),
    ({"fairsched_config": {"policy": "aging"}}, {"fairsched_config": ""}),
    ({"fairsched_policy": "aging"}, {"fairsched_policy": "policy"}),
    ({"fairsched.aging.alpha": 2}, {"fairsched.aging.alpha": "aging.alpha"}),
    ({"FAIRSCHED_AGING_ALPHA": 2}, {"FAIRSCHED_AGING_ALPHA": "aging.alpha"}),
    ({"fairsched_foo": 1}, {"fairsched_foo": "foo"}),
    ({"fairsched": {"policy": "aging"}, "policy": "hrrn"}, {"policy": "policy"}),
])
def test_fairsched_keys_outside_the_object_are_found(additional, inside):
    assert misplaced_keys(additional) == inside


@pytest.mark.parametrize("additional", [
    None, {}, fs({"policy": "aging"}),
    # vLLM-Ascend's own keys, and names that only start like fairsched's.
    {"ascend_scheduler_config": {"enabled": True}, "torchair_graph_config": {"enabled": True},
     "enable_weight_nz_layout": True, "refresh": True, "expert_map_path": "/m.json",
     "scheduler_config": {"recompute_scheduler_enable": False}, "kv_cache_dtype": "int8"},
    {"fairscheduler": 1, "policy_engine": {}, "aging_report": 1},
])
def test_other_components_keys_are_not_fairsched_keys(additional):
    assert misplaced_keys(additional) == {}


def test_start_up_warns_about_misplaced_keys_and_runs_without_them(caplog):
    with caplog.at_level(logging.WARNING, logger="vllm.fairsched"):
        config = load({"fairsched_policy": "aging", "lprs": {"target_ms": 30},
                       "fairsched": {"policy": "hrrn"}, "refresh": True})
    assert config == _loaded(policy="hrrn")
    [record] = [r for r in caplog.records if r.name == "vllm.fairsched"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "fairsched: --additional-config has fairsched settings outside its 'fairsched' "
        "object: 'fairsched_policy', 'lprs'. Start-up reads only that object and ignores "
        "them; put them under it: "
        + json.dumps({"refresh": True, "fairsched": {"policy": "hrrn",
                                                     "lprs": {"target_ms": 30}}}))


def test_no_warning_without_misplaced_keys(caplog):
    with caplog.at_level(logging.WARNING, logger="vllm.fairsched"):
        load({"fairsched": {"policy": "aging"}, "ascend_scheduler_config": {}})
    assert not [r for r in caplog.records if r.name == "vllm.fairsched"]


@pytest.mark.parametrize("key,value,message", [
    ("device", "h1000", "predictor.device: unknown accelerator 'h1000'"),
    ("device", "h100:speed=2", "predictor.device: unknown accelerator field"),
    ("model", "qwen9", "predictor.model 'qwen9' is neither"),
])
def test_the_built_in_models_presets_are_checked(key, value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config({"fairsched": {"predictor": {key: value}}}, {})
