"""`python -m repro matrix FILE`: plan the cells (--resume keeps the done ones), run them on Ray, write
the summary (repro.record.atomic) and the page; cell report pages come from repro.publish.site."""

from __future__ import annotations

import json
import signal
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path

from repro import __version__
from repro.commands import ArgumentParser
from repro.errors import EXIT_INTERRUPTED, EXIT_OK, UsageError
from repro.matrix import status
from repro.matrix.cell import CellJob, CellOutcome
from repro.matrix.page import render_matrix_page
from repro.matrix.spec import Cell, Matrix, load_matrix
from repro.paths import KIT_ROOT
from repro.plan.options import engine_python_problem
from repro.record.atomic import write_bytes_atomic, write_json_atomic
from repro.record.provenance import sha256_file, utc_now
from repro.record.report import load_report

SITE_DIR = "site"  # the cell pages, under the matrix's reports folder


def _report_arg(path: Path) -> str:
    """The --report a cell's verifier gets: relative to the kit root when inside it (as a user types it)."""
    try:
        return path.resolve().relative_to(KIT_ROOT).as_posix()
    except ValueError:
        return str(path.resolve())


def _load_or_none(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        return load_report(path)
    except UsageError:
        return None


def load_summary(path: Path) -> dict:
    """A previous matrix summary (strict: kind and version)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"matrix summary {path}: cannot read ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != status.MATRIX_KIND:
        raise UsageError(f"matrix summary {path}: not a {status.MATRIX_KIND} file")
    version = data.get("schema_version")
    if not isinstance(version, int) or version > status.MATRIX_SCHEMA_VERSION:
        raise UsageError(f"matrix summary {path}: schema_version {version!r} is newer than this kit: upgrade the kit")
    return data


def check_environments(matrix: Matrix) -> None:
    """Every cell's interpreter runs and has vllm (and lmcache for an LMCache connector): else one line, exit 2."""
    seen: dict[tuple[str, bool], str | None] = {}
    for cell in matrix.cells:
        key = (cell.python, bool(cell.connector and "lmcache" in cell.connector.lower()))
        if key not in seen:
            seen[key] = engine_python_problem(*key)
        if seen[key]:
            hint = " (make matrix sets up a profile's environment)" if "/" not in cell.environment else ""
            raise UsageError(f"cell {cell.name}: environment {cell.environment} ({cell.python}): {seen[key]}{hint}")


def _write_files(folder: Path, files: tuple[tuple[str, bytes], ...]) -> None:
    """A cell that ran on another host: its logs, then its report (the report last: it is the commit point)."""
    for rel, data in sorted(files, key=lambda f: f[0].endswith(".json")):
        dest = folder / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(dest, data)


def _on_term(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def check_earlier_run(matrix: Matrix, reports: Path, resume: bool, force: bool) -> None:
    """A run of the matrix replaces its summary, its page and every cell's report and logs: where an earlier run's
    summary or a cell report is there, it is refused (one line, exit 2, before anything runs) unless --resume (the
    same run, its missing and failed cells run again) or --force; a writeup <name>.md beside the summary is never
    left to describe another run (repro.plan.report_path), so --force does not run every cell again under it."""
    summary, folder = reports / f"{matrix.name}.json", reports / matrix.name
    cells = [folder / f"{c.name}.json" for c in matrix.cells]
    earlier = next((p for p in (summary, *cells) if p.exists()), None)
    if earlier is None or resume:
        return
    writeup = reports / f"{matrix.name}.md"
    if writeup.exists():
        raise UsageError(
            f"matrix {matrix.name}: the writeup {writeup} describes the run there: --resume reruns its missing and "
            "failed cells; to run every cell again, give another --reports or move the writeup away first"
        )
    if not force:
        raise UsageError(
            f"matrix {matrix.name}: an earlier run is there ({earlier}): --resume reruns its missing and failed "
            "cells; give another --reports, or --force to run every cell again"
        )


def run_matrix(matrix: Matrix, reports: Path, resume: bool, one_at_a_time: bool, force: bool = False) -> int:
    check_earlier_run(matrix, reports, resume, force)
    folder = reports / matrix.name
    summary_path = reports / f"{matrix.name}.json"
    previous = load_summary(summary_path) if resume and summary_path.is_file() else None
    before = {c["name"]: c for c in (previous or {}).get("cells", [])}
    records: dict[str, dict] = {}
    jobs: list[tuple[Cell, CellJob]] = []
    for cell in matrix.cells:
        path = folder / f"{cell.name}.json"
        arg = _report_arg(path)
        existing = _load_or_none(path)
        if resume and not status.needs_run(cell, existing, arg, before.get(cell.name)):
            records[cell.name] = _record(cell, folder, existing, None, ran=False, outcome=None)
            continue
        # --force: the matrix owns its cells' paths and decided above (check_earlier_run) that this cell runs again
        job = CellJob(cell.name, cell.python, (*cell.verifier_argv(arg), "--force"), str(path.resolve()),
                      str(KIT_ROOT), cell.timeout_s, socket.gethostname())  # fmt: skip
        jobs.append((cell, job))
    # Only the cells that run need their environment: --resume adds a cell (a new stack) on a host that
    # no longer has the kept cells' environments.
    check_environments(replace(matrix, cells=tuple(cell for cell, _ in jobs)))
    if jobs:
        from repro.matrix.cluster import import_ray  # Ray only where a cell runs: missing is one line, exit 2

        import_ray()
    folder.mkdir(parents=True, exist_ok=True)
    print(f"[kvkit] matrix {matrix.name}: {len(jobs)} cell(s) to run, {len(records)} kept", file=sys.stderr)

    def on_result(cell: Cell, outcome: CellOutcome | status.TaskFailure) -> None:
        path = folder / f"{cell.name}.json"
        if isinstance(outcome, CellOutcome) and outcome.files:
            _write_files(folder, outcome.files)
        report = _load_or_none(path)
        matches = status.report_matches(report, cell, _report_arg(path))
        error = status.cell_error(outcome, report, matches)
        records[cell.name] = _record(cell, folder, report, error, ran=True, outcome=outcome)
        said = f"ERROR {error[0]}: {error[1]}" if error else f"exit {records[cell.name]['exit_code']}"
        print(f"[kvkit] matrix: cell {cell.name}: {said}", file=sys.stderr, flush=True)

    started, t0 = utc_now(), time.monotonic()
    cluster = {"address": "none (nothing to run)"}
    if jobs:
        from repro.matrix.cluster import run_on_ray

        cluster = run_on_ray(jobs, on_result, one_at_a_time)
    wall = round(time.monotonic() - t0, 3)
    cells = [records[c.name] for c in matrix.cells]
    summary = _summary(matrix, cells, cluster, started, wall, one_at_a_time)
    publish(summary, reports)
    for c in cells:
        print(f"  {c['name']:<24} {c['status'] if c['status'] != 'done' else 'exit ' + str(c['exit_code'])}")
    print(f"matrix: {summary_path} · page: {reports / (matrix.name + '.html')} · wall {wall:.0f} s")
    return summary["exit_code"]


def _record(cell: Cell, folder: Path, report, error, *, ran: bool, outcome) -> dict:
    return status.cell_record(
        cell,
        report_rel=f"{folder.name}/{cell.name}.json",
        report=report,
        error=error,
        ran=ran,
        outcome=outcome,
        page_rel=f"{cell.name}.html",
    )


def _summary(matrix: Matrix, cells: list[dict], cluster: dict, started: str, wall: float, serial: bool) -> dict:
    ran = [c["wall_s"] for c in cells if c["ran"] and c["wall_s"] is not None]
    return {
        "kind": status.MATRIX_KIND,
        "schema_version": status.MATRIX_SCHEMA_VERSION,
        "tool_version": __version__,
        "claim_eligible": False,
        "name": matrix.name,
        "matrix_file": {"path": matrix.path, "sha256": sha256_file(matrix.path)},
        "cluster": cluster,
        "started_utc": started,
        "ended_utc": utc_now(),
        "cells": cells,
        "probes": status.probe_names(cells),
        "axes": status.axes(cells),
        "exit_code": status.matrix_exit_code(cells),
        # Diagnostics, not a performance claim: the run's wall time against its cells' own.
        "diagnostics": {"wall_s": wall, "cells_wall_s_sum": round(sum(ran), 3), "one_at_a_time": serial},
    }


def refresh_summary(summary: dict, reports: Path) -> dict:
    """The summary with what this kit reads from each done cell's report (its versions, arm rows and their
    LMCache copy paths) and the version axes; the run's own facts (status, errors, exit codes, timings,
    nodes, cluster, the matrix file's digest) as they were recorded. A missing or unreadable cell report
    is one line (exit 2)."""
    cells = []
    for cell in summary["cells"]:
        if cell["status"] == status.DONE and cell.get("report"):
            report = load_report(reports / cell["report"])
            cell = {**cell, "versions": status.versions(report), "arms": status.arm_rows(report)}
        cells.append(cell)
    return {**summary, "cells": cells, "probes": status.probe_names(cells), "axes": status.axes(cells)}


def refresh(matrix: Matrix, reports: Path) -> int:
    """--refresh: the summary and the matrix page written again from the cells' reports, nothing run; the
    cell pages are left as they are."""
    path = reports / f"{matrix.name}.json"
    if not path.is_file():
        raise UsageError(f"matrix {matrix.name}: no summary {path} to refresh: run the matrix first")
    summary = refresh_summary(load_summary(path), reports)
    publish(summary, reports, cell_pages=False)
    print(f"matrix: {path} · page: {reports / (matrix.name + '.html')} (refreshed from the cell reports)")
    return EXIT_OK


def publish(summary: dict, reports: Path, cell_pages: bool = True) -> None:
    """Cell pages (the report site's renderer), then the summary, then the matrix page."""
    from repro.publish.site import render_site

    folder = reports / summary["name"]
    if cell_pages and folder.is_dir():
        render_site(folder, folder / SITE_DIR)
    write_json_atomic(reports / f"{summary['name']}.json", summary)
    md = reports / f"{summary['name']}.md"  # a writeup, when someone wrote one
    writeup = md.read_text(encoding="utf-8") if md.is_file() else None
    html = render_matrix_page(summary, cells_dir=f"{summary['name']}/{SITE_DIR}", writeup_md=writeup)
    write_bytes_atomic(reports / f"{summary['name']}.html", html.encode("utf-8"))


def matrix(argv: list[str]) -> int:
    """`python -m repro matrix FILE [--resume] [--reports DIR] [--one-at-a-time]`."""
    p = ArgumentParser(prog="python -m repro matrix", description="Run a matrix of cells on Ray (a local cluster, "
                       "or RAY_ADDRESS's), one normal report per cell, a summary and a page.")  # fmt: skip
    p.add_argument("file", help="the matrix file (YAML: name, defaults, cells)")
    p.add_argument("--resume", action="store_true", help="rerun only missing and failed cells")
    p.add_argument(
        "--reports", default="reports/matrix", help="where the matrix's folder goes (default: reports/matrix)"
    )
    p.add_argument("--one-at-a-time", action="store_true", help="run the cells one after another (for comparison)")
    p.add_argument(
        "--force", action="store_true", help="run every cell again over an earlier run (default: refuse, exit 2)"
    )
    p.add_argument(
        "--print-profiles", action="store_true", help="print the profiles the cells use, one a line, and stop"
    )
    p.add_argument(
        "--refresh",
        action="store_true",
        help="run nothing: write the summary and the matrix page again from the cells' reports as this kit reads "
        "them (versions, copy paths, axes), keeping what the run recorded",
    )
    args = p.parse_args(argv)
    spec = load_matrix(args.file)
    if args.print_profiles:
        for profile in sorted({c.environment for c in spec.cells if "/" not in c.environment}):
            print(profile)
        return EXIT_OK
    if args.refresh:
        return refresh(spec, Path(args.reports))
    signal.signal(signal.SIGTERM, _on_term)
    try:
        return run_matrix(spec, Path(args.reports), args.resume, args.one_at_a_time, args.force)
    except KeyboardInterrupt:
        print(
            "error: matrix interrupted: its tasks were cancelled and Ray shut down; no summary written (cells that "
            "had finished keep their reports: --resume reruns the rest)",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
