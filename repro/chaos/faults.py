"""The faults of a chaos run, drawn from a seed (pure: no clock, no processes, no files)."""

from __future__ import annotations

import random
from dataclasses import dataclass

# What a fault hits. Each category names the kit run it needs (repro.chaos.scenarios).
KIT, CHILD, SERVER, RAY_WORKER = "kit", "engine-child", "mp-server", "ray-worker"
DISK_FULL, UNWRITABLE, RESULT_FILE = "disk-full", "unwritable-dir", "result-file"
CATEGORIES = (KIT, CHILD, SERVER, RAY_WORKER, DISK_FULL, UNWRITABLE, RESULT_FILE)
SIGNALS = ("SIGKILL", "SIGTERM", "SIGINT")
SIGNALLED = (KIT, CHILD, SERVER, RAY_WORKER)
# The kit runs (repro.chaos.scenarios): the CPU self-test, the same with an LMCacheMPConnector arm on the MP
# stand-in, the self-test whose children keep their result a while before they exit, a 2-cell matrix on Ray.
SELFTEST, MP, LINGER, MATRIX = "selftest", "mp", "linger", "matrix"
# "before": the directory is unwritable before the kit starts; "mid-run": at the fault's moment.
UNWRITABLE_WHEN = ("before", "mid-run")
RESULT_DAMAGE = ("truncate", "corrupt")


@dataclass(frozen=True)
class Fault:
    index: int  # 1-based, in drawing order
    category: str
    variant: str  # a signal name, "before"/"mid-run", "truncate"/"corrupt", or "fill"
    scenario: str
    fraction: float  # the moment, as a fraction of the scenario's calibrated wall time
    pick: float  # which target, when several are alive: a fraction of the sorted list
    damage_at: float  # result-file faults: where in the file (a fraction of its length)

    @property
    def label(self) -> str:
        return f"{self.category}:{self.variant}"


def draw_faults(n: int, seed: int, categories: tuple[str, ...] = CATEGORIES) -> list[Fault]:
    """n faults: the categories round by round, each round in an order drawn from the seed, so that any
    len(categories) consecutive faults cover every category; the variant, the moment and the target
    from the same generator. The same (n, seed, categories) always gives the same list."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    order: list[str] = []
    while len(faults) < n:
        if not order:
            order = list(categories)
            rng.shuffle(order)
        category = order.pop(0)
        variant, scenario = _variant(rng, category)
        faults.append(Fault(len(faults) + 1, category, variant, scenario, rng.random(), rng.random(), rng.random()))
    return faults


def _variant(rng: random.Random, category: str) -> tuple[str, str]:
    if category in (KIT, CHILD):
        return rng.choice(SIGNALS), rng.choice((SELFTEST, MP))
    if category == SERVER:
        return rng.choice(SIGNALS), MP
    if category == RAY_WORKER:
        return rng.choice(SIGNALS), MATRIX
    if category == DISK_FULL:
        return "fill", SELFTEST
    if category == UNWRITABLE:
        return rng.choice(UNWRITABLE_WHEN), SELFTEST
    if category == RESULT_FILE:
        return rng.choice(RESULT_DAMAGE), LINGER
    raise ValueError(f"unknown fault category {category!r}")
