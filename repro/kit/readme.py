"""The kit's README.md for the maintainer: a view model of the findings, rendered from templates/kit-readme.md.j2."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from repro import __version__
from repro.kit import EVIDENCE, KIT_NAME, PAGES_COMMAND
from repro.kit.evidence import ChosenReport, LeftOut
from repro.paths import RAW_DIR
from repro.publish import issue_md
from repro.publish.environment import make_environment
from repro.publish.headline import headline
from repro.readmodel import Report, as_report

TEMPLATE = "kit-readme.md.j2"
CPU_PROFILE = "cpu"
DIFF_TOKEN_LIMIT = 16  # tokens shown per list in the README's first diffs; the report JSON has them all


@dataclass(frozen=True)
class Finding:
    """One chosen report as the README shows it; every field is ready-made Markdown or plain text."""

    raw_path: str  # the report's path in the archive
    headline: str  # the finding in one sentence (repro.publish.headline)
    why: str  # why the kit carries it
    hardware: str
    day: str
    table: str  # issue_md's verdict table (arm titles, cached and diff cells from repro.readmodel)
    verdicts: str
    diffs: str
    stack: str
    profile: str  # the packed `make repro` profile that installs the report's stack, or ""
    command: str  # the report's exact command, as a fenced sh block
    model_sha256: str
    missing_logs: tuple[str, ...]

    @property
    def is_cpu(self) -> bool:
        return self.profile == CPU_PROFILE


def profile_for(report: Report, files: Mapping[str, bytes]) -> str:
    """The packed `make repro` profile that installs a report's stack (its vLLM and LMCache pins), or ""."""
    if report.config.get("device") == "cpu":
        return CPU_PROFILE
    packages = report.provenance.get("packages") or {}
    profile = f"gpu-lmcache-{packages.get('lmcache', '')}"
    pins = files.get(f"requirements/{profile}.txt", b"").decode("utf-8", errors="replace").split()
    return profile if f"vllm=={packages.get('vllm', '')}" in pins else ""


def build_finding(c: ChosenReport, files: Mapping[str, bytes]) -> Finding:
    r = as_report(c.report)
    return Finding(
        raw_path=c.raw_path,
        headline=headline(r),
        why=c.why,
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


def render_readme(commit: str, reports: list[ChosenReport], left_out: list[LeftOut], files: Mapping[str, bytes]) -> str:
    """The README: what was found in each chosen report, the evidence carried and left out (with why and
    where it is), the one command, verdicts, limits, integrity.

    files are the packed kit files by path (a report's profile counts only when its requirements are packed
    and pin the report's vLLM and LMCache)."""
    return (
        make_environment()
        .get_template(TEMPLATE)
        .render(
            kit_name=KIT_NAME,
            version=__version__,
            commit=commit,
            findings=[build_finding(c, files) for c in reports],
            left_out=left_out,
            evidence=EVIDENCE,
            raw=RAW_DIR,
            pages_command=" ".join(PAGES_COMMAND),
        )
    )
