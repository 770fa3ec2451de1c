"""The detection study's rows of failures reported as success (repro.engine.connectors.planted_failures): each row's
fault, position, settings and engine, and its expectation, written before its first run and never tuned after.

The study's other rows expect one thing (a FAIL at some window, the planted blocks blamed exactly); these expect what
their own mechanism must give: a FAIL where a reuse that reported a hit read wrong bytes, the request's ERROR where
vLLM's kv_load_failure_policy "fail" stops it, the baseline's answer where "recompute" recovers, and a class of its own
where the connector loaded what it never counted. Whether each held is decided from the row's entry
(repro.detection.expected); a row that did not hold is reported as measured.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from repro.judge.verdict import CORRUPT, ERROR, EXACT, FAIL, FOREIGN, KV_FINDINGS, NO_HIT_DIFFERS, PASS

# The smallest pool vLLM starts with at the study's max_model_len (2048 tokens, 128 blocks of 16): the study's
# prompts use it up by the third probe, so later reuses are given blocks that earlier requests freed.
RECYCLED_POOL_TOKENS = 2048


@dataclass(frozen=True)
class Expectation:
    """What must hold on every probe of a row, at the study's largest window (its 32-token run)."""

    verdict: tuple[str, ...]  # the token verdicts each probe may take (decide_probe over the first 32 tokens)
    kv: tuple[str, ...] | None  # the KV verdicts each probe may take; None: not stated (why says why)
    # "exact" (the planted blocks blamed, no more, no fewer), "reported" (none blamed, the blocks the connector reported
    # to vLLM as not loaded the planted ones: repro.detection.blame), "unavailable", or None: not stated
    blame: str | None
    why: str
    finding: str | None = None  # the finding every probe's FAIL must carry (repro.judge.verdict.FINDINGS)
    # an expectation changed after its row first ran: what it said, what the run found and why it changed (shown
    # beside the row on the study's page); None: as written before the first run
    restated: str | None = None


@dataclass(frozen=True)
class Row:
    fault: str
    position: str
    what: str
    params: dict = field(default_factory=dict)  # the planted connector's settings beside `fault`
    kv_cache_tokens: int | None = None  # the arm's KV pool, where the row needs its own (else the study's)
    # another prompt sent whole between each cold request and its reuse (repro.detection.plan.BETWEEN), so that the
    # reuse is given the blocks that prompt freed, holding its KV, rather than its own cold request's
    between: bool = False
    expectation: Expectation | None = None

    def to_json(self) -> dict:
        return asdict(self)


ANY_KV_FINDING = tuple(KV_FINDINGS)  # a row that accepts whichever KV finding its probes show
ROWS = (
    Row(
        "dropped_load",
        "fresh",
        "every block of every load is counted as loaded and never written; the study's pool is large enough that "
        "each reuse gets never-used, zeroed blocks",
        expectation=Expectation(
            (FAIL,),
            (CORRUPT,),
            "exact",
            "Each reuse reports a hit on its whole loaded prefix (18 to 28 blocks) and attention reads zeros for all "
            "of it, far more than the single zeroed block the zero_blocks row already catches at 32 tokens; zeros "
            "equal no prompt's KV, so every loaded block is CORRUPT, and only those.",
        ),
    ),
    Row(
        "dropped_load",
        "recycled",
        f"the same, in a {RECYCLED_POOL_TOKENS}-token pool (128 blocks): from the second probe on, the reuse's blocks "
        "include blocks earlier requests freed, so it reads what they left (another request's KV) where it reads "
        "no zeros",
        kv_cache_tokens=RECYCLED_POOL_TOKENS,
        expectation=Expectation(
            (FAIL,),
            ANY_KV_FINDING,
            "exact",
            "As in a fresh pool, nothing of the loaded prefix is the prompt's own KV at its own position: a block "
            "keeps zeros (CORRUPT), a block or a partial block of another request (FOREIGN or CORRUPT), or this "
            "prompt's own KV from another position (MISPLACED, not expected: vLLM frees a request's blocks last "
            "first, so they come back in reverse order). Every loaded block is a finding, and only those.",
        ),
    ),
    Row(
        "failed_store",
        "head",
        "the first 16 blocks a cold request stores (a 256-token chunk) are saved with layers 0 and 1 of 4 only, "
        "their keys registered; each reuse loads them whole as far as the store has them",
        params={"first_block": 0, "num_blocks": 16},
        expectation=Expectation(
            (FAIL,),
            (CORRUPT,),
            "exact",
            "Layers 2 and 3 of 16 loaded blocks keep the fresh pool's zeros while vLLM counts them as loaded: half "
            "the model over 16 blocks, far more than the single zeroed block the zero_blocks head row catches at 32 "
            "tokens. The blocks the broken store touched are CORRUPT in those layers; every other block is the "
            "stored KV, exact.",
        ),
    ),
    Row(
        "failed_store",
        "tail",
        "the last 16 blocks a cold request stores are saved with layers 0 and 1 only, their keys registered",
        params={"first_block": -16, "num_blocks": 16},
        expectation=Expectation(
            (FAIL,),
            (CORRUPT,),
            "exact",
            "As the head row, at the other end of the prompt: the study's prompts store as many blocks as their "
            "reuses load ((L - 1) % 16 is never 0), so all 16 broken blocks are loaded.",
        ),
    ),
    Row(
        "late_load",
        "whole",
        "every load is asynchronous and reported received before any byte is written; the bytes arrive after the "
        "forward that first computes the request",
        expectation=Expectation(
            (FAIL,),
            (CORRUPT,),
            "exact",
            "The prefill's attention reads the zeroed blocks for the whole loaded prefix and samples the first token "
            "from them, and the prompt's last partial block is computed on them; later steps read the right prefix "
            "and that wrong tail. The KV audit reads an asynchronous load's blocks in the first forward that "
            "computes the request, before the late bytes: every loaded block is CORRUPT there.",
        ),
    ),
    Row(
        "load_error",
        "policy-fail",
        "the last 4 blocks of every load are never written and are reported to vLLM "
        "(get_block_ids_with_load_errors), with kv_load_failure_policy fail (vLLM's default)",
        params={"first_block": -4, "num_blocks": 4, "load_failure_policy": "fail"},
        expectation=Expectation(
            (ERROR,),
            None,
            "unavailable",
            "vLLM finishes each reuse with finish_reason error and no tokens: the kit must show ERROR for the probe "
            "(the reuse's answer is not the one asked for), never PASS. The KV is not stated: what the audit read is "
            "in a forward whose request failed. Blame is unavailable: vLLM returns a request it failed without its "
            "kv_transfer_params, so the study does not know which blocks were planted.",
        ),
    ),
    Row(
        "load_error",
        "policy-recompute",
        "the same, with kv_load_failure_policy recompute: vLLM recomputes from the first reported block",
        params={"first_block": -4, "num_blocks": 4, "load_failure_policy": "recompute"},
        expectation=Expectation(
            (PASS,),
            (EXACT,),
            "reported",
            "vLLM discards the step that read the unwritten blocks and recomputes the prompt from the first of them, "
            "keeping the faithfully loaded blocks before it: the answer is the baseline's. The KV audit reads a "
            "reuse's blocks in its first forward, the one vLLM discards, and the 4 blocks the connector reported "
            "(get_block_ids_with_load_errors) are read but never a finding: no block blamed, the reported blocks the "
            "planted ones; every other loaded block is the stored KV, exact.",
            restated="Before its first run this row expected KV CORRUPT with the 4 reported blocks blamed exactly: "
            "the kit did not read what a connector reports to vLLM, and said so as a known false blame. The run "
            "found MISPLACED on exactly those blocks (they held this prompt's KV mirrored, not zeros). The kit now "
            "reads the report (repro.engine.kvaudit_hooks), so the row states what a fixed kit must show: a change "
            "to the kit, not to what vLLM does.",
        ),
    ),
    Row(
        "unreported_load",
        "prefix",
        "the connector finds each reuse's stored blocks, tells vLLM 0 tokens, and after the prefill writes into "
        "them the KV the most recently stored other prompt has at each index (the decoy's for the first probe)",
        expectation=Expectation(
            (FAIL,),
            (FOREIGN,),
            "exact",
            "Every decode step attends over another prompt's KV for the whole prefix: the answer changes while vLLM's "
            "counter says 0 cached tokens. The verifier must not call that INCONCLUSIVE: it is a reuse that reports no"
            " hit and answers differently, the verifier's FAIL with the finding no-hit-differs (its cold request, the "
            "same prompt prefilled whole, gave the baseline's tokens: not numerics). The KV audit reads such a reuse's"
            " computed blocks at the end of its prefill's step, after the connector's write: each block it overwrote "
            "holds another prompt's KV at the same index (FOREIGN), and those blocks are blamed exactly.",
            finding=NO_HIT_DIFFERS,
            restated="Before its first run this row expected KV UNAVAILABLE, no block blamed: the audit was thought "
            "to read only what vLLM counted as reused. The run found KV EXACT, blame under: the kit read a no-hit "
            "reuse's computed blocks during the forward, before the connector wrote over them, and called KV that no "
            "decode step read exact. The kit now reads computed blocks at the end of the step, once every write of "
            "the step landed (repro.engine.kvaudit), so the row states what that kit must show: a change to the kit, "
            "not to what the connector does.",
        ),
    ),
)
# Rows added after the first run of the two above them missed their predictions (docs/detection.md): that run found
# vLLM 0.28 gives a reuse its own cold request's freed blocks, last freed first (vllm/v1/core/block_pool.py
# free_blocks: blocks that are not prefix-cached are prepended to the free queue, "LIFO reuse ... for better GPU
# locality"), so the lost layers and the unwritten blocks held this prompt's own KV, mirrored, not zeros. These rows
# keep the faults and settings of failed_store/tail and late_load/whole and send another prompt between, so that the
# premise holds by construction; written before their first run, and the two rows above stay as they measured.
BETWEEN_ROWS = (
    Row(
        "failed_store",
        "tail-after-another",
        "as the tail row, with another prompt (longer than any probe) sent whole between each cold request and its "
        "reuse: the reuse is given that prompt's freed blocks, so the 16 broken blocks' layers 2 and 3 hold its KV",
        params={"first_block": -16, "num_blocks": 16},
        between=True,
        expectation=Expectation(
            (FAIL, PASS),
            ANY_KV_FINDING,
            "exact",
            "Every loaded block is one of the prompt sent between's freed blocks (it is longer than any probe, so "
            "it takes all of the cold request's and frees its own last first). The 16 broken blocks are loaded with "
            "layers 0 and 1 right and layers 2 and 3 holding that prompt's KV from other positions: each is a KV "
            "finding, and only those (the stored blocks before them are exact), blamed exactly. The token verdict is "
            "not stated: in the tail row delta kept the baseline's 32 tokens with those layers wrong on 16 of its 18 "
            "loaded blocks, so this tiny model's answer is not a measure of this fault; the KV audit is.",
        ),
    ),
    Row(
        "late_load",
        "whole-after-another",
        "as the whole row, with another prompt sent whole between each cold request and its reuse: the late bytes "
        "arrive after a prefill that read that prompt's KV, not this prompt's own",
        between=True,
        expectation=Expectation(
            (FAIL,),
            ANY_KV_FINDING,
            "exact",
            "The prefill's attention reads another prompt's KV for the whole loaded prefix and samples the first token "
            "from it, and the prompt's last partial block is computed on it. In the study's other_prompt row, a whole "
            "prefix of another prompt's KV changed every probe's answer within 32 tokens (first diff at 0 to 3), and "
            "here the first token and the partial block come from such a prefill: a FAIL on every probe. The audit "
            "reads an asynchronous load's blocks in the first forward that computes the request, before the late "
            "bytes: every loaded block holds the other prompt's KV there, a finding, blamed exactly.",
        ),
    ),
)
ROWS = (*ROWS, *BETWEEN_ROWS)
# The asynchronous path's own control (late_load's machinery without the lateness), beside the study's controls.
ASYNC_CONTROL = ("PlantedFault-none-async", {"async_load": True})


def rows_of(fault: str) -> tuple[Row, ...]:
    return tuple(r for r in ROWS if r.fault == fault)


def row(fault: str, position: str) -> Row | None:
    return next((r for r in ROWS if r.fault == fault and r.position == position), None)


FAULTS = tuple(dict.fromkeys(r.fault for r in ROWS))
