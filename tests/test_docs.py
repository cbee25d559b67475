"""The documentation's links: every relative link and picture in the README and the pages it links
(docs/, bench/, tests/, deploy/, examples/) names a file of this checkout, and a `#fragment` a
heading of that file (GitHub's anchors); every page under docs/ is reached from the README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("*/README.md"), *ROOT.glob("*/*/README.md")],
    key=str,
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def links(page: Path) -> list[str]:
    """The link targets of `page`, outside code blocks and inline code."""
    found, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            found += LINK.findall(re.sub(r"`[^`]*`", "", line))
    return found


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of `page`'s headings: lowercased, punctuation but `-` and `_` dropped, spaces as `-`."""
    found, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#{1,6} (.+)", line)):
            found.add(re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_a_file_and_a_heading_of_it(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue  # a web address: not checked offline
        path, _, fragment = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif fragment and where.suffix == ".md" and fragment not in anchors(where):
            broken.append(f"{target}: no heading #{fragment}")
    assert broken == [], page


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links(ROOT / "README.md")}
    assert [p.name for p in sorted(ROOT.glob("docs/*.md")) if p.resolve() not in linked] == []


def test_the_checker_finds_a_broken_link_and_a_missing_heading(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [gone](missing.md) [bad](#nowhere)\n```\n[code](not-a-link.md)\n```\n")
    assert links(page) == ["#title", "missing.md", "#nowhere"]
    assert anchors(page) == {"title"}
