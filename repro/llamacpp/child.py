"""The llama.cpp engine child: `python -m repro.llamacpp JOB.json`, run by repro.run.runner.run_arm in .venvs/llamacpp
(llama-cpp-python, built by repro.llamacpp.build), reading the same repro.contract.job.Job and writing the same
repro.contract.result.ArmResult as vLLM's child, so the one judge decides. Greedy (temperature 0, no penalties),
exactly max_tokens tokens (an end-of-generation token is one of them: nothing stops early, as vLLM's ignore_eos).

An arm is one way llama.cpp reuses a prompt's KV (repro.llamacpp.arms says which); the hit counter of every reuse is
what the engine kept, read from it before the request by the rule the reuse path applies (repro.llamacpp.arms),
never assumed. With --frontend server each arm is llama-server instead (repro.llamacpp.served): the hit counter is
then llama-server's own per request (timings.cache_n).
"""

from __future__ import annotations

import time

_T_PROCESS = time.monotonic()

import os  # after the clock: engine start counts from process start
import sys

from repro.contract.job import Job
from repro.contract.result import ArmResult
from repro.record.child_io import read_job, report_stage, wait_for_probes, write_result

# the front end the parent asked for (repro.plan.options.FRONTEND_ENV, pinned equal by tests/test_frontend.py)
FRONTEND_ENV = "KVKIT_FRONTEND"


def run_served(job: Job) -> ArmResult:
    """--frontend server: the arm's own llama-server (repro.llamacpp.served)."""
    from importlib.metadata import version

    from repro.llamacpp import served
    from repro.llamacpp.audit import LlamaAudit
    from repro.llamacpp.engine import build_record

    report_stage(job, "starting llama-server", preflight_ok=True)
    t0 = time.monotonic()
    if job.probes_file:  # native-matched: the lengths its connector arm reused
        job = wait_for_probes(job)
    report_stage(job, "generating", preflight_ok=True)
    audit = LlamaAudit(job.kv_audit_dir, job.engine.block_size) if job.kv_audit_dir else None
    probes, facts, scenario, versions = served.run(job, audit)
    config = {
        "engine": "llama.cpp",
        "model": job.engine.model,
        "block_size": job.engine.block_size,
        "seed": job.engine.seed,
        "kv_type": "f16 (llama.cpp's default)",
        "decoding": "greedy (temperature 0, top_k 1, penalties off); exactly max_tokens tokens (ignore_eos: the "
        "end-of-generation tokens biased away)",
    }
    binding = {"llama_cpp_python": version("llama_cpp_python"), "llamacpp_build": build_record()}
    versions = {"engine": "llama.cpp", **versions}  # the server's --version in versions["llama_server"]
    return ArmResult(
        arm=job.arm.name,
        probes=tuple(probes),
        pid=os.getpid(),
        versions={**versions, **binding},
        effective_config={**config, **facts},
        engine_start_s=None,
        import_s=round(t0 - _T_PROCESS, 3),
        generation_s=round(time.monotonic() - t0, 3),
        fixture_sha256=job.fixture_sha256,
        kv_audit=None if audit is None else audit.summary(),
        scenario=scenario,
    )


def run_job(job: Job) -> ArmResult:
    if os.environ.get(FRONTEND_ENV) == "server":
        return run_served(job)
    from repro.llamacpp import arms
    from repro.llamacpp.audit import LlamaAudit
    from repro.llamacpp.engine import Engine

    report_stage(job, "building the engine", preflight_ok=True)
    t0 = time.monotonic()
    engine = Engine.load(job)
    ready = time.monotonic()
    if job.probes_file:  # native-matched: the lengths its connector arm reused
        job = wait_for_probes(job)
    report_stage(job, "generating", preflight_ok=True)
    t_gen = time.monotonic()
    audit = LlamaAudit(job.kv_audit_dir, job.engine.block_size)
    probes, facts = arms.run(engine, job, audit)
    return ArmResult(
        arm=job.arm.name,
        probes=tuple(probes),
        pid=os.getpid(),
        versions=engine.versions(),
        effective_config={**engine.effective_config(), **facts},
        engine_start_s=round(ready - _T_PROCESS, 3),
        import_s=round(t0 - _T_PROCESS, 3),
        generation_s=round(time.monotonic() - t_gen, 3),
        fixture_sha256=job.fixture_sha256,
        kv_audit=audit.summary(),
    )


def main(argv: list[str]) -> int:
    job = read_job(argv, "repro.llamacpp")
    if job is None:
        return 2
    print(f"kvkit-llamacpp: arm={job.arm.name} pid={os.getpid()}", flush=True)
    code = write_result(job, lambda: run_job(job))
    sys.stdout.flush()
    sys.stderr.flush()
    return code
