"""The kit's evidence: the reports it carries (its default ones, plus --report), the logs and writeups they
bring, and the committed reports it leaves out, each named with why."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from repro.errors import UsageError
from repro.kit import EVIDENCE
from repro.kit.git import committed_files, read_blob
from repro.paths import RAW_DIR
from repro.record.atomic import dumps_json
from repro.record.compact import packed_report
from repro.record.report import REPORT_KIND

# What a kit carries unless told otherwise, in the order its README shows them: the evidence behind the finding
# it is attached for (LMCacheConnectorV1 serving wrong KV), and nothing else. A maintainer on an upstream issue asks
# whether it happens on the stack the kit's reference command installs (the packed gpu-lmcache-0.5.4 profile:
# vLLM 0.28.0, LMCache's own compiled ops rather than its torch fallback), what exactly is wrong, and whether the
# newest release still does it. The other committed reports (runs these supersede, a timing run, a rejected
# configuration, the MP connector's runs, the studies and matrices) stay in the repository; the kit's README
# names each. Pages are not packed: the kit renders them from these files on demand (PAGES_COMMAND). Every
# committed top-level report with its page made a 1.24 MB kit, over the 1 MB MAX_KIT_BYTES of the time; these three with their logs
# and writeups are about 165 KB of gzip.
DEFAULT_REPORTS: Mapping[str, str] = {
    "reports/conditions/h200-conditions-tiny-five-v028.json": (
        "the finding on the stack the packed gpu-lmcache-0.5.4 profile installs (H200, vLLM 0.28.0, torch 2.13, "
        "LMCache 0.5.4 with its wheel's compiled ops): LMCacheConnectorV1 counts cache hits, answers differently "
        "and its reused KV is corrupt, while the controls beside it all PASS (LMCacheMPConnector, native prefix "
        "caching, and native prefix caching at LMCache's reuse lengths)"
    ),
    "reports/h200-kvaudit-lmcache-0.5.4.json": (
        "the KV audit's run whose writeup says what the wrong bytes are: the previous request's KV, still in the "
        "blocks attention read (H200, vLLM 0.26.0, LMCache 0.5.4 on its torch fallback)"
    ),
    "reports/h200-kvaudit-lmcache-0.5.6.json": (
        "the same run on LMCache 0.5.6, the newest release tested: the same tokens and the same corrupt blocks"
    ),
}
EXTRA_WHY = "chosen when the kit was built (--report)"
REPORTS_DIR = "reports"

LogReader = Callable[[str], bytes | None]  # a path relative to the report -> its bytes, or None when absent


@dataclass(frozen=True)
class ChosenReport:
    name: str  # file name in evidence/raw/
    data: bytes
    report: dict
    logs: dict[str, bytes]  # cited log path (relative to the report) -> bytes
    missing_logs: tuple[str, ...]
    writeup: bytes | None = None  # reports/<stem>.md beside the report, rendered on its page
    why: str = EXTRA_WHY  # why the kit carries it

    @property
    def writeup_name(self) -> str:
        return f"{Path(self.name).stem}.md"

    @property
    def raw_path(self) -> str:
        """The report's path in the archive."""
        return f"{EVIDENCE}/{RAW_DIR}/{self.name}"

    def inputs(self) -> dict[str, bytes]:
        """Everything the report brings, by path relative to its directory: itself, its logs, its writeup."""
        extra = {self.writeup_name: self.writeup} if self.writeup is not None else {}
        return {self.name: self.data, **self.logs, **extra}


@dataclass(frozen=True)
class LeftOut:
    """A committed report, or a folder of them, that the kit does not carry."""

    path: str  # in the repository at the packed commit
    about: str  # what it is: its writeup's title, a folder's count, or "" when nothing says


def report_logs(report: dict) -> list[str]:
    """The logs a report cites (arm["log"], relative to the report's directory), sorted, unique."""
    logs = {a["log"] for a in report.get("arms", []) if isinstance(a.get("log"), str) and a["log"]}
    for rel in logs:
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise UsageError(f"report cites a log outside its directory: {rel}")
    return sorted(logs)


def choose_report(name: str, data: bytes, log_reader: LogReader, why: str = EXTRA_WHY) -> ChosenReport:
    """Parse a chosen report and fetch what it cites through log_reader. A schema_version 2 report is packed as
    version 3 (repro.record.compact: its KV grid's figures in runs, lossless, the pages the same), which takes
    about 6 % off the SmolLM2 H200 report's gzip; any other version is packed byte for byte."""
    try:
        report = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"report {name}: not valid JSON ({exc})") from None
    if not isinstance(report, dict) or report.get("kind") != REPORT_KIND:
        raise UsageError(f"report {name}: not a {REPORT_KIND} file")
    packed = packed_report(report)
    if packed is not report:
        report, data = packed, dumps_json(packed).encode("utf-8")
    logs, missing = {}, []
    for rel in report_logs(report):
        blob = log_reader(rel)
        if blob is None:
            missing.append(rel)
        else:
            logs[rel] = blob
    return ChosenReport(name, data, report, logs, tuple(missing), log_reader(f"{Path(name).stem}.md"), why)


def committed_reader(root: Path, commit: str, base: Path, tracked: set[str]) -> LogReader:
    """Reads what a committed report cites from the commit, never from the working tree."""

    def read(rel: str) -> bytes | None:
        path = (base / rel).as_posix()
        return read_blob(root, commit, path) if path in tracked else None

    return read


def disk_reader(base: Path) -> LogReader:
    """Reads what a --report file cites from beside it on disk."""
    return lambda rel: (base / rel).read_bytes() if (base / rel).is_file() else None


def writeup_title(blob: bytes | None) -> str:
    """The first Markdown heading of a report's writeup, as one line ("" without one)."""
    lines = (blob or b"").decode("utf-8", errors="replace").splitlines()
    return next((line.lstrip("#").strip() for line in lines if line.startswith("#")), "")


def left_out_reports(root: Path, commit: str, tracked: set[str], carried: set[str]) -> list[LeftOut]:
    """The commit's top-level reports/*.json whose name the kit does not carry, each with its writeup's title,
    then each folder under reports/ (studies, matrices, conditions) with how many of its JSON files it leaves out."""
    top, folders = [], {}
    for path in sorted(tracked):
        parts = path.split("/")
        if parts[0] != REPORTS_DIR or len(parts) < 2 or not path.endswith(".json") or parts[-1] in carried:
            continue
        if len(parts) > 2:
            folders[f"{REPORTS_DIR}/{parts[1]}/"] = folders.get(f"{REPORTS_DIR}/{parts[1]}/", 0) + 1
        else:
            writeup = path.removesuffix(".json") + ".md"
            top.append(LeftOut(path, writeup_title(read_blob(root, commit, writeup) if writeup in tracked else None)))
    return top + [LeftOut(p, f"{n} JSON file{'s' if n != 1 else ''} left out") for p, n in folders.items()]


def gather_reports(
    root: Path, commit: str, extra: list[str], defaults: Mapping[str, str] = DEFAULT_REPORTS
) -> tuple[list[ChosenReport], list[LeftOut]]:
    """The default reports in their order (from the commit, with their logs), then each --report PATH by
    name (logs from disk); and what the commit's reports/ holds that the kit leaves out. A default report the
    commit lacks is an error, never a silent drop; a --report that is a default one, byte for byte, is
    carried once."""
    tracked = {p for p, _ in committed_files(root, commit)}
    chosen: list[ChosenReport] = []
    extras: list[ChosenReport] = []
    for path, why in defaults.items():
        if path not in tracked:
            raise UsageError(
                f"the kit's default report {path} is not in commit {commit[:7]}: commit it, or change "
                "DEFAULT_REPORTS in repro/kit/evidence.py"
            )
        reader = committed_reader(root, commit, Path(path).parent, tracked)
        chosen.append(choose_report(Path(path).name, read_blob(root, commit, path), reader, why))
    for path in extra:
        p = Path(path)
        if not p.is_file():
            raise UsageError(f"--report {path}: no such file")
        extra = choose_report(p.name, p.read_bytes(), disk_reader(p.parent))
        if not any(c.name == extra.name and c.data == extra.data for c in chosen + extras):
            extras.append(extra)
    chosen += sorted(extras, key=lambda c: c.name)
    names = [c.name for c in chosen]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UsageError(f"two chosen reports share a file name: {', '.join(dupes)}; rename one")
    return chosen, left_out_reports(root, commit, tracked, set(names))


def evidence_files(reports: list[ChosenReport]) -> dict[str, bytes]:
    """evidence/raw/: each report, the logs it cites and its writeup, laid out as the site's raw/ folder so
    that PAGES_COMMAND renders their pages from the kit's own files. Keys are archive paths; two reports
    that bring one path with different bytes are refused, never one silently replacing the other."""
    files: dict[str, bytes] = {}
    for c in reports:
        for rel, blob in c.inputs().items():
            path = f"{EVIDENCE}/{RAW_DIR}/{rel}"
            if files.setdefault(path, blob) != blob:
                raise UsageError(f"two chosen reports bring {rel} with different bytes; rename one report's logs")
    return dict(sorted(files.items()))
