"""Tenant isolation across cache salts, judged: whether a request's reported hit can have come only from KV that
another tenant salt (vLLM's cache_salt, repro.plan.salts) had sent to the same engine.

vLLM keys a prompt's first prefix-cache block on its salt, so the same tokens under two salts never share native
blocks; a store that keys on the tokens alone (vLLM's ExampleConnector names its files by the tokens and images only)
serves one tenant's KV to another. A salt changes no answer (the KV of the same tokens is the same), so the tokens
cannot show it: the hit counter does. A request of salt S may reuse as much of its prompt as a request of S sent
before it in this engine had in common with it; a hit beyond that, where a request of another salt sent before it
shares the prompt further, is another tenant's KV served: TENANT_ISOLATION (repro.judge.verdict), a FAIL that no
fixture's FAIL excuses. A hit that no earlier request explains at all is left to the other rules (a store that held
something before the run: not a question of salts). Probes without a salt are one tenant of their own ("no salt"), as
vLLM treats them; a run without salts has one tenant and nothing to judge here.

Only an engine the kit started is judged so: a server the kit did not start (`repro endpoint`) holds traffic the run
did not send, so its history is not this run's. Pure functions over a result's probes (name, prompt_token_ids,
cache_salt) and the hit counters as reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from repro.judge.compare import first_diff
from repro.judge.verdict import ProbeVerdict, decide_tenant_isolation, hit_count


def salt_text(salt: str | None) -> str:
    """The salt as a reason names it: cache_salt 'tenant-a', or no cache_salt."""
    return f"cache_salt {salt!r}" if salt is not None else "no cache_salt"


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading tokens a and b share (repro.judge.compare.first_diff; all of a when they are the same)."""
    found = first_diff(list(a), list(b))
    return len(a) if found is None else found


@dataclass(frozen=True)
class Sent:
    """One request an engine was sent: its label ('short-a cold request', 'step 1 short-a'), salt and prompt."""

    label: str
    salt: str | None
    ids: tuple[int, ...]


class Tenants:
    """What one engine (and its connector's store) was sent so far, request by request, and whether each hit it
    reports is its own tenant's to reuse. probes: the run's probe results (name, prompt_token_ids, cache_salt)."""

    def __init__(self, probes: Iterable, judged: bool = True):
        probes = list(probes)
        self.prompts = {p.name: (getattr(p, "cache_salt", None), tuple(p.prompt_token_ids)) for p in probes}
        # nothing to judge without two tenants, or on a server the kit did not start (its history is not the run's)
        self.judged = judged and len({salt for salt, _ in self.prompts.values()}) > 1
        self.sent: list[Sent] = []

    def cross(self, label: str, probe: str, cached: object) -> str | None:
        """Why this request's hit is another tenant's KV (the reason of a TENANT_ISOLATION), or None; then counts
        the request as sent (label: how the reason names it)."""
        salt, ids = self.prompts.get(probe, (None, ()))
        why = self._why(salt, ids, hit_count(cached)) if self.judged and probe in self.prompts else None
        self.sent.append(Sent(label, salt, ids))
        return why

    def _why(self, salt: str | None, ids: tuple[int, ...], hits: int | None) -> str | None:
        if not hits:
            return None
        own = max((common_prefix(ids, s.ids) for s in self.sent if s.salt == salt), default=0)
        others = [(common_prefix(ids, s.ids), s) for s in self.sent if s.salt != salt]
        reach, source = max(others, key=lambda o: o[0], default=(0, None))
        if hits <= own or reach <= own or source is None:
            return None
        return (
            f"tenant isolation: {salt_text(salt)} reported {hits} cached tokens, of which its own salt had sent "
            f"{own} before it; {source.label} ({salt_text(source.salt)}) had sent {min(hits, reach)}: another "
            "tenant's KV served"
        )


def judge_probes(
    probes: Iterable, verdicts: Mapping[str, ProbeVerdict], judged: bool = True
) -> dict[str, ProbeVerdict]:
    """A plain arm's probes (its result's, in the order it ran them) with each probe whose request reported another
    tenant's KV made a TENANT_ISOLATION FAIL (repro.judge.verdict.decide_tenant_isolation); the others as given.
    judged False: a server the kit did not start (nothing is judged)."""
    probes = list(probes)
    tenants = Tenants(probes, judged)
    out = dict(verdicts)
    for p in probes:
        reasons = []
        for i, r in enumerate(p.requests):
            label = "cold request" if i == 0 else f"reuse {i}"
            why = tenants.cross(f"probe {p.name} {label}", p.name, r.cached_tokens)
            if why is not None:
                reasons.append(f"{label}: {why}")
        if reasons and p.name in out:
            out[p.name] = decide_tenant_isolation(out[p.name], reasons)
    return out
