"""Every README is a door: what its folder is, how to run it, its settings and guarantees, and links, in at most
250 lines. Explanations that earn more length live in docs/, where the README links to them; a README growing past
the bound is the sign that a part of it belongs there."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 250
# The repository's own folders; not the hidden ones tools make (.pytest_cache, .venv).
READMES = sorted([ROOT / "README.md",
                  *(path for path in ROOT.glob("*/README.md") if not path.parent.name.startswith("."))])


@pytest.mark.parametrize("readme", READMES, ids=[str(path.relative_to(ROOT)) for path in READMES])
def test_a_readme_stays_a_door(readme: Path) -> None:
    lines = len(readme.read_text().splitlines())
    assert lines <= MAX_LINES, (f"{readme.relative_to(ROOT)} has {lines} lines, more than {MAX_LINES}: move an "
                                f"explanation to docs/ and link to it")
