"""Deciding verdicts: pure functions over token IDs and hit counters, no I/O.

PASS: every reuse reports a hit and matches the baseline exactly.
FAIL: a reuse that reports a hit differs from the baseline.
INCONCLUSIVE: the evidence cannot blame or clear reuse (missing or zero counters, a cold
request that was not a verified miss, a cold miss that already differs from the baseline, or no
reuse at all).
ERROR: the engine crashed, timed out or raised; decided by the runner, never turned into PASS.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from repro.compare import first_diff

PASS, FAIL, INCONCLUSIVE, ERROR = "PASS", "FAIL", "INCONCLUSIVE", "ERROR"
VERDICTS = (PASS, FAIL, INCONCLUSIVE, ERROR)
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


def worst(verdicts: list[str] | tuple[str, ...]) -> str:
    """The arm verdict: the most severe of its probes; no probes at all is INCONCLUSIVE."""
    if not verdicts:
        return INCONCLUSIVE
    return max(verdicts, key=lambda v: _SEVERITY[v])


def decide_baseline_probe(cold: Request) -> ProbeVerdict:
    """The cache-disabled reference must itself report no reuse."""
    if cold.cached_tokens is None:
        return ProbeVerdict(INCONCLUSIVE, ("baseline hit counter missing: cannot confirm caching was off",), None)
    if cold.cached_tokens > 0:
        return ProbeVerdict(
            INCONCLUSIVE, (f"baseline reported {cold.cached_tokens} cached tokens with caching off",), None
        )
    return ProbeVerdict(PASS, (), None)


def decide_probe(baseline: tuple[int, ...], cold: Request, reuses: list[Request] | tuple[Request, ...]) -> ProbeVerdict:
    """Verdict for one probe of a reuse arm: a cold request then N reuses, against the baseline."""
    cold_diff = first_diff(list(baseline), list(cold.token_ids))
    diffs = tuple(first_diff(list(baseline), list(r.token_ids)) for r in reuses)
    diffs_cold = tuple(first_diff(list(cold.token_ids), list(r.token_ids)) for r in reuses)
    reasons: list[str] = []
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
