"""Deciding verdicts: pure functions over token IDs and hit counters, no I/O.

PASS: every reuse reports a hit and matches the baseline exactly.
FAIL: a reuse that reports a hit differs from the baseline.
INCONCLUSIVE: the evidence cannot blame or clear reuse (missing or zero counters, a cold
request that was not a verified miss, a cold miss that already differs from the baseline, or no
reuse at all).
ERROR: the engine crashed, timed out or raised, the arms cannot be compared, LMCache ran in
degraded mode, or --batch-invariant asked for vLLM's batch-invariant kernels and the arm's workers
did not confirm them active; never turned into PASS.
SKIPPED: a probe a fixture declares the arm cannot run, with the reason (shown, never dropped).

The KV audit adds a second, independent verdict per probe of a reuse arm (the token verdict
above never changes because of it):
EXACT: every block the reuses read is bit-identical to the KV the cache-off baseline computed.
NUMERIC: none is corrupt, some differ but no more than the arm's own cold prefill differed from
the baseline (the floor the kit measures in every run and reports).
CORRUPT: some block x layer x plane differs by more than that floor (a finding, exit 1).
UNAVAILABLE: the audit could not see what was reused (with the reason).

Every divergence (a request's first token that differs from the baseline) also gets a class, which
never changes a verdict: a FAIL stays a FAIL. From the baseline's top-1/top-2 logprob gap at that
index: near-tie under repro.judge.compare.NEAR_TIE_NATS (the baseline itself nearly chose the other
token, so a rounding difference could flip it), decisive at or above it, unclassed when no gap
was recorded (never assumed decisive).

This module is the one verdict authority: every decision is a pure function here that returns a
frozen record (ProbeVerdict, ArmVerdict). Other modules format and store verdicts; they never
write a verdict themselves.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from repro.judge.compare import NEAR_TIE_NATS, first_diff

PASS, FAIL, INCONCLUSIVE, ERROR, SKIPPED = "PASS", "FAIL", "INCONCLUSIVE", "ERROR", "SKIPPED"
VERDICTS = (PASS, FAIL, INCONCLUSIVE, ERROR, SKIPPED)
EXACT, NUMERIC, CORRUPT, UNAVAILABLE = "EXACT", "NUMERIC", "CORRUPT", "UNAVAILABLE"
KV_VERDICTS = (EXACT, NUMERIC, CORRUPT, UNAVAILABLE)
# The class of a divergence, from the baseline's top-1/top-2 gap at its index (classify_divergence).
DECISIVE, NEAR_TIE, UNCLASSED = "decisive", "near-tie", "unclassed"
DIVERGENCE_CLASSES = (DECISIVE, NEAR_TIE, UNCLASSED)
# The class of one audited cell (block x layer x K/V plane): exact, numeric, corrupt.
CELL_EXACT, CELL_NUMERIC, CELL_CORRUPT = "e", "n", "c"
# The arm-level failure kind for LMCache's degraded mode (the child failure kinds are in repro.contract).
LMCACHE_DEGRADED = "lmcache-degraded"
# An arm takes the worst verdict of its probes; a finding (FAIL) outranks missing evidence.
_SEVERITY = {PASS: 0, INCONCLUSIVE: 1, FAIL: 2, ERROR: 3}


@dataclass(frozen=True)
class Request:
    """One generation as observed: what came out and what the engine said it reused."""

    token_ids: tuple[int, ...]
    cached_tokens: int | None  # None: the engine reported nothing, which is never read as zero

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


def counter_missing(value: object, whose: str = "") -> str:
    """'[whose ]hit counter missing', with the value it had when there was one (-1: vLLM's 'not checked yet')."""
    head = f"{whose} hit counter missing" if whose else "hit counter missing"
    if value is None:
        return head
    note = " (vLLM's 'not checked yet')" if value == -1 and not isinstance(value, bool) else ""
    return f"{head} ({value!r}{note}: not a count)"


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


def decide_baseline_probe(cold: Request) -> ProbeVerdict:
    """The cache-disabled reference must itself report no reuse."""
    if cold.hits is None:
        why = counter_missing(cold.cached_tokens, "baseline")
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
    if cold.hits is None:
        reasons.append(f"{counter_missing(cold.cached_tokens, 'cold request')}: not a verified miss")
    elif cold.hits > 0:
        reasons.append(f"cold request reported {cold.cached_tokens} cached tokens: not a verified miss")
    if cold_diff is not None:
        reasons.append(f"cold miss differs from baseline @{cold_diff}: reuse cannot be blamed")
    if not reuses:
        reasons.append("no reuse was compared")
    if reasons:
        return ProbeVerdict(INCONCLUSIVE, tuple(reasons), cold_diff, diffs, diffs_cold)

    failed, unproven = [], []
    for i, (req, diff) in enumerate(zip(reuses, diffs), start=1):
        if req.hits is None:
            unproven.append(f"reuse {i}: {counter_missing(req.cached_tokens)}")
        elif req.hits == 0:
            unproven.append(f"reuse {i}: zero cached tokens, reuse not exercised")
        elif diff is not None:
            failed.append(f"reuse {i}: {req.cached_tokens} cached tokens, differs from baseline @{diff}")
    if failed:
        return ProbeVerdict(FAIL, tuple(failed + unproven), cold_diff, diffs, diffs_cold)
    if unproven:
        return ProbeVerdict(INCONCLUSIVE, tuple(unproven), cold_diff, diffs, diffs_cold)
    return ProbeVerdict(PASS, (), cold_diff, diffs, diffs_cold)


def classify_kv_cell(identical: bool, rel: float | None, floor_rel: float | None) -> str:
    """One block x layer x plane that a reuse read, against the baseline's KV for the same tokens.

    identical: bit-identical. rel: ||loaded - reference|| / ||reference|| (None when it is not a
    finite number, or the reference is all zeros and the loaded plane is not). floor_rel: the
    largest relative error of this arm's own cold prefill against the baseline (None: not measured).
    Exact needs bit-identity; numeric needs a measured floor and an error within it; else corrupt."""
    if identical:
        return CELL_EXACT
    if rel is not None and floor_rel is not None and rel <= floor_rel:
        return CELL_NUMERIC
    return CELL_CORRUPT


@dataclass(frozen=True)
class KVRequestAudit:
    """What the audit saw for one reuse request: its cells' classes, or why it saw nothing."""

    available: bool
    reason: str | None = None  # why not available
    corrupt: tuple[tuple[int, int, str], ...] = ()  # (block, layer, plane) of every corrupt cell
    numeric: int = 0
    exact: int = 0


@dataclass(frozen=True)
class KVVerdict:
    verdict: str
    reasons: tuple[str, ...]
    blocks: tuple[int, ...] = ()  # blamed blocks (CORRUPT only), and their layers and planes
    layers: tuple[int, ...] = ()
    planes: tuple[str, ...] = ()


def decide_kv_unavailable(reason: str) -> KVVerdict:
    return KVVerdict(UNAVAILABLE, (reason,))


def decide_kv_probe(reuses: list[KVRequestAudit] | tuple[KVRequestAudit, ...], floor_rel: float | None) -> KVVerdict:
    """The KV verdict of one probe from its reuse requests' audits. A corrupt cell is a finding even
    when another reuse could not be audited; otherwise any gap makes the probe UNAVAILABLE."""
    if not reuses:
        return decide_kv_unavailable("no reuse request to audit")
    corrupt = [c for r in reuses if r.available for c in r.corrupt]
    gaps = [f"reuse {i}: {r.reason}" for i, r in enumerate(reuses, start=1) if not r.available]
    gaps += [
        f"reuse {i}: no full block was reused, nothing to audit"
        for i, r in enumerate(reuses, start=1)
        if r.available and not (r.corrupt or r.numeric or r.exact)
    ]
    if corrupt:
        reasons = []
        for i, r in enumerate(reuses, start=1):
            if r.available and r.corrupt:
                total = len(r.corrupt) + r.numeric + r.exact
                reasons.append(
                    f"reuse {i}: {len(r.corrupt)} of {total} block x layer x plane cells differ from the baseline's KV "
                    f"beyond the measured floor (relative error {_floor(floor_rel)})"
                )
        return KVVerdict(
            CORRUPT,
            tuple(reasons + gaps),
            tuple(sorted({b for b, _, _ in corrupt})),
            tuple(sorted({layer for _, layer, _ in corrupt})),
            tuple(sorted({p for _, _, p in corrupt})),
        )
    if gaps:
        return KVVerdict(UNAVAILABLE, tuple(gaps))
    numeric = sum(r.numeric for r in reuses)
    if numeric:
        return KVVerdict(
            NUMERIC,
            (f"{numeric} cells differ from the baseline's KV within the measured floor ({_floor(floor_rel)})",),
        )
    return KVVerdict(EXACT, ())


def _floor(floor_rel: float | None) -> str:
    return "not measured" if floor_rel is None else f"{floor_rel:.3g}"


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


# --batch-invariant: vLLM's batch-invariant kernels, asked for and confirmed by every worker.
BATCH_INVARIANT_INACTIVE = "batch-invariant-inactive"
# vLLM 0.26-0.28 install batch-invariant matmuls on CUDA (SM8x through Triton overrides, SM90 and
# later through cuBLAS settings) and XPU; its documentation names compute capability 8.0 as the floor.
BATCH_INVARIANT_MIN_CAPABILITY = (8, 0)
BATCH_INVARIANT_PLATFORMS = ("cuda", "xpu")


@dataclass(frozen=True)
class BatchInvariance:
    """Whether vLLM's batch-invariant kernels were active in every worker of an arm (None: no worker
    said, never assumed either way), and why not."""

    active: bool | None
    reasons: tuple[str, ...] = ()


def parse_capability(text: object) -> tuple[int, int] | None:
    """'8.9' -> (8, 9); anything else None."""
    if not isinstance(text, str):
        return None
    major, _, minor = text.partition(".")
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None


def batch_invariant_device_problem(platform: str, capability: tuple[int, int] | None) -> str | None:
    """Why vLLM's batch-invariant kernels cannot run on this device (one phrase), or None when they can."""
    if platform not in BATCH_INVARIANT_PLATFORMS:
        return f"vLLM has batch-invariant kernels for CUDA and XPU only, and this runs on {platform}"
    if platform == "cuda" and capability is None:
        return "the GPU's compute capability could not be read"
    if platform == "cuda" and capability < BATCH_INVARIANT_MIN_CAPABILITY:
        floor = ".".join(map(str, BATCH_INVARIANT_MIN_CAPABILITY))
        return f"compute capability {capability[0]}.{capability[1]} is below {floor}, vLLM's floor for them"
    return None


def _worker_problems(worker: dict) -> tuple[list[str], list[str]]:
    """(why the kernels were not active, what was not recorded) for one worker's facts."""
    inactive, unknown = [], []
    bi = worker.get("batch_invariant") if isinstance(worker.get("batch_invariant"), dict) else {}
    if bi.get("mode") is False:
        env = "set" if bi.get("env") else "not set"
        inactive.append(f"vLLM's batch-invariant mode is off (VLLM_BATCH_INVARIANT {env} in the worker)")
    elif bi.get("mode") is not True:
        unknown.append("vLLM's batch-invariant mode was not recorded")
    platform, capability = worker.get("platform"), parse_capability(worker.get("compute_capability"))
    if not isinstance(platform, str):
        unknown.append("the platform was not recorded")
    elif platform == "cuda" and capability is None:
        unknown.append("the GPU's compute capability was not recorded")
    elif device := batch_invariant_device_problem(platform, capability):
        inactive.append(device)
    backends = worker.get("attention_backends")
    if not isinstance(backends, list) or not backends:
        unknown.append("the attention backend was not recorded")
    else:
        for b in backends:
            if isinstance(b, dict) and b.get("supports_batch_invariance") is False:
                inactive.append(f"attention backend {b.get('name')} does not support batch invariance")
            elif not isinstance(b, dict) or b.get("supports_batch_invariance") is not True:
                unknown.append(f"whether attention backend {(b or {}).get('name')} supports batch invariance")
    return inactive, unknown


def batch_invariance_state(workers: list[dict] | None) -> BatchInvariance:
    """From the facts an arm's workers recorded (repro.engine.kvaudit.worker_facts): active when every
    worker has vLLM's batch-invariant mode on (it installed its kernel overrides), runs on a device
    vLLM has those kernels for, and only attention backends that vLLM says support batch invariance.
    A worker that says otherwise makes it inactive; a fact nobody recorded makes it unknown (None)."""
    if not workers:
        return BatchInvariance(None, ("no worker recorded its facts (they come with the KV audit's records)",))
    inactive, unknown = [], []
    for w in workers:
        if not isinstance(w, dict):
            unknown.append("a worker's facts are not an object")
            continue
        off, missing = _worker_problems(w)
        who = f"worker pid {w.get('pid', '?')}"
        inactive += [f"{who}: {p}" for p in off]
        unknown += [f"{who}: {p}" for p in missing]
    if inactive:
        return BatchInvariance(False, tuple(inactive + unknown))
    if unknown:
        return BatchInvariance(None, tuple(unknown))
    return BatchInvariance(True, ())


def decide_batch_invariance(current: ArmVerdict, requested: bool, state: BatchInvariance) -> ArmVerdict:
    """--batch-invariant asked for vLLM's batch-invariant kernels: an arm whose workers do not confirm
    them active ran something else than asked, so its verdict is ERROR, never PASS or FAIL. An arm
    that is already an ERROR keeps its own error."""
    if not requested or state.active is True or current.verdict == ERROR:
        return current
    said = "not active" if state.active is False else "not confirmed active"
    detail = f"batch-invariant kernels requested (--batch-invariant) but {said}: " + "; ".join(state.reasons)
    return ArmVerdict(
        ERROR, (f"{BATCH_INVARIANT_INACTIVE}: {detail}", *current.reasons), BATCH_INVARIANT_INACTIVE, detail
    )


# ---- scenarios (repro.run.scenarios): every request against its probe's cache-off baseline -------------------
# A divergence that the scenario's own cache-off run (the schedule control) shows too: the schedule
# (batching, preemption) changed the numerics, so reuse is neither blamed nor cleared there.
SCHEDULE_NUMERICS = "schedule-numerics"
MISS, REUSE = "miss", "reuse"


@dataclass(frozen=True)
class ScenarioRequestVerdict:
    """One request of a scenario step: its verdict, what it turned out to be (role: reuse when its hit
    counter is above zero, else miss), its first diff from the baseline and the divergence's class."""

    verdict: str
    reasons: tuple[str, ...]
    role: str
    first_diff: int | None
    cls: str | None = None  # SCHEDULE_NUMERICS, or None


def decide_scenario_request(
    baseline: tuple[int, ...],
    req: Request,
    expect: str | None,
    control_matches: bool | None,
    preempted: bool = False,
) -> ScenarioRequestVerdict:
    """A scenario request against its probe's cache-off baseline (the baseline arm's plain cold request).

    expect: "miss" (a hit is a finding: FAIL), "reuse" (a zero or missing hit counter: INCONCLUSIVE),
    None (either is correct). control_matches: whether the scenario's cache-off run gave the baseline's
    tokens at this request (None: that run failed). Exact tokens, no tolerance:
    - a divergence where the control diverges too is INCONCLUSIVE, classed schedule-numerics;
    - a divergence without a working control is INCONCLUSIVE (it cannot be told from the schedule's);
    - a divergence with a hit, or in a call where the engine preempted (a resumed request reuses its
      KV), is a FAIL;
    - a divergence of a miss with no preemption is INCONCLUSIVE (no reuse to blame)."""
    cached = req.hits
    role = REUSE if cached else MISS
    diff = first_diff(list(baseline), list(req.token_ids))
    found: list[tuple[str, str]] = []  # (verdict, reason)
    cls = None
    if cached is None:
        found.append((INCONCLUSIVE, counter_missing(req.cached_tokens)))
    if expect == MISS and cached:
        found.append((FAIL, f"expected a miss, reported {cached} cached tokens"))
    if expect == REUSE and cached == 0:
        found.append((INCONCLUSIVE, "expected reuse, reported zero cached tokens: reuse not exercised"))
    if diff is not None:
        if control_matches is False:
            cls = SCHEDULE_NUMERICS
            why = f"differs from the baseline @{diff}, and so does the scenario's cache-off run here: "
            found.append((INCONCLUSIVE, why + "the schedule changed the numerics, not reuse"))
        elif control_matches is None:
            why = f"differs from the baseline @{diff}; the scenario's cache-off run failed, so this cannot be told "
            found.append((INCONCLUSIVE, why + "from the schedule's own numerics"))
        elif cached:
            found.append((FAIL, f"{cached} cached tokens, differs from baseline @{diff}"))
        elif preempted:
            found.append((FAIL, f"differs from baseline @{diff} in a call where the engine preempted requests"))
        else:
            counter = "zero cached tokens" if cached == 0 else "no hit counter"
            found.append((INCONCLUSIVE, f"a miss ({counter}) differs from baseline @{diff}: no reuse to blame"))
    verdict = worst([v for v, _ in found]) if found else PASS
    return ScenarioRequestVerdict(verdict, tuple(r for _, r in found), role, diff, cls)


def decide_scenario_request_unbased(req: Request) -> ScenarioRequestVerdict:
    """A scenario request whose probe the plain baseline has no result for: nothing to compare with."""
    return ScenarioRequestVerdict(
        INCONCLUSIVE, ("the baseline has no result for this probe",), REUSE if req.hits else MISS, None
    )


def decide_scenario_arm(
    requests: list[tuple[str, ScenarioRequestVerdict]] | tuple[tuple[str, ScenarioRequestVerdict], ...],
    preemption_required: bool,
    preemptions: int | None,
) -> ArmVerdict:
    """A (scenario, arm): the worst of its requests' verdicts (each labelled, e.g. "step 2 chat-511"),
    INCONCLUSIVE when none ran or none reused cached tokens (it compared no reuse: never a PASS by default),
    and INCONCLUSIVE when the scenario says preemption must happen and the engine's counter stayed at 0 or
    could not be read (the scenario then did not test what it says)."""
    verdicts = [v.verdict for _, v in requests]
    reasons = [f"{label}: {r}" for label, v in requests if v.verdict != PASS for r in v.reasons]
    if not requests:
        reasons.append("no request was run")
    elif not any(v.role == REUSE for _, v in requests):
        verdicts.append(INCONCLUSIVE)
        reasons.append("no request reused cached tokens: the scenario compared no reuse")
    if preemption_required and preemptions is None:
        verdicts.append(INCONCLUSIVE)
        reasons.append("the scenario needs preemption and the engine's preemption counter is unavailable")
    elif preemption_required and preemptions == 0:
        verdicts.append(INCONCLUSIVE)
        reasons.append("the scenario needs preemption and the engine preempted no request")
    return ArmVerdict(worst(verdicts), tuple(reasons))


def decide_scenario_kv(requests: list[tuple[str, KVVerdict]] | tuple[tuple[str, KVVerdict], ...]) -> KVVerdict:
    """A (scenario, arm)'s KV verdict from its audited requests' (label, verdict): CORRUPT when any is
    (blocks, layers and planes pooled), else UNAVAILABLE when any is or none was audited, else NUMERIC
    when any is, else EXACT."""
    if not requests:
        return decide_kv_unavailable("no request reused a full block to audit")
    by = {k: [(label, v) for label, v in requests if v.verdict == k] for k in KV_VERDICTS}
    for kind in (CORRUPT, UNAVAILABLE, NUMERIC):
        if by[kind]:
            reasons = tuple(f"{label}: {r}" for label, v in by[kind] for r in v.reasons)
            hit = [v for _, v in by[kind]]
            return KVVerdict(
                kind,
                reasons,
                tuple(sorted({b for v in hit for b in v.blocks})),
                tuple(sorted({x for v in hit for x in v.layers})),
                tuple(sorted({p for v in hit for p in v.planes})),
            )
    return KVVerdict(EXACT, ())


# ---- expectations: what a fixture states must hold on any machine ---------------------------------------
# An expectation is one verdict ("PASS") or a set of them (["EXACT", "NUMERIC"]): a set states what must hold
# where the numerics legitimately depend on the machine's kernels (a reused prefix computed by a prefill of
# another length is bit-identical on one CPU and within the floor on the next). A set never mixes a finding
# (FAIL, CORRUPT) with its absence: that would accept a finding and its absence alike (repro.plan.fixtures refuses it).
FINDINGS = (FAIL, CORRUPT)


def expectation_values(want: object) -> tuple[str, ...]:
    """The verdicts an expectation accepts: ("PASS",) for "PASS", the list's members for a list."""
    if isinstance(want, str):
        return (want,)
    if isinstance(want, (list, tuple)):
        return tuple(str(w) for w in want)
    return ()


def expectation_met(want: object, got: str | None) -> bool:
    """Whether an observed verdict (None: none observed) is one the expectation accepts."""
    return got is not None and got in expectation_values(want)


def expectation_states(want: object, verdict: str) -> bool:
    """Whether the expectation states this verdict (a stated CORRUPT or FAIL: a planted fault meant to be caught)."""
    return verdict in expectation_values(want)


def expectation_problem(want: object, allowed: tuple[str, ...]) -> str | None:
    """Why an expectation is not one a fixture may state (None: it may): one verdict of allowed, or a
    non-empty list of distinct ones that does not mix a finding with its absence."""
    if isinstance(want, str):
        return None if want in allowed else f"{want!r} is not one of {', '.join(allowed)}"
    if not isinstance(want, list) or not want:
        return f"{want!r} is neither a verdict nor a non-empty list of verdicts"
    bad = [w for w in want if not isinstance(w, str) or w not in allowed]
    if bad:
        return f"{bad[0]!r} is not one of {', '.join(allowed)}"
    if len(set(want)) != len(want):
        return f"{want!r} lists a verdict twice"
    found = [w for w in want if w in FINDINGS]
    if found and len(found) != len(want):
        return f"{want!r} mixes a finding ({found[0]}) with its absence: state one or the other"
    return None


def expectation_text(want: object) -> str:
    """'PASS', or 'EXACT or NUMERIC' for a set."""
    return " or ".join(expectation_values(want))
