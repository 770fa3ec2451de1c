"""A report's scenarios as the read model holds them: each scenario's steps and engine settings, its
schedule control (the baseline's cache-off run of the same steps) and, per arm, its verdict with its class
and one request per prompt submitted (verdict, first diff, hit counter, KV verdict, expectation, control).

Every key a scenario record may lack reads as absent ('—', '?', None), never as a pass or a zero. The
requests and the control are repro.readmodel.scenario_requests; the trials, repro.readmodel.scenario_trials."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from repro.judge.verdict import FAIL, KV_FINDINGS
from repro.readmodel.arms import floor_rel_text
from repro.readmodel.conditions import ArmConditions
from repro.readmodel.probes import ProbeKV, finding_text
from repro.readmodel.scenario_fields import EXPECT_TEXT, Judged, RunFacts, int_field
from repro.readmodel.scenario_load import arm_rates_text
from repro.readmodel.scenario_requests import ControlRequest, ScenarioControl, StepRequest
from repro.readmodel.scenario_trials import RequestRate, ScenarioTrials


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
        return int_field(self.data.get("index"))

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


@dataclass(frozen=True)
class ScenarioArm(Judged, RunFacts):
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
        """'FAIL', 'PASS (schedule-numerics)', 'FAIL · tenant-isolation failure on step 1 short-b'."""
        text = f"{self.verdict} ({self.cls})" if self.cls else self.verdict
        return f"{text} · {self.finding_text}" if self.finding_text else text

    @property
    def finding_text(self) -> str:
        """Its requests' findings that no fixture's FAIL excuses, by step and probe; '' for none."""
        return finding_text([(r.finding, f"step {r.data.get('step')} {r.data.get('probe')}") for r in self.requests
                             if r.finding])  # fmt: skip

    @property
    def mode(self) -> str:
        return str(self.data.get("mode") or "")

    @property
    def kv_verdict(self) -> str | None:
        return self.kv.verdict if self.kv is not None else None

    @property
    def kv_text(self) -> str:
        """'KV EXACT · floor rel 0 over 1248 cells', 'KV CORRUPT: blocks …', 'KV MISPLACED: blocks …'; '' when not
        audited."""
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
        rates = arm_rates_text(self.load) if self.load is not None else ""  # a load scenario: rates, not 192 hits
        facts += [rates or (f"hits {self.hits_text}" if self.requests else ""), self.trials_text]
        return " · ".join(f for f in facts if f)

    @property
    def load(self) -> Mapping[str, Any] | None:
        """A load scenario arm's rates per round (repro.run.load_scenario.rates); None for any other."""
        found = self.data.get("load")
        return found if isinstance(found, Mapping) else None

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
        """A FAIL, or a KV finding (CORRUPT, FOREIGN, MISPLACED; as for a probe)."""
        return self.verdict == FAIL or self.kv_verdict in KV_FINDINGS

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

    @property
    def load(self) -> Mapping[str, Any] | None:
        """A production-load scenario's generated plan and its two other runs (repro.plan.load); None for any other."""
        found = self.data.get("load")
        return found if isinstance(found, Mapping) else None

    def arm(self, name: str) -> ScenarioArm | None:
        return next((a for a in self.arms if a.name == name), None)

    @property
    def findings(self) -> tuple[ScenarioArm, ...]:
        """The arms whose run of this scenario is a finding: a FAIL, or a KV finding."""
        return tuple(a for a in self.arms if a.is_finding)
