"""Whether an answer is the one asked for: its generated token IDs against the request's max_tokens. Pure.

The kit asks every request it compares greedy, with ignore_eos, for max_tokens tokens (the engine child's
SamplingParams, the served body of repro.engine.served, the P→D pair's requests). The engine then stops only at
max_tokens, so an answer of any other length is not the answer asked for: a server cut it, dropped its token IDs,
or ran past the window. Compared as it is, it would compare part of an answer, or nothing (two empty answers are
equal). Such an answer is refused as one without token IDs is.

Where the rule does not apply:
- Without ignore_eos the model's end-of-sequence token may end an answer early, so only an answer longer than
  max_tokens is wrong. This covers the child's priming request (max_tokens 1, never recorded).
- Requests that are not answers never come here: the P→D producer's prefill (max_tokens 1, only its
  kv_transfer_params are read) and a load round's cancellation that landed (the request is sent again, and that
  answer is the one judged; a cancellation that missed is read to its end and judged as any answer).
"""

from __future__ import annotations

from collections.abc import Sequence

NO_TOKEN_IDS = "answer has no token_ids"


def answer_problem(token_ids: Sequence[int] | None, asked: int | None, ignore_eos: bool) -> str | None:
    """What is wrong with an answer's generated token IDs (None: nothing). token_ids None: the answer had none.
    asked: the request's max_tokens; None where the caller does not know it. The kit never asks for fewer than 1
    token, so under ignore_eos an empty answer is refused even then. ignore_eos: whether the request set it."""
    if token_ids is None:
        return NO_TOKEN_IDS
    got = len(token_ids)
    if asked is None:
        return "answer has 0 tokens, at least 1 asked (greedy, ignore_eos)" if ignore_eos and got == 0 else None
    rule = " (greedy, ignore_eos)" if ignore_eos else ""
    if ignore_eos and got < asked:
        return f"answer has {got} of {asked} tokens asked{rule}"
    if got > asked:
        return f"answer has {got} tokens, over the {asked} asked{rule}"
    return None
