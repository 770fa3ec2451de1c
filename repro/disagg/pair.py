"""A producer/consumer pair as the P→D arm drives it (PairDriver), and the cases run through one, in order.

PairDriver is what the arm needs of a pair: the cache-off baseline's answer to a prompt, the producer's prefill of
a request (max_tokens 1, kv_transfer_params {"do_remote_decode": true}) returning the kv_transfer_params it hands
on, and the consumer's decode of a request with those parameters (or none: its own prefill) returning the greedy
token IDs and what it said it loaded (repro.judge.pd_verdict.Transfer). repro.disagg.servers drives two `vllm
serve` processes with NixlConnector; the engine-free tests drive fakes (NIXL needs a CUDA GPU).

run_cases sends each case's requests in its order (repro.disagg.cases) and judges every request it judges as it
comes back; the consumer's prefix cache is reset before each case (the producer runs without one), so no case
feeds another.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from repro.disagg.cases import OUT_OF_RANGE_BASE, Case, Cases
from repro.judge.pd_kvaudit import PdKvAudit, name_loaded_blocks
from repro.judge.pd_verdict import ControlOutcome, PdVerdict, Transfer, decide_control, decide_pd_request


@dataclass(frozen=True)
class Answer:
    """One request's answer: its greedy token IDs and counters, or the error the server gave instead."""

    token_ids: tuple[int, ...] | None
    transfer: Transfer | None = None
    error: str | None = None
    cached_tokens: int | None = None  # what the engine reported cached (the baseline must report 0)
    top_gaps: tuple[float | None, ...] | None = None  # the reference's top-1/top-2 logprob gap at each position
    # with the KV audit: the reference's computed full blocks, or the consumer's received ones, as digests (one a
    # block over every layer's K and V); None: not audited
    kv_blocks: tuple[str | None, ...] | None = None
    kv_first_slot: int = 0  # the consumer's: the block slot its first received block went to (its own hit before it)


class PairDriver(Protocol):
    def baseline(self, request_id: str, prompt: tuple[int, ...], max_tokens: int) -> Answer:
        """The cache-off reference's greedy answer (no connector, no prefix cache)."""

    def reset(self) -> None:
        """Empty the consumer's prefix cache (before each case; the producer runs without one)."""

    def prefill(self, request_id: str, prompt: tuple[int, ...]) -> dict:
        """The producer's prefill (do_remote_decode, max_tokens 1): the kv_transfer_params it returns."""

    def decode(self, request_id: str, prompt: tuple[int, ...], params: dict | None, max_tokens: int) -> Answer:
        """The consumer's greedy answer with those kv_transfer_params (None: its own prefill, no transfer)."""


@dataclass(frozen=True)
class Judged:
    """A judged request of a case: which prompt it sent, whose reference it carried, what came back, the verdict."""

    case: str
    trial: int
    prompt: str
    reference: str | None  # the request whose kv_transfer_params it carried; None: none (the consumer's own prefill)
    answer: Answer
    verdict: PdVerdict
    control: ControlOutcome | None = None
    expected_external: int | None = None
    kv: PdKvAudit | None = None  # with the KV audit: whose blocks the consumer loaded (repro.judge.pd_kvaudit)

    def as_dict(self) -> dict:
        a = self.answer
        audit = {"kv_audit": self.kv.as_dict()} if self.kv is not None else {}
        return {
            "case": self.case,
            "trial": self.trial,
            "prompt": self.prompt,
            "reference": self.reference,
            "token_ids": list(a.token_ids) if a.token_ids is not None else None,
            "error": a.error,
            "transfer": a.transfer.as_dict() if a.transfer else None,
            "expected_external_tokens": self.expected_external,
            **self.verdict.as_dict(),
            "control": self.control.as_dict() if self.control else None,
            **audit,
        }


@dataclass
class Run:
    """What a run through a pair gave: the baselines and every judged request, in order."""

    baselines: dict[str, Answer] = field(default_factory=dict)
    judged: list[Judged] = field(default_factory=list)


def run_baselines(driver: PairDriver, cases: Cases) -> dict[str, Answer]:
    return {name: driver.baseline(f"baseline-{name}", toks, cases.max_tokens) for name, toks in cases.prompts.items()}


def aligned_hit(prompt: tuple[int, ...], warm: tuple[int, ...], block_size: int) -> int:
    """The consumer's own prefix hit on `prompt` after `warm` ran there: their common prefix in whole blocks (the
    last prompt token is never a hit: vLLM computes it to sample)."""
    common = 0
    for a, b in zip(prompt[:-1], warm):
        if a != b:
            break
        common += 1
    return common - common % block_size


def run_cases(
    driver: PairDriver,
    cases: Cases,
    trials: int = 1,
    progress: Callable[[str], None] | None = None,
    into: Run | None = None,
) -> Run:
    """Every case `trials` times through the pair, against baselines taken first; each request judged. `into`:
    the Run to fill as requests come back (what came back before a server failed is kept)."""
    run = into if into is not None else Run()
    run.baselines.update(run_baselines(driver, cases))
    answers = {n: a.token_ids or () for n, a in run.baselines.items()}
    for trial in range(1, trials + 1):
        for case in cases.cases:
            if progress:
                progress(f"trial {trial}: {case.kind} {case.name}")
            driver.reset()
            _run_case(driver, cases, case, trial, run.baselines, answers, run.judged)
    return run


def _run_case(
    driver: PairDriver, cases: Cases, case: Case, trial: int, baselines: dict, answers: dict, out: list[Judged]
) -> None:
    """One case's requests in order, each judged and appended to `out` as it comes back."""
    p = cases.prompts
    tag = f"{case.name}-t{trial}"

    def send(label: str, prompt: str, params: dict | None, reference: str | None, judged_as_control: bool) -> Judged:
        got = driver.decode(f"{tag}-{label}", p[prompt], params, cases.max_tokens)
        base = baselines[prompt]
        pv = decide_pd_request(prompt, base.token_ids or (), got.token_ids, got.transfer, answers, got.error,
                               base.cached_tokens if base.error is None else None, base.top_gaps,
                               asked=cases.max_tokens)  # fmt: skip
        if base.error is not None:
            pv = decide_pd_request(prompt, (), None, None, answers, f"the baseline failed: {base.error}")
        control = decide_control(pv, case.expect, case.expect_answers_as, case.predict) if judged_as_control else None
        expected = None
        if params is not None and reference == prompt:
            local = aligned_hit(p[prompt], p[case.other], cases.block_size) if case.kind == "partial" else 0
            expected = len(p[prompt]) - local
        return Judged(case.name, trial, prompt, reference, got, pv, control, expected, _audit(prompt, got))

    def _audit(prompt: str, got: Answer) -> PdKvAudit | None:
        if got.kv_blocks is None:
            return None
        ref = {n: b.kv_blocks for n, b in baselines.items() if b.kv_blocks is not None}
        return name_loaded_blocks(prompt, got.kv_blocks, got.kv_first_slot, ref)

    if case.kind == "partial":  # the consumer's own prefill of the warm prompt: its cache holds the shared blocks
        out.append(send("warm", case.other, None, None, False))
    if case.kind == "stale":
        prev = driver.prefill(f"{tag}-previous", p[case.other])
        out.append(send("previous", case.other, prev, case.other, False))
        driver.reset()  # the consumer's own cache emptied: all of the stale reference is pulled
        out.append(send("stale", case.prompt, prev, case.other, True))
        return
    params = driver.prefill(f"{tag}-prefill", p[case.prompt])
    out.append(send("decode", case.prompt, params, case.prompt, False))
    if case.kind == "consumed":
        between = driver.prefill(f"{tag}-between", p[case.other])
        out.append(send("between", case.other, between, case.other, False))
        driver.reset()  # else the consumer's own cache holds this prompt from its first decode and pulls one block
        out.append(send("consumed", case.prompt, params, case.prompt, True))
    if case.kind == "out-of-range":
        driver.reset()  # else the consumer's own cache holds this prompt from its first decode
        out.append(send("out-of-range", case.prompt, out_of_range(params), case.prompt, True))


def out_of_range(params: dict) -> dict:
    """The same kv_transfer_params with every remote block ID moved past any producer's pool (vLLM #52234's
    "out-of-range remote_block_ids"); remote_block_ids is a list per KV cache group (or one flat list)."""
    ids = params.get("remote_block_ids") or []
    moved = [[OUT_OF_RANGE_BASE + b for b in g] if isinstance(g, list) else OUT_OF_RANGE_BASE + g for g in ids]
    return {**params, "remote_block_ids": moved}


def probe_requests(run: Run) -> list[Judged]:
    """The requests that judge the pair: every request a case sent with its own fresh reference (the controls'
    setup requests included), not the consumer's warm-up and not a control's reused reference."""
    return [j for j in run.judged if j.control is None and j.reference is not None]


def controls(run: Run) -> list[Judged]:
    return [j for j in run.judged if j.control is not None]
