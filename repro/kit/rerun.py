"""The kit README's first command: the lead finding run again from the unpacked kit exactly as written (its stack's
environment from the packed requirements, its model made by the kit with its seed, the verifier's command with no
path of the machine that made it), and which finding leads."""

from __future__ import annotations

from dataclasses import dataclass

from repro.kit.evidence import EXTRA_WHY, ChosenReport
from repro.plan.options import build_parser
from repro.readmodel import Report
from repro.readmodel.rerun import model_need, reproduce_argv, rerun_lines

CPU_PROFILE = "cpu"
# The CPU environment as `make repro PROFILE=cpu` makes it (torch's CPU build, the unwanted packages taken out):
# `make model` makes it on the way to the kit's default tiny model, and runs nothing else.
CPU_SETUP = "make model"
# Where no packed profile pins the report's stack, the maintainer names an environment that has it.
ANY_PYTHON = '"$PYTHON"'
ANY_SETUP = 'PYTHON="${PYTHON:?set PYTHON to the python of an environment with the report stack (README.md)}"'


@dataclass(frozen=True)
class Rerun:
    """A report's commands from the kit's root, and what they need and write."""

    lines: tuple[str, ...]  # one shell line each: the environment, the model, the verifier
    report: str  # where the rerun writes its report, relative to the kit ('reports/tiny-five-v028.json')
    model: str  # what --model gets ('.cache/models/kvkit-tiny-qwen3-seed6', a hub name, or MODEL_DIR)
    seed: int | None  # the generated tiny model's weight seed, where the report ran on it
    made_by_kit: bool  # the kit's command for the model is among the lines

    @property
    def block(self) -> str:
        """The lines as a fenced sh block."""
        return "```sh\n" + "\n".join(self.lines) + "\n```"


def setup_lines(profile: str) -> tuple[str, ...]:
    """The environment's lines: the CPU one through the Makefile, a GPU profile's from its packed requirements,
    else PYTHON, which the maintainer gives."""
    if profile == CPU_PROFILE:
        return (CPU_SETUP,)
    if profile:
        venv = f".venvs/{profile}"
        return (f"python3 -m venv {venv}", f"{venv}/bin/pip install -r requirements/{profile}.txt")
    return (ANY_SETUP,)


def build_rerun(report: Report, profile: str) -> Rerun:
    """The commands that run report again from the kit's root on its stack's profile ("" for none packed)."""
    python = f".venvs/{profile}/bin/python" if profile else ANY_PYTHON
    need = model_need(report.provenance)
    args = reproduce_argv(report.argv, need.argument)
    written = args[args.index("--report") + 1] if "--report" in args[:-1] else build_parser().get_default("report")
    lines = setup_lines(profile) + rerun_lines(report.argv, report.provenance, python)
    return Rerun(lines, written, need.argument, need.seed, need.made_by_kit)


def lead_report(reports: list[ChosenReport]) -> ChosenReport | None:
    """The finding the README's first command runs: the first report chosen with --report (the one the kit was
    built for), else the first default one; None for a kit that carries none."""
    return next((c for c in reports if c.why == EXTRA_WHY), reports[0] if reports else None)
