"""The kit's evidence: the chosen reports, the logs and writeups they bring, and their rendered pages."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from repro.errors import UsageError
from repro.kit.git import committed_files, committed_reports, read_blob
from repro.paths import RAW_DIR
from repro.publish.site import render_site
from repro.report import REPORT_KIND

EVIDENCE = "evidence"  # the archive's folder for the rendered site; reports and logs under its RAW_DIR

LogReader = Callable[[str], bytes | None]  # a path relative to the report -> its bytes, or None when absent


@dataclass(frozen=True)
class ChosenReport:
    name: str  # file name in evidence/raw/
    data: bytes
    report: dict
    logs: dict[str, bytes]  # cited log path (relative to the report) -> bytes
    missing_logs: tuple[str, ...]
    writeup: bytes | None = None  # reports/<stem>.md beside the report, rendered on its page

    @property
    def writeup_name(self) -> str:
        return f"{Path(self.name).stem}.md"

    def inputs(self) -> dict[str, bytes]:
        """Everything the report brings, by path relative to its directory: itself, its logs, its writeup."""
        extra = {self.writeup_name: self.writeup} if self.writeup is not None else {}
        return {self.name: self.data, **self.logs, **extra}


def report_logs(report: dict) -> list[str]:
    """The logs a report cites (arm["log"], relative to the report's directory), sorted, unique."""
    logs = {a["log"] for a in report.get("arms", []) if isinstance(a.get("log"), str) and a["log"]}
    for rel in logs:
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise UsageError(f"report cites a log outside its directory: {rel}")
    return sorted(logs)


def choose_report(name: str, data: bytes, log_reader: LogReader) -> ChosenReport:
    """Parse a chosen report and fetch what it cites through log_reader."""
    try:
        report = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"report {name}: not valid JSON ({exc})") from None
    if not isinstance(report, dict) or report.get("kind") != REPORT_KIND:
        raise UsageError(f"report {name}: not a {REPORT_KIND} file")
    logs, missing = {}, []
    for rel in report_logs(report):
        blob = log_reader(rel)
        if blob is None:
            missing.append(rel)
        else:
            logs[rel] = blob
    return ChosenReport(name, data, report, logs, tuple(missing), log_reader(f"{Path(name).stem}.md"))


def committed_reader(root: Path, commit: str, base: Path, tracked: set[str]) -> LogReader:
    """Reads what a committed report cites from the commit, never from the working tree."""

    def read(rel: str) -> bytes | None:
        path = (base / rel).as_posix()
        return read_blob(root, commit, path) if path in tracked else None

    return read


def disk_reader(base: Path) -> LogReader:
    """Reads what a --report file cites from beside it on disk."""
    return lambda rel: (base / rel).read_bytes() if (base / rel).is_file() else None


def gather_reports(root: Path, commit: str, extra: list[str], use_committed: bool = True) -> list[ChosenReport]:
    """Committed reports/*.json (logs from the commit), then each --report PATH (logs from disk)."""
    chosen: list[ChosenReport] = []
    if use_committed:
        tracked = {p for p, _ in committed_files(root, commit)}
        for path in committed_reports(root, commit):
            reader = committed_reader(root, commit, Path(path).parent, tracked)
            chosen.append(choose_report(Path(path).name, read_blob(root, commit, path), reader))
    for path in extra:
        p = Path(path)
        if not p.is_file():
            raise UsageError(f"--report {path}: no such file")
        chosen.append(choose_report(p.name, p.read_bytes(), disk_reader(p.parent)))
    names = [c.name for c in chosen]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UsageError(f"two chosen reports share a file name: {', '.join(dupes)}; rename one")
    return sorted(chosen, key=lambda c: c.name)


def render_pages(reports: list[ChosenReport], scratch: Path) -> tuple[dict[str, bytes], str | None]:
    """The site pages of the chosen reports (repro.publish.site), or a note on why there are none."""
    if not reports:
        return {}, "no report chosen, so no pages"
    reports_dir, out_dir = scratch / "reports", scratch / "site"
    for c in reports:
        for rel, blob in c.inputs().items():
            (reports_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (reports_dir / rel).write_bytes(blob)
    out_dir.mkdir(parents=True, exist_ok=True)
    render_site(reports_dir, out_dir)
    pages = {p.relative_to(out_dir).as_posix(): p.read_bytes() for p in sorted(out_dir.rglob("*")) if p.is_file()}
    return pages, None if pages else "the site renderer wrote no pages"


def evidence_files(reports: list[ChosenReport], scratch: Path) -> tuple[dict[str, bytes], str | None]:
    """evidence/ is the rendered site: pages at its root, reports, cited logs and writeups under raw/,
    where the site links them. The raw copies are packed by the kit itself, so they are there without
    pages too. Keys are archive paths; the note says why there are no pages."""
    files = {f"{RAW_DIR}/{rel}": blob for c in reports for rel, blob in c.inputs().items()}
    pages, note = render_pages(reports, scratch)
    for rel, blob in pages.items():
        if rel in files and files[rel] != blob:
            raise UsageError(f"the site renderer wrote {rel} with bytes that differ from the chosen input")
        files[rel] = blob
    return {f"{EVIDENCE}/{rel}": blob for rel, blob in sorted(files.items())}, note
