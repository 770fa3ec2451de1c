"""Deciding verdicts: pure functions over token IDs and hit counters, no I/O.

PASS: every reuse reports a hit and matches the baseline exactly.
FAIL: a reuse that reports a hit differs from the baseline.
INCONCLUSIVE: the evidence cannot blame or clear reuse (missing or zero counters, a cold
request that was not a verified miss, a cold miss that already differs from the baseline, or no
reuse at all).
ERROR: the engine crashed, timed out or raised, the arms cannot be compared, or LMCache ran in
degraded mode; never turned into PASS.
SKIPPED: a probe a fixture declares the arm cannot run, with the reason (shown, never dropped).

This module is the one verdict authority: every decision is a pure function here that returns a
frozen record (ProbeVerdict, ArmVerdict). Other modules format and store verdicts; they never
write a verdict themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from repro.compare import first_diff

PASS, FAIL, INCONCLUSIVE, ERROR, SKIPPED = "PASS", "FAIL", "INCONCLUSIVE", "ERROR", "SKIPPED"
VERDICTS = (PASS, FAIL, INCONCLUSIVE, ERROR, SKIPPED)
# The arm-level failure kind for LMCache's degraded mode (the child failure kinds are in repro.contract).
LMCACHE_DEGRADED = "lmcache-degraded"
# An arm takes the worst verdict of its probes; a finding (FAIL) outranks missing evidence.
_SEVERITY = {PASS: 0, INCONCLUSIVE: 1, FAIL: 2, ERROR: 3}


@dataclass(frozen=True)
class Request:
    """One generation as observed: what came out and what the engine said it reused."""

    token_ids: tuple[int, ...]
    cached_tokens: int | None  # None: the engine reported nothing, which is never read as zero


@dataclass(frozen=True)
class ProbeVerdict:
    verdict: str
    reasons: tuple[str, ...]
    cold_first_diff: int | None
    reuse_first_diffs: tuple[int | None, ...] = field(default_factory=tuple)
    reuse_first_diffs_vs_cold: tuple[int | None, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class ArmVerdict:
    """An arm's verdict with its reasons; an ERROR names its kind and detail."""

    verdict: str
    reasons: tuple[str, ...]
    error_kind: str | None = None
    error_detail: str | None = None


def worst(verdicts: list[str] | tuple[str, ...]) -> str:
    """The most severe of some judged verdicts (SKIPPED is not judged); none at all is INCONCLUSIVE."""
    judged = [v for v in verdicts if v != SKIPPED]
    if not judged:
        return INCONCLUSIVE
    return max(judged, key=lambda v: _SEVERITY[v])


def decide_arm(probes: list[tuple[str, ProbeVerdict]] | tuple[tuple[str, ProbeVerdict], ...]) -> ArmVerdict:
    """The arm takes the worst verdict of its judged probes; every probe that is not PASS gives its reasons."""
    judged = [pv.verdict for _, pv in probes if pv.verdict != SKIPPED]
    reasons = [] if judged else ["no probe was run"]
    for name, pv in probes:
        if pv.verdict not in (PASS, SKIPPED):
            reasons += [f"{name}: {r}" for r in pv.reasons]
    return ArmVerdict(worst(judged), tuple(reasons))


def decide_skipped(reason: str) -> ProbeVerdict:
    """A probe the fixture says this arm cannot run: shown with its reason, never judged."""
    return ProbeVerdict(SKIPPED, (reason,), None)


def decide_shared_first_block(pv: ProbeVerdict, other_probe: str) -> ProbeVerdict:
    """A probe whose first block equals an earlier probe's could have been fed by it: not isolated,
    so neither a PASS nor a FAIL can be trusted (an ERROR stays an ERROR)."""
    if pv.verdict in (ERROR, SKIPPED):
        return pv
    reason = f"shares its first block with probe {other_probe}: probes are not isolated"
    return replace(pv, verdict=INCONCLUSIVE, reasons=(*pv.reasons, reason))


def decide_missing_baseline_probe() -> ProbeVerdict:
    return ProbeVerdict(INCONCLUSIVE, ("the baseline has no result for this probe",), None)


def decide_child_failure(kind: str, detail: str) -> ArmVerdict:
    """An engine child that delivered no usable result (a repro.contract failure kind)."""
    return ArmVerdict(ERROR, (f"{kind}: {detail}",), kind, detail)


def decide_no_baseline() -> ArmVerdict:
    return ArmVerdict(ERROR, ("the baseline arm failed: nothing to compare with",))


def decide_incomparable(problems: list[str] | tuple[str, ...]) -> ArmVerdict:
    """Arms that differ on what must match are never compared: ERROR naming every key."""
    return ArmVerdict(ERROR, tuple("refusing to compare: " + p for p in problems))


def decide_lmcache_degraded(current: ArmVerdict, degraded_messages: list[str] | tuple[str, ...]) -> ArmVerdict:
    """LMCache caught its own start-up failure and silently recomputes: the arm is ERROR, never PASS.
    An arm that is already an ERROR keeps its own error."""
    if not degraded_messages or current.verdict == ERROR:
        return current
    detail = "LMCache failed to start and ran in degraded mode (recompute, zero hits)"
    reason = f"{LMCACHE_DEGRADED}: LMCache failed to start and ran in degraded mode"
    return ArmVerdict(ERROR, (reason, *current.reasons), LMCACHE_DEGRADED, detail)


def decide_baseline_probe(cold: Request) -> ProbeVerdict:
    """The cache-disabled reference must itself report no reuse."""
    if cold.cached_tokens is None:
        return ProbeVerdict(INCONCLUSIVE, ("baseline hit counter missing: cannot confirm caching was off",), None)
    if cold.cached_tokens > 0:
        return ProbeVerdict(
            INCONCLUSIVE, (f"baseline reported {cold.cached_tokens} cached tokens with caching off",), None
        )
    return ProbeVerdict(PASS, (), None)


def decide_probe(
    baseline: tuple[int, ...],
    cold: Request,
    reuses: list[Request] | tuple[Request, ...],
    baseline_verdict: str = PASS,
) -> ProbeVerdict:
    """Verdict for one probe of a reuse arm: a cold request then N reuses, against the baseline.

    baseline_verdict is the baseline's own verdict on this probe: a reference that is not PASS
    (it reported cached tokens with caching off, say) can neither clear nor blame reuse."""
    cold_diff = first_diff(list(baseline), list(cold.token_ids))
    diffs = tuple(first_diff(list(baseline), list(r.token_ids)) for r in reuses)
    diffs_cold = tuple(first_diff(list(cold.token_ids), list(r.token_ids)) for r in reuses)
    reasons: list[str] = []
    if baseline_verdict != PASS:
        reasons.append(f"the baseline's own probe is {baseline_verdict}: it is not a reference")
    if cold.cached_tokens is None:
        reasons.append("cold request hit counter missing: not a verified miss")
    elif cold.cached_tokens > 0:
        reasons.append(f"cold request reported {cold.cached_tokens} cached tokens: not a verified miss")
    if cold_diff is not None:
        reasons.append(f"cold miss differs from baseline @{cold_diff}: reuse cannot be blamed")
    if not reuses:
        reasons.append("no reuse was compared")
    if reasons:
        return ProbeVerdict(INCONCLUSIVE, tuple(reasons), cold_diff, diffs, diffs_cold)

    failed, unproven = [], []
    for i, (req, diff) in enumerate(zip(reuses, diffs), start=1):
        if req.cached_tokens is None:
            unproven.append(f"reuse {i}: hit counter missing")
        elif req.cached_tokens == 0:
            unproven.append(f"reuse {i}: zero cached tokens, reuse not exercised")
        elif diff is not None:
            failed.append(f"reuse {i}: {req.cached_tokens} cached tokens, differs from baseline @{diff}")
    if failed:
        return ProbeVerdict(FAIL, tuple(failed + unproven), cold_diff, diffs, diffs_cold)
    if unproven:
        return ProbeVerdict(INCONCLUSIVE, tuple(unproven), cold_diff, diffs, diffs_cold)
    return ProbeVerdict(PASS, (), cold_diff, diffs, diffs_cold)
