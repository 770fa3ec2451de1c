"""Replayed answers: where a divergent reuse's generated tokens are another probe's answer, or one of
its own probe's earlier requests'. Pure functions over token-ID lists; no KV audit needed.

A reuse that ran on another prompt's KV tends to answer as that prompt would: from its first
generated token on, at the same indices. So the comparison is aligned: index k of the reuse against
index k of a source (another probe's baseline continuation, or an earlier request of the same probe
in the same arm: its cold request and earlier reuses). An index is evidence of a replay when the
reuse's token equals the source's and differs from the probe's own baseline token there: probes
share a model and a chat template, so their answers share tokens, and a token the probe's own answer
has at that index says nothing about where the reuse's answer came from. A replay is a run of at
least MIN_REPLAY_TOKENS consecutive evidence indices (issue 19 set 4, fixed before any run was
looked at); each source gives its longest run (the earliest of equals).

Tokens at other indices (an answer shifted by some tokens) are not compared: on a small vocabulary
short n-grams recur everywhere, and an unaligned 4-token match would name sources by chance.

Key identity (LoRA adapters, repro.plan.adapters): a source probe with this probe's prompt under another adapter
(the same tokens, other weights) is that adapter's answer to this very prompt. Its replay names the adapter
(Replay.answers_as): the reuse answers as adapter A, whose KV a cache keyed on the tokens alone would serve.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MIN_REPLAY_TOKENS = 4
BASELINE = "baseline"  # the source is another probe's baseline continuation (its answer)


@dataclass(frozen=True)
class Replay:
    """A run of a reuse's tokens that are a source's tokens at the same indices, not its own answer's."""

    probe: str  # whose answer: another probe, or this probe (an earlier request)
    request: str  # "baseline" (that probe's answer), or this probe's "cold" / "reuse N"
    start: int  # the first index of the run, in the reuse and in the source alike
    tokens: int  # the run's length
    answers_as: str | None = None  # the source is this prompt under other weights: "adapter A", "the base model"

    def as_dict(self) -> dict:
        out = {"probe": self.probe, "request": self.request, "from": self.start, "tokens": self.tokens}
        return out | ({"answers_as": self.answers_as} if self.answers_as is not None else {})


def replay_run(reuse: Sequence[int], own: Sequence[int], source: Sequence[int]) -> tuple[int, int] | None:
    """(start, length) of the longest run of indices where the reuse has the source's token and not
    its own baseline's (an index past the end of its own baseline counts as not); None when it is
    shorter than MIN_REPLAY_TOKENS."""
    best, start, length = None, 0, 0
    for k, (got, theirs) in enumerate(zip(reuse, source)):
        if got == theirs and (k >= len(own) or got != own[k]):
            start, length = (start, length + 1) if length else (k, 1)
            if length >= MIN_REPLAY_TOKENS and (best is None or length > best[1]):
                best = (start, length)
        else:
            length = 0
    return best


def find_replays(
    probe: str,
    reuse: Sequence[int],
    own: Sequence[int],
    answers: Mapping[str, Sequence[int]],
    earlier: Sequence[tuple[str, Sequence[int]]] = (),
    answers_as: Mapping[str, str] | None = None,
) -> tuple[Replay, ...]:
    """Every source the reuse replays: other probes' answers first (answers: probe -> baseline
    continuation; the probe's own entry is skipped), then this probe's earlier requests (earlier:
    (label, tokens), e.g. ("cold", ...), ("reuse 1", ...)); each group longest run first, then by
    start, then in the order given. Earlier requests that give the very same run are one finding (a
    deterministic fault gives every reuse the same answer): only the earliest of them is kept.
    answers_as: the probes that are this prompt under other weights -> whose answer theirs is ("adapter A", "the
    base model"; repro.judge.adapters.siblings); their replays say so."""
    named = answers_as or {}
    others = [
        Replay(name, BASELINE, *run, named.get(name))
        for name, tokens in answers.items()
        if name != probe and (run := replay_run(reuse, own, tokens)) is not None
    ]
    mine: dict[tuple[int, int], Replay] = {}
    for label, tokens in earlier:
        run = replay_run(reuse, own, tokens)
        if run is not None and run not in mine:
            mine[run] = Replay(probe, label, *run)
    return tuple(sorted(others, key=_longest_first) + sorted(mine.values(), key=_longest_first))


def _longest_first(replay: Replay) -> tuple[int, int]:
    """Longest run first, then the earliest; sorted() keeps the given order of equals."""
    return -replay.tokens, replay.start


def request_label(index: int) -> str:
    """A probe's request by its index: 'cold' for the first, then 'reuse 1', 'reuse 2', …"""
    return "cold" if index == 0 else f"reuse {index}"
