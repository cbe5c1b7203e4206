"""Comments and docstrings cite the project's own reference pages (docs/reference/*.md), which
users have, never the sections of a specification they do not: every cited page exists and every
cited anchor is one of its headings."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
CITATION = re.compile(r"docs/reference/([\w-]+\.md)(?:#([\w-]+))?")
SPEC_SECTION = re.compile(r"\bSPEC(?:'s)? (?:section|sections|\d)|\(SPEC\)|SPEC-timed|SPEC order|SPEC formula")


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces as '-'."""
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def bad_citations(text: str) -> list[str]:
    bad = []
    for page, anchor in CITATION.findall(text):
        path = REFERENCE / page
        if not path.is_file():
            bad.append(page)
        elif anchor and anchor not in anchors(path):
            bad.append(f"{page}#{anchor}")
    return bad


def sources() -> list[Path]:
    return [p for d in ("src", "tests", "benchmarks") for p in (ROOT / d).rglob("*")
            if p.suffix in (".py", ".toml") and p.is_file() and p != Path(__file__).resolve()]


def test_every_cited_reference_page_and_anchor_exists():
    found = {str(p.relative_to(ROOT)): b for p in sources() if (b := bad_citations(p.read_text()))}
    assert found == {}


def test_nothing_cites_spec_sections():
    found = {str(p.relative_to(ROOT)): m for p in sources() if (m := SPEC_SECTION.findall(p.read_text()))}
    assert found == {}


def test_the_checks_see_a_planted_bad_citation():
    assert bad_citations("(docs/reference/training-contract.md#timing)") == []
    assert bad_citations("(docs/reference/training-contract.md#warmup)") == ["training-contract.md#warmup"]
    assert bad_citations("see docs/reference/nowhere.md") == ["nowhere.md"]
    assert SPEC_SECTION.findall("the contract (SPEC section 4)") and SPEC_SECTION.findall("SPEC 5's matrix")
    assert not SPEC_SECTION.findall("SPEC = {'name': 'gpt2_2'}")
