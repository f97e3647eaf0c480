"""Build shim: feeds entry_points.toml to setuptools so entry points are declared once."""

import tomllib
from pathlib import Path

from setuptools import setup

_ENTRY_POINTS = tomllib.loads(Path(__file__).with_name("entry_points.toml").read_text())

setup(
    entry_points={
        group: [f"{name} = {target}" for name, target in points.items()]
        for group, points in _ENTRY_POINTS.items()
    }
)
