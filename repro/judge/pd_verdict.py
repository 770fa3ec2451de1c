"""Disaggregated prefill (P→D): a consumer's answer judged against the cache-off baseline, gated on the KV it says
it loaded from the producer. Pure functions over token IDs and counters; the names come from repro.judge.verdict.

A pair passes only where the consumer loaded external tokens (vLLM's `num_external_tokens`, seen from outside as the
delta of `vllm:external_prefix_cache_hits` on the consumer) with no failed NIXL transfer, and its greedy tokens equal
the baseline's exactly. A consumer that loaded nothing re-prefilled (vLLM #26896: a right answer with no transfer):
"transfer not exercised", INCONCLUSIVE, never PASS. An answer that differs is a FAIL whoever computed it; where its
tokens are another request's baseline answer at the same indices (repro.judge.replays) the FAIL names it: "answers as
<request>" (vLLM #52234's stale reference returns the previous prompt's answer).

A wrong answer given with HTTP 200 after external tokens were loaded is a FAIL, as every reuse that differs from the
baseline (docs/verdicts.md); where the consumer counted a failed NIXL transfer (vllm:nixl_num_failed_transfers) the
reasons say so (the fault showed in the server's metrics, not to the client). A refused request is ERROR. A failed
transfer recomputed into the right answer is "transfer not exercised", INCONCLUSIVE; a NIXL counter the consumer did
not export (None) is INCONCLUSIVE too, naming the counter: missing telemetry never scores better than a zero. An
answer, the consumer's or the baseline's, that is not the one asked for (greedy, ignore_eos: max_tokens long,
repro.judge.answer) is ERROR, as a refused request is: two empty or cut answers that agree prove nothing.

A negative control (a consumed, stale or out-of-range reference handed to the consumer) is judged the same way; what
the case declares it must not be (`expect`: the verdicts that show the stack caught or exposed it, `expect_answers_as`:
whose answer a stale reference must be named as) is checked by decide_control.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from repro.judge.answer import answer_problem
from repro.judge.compare import first_diff
from repro.judge.replays import BASELINE, Replay, find_replays
from repro.judge.verdict import (
    ERROR,
    FAIL,
    INCONCLUSIVE,
    PASS,
    UNCLASSED,
    VERDICTS,
    classify_divergence,
    counter_missing,
    hit_count,
)

NOT_EXERCISED = "transfer not exercised"
# the consumer's metrics Transfer's counts come from (repro.disagg.servers reads them), named where one is missing
XFER_COUNTER = "vllm:nixl_xfer_time_seconds"
FAILED_COUNTER = "vllm:nixl_num_failed_transfers"


@dataclass(frozen=True)
class Transfer:
    """What the consumer reported for one request (None: not reported, never read as zero)."""

    external_tokens: int | None  # the connector's tokens for this request: vLLM's num_external_tokens
    local_tokens: int | None = None  # the consumer's own prefix-cache hit (vllm:prefix_cache_hits delta)
    cached_tokens: int | None = None  # the served usage.prompt_tokens_details.cached_tokens: local + external
    transfers: int | None = None  # NIXL transfers completed (vllm:nixl_xfer_time_seconds count delta)
    failed_transfers: int | None = None  # vllm:nixl_num_failed_transfers delta

    def as_dict(self) -> dict:
        return {
            "external_tokens": self.external_tokens,
            "local_tokens": self.local_tokens,
            "cached_tokens": self.cached_tokens,
            "transfers": self.transfers,
            "failed_transfers": self.failed_transfers,
        }


@dataclass(frozen=True)
class PdVerdict:
    verdict: str
    reasons: tuple[str, ...]
    first_diff: int | None = None
    replays: tuple[Replay, ...] = ()
    divergence: str | None = None  # a FAIL's class: decisive, near-tie or unclassed (no gap recorded)

    @property
    def answers_as(self) -> str | None:
        """The request whose baseline answer this one replays (the longest run), or None."""
        return next((r.probe for r in self.replays if r.request == BASELINE), None)

    def as_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "first_diff": self.first_diff,
            "replays": [r.as_dict() for r in self.replays],
            "answers_as": self.answers_as,
            "divergence": self.divergence,
        }


def decide_pd_request(
    name: str,
    baseline: Sequence[int],
    tokens: Sequence[int] | None,
    transfer: Transfer | None,
    answers: Mapping[str, Sequence[int]],
    error: str | None = None,
    baseline_cached: int | None = 0,
    baseline_gaps: Sequence[float | None] | None = None,
    asked: int | None = None,
) -> PdVerdict:
    """One request sent through the pair: `name` the request, `baseline` its cache-off answer, `tokens` the
    consumer's (None with `error`: the consumer or producer refused it), `answers` every request's baseline answer
    (its own is skipped) for naming a replay, `baseline_cached` what the baseline reported cached (must be 0),
    `baseline_gaps` the baseline's top-1/top-2 logprob gap at each index: a divergence is classed from it (a near-tie
    or decisive, repro.judge.verdict.classify_divergence), which never changes the FAIL. `asked`: the max_tokens both
    were sent with (greedy, ignore_eos); None where not known, and then only an empty answer is refused."""
    if error is not None or tokens is None:
        failed = hit_count(transfer.failed_transfers) if transfer else None
        told = f"; the consumer counted {failed} failed NIXL transfer(s)" if failed else ""
        return PdVerdict(ERROR, (f"the pair gave no answer: {error or 'no tokens'}{told}",))
    cut = [f"{whose}{p}" for whose, ids in (("", tokens), ("the baseline's ", baseline))
           if (p := answer_problem(ids, asked, ignore_eos=True)) is not None]  # fmt: skip
    if cut:
        return PdVerdict(ERROR, tuple(cut))
    if hit_count(baseline_cached) != 0:
        why = counter_missing(baseline_cached, "baseline", cached=True) if hit_count(baseline_cached) is None else None
        why = why or f"the baseline reported {baseline_cached} cached tokens with caching off"
        return PdVerdict(INCONCLUSIVE, (f"{why}: it is not a reference",))
    diff = first_diff(list(baseline), list(tokens))
    transfer = transfer or Transfer(None)
    ext = hit_count(transfer.external_tokens)
    if diff is not None:
        loaded = "the external token count missing" if ext is None else f"{ext} external tokens loaded"
        if ext == 0:
            loaded = "no external tokens: the consumer's own prefill"
        replays = tuple(r for r in find_replays(name, tokens, baseline, answers) if r.request == BASELINE)
        gap = baseline_gaps[diff] if baseline_gaps is not None and diff < len(baseline_gaps) else None
        divergence = classify_divergence(gap)
        shown = f", the baseline's top-1/top-2 gap {gap:.4f} nats" if divergence != UNCLASSED else ""
        reasons = [f"differs from the baseline @{diff} ({loaded}; {divergence}{shown})"]
        reasons += [
            f"answers as {r.probe}: its baseline's tokens @{r.start}-{r.start + r.tokens - 1}, not its own"
            for r in replays
        ]
        failed = hit_count(transfer.failed_transfers)
        if failed:  # wrong with HTTP 200: a FAIL (docs/verdicts.md), the consumer's own count of it in the reasons
            reasons.append(f"answered with HTTP 200 although the consumer counted {failed} failed NIXL transfer(s)")
        if failed is None:
            reasons.append("the failed-transfer count missing: whether the stack reported a failure is unknown")
        return PdVerdict(FAIL, tuple(reasons), diff, replays, divergence)
    return PdVerdict(*_gate(transfer, ext))


def _gate(transfer: Transfer, ext: int | None) -> tuple[str, tuple[str, ...]]:
    """An answer equal to the baseline's: PASS only where the consumer loaded the producer's KV."""
    if ext is None:
        return INCONCLUSIVE, (f"{counter_missing(transfer.external_tokens, 'the consumer external token')}",)
    if ext == 0:
        return INCONCLUSIVE, (f"{NOT_EXERCISED}: the consumer loaded no external tokens (it re-prefilled)",)
    failed = hit_count(transfer.failed_transfers)
    if failed:
        return INCONCLUSIVE, (f"{NOT_EXERCISED}: {failed} NIXL transfer(s) failed and the consumer recomputed",)
    done = hit_count(transfer.transfers)
    if done == 0:
        return INCONCLUSIVE, (f"{NOT_EXERCISED}: {ext} external tokens counted but no NIXL transfer completed",)
    # a counter the consumer did not export is missing, never good: it may hide a failed load recomputed right
    if done is None:
        why = f"whether the {ext} external tokens came by a completed transfer is unknown"
        return INCONCLUSIVE, (f"the NIXL transfer counter ({XFER_COUNTER}) missing: {why}",)
    if failed is None:
        why = "whether a transfer failed and the consumer recomputed is unknown"
        return INCONCLUSIVE, (f"the failed NIXL transfer counter ({FAILED_COUNTER}) missing: {why}",)
    return PASS, ()


@dataclass(frozen=True)
class ControlOutcome:
    """Whether a negative control came out as its case says it must."""

    held: bool
    reason: str
    predicted: bool | None = None  # the verdict the case predicted before any run came out (None: no prediction)

    def as_dict(self) -> dict:
        return {"held": self.held, "reason": self.reason, "predicted": self.predicted}


def decide_control(
    pv: PdVerdict, expect: Sequence[str], answers_as: str | None = None, predict: str | None = None
) -> ControlOutcome:
    """A negative control holds when its verdict is one the case expects and, where the case names whose answer a
    stale reference returns, the FAIL names that request. `predict`, the one verdict the case predicted before any
    run, is reported beside it (as predicted or not) and never changes whether it held."""
    unknown = [v for v in (*expect, *([predict] if predict else [])) if v not in VERDICTS]
    if unknown:
        raise ValueError(f"not a verdict: {unknown[0]!r}")
    predicted = None if predict is None else pv.verdict == predict
    said = "" if predict is None else f"; predicted {predict}: " + ("as predicted" if predicted else "not as predicted")
    if pv.verdict not in expect:
        return ControlOutcome(False, f"expected {' or '.join(expect)}, got {pv.verdict}{said}", predicted)
    if answers_as is not None and pv.verdict == FAIL and pv.answers_as != answers_as:
        got = pv.answers_as or "no other request"
        return ControlOutcome(
            False, f"expected the answer named as {answers_as}'s, it answers as {got}{said}", predicted
        )
    named = f" answers as {pv.answers_as}" if pv.answers_as else ""
    return ControlOutcome(True, f"{pv.verdict}{named}, as expected{said}", predicted)


def decide_pd_arm(verdicts: Sequence[str], controls: Sequence[ControlOutcome]) -> tuple[str, tuple[str, ...]]:
    """The arm: the worst of its probe requests' verdicts (no probe request at all is INCONCLUSIVE). A control that
    did not hold is a reason beside it, not a change of it: a stack that refuses or recomputes a bad reference is
    correct, and the probes say whether its transfers are; the control says the kit could not show that fault there
    (the exit code, the kit's one exit rule over the requests, is 0 only when every probe request PASSes and every
    control held: repro.disagg.report.exit_view)."""
    order = {PASS: 0, INCONCLUSIVE: 1, FAIL: 2, ERROR: 3}
    arm = max(verdicts, key=order.__getitem__) if verdicts else INCONCLUSIVE
    reasons = [] if verdicts else ["no probe request was run"]
    reasons += [f"a negative control did not hold: {c.reason}" for c in controls if not c.held]
    return arm, tuple(reasons)
