"""--batch-invariant: refused where vLLM has no batch-invariant kernels, asked of every child through
VLLM_BATCH_INVARIANT, and confirmed (or not) by what each arm's workers recorded; and the worker and
LMCache facts a maintainer asks for, gathered by the engine child."""

from __future__ import annotations

import json
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from types import SimpleNamespace

import pytest
from kvkit_testutil import have_vllm, run_cli

from repro.contract.result import ProbeResult, RequestResult
from repro.engine.audit_records import AuditRecords
from repro.engine.facts import lmcache_build, process_facts
from repro.engine.preflight import batch_invariant_requested, check_batch_invariant
from repro.errors import UsageError
from repro.judge.batch_invariance import (
    BATCH_INVARIANT_INACTIVE,
    BatchInvariance,
    batch_invariance_state,
    decide_batch_invariance,
)
from repro.judge.verdict import ERROR, FAIL, PASS, ArmVerdict
from repro.plan.options import parse_args
from repro.record.report import validate_report

FAKE = ["--engine-module", "tests.fake_engine"]


def worker(pid=11, platform="cuda", capability="9.0", mode=True, env=True, backends=(("FLASH_ATTN", True),)):
    return {
        "pid": pid,
        "pythonhashseed": "0",
        "platform": platform,
        "compute_capability": capability,
        "batch_invariant": {"env": env, "mode": mode},
        "attention_backends": None
        if backends is None
        else [{"name": n, "supports_batch_invariance": s} for n, s in backends],
        "problems": [],
    }


# ---- repro.judge.batch_invariance: active, inactive or unknown, from the workers' own facts -----------------------


def test_active_only_when_every_worker_confirms_mode_device_and_backend():
    assert batch_invariance_state([worker(), worker(pid=12, capability="8.0")]) == BatchInvariance(True, ())
    assert batch_invariance_state([worker(platform="xpu", capability=None)]).active is True


@pytest.mark.parametrize(
    ("facts", "said"),
    [
        (worker(mode=False, env=False), "vLLM's batch-invariant mode is off (VLLM_BATCH_INVARIANT not set"),
        (worker(mode=False, env=True), "vLLM's batch-invariant mode is off (VLLM_BATCH_INVARIANT set"),
        (worker(platform="cpu", capability=None), "for CUDA and XPU only, and this runs on cpu"),
        (worker(platform="rocm", capability="9.4"), "this runs on rocm"),
        (worker(capability="7.5"), "compute capability 7.5 is below 8.0"),
        (worker(backends=(("FLASHINFER", False),)), "attention backend FLASHINFER does not support batch invariance"),
    ],
)
def test_a_worker_that_says_otherwise_makes_the_arm_inactive(facts, said):
    state = batch_invariance_state([worker(pid=1), facts])
    assert state.active is False
    assert any(r.startswith("worker pid 11: ") and said in r for r in state.reasons), state.reasons


@pytest.mark.parametrize(
    ("workers", "said"),
    [
        (None, "no worker recorded its facts"),
        ([], "no worker recorded its facts"),
        ([worker(mode=None)], "mode was not recorded"),
        ([worker(capability=None)], "compute capability was not recorded"),
        ([worker(backends=None)], "the attention backend was not recorded"),
        ([worker(backends=(("X", None),))], "whether attention backend X supports batch invariance"),
        ([{"pid": 3, "problems": ["worker facts: boom"]}], "the platform was not recorded"),
    ],
)
def test_what_no_worker_recorded_is_unknown_never_assumed(workers, said):
    state = batch_invariance_state(workers)
    assert state.active is None
    assert any(said in r for r in state.reasons), state.reasons


def test_requested_but_not_confirmed_is_an_error_with_its_own_kind():
    fail = ArmVerdict(FAIL, ("p: reuse 1 differs",))
    inactive = batch_invariance_state([worker(capability="7.0")])
    got = decide_batch_invariance(fail, True, inactive)
    assert (got.verdict, got.error_kind) == (ERROR, BATCH_INVARIANT_INACTIVE)
    assert got.error_detail.startswith("batch-invariant kernels requested (--batch-invariant) but not active: ")
    assert got.reasons[0].startswith(f"{BATCH_INVARIANT_INACTIVE}: ") and got.reasons[1:] == fail.reasons
    unknown = decide_batch_invariance(ArmVerdict(PASS, ()), True, batch_invariance_state(None))
    assert unknown.verdict == ERROR and "but not confirmed active: no worker recorded" in unknown.error_detail
    # not requested, confirmed, or already an error: unchanged
    assert decide_batch_invariance(fail, False, inactive) is fail
    assert decide_batch_invariance(fail, True, BatchInvariance(True)) is fail
    crashed = ArmVerdict(ERROR, ("crash: x",), "crash", "x")
    assert decide_batch_invariance(crashed, True, inactive) is crashed


# ---- refusals: one line, exit 2, before anything runs ---------------------------------------------


@pytest.fixture
def argv(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    fixture = tmp_path / "fixture.json"
    fixture.write_text("{}")
    return ["--model", str(model), "--fixture", str(fixture), "--report", str(tmp_path / "r.json"), *FAKE]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--no-kv-audit"], "--batch-invariant needs the KV audit (drop --no-kv-audit)"),
        (["--device", "cpu"], "--batch-invariant: vLLM's batch-invariant kernels run on CUDA GPUs of compute"),
        (["--device", "auto"], "no GPU is visible (--device auto)"),
    ],
)
def test_refused_where_it_cannot_work(argv, monkeypatch, extra, message):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU for --device auto
    with pytest.raises(UsageError) as err:
        parse_args([*argv, "--batch-invariant", *extra])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_accepted_on_cuda_and_off_by_default(argv, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert parse_args([*argv, "--batch-invariant", "--device", "cuda"]).args.batch_invariant is True
    assert parse_args([*argv, "--device", "cpu"]).args.batch_invariant is False
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert parse_args([*argv, "--batch-invariant"]).args.batch_invariant is True


def test_the_preflight_refuses_a_device_without_the_kernels():
    assert check_batch_invariant(False, "cpu", None) is None
    assert check_batch_invariant(True, "cuda", (9, 0)) is None
    assert check_batch_invariant(True, "cuda", (8, 9)) is None
    assert check_batch_invariant(True, "xpu", None) is None
    assert check_batch_invariant(True, "cuda", (7, 5)) == (
        "--batch-invariant: compute capability 7.5 is below 8.0, vLLM's floor for them"
    )
    assert "could not be read" in check_batch_invariant(True, "cuda", None)
    assert "this runs on cpu" in check_batch_invariant(True, "cpu", None)
    assert [batch_invariant_requested({"VLLM_BATCH_INVARIANT": v}) for v in ("1", "0", "", "x", "2")] == [
        True,
        False,
        False,
        False,
        True,
    ]
    assert batch_invariant_requested({}) is False


# ---- the flag reaches every child, and the report says it ----------------------------------------


def _fake_run(tmp_path, *extra, caller_env="1"):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    fixture = tmp_path / "fixture.json"
    probes = [{"name": "p1", "prompt": {"token_ids": list(range(1, 40))}}]
    fixture.write_text(
        json.dumps(
            {"kind": "kvkit-fixture", "schema_version": 1, "name": "t", "tokenizer": {"name": "f"}, "probes": probes}
        )
    )
    report = tmp_path / "r.json"
    fake = {"echo_env": ["VLLM_BATCH_INVARIANT"]}
    args = ["--model", str(model), "--max-model-len", "256", "--max-tokens", "4", "--timeout", "60"]
    args += ["--fixture", str(fixture), "--report", str(report), "--force", "--kv-connector", "ExampleConnector"]
    args += ["--jobs", "1"]  # --force: a test's runs replace each other's report
    proc = run_cli([*args, *FAKE, *extra], env={"KVKIT_FAKE": json.dumps(fake), "VLLM_BATCH_INVARIANT": caller_env})
    assert proc.returncode in (0, 1, 3), proc.stderr
    data = json.loads(report.read_text())
    logs = [(tmp_path / "r.logs" / f"{a['name']}.log").read_text() for a in data["arms"]]
    return data, logs


def test_the_flag_decides_what_every_child_gets(tmp_path):
    on, logs = _fake_run(tmp_path, "--batch-invariant", "--device", "cuda")
    assert on["config"]["batch_invariant"] is True
    assert on["provenance"]["env"]["VLLM_BATCH_INVARIANT"] == "1"
    assert all("fake-engine: VLLM_BATCH_INVARIANT=1" in log for log in logs)
    off, logs = _fake_run(tmp_path, "--device", "cpu", caller_env="1")  # the caller's own setting does not leak in
    assert off["config"]["batch_invariant"] is False
    assert all("fake-engine: VLLM_BATCH_INVARIANT=0" in log for log in logs)


def test_the_schema_knows_the_flag_and_the_error_kind(tmp_path):
    data, _ = _fake_run(tmp_path, "--batch-invariant", "--device", "cuda")
    data["arms"][1]["error"] = {"kind": BATCH_INVARIANT_INACTIVE, "detail": "d", "log_tail": ""}
    data["arms"][1]["verdict"] = ERROR
    validate_report(data)


# ---- the engine child gathers what the workers recorded ------------------------------------------


def _probe(*records):
    reqs = tuple(
        RequestResult("cold" if i == 0 else "reuse", 0, (1,), (), "length", None, "", kv_audit_record=r)
        for i, r in enumerate(records)
    )
    return ProbeResult("p", (1, 2), None, reqs)


def test_the_child_gathers_one_entry_per_worker_and_decides_active(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    audit = AuditRecords(str(tmp_path))
    audit.primes.append({"probe": "p", "reuse": 1, "record": {"worker": worker(pid=12)}})
    probes = [_probe({"worker": worker()}, {"worker": worker()}, {"unavailable": "x"}), _probe(None)]
    facts = process_facts(probes, audit)
    assert [w["pid"] for w in facts["workers"]] == [11, 12]
    assert facts["pythonhashseed"] == "0"
    assert facts["batch_invariant"] == {"requested": True, "active": True, "reasons": []}
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    off = process_facts([_probe({"worker": worker(mode=False, env=False)})], AuditRecords(str(tmp_path)))
    assert off["batch_invariant"]["requested"] is False and off["batch_invariant"]["active"] is False


def test_without_the_audit_no_worker_facts_and_not_confirmed():
    facts = process_facts([_probe(None)], AuditRecords(None))
    assert facts["workers"] is None
    assert facts["batch_invariant"]["active"] is None
    assert facts["batch_invariant"]["reasons"] == ["the KV audit is off: no worker recorded its facts"]


def test_the_lmcache_build_is_read_from_its_compiled_ops(tmp_path, monkeypatch):
    pkg = tmp_path / "lmcache"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    blob = b"\x00libcudart.so.13\x00Cuda compilation tools, release 13.0, V13.0.88\x00"
    ops = pkg / f"cuda_ops{EXTENSION_SUFFIXES[0]}"  # a name this interpreter would load
    ops.write_bytes(blob)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "lmcache" or m.startswith("lmcache.")]:
        monkeypatch.delitem(sys.modules, name)
    build = lmcache_build()
    assert build["cuda_runtime"] == ["libcudart.so.13"] and build["nvcc"] == "13.0.88"
    assert build["torch_build"] == "not recorded in the wheel"
    assert build["cuda_ops"].startswith("not loaded: ImportError")  # not an ELF file: it cannot load
    ops.unlink()
    assert lmcache_build()["cuda_ops"] == "not shipped in this wheel"
    for name in [m for m in sys.modules if m == "lmcache" or m.startswith("lmcache.")]:
        monkeypatch.delitem(sys.modules, name)


# ---- the worker reads its own facts (real vLLM, no engine) ---------------------------------------


@pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")
def test_worker_facts_on_this_machine_and_with_attention_layers(monkeypatch):
    from repro.engine.worker_facts import worker_facts

    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    monkeypatch.setenv("PYTHONHASHSEED", "7")

    class Backend:
        @staticmethod
        def get_name():
            return "CPU_ATTN"

        @classmethod
        def supports_batch_invariance(cls):
            return False

    layers = {"model.layers.0.attn": SimpleNamespace(attn_backend=Backend), "model.norm": SimpleNamespace()}
    config = SimpleNamespace(compilation_config=SimpleNamespace(static_forward_context=layers))
    facts = worker_facts(config)
    assert facts["platform"] == "cpu" and facts["compute_capability"] is None
    assert facts["pythonhashseed"] == "7"
    assert facts["batch_invariant"]["env"] is True  # vLLM read the variable
    assert facts["batch_invariant"]["mode"] is False  # but nothing in this process installed the kernels
    assert facts["attention_backends"] == [{"name": "CPU_ATTN", "supports_batch_invariance": False}]
    assert facts["problems"] == []
    state = batch_invariance_state([facts])
    assert state.active is False and any("this runs on cpu" in r for r in state.reasons)
    bare = worker_facts(None)  # no model: the backend is a recorded problem, never an exception
    assert bare["attention_backends"] is None
    assert bare["problems"] == [
        "attention backend: LookupError: no attention layer registered in the static forward context"
    ]


def test_the_verifier_makes_an_unconfirmed_arm_an_error_and_leaves_others_alone():
    """repro.run.entries.arm_entry: with --batch-invariant an arm whose workers did not confirm the kernels
    is ERROR batch-invariant-inactive; without the flag the same arm keeps its verdict."""
    from repro.contract.job import ArmSpec
    from repro.contract.result import ArmResult
    from repro.plan.arms import PlannedArm
    from repro.run.entries import arm_entry
    from repro.run.runner import ArmOutcome

    req = RequestResult("cold", 0, (1, 2), (), "length", None, "")
    res = ArmResult("baseline", (ProbeResult("p", (1,), None, (req,)),), effective_config={"workers": []})
    outcome = ArmOutcome("baseline", res, None, None, "", 1.0)
    arm = PlannedArm(ArmSpec("baseline", "baseline"))
    on = arm_entry(arm, outcome, res, 16, "logs", batch_invariant=True)
    assert on["verdict"] == "ERROR" and on["error"]["kind"] == "batch-invariant-inactive"
    off = arm_entry(arm, outcome, res, 16, "logs", batch_invariant=False)
    assert off["verdict"] == "PASS" and off["error"] is None
