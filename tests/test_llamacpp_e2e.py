"""llama.cpp behind the kit's boundary, end to end on the real engine (llama-cpp-python 0.3.36 in .venvs/llamacpp,
SmolLM2's GGUF): the self-test `make repro ENGINE=llamacpp` runs, judged by the one judge, and the state reader on
the real engine's blobs. Marker extended: make test-extended (CI) builds the environment and runs these."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_runs import shared_run
from kvkit_testutil import ROOT, need_llamacpp_python

pytestmark = [pytest.mark.e2e, pytest.mark.extended]


def _gguf(py: str) -> str:
    sys.path.insert(0, str(ROOT))
    import tasks

    return tasks.llamacpp_gguf(py)


def _selftest(_model, tmp) -> tuple[int, dict, str]:
    """The llama.cpp self-test as make repro ENGINE=llamacpp runs it (tasks.llamacpp_args), the verifier in this
    interpreter (the CPU environment's), its engines in .venvs/llamacpp."""
    import tasks

    py = need_llamacpp_python()
    report = tmp / "llamacpp.json"
    argv = [sys.executable, "-m", "repro.verify_kv_reuse", *tasks.llamacpp_args(_gguf(py), str(report), py)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=1500, check=False)  # fmt: skip
    return done.returncode, json.loads(report.read_text()), done.stdout + done.stderr


llamacpp_selftest = shared_run("llamacpp_selftest", _selftest)


def test_the_llamacpp_self_test_matches_its_fixture_and_exits_0(llamacpp_selftest):
    import tasks

    code, report, out = llamacpp_selftest
    assert code == 0, out[-3000:]
    assert report["acceptance"]["matched"] is True, report["acceptance"]
    versions = report["provenance"]["engine_versions"]
    assert versions["engine"] == "llama.cpp" and versions["llama_cpp_python"] == "0.3.36"
    build = versions["llamacpp_build"]  # the portable build that ran, hash-checked
    assert build["cmake_args"][0] == "-DGGML_NATIVE=OFF" and build["sdist_sha256"] == tasks.llamacpp_build.pin()[1]
    assert "llama.cpp (llama-cpp-python 0.3.36)" in out.splitlines()[0]  # the headline names the engine that ran


def test_the_planted_fault_fails_on_every_probe_with_exactly_its_blocks_blamed(llamacpp_selftest):
    _, report, _ = llamacpp_selftest
    arms = {a["name"]: a for a in report["arms"]}
    planted = arms["PlantedStateFault"]
    assert {p["name"] for p in planted["probes"]} == {"fixture", "chat-511", "chat-512", "chat-513"}
    for probe in planted["probes"]:
        assert probe["verdict"] == "FAIL", probe["name"]
        for req in probe["requests"][1:]:  # every reuse: a hit, and the 16 planted blocks
            assert req["cached_tokens"] == probe["prompt_tokens"] - 1
            assert req["kv_transfer_params"]["planted_fault"]["faulted_blocks"] == list(range(16))
        assert probe["kv"]["verdict"] == "CORRUPT"
        assert probe["kv"]["blame"]["blocks"] == list(range(16)), probe["kv"]["blame"]  # exactly those blamed
    for name in ("LlamaStateSeq", "PlantedStateFault-none", "native"):  # the clean paths: PASS, bit-exact
        for probe in arms[name]["probes"]:
            assert probe["verdict"] == "PASS" and probe["kv"]["verdict"] == "EXACT", (name, probe["name"])
            assert all(r["cached_tokens"] > 0 for r in probe["requests"][1:])


def test_the_state_reader_reads_the_real_engines_blob(tmp_path):
    """llama.cpp's own sequence state: every position once, f16 rows, and a restore of the altered blob gives back
    exactly the zeroed rows (the planted fault is what the engine then holds)."""
    py = need_llamacpp_python()
    script = """
import json, sys
sys.path.insert(0, sys.argv[2])
from repro.contract.job import ArmSpec, EngineConfig, ProbeJob, build_job
from repro.llamacpp import state
from repro.llamacpp.engine import Engine
job = build_job(ArmSpec("native", "native"), EngineConfig(sys.argv[1], None, "float16", 0, 0.1, 512, 16, "cpu"),
                [ProbeJob("p", {"token_ids": list(range(100, 160))}, 1)], max_tokens=4, logprobs=2)
eng = Engine.load(job)
eng.generate(list(range(100, 160)))
blob, tokens = eng.take_state()
st = state.parse(blob)
rows = st.rows(list(range(63)))
altered = state.zero_positions(st, list(range(16)))
read = eng.put_state(altered, tokens)
back = state.parse(eng.take_state()[0]).rows(list(range(63)))
print(json.dumps({"positions": sorted(st.positions), "tokens": len(tokens), "types": sorted({(l.k_type, l.v_type) for l in st.layers}),
                  "layers": len(st.layers), "row": int(rows.shape[-1]), "read": read, "v_trans": st.v_trans,
                  "zeroed": bool((back[:, :, :16] == 0).all()), "kept": bool((back[:, :, 16:] == rows[:, :, 16:]).all()),
                  "nonzero": bool(rows[:, :, :16].any())}))
"""
    out = subprocess.run([py, "-c", script, _gguf(py), str(ROOT)], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # 60 prompt tokens and 3 of the 4 generated (the last is sampled, never evaluated)
    assert got["positions"] == list(range(63)) and got["tokens"] == 63
    assert got["types"] == [[1, 1]] and got["layers"] == 30 and got["row"] == 3 * 64 * 2  # 3 KV heads of 64, f16
    assert got["read"] > 0
    assert got["nonzero"] and got["zeroed"] and got["kept"]


def _served_selftest(_model, tmp) -> tuple[int, dict, str]:
    """The self-test on llama-server as make repro ENGINE=llamaserver runs it (tasks.llamacpp_args, served), its
    llama-server the one make test-extended installed beside .venvs/llamacpp's interpreter."""
    import tasks

    py = need_llamacpp_python()
    if not (Path(py).parent / "llama-server").is_file():
        if os.environ.get("KVKIT_MAKE_TEST"):
            pytest.fail("llama-server is missing from .venvs/llamacpp/bin, though make test-extended builds it")
        pytest.skip("llama-server not built (make repro ENGINE=llamaserver builds it)")
    report = tmp / "llamaserver.json"
    argv = [sys.executable, "-m", "repro.verify_kv_reuse", *tasks.llamacpp_args(_gguf(py), str(report), py, True)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=1500, check=False)  # fmt: skip
    return done.returncode, json.loads(report.read_text()), done.stdout + done.stderr


llamaserver_selftest = shared_run("llamaserver_selftest", _served_selftest)


def test_llama_server_arms_are_judged_on_its_own_counters_and_its_kv_read_through_its_slot_files(llamaserver_selftest):
    """What holds on any machine, whatever the answers: the exit is the one exit rule's (0 only where the fixture's
    expectations hold, 1 where a verdict is not as stated, never an ERROR); the baseline's llama-server counted 0 on
    every request; a whole-prompt reuse keeps L-1 tokens (its last evaluated again) by llama-server's own count; the
    reused KV, read through /slots save files, is bit-identical to what the cache-off server computed (the same
    binary, the same batches: EXACT, floor 0), and a slot file altered before its restore is CORRUPT with exactly its
    blocks blamed; --cache-reuse's shifted KV is blamed past the donor's kept prefix and never in it, its control's is
    not; #27148's scenario ran every step with a counter on every request."""
    code, report, out = llamaserver_selftest
    assert code == (0 if report["acceptance"]["matched"] else 1), out[-3000:]
    arms = {a["name"]: a for a in report["arms"]}
    assert all(a["verdict"] != "ERROR" for a in arms.values()), {n: a["error"] for n, a in arms.items()}
    assert all(r["cached_tokens"] == 0 for p in arms["baseline"]["probes"] for r in p["requests"])
    for name in ("native", "LlamaServerSlots", "native-matched"):
        for probe in arms[name]["probes"]:
            assert probe["kv"]["verdict"] == "EXACT", (name, probe["name"], probe["kv"])
            hits = [r["cached_tokens"] for r in probe["requests"][1:]]
            if name != "native-matched":
                assert hits == [probe["prompt_tokens"] - 1] * len(hits), (name, probe["name"], hits)
    for probe in arms["PlantedSlotFault"]["probes"]:  # the served audit's positive control: exactly its blocks
        assert probe["verdict"] == "FAIL" and probe["kv"]["verdict"] == "CORRUPT", (probe["name"], probe["kv"])
        assert probe["kv"]["blame"]["blocks"] == list(range(16)), (probe["name"], probe["kv"]["blame"])
    # --cache-reuse, the positive control of a reuse approximate by design: the donor's first 32 positions kept as
    # they are, the rest shifted (a hit past them) and blamed only there; its control (0) keeps the 32 and no more
    for probe in arms["LlamaServerCacheReuse"]["probes"]:
        assert all(r["cached_tokens"] > 32 for r in probe["requests"][1:]), (probe["name"], probe["requests"])
        blame = probe["kv"]["blame"]["blocks"]
        assert probe["kv"]["verdict"] in ("CORRUPT", "FOREIGN", "MISPLACED") and blame and min(blame) >= 2, probe["kv"]
    for probe in arms["CacheReuse-control"]["probes"]:
        assert [r["cached_tokens"] for r in probe["requests"][1:]] == [32] * (len(probe["requests"]) - 1)
        assert probe["kv"]["verdict"] in ("EXACT", "NUMERIC"), (probe["name"], probe["kv"])
    restores = [
        r["kv_transfer_params"]["restore"] for p in arms["LlamaServerSlots"]["probes"] for r in p["requests"][1:]
    ]
    assert restores and all(r["n_restored"] > 0 for r in restores)
    versions = report["provenance"]["engine_versions"]
    assert (
        "commit 0c1e570" in versions["llama_server"]
        and versions["llama_server_build"]["cmake_args"][0] == "-DGGML_NATIVE=OFF"
    )
    assert versions["llama_server_sha256"] == versions["llama_server_build"]["binary_sha256"]
    scenario, unified = report["scenarios"]
    native = next(a for a in scenario["arms"] if a["arm"] == "native")
    assert [(r["step"], r["probe"]) for r in native["requests"]] == [
        (0, "conv-a"), (0, "conv-b"), (1, "conv-c"), (1, "conv-d"), (2, "conv-a"), (2, "conv-e"), (3, "conv-f"), (4, "conv-b")
    ]  # fmt: skip
    assert all(isinstance(r["cached_tokens"], int) and r["verdict"] in ("PASS", "FAIL") for r in native["requests"])
    native = next(a for a in unified["arms"] if a["arm"] == "native")  # #27148's second repro: sequential, unified
    assert unified["name"] == "issue-27148-unified" and len(native["requests"]) == 8
    assert all(isinstance(r["cached_tokens"], int) and r["verdict"] in ("PASS", "FAIL") for r in native["requests"])
    assert "llama.cpp (llama-server, from llama-cpp-python 0.3.36)" in out
