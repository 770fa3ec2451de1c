"""The plan of one verification run, read once: the command line's options (repro.plan.options) and the
fixture become frozen parts, one per stage that uses them (repro.plan.settings), beside the probes, the
scenarios and the arms. After build_plan nothing reads the options again: every stage takes its part."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from repro.contract.job import ArmSpec, Preflight
from repro.errors import UsageError
from repro.plan import adapters, endpoint, images, multi, offloading
from repro.plan import llamacpp as llamacpp_options
from repro.plan.arms import PlannedArm, default_jobs, plan_arms, preflight_for, vocab_size
from repro.plan.devices import uses_cuda
from repro.plan.expectation_names import check_expectation_names
from repro.plan.fixtures import Fixture, Probe, Scenario, load_fixture
from repro.plan.options import Options
from repro.plan.scenarios import check_load, select
from repro.plan.settings import (
    ArmsAsked,
    ChildSettings,
    EngineSettings,
    KVAuditSettings,
    LMCacheSettings,
    Loads,
    OutputSettings,
    Repeats,
)
from repro.plan.suite import build_probes


@dataclass(frozen=True)
class ProbeSet:
    """What every arm is asked: the fixture (as given, and its digest), its probes with the suite's, each
    probe's reuses (--reuses, else its own) and the scenarios asked for (--scenarios)."""

    fixture_path: str
    fixture: Fixture
    suite: str | None
    reuses: int | None
    probes: tuple[Probe, ...]
    scenarios: tuple[Scenario, ...]
    adapters: adapters.AdapterPlan | None = None  # the LoRA adapters probes run under (repro.plan.adapters)


@dataclass(frozen=True)
class RunPlan:
    """One run, planned: its parts in the order the stages use them."""

    argv: tuple[str, ...]  # as given: the report's provenance
    engine: EngineSettings
    inputs: ProbeSet
    asked: ArmsAsked
    arms: tuple[PlannedArm, ...]  # baseline first (repro.plan.arms.plan_arms)
    preflight: Preflight | None  # the first child's (repro.plan.arms.preflight_for)
    jobs: int  # arms at once: --jobs, else what the machine sustains (repro.plan.arms.default_jobs)
    children: ChildSettings
    repeats: Repeats
    loads: Loads
    lmcache: LMCacheSettings
    kv_audit: KVAuditSettings
    output: OutputSettings


def build_plan(opts: Options, argv: list[str]) -> RunPlan:
    """The run's plan: the fixture loaded, its probes built and checked against the model and engine, the
    scenarios selected, the arms planned, every option read into its part; a problem is one line (exit 2)."""
    a = opts.args
    engine = EngineSettings(
        model=a.model,
        model_is_local=opts.model_is_local,
        revision=a.model_revision,
        dtype=a.dtype,
        seed=a.seed,
        gpu_memory_utilization=a.gpu_memory_utilization,
        kv_cache_tokens=a.kv_cache_tokens,
        speculative_config=a.speculative_config,
        max_model_len=a.max_model_len,
        block_size=a.block_size,
        block_size_chosen=opts.block_size_chosen,
        device=a.device,
        max_tokens=a.max_tokens,
        logprobs=a.logprobs,
        batch_invariant=bool(a.batch_invariant),
        frontend=a.frontend,
        stream=a.stream,
        engine_layout=a.engine_layout or ("vllm" if uses_cuda(a.device) or a.frontend == "server" else "one-process"),
    )
    fixture = load_fixture(a.fixture)
    probes = build_probes(fixture.probes, a.suite)
    probes, lora = adapters.resolve(fixture.adapters, probes, a.model, opts.model_is_local, a.fixture)
    images.check_images(probes, a.model, opts.model_is_local)  # each fits the model (repro.plan.images)
    engine = replace(engine, lora=lora.engine() if lora is not None else None)
    if lora is not None and engine.frontend in ("server", "endpoint"):
        raise UsageError(
            f"fixture {a.fixture}: probes under LoRA adapters cannot run served (--frontend server, repro endpoint) "
            "(the kit does not load adapters into vllm serve); use --frontend sync or async"
        )
    if engine.frontend in ("server", "endpoint") and any(getattr(p, "image", None) is not None for p in probes):
        raise UsageError(
            f"fixture {a.fixture}: image probes cannot run served (--frontend server, repro endpoint) "
            "(the kit sends served prompts as token IDs without their image); use --frontend sync or async"
        )
    asking = [p.name for p in probes if getattr(p, "prompt_logprobs", None) is not None]
    if engine.stream and asking:  # the stream would hold none, and two empty records compare nothing
        raise UsageError(
            f"fixture {a.fixture}: probe {asking[0]!r} asks for prompt_logprobs, which a completion stream does not "
            "carry (vLLM's stream has no prompt_logprobs); run it without --stream"
        )
    vocab = vocab_size(engine)
    check_probes_fit(
        probes,
        vocab_size=vocab,
        max_model_len=engine.max_model_len,
        max_tokens=engine.max_tokens,
        where=f"fixture {a.fixture}",
    )
    chosen = select(fixture, a.scenarios, probes, engine.max_model_len)
    asked = ArmsAsked(
        kv_connector=a.kv_connector,
        module_path=a.kv_connector_module_path,
        extra_config=dict(opts.extra_config),
        compare_native=a.compare_native,
        native_matched=not a.no_native_matched,
        offloading_size=a.kv_offloading_size,
        offloading_backend="simple" if offloading.simple_from_env(os.environ) else "native",
    )
    arms = plan_arms(asked, fixture, a.lmcache_config)
    if engine.frontend == "endpoint":  # repro endpoint: the two servers it was given, nothing else
        arms = [PlannedArm(ArmSpec(arm, "baseline" if arm == endpoint.BASELINE_ARM else "native"),
                           env={endpoint.ENDPOINT_URL_ENV: url}) for arm, url in sorted(a.endpoints.items())]  # fmt: skip
    check_expectation_names(fixture, [arm.name for arm in arms])  # a misspelt arm or probe: one line (exit 2)
    images.check_native_matched(probes, any(arm.match_arm for arm in arms))
    check_load(chosen, [arm.spec.mode for arm in arms], engine.frontend, lambda ps, where: check_probes_fit(
        ps, vocab_size=vocab, max_model_len=engine.max_model_len, max_tokens=engine.max_tokens, where=where))  # fmt: skip
    for arm in arms:  # vLLM's offloading connectors refuse its CPU backend: one line, before any engine
        conn = arm.spec.connector
        for c in ([conn] if conn else []) + (multi.member_specs(conn) if multi.is_multi(conn) else []):
            if (problem := offloading.gpu_only_problem(c.name, not uses_cuda(engine.device))) is not None:
                raise UsageError(f"arm {arm.name}: {problem}")
    children = ChildSettings(
        python=a.python,
        engine_module=a.engine_module,
        timeout_s=a.timeout,
        max_disk_gb=a.max_child_disk_gb,
        lmcache_server_module=a.lmcache_server_module,
        compare_python=sys.executable if a.engine == llamacpp_options.ENGINE else None,
    )
    return RunPlan(
        argv=tuple(argv),
        engine=engine,
        inputs=ProbeSet(a.fixture, fixture, a.suite, a.reuses, tuple(probes), tuple(chosen), lora),
        asked=asked,
        arms=tuple(arms),
        preflight=preflight_for(arms, engine.device, children.engine_module),
        jobs=a.jobs or default_jobs(engine, len(arms)),
        children=children,
        repeats=Repeats(trials=a.trials, confirm=a.confirm),
        loads=Loads(gpu=bool(a.gpu_load), cpu=bool(a.cpu_load)),
        lmcache=LMCacheSettings(ops=a.lmcache_ops, config=a.lmcache_config),
        kv_audit=KVAuditSettings(enabled=a.kv_audit, keep_dir=a.keep_kv),
        output=OutputSettings(report=Path(a.report), quiet=a.quiet),
    )


def check_probes_fit(
    probes: list[Probe], *, vocab_size: int | None, max_model_len: int, max_tokens: int, where: str
) -> None:
    """Reject prompts the engine could not take: out-of-vocabulary IDs, or too long for the window."""
    limit = max_model_len - max_tokens
    for p in probes:
        if p.length > limit:
            raise UsageError(
                f"{where}: probe {p.name!r} has {p.length} prompt tokens, over max_model_len - max_tokens = {limit}"
            )
        if vocab_size is not None and p.token_ids is not None:
            bad = [t for t in p.token_ids if t >= vocab_size]
            if bad:
                raise UsageError(
                    f"{where}: probe {p.name!r} has token ID {bad[0]} outside the vocabulary (size {vocab_size})"
                )
