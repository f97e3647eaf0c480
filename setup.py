"""Build shim: feeds entry_points.toml to setuptools so entry points are declared once."""

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser as a package (a build requirement there)
    import tomli as tomllib

from setuptools import setup

_ENTRY_POINTS = tomllib.loads(Path(__file__).with_name("entry_points.toml").read_text())

setup(
    entry_points={
        group: [f"{name} = {target}" for name, target in points.items()]
        for group, points in _ENTRY_POINTS.items()
    }
)
