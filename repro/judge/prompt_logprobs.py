"""Prompt-logprob probes judged: a request's prompt logprobs against the cache-off baseline's for the same prompt,
and the check that a reuse expected to hit was not silently turned off by asking for them. Pure functions.

The rule, fixed before any run was measured (docs/verdicts.md, "Prompt logprobs"):
- the top-1 token IDs are compared exactly, position by position, as generated tokens are everywhere in the kit; a
  request that reported a hit and whose top-1 IDs differ, whose position count differs, or that holds a value no
  log-probability can be (not finite, or above 0) FAILs; a miss that does is INCONCLUSIVE (no reuse to blame);
- the values are compared bit for bit and reported (the largest |difference|, the first position that differs), and
  never decide a verdict alone: a reuse computes the positions after its cached prefix in a prefill of another shape,
  which rounds differently (the KV audit's NUMERIC), and no floor for prompt logprobs has been measured, so any
  tolerance would be invented;
- a request that asked for prompt logprobs where reuse was expected and whose hit counter says 0 is INCONCLUSIVE:
  vLLM's SamplingParams skip reading the prefix cache for such a request (skip_reading_prefix_cache), so the arm
  compared no reuse;
- a record with fewer positions than its prompt has from the second token on (the record's prompt_tokens; vLLM's
  completion stream carries no prompt logprobs, and an endpoint may ignore the field), or one compared with a
  baseline's that has, is missing evidence: INCONCLUSIVE with its reason, never exact (two empty records are
  equal and compare nothing); the report then keeps no vs_baseline for it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace

from repro.judge.verdict import ERROR, FAIL, INCONCLUSIVE, SKIPPED, hit_count, worst

TURNED_OFF = "reuse turned off by prompt_logprobs"
EXACT_VALUES, VALUES_DIFFER, INVALID, TOP1_DIFFERS = "exact", "values-differ", "invalid", "top1-differs"
MISSING = "missing"  # a side holds fewer positions than its prompt: nothing compared (never written in a report)


@dataclass(frozen=True)
class Comparison:
    """A request's prompt logprobs against the baseline's: positions on each side, the first top-1 ID that differs
    and how many do, the first and last value that differ (a reuse's cached prefix covers positions 0 to hits - 1:
    a last difference below that says the positions it computed are bit-identical), the largest |difference| (over
    positions both hold a number), the values that are no logprob, and the class (the worst of top1-differs,
    invalid, values-differ, exact; missing where either side is short of its prompt, with why in `missing`)."""

    positions: int
    baseline_positions: int
    top1_first_diff: int | None
    top1_differ: int
    value_first_diff: int | None
    value_last_diff: int | None
    max_abs_diff: float | None
    invalid: int
    cls: str
    missing: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {
            "baseline_positions": self.baseline_positions,
            "top1_first_diff": self.top1_first_diff,
            "top1_differ": self.top1_differ,
            "value_first_diff": self.value_first_diff,
            "value_last_diff": self.value_last_diff,
            "max_abs_diff": self.max_abs_diff,
            "invalid": self.invalid,
            "class": self.cls,
        }


def _bad(value: object) -> bool:
    return not isinstance(value, (int, float)) or isinstance(value, bool) or value > 0


def shortfall(record: dict) -> str | None:
    """Why a record holds fewer positions than its prompt has from the second token on (None: it holds them all).
    Without prompt_tokens (a record made by hand) only an empty record is short."""
    got, prompt = len(record.get("logprobs") or []), record.get("prompt_tokens")
    if isinstance(prompt, int) and not isinstance(prompt, bool) and got < prompt - 1:
        return f"{got} of {prompt - 1} prompt positions returned"
    return "no prompt positions returned" if got == 0 else None


def compare(record: dict, baseline: dict) -> Comparison:
    """One request's record (repro.engine.prompt_logprobs.record) against the baseline's for the same prompt; a side
    short of its prompt (shortfall) makes the class MISSING: nothing is compared, whatever the rest says."""
    missing = tuple(f"{whose}{why}" for whose, r in (("", record), ("the baseline's record: ", baseline))
                    if (why := shortfall(r)) is not None)  # fmt: skip
    lps, top1 = list(record.get("logprobs") or []), list(record.get("top1") or [])
    base_lps, base_top1 = list(baseline.get("logprobs") or []), list(baseline.get("top1") or [])
    n, m = len(lps), len(base_lps)
    top1_diffs = [i for i in range(max(len(top1), len(base_top1)))
                  if i >= len(top1) or i >= len(base_top1) or top1[i] != base_top1[i]]  # fmt: skip
    value_diffs = [i for i in range(max(n, m)) if i >= n or i >= m or lps[i] != base_lps[i]]
    numbers = [abs(a - b) for a, b in zip(lps, base_lps) if not _bad(a) and not _bad(b)]
    invalid = sum(1 for v in lps if _bad(v))
    cls = (
        TOP1_DIFFERS if top1_diffs or n != m else INVALID if invalid else VALUES_DIFFER if value_diffs else EXACT_VALUES
    )
    cls = MISSING if missing else cls
    return Comparison(
        positions=n,
        baseline_positions=m,
        top1_first_diff=top1_diffs[0] if top1_diffs else None,
        top1_differ=len(top1_diffs),
        value_first_diff=value_diffs[0] if value_diffs else None,
        value_last_diff=value_diffs[-1] if value_diffs else None,
        max_abs_diff=max(numbers) if numbers else None,
        invalid=invalid,
        cls=cls,
        missing=missing,
    )


def digest(record: dict) -> str:
    """A short digest of a record's values and top-1 IDs: two requests with equal digests returned the same."""
    data = json.dumps([record.get("logprobs"), record.get("top1")], separators=(",", ":"))
    return "sha256:" + hashlib.sha256(data.encode("utf-8")).hexdigest()[:16]


def summary(record: dict | None, comparison: Comparison | None) -> dict | None:
    """What the report keeps of a request's prompt logprobs (never every value: reports stay small); vs_baseline only
    where a comparison was made (not where a side was missing)."""
    if record is None:
        return None
    out = {"k": record.get("k"), "positions": len(record.get("logprobs") or []), "digest": digest(record)}
    made = comparison is not None and comparison.cls != MISSING
    return out | ({"vs_baseline": comparison.as_dict()} if made else {})


def findings(
    record: dict | None, comparison: Comparison | None, hits: int | None, expect_reuse: bool
) -> list[tuple[str, str]]:
    """(verdict, reason) pairs a request's prompt logprobs add to its verdict; none where it asked for none.
    hits: its hit counter as a count (None: missing, which its own verdict already says). comparison None: not
    compared (a baseline's own request), and then only the record's own shortfall is judged."""
    if record is None:
        return []
    found = []
    if expect_reuse and hits == 0:
        why = f"{TURNED_OFF}: it asked for prompt_logprobs={record.get('k')} and its hit counter says 0"
        found.append((INCONCLUSIVE, why + " (vLLM skips reading its prefix cache for such a request)"))
    missing = comparison.missing if comparison is not None else tuple(filter(None, [shortfall(record)]))
    if missing:
        found.append((INCONCLUSIVE, f"prompt logprobs missing: {'; '.join(missing)} (nothing compared)"))
    c = comparison
    if c is None or c.cls not in (TOP1_DIFFERS, INVALID, MISSING) or (c.cls == MISSING and not c.invalid):
        return found
    what = (
        f"prompt logprobs' top-1 IDs differ from the baseline's @{c.top1_first_diff} ({c.top1_differ} of "
        f"{c.baseline_positions} positions; {c.positions} returned)"
        if c.cls == TOP1_DIFFERS
        else f"prompt logprobs hold {c.invalid} value(s) no log-probability can be"
    )
    if hits:
        found.append((FAIL, f"{hits} cached tokens, {what}"))
    else:
        found.append((INCONCLUSIVE, f"{what} on a miss: no reuse to blame"))
    return found


def apply(verdict, found: list[tuple[str, str]]):
    """A probe's or scenario request's verdict record (it has .verdict and .reasons) with these findings: the worst
    verdict, their reasons added; an ERROR or SKIPPED stays as it is."""
    if not found or verdict.verdict in (ERROR, SKIPPED):
        return verdict
    return replace(
        verdict,
        verdict=worst([verdict.verdict, *(v for v, _ in found)]),
        reasons=(*verdict.reasons, *(r for _, r in found)),
    )


def judge_probe(pv, requests: tuple, baseline_cold, entries: list[dict], reuse_arm: bool):
    """A plain probe's verdict with its prompt logprobs judged: every request (RequestResult) of a reuse arm against
    the baseline's cold request, its reuses expected to hit; entries (the report's requests, in the same order) get
    the summary in place of the record. The baseline's own requests are summarized, not compared; a record of
    theirs short of its prompt is missing evidence there too."""
    base = baseline_cold.prompt_logprobs if baseline_cold is not None else None
    found = []
    for i, (req, entry) in enumerate(zip(requests, entries)):
        record = req.prompt_logprobs
        comparison = compare(record, base) if reuse_arm and record is not None and base is not None else None
        entry.pop("prompt_logprobs", None)
        if record is None:
            continue
        entry["prompt_logprobs"] = summary(record, comparison)
        label = "cold request" if i == 0 else f"reuse {i}"
        hits = hit_count(req.cached_tokens)
        found += [(v, f"{label}: {r}") for v, r in findings(record, comparison, hits, expect_reuse=reuse_arm and i > 0)]
    return apply(pv, found)


def judge_request(v, req, baseline_cold, expect_reuse: bool) -> tuple:
    """A scenario request's verdict (ScenarioRequestVerdict) with its prompt logprobs judged against the baseline's
    cold request of its probe, and the report's summary of them (None where it asked for none)."""
    record = req.prompt_logprobs
    if record is None:
        return v, None
    base = baseline_cold.prompt_logprobs if baseline_cold is not None else None
    comparison = compare(record, base) if base is not None else None
    return apply(v, findings(record, comparison, hit_count(req.cached_tokens), expect_reuse)), summary(
        record, comparison
    )
