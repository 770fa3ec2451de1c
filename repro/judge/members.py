"""A MultiConnector arm's members judged apart: which member served each reuse, its hits, and what that shows.

MultiConnector loads a request from the first member that reports hits, so an arm's token verdict is the verdict
of whichever member served; a member that served no reuse was never exercised (vLLM #46865: an offload tier
inside MultiConnector silently stored almost nothing), and the arm's PASS says nothing of it. Each member gets
its own verdict over the reuses it served, from the names in repro.judge.verdict:
  FAIL          a reuse it served differs from the baseline (the arm's FAIL names it);
  PASS          it served at least one reuse, every one matched, and the arm's verdict is PASS or a FAIL that
                another member's reuse made;
  INCONCLUSIVE  it served no reuse ("never served a reuse: not exercised"), or the arm's own verdict cannot clear
                anything (INCONCLUSIVE, ERROR).
A reuse whose member is not known (the KV audit off, or without a record of it) is served by nobody the kit can
name: a member that served none of the known ones is then INCONCLUSIVE with that said.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from repro.judge.verdict import FAIL, INCONCLUSIVE, PASS


@dataclass(frozen=True)
class Served:
    """One reuse of a MultiConnector arm: which member loaded it (None: none did, or not known) and how much."""

    label: str  # "fixture reuse 1"
    member: int | None
    tokens: int
    differs: bool  # its answer differs from the baseline's
    unknown: str | None = None  # why the member that loaded it is not known


@dataclass(frozen=True)
class MemberVerdict:
    index: int
    connector: str
    reuses: tuple[str, ...]  # the reuses it served
    hits: int  # tokens it loaded, summed over those reuses
    verdict: str
    reasons: tuple[str, ...]

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "connector": self.connector,
            "reuses_served": list(self.reuses),
            "hits": self.hits,
            "verdict": self.verdict,
            "reasons": list(self.reasons),
        }


def decide_members(connectors: Sequence[str], served: Sequence[Served], arm_verdict: str) -> list[MemberVerdict]:
    """Each member's verdict over the reuses it served (see the module's docstring)."""
    unknown = [s for s in served if s.unknown is not None]
    out = []
    for i, name in enumerate(connectors):
        mine = [s for s in served if s.unknown is None and s.member == i]
        hits = sum(s.tokens for s in mine)
        head = f"member {i} {name}"
        differs = [s.label for s in mine if s.differs]
        if differs:
            verdict, why = FAIL, f"{head} served {', '.join(differs)}, which differ from the baseline ({hits} tokens)"
        elif not mine:
            why = f"{head} never served a reuse: not exercised"
            if unknown:
                why += f" (which member served {len(unknown)} reuse(s) is not known: {unknown[0].unknown})"
            verdict = INCONCLUSIVE
        elif arm_verdict in (PASS, FAIL):
            verdict, why = PASS, ""
        else:
            verdict, why = INCONCLUSIVE, f"{head} served {len(mine)} reuse(s) ({hits} tokens); the arm is {arm_verdict}"
        out.append(MemberVerdict(i, name, tuple(s.label for s in mine), hits, verdict, (why,) if why else ()))
    return out


def served_reuses(probes: Sequence[dict]) -> list[Served]:
    """The reuses of an arm's judged probe entries (repro.judge.evaluate) with the member that loaded each."""
    out = []
    for probe in probes:
        for i, req in enumerate(probe.get("requests") or []):
            if i == 0:
                continue
            m = req.get("connector_member") or {"index": None, "unavailable": "no member recorded"}
            label = f"{probe['name']} reuse {i}"
            differs = req.get("first_diff") is not None
            out.append(Served(label, m.get("index"), int(m.get("tokens") or 0), differs, m.get("unavailable")))
    return out
