"""The README's configuration table is generated from ``config.KEYS``: it may not drift."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fairsched_plugin.config import KEYS, markdown_table

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "config_table.py"


def _script():
    spec = importlib.util.spec_from_file_location("config_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_table_is_the_generated_one():
    script = _script()
    text = script.README.read_text(encoding="utf-8")
    assert script.with_table(text) == text, "run scripts/config_table.py"


def test_table_has_one_row_per_key_and_every_policy():
    table = markdown_table()
    for key in KEYS:
        assert f"| `{key.path}` | `{key.env_name}` |" in table
    assert "`lprs.correction`" in table and "`guarded-srpf` (" in table
