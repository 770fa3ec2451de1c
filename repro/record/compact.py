"""The explicit migration of a version 2 report to version 3 (its KV grid in runs, repro.judge.kv_grid): what
`python -m repro compact-report IN OUT` writes and what the kit packs. Lossless: every audited reuse's planes read
back as the report's own rows, or nothing is written."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

from repro.commands import ArgumentParser
from repro.errors import EXIT_OK, UsageError
from repro.judge.kv_grid import FIGURES, compact_plane, dense_planes
from repro.record.atomic import dumps_json, write_bytes_atomic
from repro.record.report import REPORT_SCHEMA_VERSION, ReportInvalid, kv_audit_problems, load_report

MIGRATES_FROM = 2  # the one version compact_report rewrites; 1 has no grid, 3 is already compact


def _audits(report: dict):
    """Every request's KV audit that has planes (audited reuses), in the report's order."""
    for arm in report.get("arms") or []:
        for probe in arm.get("probes") or []:
            for req in probe.get("requests") or []:
                audit = req.get("kv_audit") if isinstance(req, dict) else None
                if isinstance(audit, dict) and isinstance(audit.get("planes"), dict):
                    yield audit


def compact_report(report: dict) -> dict:
    """A version 2 report as version 3: a copy whose audited reuses' planes are in runs, every other field as it
    was, migrated_from 2. Checked before it is returned: the result's grids are well formed and read back as the
    original's rows, byte for byte once serialized (a difference is a kit bug: ReportInvalid)."""
    if report.get("schema_version") != MIGRATES_FROM:
        raise UsageError(
            f"compact-report reads schema_version {MIGRATES_FROM} reports; this one is {report.get('schema_version')}"
            " (version 1 has no KV grid, version 3 is already compact)"
        )
    if problems := kv_audit_problems(report):
        raise UsageError(f"the report's KV audit is malformed, so it is not compacted: {problems[0]}")
    out = copy.deepcopy(report)
    out["schema_version"] = REPORT_SCHEMA_VERSION
    out["migrated_from"] = MIGRATES_FROM
    for audit in _audits(out):
        audit["planes"] = {
            name: compact_plane(plane["class"], *(plane[key] for key in FIGURES))
            for name, plane in audit["planes"].items()
        }
    problems = kv_audit_problems(out)
    if problems:
        raise ReportInvalid(f"compacting made a malformed grid: {problems[0]}")
    for before, after in zip(_audits(report), _audits(out), strict=True):
        if dumps_json(dense_planes(after["planes"])) != dumps_json(before["planes"]):
            raise ReportInvalid("compacting changed a KV grid's figures")
    return out


def packed_report(report: dict) -> dict:
    """The report as the kit packs it: a version 2 report compacted, any other version as it is."""
    return compact_report(report) if report.get("schema_version") == MIGRATES_FROM else report


def main(argv: list[str]) -> int:
    """`python -m repro compact-report IN OUT`: write IN (a version 2 report) as version 3 to OUT."""
    parser = ArgumentParser(prog="python -m repro compact-report", description=main.__doc__)
    parser.add_argument("input", help=f"a kvkit report JSON, schema_version {MIGRATES_FROM}")
    parser.add_argument("output", help="where to write it compacted (may be IN itself; written atomically)")
    parser.add_argument("--force", action="store_true", help="replace another report already at OUT")
    args = parser.parse_args(argv)
    source = Path(args.input)
    out = Path(args.output)
    if out.exists() and not args.force and not (source.exists() and out.resolve() == source.resolve()):
        # IN itself is compacted in place, losslessly (checked before it is written); any other report is not ours
        raise UsageError(f"{out}: a report is already there: give another OUT, or --force to replace it")
    before = source.stat().st_size
    data = dumps_json(compact_report(load_report(source))).encode("utf-8")
    write_bytes_atomic(args.output, data)
    print(
        f"wrote {args.output}: schema_version {REPORT_SCHEMA_VERSION}, {len(data)} bytes ({before} before)",
        file=sys.stderr,
    )
    return EXIT_OK
