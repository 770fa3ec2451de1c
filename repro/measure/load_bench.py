"""`make bench`'s production-load figures: one run of the CPU load fixture's production-load scenario
(fixtures/scenarios-load-cpu-planted.json, --compare-native, the KV audit's tensors kept), and what it cost: the
run's and the scenario stage's wall time, each (scenario, arm) child's, and per run the KV audit's bytes per request
it recorded. Figures about the kit on this machine, not a test and not a claim about any engine."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from repro.judge.verdict import SKIPPED
from repro.paths import KIT_ROOT
from repro.plan.load import CONTROL_SUFFIX, REFERENCE_SUFFIX
from repro.plan.options import CPU_ENGINE_FLAGS

LOAD_FIXTURE = KIT_ROOT / "fixtures" / "scenarios-load-cpu-planted.json"
SCENARIO = "production-load"


def audit_bytes(run_dir: Path) -> tuple[int, int]:
    """(bytes, records) one run's KV audit wrote: every file under its directory, and its per-request records."""
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    records = [p for p in files if p.suffix == ".json" and p.name[:1].isdigit()]
    return sum(p.stat().st_size for p in files), len(records)


def load_figures(model: str) -> int:
    """Run the load fixture once and print its figures; returns 0 once it wrote a report (its verdicts, ExampleConnector's
    ERROR and the planted fault's FAIL among them, are the fixture's, not the bench's), else 3."""
    with tempfile.TemporaryDirectory(prefix="kvkit-bench-load-") as tmp:
        report, keep = Path(tmp) / "load.json", Path(tmp) / "kv"
        argv = [sys.executable, "-m", "repro.verify_kv_reuse", "--model", model, *CPU_ENGINE_FLAGS,
                "--fixture", str(LOAD_FIXTURE), "--compare-native", "--no-native-matched",
                "--scenarios", SCENARIO, "--keep-kv", str(keep), "--report", str(report), "--quiet"]  # fmt: skip
        t0 = time.monotonic()
        proc = subprocess.run(argv, check=False, capture_output=True, text=True)
        wall = time.monotonic() - t0
        if not report.is_file():
            print(f"production load: the run wrote no report (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
            return 3
        data = json.loads(report.read_text(encoding="utf-8"))
        print(f"production load ({LOAD_FIXTURE.name}, --scenarios {SCENARIO}, exit {proc.returncode}): "
              f"{wall:.1f} s in all, scenario stage {data['diagnostics'].get('scenarios_wall_s', 0):.1f} s")  # fmt: skip
        for line in figure_lines(data, keep):
            print(f"  {line}")
    print("figures describe the kit's own cost on this machine; claim_eligible=false, no performance claim")
    return 0


def figure_lines(data: dict, keep: Path) -> list[str]:
    """One line per run of the load scenario: its child's wall time, its requests and the audit's bytes per request."""
    sc = next((s for s in data.get("scenarios") or [] if s.get("name") == SCENARIO), None)
    if sc is None:
        return ["the report has no production-load scenario"]
    load = sc.get("load") or {}
    # (label, wall time, its KV directory: the run's name)
    runs = [("baseline (schedule control)", (sc.get("control") or {}).get("wall_s"), "baseline"),
            ("reference", (load.get("reference") or {}).get("wall_s"), "baseline", REFERENCE_SUFFIX),
            ("reuse control", (load.get("reuse_control") or {}).get("wall_s"), "native", CONTROL_SUFFIX)]  # fmt: skip
    runs += [(a["arm"], a.get("wall_s"), a["arm"]) for a in sc.get("arms") or [] if a.get("verdict") != SKIPPED]
    out = []
    for label, wall, arm, *suffix in runs:
        run_dir = keep / f"{arm}~scenario.{SCENARIO}{''.join(suffix)}"
        size, records = audit_bytes(run_dir) if run_dir.is_dir() else (0, 0)
        per = f"{size / records / 1024:.1f} KiB a request over {records} records" if records else "no audit records"
        out.append(f"{label}: {'?' if wall is None else f'{wall:.1f} s'} · KV audit {size / 2**20:.1f} MiB, {per}")
    return out
