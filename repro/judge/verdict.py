"""Deciding verdicts: pure functions over token IDs and hit counters, no I/O.

PASS: every reuse reports a hit and matches the baseline exactly.
FAIL: a reuse that reports a hit differs from the baseline.
INCONCLUSIVE: the evidence cannot blame or clear reuse (missing counters, a zero counter with the baseline's
answer, a cold request that was not a verified miss, a cold miss that already differs from the baseline, or no
reuse at all).

Two FAILs carry a finding of their own (ProbeVerdict.finding, FINDINGS), which no fixture's FAIL excuses from exit 1
(repro.record.exit_rule) and every view names:
tenant-isolation: a request of one tenant salt (cache_salt) reported a hit of KV that only another salt had sent
  (repro.judge.salts): one tenant's KV served to another.
no-hit-differs: a reuse reported no hit (0 cached tokens) and answered otherwise than the baseline, while its
  same-length control gave the baseline's answer (the arm's own cold request, the same prompt prefilled whole; a
  scenario's cache-off run of the same steps): not numerics, and no reuse the engine owned up to.
ERROR: the engine crashed, timed out or raised, the arms cannot be compared, LMCache ran in
degraded mode, --batch-invariant asked for vLLM's batch-invariant kernels and the arm's workers
did not confirm them active, or a request's answer is not the one asked for (no token IDs, or not
max_tokens long under greedy ignore_eos: repro.judge.answer); never turned into PASS.
SKIPPED: a probe a fixture declares the arm cannot run, with the reason (shown, never dropped).

The KV audit adds a second, independent verdict per probe of a reuse arm (the token verdict
above never changes because of it):
EXACT: every block the reuses read is bit-identical to the KV the cache-off baseline computed.
NUMERIC: none is corrupt, some differ but no more than the arm's own cold prefill differed from
the baseline (the floor the kit measures in every run and reports).
MISPLACED: some block x layer x plane differs by more than that floor, and its bytes are this prompt's own KV
from another position or plane (equal, or within the floor, to the baseline's block there): real KV in the
wrong slot, a block-mapping fault (a finding, exit 1).
FOREIGN: some cell's bytes are another prompt's KV (equal, or within the floor, to the baseline's block of
another probe, a request this engine also ran): another request's KV served (a finding, exit 1).
CORRUPT: some cell differs by more than the floor and equals nothing known (garbage, zeros: a finding, exit 1).
A probe takes the worst class of its cells: CORRUPT over FOREIGN over MISPLACED over NUMERIC over EXACT.
UNAVAILABLE: the audit could not see what was reused (with the reason).

Every divergence (a request's first token that differs from the baseline) also gets a class, which
never changes a verdict: a FAIL stays a FAIL. From the baseline's top-1/top-2 logprob gap at that
index: near-tie under repro.judge.compare.NEAR_TIE_NATS (the baseline itself nearly chose the other
token, so a rounding difference could flip it), decisive at or above it, unclassed when no gap
was recorded (never assumed decisive).

This module is the one verdict authority: it names every verdict (no other module writes one,
tests/test_imports.py) and decides the token verdicts of probes and arms, each a pure function that
returns a frozen record (ProbeVerdict, ArmVerdict). The other decisions are pure functions over these
names beside it: repro.judge.kv_verdict (KV cells and KV verdicts), repro.judge.scenario_verdict
(scenario requests and arms), repro.judge.batch_invariance (--batch-invariant), repro.judge.prompt_logprobs
(prompt logprobs and reuse they turned off) and repro.judge.expectations (what a fixture's expectations accept). Other modules format and store
verdicts; they never write a verdict themselves.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from repro.judge.answer import answer_problem
from repro.judge.compare import NEAR_TIE_NATS, first_diff

PASS, FAIL, INCONCLUSIVE, ERROR, SKIPPED = "PASS", "FAIL", "INCONCLUSIVE", "ERROR", "SKIPPED"
VERDICTS = (PASS, FAIL, INCONCLUSIVE, ERROR, SKIPPED)
EXACT, NUMERIC, CORRUPT, UNAVAILABLE = "EXACT", "NUMERIC", "CORRUPT", "UNAVAILABLE"
MISPLACED, FOREIGN = "MISPLACED", "FOREIGN"
KV_VERDICTS = (EXACT, NUMERIC, MISPLACED, FOREIGN, CORRUPT, UNAVAILABLE)
# The KV verdicts that are findings (the bytes a reuse read are not the baseline's), worst first.
KV_FINDINGS = (CORRUPT, FOREIGN, MISPLACED)
# The class of a divergence, from the baseline's top-1/top-2 gap at its index (classify_divergence).
DECISIVE, NEAR_TIE, UNCLASSED = "decisive", "near-tie", "unclassed"
DIVERGENCE_CLASSES = (DECISIVE, NEAR_TIE, UNCLASSED)
# The findings a FAIL may carry that no fixture's FAIL excuses (the module's docstring), worst first, and their words.
TENANT_ISOLATION, NO_HIT_DIFFERS = "tenant-isolation", "no-hit-differs"
FINDINGS = (TENANT_ISOLATION, NO_HIT_DIFFERS)
FINDING_WORDS = {TENANT_ISOLATION: "tenant-isolation failure", NO_HIT_DIFFERS: "differs with no reported hit"}
# The arm-level failure kind for LMCache's degraded mode (the child failure kinds are in repro.contract.failure).
LMCACHE_DEGRADED = "lmcache-degraded"
# An arm takes the worst verdict of its probes; a finding (FAIL) outranks missing evidence.
_SEVERITY = {PASS: 0, INCONCLUSIVE: 1, FAIL: 2, ERROR: 3}


@dataclass(frozen=True)
class Request:
    """One generation as observed: what came out and what the engine said it reused."""

    token_ids: tuple[int, ...]
    cached_tokens: int | None  # None: the engine reported nothing, which is never read as zero
    # a connector beneath the GPU prefix cache (counts_external): its own count of the tokens it loaded; the
    # hit that counts is that one (cached_tokens is the GPU cache's and the connector's together)
    external_tokens: int | None = None
    counts_external: bool = False

    @property
    def hits(self) -> int | None:
        """The hit counter when it is a count (an int >= 0), else None: missing (see counter_missing)."""
        return hit_count(self.cached_tokens)


def hit_count(value: object) -> int | None:
    """A hit counter as a count, or None when it is missing. vLLM starts Request.num_cached_tokens at -1 ("not
    checked yet"): a negative value, a bool or any non-integer is no count, and never read as a hit or a miss."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


# Where a served answer's hit counter comes from, named where it is absent: vLLM's server sends
# usage.prompt_tokens_details only when started with this flag (the kit's own servers are; a server that
# `repro endpoint` judges may not be).
SERVED_HITS_FLAG = "--enable-prompt-tokens-details"


def counter_missing(value: object, whose: str = "", cached: bool = False) -> str:
    """'[whose ]hit counter missing', with the value it had when there was one (-1: vLLM's 'not checked yet').
    cached: the counter is the request's cached tokens; absent, the reason says where a served answer has it."""
    head = f"{whose} hit counter missing" if whose else "hit counter missing"
    if value is None:
        served = f"a served answer has it in usage.prompt_tokens_details, which vLLM sends only with {SERVED_HITS_FLAG}"
        return f"{head} ({served})" if cached else head
    note = " (vLLM's 'not checked yet')" if value == -1 and not isinstance(value, bool) else ""
    return f"{head} ({value!r}{note}: not a count)"


@dataclass(frozen=True)
class ProbeVerdict:
    verdict: str
    reasons: tuple[str, ...]
    cold_first_diff: int | None
    reuse_first_diffs: tuple[int | None, ...] = field(default_factory=tuple)
    reuse_first_diffs_vs_cold: tuple[int | None, ...] = field(default_factory=tuple)
    finding: str | None = None  # TENANT_ISOLATION or NO_HIT_DIFFERS beside a FAIL (FINDINGS); None: neither


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
    so neither a PASS nor a FAIL can be trusted (an ERROR stays an ERROR). A FAIL with a finding (FINDINGS) stays: a
    reuse across tenant salts, or an answer changed with no hit reported, is no reuse of the other probe's to allow."""
    if pv.verdict in (ERROR, SKIPPED):
        return pv
    reason = f"shares its first block with probe {other_probe}: probes are not isolated"
    verdict = FAIL if pv.finding is not None else INCONCLUSIVE
    return replace(pv, verdict=verdict, reasons=(*pv.reasons, reason))


def decide_tenant_isolation(pv: ProbeVerdict, reasons: list[str] | tuple[str, ...]) -> ProbeVerdict:
    """A probe one of whose requests reported a hit of KV that only another tenant salt had sent (repro.judge.salts,
    which gives the reasons): FAIL with the finding TENANT_ISOLATION, whatever its tokens show (a salt changes no
    answer, so only the hit tells). An ERROR stays an ERROR, the reasons added; no reasons: unchanged."""
    if not reasons or pv.verdict == SKIPPED:
        return pv
    verdict = ERROR if pv.verdict == ERROR else FAIL
    return replace(pv, verdict=verdict, reasons=(*reasons, *pv.reasons), finding=TENANT_ISOLATION)


def decide_indistinct_adapters(pv: ProbeVerdict, reason: str) -> ProbeVerdict:
    """A probe whose baseline equals another adapter's on its prompt (repro.judge.adapters) cannot tell whose KV a
    reuse read: a PASS proves nothing of key identity and is INCONCLUSIVE; any other verdict stays, the reason
    added."""
    if pv.verdict == SKIPPED:
        return pv
    return replace(pv, verdict=INCONCLUSIVE if pv.verdict == PASS else pv.verdict, reasons=(*pv.reasons, reason))


def decide_missing_baseline_probe() -> ProbeVerdict:
    return ProbeVerdict(INCONCLUSIVE, ("the baseline has no result for this probe",), None)


def decide_missing_probe(pv: ProbeVerdict | None, asked: int, got: int = 0) -> ProbeVerdict:
    """A probe the arm's job asked for that its result lacks (pv None), or that came back with fewer
    requests than asked: what did not run decides nothing, so the probe is INCONCLUSIVE at least (a FAIL
    or an ERROR among the requests that did run stays)."""
    if pv is None:
        return ProbeVerdict(INCONCLUSIVE, ("the arm's result has no result for this probe",), None)
    reason = f"the arm's result has {got} of the {asked} requests its job asked for"
    if pv.verdict in (FAIL, ERROR):
        return replace(pv, reasons=(*pv.reasons, reason))
    return replace(pv, verdict=INCONCLUSIVE, reasons=(*pv.reasons, reason))


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


def decide_baseline_probe(cold: Request, asked: int | None = None) -> ProbeVerdict:
    """The cache-disabled reference must itself report no reuse, and its answer be the one asked for (asked: the
    max_tokens of every probe request, greedy and ignore_eos; None: not known, only an empty answer is refused)."""
    if (problem := answer_problem(cold.token_ids, asked, ignore_eos=True)) is not None:
        return ProbeVerdict(ERROR, (f"baseline: {problem}",), None)
    if cold.hits is None:
        why = counter_missing(cold.cached_tokens, "baseline", cached=True)
        return ProbeVerdict(INCONCLUSIVE, (f"{why}: cannot confirm caching was off",), None)
    if cold.hits > 0:
        return ProbeVerdict(
            INCONCLUSIVE, (f"baseline reported {cold.cached_tokens} cached tokens with caching off",), None
        )
    return ProbeVerdict(PASS, (), None)


def decide_probe(
    baseline: tuple[int, ...],
    cold: Request,
    reuses: list[Request] | tuple[Request, ...],
    baseline_verdict: str = PASS,
    asked: int | None = None,
) -> ProbeVerdict:
    """Verdict for one probe of a reuse arm: a cold request then N reuses, against the baseline.

    baseline_verdict is the baseline's own verdict on this probe: a reference that is not PASS
    (it reported cached tokens with caching off, say) can neither clear nor blame reuse. asked: the max_tokens
    every request of the probe was sent with (greedy, ignore_eos: every probe request the kit sends); None where
    the caller does not know it, and then only an empty answer is refused (repro.judge.answer). A request whose
    answer is not the one asked for is not an answer: the probe is ERROR, whatever the others show."""
    cold_diff = first_diff(list(baseline), list(cold.token_ids))
    diffs = tuple(first_diff(list(baseline), list(r.token_ids)) for r in reuses)
    diffs_cold = tuple(first_diff(list(cold.token_ids), list(r.token_ids)) for r in reuses)
    labelled = [("cold request", cold), *((f"reuse {i}", r) for i, r in enumerate(reuses, start=1))]
    unanswered = [
        f"{label}: {p}" for label, r in labelled if (p := answer_problem(r.token_ids, asked, ignore_eos=True))
    ]
    if unanswered:
        return ProbeVerdict(ERROR, tuple(unanswered), cold_diff, diffs, diffs_cold)
    reasons: list[str] = []
    if (problem := answer_problem(baseline, asked, ignore_eos=True)) is not None:
        reasons.append(f"the baseline's {problem}: it is not a reference")
    elif baseline_verdict != PASS:
        reasons.append(f"the baseline's own probe is {baseline_verdict}: it is not a reference")
    if cold.hits is None:
        reasons.append(f"{counter_missing(cold.cached_tokens, 'cold request', cached=True)}: not a verified miss")
    elif cold.hits > 0:
        reasons.append(f"cold request reported {cold.cached_tokens} cached tokens: not a verified miss")
    if cold_diff is not None:
        reasons.append(f"cold miss differs from baseline @{cold_diff}: reuse cannot be blamed")
    if not reuses:
        reasons.append("no reuse was compared")
    if reasons:
        return ProbeVerdict(INCONCLUSIVE, tuple(reasons), cold_diff, diffs, diffs_cold)

    failed, unproven, unowned = [], [], []
    for i, (req, diff) in enumerate(zip(reuses, diffs), start=1):
        if req.hits is None:
            unproven.append(f"reuse {i}: {counter_missing(req.cached_tokens, cached=True)}")
        elif req.hits == 0 and diff is not None:  # the cold request, a verified miss, matched: the same-length control
            unowned.append(f"reuse {i}: {no_hit_reason(diff)}, though the cold request (the same prompt prefilled "
                           "whole in this engine, a verified miss) gave the baseline's tokens: not numerics")  # fmt: skip
        elif req.hits == 0:
            unproven.append(f"reuse {i}: zero cached tokens, reuse not exercised")
        elif req.counts_external:
            _judge_beneath(i, req, diff, failed, unproven)
        elif diff is not None:
            failed.append(f"reuse {i}: {req.cached_tokens} cached tokens, differs from baseline @{diff}")
    if failed or unowned:
        finding = NO_HIT_DIFFERS if unowned else None
        return ProbeVerdict(FAIL, tuple(unowned + failed + unproven), cold_diff, diffs, diffs_cold, finding)
    if unproven:
        return ProbeVerdict(INCONCLUSIVE, tuple(unproven), cold_diff, diffs, diffs_cold)
    return ProbeVerdict(PASS, (), cold_diff, diffs, diffs_cold)


def no_hit_reason(diff: int) -> str:
    """The words of a NO_HIT_DIFFERS request: 'differs from baseline @3 with no reported hit (0 cached tokens)'."""
    return f"differs from baseline @{diff} with no reported hit (0 cached tokens)"


def _judge_beneath(i: int, req: Request, diff: int | None, failed: list, unproven: list) -> None:
    """A reuse with hits on an arm whose connector sits beneath the GPU prefix cache: only the connector's own
    count says it served. A reuse that differs is a FAIL whoever served it (an answer changed after a hit); one
    that matches clears the connector only where the connector loaded something."""
    ext = hit_count(req.external_tokens)
    if diff is not None:
        whose = "the connector's count missing" if ext is None else f"{ext} from the connector"
        failed.append(f"reuse {i}: {req.cached_tokens} cached tokens ({whose}), differs from baseline @{diff}")
    elif ext is None:
        why = counter_missing(req.external_tokens, "the connector's")
        unproven.append(f"reuse {i}: {why} (the GPU prefix cache is on: cached tokens do not say who served)")
    elif ext == 0:
        unproven.append(
            f"reuse {i}: {req.cached_tokens} cached tokens, all from the GPU prefix cache: connector not exercised"
        )


def classify_divergence(baseline_top_gap: float | None, near_tie: bool | None = None) -> str:
    """The class of one divergence from the baseline's top-1/top-2 logprob gap (nats) at its index.

    Both come from the report's margin (baseline_top_gap, near_tie), so every report ever written
    (schema 1 and 2) is classed the same way. NEAR_TIE under the threshold, DECISIVE at or above
    it; UNCLASSED when no gap was recorded or it is not a finite number (fewer than two logprobs at
    that index). The report rounds the gap to 6 decimals; repro.judge.compare decided near_tie with the
    same threshold before rounding, so where that flag is recorded it settles a gap that rounded
    onto the threshold (0.09999996 is stored as 0.1 with near_tie true)."""
    if isinstance(baseline_top_gap, bool) or not isinstance(baseline_top_gap, (int, float)):
        return UNCLASSED
    if not math.isfinite(baseline_top_gap):
        return UNCLASSED
    if isinstance(near_tie, bool):
        return NEAR_TIE if near_tie else DECISIVE
    return NEAR_TIE if baseline_top_gap < NEAR_TIE_NATS else DECISIVE


@dataclass(frozen=True)
class DivergenceTally:
    """Divergences counted by class (an arm's or a probe's)."""

    decisive: int = 0
    near_tie: int = 0
    unclassed: int = 0

    @property
    def total(self) -> int:
        return self.decisive + self.near_tie + self.unclassed

    @property
    def near_ties_only(self) -> bool:
        """Every divergence is a near-tie: a FAIL the baseline itself almost decided the other way."""
        return self.near_tie > 0 and self.near_tie == self.total


def tally_divergences(classes: Iterable[str]) -> DivergenceTally:
    """Count classes from classify_divergence; anything else is a kit bug (ValueError)."""
    counts = {c: 0 for c in DIVERGENCE_CLASSES}
    for c in classes:
        if c not in counts:
            raise ValueError(f"not a divergence class: {c!r}")
        counts[c] += 1
    return DivergenceTally(counts[DECISIVE], counts[NEAR_TIE], counts[UNCLASSED])
