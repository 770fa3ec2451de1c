"""What one verifier run of the watch gave: its exit code and wall time, why it gave no report when it did not, and
each arm's verdict, KV class and findings, read from its report through repro.readmodel (the one loader)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from repro.judge.verdict import ERROR, FAIL, INCONCLUSIVE, KV_FINDINGS
from repro.readmodel import Arm, Report, ScenarioArm
from repro.readmodel.arms import KV_TALLY_ORDER

DETAIL_CHARS = 240
# What two runs of one stack must share for their verdicts to be compared (else the comparison names the key):
# the fixture and model bytes, and the engine settings that change which blocks are reused and how.
COMPARABLE_CONFIG = ("block_size", "dtype", "max_tokens", "seed", "kv_cache_tokens", "max_model_len", "device")


def worst_kv(verdicts: list[str | None]) -> str | None:
    """The worst KV class among verdicts (findings first, then UNAVAILABLE, NUMERIC, EXACT); None: none audited."""
    seen = [v for v in verdicts if v is not None]
    ranked = [v for v in KV_TALLY_ORDER if v in seen]
    return (ranked or sorted(seen) or [None])[0]


def _kinds(verdict: str, kv: str | None) -> list[str]:
    """The kinds of finding one probe or scenario run shows: FAIL, and its KV finding (as repro.record.exit_rule)."""
    return ([FAIL] if verdict == FAIL else []) + ([kv] if kv in KV_FINDINGS else [])


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 1] + "…"


@dataclass(frozen=True)
class ArmOutcome:
    """One arm of one run (a plain arm, or an arm's run of one scenario): its verdict, KV class and findings."""

    run: str
    arm: str
    scenario: str | None
    verdict: str
    kv: str | None  # the worst KV class of its probes (a scenario run's own); None: not audited
    findings: tuple[str, ...]  # 'fixture: FAIL', 'fixture: CORRUPT' (a scenario run: 'FAIL', 'FOREIGN'), sorted
    planted: bool  # the kit's own planted connector (its findings are the kit's, never an upstream fix)
    detail: str = ""  # the error, or the first reason of an INCONCLUSIVE or FAIL
    # an expectation of this arm the fixture bound to an upstream bug, where the run judged it a change to look at
    # (repro.judge.upstream: fixed-upstream, bound-wrong, undecided): its state and the judge's sentence; "" if none
    upstream_state: str = ""
    upstream: str = ""

    @property
    def key(self) -> str:
        return " · ".join(p for p in (self.run, self.scenario, self.arm) if p)

    @property
    def state_text(self) -> str:
        """'FAIL, KV CORRUPT', 'PASS', 'ERROR'."""
        return self.verdict + (f", KV {self.kv}" if self.kv else "")

    def to_json(self) -> dict:
        return {"run": self.run, "arm": self.arm, "scenario": self.scenario, "verdict": self.verdict, "kv": self.kv,
                "findings": list(self.findings), "planted": self.planted, "detail": self.detail,
                "upstream_state": self.upstream_state, "upstream": self.upstream}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ArmOutcome:
        return cls(str(data["run"]), str(data["arm"]), data.get("scenario"), str(data["verdict"]), data.get("kv"),
                   tuple(str(f) for f in data.get("findings") or []), bool(data.get("planted")),
                   str(data.get("detail") or ""), str(data.get("upstream_state") or ""),
                   str(data.get("upstream") or ""))  # fmt: skip


@dataclass(frozen=True)
class RunOutcome:
    """One verifier run: how it ended, its report (None: it wrote none, and `error` says why) and its arms."""

    name: str
    report: str | None
    exit_code: int | None  # None: stopped at the watch's timeout
    wall_s: float
    error: str | None = None  # the run gave no usable report: why, one line
    comparable: Mapping[str, Any] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)
    arms: tuple[ArmOutcome, ...] = ()

    def to_json(self) -> dict:
        return {"name": self.name, "report": self.report, "exit_code": self.exit_code, "wall_s": self.wall_s,
                "error": self.error, "comparable": dict(self.comparable), "versions": dict(self.versions),
                "arms": [a.to_json() for a in self.arms]}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunOutcome:
        return cls(str(data["name"]), data.get("report"), data.get("exit_code"), float(data.get("wall_s") or 0.0),
                   data.get("error"), dict(data.get("comparable") or {}), dict(data.get("versions") or {}),
                   tuple(ArmOutcome.from_json(a) for a in data.get("arms") or []))  # fmt: skip


def _planted(arm: Arm | None) -> bool:
    return arm is not None and str(arm.connector_name or "").startswith("Planted")


def _plain(run: str, arm: Arm) -> ArmOutcome:
    findings = sorted(f"{p.name}: {kind}" for p in arm.probes for kind in _kinds(p.verdict, p.kv_verdict))
    if arm.verdict == ERROR:
        err = arm.error or {}
        detail = f"{err.get('kind', '?')}: {err.get('detail') or err.get('message') or ''}".rstrip(": ")
    else:
        detail = arm.reasons[0] if arm.verdict in (INCONCLUSIVE, FAIL) and arm.reasons else ""
    kv = worst_kv([p.kv_verdict for p in arm.probes])
    return ArmOutcome(run, arm.name, None, arm.verdict, kv, tuple(findings), _planted(arm), _short(detail))


def _scenario(run: str, scenario: str, arm: ScenarioArm, plain: Arm | None) -> ArmOutcome:
    detail = arm.error_text or (arm.reasons[0] if arm.verdict in (INCONCLUSIVE, FAIL) and arm.reasons else "")
    findings = tuple(sorted(_kinds(arm.verdict, arm.kv_verdict)))
    return ArmOutcome(run, arm.name, scenario, arm.verdict, arm.kv_verdict, findings, _planted(plain), _short(detail))


def arm_outcomes(run: str, report: Report) -> tuple[ArmOutcome, ...]:
    """Every plain arm (the baseline too: an ERROR there is the run's) and every arm's run of every scenario."""
    by_name = {a.name: a for a in report.arms}
    plain = [_plain(run, a) for a in report.arms]
    scenarios = [_scenario(run, s.name, a, by_name.get(a.name)) for s in report.scenarios for a in s.arms]
    return tuple(_with_upstream(o, report) for o in plain + scenarios)


def _with_upstream(outcome: ArmOutcome, report: Report) -> ArmOutcome:
    """The outcome with the first upstream bound of its arm (and scenario) that the run judged a change to look at."""
    for bound in report.upstream_changes:
        if bound.data.get("arm") == outcome.arm and bound.data.get("scenario") == outcome.scenario:
            return replace(outcome, upstream_state=bound.state, upstream=_short(bound.text))
    return outcome


def comparable_facts(report: Report) -> dict:
    """The facts two runs must share to be compared: the fixture's and the model's SHA-256 and COMPARABLE_CONFIG."""
    prov = report.provenance
    fixture = prov.get("fixture") if isinstance(prov.get("fixture"), Mapping) else {}
    model = prov.get("model") if isinstance(prov.get("model"), Mapping) else {}
    facts = {"fixture_sha256": fixture.get("sha256"), "model_sha256": model.get("sha256")}
    return facts | {k: report.config.get(k) for k in COMPARABLE_CONFIG}


def report_versions(report: Report) -> dict:
    """The stack as the run recorded it: vLLM, LMCache, torch and transformers ('—' where it recorded none)."""
    return {n: report.package_version(n) for n in ("vllm", "lmcache", "torch", "transformers")}


def read_outcome(name: str, report_path: str, report: Report, exit_code: int | None, wall_s: float) -> RunOutcome:
    return RunOutcome(name, report_path, exit_code, wall_s, None, comparable_facts(report), report_versions(report),
                      arm_outcomes(name, report))  # fmt: skip
