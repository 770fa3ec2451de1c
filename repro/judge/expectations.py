"""Expectations: what a fixture states must hold on any machine, and whether an observed verdict meets it.

An expectation is one verdict ("PASS") or a set of them (["EXACT", "NUMERIC"]): a set states what must hold
where the numerics legitimately depend on the machine's kernels (a reused prefix computed by a prefill of
another length is bit-identical on one CPU and within the floor on the next). A set never mixes a finding
(FAIL, or a KV finding: CORRUPT, FOREIGN, MISPLACED) with its absence: that would accept a finding and its absence
alike (repro.plan.fixtures refuses it). A set of findings (["CORRUPT", "MISPLACED"]) is a finding either way.
"""

from __future__ import annotations

from repro.judge.verdict import FAIL, KV_FINDINGS

FINDINGS = (FAIL, *KV_FINDINGS)


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
    """Whether the expectation states this verdict (a stated FAIL or KV finding: a planted fault meant to be caught)."""
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
