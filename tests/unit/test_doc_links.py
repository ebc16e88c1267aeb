"""Every link between the docs leads somewhere: a relative link in README.md, a folder's README.md or docs/*.md names
a file or folder of the repository, and its `#anchor`, where it has one, a heading of that page (as GitHub makes a
heading's anchor: lower case, punctuation dropped, spaces as hyphens, `-1`, `-2` for repeats) or an `<a id>` in it.

Only files are read; links to other sites are not followed.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted({*ROOT.glob("README.md"), *ROOT.glob("*/README.md"), *ROOT.glob("docs/*.md")})
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup and punctuation dropped, lower case, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose_lines(page.read_text()):
        found.update(EXPLICIT_ANCHOR.findall(line))
        if match := HEADING.match(line):
            base = slug(match[2])
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    broken = []
    for line in prose_lines(page.read_text()):
        for match in LINK.finditer(line):
            target = match[1] or match[2]
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                continue
            path_part, _, anchor = target.partition("#")
            destination = (page.parent / path_part).resolve() if path_part else page
            if not destination.exists():
                broken.append(f"{target}: no such file")
            elif anchor and destination.is_file() and destination.suffix == ".md" and anchor not in anchors(destination):
                broken.append(f"{target}: no heading or anchor #{anchor} in {destination.relative_to(root)}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_every_link_leads_somewhere(page: Path) -> None:
    assert broken_links(page) == []


def test_a_link_to_nothing_is_named(tmp_path: Path) -> None:
    """The check itself can fail: a missing file and a missing heading are named; headings, repeats and explicit
    anchors are found; links in code blocks and to other sites are not followed."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# Page\n## Bounded disorder: `max_out_of_orderness_s`\n## Tests\n## Tests\n<a id=\"timers\"></a>\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/a.md#bounded-disorder-max_out_of_orderness_s) [ok](docs/a.md#tests-1) "
                    "[ok](docs/a.md#timers) [site](https://example.com/x#y) ![picture](docs/a.md)\n"
                    "[gone](docs/b.md) [no heading](docs/a.md#tests-2)\n```\n[in code](nowhere.md)\n```\n")
    assert broken_links(page, tmp_path) == ["docs/b.md: no such file",
                                            "docs/a.md#tests-2: no heading or anchor #tests-2 in docs/a.md"]
