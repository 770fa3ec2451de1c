"""One reading of the options (issue 34, item 2): the command line and the fixture become a frozen plan of the
run (repro.plan.run_plan.build_plan), and no stage after it reads the options. Without an engine: the plan of
the CPU self-test's command line, every option read into it, the report's config made from it, a verifier run
whose options are emptied once the plan is made, and a static check over repro/ that keeps the rule."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import sys
from pathlib import Path

import pytest
from kvkit_testutil import ROOT, engine_block_size
from test_cli_failures import _args, _env, setup  # noqa: F401 - setup is a fixture

from repro.contract.job import EngineConfig, Preflight
from repro.errors import EXIT_OK, UsageError
from repro.plan.arms import default_jobs
from repro.plan.options import SELFTEST_CPU_FIXTURE, Options, build_parser, parse_args, selftest_cpu_argv
from repro.plan.run_plan import build_plan
from repro.plan.settings import (
    DEFAULT_MAX_CHILD_DISK_GB,
    ArmsAsked,
    ChildSettings,
    EngineSettings,
    KVAuditSettings,
    LMCacheSettings,
    Loads,
    OutputSettings,
    Repeats,
)
from repro.record.assemble import config_block
from repro.record.provenance import package_version


def vllm_version() -> str:
    return package_version("vllm")


SELFTEST_ARMS = ["baseline", "ExampleConnector", "PlantedFault", "PlantedFault-none", "native", "native-matched"]


def _selftest(tiny_model: str, report: Path, *extra: str):
    argv = [*selftest_cpu_argv(tiny_model, str(report), str(ROOT / SELFTEST_CPU_FIXTURE)), *extra]
    return build_plan(parse_args(argv), argv), argv


# ---- (a) the CPU self-test's plan --------------------------------------------------------------------------


def test_the_cpu_self_tests_plan_has_every_part_typed_and_read_once(tiny_model, tmp_path):
    report = tmp_path / "out" / "selftest.json"
    plan, argv = _selftest(tiny_model, report)
    assert plan.argv == tuple(argv)
    block = engine_block_size()  # --block-size auto: what this vLLM's CPU attention backend takes (16 on 0.28)
    assert plan.engine.block_size_chosen.startswith(f"auto: vLLM {vllm_version()}'s CPUAttentionBackend takes ")
    assert plan.engine == EngineSettings(
        model=tiny_model, model_is_local=True, revision=None, dtype="float32", seed=0, gpu_memory_utilization=0.1,
        max_model_len=2048, block_size=block, device="cpu", max_tokens=16, logprobs=2, batch_invariant=False,
        frontend="sync", engine_layout="one-process", kv_cache_tokens=32768,
        block_size_chosen=plan.engine.block_size_chosen,
    )  # fmt: skip
    resolved = str(Path(tiny_model).resolve())  # a local model, by its resolved path
    assert plan.engine.config() == EngineConfig(resolved, None, "float32", 0, 0.1, 2048, block, "cpu", 32768)
    inputs = plan.inputs
    assert inputs.fixture_path == str(ROOT / SELFTEST_CPU_FIXTURE) and inputs.fixture.name == "selftest-cpu"
    assert inputs.suite == "acceptance" and inputs.reuses is None and inputs.scenarios == ()
    assert [p.name for p in inputs.probes] == ["fixture", "chat-511", "chat-512", "chat-513"]  # the suite's added
    assert plan.asked == ArmsAsked(kv_connector=None, module_path=None, extra_config={}, compare_native=True)
    assert [arm.name for arm in plan.arms] == SELFTEST_ARMS  # the fixture's arms, then native and its control
    assert plan.arms[-1].match_arm == "ExampleConnector"
    assert isinstance(plan.preflight, Preflight) and plan.preflight.device == "cpu"
    assert [c.arm for c in plan.preflight.connectors] == SELFTEST_ARMS[1:4]
    assert plan.jobs == default_jobs(plan.engine, len(SELFTEST_ARMS)) and 1 <= plan.jobs <= len(SELFTEST_ARMS)
    assert plan.children == ChildSettings(sys.executable, "repro.engine", 1800.0, DEFAULT_MAX_CHILD_DISK_GB, None)
    assert plan.repeats == Repeats(trials=1, confirm=True)
    assert plan.loads == Loads(gpu=False, cpu=False)
    assert plan.lmcache == LMCacheSettings(ops="auto", config=None)
    assert plan.kv_audit == KVAuditSettings(enabled=True, keep_dir=None)
    assert plan.output == OutputSettings(report=report, quiet=False) and plan.output.logs_rel == "selftest.logs"


def test_every_part_of_the_plan_is_frozen(tiny_model, tmp_path):
    plan, _ = _selftest(tiny_model, tmp_path / "r.json")
    parts = [plan, *(getattr(plan, f.name) for f in dataclasses.fields(plan))]
    frozen = [p for p in parts if dataclasses.is_dataclass(p)]
    assert len(frozen) == 11  # the plan and its ten typed parts (argv, arms and jobs are plain values)
    for part in frozen:
        assert part.__dataclass_params__.frozen, type(part).__name__
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(part, dataclasses.fields(part)[0].name, None)
    assert all(dataclasses.is_dataclass(a) and a.__dataclass_params__.frozen for a in plan.arms)


def test_each_flag_lands_in_the_part_of_the_stage_that_uses_it(tiny_model, tmp_path):
    keep = tmp_path / "kept"
    plan, _ = _selftest(
        tiny_model, tmp_path / "r.json", "--trials", "3", "--no-confirm", "--quiet", "--jobs", "2", "--reuses", "2",
        "--logprobs", "3", "--seed", "7", "--frontend", "async", "--timeout", "60", "--max-child-disk-gb", "5",
        "--keep-kv", str(keep), "--no-native-matched", "--cpu-load", "--lmcache-ops", "fallback",
        "--python", sys.executable,
    )  # fmt: skip
    assert plan.repeats == Repeats(trials=3, confirm=False)
    assert plan.output.quiet is True and plan.jobs == 2
    assert plan.inputs.reuses == 2 and (plan.engine.logprobs, plan.engine.seed, plan.engine.frontend) == (3, 7, "async")
    assert (plan.children.timeout_s, plan.children.max_disk_gb) == (60.0, 5.0)
    assert plan.kv_audit == KVAuditSettings(enabled=True, keep_dir=str(keep))
    assert plan.asked.native_matched is False and [a.name for a in plan.arms][-1] == "native"
    assert plan.loads == Loads(gpu=False, cpu=True) and plan.lmcache.ops == "fallback"


def test_the_engine_layout_is_one_process_on_the_cpu_unless_asked_and_sets_the_childs_environment(
    tiny_model, tmp_path, monkeypatch
):
    from repro.plan import devices
    from repro.plan.settings import engine_layout_env

    assert _selftest(tiny_model, tmp_path / "r.json")[0].engine.engine_layout == "one-process"
    assert _selftest(tiny_model, tmp_path / "r.json", "--engine-layout", "vllm")[0].engine.engine_layout == "vllm"
    served = ("--frontend", "server")  # vLLM's own layout unless asked; one-process on the CPU when asked
    assert _selftest(tiny_model, tmp_path / "r.json", *served)[0].engine.engine_layout == "vllm"
    asked = _selftest(tiny_model, tmp_path / "r.json", *served, "--engine-layout", "one-process")[0]
    assert (asked.engine.engine_layout, asked.engine.frontend) == ("one-process", "server")
    monkeypatch.setattr(devices, "visible_gpus", lambda: ["0"])  # --device auto with a GPU: vLLM's own, always
    argv = [a for a in selftest_cpu_argv(tiny_model, str(tmp_path / "r.json")) if a not in ("--device", "cpu")]
    assert build_plan(parse_args(argv), argv).engine.engine_layout == "vllm"
    with pytest.raises(UsageError, match="is for the CPU engine"):
        parse_args([*argv, "--engine-layout", "one-process"])
    assert engine_layout_env("one-process") == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
    assert engine_layout_env("vllm") == {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}  # the flag decides, not the shell


@pytest.mark.parametrize(
    "environ, cores",
    [
        ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "1"}, [1]),
        ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "0,2-3"}, [0, 2, 3]),
        ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "auto"}, None),  # vLLM's own word
        ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}, None),  # one list per worker
        ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, None),  # an arm alone: no slot
        ({"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_OMP_THREADS_BIND": "1"}, None),  # vLLM binds its worker
    ],
)
def test_the_one_process_child_pins_itself_to_its_slots_cores(environ, cores):
    from repro.engine.child import slot_cores

    assert slot_cores(environ) == cores


def test_build_plan_reads_every_option_of_the_command_line(tiny_model, tmp_path):
    """Every flag the parser defines is read into the plan: none is left for a later stage to read."""
    argv = selftest_cpu_argv(tiny_model, str(tmp_path / "r.json"), str(ROOT / SELFTEST_CPU_FIXTURE))
    opts = parse_args(argv)
    read: set[str] = set()

    class Spy(argparse.Namespace):
        def __getattribute__(self, name: str):
            if not name.startswith("__"):
                read.add(name)
            return super().__getattribute__(name)

    spied = Options(Spy(**vars(opts.args)), opts.extra_config, opts.model_is_local, opts.block_size_chosen)
    assert build_plan(spied, argv) == build_plan(opts, argv)
    dests = {a.dest for a in build_parser()._actions if a.dest != "help"}
    # the connector's JSON settings are read by the parser's checks into Options.extra_config, which the plan takes;
    # --force only by the check of the report's path (repro.plan.report_path), before any plan
    assert dests - read == {"kv_connector_extra_config", "force"}
    argv += ["--kv-connector", "ExampleConnector", "--kv-connector-extra-config", '{"a": 1}']
    assert build_plan(parse_args(argv), argv).asked.extra_config == {"a": 1}


def test_the_reports_config_comes_from_the_plan_as_the_options_gave_it(tiny_model, tmp_path):
    """The report's `config` block, key by key, against the flags it records (as the verifier wrote it from the
    options before the plan)."""
    for extra in ([], ["--reuses", "2", "--logprobs", "3", "--seed", "7", "--no-kv-audit", "--frontend", "async",
                       "--jobs", "9", "--kv-connector", "ExampleConnector", "--engine-layout", "vllm"]):  # fmt: skip
        argv = [*selftest_cpu_argv(tiny_model, str(tmp_path / "r.json"), str(ROOT / SELFTEST_CPU_FIXTURE)), *extra]
        opts = parse_args(argv)
        plan = build_plan(opts, argv)
        a = opts.args
        assert config_block(plan) == {
            "model": a.model, "model_revision": a.model_revision, "dtype": a.dtype, "block_size": a.block_size,
            "block_size_chosen": opts.block_size_chosen,  # --block-size auto (the self-test's), as it was settled
            "max_tokens": a.max_tokens, "max_model_len": a.max_model_len, "seed": a.seed,
            "gpu_memory_utilization": a.gpu_memory_utilization, "kv_cache_tokens": a.kv_cache_tokens,
            "device": a.device, "suite": a.suite,
            "compare_native": a.compare_native, "reuses": a.reuses, "logprobs": a.logprobs,
            "kv_connector": a.kv_connector, "kv_connector_module_path": a.kv_connector_module_path,
            "lmcache_config": a.lmcache_config, "kv_audit": a.kv_audit, "keep_kv": a.keep_kv,
            "batch_invariant": a.batch_invariant, "frontend": a.frontend,
            "engine_layout": a.engine_layout or "one-process",  # the CPU's default
            "jobs": min(a.jobs or default_jobs(plan.engine, len(plan.arms)), len(plan.arms)),
            "decoding": "greedy, ignore_eos, enforce_eager",
        }  # fmt: skip


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--scenarios", "nope"], "declares no scenarios"),  # the self-test's fixture has none
        (["--kv-connector", "native"], "--kv-connector"),  # a name the kit gives its own arm
        (["--engine-layout", "one-process", "--device", "cuda"], "is for the CPU engine"),
        (["--kv-cache-tokens", "2047"], "--kv-cache-tokens 2047 is below --max-model-len 2048"),
    ],
)
def test_a_plan_that_cannot_be_made_is_one_usage_error(tiny_model, tmp_path, extra, message):
    with pytest.raises(UsageError, match=message):
        _selftest(tiny_model, tmp_path / "r.json", *extra)


def test_a_run_whose_options_are_emptied_once_planned_still_writes_its_report(setup, monkeypatch):  # noqa: F811
    """The rule, run: once the plan is made the options are emptied, and a whole run (the stand-in engine,
    native and native-matched, trials, the KV audit pass) completes; any stage that read them would fail."""
    from repro import verify

    real = verify.build_plan

    def plan_then_forget(opts: Options, argv: list[str]):
        plan = real(opts, argv)
        vars(opts.args).clear()
        return plan

    monkeypatch.setattr(verify, "build_plan", plan_then_forget)
    for name, value in _env(setup).items():
        monkeypatch.setenv(name, value)
    argv = _args(setup, "--kv-connector", "ExampleConnector", "--compare-native", "--trials", "2", "--quiet")
    assert verify.main(argv) == EXIT_OK
    report = json.loads(setup["report"].read_text())
    assert report["complete"] is True and report["conditions"]["trials"] == 2
    assert [a["name"] for a in report["arms"]] == ["baseline", "ExampleConnector", "native", "native-matched"]


# ---- (b) the rule, kept: nothing outside repro/plan/ and the entry points reads the options -----------------

ALLOWED = {"repro/verify.py", "repro/verify_kv_reuse.py"}  # the entry points: they parse, then plan
OPTIONS_MODULE = "repro.plan.options"
OPTIONS_NAMES = {"Options", "parse_args", "validate"}  # the parsed command line, and what makes it
READER = "opts"  # the name the options went by (`a`, the Namespace, came from `opts.args`)


def option_reads(source: str) -> list[str]:
    """What in one module's source reads the verifier's options: an import of Options or of what parses the
    command line into it, a parameter `opts` or an attribute read of it, or `options.args`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == OPTIONS_MODULE:
            found += [f"imports {a.name}" for a in node.names if a.name in OPTIONS_NAMES]
        elif isinstance(node, ast.ImportFrom) and node.module == "repro.plan":
            found += [f"imports {OPTIONS_MODULE}" for a in node.names if a.name == "options"]
        elif isinstance(node, ast.Import):
            found += [f"imports {a.name}" for a in node.names if a.name == OPTIONS_MODULE]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == READER or (node.value.id == "options" and node.attr == "args"):
                found.append(f"reads {node.value.id}.{node.attr}")
        elif isinstance(node, ast.arg) and node.arg == READER:
            found.append(f"takes {node.arg}")
    return found


def test_no_stage_after_the_plan_reads_the_options():
    offenders = {}
    for path in sorted((ROOT / "repro").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("repro/plan/") or rel in ALLOWED:
            continue
        if found := option_reads(path.read_text(encoding="utf-8")):
            offenders[rel] = found
    assert offenders == {}


def test_the_check_finds_each_way_of_reading_the_options():
    assert option_reads("from repro.plan.options import Options\n") == ["imports Options"]
    assert option_reads("from repro.plan.options import parse_args, FRONTEND_ENV\n") == ["imports parse_args"]
    assert option_reads("from repro.plan import options\n") == ["imports repro.plan.options"]
    assert option_reads("import repro.plan.options\n") == ["imports repro.plan.options"]
    assert option_reads("def f(opts):\n    return opts.args.model\n") == ["takes opts", "reads opts.args"]
    assert option_reads("x = options.args.model\n") == ["reads options.args"]
    assert option_reads("def f(plan):\n    return plan.engine.model, exc.args\n") == []  # a plan, an exception
    assert option_reads("def f(**options):\n    return options['x']\n") == []  # a function's own keywords
    assert option_reads("from repro.plan.options import FRONTEND_ENV\n") == []  # a constant is no reading
