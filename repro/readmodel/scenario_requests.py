"""A scenario's requests as the read model holds them: each arm's request of a step (verdict, first diff, hit
counter, KV verdict, expectation, the control's request at the same place) and the schedule control (the
baseline's cache-off run of the same steps) with its own requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from repro.judge.verdict import PASS
from repro.judge.wording import NOT_RECORDED
from repro.readmodel.probes import KVCells, ProbeKV
from repro.readmodel.requests import Divergence, Request
from repro.readmodel.scenario_fields import EXPECT_TEXT, Judged, Placed, RunFacts, int_field
from repro.readmodel.scenario_trials import RequestRate


@dataclass(frozen=True)
class ControlRequest(Placed):
    """One request of the schedule control: the baseline's cache-off run of the scenario's steps, against
    the plain cold baseline of its probe (a difference is the schedule's own numerics, not reuse)."""

    data: Mapping[str, Any] = field(repr=False)

    @property
    def token_ids(self) -> list[int] | None:
        found = self.data.get("token_ids")
        return found if isinstance(found, list) else None

    @property
    def cached_tokens(self) -> int | None:
        return int_field(self.data.get("cached_tokens"))

    @property
    def matches_plain(self) -> bool | None:
        found = self.data.get("matches_plain")
        return found if isinstance(found, bool) else None

    @property
    def first_diff(self) -> int | None:
        return int_field(self.data.get("first_diff"))

    @property
    def preemptions(self) -> int | None:
        return int_field(self.data.get("preemptions"))

    @property
    def differs(self) -> bool:
        """The schedule alone changed this request's tokens (cache off)."""
        return self.matches_plain is False

    @property
    def text(self) -> str:
        """'same as the plain baseline', 'differs from the plain baseline @5', 'not recorded'."""
        if self.matches_plain is None:
            return NOT_RECORDED
        if self.matches_plain:
            return "same as the plain baseline"
        at = f" @{self.first_diff}" if self.first_diff is not None else ""
        return f"differs from the plain baseline{at}"


@dataclass(frozen=True)
class ScenarioControl(RunFacts):
    """The schedule control of a scenario: which arm ran it (the baseline), whether it ran, its requests."""

    data: Mapping[str, Any] = field(repr=False)
    requests: tuple[ControlRequest, ...]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScenarioControl:
        found = data.get("requests")
        items = found if isinstance(found, list) else []
        return cls(data, tuple(ControlRequest(r) for r in items if isinstance(r, dict)))

    @property
    def arm(self) -> str:
        return str(self.data.get("arm") or "baseline")

    @property
    def status(self) -> str:
        return str(self.data.get("status") or "?")

    @property
    def error(self) -> str:
        return str(self.data.get("error") or "")

    @property
    def ran(self) -> bool:
        return self.status == "ok"

    @property
    def differing(self) -> tuple[ControlRequest, ...]:
        return tuple(r for r in self.requests if r.differs)

    @property
    def summary_line(self) -> str:
        """'control (baseline, cache off): ERROR …' or 'control (baseline, cache off) differs from the plain
        baseline: step 0 chat-513 @5, …'; '' when it ran and every request matched (nothing to say)."""
        head = f"control ({self.arm}, cache off)"
        if not self.ran:
            return f"{head}: ERROR {self.error or self.status}"
        if not self.differing:
            return ""
        where = ", ".join(f"{r.place} @{'?' if r.first_diff is None else r.first_diff}" for r in self.differing)
        return f"{head} differs from the plain baseline: {where}"

    @property
    def text(self) -> str:
        """What the control says, in one line: every request as the plain baseline, which differ, or why
        it gave no control."""
        head = f"schedule control ({self.arm}, cache off, the same steps)"
        if not self.ran:
            return f"{head}: {self.status}" + (f": {self.error}" if self.error else "")
        if not self.requests:
            return f"{head}: no request recorded"
        if not self.differing:
            return f"{head}: every request gave the plain baseline's tokens"
        where = "; ".join(f"{r.place} {r.text}" for r in self.differing)
        return f"{head}: {where} (the schedule alone changes the numerics there)"


@dataclass(frozen=True)
class StepRequest(KVCells, Placed, Judged, Request):
    """One request of a scenario arm: a Request (tokens, first diff, margin, replays) with its step, the
    expectation, its own verdict, its KV verdict and the control's request at the same place."""

    kv: ProbeKV | None = None  # None: not audited (a miss, the audit off)
    control: ControlRequest | None = None  # the control's request at the same step, probe and occurrence
    rate: RequestRate | None = None  # the same request across the arm's trials; None: one trial, or PASS in all

    @classmethod
    def from_scenario(
        cls,
        data: Mapping[str, Any],
        block_size: int | None,
        control: ControlRequest | None,
        rate: RequestRate | None = None,
    ) -> StepRequest:
        base = Request.from_json(data)
        kv = data.get("kv")
        kv_verdict = ProbeKV(kv, block_size) if isinstance(kv, dict) else None
        return cls(data, base.kv_audit, base.replays, kv_verdict, control, rate)

    @property
    def trial_mark(self) -> str:
        """'in 2 of 2 trials, KV CORRUPT in 2 of 2': how many trials gave this request its verdict (and its KV
        finding, by its class: 'KV MISPLACED in 1 of 2'); '' with one trial."""
        rate = self.rate
        if rate is None or rate.of is None:
            return ""
        mark = f"in {rate.count(self.verdict)} of {rate.of} trials"
        if self.kv_finding:
            mark += f", KV {self.kv_verdict} in {rate.kv_count(str(self.kv_verdict))} of {rate.of}"
        return mark

    @property
    def expect(self) -> str | None:
        found = self.data.get("expect")
        return None if found is None else str(found)

    @property
    def expect_text(self) -> str:
        return EXPECT_TEXT.get(self.expect, f"expect {self.expect}")

    @property
    def note(self) -> str:
        """What qualifies the request's check (e.g. an expected reuse not enforced); '' when nothing does."""
        return str(self.data.get("note") or "")

    @property
    def preemptions(self) -> int | None:
        return int_field(self.data.get("preemptions"))

    @property
    def connector_hit_tokens(self) -> int | None:
        """The connector's own count of this request's hit tokens (LMCache's `num_lmcache_cached_tokens` in its
        kv_transfer_params); None: not reported (native, LMCacheMPConnector)."""
        found = self.data.get("kv_transfer_params")
        return int_field(found.get("num_lmcache_cached_tokens")) if isinstance(found, dict) else None

    @property
    def counter_note(self) -> str:
        """Where the connector counted more hit tokens than vLLM, beyond the last prompt token that vLLM never
        counts: 'LMCache reported 256 hit tokens where vLLM counted 0 cached'. With a preemption in its call,
        the reason is named: vLLM (0.28.0's scheduler) records a request's cached tokens at its first schedule
        only, so a load when a preempted request resumes is in LMCache's count and not in vLLM's. Evidence
        beside the verdict, which vLLM's count and the tokens decide; '' when the counts agree."""
        theirs, cached = self.connector_hit_tokens, self.cached_tokens
        if theirs is None or cached is None or theirs <= cached + 1:
            return ""
        text = f"LMCache reported {theirs} hit tokens where vLLM counted {cached} cached"
        if self.preemptions:
            text += (
                ": a load vLLM's counter leaves out (vLLM records a request's cached tokens at its first schedule, "
                "not when it resumes after a preemption)"
            )
        return text

    @property
    def origin(self) -> str:
        """Where the audit found the reused KV came from: 'local' (the engine's prefix cache), 'external'
        (the connector); '' when not recorded."""
        return str((self.kv.data.get("origin") if self.kv is not None else None) or "")

    @property
    def hit_cell(self) -> str:
        """'496', '0', '?' (absent is shown, never read as 0)."""
        cached = self.cached_tokens
        return "?" if cached is None else str(cached)

    @property
    def divergence(self) -> Divergence | None:
        if self.first_diff is None:
            return None
        gap = self.top_gap
        return Divergence(
            self.first_diff, self.divergence_class or "", gap if isinstance(gap, (int, float)) else None, 1
        )

    @property
    def diff_cell(self) -> str:
        """'@2 (decisive, gap 8.376 nats)'; '' when it gave the baseline's tokens."""
        found = self.divergence
        return found.text if found is not None else ""

    @property
    def control_matches(self) -> bool | None:
        """Whether this request's tokens equal the schedule control's at the same place; None: not recorded.

        From the token IDs of both where the report has them. The report's own `control_matches` says
        something else: whether the control gave the plain baseline's tokens at this request (what
        repro.judge.scenario_verdict decides with); it is used only where a request's or the control's tokens are missing."""
        control = self.control
        mine = self.data.get("token_ids")
        if control is not None and control.token_ids is not None and isinstance(mine, list):
            return mine == control.token_ids
        control_as_plain = self.data.get("control_matches")
        if not isinstance(control_as_plain, bool) or not control_as_plain:
            return None  # the control differs from the plain baseline, and where this request is is unknown
        return self.first_diff is None  # the control has the baseline's tokens: so does this request, or not

    @property
    def control_cell(self) -> str:
        """'same' (tokens as the control's), 'differs', then the control against the plain baseline where it
        differed: 'same (control @5)' is the schedule's numerics, not reuse; '—' when not recorded."""
        word = {True: "same", False: "differs", None: "—"}[self.control_matches]
        control = self.control
        if control is not None and control.differs:
            at = f" @{control.first_diff}" if control.first_diff is not None else ""
            return f"{word} (control{at})"
        return word

    @property
    def control_text(self) -> str:
        """The control at this request in words: 'the cache-off control gave the plain baseline's tokens',
        'as the cache-off control, which differs @5 too (the schedule's numerics)', ..."""
        control = self.control
        if control is not None and control.differs:
            at = f" @{control.first_diff}" if control.first_diff is not None else ""
            if self.control_matches is True:
                return f"as the cache-off control, which differs{at} too (the schedule's numerics)"
            return f"the cache-off control differs{at} as well, but not as this request does"
        if self.control_matches is False:
            return "the cache-off control gave the plain baseline's tokens"
        if self.control_matches is True:
            return "as the cache-off control"
        return "control not recorded"

    @property
    def is_finding(self) -> bool:
        return self.verdict != PASS

    @property
    def line(self) -> str:
        """'step 2 chat-511 (reuse, 496 cached, must reuse): FAIL @2 (decisive, gap 8.376 nats) · KV CORRUPT: …
        · the cache-off control gave the plain baseline's tokens'."""
        head = f"{self.place} ({self.role or '?'}, {self.hit_cell} cached, {self.expect_text})"
        verdict = f"{self.verdict} {self.diff_cell}".rstrip() + (f" ({self.cls})" if self.cls else "")
        verdict += f" {self.trial_mark}" if self.trial_mark else ""
        kv = f" · KV {self.kv_cell}" if self.kv is not None else ""
        why = f" — {'; '.join(self.reasons)}" if self.reasons else ""
        counts = self.counter_note
        return f"{head}: {verdict}{kv} · {self.control_text}{why}" + (f" · {counts}" if counts else "")
