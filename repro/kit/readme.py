"""The kit's README.md for the maintainer: a view model of the findings, rendered from templates/kit-readme.md.j2."""

from __future__ import annotations

from dataclasses import dataclass

from repro import __version__
from repro.kit import KIT_NAME
from repro.kit.evidence import EVIDENCE, ChosenReport
from repro.paths import RAW_DIR
from repro.publish import issue_md
from repro.publish.environment import make_environment
from repro.readmodel import Report, as_report

TEMPLATE = "kit-readme.md.j2"
CPU_PROFILE = "cpu"
DIFF_TOKEN_LIMIT = 16  # tokens shown per list in the README's first diffs; the report JSON has them all


@dataclass(frozen=True)
class Finding:
    """One chosen report as the README shows it; every field is ready-made Markdown or plain text."""

    raw_path: str  # the report's path in the archive
    hardware: str
    day: str
    table: str  # issue_md's verdict table (arm titles, cached and diff cells from repro.readmodel)
    verdicts: str
    diffs: str
    stack: str
    profile: str  # the `make repro` profile matching the report's stack, or "" when none is packed
    command: str  # the report's exact command, as a fenced sh block
    model_sha256: str
    missing_logs: tuple[str, ...]

    @property
    def is_cpu(self) -> bool:
        return self.profile == CPU_PROFILE


def profile_for(report: Report, files: set[str]) -> str:
    """The `make repro` profile that matches a report's stack, or "" when none is packed."""
    if report.config.get("device") == "cpu":
        return CPU_PROFILE
    lmcache = str((report.provenance.get("packages") or {}).get("lmcache", ""))
    return f"gpu-lmcache-{lmcache}" if f"requirements/gpu-lmcache-{lmcache}.txt" in files else ""


def build_finding(c: ChosenReport, files: set[str]) -> Finding:
    r = as_report(c.report)
    return Finding(
        raw_path=f"{EVIDENCE}/{RAW_DIR}/{c.name}",
        hardware=r.hardware_label,
        day=r.day,
        table=issue_md.format_table(r),
        verdicts=issue_md.format_verdicts(r),
        diffs=issue_md.format_diffs(r, token_limit=DIFF_TOKEN_LIMIT),
        stack=issue_md.format_stack(r),
        profile=profile_for(r, files),
        command=issue_md.format_reproduce(r).split("\n\n")[0],
        model_sha256=str((r.provenance.get("model") or {}).get("sha256", "?")),
        missing_logs=c.missing_logs,
    )


def render_readme(commit: str, reports: list[ChosenReport], files: set[str], pages_note: str | None) -> str:
    """The README: what was found in each chosen report, the one command, verdicts, limits, integrity.

    files are the packed kit paths (a report's profile counts only when its requirements are packed);
    pages_note says why there are no rendered pages, or is None when there are."""
    return (
        make_environment()
        .get_template(TEMPLATE)
        .render(
            kit_name=KIT_NAME,
            version=__version__,
            commit=commit,
            findings=[build_finding(c, files) for c in reports],
            evidence=EVIDENCE,
            raw=RAW_DIR,
            pages_note=pages_note,
        )
    )
