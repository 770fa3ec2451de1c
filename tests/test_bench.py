"""`python -m repro bench-figures`: the concurrency figures of runs made elsewhere, from their files
(the H200 three-arm run and the four-cell matrix committed under reports/)."""

from __future__ import annotations

import copy
import json

import pytest
from kvkit_testutil import ROOT

from repro.errors import UsageError
from repro.measure.bench import figures, matrix_figures, report_figures

# The kit to attach to an issue carries no reports/: skip there, never in a checkout
pytestmark = pytest.mark.skipif(
    not (ROOT / "reports" / "h200-bench-3arm.json").exists() and not (ROOT / ".git").exists(),
    reason="the committed reports are not part of this copy (the kit)",
)


def test_a_reports_wall_against_its_slowest_arm():
    data = json.loads((ROOT / "reports" / "h200-bench-3arm.json").read_text())
    lines = report_figures(data)
    assert "wall / slowest arm (LMCacheConnectorV1): 1.42x  (target on a GPU <= 1.3: NOT met)" in lines
    assert lines[0].startswith("3 arms, 3 at a time") and "wall 94.5 s" in lines[0]


def test_a_matrix_at_once_against_one_at_a_time(tmp_path, capsys):
    together = json.loads((ROOT / "reports" / "matrix" / "h200-lmcache-versions.json").read_text())
    # the --one-at-a-time run of the same cells on the same machine took 510.6 s (its summary's
    # diagnostics; its cell reports were not kept)
    serial = copy.deepcopy(together)
    serial["diagnostics"].update(wall_s=510.574, one_at_a_time=True)
    assert matrix_figures(together, serial)[1].endswith("0.58x  (target <= 0.6: met)")
    with pytest.raises(UsageError, match="at the same time first"):
        matrix_figures(serial, together)
    (tmp_path / "a.json").write_text(json.dumps(together))
    (tmp_path / "b.json").write_text(json.dumps(serial))
    assert figures([str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    assert "0.58x" in capsys.readouterr().out
    with pytest.raises(UsageError, match="give one kvkit-report"):
        figures([str(tmp_path / "a.json")])
