"""Exact token-ID comparison and the logprob margin at a divergence. Pure functions."""

from __future__ import annotations

from dataclasses import dataclass

# Fixed in the kit's first commit, before any report, and never changed; what it means in float16 ULPs and
# how far numerics move a gap (measured: python -m repro.measure.margins --compare-kernels): docs/verdicts.md#the-near-tie-line
NEAR_TIE_NATS = 0.1


def first_diff(expected: list[int], got: list[int]) -> int | None:
    """Index of the first differing token, or None when the sequences are identical.

    A length difference counts as a difference at the shorter length: no normalization.
    """
    for i, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            return i
    if len(expected) != len(got):
        return min(len(expected), len(got))
    return None


@dataclass(frozen=True)
class Margin:
    """Logprob evidence at the first divergence, from both sides."""

    index: int
    baseline_token: int | None
    reuse_token: int | None
    # baseline's logprob of its own token minus its logprob of the reuse's token; None when the
    # reuse token is outside the baseline's top-k (then baseline_gap_lower_bound holds).
    baseline_margin: float | None
    baseline_gap_lower_bound: float | None
    reuse_margin: float | None
    baseline_top_gap: float | None
    near_tie: bool

    def as_dict(self) -> dict:
        return {
            "index": self.index,
            "baseline_token": self.baseline_token,
            "reuse_token": self.reuse_token,
            "baseline_margin": _r(self.baseline_margin),
            "baseline_gap_lower_bound": _r(self.baseline_gap_lower_bound),
            "reuse_margin": _r(self.reuse_margin),
            "baseline_top_gap": _r(self.baseline_top_gap),
            "near_tie": self.near_tie,
        }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def _lookup(top: list[list], token: int | None) -> float | None:
    for t, lp in top:
        if t == token:
            return lp
    return None


def margin_at(
    index: int, baseline_ids: list[int], reuse_ids: list[int], baseline_top: list[list], reuse_top: list[list]
) -> Margin:
    """How decisive each side was at the divergence.

    baseline_top and reuse_top are [[token_id, logprob], ...] best first at that position.
    """
    a = baseline_ids[index] if index < len(baseline_ids) else None
    b = reuse_ids[index] if index < len(reuse_ids) else None
    base_a, base_b = _lookup(baseline_top, a), _lookup(baseline_top, b)
    reuse_b, reuse_a = _lookup(reuse_top, b), _lookup(reuse_top, a)
    top_gap = baseline_top[0][1] - baseline_top[1][1] if len(baseline_top) >= 2 else None
    baseline_margin = base_a - base_b if base_a is not None and base_b is not None else None
    lower = None
    if baseline_margin is None and base_a is not None and baseline_top:
        # the reuse token is not in the baseline's top-k: the gap is at least top-1 minus the worst listed
        lower = base_a - baseline_top[-1][1]
    reuse_margin = reuse_b - reuse_a if reuse_b is not None and reuse_a is not None else None
    return Margin(
        index=index,
        baseline_token=a,
        reuse_token=b,
        baseline_margin=baseline_margin,
        baseline_gap_lower_bound=lower,
        reuse_margin=reuse_margin,
        baseline_top_gap=top_gap,
        near_tie=top_gap is not None and top_gap < NEAR_TIE_NATS,
    )
