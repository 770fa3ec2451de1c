"""What each cell's run says (done or ERROR, with its reason), which cells --resume reruns, and the
matrix summary: pure functions over cell outcomes and the reports they wrote."""

from __future__ import annotations

from dataclasses import dataclass

from repro.errors import EXIT_INTERRUPTED, EXIT_MISMATCH, EXIT_OK, EXIT_RUNTIME, EXIT_USAGE
from repro.judge.wording import NOT_RECORDED
from repro.matrix.cell import CellOutcome
from repro.matrix.spec import Cell
from repro.readmodel import ArmConditions, Report, Request
from repro.record.exit_rule import exit_code

MATRIX_KIND = "kvkit-matrix"
# 1: cells (status, error, exit code, report and page links, versions, per-arm per-probe verdicts with
#    KV verdict and divergence class), probes, cluster, timings. Added without a bump (absent from older
#    summaries, which render as before): per arm copy_path and class, per probe conditions (issue 18);
#    axes (issue 20: the vLLM and LMCache versions and LMCache copy paths the done cells ran, each with
#    its cells; the page computes the same from the cells of a summary without it); per arm scenarios
#    (issue 23: each scenario's verdict, class and the requests that are not a PASS, where the cell's
#    report ran scenarios; the page shows them beside the probes).
MATRIX_SCHEMA_VERSION = 1
DONE, ERROR = "done", "error"
# Error kinds of a cell (the verifier's own ERROR arms are inside its report: kind "engine-error").
NODE_LOST, CRASH, TIMEOUT, NO_REPORT, USAGE, INTERRUPTED = (
    "node-lost", "crash", "timeout", "no-report", "bad-input", "interrupted")  # fmt: skip


@dataclass(frozen=True)
class TaskFailure:
    """A cell whose Ray task gave no outcome: its node was lost, its worker died, it raised."""

    kind: str
    detail: str


def report_matches(report: dict | None, cell: Cell, report_arg: str) -> bool:
    """The report is this cell's: the verifier ran with exactly the cell's arguments (--force aside: the matrix
    passes it to every cell it runs, and a report written before it did has none)."""
    argv = (report or {}).get("provenance", {}).get("argv")
    return bool(report) and isinstance(argv, list) and _unforced(argv) == _unforced(cell.verifier_argv(report_arg))


def _unforced(argv: list) -> list:
    return [a for a in argv if a != "--force"]


def cell_error(outcome: CellOutcome | TaskFailure, report: dict | None, matches: bool) -> tuple[str, str] | None:
    """(kind, detail) when the cell's run is an ERROR cell, else None: the report is its result."""
    if isinstance(outcome, TaskFailure):
        return outcome.kind, outcome.detail
    rc = outcome.returncode
    if rc is None:
        return TIMEOUT, "the cell ran past its timeout and was stopped"
    if rc == EXIT_INTERRUPTED:
        return INTERRUPTED, "the verifier was interrupted (exit 130); no report written"
    if rc == EXIT_USAGE:
        return USAGE, "the verifier refused the cell's input (exit 2): " + _last_line(outcome.output_tail)
    if rc < 0:
        return CRASH, f"the verifier was killed by signal {-rc}"
    if not outcome.wrote_report or not matches:
        return NO_REPORT, f"the verifier exited {rc} without writing the cell's report: " + _last_line(
            outcome.output_tail
        )
    if exit_code(report) == EXIT_RUNTIME:
        errors = report.get("errors") or [{"arm": "?", "kind": "error", "detail": "an arm is ERROR"}]
        first = errors[0]
        return "engine-error", f"{first.get('arm')}: {first.get('kind')}: {first.get('detail')}"[:300]
    return None


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def needs_run(cell: Cell, report: dict | None, report_arg: str, previous: dict | None) -> bool:
    """--resume: rerun a cell whose report is missing, not this cell's, an ERROR, or whose last
    matrix run recorded it as an ERROR cell."""
    if not report_matches(report, cell, report_arg) or exit_code(report) == EXIT_RUNTIME:
        return True
    return bool(previous) and previous.get("status") != DONE


def divergence(probe: dict) -> str | None:
    """The probe's divergence class ("near-tie", "decisive", ...; several joined by "+") from the read
    model's classifier (repro.readmodel.Request.divergence_class); None when no request diverged."""
    requests = [Request.from_json(r) for r in probe.get("requests", []) if isinstance(r, dict)]
    classes = {r.divergence_class for r in requests} - {None}
    return "+".join(sorted(classes)) or None


def arm_rows(report: dict) -> list[dict]:
    """Each arm's verdict and, per probe, its verdict, KV verdict and near-tie flag (when present). Where
    the report records them (issue 18): the arm's LMCache copy path ("copy_path"), the class its trials
    or re-run alone gave its finding ("class"), and per probe the marks beside a FAIL ("conditions");
    where it ran scenarios (issue 23), the arm's verdict per scenario ("scenarios", scenario_marks);
    a report without them gives the rows it always gave."""
    rows = []
    report_read = Report.from_json(report)
    for arm, read in zip(report["arms"], report_read.arms):
        probes = {}
        for probe, read_probe in zip(arm["probes"], read.probes):
            kv = probe.get("kv")
            probes[probe["name"]] = {
                "verdict": probe.get("verdict"),
                "kv": kv.get("verdict") if isinstance(kv, dict) else None,
                "divergence": divergence(probe),
            }
            marks = read.marks_text(read_probe)
            if marks:
                probes[probe["name"]]["conditions"] = marks
        row = {"name": arm["name"], "mode": arm["mode"], "verdict": arm["verdict"], "probes": probes}
        extra = {
            "copy_path": copy_path_text(arm),
            "class": read.conditions.finding_class_text,
            "scenarios": scenario_marks(report_read, arm["name"]),
        }
        rows.append(row | {k: v for k, v in extra.items() if v})
    return rows


def scenario_marks(report: Report, arm: str) -> dict[str, dict]:
    """The arm's run of each scenario: its verdict, and where there are any, its KV verdict, its class and the
    requests that are not a PASS ('step 2 chat-511 FAIL'); {} for an arm that ran none (a report without
    scenarios)."""
    marks = {}
    for scenario in report.scenarios:
        found = scenario.arm(arm)
        if found is None:
            continue
        mark: dict = {"verdict": found.verdict}
        if found.kv_verdict is not None:
            mark["kv"] = found.kv_verdict
        if found.cls:
            mark["class"] = found.cls
        if found.failing:
            mark["requests"] = [f"{r.place} {r.verdict}" for r in found.failing]
        marks[scenario.name] = mark
    return marks


def scenario_names(cells: list[dict]) -> list[str]:
    """Every scenario any cell's arms ran, in the order first seen (none for a matrix without scenarios)."""
    names: list[str] = []
    for cell in cells:
        for arm in cell["arms"]:
            names += [s for s in arm.get("scenarios") or {} if s not in names]
    return names


# Arms whose LMCache copies also run in a server process of their own (the kit starts it).
SERVER_CONNECTORS = ("LMCacheMPConnector",)


def copy_paths(arm: dict) -> list[dict]:
    """Each LMCache process's copy path (repro.lmcache.signals.copy_paths). A report made before they were
    recorded has the engine's in its older `lmcache.cuda_ops` signal (read from the same fallback warning
    of LMCache in the arm's log): the engine's path from it, an MP arm's server as not recorded. [] for an
    arm without LMCache."""
    paths = [vars(p) | {k: getattr(p, k) or None for k in ("source", "detail")} for p in ArmConditions(arm).copy_paths]
    lm = arm.get("lmcache")
    old = lm.get("cuda_ops") if isinstance(lm, dict) else None
    if paths or not isinstance(old, str):
        return paths
    path = "compiled" if old.startswith("loaded") else "fallback" if old.startswith("not loaded") else None
    out = [{"process": "engine", "path": path or NOT_RECORDED, "source": None, "detail": f"cuda_ops: {old}"}]
    conn = arm.get("connector")
    if isinstance(conn, dict) and conn.get("name") in SERVER_CONNECTORS:
        out.append({"process": "MP server", "path": NOT_RECORDED, "source": None, "detail": "not recorded"})
    return out


def copy_path_text(arm: dict) -> str:
    """'engine compiled (wheel), MP server fallback'; '' for an arm without LMCache."""
    return ArmConditions({"copy_paths": copy_paths(arm)}).copy_path_text


def version(cell: dict, package: str) -> str | None:
    """A package's version in the cell's stack; None when not there or its probe failed ("unavailable: ...")."""
    found = (cell.get("versions") or {}).get(package)
    return None if not found or str(found).startswith("unavailable") else str(found)


def axes(cells: list[dict]) -> dict[str, dict[str, list[str]]]:
    """The version axes of a matrix: per axis (vllm, lmcache, copy_path), each value the done cells ran
    and those cells, in the order first seen. A cell without LMCache is under lmcache "none"; copy_path
    lists each LMCache arm's path (an arm's row says which arm)."""
    out: dict[str, dict[str, list[str]]] = {"vllm": {}, "lmcache": {}, "copy_path": {}}
    for cell in cells:
        if cell["status"] != DONE:
            continue
        found = {
            "vllm": [version(cell, "vllm") or NOT_RECORDED],
            "lmcache": [version(cell, "lmcache") or "none"],
        }
        found["copy_path"] = [a["copy_path"] for a in cell["arms"] if a.get("copy_path")]
        for axis, values in found.items():
            for value in values:
                names = out[axis].setdefault(str(value), [])
                if cell["name"] not in names:
                    names.append(cell["name"])
    return out


def versions(report: dict | None) -> dict:
    """The stack the cell's engines ran on: the engine child's versions, else the environment's."""
    if not report:
        return {}
    prov = report.get("provenance", {})
    found = prov.get("engine_versions") or (prov.get("engine_environment") or {}).get("packages") or {}
    return {k: found[k] for k in ("vllm", "lmcache", "torch", "python") if k in found}


def cell_record(
    cell: Cell,
    *,
    report_rel: str,
    report: dict | None,
    error: tuple[str, str] | None,
    ran: bool,
    outcome: CellOutcome | TaskFailure | None,
    page_rel: str | None,
) -> dict:
    """One cell of the summary. A cell kept by --resume (ran=False) carries its report as it was."""
    usable = report if error is None else None
    return {
        "name": cell.name,
        "environment": cell.environment,
        "python": cell.python,
        "connector": cell.connector,
        "fixture": cell.fixture,
        "model": cell.model,
        "seed": cell.seed,
        "flags": list(cell.flags),
        "status": DONE if error is None else ERROR,
        "error": None if error is None else {"kind": error[0], "detail": error[1], "output_tail": _tail(outcome)},
        "exit_code": exit_code(usable) if usable else None,
        "report": report_rel if usable else None,
        "page": page_rel if usable else None,
        "ran": ran,
        "wall_s": outcome.wall_s if isinstance(outcome, CellOutcome) else None,
        "node": outcome.node if isinstance(outcome, CellOutcome) else None,
        "hardware": usable.get("hardware_label") if usable else None,
        "versions": versions(usable),
        "arms": arm_rows(usable) if usable else [],
    }


def _tail(outcome: CellOutcome | TaskFailure | None) -> str | None:
    return outcome.output_tail if isinstance(outcome, CellOutcome) else None


def probe_names(cells: list[dict]) -> list[str]:
    """Every probe any cell ran, in the order first seen."""
    names: list[str] = []
    for cell in cells:
        for arm in cell["arms"]:
            names += [p for p in arm["probes"] if p not in names]
    return names


def matrix_exit_code(cells: list[dict]) -> int:
    """3 when any cell is an ERROR cell, 1 when any cell's report is a finding, else 0."""
    if any(c["status"] != DONE for c in cells):
        return EXIT_RUNTIME
    return EXIT_MISMATCH if any(c["exit_code"] != EXIT_OK for c in cells) else EXIT_OK
