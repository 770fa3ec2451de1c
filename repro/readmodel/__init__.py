"""The read model: a report of any version this kit reads, loaded once into frozen records (report,
arm, probe, request, KV audit, divergence, replay, conditions, scenario) whose derived facts are properties.
The text summary, the site, the issue Markdown, the matrix page and bench-figures read only these;
the report JSON on disk stays the contract (repro.record.report writes and strictly loads it)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from repro.readmodel.arms import Arm, ArmAudit, floor_rel_text, floor_text
from repro.readmodel.conditions import ArmConditions, ConditionMark, CopyPath, RunConditions, TrialRate
from repro.readmodel.probes import KV_FINER_LEGEND, Probe, ProbeKV, kv_blame_text
from repro.readmodel.reports import DEVICE_UNRECORDED, Report, commit_label
from repro.readmodel.requests import (
    DIVERGENCE_LEGEND,
    REPLAY_LEGEND,
    BlamedChunk,
    Divergence,
    Replay,
    Request,
    RequestAudit,
    margin_class,
)
from repro.readmodel.scenario_requests import ControlRequest, ScenarioControl, StepRequest
from repro.readmodel.scenarios import Scenario, ScenarioArm, Step

__all__ = [
    "DEVICE_UNRECORDED",
    "DIVERGENCE_LEGEND",
    "KV_FINER_LEGEND",
    "REPLAY_LEGEND",
    "Arm",
    "ArmAudit",
    "ArmConditions",
    "BlamedChunk",
    "ConditionMark",
    "ControlRequest",
    "CopyPath",
    "Divergence",
    "Probe",
    "ProbeKV",
    "Replay",
    "Report",
    "Request",
    "RequestAudit",
    "RunConditions",
    "Scenario",
    "ScenarioArm",
    "ScenarioControl",
    "Step",
    "StepRequest",
    "TrialRate",
    "as_report",
    "commit_label",
    "floor_rel_text",
    "floor_text",
    "kv_blame_text",
    "margin_class",
    "read_report",
]


def read_report(path: str | Path) -> Report:
    """The report at path, strictly loaded (kind and version, repro.record.report.load_report), as records."""
    from repro.record.report import load_report  # the writer's module; it never imports the read model

    return Report.from_json(load_report(path))


def as_report(report: Report | Mapping[str, Any]) -> Report:
    """The one door from a report's JSON (a dict the verifier just built, or one a test made) to the
    records; a Report passes through. Every view's entry point calls this once."""
    return report if isinstance(report, Report) else Report.from_json(report)
