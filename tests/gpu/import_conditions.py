"""Bring one H200 conditions run (tests/gpu/h200_conditions.sh) into reports/conditions/ as h200-conditions-NAME.

    python tests/gpu/import_conditions.py RAW_DIR NAME [--reports reports/conditions] [--prefix h200-conditions-]

RAW_DIR holds NAME.json and NAME.logs.tar.xz as the driver wrote them. Two things change, and the
report says so in `diagnostics.imported`: (1) the file is renamed, so every path into its logs
folder is rewritten to the new stem (nothing else in a string is touched); (2) a confirmation that
ran is re-classed from the runs the report keeps, with repro.judge.trials as it is now, where the kit that
made the report predates a class (it named "not reproduced" what is now "reproduced, varying": a
probe wrong again alone with other first diffs or KV blame). The measured runs are not changed.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from repro.judge import trials
from repro.record import atomic
from repro.record.report import validate_report

PREFIX = "h200-conditions-"


def _rewrite(value, old: str, new: str):
    if isinstance(value, str):  # the stem where a path starts: not inside a longer name
        return re.sub(rf"(?<![\w.-]){re.escape(old)}", new, value)
    if isinstance(value, list):
        return [_rewrite(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: _rewrite(v, old, new) for k, v in value.items()}
    return value


def reclass(report: dict) -> list[str]:
    """Re-class every confirmation that ran; returns what changed, one line each."""
    changed = []
    for arm in report["arms"]:
        c = arm.get("confirmation")
        if not isinstance(c, dict) or c.get("status") != "ran" or c.get("run") is None:
            continue
        runs = (arm.get("trials") or {}).get("runs") or []
        shared = [r for r in runs if r.get("shared")]
        if not shared:
            continue  # a single run: its summary is not kept apart from the arm; leave the class as made
        cls, reason = trials.classify_confirmation(shared, c["run"])
        if (cls, reason) != (c["class"], c["reason"]):
            changed.append(f"{arm['name']}: confirmation {c['class']!r} re-classed {cls!r} from the same runs")
            c["class"], c["reason"] = cls, reason
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("name")
    ap.add_argument("--reports", type=Path, default=Path("reports/conditions"))
    ap.add_argument("--prefix", default=PREFIX, help=f"the stem's prefix (default {PREFIX})")
    a = ap.parse_args(argv)
    src, logs_tar = a.raw / f"{a.name}.json", a.raw / f"{a.name}.logs.tar.xz"
    stem = a.prefix + a.name
    dest, dest_logs = a.reports / f"{stem}.json", a.reports / f"{stem}.logs"
    if dest.exists() or dest_logs.exists():
        print(f"error: {dest} or {dest_logs} exists already", file=sys.stderr)
        return 2
    report = json.loads(src.read_text(encoding="utf-8"))
    report = _rewrite(report, f"{a.name}.logs/", f"{stem}.logs/")
    notes = [f"renamed from {src.name}; paths into {a.name}.logs/ rewritten to {stem}.logs/"]
    notes += reclass(report)
    report.setdefault("diagnostics", {})["imported"] = notes
    validate_report(report)
    with tempfile.TemporaryDirectory(dir=a.reports) as tmp:
        with tarfile.open(logs_tar) as tar:
            tar.extractall(tmp, filter="data")
        shutil.move(str(Path(tmp) / f"{a.name}.logs"), dest_logs)
    atomic.write_json_atomic(dest, report)
    print(f"{dest}: " + "; ".join(notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
