"""The supported Python versions are the ones tested: pyproject's `requires-python` admits the interpreter the
tests run on and the image's, and nothing the project has never run on."""
from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_requires_python_names_exactly_the_tested_minor_version() -> None:
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    tested = f"{sys.version_info.major}.{sys.version_info.minor}"
    image = re.search(r"^FROM python:(\d+\.\d+)", (ROOT / "Dockerfile").read_text(), re.MULTILINE).group(1)
    assert image == tested
    major, minor = sys.version_info[:2]
    assert requires == f">={major}.{minor},<{major}.{minor + 1}", requires
