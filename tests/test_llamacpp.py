"""llama.cpp behind the kit's boundary, without llama.cpp: the sequence-state reader on blobs written to llama.cpp's
documented layout (src/llama-kv-cache.cpp state_write; the real engine's blobs are read in
tests/test_llamacpp_e2e.py), the planted fault's positions, the verifier's --engine llamacpp checks and the build's
cache key."""

from __future__ import annotations

import argparse
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from repro.errors import UsageError
from repro.llamacpp import arms, build
from repro.llamacpp import state as seqstate
from repro.plan import llamacpp as options


def _blob(positions, n_layer=2, row=8, v_trans=False, seed=0) -> tuple[bytes, np.ndarray]:
    """A single-stream sequence state as llama.cpp writes it; rows[layer, k/v, cell] are the bytes per cell."""
    rng = np.random.default_rng(seed)
    cells = len(positions)
    rows = rng.integers(1, 255, size=(n_layer, 2, cells, row), dtype=np.uint8)
    out = struct.pack("<Ii", seqstate.MAGIC, 0) + struct.pack("<I", 1) + struct.pack("<I", cells)
    for p in positions:
        out += struct.pack("<iIi", p, 1, 0)
    out += struct.pack("<II", int(v_trans), n_layer)
    for layer in range(n_layer):
        out += struct.pack("<iQ", 1, row) + rows[layer, 0].tobytes()
    for layer in range(n_layer):
        if not v_trans:
            out += struct.pack("<iQ", 1, row) + rows[layer, 1].tobytes()
        else:  # per element j, every cell's element j (2-byte elements)
            out += struct.pack("<iII", 1, 2, row // 2)
            v = rows[layer, 1].reshape(cells, row // 2, 2)
            out += b"".join(v[:, j, :].tobytes() for j in range(row // 2))
    return out, rows


@pytest.mark.parametrize("v_trans", [False, True])
def test_the_reader_gives_each_position_its_k_and_v_rows_whatever_the_cell_order(v_trans):
    positions = [3, 0, 2, 1]  # cache order is not position order
    blob, rows = _blob(positions, v_trans=v_trans)
    st = seqstate.parse(blob)
    assert st.positions == tuple(positions) and st.v_trans is v_trans and len(st.layers) == 2
    got = st.rows([0, 1, 2, 3])
    for i, p in enumerate([0, 1, 2, 3]):
        cell = positions.index(p)
        assert (got[:, :, i] == rows[:, :, cell]).all()


@pytest.mark.parametrize("v_trans", [False, True])
def test_the_planted_fault_zeroes_exactly_the_named_positions_k_and_v_in_every_layer(v_trans):
    blob, _ = _blob([0, 1, 2, 3, 4, 5], v_trans=v_trans, seed=1)
    st = seqstate.parse(blob)
    out = seqstate.parse(seqstate.zero_positions(st, [1, 4]))
    after = out.rows(list(range(6)))
    assert not after[:, :, [1, 4]].any()
    assert (after[:, :, [0, 2, 3, 5]] == st.rows([0, 2, 3, 5])).all()
    assert len(out.blob) == len(blob)


def test_a_slot_of_a_server_with_one_kv_stream_per_slot_is_read_from_its_own_stream():
    """llama-server's slots without a unified KV: one stream per slot; a slot's state holds its cells in its stream
    and writes the others empty (cell count 0), before or after it."""
    blob, rows = _blob([1, 0, 2])
    head, body = blob[:8], blob[12:]  # magic and seq id; after the stream count
    for streams in (struct.pack("<I", 3) + struct.pack("<I", 0) + body + struct.pack("<I", 0),
                    struct.pack("<I", 2) + body + struct.pack("<I", 0)):  # fmt: skip
        st = seqstate.parse(head + streams)
        assert st.positions == (1, 0, 2) and (st.rows([1])[:, :, 0] == rows[:, :, 0]).all()


def test_a_slot_file_is_the_sequence_state_behind_llamacpps_sequence_file_header():
    from repro.llamacpp.served import SEQ_FILE_MAGIC, read_slot_file

    blob, _ = _blob([0, 1])
    raw = struct.pack("<III", SEQ_FILE_MAGIC, 3, 2) + struct.pack("<2i", 11, 12) + blob[8:]  # a plain token list
    state, tokens, head = read_slot_file(raw)
    assert tokens == [11, 12] and head == 20 and state == blob and seqstate.parse(state).positions == (0, 1)
    # llama-server's packed tokens (server_tokens::serialize): -1, format 1, the count, the tokens, 0 media chunks
    raw = struct.pack("<III", SEQ_FILE_MAGIC, 3, 6) + struct.pack("<6i", -1, 1, 2, 11, 12, 0) + blob[8:]
    state, tokens, head = read_slot_file(raw)
    assert tokens == [11, 12] and head == 36 and state == blob
    with pytest.raises(seqstate.StateFormatError, match="not llama-server's packed format 1 with no media"):
        read_slot_file(struct.pack("<III", SEQ_FILE_MAGIC, 3, 6) + struct.pack("<6i", -1, 1, 2, 11, 12, 1) + blob[8:])
    with pytest.raises(seqstate.StateFormatError, match="not llama.cpp's sequence file"):
        read_slot_file(struct.pack("<III", SEQ_FILE_MAGIC, 2, 0))


def test_the_reader_refuses_what_it_cannot_read_as_written():
    blob, _ = _blob([0, 1])
    with pytest.raises(seqstate.StateFormatError, match="ends at byte"):
        seqstate.parse(blob[:-3])
    with pytest.raises(seqstate.StateFormatError, match="after the last layer"):
        seqstate.parse(blob + b"\0")
    with pytest.raises(seqstate.StateFormatError, match="streams 0 and 1 both hold cells"):
        seqstate.parse(blob[:8] + struct.pack("<I", 2) + blob[12:] + blob[12:])
    with pytest.raises(seqstate.StateFormatError, match="not llama.cpp's sequence state"):
        seqstate.parse(b"\0" * 4 + blob[4:])
    with pytest.raises(seqstate.StateFormatError, match="no cell at positions"):
        seqstate.parse(blob).rows([0, 7])
    assert seqstate.parse(struct.pack("<IiII", seqstate.MAGIC, 0, 1, 0)).cells == 0  # an empty sequence


def test_the_planted_positions_are_whole_blocks_of_the_reused_prefix():
    head = arms.planted_positions({"fault": "zero_blocks", "first_block": 0, "num_blocks": 2}, 100, 16)
    assert head == list(range(32))
    tail = arms.planted_positions({"fault": "zero_blocks", "first_block": -1, "num_blocks": 1}, 100, 16)
    assert tail == list(range(80, 96))  # 100 reused positions: 6 full blocks, the last is block 5
    assert arms.planted_positions({"fault": "zero_blocks", "first_block": 5, "num_blocks": 4}, 100, 16) == list(
        range(80, 96)
    )  # only blocks the reuse takes
    assert arms.planted_positions({"fault": "none"}, 100, 16) == []


def _args(tmp_path, model_bytes=b"GGUF\x03\x00\x00\x00", **over) -> argparse.Namespace:
    model = tmp_path / "m.gguf"
    model.write_bytes(model_bytes)
    base = {"model": str(model), "kv_connector": None, "kv_offloading_size": None, "lmcache_config": None,
            "scenarios": None, "batch_invariant": False, "gpu_load": False, "stream": False, "frontend": "sync",
            "device": "cpu", "engine_module": "stand.in", "python": "/nonexistent"}  # fmt: skip
    return argparse.Namespace(**(base | over))


def test_the_verifiers_llamacpp_checks_are_one_line_each(tmp_path):
    options.check(_args(tmp_path), "repro.engine")  # a stand-in module is kept, and nothing is asked of --python
    with pytest.raises(UsageError, match="not a GGUF file"):
        options.check(_args(tmp_path, b"PK\x03\x04"), "repro.engine")
    with pytest.raises(UsageError, match="no such file"):
        options.check(_args(tmp_path, model=str(tmp_path / "absent.gguf")), "repro.engine")
    with pytest.raises(UsageError, match="--kv-connector: llama.cpp's reuse paths"):
        options.check(_args(tmp_path, kv_connector="LMCacheConnectorV1"), "repro.engine")
    with pytest.raises(UsageError, match="--frontend async is vLLM's"):
        options.check(_args(tmp_path, frontend="async"), "repro.engine")
    with pytest.raises(UsageError, match="--scenarios: llama.cpp's scenarios run on llama-server"):
        options.check(_args(tmp_path, scenarios="all"), "repro.engine")
    options.check(_args(tmp_path, frontend="server", scenarios="all"), "repro.engine")  # llama-server's scenarios
    with pytest.raises(UsageError, match="for the CPU"):
        options.check(_args(tmp_path, device="cuda"), "repro.engine")
    args = _args(tmp_path, engine_module="repro.engine")
    with pytest.raises(UsageError, match="--python /nonexistent: cannot be run"):
        options.check(args, "repro.engine")
    assert args.engine_module == options.MODULE


def test_the_build_cache_is_keyed_by_the_flags_and_holds_only_finished_builds(tmp_path, monkeypatch):
    version, sha = build.pin()
    assert version == "0.3.36" and len(sha) == 64
    assert "-DGGML_NATIVE=OFF" in build.CMAKE_ARGS  # portable: the native build dies with SIGILL on AMX VMs
    key = build.cache_key(version, sha, "cp311", "x86_64")
    assert key == build.cache_key(version, sha, "cp311", "x86_64") != build.cache_key(version, sha, "cp312", "x86_64")
    monkeypatch.setattr(build, "CMAKE_ARGS", ("-DGGML_NATIVE=ON", *build.CMAKE_ARGS[1:]))
    assert build.cache_key(version, sha, "cp311", "x86_64") != key  # a native build is another wheel
    folder = tmp_path / key
    folder.mkdir()
    (folder / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl").write_bytes(b"w")
    assert build.cached_wheel(folder) is None  # no build record: not a finished build
    (folder / build.BUILD_RECORD).write_text("{}")
    assert build.cached_wheel(folder).name.endswith(".whl")
    assert build.cache_dir({build.CACHE_ENV: str(tmp_path)}) == tmp_path
    assert build.cache_dir({"XDG_CACHE_HOME": "/x"}).as_posix() == "/x/kvkit/wheels"


def test_the_build_never_takes_pips_cached_wheel_and_records_itself(tmp_path, monkeypatch):
    """pip's wheel cache is keyed by the sdist alone: a native wheel built earlier would come back for a portable
    request (a fresh clone's first build took it in 0.6 s). The kit builds with --no-cache-dir and the portable flags,
    checks the sdist's hash, and keeps the wheel under its key with how long it took."""
    calls = []

    def run(cmd, **kw):
        calls.append((cmd, kw.get("env")))
        if "-c" in cmd:  # the Python tag
            return subprocess.CompletedProcess(cmd, 0, stdout="cp311\n")
        out = Path(cmd[cmd.index("-w") + 1])
        (out / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl").write_bytes(b"wheel")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(build.subprocess, "run", run)
    with open(tmp_path / "log", "w") as log:
        wheel, record = build.ensure_wheel("py", log, environ={build.CACHE_ENV: str(tmp_path / "cache")})
    (cmd, env), *_ = [c for c in calls if "wheel" in c[0]]
    assert {"--no-cache-dir", "--require-hashes", "--no-deps"} <= set(cmd) and cmd[
        cmd.index("--no-binary") + 1
    ] == build.PACKAGE
    assert env["CMAKE_ARGS"].split() == list(build.CMAKE_ARGS)
    assert wheel.parent.name == build.cache_key(*build.pin(), "cp311") and record["build_s"] >= 0
    assert record["cmake_args"] == list(build.CMAKE_ARGS) and record["wheel_sha256"]
    calls.clear()
    with open(tmp_path / "log", "a") as log:  # the second time: the kit's cache, nothing built
        assert build.ensure_wheel("py", log, environ={build.CACHE_ENV: str(tmp_path / "cache")})[0] == wheel
    assert not [c for c in calls if "wheel" in c[0]]


def test_a_probe_asking_what_llamacpps_child_does_not_send_is_refused_not_run_without_it():
    """A salted, adapted, imaged or prompt-logprob probe, or one with a prompt between its requests, would run plain and
    be judged as asked: the child refuses it (the arm's ERROR names why) before any request."""
    from repro.contract.job import ArmSpec, EngineConfig, ProbeJob, build_job

    def job(**prompt):
        probe = ProbeJob("p", {"token_ids": [1, 2, 3], **prompt}, 2)
        return build_job(ArmSpec("native", "native"), EngineConfig("m.gguf", None, "float16", 0, 0.1, 512, 16, "cpu"),
                         [probe], max_tokens=4, logprobs=2)  # fmt: skip

    assert arms.refused(job()) is None
    assert arms.refused(job(cache_salt="tenant-a")) == (
        "probe p asks for a tenant salt (cache_salt), which llama.cpp's child does not send"
    )
    assert "a LoRA adapter" in arms.refused(job(adapter={"label": "A"}))
    assert "prompt logprobs" in arms.refused(job(prompt_logprobs=2))
    with pytest.raises(ValueError, match="an image"):
        arms.run(None, job(image={"seed": 1}), None)  # refused before the engine is touched


def _served_job(arm, probes=None, scenario=None, max_num_seqs=None, kv_unified=None):
    from repro.contract.job import EngineConfig, ProbeJob, ScenarioJob, StepJob, build_job

    engine = EngineConfig(
        "m.gguf", None, "float16", 7, 0.1, 2048, 16, "cpu", max_num_seqs=max_num_seqs, kv_unified=kv_unified
    )
    probes = probes or [ProbeJob("p", {"token_ids": [1, 2, 3]}, 2)]
    job = build_job(arm, engine, probes, max_tokens=16, logprobs=2)
    if scenario:
        from dataclasses import replace

        job = replace(job, scenario=ScenarioJob("s", (StepJob(("p",), True),)))
    return job


def test_each_served_arm_gets_its_own_llama_servers_flags_and_the_baseline_no_cache_at_all():
    """The baseline: no RAM prompt cache and cache_prompt off on every request; native: llama-server's defaults (no
    cache flag given); native-matched: no RAM cache, so the primed prefix is all a reuse can find; the slots arm
    saves where its store is; a scenario runs max_num_seqs slots, each of max_model_len tokens."""
    from repro.contract.job import ArmSpec, ConnectorSpec, ProbeJob
    from repro.llamacpp import served

    base, cache = served.flags(_served_job(ArmSpec("baseline", "baseline")), 2, "/s")
    assert cache is False and base[base.index("--cache-ram") + 1] == "0" and base[base.index("-np") + 1] == "1"
    assert base[base.index("--seed") + 1] == "7" and base[base.index("-c") + 1] == "2048"
    native, cache = served.flags(_served_job(ArmSpec("native", "native")), 2, "/s")
    assert cache is True and "--cache-ram" not in native and "--cache-idle-slots" not in native
    matched = _served_job(ArmSpec("native-matched", "native"), [ProbeJob("p", {"token_ids": [1, 2, 3]}, 2, (2,))])
    assert served.flags(matched, 2, "/s")[0][-2:] == ["--cache-ram", "0"]
    slots = ArmSpec("S", "connector", ConnectorSpec(served.SLOTS, extra_config={"store_dir": "/tmp/store"}))
    args, cache = served.flags(_served_job(slots), 2, "/tmp/store")
    assert cache is True and args[args.index("--slot-save-path") + 1] == "/tmp/store" and "--cache-ram" in args
    two, _ = served.flags(_served_job(ArmSpec("native", "native"), scenario=True, max_num_seqs=2), 2, "/s")
    assert two[two.index("-np") + 1] == "2" and two[two.index("-c") + 1] == "4096"
    assert "--kv-unified" not in two and "--no-kv-unified" not in two  # unset: llama-server's own default
    for unified, flag in ((True, "--kv-unified"), (False, "--no-kv-unified")):
        job = _served_job(ArmSpec("native", "native"), scenario=True, max_num_seqs=2, kv_unified=unified)
        assert flag in served.flags(job, 2, "/s")[0]
    with pytest.raises(ValueError, match="llama-server has no connector 'LlamaStateSeq'"):
        served.flags(_served_job(ArmSpec("X", "connector", ConnectorSpec("LlamaStateSeq"))), 2, "/s")


def test_the_cache_reuse_arm_shifts_what_its_donor_holds_and_refuses_a_config_it_cannot_run():
    """LlamaServerCacheReuse: llama-server's --cache-reuse at min_chunk (0: its control, no shifting), no RAM prompt
    cache, cache_prompt on; its donor is the probe's prompt with the inserted tokens before token insert_at; a
    setting it cannot run is one line, before any server starts."""
    from repro.contract.job import ArmSpec, ConnectorSpec
    from repro.llamacpp import served

    def arm(**extra):
        return _served_job(ArmSpec("C", "connector", ConnectorSpec(served.CACHE_REUSE, extra_config=extra)))

    args, cache = served.flags(arm(min_chunk=16, insert_at=32, insert_text=" x"), 2, "/s")
    assert cache is True and args[-4:] == ["--cache-ram", "0", "--cache-reuse", "16"]
    assert served.flags(arm(min_chunk=0, insert_at=32, insert_text=" x"), 2, "/s")[0][-1] == "0"
    assert served.donor_ids([1, 2, 3, 4], 2, [9, 9]) == [1, 2, 9, 9, 3, 4]
    with pytest.raises(ValueError, match="insert_at 3 leaves nothing to shift in a 4-token prompt"):
        served.donor_ids([1, 2, 3, 4], 3, [9])
    for bad, said in (
        ({"min_chunk": -1, "insert_at": 32, "insert_text": " x"}, "extra_config.min_chunk must be a whole number"),
        ({"min_chunk": 16, "insert_at": True, "insert_text": " x"}, "extra_config.insert_at must be a whole number"),
        ({"min_chunk": 16, "insert_at": 32, "insert_text": " "}, "extra_config.insert_text must be a non-empty"),
    ):
        with pytest.raises(ValueError, match=said):
            served.flags(arm(**bad), 2, "/s")


def test_kv_unified_is_a_scenarios_setting_for_llama_server_that_vllms_child_refuses():
    """A scenario's kv_unified reaches the job's engine (and its JSON, both ways); vLLM's child refuses it in one
    line rather than run the scenario without it."""
    from dataclasses import replace

    from repro.contract.job import ArmSpec, EngineConfig
    from repro.engine.engine_args import engine_kwargs

    job = _served_job(ArmSpec("native", "native"), scenario=True, max_num_seqs=2, kv_unified=True)
    assert EngineConfig.from_json(job.engine.to_json()).kv_unified is True
    assert "kv_unified" not in replace(job.engine, kv_unified=None).to_json()
    with pytest.raises(ValueError, match="kv_unified True is llama-server's --kv-unified: vLLM has no such setting"):
        engine_kwargs(job)


def test_a_served_answer_without_llama_servers_counter_is_missing_never_zero():
    """timings.cache_n is the hit counter; a response without it says None (the judge's missing counter), and the
    answer's token IDs and top log-probabilities are read as llama-server writes them."""
    from repro.llamacpp.server import answer_of, greedy_body

    got = answer_of({"tokens": [5, 6], "stop_type": "limit", "id_slot": 1, "content": "ab",
                     "timings": {"cache_n": 0, "prompt_n": 9},
                     "completion_probabilities": [{"id": 5, "logprob": -0.1, "top_logprobs": [
                         {"id": 5, "logprob": -0.1}, {"id": 9, "logprob": -2.5}]}]})  # fmt: skip
    assert got["cached_tokens"] == 0 and got["token_ids"] == [5, 6] and got["logprobs"] == [[[5, -0.1], [9, -2.5]]]
    assert answer_of({"tokens": [5], "stop_type": "limit"})["cached_tokens"] is None
    assert answer_of({"content": "text only"})["token_ids"] == []  # the judge refuses an answer without IDs
    body = greedy_body([1, 2], 16, 2, False, 0, 3)
    assert body["cache_prompt"] is False and body["ignore_eos"] is True and body["return_tokens"] is True
    assert body["temperature"] == 0.0 and body["top_k"] == 1 and body["id_slot"] == 0 and body["n_probs"] == 2
    assert "id_slot" not in greedy_body([1], 16, 0, True, None, 3)  # a scenario's requests: the server picks


def test_the_served_self_test_needs_llama_server_beside_its_interpreter(tmp_path):
    py = tmp_path / "bin" / "python"
    py.parent.mkdir()
    assert "has no llama-server beside it" in options.llamaserver_problem(str(py))
    server = py.parent / "llama-server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    assert options.llamaserver_problem(str(py)) is None


def test_the_planted_slot_fault_zeroes_exactly_its_blocks_in_the_saved_file_and_keeps_its_header(tmp_path):
    """PlantedSlotFault alters the slot file llama-server saved, before its restore: the named blocks' K and V rows
    zeroed in every layer, among the positions the reuse will keep, the file's header and tokens as saved; what it
    reports is what the judge's blame reads."""
    from repro.contract.job import ArmSpec, ConnectorSpec
    from repro.llamacpp.served import PLANTED_SLOTS, SEQ_FILE_MAGIC, ServedArm, read_slot_file

    blob, _ = _blob(list(range(40)), seed=3)  # as llama-server writes a slot: its tokens packed
    head = struct.pack("<III", SEQ_FILE_MAGIC, 3, 44) + struct.pack("<44i", -1, 1, 40, *range(40), 0)
    path = tmp_path / "000.bin"
    path.write_bytes(head + blob[8:])
    extra = {"fault": "zero_blocks", "first_block": 0, "num_blocks": 1, "store_dir": str(tmp_path)}
    arm = ArmSpec("P", "connector", ConnectorSpec(PLANTED_SLOTS, extra_config=extra))
    served_arm = ServedArm(_served_job(arm), None, str(tmp_path), 2)
    said = served_arm.plant(path, list(range(40)))
    assert said == {"planted_fault": {"fault": "zero_blocks", "faulted_blocks": [0]}}
    raw = path.read_bytes()
    assert raw[: len(head)] == head and len(raw) == len(head) + len(blob) - 8
    state, tokens, _ = read_slot_file(raw)
    before, after = seqstate.parse(blob).rows(list(range(40))), seqstate.parse(state).rows(list(range(40)))
    assert tokens == list(range(40)) and not after[:, :, :16].any() and (after[:, :, 16:] == before[:, :, 16:]).all()
    with pytest.raises(ValueError, match="fault 'flip' is not one of"):
        bad = ArmSpec("P", "connector", ConnectorSpec(PLANTED_SLOTS, extra_config={**extra, "fault": "flip"}))
        ServedArm(_served_job(bad), None, str(tmp_path), 2).plant(path, list(range(40)))
