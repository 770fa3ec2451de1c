"""A (scenario, arm)'s trials as the read model holds them (--trials N > 1): every run reduced to its verdicts,
and the rates of the requests that were not a PASS in some trial, each with its class across the trials.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from repro.judge.trials import KV_RATE_FIELDS
from repro.judge.verdict import ERROR, FAIL, KV_FINDINGS
from repro.readmodel.scenario_fields import Placed, int_field


@dataclass(frozen=True)
class RequestRate(Placed):
    """One request of a (scenario, arm) across its trials (one that was not a PASS, or had a KV finding, in
    some trial): its verdict, first diff and KV in each trial, how many FAILed and had each KV finding, the class."""

    data: Mapping[str, Any] = field(repr=False)

    @property
    def key(self) -> tuple:
        return self.data.get("step"), self.data.get("probe"), int_field(self.data.get("nth")) or 0

    @property
    def of(self) -> int | None:
        return int_field(self.data.get("of"))

    def _each(self, key: str) -> list:
        found = self.data.get(key)
        return found if isinstance(found, list) else []

    def count(self, verdict: str) -> int:
        """The trials whose verdict of this request was this one."""
        return sum(1 for v in self._each("verdicts") if v == verdict)

    def kv_count(self, verdict: str) -> int:
        """The trials whose KV verdict of this request was this finding: the rate's own count (kv_corrupt,
        kv_foreign, kv_misplaced), else counted from the per-trial KV verdicts."""
        stored = int_field(self.data.get(KV_RATE_FIELDS.get(verdict, "")))
        return stored if stored is not None else sum(1 for v in self._each("kv") if v == verdict)

    @property
    def runs_text(self) -> str:
        """'#1 FAIL @0 KV CORRUPT · #2 PASS KV MISPLACED · #3 not run' (not run: that trial recorded no such request)."""
        verdicts, diffs, kvs = self._each("verdicts"), self._each("first_diffs"), self._each("kv")
        parts = []
        for i, verdict in enumerate(verdicts):
            diff = diffs[i] if i < len(diffs) else None
            kv = kvs[i] if i < len(kvs) else None
            text = "not run" if verdict is None else str(verdict) + (f" @{diff}" if diff is not None else "")
            parts.append(f"#{i + 1} {text}" + (f" KV {kv}" if kv in KV_FINDINGS else ""))
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
        found = sum(1 for i in ran if verdicts[i] == FAIL or (i < len(kvs) and kvs[i] in KV_FINDINGS))
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
        return int_field(self.data.get("n")) or len(self.runs)

    @property
    def found(self) -> int:
        """The trials that found something: a request FAIL, or a KV finding."""
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
    if run.get("kv") in KV_FINDINGS:
        return True
    requests = run.get("requests")
    return any(
        isinstance(r, dict) and (r.get("verdict") == FAIL or r.get("kv") in KV_FINDINGS)
        for r in (requests if isinstance(requests, list) else [])
    )
