"""Scenario verdicts (repro.run.scenarios): every request against its probe's cache-off baseline, and
each (scenario, arm) from its requests. Pure functions; the verdict names are repro.judge.verdict's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from repro.judge.answer import answer_problem
from repro.judge.compare import first_diff
from repro.judge.verdict import (
    ERROR,
    FAIL,
    INCONCLUSIVE,
    NO_HIT_DIFFERS,
    PASS,
    TENANT_ISOLATION,
    ArmVerdict,
    Request,
    counter_missing,
    hit_count,
    no_hit_reason,
    worst,
)

# A divergence that the scenario's own cache-off run (the schedule control) shows too: the schedule
# (batching, preemption) changed the numerics, so reuse is neither blamed nor cleared there.
SCHEDULE_NUMERICS = "schedule-numerics"
# A load request that differs from its prompt's cache-off answer exactly as the reuse control's answer to the same
# request does (native prefix caching with a pool that holds every prompt): reuse at that length changes the
# numerics, and the arm under test does no worse than native reuse; not counted as a differing request.
REUSE_NUMERICS = "reuse-numerics"
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
    finding: str | None = None  # repro.judge.verdict.FINDINGS beside a FAIL, or None


def decide_scenario_request(
    baseline: tuple[int, ...],
    req: Request,
    expect: str | None,
    control_matches: bool | None,
    preempted: bool = False,
    asked: int | None = None,
) -> ScenarioRequestVerdict:
    """A scenario request against its probe's cache-off baseline (the baseline arm's plain cold request).

    asked: the max_tokens it and the baseline were sent with (greedy, ignore_eos); an answer of another length, or
    none, is no answer (repro.judge.answer): ERROR, whatever else holds (None: not known, only an empty one is).

    expect: "miss" (a hit is a finding: FAIL), "reuse" (a zero or missing hit counter: INCONCLUSIVE),
    None (either is correct). control_matches: whether the scenario's cache-off run gave the baseline's
    tokens at this request (None: that run failed). Exact tokens, no tolerance:
    - a divergence where the control diverges too is INCONCLUSIVE, classed schedule-numerics;
    - a divergence without a working control is INCONCLUSIVE (it cannot be told from the schedule's);
    - a divergence with a hit, or in a call where the engine preempted (a resumed request reuses its
      KV), is a FAIL;
    - a divergence of a request whose counter says 0 (no preemption), where the control matched, is a FAIL with the
      finding NO_HIT_DIFFERS: the same steps cache-off gave the baseline's answer, so not the schedule's numerics;
    - a divergence of one with no counter at all is INCONCLUSIVE (no reuse to blame)."""
    cached = req.hits
    role = REUSE if cached else MISS
    diff = first_diff(list(baseline), list(req.token_ids))
    cut = _unanswered(req.token_ids, baseline, asked)
    if cut:
        return ScenarioRequestVerdict(ERROR, cut, role, diff)
    found: list[tuple[str, str]] = []  # (verdict, reason)
    cls = finding = None
    if cached is None:
        found.append((INCONCLUSIVE, counter_missing(req.cached_tokens, cached=True)))
    if expect == MISS and cached:
        found.append((FAIL, f"expected a miss, reported {cached} cached tokens"))
    if expect == REUSE and cached == 0:
        found.append((INCONCLUSIVE, "expected reuse, reported zero cached tokens: reuse not exercised"))
    if req.counts_external and expect == REUSE and cached:  # beneath the GPU prefix cache: only its own hits count
        ext = hit_count(req.external_tokens)
        if ext is None:
            found.append((INCONCLUSIVE, f"expected reuse: {counter_missing(req.external_tokens, 'the connector')}"))
        elif ext == 0:
            why = f"expected reuse: {cached} cached tokens, all from the GPU prefix cache: connector not exercised"
            found.append((INCONCLUSIVE, why))
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
        elif cached == 0:
            finding = NO_HIT_DIFFERS
            why = ", though the scenario's cache-off run gave the baseline's tokens here: not the schedule's numerics"
            found.append((FAIL, no_hit_reason(diff) + why))
        else:
            found.append((INCONCLUSIVE, f"a miss (no hit counter) differs from baseline @{diff}: no reuse to blame"))
    verdict = worst([v for v, _ in found]) if found else PASS
    return ScenarioRequestVerdict(verdict, tuple(r for _, r in found), role, diff, cls, finding)


def _unanswered(tokens, baseline, asked: int | None) -> tuple[str, ...]:
    """Why a request's answer or its baseline's is not the one asked for (repro.judge.answer); () when both are."""
    return tuple(
        f"{whose}{p}"
        for whose, ids in (("", tokens), ("the baseline's ", baseline))
        if (p := answer_problem(ids, asked, ignore_eos=True)) is not None
    )


def decide_load_request(
    baseline: tuple[int, ...],
    req: Request,
    control_matches: bool | None,
    preempted: bool,
    reuse_control: tuple[tuple[int, ...], int | None] | None,
    asked: int | None = None,
) -> ScenarioRequestVerdict:
    """A production-load request (repro.plan.load): against its prompt's cache-off answer (baseline), as any
    scenario request, but a divergence the reuse control shows too, token for token (its tokens for the same
    request, and how many it reused), is no finding: PASS, classed reuse-numerics, its reason saying both reuse
    lengths. reuse_control None: that run failed or has no such request; the request is judged without it. asked:
    as decide_scenario_request's."""
    diff = first_diff(list(baseline), list(req.token_ids))
    if diff is not None and reuse_control is not None and tuple(req.token_ids) == tuple(reuse_control[0]):
        why = (
            f"differs from the cache-off answer @{diff} ({req.cached_tokens} cached tokens), exactly as native prefix "
            f"caching with a pool that holds every prompt does here ({reuse_control[1]} cached tokens): reuse numerics"
        )
        cut = _unanswered(req.token_ids, baseline, asked)
        if cut:
            return ScenarioRequestVerdict(ERROR, cut, REUSE if req.hits else MISS, diff)
        checked = decide_scenario_request(tuple(req.token_ids), req, None, True, preempted, asked)  # counters count
        return ScenarioRequestVerdict(checked.verdict, (why, *checked.reasons), checked.role, diff, REUSE_NUMERICS)
    return decide_scenario_request(baseline, req, None, control_matches, preempted, asked)


def decide_scenario_indistinct(v: ScenarioRequestVerdict, reason: str) -> ScenarioRequestVerdict:
    """A request whose probe's baseline equals another adapter's on its prompt (repro.judge.adapters): a PASS
    proves nothing of key identity and is INCONCLUSIVE; any other verdict stays, the reason added."""
    return replace(v, verdict=INCONCLUSIVE if v.verdict == PASS else v.verdict, reasons=(*v.reasons, reason))


def decide_scenario_tenant_isolation(v: ScenarioRequestVerdict, reason: str | None) -> ScenarioRequestVerdict:
    """A scenario request that reported a hit of KV only another tenant salt had sent (repro.judge.salts gives the
    reason): FAIL with the finding TENANT_ISOLATION, whatever its tokens show; an ERROR stays one. None: unchanged."""
    if reason is None:
        return v
    return replace(v, verdict=ERROR if v.verdict == ERROR else FAIL, reasons=(reason, *v.reasons),
                   finding=TENANT_ISOLATION)  # fmt: skip


def decide_scenario_request_unbased(req: Request) -> ScenarioRequestVerdict:
    """A scenario request whose probe the plain baseline has no result for: nothing to compare with."""
    return ScenarioRequestVerdict(
        INCONCLUSIVE, ("the baseline has no result for this probe",), REUSE if req.hits else MISS, None
    )


def decide_scenario_arm(
    requests: list[tuple[str, ScenarioRequestVerdict]] | tuple[tuple[str, ScenarioRequestVerdict], ...],
    preemption_required: bool,
    preemptions: int | None,
    connector_served: bool | None = None,
    chunked_prefill: int | None = None,
) -> ArmVerdict:
    """A (scenario, arm): the worst of its requests' verdicts (each labelled, e.g. "step 2 chat-511"),
    INCONCLUSIVE when none ran or none reused cached tokens (it compared no reuse: never a PASS by default),
    and INCONCLUSIVE when the scenario says preemption must happen and the engine's counter stayed at 0 or
    could not be read (the scenario then did not test what it says). connector_served: for a connector beneath the
    GPU prefix cache, whether its own count says it served any request (False: INCONCLUSIVE, never a PASS of it;
    None: not such an arm). chunked_prefill: the scenario engine's long_prefill_token_threshold, said beside "no
    request reused" (the plain probes prefill whole prompts: a store that saves a prompt at its first scheduling step
    sees part of it here); None: whole-prompt prefill."""
    verdicts = [v.verdict for _, v in requests]
    reasons = [f"{label}: {r}" for label, v in requests if v.verdict != PASS for r in v.reasons]
    if not requests:
        reasons.append("no request was run")
    elif not any(v.role == REUSE for _, v in requests):
        verdicts.append(INCONCLUSIVE)
        reasons.append(
            "no request reused cached tokens: the scenario compared no reuse"
            + (
                f" (its engine prefilled each request over several steps, at most {chunked_prefill} tokens a step: "
                "long_prefill_token_threshold; the plain probes prefill whole prompts in one)"
                if chunked_prefill
                else ""
            )
        )
    elif connector_served is False:
        verdicts.append(INCONCLUSIVE)
        reasons.append("the connector beneath the GPU prefix cache served no request: the GPU cache served them all")
    if preemption_required and preemptions is None:
        verdicts.append(INCONCLUSIVE)
        reasons.append("the scenario needs preemption and the engine's preemption counter is unavailable")
    elif preemption_required and preemptions == 0:
        verdicts.append(INCONCLUSIVE)
        reasons.append("the scenario needs preemption and the engine preempted no request")
    return ArmVerdict(worst(verdicts), tuple(reasons))
