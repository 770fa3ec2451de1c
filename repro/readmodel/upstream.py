"""A report's upstream bounds as the read model holds them: each expectation the fixture bound to a known upstream
bug, with the state the run judged it in (repro.judge.upstream) and the words the views print."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from repro.judge.upstream import BOUND_WRONG, FIXED_UPSTREAM, UNDECIDED, UPSTREAM_CHANGES


@dataclass(frozen=True)
class UpstreamCheck:
    """One bound as the report records it (the report's `upstream` items)."""

    data: Mapping[str, Any] = field(repr=False)

    @property
    def state(self) -> str:
        return str(self.data.get("state"))

    @property
    def text(self) -> str:
        """The judge's sentence, which names the bug, the version, where and what was observed: 'fixed upstream:
        vllm-project/vllm#30931 does not reproduce on vllm 0.32.0 (native same-name PASS where the fixture expects
        FAIL; its range: vllm <0.31)'."""
        return str(self.data.get("text") or self.state)

    @property
    def issue(self) -> str:
        return str(self.data.get("issue"))

    @property
    def is_change(self) -> bool:
        """A change to look at, which exits 1: fixed upstream, a wrong bound, one that cannot be decided."""
        return self.state in UPSTREAM_CHANGES

    @property
    def short(self) -> str:
        """The headline's words for a change ('vllm-project/vllm#30931 fixed upstream: does not reproduce on vllm
        0.32.0'); '' for a bound that is no change."""
        version = f"{self.data.get('package')} {self.data.get('engine_version')}"
        return {
            FIXED_UPSTREAM: f"{self.issue} fixed upstream: does not reproduce on {version}",
            BOUND_WRONG: f"{self.issue} reproduces on {version}, outside its stated range {self.data.get('versions')}",
            UNDECIDED: f"{self.issue}'s range cannot be decided on this report's {self.data.get('package')} version",
        }.get(self.state, "")


def read_upstream(found: object) -> tuple[UpstreamCheck, ...]:
    """The report's `upstream` items as records; () for a report without them."""
    return tuple(UpstreamCheck(u) for u in found if isinstance(u, Mapping)) if isinstance(found, list) else ()
