"""The probe sets: a fixture's probes, plus the acceptance suite's chunk-boundary chat probes."""

from __future__ import annotations

from repro.plan.fixtures import Probe
from repro.plan.prompts import BOUNDARY_FILLER, chat_spec

DEFAULT_REUSES = 3
# Prompt lengths around LMCache's default 256-token chunk: one short of two chunks, exactly two
# (a full-prompt hit), and one over. The reference saw 0→256, 0→511 and 0→512 cached there.
BOUNDARY_LENGTHS = (511, 512, 513)
# One reuse each, as in the reference run (4 + 2 + 2 + 2 generations per reuse arm).
BOUNDARY_REUSES = 1


def boundary_probe(length: int) -> Probe:
    """A chat prompt of exactly `length` tokens whose first block is unique to it.

    The length leads the system message, so no two probes share their first block (and so
    neither a block- nor a chunk-granular cache can serve one probe from another).
    """
    return Probe(
        name=f"chat-{length}",
        chat=chat_spec(f"{length}-token boundary", length, BOUNDARY_FILLER),
        reuses=BOUNDARY_REUSES,
    )


def build_probes(fixture_probes: tuple[Probe, ...], suite: str | None) -> list[Probe]:
    probes = list(fixture_probes)
    if suite == "acceptance":
        taken = {p.name for p in probes}
        probes += [boundary_probe(n) for n in BOUNDARY_LENGTHS if f"chat-{n}" not in taken]
    return probes


def requests_for(probe: Probe, reuses_flag: int | None) -> int:
    """1 cold request plus the reuses: the command line's --reuses wins, then the probe's own."""
    if reuses_flag is not None:
        return 1 + reuses_flag
    return 1 + (probe.reuses if probe.reuses is not None else DEFAULT_REUSES)
