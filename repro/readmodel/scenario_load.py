"""A production-load scenario as the read model holds it (repro.plan.load, repro.run.load_scenario): what it
generated, its reference and reuse control, and each arm's rates per round, always k of N.

Every key a record may lack reads as absent ('?'), never as a zero."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repro.judge.verdict import KV_FINDINGS
from repro.readmodel.scenario_fields import int_field

# at most this many requests that are not PASS are listed per (load scenario, arm) in the summary; the page and
# the report list them all
SUMMARY_REQUESTS = 8


def _n(round_: Mapping[str, Any], key: str) -> str:
    found = int_field(round_.get(key))
    return "?" if found is None else str(found)


def round_of(step: int | None) -> str:
    """'round 1': a load request's round as a reader counts it. Its record keeps the key every scenario's requests
    share, `step` (0-based); the rounds' rates and the page's rounds count from 1."""
    return f"round {'?' if step is None else step + 1}"


def round_step_text(index: int | None, prompts: int, cancel: Mapping[str, Any]) -> str:
    """'round 1: 64 prompts in flight together, in a shuffled order, cancelling load-p004-s01 (prefill), …' (a
    round's 64 names are in the report)."""
    text = f"{round_of(index)}: {prompts} prompts in flight together, in a shuffled order"
    return text + (", cancelling " + ", ".join(f"{n} ({w})" for n, w in cancel.items()) if cancel else "")


def rounds_of(data: Mapping[str, Any] | None) -> tuple[Mapping[str, Any], ...]:
    found = (data or {}).get("rounds")
    return tuple(r for r in found if isinstance(r, Mapping)) if isinstance(found, list) else ()


def arm_rates_text(load: Mapping[str, Any] | None) -> str:
    """'round 1: 2 of 64 differ (2 FAIL), 6 of 64 reused, KV findings 1 of 64 (1 CORRUPT, 1 with cache-off tokens),
    6 cancelled; round 2: ...' for an arm's load rates: a request differs when neither the reuse control nor the
    schedule control shows its divergence; a request whose hit counter is None or negative (vLLM's -1) is no reuse,
    said apart ('2 of 64 with no hit counter'); its KV findings beside, where the arm was KV-audited (kv_text); ''
    without rates."""
    parts = []
    for r in rounds_of(load):
        total = _n(r, "requests")
        text = f"round {_n(r, 'round')}: {_n(r, 'differ')} of {total} differ ({_n(r, 'fail')} FAIL)"
        explained = [
            f"{_n(r, key)} {label}"
            for key, label in (("reuse_numerics", "as the reuse control"), ("schedule_numerics", "as cache-off"))
            if int_field(r.get(key))
        ]
        if explained:
            text += f", {' and '.join(explained)}"
        text += f", {_n(r, 'reused')} of {total} reused"
        if int_field(r.get("counter_missing")):  # None or vLLM's -1: no hit, said apart (absent in older reports)
            text += f", {_n(r, 'counter_missing')} of {total} with no hit counter"
        text += kv_text(r)
        text += f", {_n(r, 'cancelled')} cancelled"
        if int_field(r.get("cancel_missed")):
            text += f" ({_n(r, 'cancel_missed')} missed)"
        parts.append(text)
    if load is not None and load.get("reuse_control") is False:
        parts.append("no reuse control to compare with")
    return "; ".join(parts)


def kv_text(round_: Mapping[str, Any]) -> str:
    """', KV findings 3 of 64 (2 CORRUPT, 1 MISPLACED, 1 with cache-off tokens), 2 KV unavailable': a round's KV
    findings (MISPLACED, FOREIGN, CORRUPT: repro.judge.verdict.KV_FINDINGS) beside its token differences, by class,
    and how many of them gave the cache-off answer's tokens (the tokens alone would not show those); '' where the
    round has no KV figures (the arm not KV-audited, or a report made before rounds counted them)."""
    if int_field(round_.get("kv_audited")) is None:
        return ""
    text = f", KV findings {_n(round_, 'kv_findings')} of {_n(round_, 'requests')}"
    if int_field(round_.get("kv_findings")):
        classes = [
            f"{_n(round_, f'kv_{c.lower()}')} {c}" for c in KV_FINDINGS if int_field(round_.get(f"kv_{c.lower()}"))
        ]
        text += f" ({', '.join(classes)}, {_n(round_, 'kv_findings_tokens_match')} with cache-off tokens)"
    return text + (
        f", {_n(round_, 'kv_unavailable')} KV unavailable" if int_field(round_.get("kv_unavailable")) else ""
    )


def spec_text(load: Mapping[str, Any]) -> str:
    """'64 prompts a round (16 prefixes of 192 tokens × 4 suffixes of 32), 3 rounds in shuffled orders, seed 5;
    a round cancels 3 in prefill and 3 at their last step, each that lands sent again'."""
    g = {k: "?" if int_field(load.get(k)) is None else str(load.get(k)) for k in load}
    n = (int_field(load.get("prefixes")) or 0) * (int_field(load.get("suffixes")) or 0)
    text = (
        f"{n or '?'} prompts a round ({g.get('prefixes', '?')} prefixes of {g.get('prefix_tokens', '?')} tokens × "
        f"{g.get('suffixes', '?')} suffixes of {g.get('suffix_tokens', '?')}), {g.get('rounds', '?')} rounds in "
        f"shuffled orders, seed {g.get('seed', '?')}"
    )
    cancels = [
        f"{load.get(key)} {label}"
        for key, label in (("cancel_in_prefill", "in prefill"), ("cancel_at_last_step", "at their last step"))
        if int_field(load.get(key))
    ]
    return text + (f"; a round cancels {' and '.join(cancels)}, each that lands sent again" if cancels else "")


def controls_text(load: Mapping[str, Any]) -> str:
    """'reference: ok · reuse control (native, a pool that holds every prompt): round 1: 0 of 64 differ from
    cache-off, 49 reused; ...': the two runs every arm is judged against."""
    ref = load.get("reference") if isinstance(load.get("reference"), Mapping) else {}
    ctl = load.get("reuse_control") if isinstance(load.get("reuse_control"), Mapping) else {}
    ref_text = f"reference (each prompt alone, cache off): {ref.get('status', '?')}"
    if ref.get("error"):
        ref_text += f" — {ref['error']}"
    ctl_text = "reuse control (native, a pool that holds every prompt): " + str(ctl.get("status", "?"))
    if ctl.get("error"):
        ctl_text += f" — {ctl['error']}"
    rounds = [
        f"round {_n(r, 'round')}: {_n(r, 'differ')} of {_n(r, 'requests')} differ from cache-off, "
        f"{_n(r, 'reused')} reused"
        + (f", {_n(r, 'counter_missing')} with no hit counter" if int_field(r.get("counter_missing")) else "")
        for r in rounds_of(ctl)
    ]
    return " · ".join([ref_text, ctl_text + (f": {'; '.join(rounds)}" if rounds else "")])
