"""README.md and docs/: a README a newcomer reads in five minutes, every topic on a page of docs/ it links,
links that resolve, the test command CI runs, and no reference to this project's own issue numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kvkit_testutil import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 150

# The kit to attach to an issue carries neither docs/ nor this README: skip there, never in a checkout
pytestmark = pytest.mark.skipif(
    not DOCS.is_dir() and not (ROOT / ".git").exists(),
    reason="docs/ is not part of this copy (the kit)",
)

LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$")
# "issue 18", "issues 12 and 13", "issue #21": this project's tracker; an upstream one is named by its project
OWN_ISSUE = re.compile(r"(?<!LMCache )\bissues? #?\d+", re.IGNORECASE)


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens (code blocks skipped)."""
    found, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            found.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return found


def test_the_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move a topic into docs/"


def test_the_readme_links_every_docs_page():
    text = README.read_text(encoding="utf-8")
    pages_ = sorted(DOCS.glob("*.md"))
    assert pages_, "docs/ has no page"
    for page in pages_:
        assert f"](docs/{page.name})" in text, f"README.md does not link docs/{page.name}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: {target} points at nothing"
        if fragment:
            assert fragment in anchors(dest), f"{page.name}: {target}: no such heading in {dest.name}"


def test_ci_runs_the_readmes_test_command():
    readme = README.read_text(encoding="utf-8")
    assert re.search(r"^make test\b", readme, re.MULTILINE), "README.md no longer shows `make test`"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands[-1] == "make test"


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_page_cites_this_projects_issue_numbers(page):
    hits = OWN_ISSUE.findall(page.read_text(encoding="utf-8"))
    assert not hits, f"{page.name} cites {hits}: say what was meant, or name the commit"


def test_each_topic_kept_its_figures_on_its_page():
    """What left the README is on its page (a sample of figures that must not be lost in a move)."""
    facts = {
        "verdicts.md": ["(ERROR > FAIL > INCONCLUSIVE > PASS)", "`FAIL (near-ties only: 2)`", "0→1280×3"],
        "kv-audit.md": ["| UNAVAILABLE |", "−9.5 % to +17.6 %", "VLLM_CPU_NUM_OF_RESERVED_CPU=1"],
        "concurrency.md": ["74.9 s / 118.3 s = **0.633**", "94.5 s / 66.7 s = **1.42×**"],
        "matrix.md": ["147 s", "`--resume`"],
        "kit.md": ["65,536 characters", "make kit-check"],
        "detection.md": ["**75 of 75 fault probes blamed exactly**", "| `other_prompt` | prefix | 5/5 | 5/5 | 5/5 |"],
        "gpu.md": ["reports/conditions/", "FAIL 4/5, KV CORRUPT 5/5", "## H200 results", "## Stacks validated"],
        "reliability.md": ["| 130 |", "make chaos SEED=2101", "**2 shortfalls**"],
        "smollm2.md": ["272/272 tensors bit-identical", "762 s (12 min 42 s)"],
        "usage.md": ["--batch-invariant", "repro.record.atomic.dumps_json"],
    }
    for name, needles in facts.items():
        text = (DOCS / name).read_text(encoding="utf-8")
        for needle in needles:
            assert needle in text, f"docs/{name} lost {needle!r}"
