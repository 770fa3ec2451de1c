"""One arm of a report as the read model holds it: its title, verdict with its divergence classes and
conditions, its probes, and its KV audit (status and measured floor)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from repro.judge.approximate import approximation_text, setting_text
from repro.judge.verdict import (
    DECISIVE,
    EXACT,
    FAIL,
    KV_FINDINGS,
    NEAR_TIE,
    NUMERIC,
    UNAVAILABLE,
    UNCLASSED,
    DivergenceTally,
    tally_divergences,
)
from repro.judge.wording import number
from repro.readmodel.conditions import ArmConditions, ConditionMark
from repro.readmodel.probes import Probe, finding_text

# The order a tally lists KV verdicts in: findings first (CORRUPT, FOREIGN, MISPLACED), then the rest.
KV_TALLY_ORDER = (*KV_FINDINGS, UNAVAILABLE, NUMERIC, EXACT)


def floor_text(floor: object) -> str:
    """How far the arm's own cold prefill KV differed from the baseline's: the bound for the numeric class."""
    if not isinstance(floor, Mapping) or not floor.get("cells"):
        return "floor not measured (no cold prefill was compared)"
    over = f" over {floor['cells']} cells"
    if floor.get("identical"):
        return f"floor 0: the cold prefill's KV is bit-identical to the baseline's{over}"
    if floor.get("rel") is None:
        return f"floor not measured: the cold prefill's relative error is not a finite number{over}"
    return f"floor rel {number(floor.get('rel'))} (max abs {number(floor.get('max_abs'))}){over}"


def floor_rel_text(floor: object) -> str:
    """'floor rel 3.1e-07', 'floor rel 0 (bit-identical)' or 'floor not measured': for a caption."""
    if not isinstance(floor, Mapping) or not floor.get("cells"):
        return "floor not measured"
    if floor.get("identical"):
        return "floor rel 0 (bit-identical)"
    rel = floor.get("rel")
    return "floor not measured" if rel is None else f"floor rel {number(rel)}"


@dataclass(frozen=True)
class ArmAudit:
    """The arm's KV audit: reference (the baseline), ok with its measured floor, or why it did not run."""

    data: Mapping[str, Any] = field(repr=False)

    @property
    def floor(self) -> object:
        return self.data.get("floor")

    @property
    def text(self) -> str:
        """'KV audit: ok · floor rel …', 'KV audit: reference KV recorded (…)', 'KV audit: unavailable (why)'."""
        audit = self.data
        status = str(audit.get("status"))
        reason = f" ({audit['reason']})" if audit.get("reason") else ""
        if status == "reference":
            shape = audit.get("kv_shape")
            layout = ", ".join(
                part
                for part in (
                    f"{audit.get('layers')} layers" if audit.get("layers") is not None else "",
                    f"layout {audit['layout']}" if audit.get("layout") else "",
                    f"dtype {audit['dtype']}" if audit.get("dtype") else "",
                    f"shape {'×'.join(map(str, shape))}" if isinstance(shape, list) and shape else "",
                )
                if part
            )
            return f"KV audit: reference KV recorded{reason}" + (f" ({layout})" if layout else "")
        if status == "ok":
            return f"KV audit: ok{reason} · {floor_text(self.floor)}"
        return f"KV audit: {status}{reason}"


@dataclass(frozen=True)
class Member:
    """One member of a MultiConnector arm (repro.judge.members): the reuses it served, its hits and verdict."""

    data: Mapping[str, Any]

    @property
    def verdict(self) -> str:
        return self.data["verdict"]

    @property
    def line(self) -> str:
        """'member 0 ExampleConnector: served 2 reuses, 2976 tokens · PASS', then why where it is no PASS."""
        n = len(self.data.get("reuses_served") or [])
        name = f"member {self.data['index']} {self.data['connector']}"
        text = f"{name}: served {n} reuse{'' if n == 1 else 's'}, {self.data.get('hits', 0)} tokens · {self.verdict}"
        reasons = self.data.get("reasons") or []
        return f"{text} — {reasons[0].removeprefix(name + ' ')}" if reasons else text


@dataclass(frozen=True)
class Arm:
    """One arm: baseline, native prefix caching or a connector; its verdict, probes and conditions."""

    data: Mapping[str, Any] = field(repr=False)
    probes: tuple[Probe, ...]
    kv_audit: ArmAudit | None
    conditions: ArmConditions

    @classmethod
    def from_json(cls, data: Mapping[str, Any], block_size: int | None) -> Arm:
        probes = tuple(Probe.from_json(p, block_size) for p in data.get("probes") or [])
        audit = data.get("kv_audit")
        return cls(data, probes, ArmAudit(audit) if isinstance(audit, dict) else None, ArmConditions(data))

    @property
    def name(self) -> str:
        return self.data["name"]

    @property
    def mode(self) -> str:
        return self.data["mode"]

    @property
    def is_baseline(self) -> bool:
        return self.mode == "baseline"

    @property
    def verdict(self) -> str:
        return self.data["verdict"]

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(self.data.get("reasons") or [])

    @property
    def findings(self) -> tuple[str, ...]:
        return tuple(str(f) for f in self.data.get("findings") or [])

    @property
    def error(self) -> Mapping[str, Any] | None:
        return self.data.get("error") or None

    @property
    def members(self) -> tuple[Member, ...]:
        """A MultiConnector arm's members, in its order; () for any other arm."""
        return tuple(Member(m) for m in self.data.get("members") or [])

    @property
    def connector_name(self) -> object:
        return (self.data.get("connector") or {}).get("name")

    @property
    def approximation(self) -> str:
        """'approximate by design: --cache-reuse 16, …' for an arm whose reuse path its engine documents as
        approximate (repro.judge.approximate); '' for any other."""
        conn = self.data.get("connector") or {}
        return approximation_text(conn.get("name"), conn.get("extra_config"))

    @property
    def matched_to(self) -> object:
        return self.data.get("matched_to")

    @property
    def log(self) -> object:
        return self.data.get("log")

    @property
    def effective_config(self) -> Mapping[str, Any] | None:
        """The engine's configuration as the child recorded it (free-form: shown flattened)."""
        return self.data.get("effective_config")

    @property
    def lmcache(self) -> Mapping[str, Any]:
        """LMCache's own signals and logged configuration on this arm ({} without LMCache)."""
        return self.data.get("lmcache") or {}

    @property
    def versions(self) -> Mapping[str, Any]:
        return self.data.get("versions") or {}

    @property
    def timing(self) -> Mapping[str, Any]:
        return self.data.get("timing") or {}

    @property
    def title(self) -> str:
        """'baseline', 'native prefix caching', the connector's name, or 'ARM (CONNECTOR)'."""
        if self.mode == "baseline":
            return "baseline"
        if self.mode == "native":
            if self.matched_to:
                return f"native prefix caching, matched to {self.matched_to}"
            if self.name == "endpoint":  # repro endpoint's arm: judged as native is, on a server the kit did not start
                return "endpoint (a server the kit did not start)"
            return "native prefix caching"
        connector = self.connector_name
        title = self.name if self.name == connector else f"{self.name} ({connector})"
        # named on every page and table that shows the arm, so that no cell reads its FAIL as a broken cache
        setting = setting_text(connector, (self.data.get("connector") or {}).get("extra_config"))
        return f"{title}, approximate by design ({setting})" if setting else title

    def probe(self, name: str) -> Probe | None:
        return next((p for p in self.probes if p.name == name), None)

    @cached_property
    def divergences(self) -> DivergenceTally:
        """The divergences counted by class: every reuse that differed in a FAIL probe, one each."""
        return tally_divergences(g.cls for p in self.probes for g in p.classed_divergences for _ in range(g.count))

    @property
    def class_text(self) -> str:
        """'near-ties only: 2', 'decisive: 6', 'decisive: 1, near-tie: 1' for a FAIL arm; '' for any other."""
        if self.verdict != FAIL:
            return ""
        tally = self.divergences
        if not tally.total:
            return ""
        if tally.near_ties_only:
            return f"near-ties only: {tally.near_tie}"
        counts = ((DECISIVE, tally.decisive), (NEAR_TIE, tally.near_tie), (UNCLASSED, tally.unclassed))
        return ", ".join(f"{cls}: {n}" for cls, n in counts if n)

    @property
    def finding_text(self) -> str:
        """'tenant-isolation failure on short-b': its probes' findings that no fixture's FAIL excuses; '' for none."""
        return finding_text([(p.finding, p.name) for p in self.probes if p.finding])

    @property
    def near_ties_only(self) -> bool:
        """A FAIL whose every divergence is a near-tie (its own badge)."""
        return bool(self.class_text) and self.divergences.near_ties_only

    @property
    def verdict_text(self) -> str:
        """'FAIL (near-ties only: 2)', 'FAIL (decisive: 6) · contention-dependent: clean when re-run alone';
        other verdicts as they are; a report without trials or a confirmation keeps the bare verdict."""
        note = self.class_text
        text = f"{self.verdict} ({note})" if note else str(self.verdict)
        if self.finding_text:  # a finding no fixture's FAIL excuses, by name (repro.judge.verdict.FINDINGS)
            text += f" · {self.finding_text}"
        qualifier = self.conditions.finding_class_text
        text = f"{text} · {qualifier}" if qualifier else text
        idle = [
            f"member {m.data['index']} {m.data['connector']}" for m in self.members if not m.data.get("reuses_served")
        ]
        return f"{text} · not exercised: {', '.join(idle)}" if idle else text  # a MultiConnector's PASS is not theirs

    @property
    def kv_text(self) -> str:
        """'KV audit: ok · floor rel …', …, or 'KV audit: not run'."""
        return self.kv_audit.text if self.kv_audit is not None else "KV audit: not run"

    @property
    def kv_floor(self) -> object:
        return self.kv_audit.floor if self.kv_audit is not None else None

    @property
    def kv_tally(self) -> str:
        """'CORRUPT×2 · MISPLACED×1 · EXACT×2': the probes counted by KV verdict, findings first; '—' when none was
        audited."""
        counts: dict[str, int] = {}
        for probe in self.probes:
            if probe.kv_verdict is not None:
                counts[probe.kv_verdict] = counts.get(probe.kv_verdict, 0) + 1
        order = [v for v in KV_TALLY_ORDER if v in counts] + sorted(v for v in counts if v not in KV_TALLY_ORDER)
        return " · ".join(f"{v}×{counts[v]}" for v in order) or "—"

    @property
    def kv_worst(self) -> str | None:
        """The first KV verdict of KV_TALLY_ORDER among its probes (a finding before UNAVAILABLE, NUMERIC, EXACT);
        None when none was audited."""
        found = {p.kv_verdict for p in self.probes if p.kv_verdict is not None}
        return next((v for v in KV_TALLY_ORDER if v in found), min(found, default=None))

    def marks(self, probe: Probe) -> tuple[ConditionMark, ...]:
        """The marks beside a probe's FAIL (or KV finding): 'intermittent 3/5', '5/5 trials', 'contention-dependent'."""
        return self.conditions.marks(probe.name) if probe.is_finding else ()

    def marks_text(self, probe: Probe) -> str:
        """'intermittent 3/5, contention-dependent'; '' when nothing qualifies the probe's verdict."""
        return ", ".join(m.text for m in self.marks(probe))
