"""Each setting is declared once: one field in its section (``settings.setting``) gives
the dotted key, the ``FAIRSCHED_*`` variable, the check, ``check-config --list-keys``'s
line, the docs table's row and the value the policy receives. Shown by adding a setting
in a temporary subclass and changing nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from fairsched_plugin.config import KEYS, SCHEMA, ConfigError, Schema
from fairsched_plugin.policies import GuardedSRPF, make_policy
from fairsched_plugin.settings import (
    FairschedConfig,
    GuardedSRPFConfig,
    non_negative,
    setting,
)


@dataclass(frozen=True)
class WithGrace(GuardedSRPFConfig):
    grace_s: float = setting(0.5, "a finite number >= 0 (seconds of grace)", non_negative,
                             see="docs/policies.md")


@dataclass(frozen=True)
class ConfigWithGrace(FairschedConfig):
    guarded_srpf: WithGrace = field(default_factory=WithGrace)


SCHEMA_WITH_GRACE = Schema(ConfigWithGrace)


def test_the_new_field_is_a_key_with_its_variable_and_check():
    key = SCHEMA_WITH_GRACE.by_path["guarded_srpf.grace_s"]
    assert key.env_name == "FAIRSCHED_GUARDED_SRPF_GRACE_S"
    assert key.kind is float
    assert [k.path for k in SCHEMA_WITH_GRACE.keys] == (
        [k.path for k in KEYS[:KEYS.index(SCHEMA.by_path["guarded_srpf.overtake_running"]) + 1]]
        + ["guarded_srpf.grace_s"]
        + [k.path for k in KEYS[KEYS.index(SCHEMA.by_path["guarded_srpf.overtake_running"]) + 1:]])
    assert "guarded_srpf.grace_s" not in SCHEMA.by_path


def test_the_new_setting_loads_from_every_source_and_is_checked():
    assert SCHEMA_WITH_GRACE.load(environ={}).guarded_srpf.grace_s == 0.5
    from_env = SCHEMA_WITH_GRACE.load(environ={"FAIRSCHED_GUARDED_SRPF_GRACE_S": "2"})
    assert from_env.guarded_srpf.grace_s == 2.0
    nested = SCHEMA_WITH_GRACE.load({"fairsched": {"guarded_srpf": {"grace_s": 3}}}, environ={})
    assert nested.guarded_srpf.grace_s == 3.0
    with pytest.raises(ConfigError, match=r"guarded_srpf.grace_s from FAIRSCHED_GUARDED_SRPF_"
                                          r"GRACE_S must be a finite number >= 0 \(seconds"):
        SCHEMA_WITH_GRACE.load(environ={"FAIRSCHED_GUARDED_SRPF_GRACE_S": "-1"})
    with pytest.raises(ConfigError, match="did you mean 'guarded_srpf.grace_s'"):
        SCHEMA_WITH_GRACE.from_values({"guarded_srpf": {"grace": 1}})


def test_the_key_list_and_the_docs_table_show_it():
    assert ("  guarded_srpf.grace_s (FAIRSCHED_GUARDED_SRPF_GRACE_S): a finite number >= 0 "
            "(seconds of grace)") in SCHEMA_WITH_GRACE.accepted_keys().splitlines()
    assert ("| `guarded_srpf.grace_s` | `FAIRSCHED_GUARDED_SRPF_GRACE_S` | `0.5` | a finite "
            "number >= 0 (seconds of grace) ([docs/policies.md](docs/policies.md)) |"
            ) in SCHEMA_WITH_GRACE.markdown_table().splitlines()


def test_the_policy_receives_the_section_with_the_new_field():
    received = []

    class Graced(GuardedSRPF):
        def __init__(self, config: WithGrace) -> None:
            super().__init__(config)
            received.append(config.grace_s)

    config = SCHEMA_WITH_GRACE.from_values({"guarded_srpf": {"grace_s": 1.5}})
    with pytest.MonkeyPatch.context() as patch:
        from fairsched_plugin.policies import registry
        patch.setitem(registry.POLICIES, "guarded-srpf",
                      replace(registry.POLICIES["guarded-srpf"], policy=Graced))
        policy = make_policy(config)
    assert isinstance(policy, Graced) and received == [1.5]


def test_a_field_without_a_declaration_is_refused_when_the_schema_is_built():
    @dataclass(frozen=True)
    class Undeclared(FairschedConfig):
        loose: int = 3

    with pytest.raises(TypeError, match="Undeclared.loose: declare it with settings.setting"):
        Schema(Undeclared)
