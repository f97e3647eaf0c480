"""Config keys are declared in the dataclasses and ``config.KEYS``, and the configuration
page's table is generated from them: none of the three may drift from the others."""

from __future__ import annotations

import dataclasses
import importlib.util
import typing
from pathlib import Path

from fairsched_plugin.config import KEYS, FairschedConfig, markdown_table
from fairsched_plugin.policies.registry import POLICIES

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "config_table.py"


def _script():
    spec = importlib.util.spec_from_file_location("config_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_page_table_is_the_generated_one():
    script = _script()
    text = script.PAGE.read_text(encoding="utf-8")
    assert script.with_table(text) == text, "run scripts/config_table.py"


def test_table_has_one_row_per_key_and_every_policy():
    table = markdown_table()
    for key in KEYS:
        assert f"| `{key.path}` | `{key.env_name}` |" in table
    assert "`lprs.correction`" in table and "`guarded-srpf` (" in table


def test_every_config_field_is_a_key_and_every_key_a_field():
    """The dataclasses and ``KEYS`` declare the same keys: a field without a key could not
    be set, a key without a field would be dropped."""

    def leaves(cls: type, prefix: str = "") -> set[str]:
        hints = typing.get_type_hints(cls)
        out: set[str] = set()
        for f in dataclasses.fields(cls):
            kind = hints[f.name]
            if dataclasses.is_dataclass(kind):
                out |= leaves(kind, f"{prefix}{f.name}.")
            else:
                out.add(prefix + f.name)
        return out

    assert leaves(FairschedConfig) == {key.path for key in KEYS}


def test_every_registered_section_is_a_config_section():
    for name, entry in POLICIES.items():
        assert entry.section is None or any(
            key.path.startswith(entry.section + ".") for key in KEYS), name
