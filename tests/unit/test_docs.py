"""The guides link where they say: every relative link between the project's Markdown files names a file that exists
and, where it names a section, a heading of that file (GitHub's anchors)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "RESULTS.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def github_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        heading = None if in_code else re.match(r"^#{1,6}\s+(.*)$", line)
        if heading:
            anchor = github_anchor(heading.group(1))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def test_github_anchor_matches_the_headings_other_docs_link():
    assert github_anchor("What this CPU allows at c = 4 and 16") == "what-this-cpu-allows-at-c--4-and-16"
    assert github_anchor("On a GPU (by reading)") == "on-a-gpu-by-reading"
    assert github_anchor("Prompt lookup: runs moved from docs/lookup.md") == "prompt-lookup-runs-moved-from-docslookupmd"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    broken = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target):  # http(s), mailto: not checked here
            continue
        path, _, fragment = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{doc.relative_to(ROOT)}: {broken}"


def test_lookup_guide_stays_a_guide():
    """docs/lookup.md states rules and links their runs; dated runs live in benchmarks/RESULTS.md."""
    lines = (ROOT / "docs" / "lookup.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"docs/lookup.md has {len(lines)} lines: move dated runs to benchmarks/RESULTS.md"
