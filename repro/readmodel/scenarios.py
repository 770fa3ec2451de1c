"""A report's scenarios as the read model holds them: each scenario's steps and engine settings, its
schedule control (the baseline's cache-off run of the same steps) and, per arm, its verdict with its class
and one request per prompt submitted (verdict, first diff, hit counter, KV verdict, expectation, control).

Every key a scenario record may lack reads as absent ('—', '?', None), never as a pass or a zero."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from repro.judge.verdict import CORRUPT, ERROR, FAIL, PASS
from repro.judge.wording import NOT_RECORDED, seconds
from repro.readmodel.arms import floor_rel_text
from repro.readmodel.conditions import ArmConditions
from repro.readmodel.probes import KVCells, ProbeKV
from repro.readmodel.requests import Divergence, Request

# What a step's expect means, as a reader needs it (the producer's words are "miss", "reuse" or null).
EXPECT_TEXT = {"miss": "must miss", "reuse": "must reuse", None: "hit or miss"}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def settings_text(scenario: Mapping[str, Any]) -> str:
    """'engine kv_cache_tokens 1200, max_num_seqs 1 · LMCache max_local_cpu_size 0.002 · MP server
    cpu_pool_gb 0.002': the settings the scenario ran its engines with; '' when it names none."""
    parts = []
    for key, label in (("engine", "engine"), ("lmcache", "LMCache"), ("mp_server", "MP server")):
        found = scenario.get(key)
        if isinstance(found, Mapping) and found:
            parts.append(f"{label} " + ", ".join(f"{k} {_value(v)}" for k, v in sorted(found.items())))
    return " · ".join(parts)


def _value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Step:
    """One step: the probes it submits, at once (together) or one after another, and what it expects."""

    data: Mapping[str, Any] = field(repr=False)

    @property
    def index(self) -> int | None:
        return _int(self.data.get("index"))

    @property
    def submit(self) -> tuple[str, ...]:
        return tuple(str(p) for p in self.data.get("submit") or [])

    @property
    def together(self) -> bool:
        return self.data.get("together") is True

    @property
    def expect(self) -> str | None:
        found = self.data.get("expect")
        return None if found is None else str(found)

    @property
    def wait_s(self) -> float:
        """Seconds the engine sat idle before the step (0 when the report has none)."""
        found = self.data.get("wait_s")
        return float(found) if isinstance(found, (int, float)) and not isinstance(found, bool) else 0.0

    @property
    def text(self) -> str:
        """'chat-511, chat-512, chat-513 in flight together · must reuse'; 'chat-512 · hit or miss';
        'after 5 s idle: fixture · hit or miss'."""
        probes = ", ".join(self.submit) or "nothing"
        how = " in flight together" if self.together and len(self.submit) > 1 else ""
        idle = f"after {self.wait_s:g} s idle: " if self.wait_s else ""
        return f"{idle}{probes}{how} · {EXPECT_TEXT.get(self.expect, f'expect {self.expect}')}"


class _Placed:
    """Where a request of a scenario ran: its step and probe (a mixin over a record's data)."""

    data: Mapping[str, Any]

    @property
    def step(self) -> int | None:
        return _int(self.data.get("step"))

    @property
    def probe(self) -> str:
        return str(self.data.get("probe", "?"))

    @property
    def place(self) -> str:
        """'step 2 chat-511'."""
        return f"step {'?' if self.step is None else self.step} {self.probe}"


class _Judged:
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


class _RunFacts:
    """What one child's run of a scenario recorded besides its requests: preemptions, wall time, log."""

    data: Mapping[str, Any]

    @property
    def preemptions(self) -> int | None:
        return _int(self.data.get("preemptions"))

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


@dataclass(frozen=True)
class ControlRequest(_Placed):
    """One request of the schedule control: the baseline's cache-off run of the scenario's steps, against
    the plain cold baseline of its probe (a difference is the schedule's own numerics, not reuse)."""

    data: Mapping[str, Any] = field(repr=False)

    @property
    def token_ids(self) -> list[int] | None:
        found = self.data.get("token_ids")
        return found if isinstance(found, list) else None

    @property
    def cached_tokens(self) -> int | None:
        return _int(self.data.get("cached_tokens"))

    @property
    def matches_plain(self) -> bool | None:
        found = self.data.get("matches_plain")
        return found if isinstance(found, bool) else None

    @property
    def first_diff(self) -> int | None:
        return _int(self.data.get("first_diff"))

    @property
    def preemptions(self) -> int | None:
        return _int(self.data.get("preemptions"))

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
class ScenarioControl(_RunFacts):
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
class RequestRate(_Placed):
    """One request of a (scenario, arm) across its trials (one that was not a PASS, or had CORRUPT KV, in
    some trial): its verdict, first diff and KV in each trial, how many FAILed and had CORRUPT KV, the class."""

    data: Mapping[str, Any] = field(repr=False)

    @property
    def key(self) -> tuple:
        return self.data.get("step"), self.data.get("probe"), _int(self.data.get("nth")) or 0

    @property
    def of(self) -> int | None:
        return _int(self.data.get("of"))

    def _each(self, key: str) -> list:
        found = self.data.get(key)
        return found if isinstance(found, list) else []

    def count(self, verdict: str) -> int:
        """The trials whose verdict of this request was this one."""
        return sum(1 for v in self._each("verdicts") if v == verdict)

    @property
    def runs_text(self) -> str:
        """'#1 FAIL @0 KV CORRUPT · #2 PASS · #3 not run' (not run: that trial recorded no such request)."""
        verdicts, diffs, kvs = self._each("verdicts"), self._each("first_diffs"), self._each("kv")
        parts = []
        for i, verdict in enumerate(verdicts):
            diff = diffs[i] if i < len(diffs) else None
            kv = kvs[i] if i < len(kvs) else None
            text = "not run" if verdict is None else str(verdict) + (f" @{diff}" if diff is not None else "")
            parts.append(f"#{i + 1} {text}" + (" KV CORRUPT" if kv == CORRUPT else ""))
        return " · ".join(parts)

    @property
    def cls(self) -> str:
        """'every trial', 'intermittent' or 'none', over the trials that ran this request: one that did not (it
        ended in ERROR) is set apart, never counted as a trial that did not find it. Derived from the per-trial
        lists, so a report written before trials were set apart reads the same; the stored class otherwise."""
        verdicts, kvs = self._each("verdicts"), self._each("kv")
        ran = [i for i, v in enumerate(verdicts) if v is not None]
        if not ran:
            return str(self.data.get("class") or "")
        found = sum(1 for i in ran if verdicts[i] == FAIL or (i < len(kvs) and kvs[i] == CORRUPT))
        return "none" if found == 0 else "every trial" if found == len(ran) else "intermittent"

    @property
    def line(self) -> str:
        """'step 2 chat-512: #1 PASS · #2 FAIL @3 (intermittent)'."""
        cls = self.cls
        return f"{self.place}: {self.runs_text}" + (f" ({cls})" if cls and cls != "none" else "")


@dataclass(frozen=True)
class ScenarioTrials:
    """A (scenario, arm)'s trials (--trials N > 1): every run reduced to its verdicts, and the rates of the
    requests that were not a PASS in some trial (repro.judge.trials.scenario_trial_rates)."""

    data: Mapping[str, Any] = field(repr=False)
    rates: tuple[RequestRate, ...]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScenarioTrials:
        found = data.get("rates")
        return cls(data, tuple(RequestRate(r) for r in found if isinstance(r, dict)) if isinstance(found, list) else ())

    @property
    def runs(self) -> tuple[Mapping[str, Any], ...]:
        found = self.data.get("runs")
        return tuple(r for r in found if isinstance(r, dict)) if isinstance(found, list) else ()

    @property
    def n(self) -> int:
        return _int(self.data.get("n")) or len(self.runs)

    @property
    def found(self) -> int:
        """The trials that found something: a request FAIL, or CORRUPT KV."""
        return sum(1 for run in self.runs if _run_found(run))

    @property
    def errors(self) -> int:
        """The trials that ended in ERROR (a timeout, a crash): they found nothing because they did not finish."""
        return sum(1 for run in self.runs if run.get("verdict") == ERROR)

    @property
    def text(self) -> str:
        """'found in 2 of 2 trials (FAIL, FAIL)', 'intermittent: found in 1 of 3 trials (FAIL, PASS, PASS)',
        'found in 1 of the 1 of 2 trials that finished; 1 ERROR (FAIL, ERROR)' (a trial that ended in ERROR is set
        apart, never counted as one that did not find it), 'no finding in 2 trials (PASS, PASS)',
        'no finding in the 1 of 2 trials that finished; 1 ERROR (PASS, ERROR)', 'no trial finished: 2 of 2 ERROR
        (ERROR, ERROR)'."""
        verdicts = ", ".join(str(run.get("verdict") or "?") for run in self.runs)
        k, n, e = self.found, self.n, self.errors
        if k == 0 and e >= n:
            return f"no trial finished: {e} of {n} ERROR ({verdicts})"
        if k == 0 and e:
            return f"no finding in the {n - e} of {n} trials that finished; {e} ERROR ({verdicts})"
        if k == 0:
            return f"no finding in {n} trials ({verdicts})"
        if e:
            done = f"found in {k} of the {n - e} of {n} trials that finished; {e} ERROR ({verdicts})"
            return ("intermittent: " if k < n - e else "") + done
        return ("intermittent: " if k < n else "") + f"found in {k} of {n} trials ({verdicts})"

    def rate(self, key: tuple) -> RequestRate | None:
        return next((r for r in self.rates if r.key == key), None)


def _run_found(run: Mapping[str, Any]) -> bool:
    if run.get("kv") == CORRUPT:
        return True
    requests = run.get("requests")
    return any(
        isinstance(r, dict) and (r.get("verdict") == FAIL or r.get("kv") == CORRUPT)
        for r in (requests if isinstance(requests, list) else [])
    )


@dataclass(frozen=True)
class StepRequest(KVCells, _Placed, _Judged, Request):
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
        """'in 2 of 2 trials, KV CORRUPT in 2 of 2': how many trials gave this request its verdict (and its
        CORRUPT KV); '' with one trial."""
        rate = self.rate
        if rate is None or rate.of is None:
            return ""
        mark = f"in {rate.count(self.verdict)} of {rate.of} trials"
        if self.kv_verdict == CORRUPT:
            mark += f", KV CORRUPT in {_int(rate.data.get('kv_corrupt')) or 0} of {rate.of}"
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
        return _int(self.data.get("preemptions"))

    @property
    def connector_hit_tokens(self) -> int | None:
        """The connector's own count of this request's hit tokens (LMCache's `num_lmcache_cached_tokens` in its
        kv_transfer_params); None: not reported (native, LMCacheMPConnector)."""
        found = self.data.get("kv_transfer_params")
        return _int(found.get("num_lmcache_cached_tokens")) if isinstance(found, dict) else None

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
        repro.judge.verdict decides with); it is used only where a request's or the control's tokens are missing."""
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


@dataclass(frozen=True)
class ScenarioArm(_Judged, _RunFacts):
    """One arm's run of a scenario: its verdict, the class of its divergences, preemptions and requests."""

    data: Mapping[str, Any] = field(repr=False)
    title: str
    requests: tuple[StepRequest, ...]
    kv: ProbeKV | None = None  # the arm's KV verdict over the scenario's reuses; None: not audited
    trials: ScenarioTrials | None = None  # None: it ran once

    @classmethod
    def from_json(
        cls, data: Mapping[str, Any], block_size: int | None, title: str | None, control: ScenarioControl | None
    ) -> ScenarioArm:
        found = data.get("requests")
        items = [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []
        trials = ScenarioTrials.from_json(data["trials"]) if isinstance(data.get("trials"), dict) else None
        seen: dict[tuple, int] = {}
        requests = []
        for r in items:  # the n-th request of a probe in a step is the control's n-th there
            key = (r.get("step"), r.get("probe"))
            nth = seen[key] = seen.get(key, -1) + 1
            rate = trials.rate((*key, nth)) if trials is not None else None
            requests.append(StepRequest.from_scenario(r, block_size, _control_at(control, key, nth), rate))
        kv = data.get("kv")
        kv_verdict = ProbeKV(kv, block_size) if isinstance(kv, dict) else None
        return cls(data, title or str(data.get("arm", "?")), tuple(requests), kv_verdict, trials)

    @property
    def trials_text(self) -> str:
        """'found in 2 of 2 trials (FAIL, FAIL)'; '' when it ran once."""
        return self.trials.text if self.trials is not None else ""

    @property
    def later_rates(self) -> tuple[RequestRate, ...]:
        """The trials' rates of requests its own run passed (a finding only a later trial made is a finding
        all the same); the requests its own run did not pass carry their rate (StepRequest.trial_mark)."""
        if self.trials is None:
            return ()
        own = {r.rate.key for r in self.failing if r.rate is not None}
        return tuple(r for r in self.trials.rates if r.key not in own)

    @property
    def name(self) -> str:
        return str(self.data.get("arm", "?"))

    @property
    def verdict_text(self) -> str:
        """'FAIL', 'PASS (schedule-numerics)'."""
        return f"{self.verdict} ({self.cls})" if self.cls else self.verdict

    @property
    def mode(self) -> str:
        return str(self.data.get("mode") or "")

    @property
    def kv_verdict(self) -> str | None:
        return self.kv.verdict if self.kv is not None else None

    @property
    def kv_text(self) -> str:
        """'KV EXACT · floor rel 0 over 1248 cells', 'KV CORRUPT: blocks …'; '' when not audited."""
        if self.kv is None:
            return ""
        floor = self.kv.data.get("floor")
        return f"KV {self.kv.cell}" + (f" · {floor_rel_text(floor)}" if isinstance(floor, Mapping) else "")

    @property
    def copy_path_text(self) -> str:
        """'copy path: engine compiled (wheel), MP server compiled (wheel)': this run's own LMCache processes;
        '' for an arm without LMCache and in reports made before scenario runs recorded it."""
        text = ArmConditions({"copy_paths": self.data.get("copy_paths") or []}).copy_path_text
        return f"copy path: {text}" if text else ""

    @property
    def hits_text(self) -> str:
        """'0 0 0 992': each request's hit counter in the order they ran ('?': not reported)."""
        return " ".join(r.hit_cell for r in self.requests)

    @property
    def summary_line(self) -> str:
        """'PASS · KV EXACT · preemptions 0 · hits 0 0 0 992': the verdict and the facts a summary line shows
        (then, with trials, 'found in 2 of 2 trials (FAIL, FAIL)')."""
        facts = [self.verdict, self.cls, f"KV {self.kv_verdict}" if self.kv is not None else ""]
        facts += [f"preemptions {self.preemptions}" if self.preemptions is not None else ""]
        facts += [f"hits {self.hits_text}" if self.requests else "", self.trials_text]
        return " · ".join(f for f in facts if f)

    @property
    def error(self) -> Mapping[str, Any] | None:
        found = self.data.get("error")
        return found if isinstance(found, Mapping) and found else None

    @property
    def error_text(self) -> str:
        """'crash: the engine child exited 1 …'; '' without an error."""
        err = self.error
        if err is None:
            return ""
        return f"{err.get('kind', '?')}: {err.get('message') or err.get('detail') or ''}".rstrip(": ")

    @property
    def log_tail(self) -> str:
        return str((self.error or {}).get("log_tail") or "")

    @property
    def is_finding(self) -> bool:
        """A FAIL, or a CORRUPT KV verdict (as for a probe)."""
        return self.verdict == FAIL or self.kv_verdict == CORRUPT

    @property
    def failing(self) -> tuple[StepRequest, ...]:
        """The requests whose own verdict is not PASS (FAIL, INCONCLUSIVE), in the order they ran."""
        return tuple(r for r in self.requests if r.is_finding)


def _control_at(control: ScenarioControl | None, key: tuple, nth: int) -> ControlRequest | None:
    if control is None:
        return None
    same = [c for c in control.requests if (c.data.get("step"), c.data.get("probe")) == key]
    return same[nth] if nth < len(same) else None


@dataclass(frozen=True)
class Scenario:
    """One scenario of a report: its steps and settings, its schedule control and every arm's run of it."""

    data: Mapping[str, Any] = field(repr=False)
    steps: tuple[Step, ...]
    control: ScenarioControl | None
    arms: tuple[ScenarioArm, ...]

    @classmethod
    def from_json(cls, data: Mapping[str, Any], block_size: int | None, titles: Mapping[str, str]) -> Scenario:
        steps = tuple(Step(s) for s in data.get("steps") or [] if isinstance(s, dict))
        found = data.get("control")
        control = ScenarioControl.from_json(found) if isinstance(found, dict) else None
        arms = tuple(
            ScenarioArm.from_json(a, block_size, titles.get(str(a.get("arm"))), control)
            for a in data.get("arms") or []
            if isinstance(a, dict)
        )
        return cls(data, steps, control, arms)

    @property
    def name(self) -> str:
        return str(self.data.get("name", "?"))

    @property
    def description(self) -> str:
        return str(self.data.get("description") or "")

    @property
    def settings_text(self) -> str:
        return settings_text(self.data)

    @property
    def control_text(self) -> str:
        return self.control.text if self.control is not None else "schedule control: not recorded"

    def arm(self, name: str) -> ScenarioArm | None:
        return next((a for a in self.arms if a.name == name), None)

    @property
    def findings(self) -> tuple[ScenarioArm, ...]:
        """The arms whose run of this scenario is a FAIL."""
        return tuple(a for a in self.arms if a.is_finding)
