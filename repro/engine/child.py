"""Child side: run one arm (one engine, every probe) and write one JSON result.

This is the only kit module, with repro/connectors/ and its front ends (repro.engine.frontend: vLLM's
LLM, or a bare AsyncLLM under --frontend async), that imports vllm, torch or lmcache. The
parent (repro.run.runner) starts it as `python -m repro.engine JOB.json` with a repro.contract.Job;
the child writes one repro.contract.ArmResult to the job's output path and exits. Everything it prints goes to the arm log the parent captured at
the file-descriptor level.
"""

from __future__ import annotations

import time

_T_PROCESS = time.monotonic()  # before any heavy import: engine start counts from here

import json
import os
import platform
import sys
import traceback
from dataclasses import replace

from repro.contract import (
    EXIT_OK,
    EXIT_RAISED,
    PREFLIGHT_GATE_ENV,
    PROBES_FILE_KEY,
    ArmResult,
    ChildError,
    Job,
    ProbeJob,
    ProbeResult,
    RequestResult,
    ScenarioResult,
    StepRequest,
    progress_path,
)
from repro.engine.frontend import build_frontend, frontend_from_env, frontend_name, vllm_config_of
from repro.engine.preflight import batch_invariant_requested
from repro.judge.verdict import batch_invariance_state
from repro.record.atomic import dumps_json, write_bytes_atomic
from repro.record.provenance import package_version


class PreflightStopped(RuntimeError):
    """The first arm's preflight failed: this arm imported vLLM but built no engine."""


def wait_for_preflight(job: Job) -> float:
    """An arm started during the first arm's preflight imports vLLM meanwhile and waits here, before
    it builds an engine, for the parent's word: "go", or "stop" (then PreflightStopped: the run ends
    with the preflight's exit 2 and no engine was ever built). Returns the seconds it waited, which
    are not engine start time."""
    gate = os.environ.get(PREFLIGHT_GATE_ENV)
    if not gate:
        return 0.0
    t0 = time.monotonic()
    report_stage(job, "waiting for the preflight")
    while True:
        try:
            with open(gate, encoding="utf-8") as fh:
                word = fh.read().strip()
        except FileNotFoundError:
            time.sleep(0.1)
            continue
        if word == "go":
            return time.monotonic() - t0
        raise PreflightStopped(f"the first arm's preflight failed ({word!r}): no engine built")


class ProbesStopped(RuntimeError):
    """A native-matched arm's connector arm gave nothing to match, or the run is stopping."""


def wait_for_probes(job: Job) -> Job:
    """native-matched: the engine is built while the connector arm runs; its probes (the prefix
    lengths that arm reused) arrive in job.probes_file when that arm is done (written atomically
    by the parent). The wait is after engine start and before generation, so it counts in neither."""
    report_stage(job, "waiting for the connector arm's reuse lengths", preflight_ok=True)
    while True:
        try:
            with open(job.probes_file, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            time.sleep(0.1)
            continue
        if PROBES_FILE_KEY not in data:
            raise ProbesStopped(f"no probes to match: {data.get('stop', data)}")
        probes = tuple(ProbeJob.from_json(p, f"probes_file[{i}]") for i, p in enumerate(data[PROBES_FILE_KEY]))
        return replace(job, probes=probes, probes_file=None)


def report_stage(job: Job, stage: str, preflight_ok: bool | None = None) -> None:
    """Tell the parent where this child is (its progress display; and, for the first arm, that the
    preflight passed so the other arms may start). Never fails the arm."""
    if not job.output:
        return
    try:
        data = {"stage": stage, "at": round(time.time(), 3)}
        if preflight_ok is not None:
            data["preflight_ok"] = preflight_ok
        write_bytes_atomic(progress_path(job.output), dumps_json(data).encode("utf-8"))
    except Exception:  # noqa: BLE001 - progress is a display, never a result
        traceback.print_exc()


def build_chat_prompt(tokenizer, spec: dict) -> tuple[list[int], list[dict]]:
    """Token IDs of exactly spec['length'] tokens: chat template around a truncated filler.

    The last message's content is the filler; it is cut at token level so the templated prompt
    has the exact length the probe asks for, with whatever tokenizer the model ships.
    """
    marker = "\u2063KVKIT_FILLER\u2063"
    messages = [dict(m) for m in spec["messages"]]
    messages[-1]["content"] = messages[-1]["content"] + marker
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if text.count(marker) != 1:
        raise ValueError("chat template does not render the filler exactly once")
    pre_text, post_text = text.split(marker)
    pre = tokenizer.encode(pre_text, add_special_tokens=False)
    post = tokenizer.encode(post_text, add_special_tokens=False)
    budget = int(spec["length"]) - len(pre) - len(post)
    if budget < 0:
        raise ValueError(f"chat probe length {spec['length']} is shorter than its template ({len(pre) + len(post)})")
    repeat = 1
    filler = tokenizer.encode(spec["filler"], add_special_tokens=False)
    while len(filler) < budget:
        repeat *= 2
        filler = tokenizer.encode(" ".join([spec["filler"]] * repeat), add_special_tokens=False)
    ids = pre + filler[:budget] + post
    final = [dict(m) for m in spec["messages"]]
    final[-1]["content"] = final[-1]["content"] + tokenizer.decode(filler[:budget])
    return ids, final


def _top_logprobs(step) -> list[list]:
    """[[token_id, logprob], ...] best first, for one generated position."""
    if step is None:
        return []
    items = sorted(((int(t), float(lp.logprob)) for t, lp in step.items()), key=lambda x: (-x[1], x[0]))
    return [[t, lp] for t, lp in items]


def _model_runner(cfg) -> str:
    """'v2' or 'v1': which model runner vLLM chose (VllmConfig.use_v2_model_runner; vLLM 0.28 takes v2 by default
    for a dense model where Triton is present, and then sends a request resumed after preemption to the
    connector as new); 'unavailable: ...' where this vLLM does not say."""
    try:
        return "v2" if cfg.use_v2_model_runner else "v1"
    except Exception as exc:  # noqa: BLE001 - an older vLLM without the property
        return f"unavailable: {type(exc).__name__}: {exc}"[:200]


def _effective_config(llm) -> dict:
    cfg = vllm_config_of(llm)
    ktc = cfg.kv_transfer_config
    return {
        "frontend": frontend_name(llm),  # the front end that drove the engine (repro.engine.frontend)
        "model": cfg.model_config.model,
        "revision": cfg.model_config.revision,
        "tokenizer": cfg.model_config.tokenizer,
        "dtype": str(cfg.model_config.dtype).replace("torch.", ""),
        "max_model_len": cfg.model_config.max_model_len,
        "seed": cfg.model_config.seed,
        "enforce_eager": cfg.model_config.enforce_eager,
        "block_size": cfg.cache_config.block_size,
        "enable_prefix_caching": bool(cfg.cache_config.enable_prefix_caching),
        "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
        "max_num_seqs": cfg.scheduler_config.max_num_seqs,
        # with a consumer connector, async scheduling defers block frees (repro.engine.kvaudit.OBSERVER_ROLE)
        "async_scheduling": getattr(cfg.scheduler_config, "async_scheduling", None),
        "kv_cache_memory_bytes": getattr(cfg.cache_config, "kv_cache_memory_bytes", None),
        "kv_transfer_config": None
        if ktc is None
        else {
            "kv_connector": ktc.kv_connector,
            "kv_role": ktc.kv_role,
            "kv_connector_module_path": ktc.kv_connector_module_path,
            "kv_connector_extra_config": json.loads(json.dumps(ktc.kv_connector_extra_config, default=str)),
        },
        "device_type": str(cfg.device_config.device_type) if getattr(cfg, "device_config", None) else "unavailable",
        "model_runner": _model_runner(cfg),
        # the connector the KV audit wrapped (kv_connector then names the audit's class)
        "kv_audit_target": os.environ.get("KVKIT_KV_AUDIT_TARGET"),
    }


def _process_facts(probes: list[ProbeResult], audit: _AuditRecords, scenario: ScenarioResult | None = None) -> dict:
    """What the arm's processes ran with, for its effective_config: each worker's facts as the KV audit
    recorded them (repro.engine.kvaudit.worker_facts; one entry per worker process), whether vLLM's
    batch-invariant kernels were asked for and active in every worker (repro.judge.verdict decides), and
    this child's PYTHONHASHSEED (the workers' are in their facts)."""
    records = [r.kv_audit_record for p in probes for r in p.requests] + [p["record"] for p in audit.primes]
    records += [r.request.kv_audit_record for r in (scenario.requests if scenario else ())]
    workers: dict[str, dict] = {}
    for record in records:
        worker = (record or {}).get("worker")
        if isinstance(worker, dict):
            workers.setdefault(json.dumps(worker, sort_keys=True), worker)
    found = sorted(workers.values(), key=lambda w: (str(w.get("pid")), json.dumps(w, sort_keys=True)))
    state = batch_invariance_state(found)
    reasons = state.reasons if audit.directory else ("the KV audit is off: no worker recorded its facts",)
    return {
        "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
        "workers": found if audit.directory else None,
        "batch_invariant": {
            "requested": batch_invariant_requested(os.environ),
            "active": state.active,
            "reasons": list(reasons),
        },
    }


def _lmcache_build() -> dict:
    """The installed LMCache wheel's build, for an LMCache arm: its version, the CUDA runtime its
    compiled ops link and the nvcc that built them (read from lmcache/cuda_ops*.so), and whether
    those ops import in this environment (the worker imports the same file): `copy_path` "compiled"
    or "fallback" (LMCache's torch fallback), `ops_source` "wheel" or "kit build" (with
    `ops_build_dir`; repro.lmcache.ops), `ops_import_error` when they do not import. The wheel records
    no torch build: its metadata requires an unpinned torch, so only the import tells a mismatch."""
    import importlib
    import importlib.util
    import re

    spec = importlib.util.find_spec("lmcache")
    if spec is None or not spec.submodule_search_locations:
        return {"version": None, "problem": "lmcache is not importable"}
    out: dict = {"version": package_version("lmcache"), "torch_build": "not recorded in the wheel"}
    folder = next(iter(spec.submodule_search_locations))
    ops = sorted(n for n in os.listdir(folder) if n.startswith("cuda_ops") and n.endswith(".so"))
    if ops:
        with open(os.path.join(folder, ops[0]), "rb") as fh:
            data = fh.read()
        nvcc = re.search(rb"Cuda compilation tools, release [\d.]+, V([\d.]+)", data)
        out.update(
            cuda_ops_file=ops[0],
            cuda_runtime=sorted({m.decode() for m in re.findall(rb"libcudart\.so\.\d+", data)}),
            nvcc=nvcc.group(1).decode() if nvcc else None,
        )
    else:
        out["cuda_ops_file"] = None
    try:
        module = importlib.import_module("lmcache.cuda_ops")
    except Exception as exc:  # noqa: BLE001 - ImportError (an undefined torch symbol, say) or worse: record it
        first = (str(exc).strip().splitlines() or [""])[0]
        error = f"{type(exc).__name__}: {first[:300]}"
        shipped = f"not loaded: {error}" if ops else "not shipped in this wheel"
        return {**out, "cuda_ops": shipped, "copy_path": "fallback", "ops_source": None, "ops_import_error": error}
    # A kit build is an unpacked source tree beside the kit's manifest (repro.lmcache.ops.MANIFEST_NAME).
    tree = os.path.dirname(os.path.dirname(os.path.abspath(module.__file__ or folder)))
    build_dir = os.path.dirname(tree)
    kit = os.path.isfile(os.path.join(build_dir, "kvkit-lmcache-ops.json"))
    out.update(cuda_ops="loaded", copy_path="compiled", ops_source="kit build" if kit else "wheel")
    if kit:
        out["ops_build_dir"] = build_dir
    return out


def _collect_versions() -> dict:
    import torch

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "vllm": package_version("vllm"),
        "lmcache": package_version("lmcache"),
        "transformers": package_version("transformers"),
        "cuda_available": bool(torch.cuda.is_available()),
        "torch_cuda": torch.version.cuda or "none",
    }
    if torch.cuda.is_available():
        out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        out["gpu_capabilities"] = [
            "{}.{}".format(*torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())
        ]
    return out


_DTYPE_BYTES = {"float16": 2, "half": 2, "bfloat16": 2, "float32": 4, "float": 4}


def kv_bytes_per_token(model: str, revision: str | None, dtype: str) -> int:
    """Bytes of K and V one token takes over all layers, from the model's config (full attention,
    the KV cache in the model's dtype): what a KV cache of N tokens costs in kv_cache_memory_bytes."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model, revision=revision)
    cfg = getattr(cfg, "text_config", None) or cfg
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    if dtype == "auto":
        dtype = str(getattr(cfg, "torch_dtype", None) or getattr(cfg, "dtype", None) or "float16")
    size = _DTYPE_BYTES.get(dtype.replace("torch.", ""), 2)
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * size


def _engine_kwargs(job: Job) -> dict:
    e, arm = job.engine, job.arm
    kwargs = {
        "model": e.model,
        "tokenizer": e.model,
        "revision": e.revision,
        "dtype": e.dtype,
        "seed": e.seed,
        "enforce_eager": True,
        "gpu_memory_utilization": e.gpu_memory_utilization,
        "max_model_len": e.max_model_len,
        "block_size": e.block_size,
        # The whole prompt is prefilled in one step: connectors such as ExampleConnector store
        # only on a request's first scheduling step.
        "max_num_batched_tokens": e.max_num_batched_tokens or max(e.max_model_len, 2048),
        # one request at a time, but for a scenario's requests in flight together (repro.run.scenarios)
        "max_num_seqs": e.max_num_seqs or 1,
        "enable_prefix_caching": arm.mode == "native",
        "disable_log_stats": False,
    }
    if e.async_scheduling is not None:  # a scenario's engine; else vLLM's default (on for CUDA, off on the CPU)
        kwargs["async_scheduling"] = e.async_scheduling
    if e.kv_cache_tokens:
        kwargs["kv_cache_memory_bytes"] = e.kv_cache_tokens * kv_bytes_per_token(e.model, e.revision, e.dtype)
    ktc = None
    if arm.connector is not None:
        ktc = {
            "kv_connector": arm.connector.name,
            "kv_role": "kv_both",
            "kv_connector_extra_config": dict(arm.connector.extra_config),
        }
        if arm.connector.module_path:
            ktc["kv_connector_module_path"] = arm.connector.module_path
    if job.kv_audit_dir:
        from repro.engine import kvaudit

        if ktc is None:  # baseline and native: a connector that only records
            ktc = {"kv_connector": kvaudit.OBSERVER, "kv_role": kvaudit.OBSERVER_ROLE}
        else:  # the arm's connector, wrapped in the auditing subclass (see repro.engine.kvaudit)
            ktc["kv_connector"] = kvaudit.WRAPPED
        ktc["kv_connector_module_path"] = kvaudit.MODULE
    if ktc is not None:
        from vllm.config import KVTransferConfig

        kwargs["kv_transfer_config"] = KVTransferConfig(**ktc)
    return kwargs


def _audit_env(job: Job) -> None:
    """The audit's settings reach the engine core and worker processes (spawned) by environment."""
    if not job.kv_audit_dir:
        return
    from repro.engine import kvaudit

    os.makedirs(job.kv_audit_dir, exist_ok=True)
    os.environ[kvaudit.AUDIT_DIR_ENV] = job.kv_audit_dir
    if job.arm.connector is not None:
        c = job.arm.connector
        os.environ[kvaudit.AUDIT_TARGET_ENV] = f"{c.module_path}:{c.name}" if c.module_path else c.name


class _AuditRecords:
    """Maps the audit's per-request records (<seq>.json, in scheduling order) to the kit's requests."""

    def __init__(self, directory: str | None):
        self.directory, self.seen = directory, set()
        self.primes: list[dict] = []  # native-matched: each priming prefill's record

    def take(self, ids: list[int]) -> dict | None:
        if not self.directory:
            return None
        try:
            return self._take(ids)
        except Exception as exc:  # noqa: BLE001 - an audit failure never fails the arm
            return {"seq": None, "unavailable": f"the audit record could not be read: {type(exc).__name__}: {exc}"}

    def _new_records(self) -> list[dict]:
        """The audit's records (<seq>.json) written since the last call, in scheduling order."""
        new = sorted(
            n for n in os.listdir(self.directory) if n.endswith(".json") and n[0].isdigit() and n not in self.seen
        )
        self.seen.update(new)
        records = []
        for name in new:
            with open(os.path.join(self.directory, name), encoding="utf-8") as fh:
                records.append(json.load(fh))
        return records

    def _take(self, ids: list[int]) -> dict:
        from repro.engine.kvaudit import prompt_sha256

        records = self._new_records()
        mine = [r for r in records if r.get("prompt_sha256") == prompt_sha256(ids)]
        if len(mine) != 1 or len(records) != 1:
            return {
                "seq": None,
                "unavailable": f"expected one audit record for this request, found {len(mine)} of {len(records)} new",
            }
        return mine[0]

    def take_many(self, prompts: list[list[int]]) -> list[dict | None]:
        """The records of one generate call of several prompts (a scenario step in flight together):
        every new record, matched to each prompt by its SHA-256 (the prompts are distinct)."""
        if not self.directory:
            return [None] * len(prompts)
        try:
            return self._take_many(prompts)
        except Exception as exc:  # noqa: BLE001 - an audit failure never fails the arm
            why = f"the audit record could not be read: {type(exc).__name__}: {exc}"
            return [{"seq": None, "unavailable": why} for _ in prompts]

    def _take_many(self, prompts: list[list[int]]) -> list[dict]:
        from repro.engine.kvaudit import prompt_sha256

        records = self._new_records()
        out = []
        for ids in prompts:
            mine = [r for r in records if r.get("prompt_sha256") == prompt_sha256(ids)]
            if not mine:
                out.append({"seq": None, "unavailable": f"no audit record for this prompt among {len(records)} new"})
                continue
            # one per scheduling of a new request; a second one (seen as "also_seqs") is the same prompt scheduled
            # anew; the first is the request's own first load
            out.append({**mine[0], "also_seqs": [r.get("seq") for r in mine[1:]]} if len(mine) > 1 else mine[0])
        return out

    def summary(self) -> dict | None:
        if not self.directory:
            return None
        errors = []
        for name in sorted(os.listdir(self.directory)):
            if name.startswith("audit-error"):
                with open(os.path.join(self.directory, name), encoding="utf-8") as fh:
                    errors.append(json.load(fh))
        return {"dir": self.directory, "errors": errors, "primes": self.primes}


def _request(out, role: str, kv_audit_record: dict | None = None) -> RequestResult:
    comp = out.outputs[0]
    cached = getattr(out, "num_cached_tokens", None)
    ktp = json.loads(json.dumps(out.kv_transfer_params, default=str)) if out.kv_transfer_params else None
    return RequestResult(
        role=role,
        request_id=str(out.request_id),
        cached_tokens=None if cached is None else int(cached),
        token_ids=tuple(int(t) for t in comp.token_ids),
        logprobs=tuple(_top_logprobs(s) for s in (comp.logprobs or [])),
        finish_reason=comp.finish_reason,
        kv_transfer_params=ktp,
        text=comp.text,
        kv_audit_record=kv_audit_record,
    )


def run_job(job: Job, keep: list) -> ArmResult:
    """Run every probe of the arm in one engine; the engine is parked in `keep` so that it is not
    torn down before the result is written (the parent reaps its processes)."""
    from vllm import SamplingParams, TokensPrompt

    frontend = frontend_from_env(os.environ)  # before any engine: a bad value fails the arm at once
    versions = _collect_versions()
    waited = wait_for_preflight(job)
    report_stage(job, "building the engine", preflight_ok=True)
    _audit_env(job)
    audit = _AuditRecords(job.kv_audit_dir)
    t0 = time.monotonic()
    llm = build_frontend(frontend, _engine_kwargs(job))  # LLM, or a bare AsyncLLM behind the same calls
    keep.append(llm)
    ready = time.monotonic()
    if job.probes_file:
        job = wait_for_probes(job)
    tokenizer = llm.get_tokenizer()
    sp = SamplingParams(
        temperature=0.0, max_tokens=job.max_tokens, ignore_eos=True, logprobs=job.logprobs, seed=job.engine.seed
    )
    t_gen = time.monotonic()
    probes, scenario = [], None
    if job.scenario is not None:
        probes, scenario = run_scenario(llm, job, tokenizer, sp, audit)
    for n, probe in enumerate(job.probes if job.scenario is None else (), start=1):
        report_stage(job, f"probe {n} of {len(job.probes)}", preflight_ok=True)
        if "token_ids" in probe.prompt:
            ids, messages = list(probe.prompt["token_ids"]), None
        else:
            ids, messages = build_chat_prompt(tokenizer, probe.prompt["chat"])
        if job.arm.mode == "native":
            llm.reset_prefix_cache()  # belt and braces: probes are also isolated by content
        requests = []
        for i in range(probe.requests):
            if i > 0 and probe.match_tokens is not None:
                primed = _prime(llm, ids[: probe.match_tokens[i - 1]], audit)
                if primed is not None:
                    audit.primes.append({"probe": probe.name, "reuse": i, "record": primed})
            out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0]
            requests.append(_request(out, "cold" if i == 0 else "reuse", audit.take(ids)))
        probes.append(
            ProbeResult(name=probe.name, prompt_token_ids=tuple(ids), messages=messages, requests=tuple(requests))
        )
    if job.arm.connector is not None and "lmcache" in job.arm.connector.name.lower():
        # after the run: the engine's worker imported LMCache's compiled ops first (or failed to)
        try:
            versions["lmcache_build"] = _lmcache_build()
        except Exception as exc:  # noqa: BLE001 - a fact that cannot be read never fails the arm
            versions["lmcache_build"] = {"problem": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return ArmResult(
        arm=job.arm.name,
        probes=tuple(probes),
        pid=os.getpid(),
        versions=versions,
        effective_config={**_effective_config(llm), **_process_facts(probes, audit, scenario)},
        # from process start to a ready engine: interpreter, imports and engine construction
        engine_start_s=round(ready - _T_PROCESS - waited, 3),
        import_s=round(t0 - _T_PROCESS - waited, 3),
        generation_s=round(time.monotonic() - t_gen, 3),
        fixture_sha256=job.fixture_sha256,
        kv_audit=audit.summary(),
        scenario=scenario,
    )


PREEMPTIONS_METRIC = "vllm:num_preemptions"


def preemption_count() -> tuple[int | None, str]:
    """The engine's cumulative count of preempted requests and where it came from: vLLM's Prometheus
    counter vllm:num_preemptions (v1/metrics/loggers.py, fed by the scheduler's PREEMPTED events), read
    in this process as LLM.get_metrics() reads it (vllm.v1.metrics.reader.get_metrics_snapshot), which
    serves the synchronous LLM and the bare AsyncLLM alike; (None, "unavailable: why") otherwise."""
    try:
        from vllm.v1.metrics.reader import get_metrics_snapshot

        values = [m.value for m in get_metrics_snapshot() if m.name == PREEMPTIONS_METRIC]
    except Exception as exc:  # noqa: BLE001 - a counter that cannot be read is reported as such
        return None, f"unavailable: {type(exc).__name__}: {str(exc)[:200]}"
    if not values:
        return None, f"unavailable: vLLM's metrics have no {PREEMPTIONS_METRIC} (stat logging off?)"
    return int(sum(values)), f"{PREEMPTIONS_METRIC} (vLLM's Prometheus counter, as LLM.get_metrics() reads it)"


def run_scenario(llm, job: Job, tokenizer, sp, audit: _AuditRecords) -> tuple[list[ProbeResult], ScenarioResult]:
    """A scenario's steps in this (fresh) engine: each step's probes one generate call each in order,
    or one call with all of them (together: in flight at once, as many as max_num_seqs lets run). The
    prefix cache is never reset: what earlier steps left is the point. Each request's audit record is
    matched by its prompt among the records its call made."""
    from vllm import TokensPrompt

    prompts: dict[str, list[int]] = {}
    probes = []
    for probe in job.probes:
        if "token_ids" in probe.prompt:
            ids, messages = list(probe.prompt["token_ids"]), None
        else:
            ids, messages = build_chat_prompt(tokenizer, probe.prompt["chat"])
        prompts[probe.name] = ids
        probes.append(ProbeResult(name=probe.name, prompt_token_ids=tuple(ids), messages=messages, requests=()))
    requests = []
    steps = job.scenario.steps
    for k, step in enumerate(steps):
        if step.wait_s:  # the engine idle, so the store's own background work (an eviction loop) can run
            report_stage(job, f"step {k + 1} of {len(steps)}: waiting {step.wait_s:g} s", preflight_ok=True)
            time.sleep(step.wait_s)
        report_stage(job, f"step {k + 1} of {len(steps)}", preflight_ok=True)
        calls = [list(step.submit)] if step.together else [[name] for name in step.submit]
        for names in calls:
            before, _ = preemption_count()
            ids = [prompts[name] for name in names]
            outs = llm.generate([TokensPrompt(prompt_token_ids=i) for i in ids], sp, use_tqdm=False)
            after, _ = preemption_count()
            grew = None if before is None or after is None else after - before
            records = audit.take_many(ids) if len(ids) > 1 else [audit.take(ids[0])]
            for name, out, record in zip(names, outs, records):
                cached = getattr(out, "num_cached_tokens", None)
                role = "reuse" if cached else "cold"
                requests.append(StepRequest(k, name, _request(out, role, record), grew))
    count, source = preemption_count()
    return probes, ScenarioResult(job.scenario.name, tuple(requests), count, source)


def _prime(llm, prefix: list[int], audit) -> dict | None:
    """Leave exactly `prefix` in native prefix caching: reset the cache, then prefill the prefix
    alone (one token generated, not recorded). Its full blocks are what the next request reuses;
    returns the priming prefill's audit record (a prefill of another shape than the baseline's:
    its KV belongs to the arm's measured floor)."""
    from vllm import SamplingParams, TokensPrompt

    llm.reset_prefix_cache()
    if not prefix:
        return None
    llm.generate([TokensPrompt(prompt_token_ids=prefix)], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    return audit.take(prefix)


def _preflight_problems(job: Job) -> list[str]:
    """The first arm's child checks every arm's connector and the device before building its
    engine (see repro.engine.preflight); problems go back to the parent as a usage error."""
    if job.preflight is None:
        return []
    from repro.engine.preflight import run_preflight

    try:
        return run_preflight(job.preflight)
    except Exception:  # noqa: BLE001 - a broken check must not invent a problem: the arms report their own errors
        traceback.print_exc()
        print("kvkit-engine: warning: the preflight check did not complete; running the arm anyway", flush=True)
        return []


def _raised(job: Job, exc: BaseException) -> ArmResult:
    return ArmResult(
        arm=job.arm.name,
        pid=os.getpid(),
        fixture_sha256=job.fixture_sha256,
        error=ChildError(type(exc).__name__, str(exc)[:2000]),
    )


def run_and_write(job: Job, keep: list) -> int:
    """Run the job and write its result; returns the child's exit code. Serializing the result is
    part of the run: a result that cannot be written (a NaN, say) is a raised error, exit EXIT_RAISED."""
    try:
        report_stage(job, "preflight" if job.preflight is not None else "importing")
        problems = _preflight_problems(job)
        if job.preflight is not None:
            report_stage(job, "importing" if not problems else "preflight failed", preflight_ok=not problems)
        result = ArmResult(arm=job.arm.name, preflight_problems=tuple(problems)) if problems else run_job(job, keep)
        data, code = dumps_json(result.to_json()), EXIT_OK
    except BaseException as exc:  # noqa: BLE001 - the parent turns this into a named ERROR with the log tail
        traceback.print_exc()
        data, code = dumps_json(_raised(job, exc).to_json()), EXIT_RAISED
    write_bytes_atomic(job.output, data.encode("utf-8"))
    return code


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m repro.engine JOB.json", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as fh:
        job = Job.from_json(json.load(fh))
    print(
        f"kvkit-engine: arm={job.arm.name} pid={os.getpid()} PYTHONHASHSEED={os.environ.get('PYTHONHASHSEED')}",
        flush=True,
    )
    keep: list = []
    code = run_and_write(job, keep)
    sys.stdout.flush()
    sys.stderr.flush()
    # No graceful engine shutdown: the result is on disk, and the parent kills the whole process
    # group (engine core and workers included) as soon as this process is gone.
    os._exit(code)
