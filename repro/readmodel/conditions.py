"""The conditions a verdict was measured under, as the read model holds them: an arm's GPU, who shared
it, LMCache's copy path per process, its trials and its re-run alone; the run's trials, lmcache-ops,
gpu-load and cpu-load. Every key is optional: a report without them shows none of this ("" or nothing)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from repro.judge.trials import STORE_PERSISTED, classify_confirmation, kv_found, kv_rate_counts, shared_runs_of
from repro.judge.verdict import ERROR, FAIL, KV_FINDINGS
from repro.judge.wording import NOT_RECORDED, seconds, show

# The classes the report's trials and confirmation carry (schemas/report.schema.json, repro.judge.trials).
EVERY_TRIAL, INTERMITTENT, CLEAN_RATE = "every trial", "intermittent", "none"
DETERMINISTIC, CONTENTION_DEPENDENT = "deterministic", "contention-dependent"
REPRODUCED_VARYING, NOT_REPRODUCED, UNCONFIRMED = "reproduced, varying", "not reproduced", "unconfirmed"
CONFIRMATION_MEANING = {
    DETERMINISTIC: "reproduced when re-run alone",
    REPRODUCED_VARYING: "wrong again when re-run alone, with other first diffs or KV blame",
    CONTENTION_DEPENDENT: "clean when re-run alone, so it needed the shared device",
    NOT_REPRODUCED: "not found again when re-run alone",
    UNCONFIRMED: "the re-run alone decided nothing",
}
SHARER_NOUNS = {"arm": ("arm", "arms"), "lmcache-server": ("MP server", "MP servers")}
LOAD_KINDS = ("gpu-load", "cpu-load")  # the load neighbours (repro.run.sharing): one each, "the gpu-load"
ARM_CONDITION_KEYS = ("gpu", "sharing", "copy_paths", "trials", "confirmation")


@dataclass(frozen=True)
class ConditionMark:
    """One mark beside a FAIL: its text, and whether it weakens the finding (intermittent, needed the shared device)."""

    text: str
    qualifies: bool


@dataclass(frozen=True)
class CopyPath:
    """The copy path one LMCache process took: compiled ops or the torch fallback."""

    process: str
    path: str
    source: str
    detail: str

    @property
    def text(self) -> str:
        """'engine compiled (wheel)'."""
        return f"{self.process or '?'} {self.path or NOT_RECORDED}" + (f" ({self.source})" if self.source else "")


@dataclass(frozen=True)
class TrialRate:
    """One probe of an arm across its trials: how many found each kind of finding, and the class. found: the
    finished trials that FAILed it or had a KV finding on it (counted from the trials' runs; None: not counted)."""

    data: Mapping[str, Any] = field(repr=False)
    found: int | None = None

    @property
    def probe(self) -> object:
        return self.data.get("probe")

    @property
    def cls(self) -> object:
        return self.data.get("class")

    @property
    def of(self) -> object:
        return self.data.get("of", "?")

    @property
    def errors(self) -> int:
        """The trials that ended in ERROR (0 when none, or an older report that did not count them)."""
        n = self.data.get("errors")
        return n if isinstance(n, int) and not isinstance(n, bool) else 0

    @property
    def finished(self) -> object:
        """The trials that finished: the rate's denominator ('of' less the ERRORs)."""
        return self.of - self.errors if isinstance(self.of, int) else self.of

    @property
    def hits(self) -> int:
        """The finished trials that found it: a FAIL or a KV finding (`found`; else the larger of the two counts)."""
        return self.found if self.found is not None else max(self.data.get("failed") or 0, kv_found(self.data))

    @property
    def cell(self) -> str:
        """'FAIL 3/5', 'FAIL 0/5, KV CORRUPT 2/5', 'FAIL 0/5, KV MISPLACED 2/5', 'FAIL 1/1 (1 ERROR)' (of the trials
        that finished; each KV finding counted apart, worst first); 'FAIL 1/3, KV FOREIGN 1/3, FAIL or KV finding 2/3'
        where the FAILs and the KV findings came in different trials."""
        n, failed = self.finished, self.data.get("failed", "?")
        text = f"FAIL {failed}/{n}" + "".join(f", KV {verdict} {k}/{n}" for verdict, k in kv_rate_counts(self.data))
        if isinstance(failed, int) and self.hits > max(failed, kv_found(self.data)):
            text += f", FAIL or KV finding {self.hits}/{n}"
        return text + (f" ({self.errors} ERROR)" if self.errors else "")

    @property
    def mark(self) -> ConditionMark | None:
        """'intermittent 3/5' or '5/5 trials' beside a FAIL ('1/1 finished trials, 1 ERROR': a trial that ended in
        ERROR is set apart, never counted as one that did not find it); None for a probe clean in every trial."""
        if self.cls == CLEAN_RATE:
            return None
        hits = self.hits
        intermittent = self.cls == INTERMITTENT
        n = self.finished
        text = f"{INTERMITTENT} {hits}/{n}" if intermittent else f"{hits}/{n} trials"
        if self.errors:
            text = (f"{INTERMITTENT} {hits}/{n} finished" if intermittent else f"{hits}/{n} finished trials") + (
                f", {self.errors} ERROR"
            )
        return ConditionMark(text, intermittent)


def run_probe_text(probe: Mapping[str, Any]) -> str:
    """One probe of one run (a trial, the re-run alone): 'FAIL @6,7', 'PASS', 'PASS · KV CORRUPT', 'PASS · KV FOREIGN'."""
    seen: list[int] = []
    for d in probe.get("first_diffs") or []:
        if d is not None and d not in seen:
            seen.append(d)
    text = str(probe.get("verdict")) + (" @" + ",".join(map(str, seen)) if seen else "")
    return text + (f" · KV {probe['kv']}" if probe.get("kv") in KV_FINDINGS else "")


def _has_finding(run: Mapping[str, Any], probe: object = None) -> bool:
    """The run FAILed a probe or had a KV finding on it (on this probe, where one is named)."""
    return any(
        isinstance(p, dict)
        and probe in (None, p.get("name"))
        and (p.get("verdict") == FAIL or p.get("kv") in KV_FINDINGS)
        for p in run.get("probes") or []
    )


@dataclass(frozen=True)
class ArmConditions:
    """What one arm was measured under (each text "" when the report does not record it)."""

    data: Mapping[str, Any] = field(repr=False)  # the arm's JSON: these keys sit on the arm itself

    @property
    def recorded(self) -> bool:
        """The arm records something of what it was measured under (older reports record none of it)."""
        return any(k in self.data for k in ARM_CONDITION_KEYS) or bool(self.copy_paths)

    @property
    def copy_paths(self) -> tuple[CopyPath, ...]:
        """The arm's copy_paths, else its lmcache.copy_paths (the same list); () for an arm without LMCache."""
        paths = self.data.get("copy_paths")
        if paths is None and isinstance(self.data.get("lmcache"), dict):
            paths = self.data["lmcache"].get("copy_paths")
        return tuple(
            CopyPath(*(str(p.get(k) or "") for k in ("process", "path", "source", "detail")))
            for p in paths or []
            if isinstance(p, dict)
        )

    @property
    def copy_path_text(self) -> str:
        """'engine compiled (wheel), MP server fallback'; '' when the arm records none."""
        return ", ".join(p.text for p in self.copy_paths)

    @property
    def gpu_text(self) -> str:
        """'NVIDIA H200 (GPU 0, compute capability 9.0)'; 'CPU' when the arm ran on none; '' when not recorded."""
        if "gpu" not in self.data:
            return ""
        gpu = self.data["gpu"]
        if not isinstance(gpu, dict):
            return "CPU"
        where = [f"GPU {gpu['visible']}" if gpu.get("visible") not in (None, "") else ""]
        where.append(f"compute capability {gpu['compute_capability']}" if gpu.get("compute_capability") else "")
        detail = ", ".join(w for w in where if w)
        return str(gpu.get("name") or "GPU") + (f" ({detail})" if detail else "")

    @property
    def _sharing(self) -> Mapping[str, Any] | None:
        sharing = self.data.get("sharing")
        return sharing if isinstance(sharing, dict) else None

    @property
    def sharing_text(self) -> str:
        """'shared GPU 0 with 3 arms (max overlap 40.1 s)' or 'alone on GPU 0'; '' when not recorded."""
        sharing = self._sharing
        if sharing is None:
            return ""
        resource = sharing.get("resource") or "?"
        others = [o for o in sharing.get("others") or [] if isinstance(o, dict) and not o.get("own")]
        if not sharing.get("shared") or not others:
            return f"alone on {resource}"
        longest = max((o.get("overlap_s") or 0 for o in others), default=0)
        return f"shared {resource} with {_count_sharers(others)} (max overlap {seconds(longest)})"

    @property
    def sharing_overlaps(self) -> tuple[str, ...]:
        """'arm native: 40.1 s', 'LMCache MP server of X: 61 s (the arm's own)'."""
        sharing = self._sharing
        if sharing is None:
            return ()
        return tuple(
            f"{o.get('process', '?')}: {seconds(o.get('overlap_s'))}" + (" (the arm's own)" if o.get("own") else "")
            for o in sharing.get("others") or []
            if isinstance(o, dict)
        )

    @property
    def sharing_window(self) -> str:
        """'3.1–64.3 s into the run'; '' when not recorded."""
        window = self._sharing.get("window_s") if self._sharing is not None else None
        if not isinstance(window, list) or len(window) != 2:
            return ""
        return f"{seconds(window[0], unit=False)}–{seconds(window[1])} into the run"

    @property
    def _trials(self) -> Mapping[str, Any] | None:
        trials = self.data.get("trials")
        return trials if isinstance(trials, dict) else None

    @property
    def rates(self) -> tuple[TrialRate, ...]:
        """Each probe's rate, with the finished trials that FAILed it or had a KV finding on it counted from the runs."""
        trials = self._trials or {}
        runs = [r for r in trials.get("runs") or [] if isinstance(r, dict) and r.get("verdict") != ERROR]
        rates = [r for r in trials.get("rates") or [] if isinstance(r, dict)]
        return tuple(TrialRate(r, sum(1 for run in runs if _has_finding(run, r.get("probe")))) for r in rates)

    def rate(self, probe: str) -> TrialRate | None:
        return next((r for r in self.rates if r.probe == probe), None)

    @property
    def trial_rate_text(self) -> str:
        """'chat-511 FAIL 3/5 intermittent; clean 5/5: fixture, chat-512'; '' when the arm ran once."""
        rates = self.rates
        found = [f"{r.probe} {r.cell} {r.cls}" for r in rates if r.cls != CLEAN_RATE]
        clean = [str(r.probe) for r in rates if r.cls == CLEAN_RATE]
        if clean:
            found.append(f"clean {rates[0].of}/{rates[0].of}: {', '.join(clean)}")
        return "; ".join(found)

    @property
    def trials_found(self) -> tuple[int, int] | None:
        """(trials that found something, trials): None without trials."""
        trials = self._trials
        if trials is None:
            return None
        runs = [r for r in trials.get("runs") or [] if isinstance(r, dict)]
        return sum(1 for r in runs if _has_finding(r)), int(trials.get("n") or len(runs))

    @property
    def errors(self) -> int:
        """The trials that ended in ERROR: they found nothing because they did not finish (0 without trials)."""
        trials = self._trials
        runs = (trials or {}).get("runs") or []
        return sum(1 for r in runs if isinstance(r, dict) and r.get("verdict") == ERROR)

    def trial_diffs_text(self, probe_name: str) -> str:
        """A probe across the trials: '#1 FAIL @6,7 (shared) · #2 PASS (shared) · #3 ERROR (timeout)'."""
        parts = []
        for run in (self._trials.get("runs") or []) if self._trials else []:
            probe = next((p for p in run.get("probes") or [] if p.get("name") == probe_name), None)
            text = run_probe_text(probe) if probe else str(run.get("verdict"))
            if run.get("error"):
                text += f" ({run['error'].get('kind')})"
            parts.append(f"#{run.get('trial')} {text}" + (" (shared)" if run.get("shared") else ""))
        return " · ".join(parts)

    @property
    def _confirmation(self) -> Mapping[str, Any] | None:
        conf = self.data.get("confirmation")
        return conf if isinstance(conf, dict) else None

    @property
    def has_confirmation(self) -> bool:
        return self._confirmation is not None

    @property
    def confirmation_class(self) -> str | None:
        """The class the re-run alone gave the arm's finding; None when it did not run (or decided no class)."""
        conf = self._confirmation
        if conf is None or conf.get("status") != "ran":
            return None
        return self._reclassed[0] if self._reclassed else conf.get("class")

    @cached_property
    def _reclassed(self) -> tuple[str, str] | None:
        """(class, reason) the judge (repro.judge.trials.classify_confirmation) gives a re-run alone that the report
        records as unconfirmed: a report written before a KV finding counted in a confirmation calls a run alone whose
        tokens were INCONCLUSIVE unconfirmed, whatever its KV audit found. None: the recorded class stands (any other
        class, or unconfirmed still)."""
        conf = self._confirmation
        alone = conf.get("run") if conf is not None and conf.get("class") == UNCONFIRMED else None
        if conf is None or conf.get("status") != "ran" or not isinstance(alone, dict):
            return None
        try:
            cls, reason = classify_confirmation(shared_runs_of(dict(self.data)), alone)
        except (KeyError, TypeError, AttributeError):  # runs too old or too damaged to class again
            return None
        recorded = str(conf.get("reason") or "")
        cut = recorded.find(f"; {STORE_PERSISTED}")  # the store's note stays: it is not the judge's
        return None if cls == UNCONFIRMED else (cls, reason + (recorded[cut:] if cut >= 0 else ""))

    @property
    def confirmation_text(self) -> str:
        """'re-run alone: PASS → contention-dependent', 're-run alone: INCONCLUSIVE → unconfirmed, not independent' (its
        store persisted), 're-run alone: INCONCLUSIVE → deterministic (the report records unconfirmed: an older kit's
        class)', 're-run alone: skipped (--no-confirm)'; '' without one."""
        conf = self._confirmation
        if conf is None:
            return ""
        if conf.get("status") != "ran":
            return f"re-run alone: {conf.get('status')}" + (f" ({conf['why']})" if conf.get("why") else "")
        verdict = (conf.get("run") or {}).get("verdict") or "no result"
        text = f"re-run alone: {verdict} → {self.confirmation_class or 'unclassed'}"
        text += f" (the report records {conf.get('class')}: an older kit's class)" if self._reclassed else ""
        return text + (", not independent" if self.confirmation_independent is False else "")

    @property
    def confirmation_independent(self) -> bool | None:
        """False when the re-run alone could read what the shared run stored (its connector store persisted between
        runs; the reason says which); True when every run had empty connector state; None when not recorded."""
        conf = self._confirmation
        value = conf.get("independent") if conf is not None else None
        return value if isinstance(value, bool) else None

    @property
    def confirmation_reason(self) -> str:
        """Why the arm was re-run alone and what that run said: 'ran because shared GPU 0 with …; alone: PASS 4/4'."""
        conf = self._confirmation
        if conf is None or conf.get("status") != "ran":
            return ""
        reason = self._reclassed[1] if self._reclassed else str(conf.get("reason") or "")
        parts = [f"ran because {conf['why']}" if conf.get("why") else "", reason]
        return "; ".join(p for p in parts if p)

    @property
    def alone_probes(self) -> tuple[tuple[str, str], ...]:
        """Each probe of the re-run alone: (name, 'FAIL @6,7')."""
        conf = self._confirmation or {}
        alone = conf.get("run") if isinstance(conf.get("run"), dict) else {}
        return tuple((str(p.get("name")), run_probe_text(p)) for p in alone.get("probes") or [])

    def alone_cell(self, probe: str) -> str:
        """The probe in the re-run alone ('FAIL @6,7'), else the re-run's status; '—' without one."""
        conf = self._confirmation
        if conf is None:
            return "—"
        run = conf.get("run") if isinstance(conf.get("run"), dict) else {}
        alone = next((p for p in run.get("probes") or [] if p.get("name") == probe), None)
        return run_probe_text(alone) if alone else str(conf.get("status"))

    @property
    def finding_class_text(self) -> str:
        """'intermittent: findings in 3/5 trials', 'findings in 5/5 trials', 'contention-dependent: clean when
        re-run alone, …'; '' when neither trials nor a re-run alone say anything."""
        parts = []
        found = self.trials_found
        if found and found[0]:
            k, n = found
            e = self.errors  # set apart: a trial that ended in ERROR did not finish
            done = f"findings in {k}/{n - e} finished trials, {e} ERROR" if e else f"findings in {k}/{n} trials"
            parts.append(f"{INTERMITTENT}: {done}" if k < n - e else done)
        cls = self.confirmation_class
        if cls:
            parts.append(f"{cls}: {CONFIRMATION_MEANING.get(cls, 'see the re-run alone')}")
        return " · ".join(parts)

    @property
    def qualified(self) -> bool:
        """The finding did not show every time, or not alone: a claim of it must carry its class."""
        found = self.trials_found
        # of the trials that finished: a trial that ended in ERROR is set apart, not a trial that found nothing
        intermittent = found is not None and 0 < found[0] < found[1] - self.errors
        cls = self.confirmation_class
        weak = cls in (REPRODUCED_VARYING, CONTENTION_DEPENDENT, NOT_REPRODUCED, UNCONFIRMED)
        return intermittent or weak or self.confirmation_independent is False

    def marks(self, probe: str) -> tuple[ConditionMark, ...]:
        """The marks beside a probe's finding: 'intermittent 3/5', '5/5 trials', 'contention-dependent'."""
        marks = []
        rate = self.rate(probe)
        if rate is not None and rate.mark is not None:
            marks.append(rate.mark)
        cls = self.confirmation_class
        if cls:
            marks.append(ConditionMark(cls, cls != DETERMINISTIC))
        if cls and self.confirmation_independent is False:  # the run alone could read what the shared run stored
            marks.append(ConditionMark("not independent", True))
        return tuple(marks)


def _count_sharers(others: list[dict]) -> str:
    """'3 arms', '2 arms, 1 MP server and the gpu-load', '4 arms and the cpu-load'."""
    counts: dict[str, int] = {}
    order = {"arm": 0, "lmcache-server": 1, "gpu-load": 2, "cpu-load": 3}
    for o in sorted(others, key=lambda o: order.get(str(o.get("kind")), 4)):
        counts[str(o.get("kind"))] = counts.get(str(o.get("kind")), 0) + 1
    parts = [
        f"the {kind}" if kind in LOAD_KINDS else f"{n} {SHARER_NOUNS.get(kind, (kind, kind))[n != 1]}"
        for kind, n in counts.items()
    ]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + f" and {parts[-1]}"


@dataclass(frozen=True)
class RunConditions:
    """The run's conditions: trials, re-run alone, the --lmcache-ops choice and what ran, the gpu-load and
    the cpu-load."""

    conditions: Mapping[str, Any] | None = field(repr=False)
    lmcache_ops: Mapping[str, Any] | None = field(repr=False)  # provenance.lmcache_ops

    @property
    def lmcache_ops_text(self) -> str:
        """'fallback (path fallback, LMCache 0.5.4, torch 2.11.0+cu130, sm 9.0; forced: …)'; '' when not recorded."""
        mode = (self.conditions or {}).get("lmcache_ops")
        ops = self.lmcache_ops
        if mode is None and not (isinstance(ops, dict) and ops):
            return ""
        if not isinstance(ops, dict) or not ops:
            return str(mode)
        labels = (("path", "path "), ("source", ""), ("lmcache", "LMCache "), ("torch", "torch "), ("arch", "sm "))
        parts = [f"{label}{ops[key]}" for key, label in labels if ops.get(key) not in (None, "")]
        detail = ops.get("detail")
        text = ", ".join(parts) + (f"; {detail}" if isinstance(detail, str) and detail else "")
        return f"{mode or NOT_RECORDED}" + (f" ({text})" if text else "")

    @property
    def gpu_load_text(self) -> str:
        """'on GPU 0: NVIDIA H200 float16 n 8192, 1234 iterations, 610 TFLOPS; 3.1–180.2 s into the run'; 'none'."""
        load = (self.conditions or {}).get("gpu_load")
        if not isinstance(load, dict):
            return "none"
        found = [d for d in load.get("devices") or [] if isinstance(d, dict)]
        devices = [_load_device_text(d, named=len(found) > 1) for d in found]
        gpus = ", ".join(str(g) for g in load.get("gpus") or []) or "?"
        span = f"{seconds(load.get('started_s'), unit=False)}–{seconds(load.get('ended_s'))} into the run"
        failure = load.get("failure") if isinstance(load.get("failure"), dict) else None
        text = f"on GPU {gpus}: " + ("; ".join(devices) or "no device reported") + f"; {span}"
        return text + (f"; {failure.get('kind')}: {failure.get('detail')}" if failure else "")

    @property
    def cpu_load_text(self) -> str:
        """'on cores 0, 1: 2 workers at nice 0, 150.2 s CPU, 61.3 s waiting on a run queue; 3.1–80.2 s into the
        run'; 'none'."""
        load = (self.conditions or {}).get("cpu_load")
        if not isinstance(load, dict):
            return "none"
        workers = [w for w in load.get("workers") or [] if isinstance(w, dict)]
        nice = sorted({w.get("nice") for w in workers if isinstance(w.get("nice"), int)})
        cores = ", ".join(str(c) for c in load.get("cores") or []) or "?"
        figures = f"{len(workers)} worker{'s' if len(workers) != 1 else ''}"
        figures += f" at nice {', '.join(str(n) for n in nice)}" if nice else ""
        for key, what in (("cpu_s", "CPU"), ("wait_s", "waiting on a run queue")):
            got = [w[key] for w in workers if isinstance(w.get(key), (int, float))]
            figures += f", {sum(got):.1f} s {what}" if got else ""
        span = f"{seconds(load.get('started_s'), unit=False)}–{seconds(load.get('ended_s'))} into the run"
        text = f"on cores {cores}: {figures if workers else 'no worker reported'}; {span}"
        left = load.get("left_running")
        if isinstance(left, list) and left:
            text += f"; {len(left)} of its processes still running after its stop"
        failure = load.get("failure") if isinstance(load.get("failure"), dict) else None
        return text + (f"; {failure.get('kind')}: {failure.get('detail')}" if failure else "")

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        """(name, text): trials, re-run alone, lmcache-ops, gpu-load, cpu-load (reports that record it); ()
        when not recorded."""
        ops = self.lmcache_ops_text
        if self.conditions is None and not ops:
            return ()
        conditions = self.conditions or {}
        pairs = [("trials", show(conditions.get("trials", NOT_RECORDED)))]
        confirm = conditions.get("confirm")
        pairs.append(("re-run alone", NOT_RECORDED if confirm is None else "on" if confirm else "off (--no-confirm)"))
        pairs.append(("lmcache-ops", ops or NOT_RECORDED))
        pairs.append(("gpu-load", self.gpu_load_text if "gpu_load" in conditions else NOT_RECORDED))
        if "cpu_load" in conditions:  # reports before --cpu-load say nothing of it
            pairs.append(("cpu-load", self.cpu_load_text))
        return tuple(pairs)

    @property
    def line(self) -> str:
        """'conditions: trials 5 · re-run alone on · lmcache-ops auto (…) · gpu-load none'; '' when not recorded."""
        return "conditions: " + " · ".join(f"{k} {v}" for k, v in self.pairs) if self.pairs else ""


def _load_device_text(device: Mapping[str, Any], named: bool) -> str:
    """'NVIDIA H200 float16 n 8192, 1234 iterations, 610 TFLOPS' ('GPU 1: …' when named, for several GPUs)."""
    where = f"GPU {device['gpu']}: " if named and device.get("gpu") not in (None, "") else ""
    n, iterations = (device.get(k) for k in ("n", "iterations"))
    figures = [f"n {'?' if n is None else n}", f"{'?' if iterations is None else iterations} iterations"]
    if isinstance(device.get("tflops"), (int, float)):
        figures.append(f"{device['tflops']:g} TFLOPS")
    return f"{where}{device.get('name') or '?'} {device.get('dtype') or '?'} " + ", ".join(figures)
