"""No committed page shows a path of the machine that made it (issue 34 item 5).

The renderer shows every absolute path of a report by its name ('…/model', repro.judge.wording.machine_path_name);
a page rendered by an older renderer and committed keeps whatever it showed then. This test reads every committed
HTML page as it is on disk, so such a page fails until it is rendered again from its report."""

from __future__ import annotations

import re
import subprocess

import pytest
from conftest import ROOT

from repro.judge.wording import machine_path_name

_STYLE_OR_SCRIPT = re.compile(r"<(style|script)\b[^>]*>.*?</\1>", re.DOTALL)
# repro.judge.wording's definition of a machine path, less one it already shows by its name ('…/model').
_ABS_PATH = re.compile(r"(?<![\w./~:…-])/(?:[\w.+~@-]+/)+[\w.+~@-]*")


def committed_pages() -> list[str]:
    out = subprocess.run(["git", "ls-files", "*.html"], cwd=ROOT, capture_output=True, text=True, check=False)
    return sorted(out.stdout.split()) if out.returncode == 0 else []


def machine_paths(html: str) -> list[str]:
    """The absolute paths a page shows (its text and attributes; not its style sheet or scripts)."""
    return sorted(set(_ABS_PATH.findall(_STYLE_OR_SCRIPT.sub("", html))))


def test_the_check_finds_what_the_renderer_masks():
    page = "<tr><td>model</td><td>/tmp/kit/.cache/models/kvkit-tiny-qwen3-seed6</td></tr>"
    assert machine_paths(page) == ["/tmp/kit/.cache/models/kvkit-tiny-qwen3-seed6"]
    assert machine_paths(machine_path_name(page)) == []  # what the renderer makes of it passes
    assert machine_paths('<a href="seed6.html">seed6</a></td>') == []  # links and closing tags are no paths
    assert machine_paths("<style>a{background:url(/x/y.png)}</style><p>ok</p>") == []


@pytest.mark.skipif(not committed_pages(), reason="not a git checkout (an unpacked kit): no committed pages to read")
@pytest.mark.parametrize("page", committed_pages())
def test_no_committed_page_shows_a_machine_path(page):
    found = machine_paths((ROOT / page).read_text(encoding="utf-8"))
    assert found == [], f"{page} shows machine paths {found[:3]}: render it again from its report (make site)"
