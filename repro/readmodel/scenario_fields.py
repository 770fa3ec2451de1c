"""What every scenario record of the read model reads from its data: an integer field (absent is None,
never a zero), where a request ran (step and probe), a verdict with its reasons and class, and a run's
facts (preemptions, wall time, log); and what a step's expectation means to a reader.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repro.judge.wording import NOT_RECORDED, seconds
from repro.readmodel.probes import finding_of

# What a step's expect means, as a reader needs it (the producer's words are "miss", "reuse" or null).
EXPECT_TEXT = {"miss": "must miss", "reuse": "must reuse", None: "hit or miss"}


def int_field(value: object) -> int | None:
    """An integer as it is; anything else (a bool, absent) None, never read as a zero."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Placed:
    """Where a request of a scenario ran: its step and probe (a mixin over a record's data)."""

    data: Mapping[str, Any]

    @property
    def step(self) -> int | None:
        return int_field(self.data.get("step"))

    @property
    def probe(self) -> str:
        return str(self.data.get("probe", "?"))

    @property
    def place(self) -> str:
        """'step 2 chat-511'; a production-load request (its record has `cancel`) 'round 3 load-p011-s02': its
        record's `step` is 0-based, as every scenario's, and a reader counts rounds from 1, as its rates do."""
        if "cancel" in self.data:
            return f"round {'?' if self.step is None else self.step + 1} {self.probe}"
        return f"step {'?' if self.step is None else self.step} {self.probe}"


class Judged:
    """A scenario record's verdict, its reasons and the class of its divergences (a mixin over its data)."""

    data: Mapping[str, Any]

    @property
    def verdict(self) -> str:
        return str(self.data.get("verdict") or "?")

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(str(r) for r in self.data.get("reasons") or [])

    @property
    def cls(self) -> str:
        """The class of the divergences when the schedule explains them ('schedule-numerics'); '' when none."""
        return str(self.data.get("class") or "")

    @property
    def finding(self) -> str | None:
        """A request's finding that no fixture's FAIL excuses ('tenant-isolation', 'no-hit-differs'); None: none."""
        return finding_of(self.data)


class RunFacts:
    """What one child's run of a scenario recorded besides its requests: preemptions, wall time, log."""

    data: Mapping[str, Any]

    @property
    def preemptions(self) -> int | None:
        return int_field(self.data.get("preemptions"))

    @property
    def preemptions_text(self) -> str:
        """'preemptions 3 (vllm:num_preemptions …)', 'preemptions not recorded (unavailable: …)'."""
        source = str(self.data.get("preemptions_source") or "")
        count = self.preemptions
        text = f"preemptions {NOT_RECORDED if count is None else count}"
        return text + (f" ({source})" if source else "")

    @property
    def log(self) -> object:
        return self.data.get("log")

    @property
    def wall_text(self) -> str:
        return seconds(self.data.get("wall_s"))
