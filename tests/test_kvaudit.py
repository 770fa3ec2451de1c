"""The KV audit without an engine: K/V plane splitting per layout, the comparison's figures and the
sources it names on real tensors, the parent's classes, floor and verdicts (repro.judge.kvaudit), and the
recorder's bookkeeping of an asynchronous load across vLLM's calls (scheduler and worker halves)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from repro.contract.result import ArmResult, ProbeResult, RequestResult
from repro.engine import kvcompare
from repro.engine.kv_blocks import detect_layout, split_planes
from repro.engine.kvaudit_hooks import AuditRequest
from repro.judge.kv_grid import dense_planes
from repro.judge.kvaudit import annotate, arm_floor, compare_job

H, BS, D, NB = 2, 4, 3, 10


def test_layouts_split_k_and_v_where_each_backend_keeps_them():
    kv = torch.arange(NB * H * BS * 2 * D, dtype=torch.float32).reshape(NB, H, BS, 2 * D)
    # last-dim (FlashAttention since vLLM 0.26): K|V packed in the last dimension
    planes = split_planes(kv, [3, 1], "last-dim")
    assert planes.shape == (2, 2, H * BS * D)
    assert torch.equal(planes[0, 0], kv[3, :, :, :D].reshape(-1))
    assert torch.equal(planes[1, 1], kv[1, :, :, D:].reshape(-1))
    # cpu-rows (vLLM's CPU backend): per head, all K rows then all V rows
    planes = split_planes(kv, [3], "cpu-rows")
    rows = kv[3].reshape(H, 2 * BS, D)
    assert torch.equal(planes[0, 0], rows[:, :BS].reshape(-1))
    assert torch.equal(planes[0, 1], rows[:, BS:].reshape(-1))
    # leading-2: K and V first
    kv2 = torch.arange(2 * NB * BS * H * D, dtype=torch.float32).reshape(2, NB, BS, H, D)
    planes = split_planes(kv2, [5], "leading-2")
    assert torch.equal(planes[0, 0], kv2[0, 5].reshape(-1)) and torch.equal(planes[0, 1], kv2[1, 5].reshape(-1))


def test_layout_detection_and_an_unknown_layout():
    assert detect_layout(torch.zeros(NB, H, BS, 2 * D), NB, D) == "cpu-rows"
    assert detect_layout(torch.zeros(2, NB, BS, H, D), NB, D) == "leading-2"
    assert detect_layout(torch.zeros(NB, H, BS, D), NB, D) is None  # K only: not a layout the audit can read
    assert detect_layout(torch.zeros(NB + 1, H, BS, 2 * D), NB, D) is None  # blocks not on dim 0


def test_which_blocks_a_request_reused_or_computed():
    def req(local, ext, scheduled, prompt=70):
        return AuditRequest(0, "r", "sha", prompt, list(range(9)), local, ext, scheduled, False)

    assert req(0, 48, 70).reused_blocks(16) == [0, 1, 2] and req(0, 48, 70).computed_blocks(16) == []
    assert req(32, 0, 70).reused_blocks(16) == [0, 1]  # native: the local hit
    assert req(0, 0, 70).computed_blocks(16) == [0, 1, 2, 3]  # full prompt blocks only
    assert req(0, 0, 40).computed_blocks(16) == [0, 1]  # a chunk: what this step computed


def _write(directory, seq, kind, layers):
    directory.mkdir(parents=True, exist_ok=True)
    for li, t in enumerate(layers):
        torch.save(t, directory / f"{seq:06d}.{kind}.{li:03d}.pt")


def _reference(seed, n=6, layers=2):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 2, 24, generator=g).half() for _ in range(layers)]


def test_the_comparison_measures_every_cell_and_names_what_wrong_bytes_equal(tmp_path):
    ref, other = _reference(1), _reference(2)
    _write(tmp_path / "base", 0, "computed", ref)
    _write(tmp_path / "base", 1, "computed", other)
    loaded = [t.clone() for t in ref]
    loaded[0][1] = ref[0][4]  # block 1 <- block 4 (a shift)
    loaded[0][2, 1] = ref[0][2, 0]  # block 2's V <- its own K
    loaded[1][3] = 0  # block 3 zeroed in layer 1
    loaded[1][5] = other[1][5]  # block 5 <- the other prompt's block 5 (stale)
    loaded[0][0, 0] = loaded[0][0, 0] * 1.01  # a small numeric difference, matching nothing
    _write(tmp_path / "arm", 7, "reused", loaded)
    job = {
        "reference": {"dir": str(tmp_path / "base"), "probes": {"p": 0, "q": 1}},
        "arms": [{"name": "A", "dir": str(tmp_path / "arm"), "requests": [
            {"probe": "p", "index": 1, "seq": 7, "kind": "reused", "layers": 2},
            {"probe": "missing", "index": 1, "seq": 7, "kind": "reused", "layers": 2},
        ]}],
    }  # fmt: skip
    out = kvcompare.run(json.loads(json.dumps(job)))
    got = out["arms"]["A"]["p"]["1"]
    assert got["error"] is None and got["num_blocks"] == 6
    ident = {p: got["planes"][p]["identical"] for p in ("K", "V")}
    assert ident["K"][0] == [False, False, True, True, True, True]
    assert ident["V"][0] == [True, False, False, True, True, True]
    assert ident["K"][1] == ident["V"][1] == [True, True, True, False, True, False]
    sources = {(m["layer"], m["plane"], m["block"]): m["source"] for m in got["matches"]}
    assert sources == {
        (0, "K", 1): "block 4",
        (0, "V", 1): "block 4",
        (0, "V", 2): "its K plane",
        (1, "K", 3): "zeros",
        (1, "V", 3): "zeros",
        (1, "K", 5): "probe q block 5",
        (1, "V", 5): "probe q block 5",
    }
    assert 0.005 < got["planes"]["K"]["rel"][0][0] < 0.02  # the 1 % scale, measured
    assert got["planes"]["K"]["rel"][1][3] == 1.0  # zeros: the whole reference is the error
    assert "no reference KV" in out["arms"]["A"]["missing"]["1"]["error"]


def test_identical_bytes_measure_zero_unless_they_are_not_numbers_and_the_report_keeps_only_the_rest(tmp_path):
    """What the report's compact grid (schema_version 3, repro.judge.kv_grid) relies on: a bit-identical cell's
    figures are 0, so the runs leave it out; one whose KV holds NaN measures null, and is kept in a run."""
    ref = _reference(3, n=3, layers=1)
    ref[0][2, 1] = float("nan")  # block 2's V: bit-identical in the reuse, but not a number
    loaded = [t.clone() for t in ref]
    loaded[0][1, 0] = loaded[0][1, 0] * 1.5  # block 1's K: wrong
    _write(tmp_path / "base", 0, "computed", ref)
    _write(tmp_path / "arm", 7, "reused", loaded)
    job = {"reference": {"dir": str(tmp_path / "base"), "probes": {"p": 0}},
           "arms": [{"name": "A", "dir": str(tmp_path / "arm"),
                     "requests": [{"probe": "p", "index": 1, "seq": 7, "kind": "reused", "layers": 1}]}]}  # fmt: skip
    got = kvcompare.run(json.loads(json.dumps(job)))["arms"]["A"]["p"]["1"]
    planes = got["planes"]
    assert planes["K"]["identical"] == [[True, False, True]] and planes["V"]["identical"] == [[True, True, True]]
    assert planes["K"]["max_abs"][0][0] == planes["K"]["rel"][0][0] == 0.0 == planes["V"]["rel"][0][1]
    assert planes["V"]["max_abs"][0][2] is None and planes["V"]["rel"][0][2] is None
    entries = _entries()
    annotate(entries, _results(_record(1, reused=3)), {"arms": {"A": {"p": {"1": got}}}}, None, 16)
    stored = entries[1]["probes"][0]["requests"][1]["kv_audit"]["planes"]
    assert stored["K"]["class"][0][0] == stored["V"]["class"][0][2] == "e"
    assert [(r["layer"], r["first_block"], len(r["rel"])) for r in stored["K"]["runs"]] == [(0, 1, 1)]
    assert stored["V"]["runs"] == [{"layer": 0, "first_block": 2, "max_abs": [None], "rel": [None]}]
    assert dense_planes(stored)["V"]["rel"] == [[0.0, 0.0, None]]


def _record(seq, reused=0, computed=0, **extra):
    return {
        "seq": seq, "prompt_sha256": "x", "block_size": 16, "local_tokens": 0, "external_tokens": 16 * reused,
        "reused_blocks": reused, "computed_blocks": computed, "layers": ["l0"], "layout": "cpu-rows",
        "kv_shape": [9, 2, 16, 8], "dtype": "float32", "unavailable": None, **extra,
    }  # fmt: skip


def _req(role, record):
    return RequestResult(role, 0 if role == "cold" else 32, (1, 2), (), "length", None, "t", kv_audit_record=record)


def _planes(identical, rel):
    return {
        p: {
            "identical": [list(identical[p])],
            "rel": [list(rel[p])],
            "max_abs": [[0.0 if i else 1.0 for i in identical[p]]],
        }
        for p in ("K", "V")
    }


def _entries():
    def probe(name):
        reqs = [{"role": "cold"}, {"role": "reuse"}]
        return {"name": name, "verdict": "PASS", "reasons": [], "requests": reqs}

    return [
        {"name": "baseline", "mode": "baseline", "verdict": "PASS", "probes": [probe("p")]},
        {"name": "A", "mode": "connector", "verdict": "PASS", "probes": [probe("p")]},
    ]


def _results(reuse_record):
    base = ArmResult("baseline", (ProbeResult("p", (1,), None, (_req("cold", _record(0, computed=2)),)),),
                     kv_audit={"dir": "/b", "errors": []})  # fmt: skip
    arm = ArmResult("A", (ProbeResult("p", (1,), None, (_req("cold", _record(0, computed=2)), _req("reuse", reuse_record))),),
                    kv_audit={"dir": "/a", "errors": []})  # fmt: skip
    return {"baseline": base, "A": arm}


def _raw(cold_rel, reuse_identical, reuse_rel):
    same = {"K": [True, True], "V": [True, True]}
    cold_same = {p: [r == 0.0 for r in cold_rel[p]] for p in ("K", "V")}
    return {"arms": {"A": {"p": {
        "0": {"kind": "computed", "num_blocks": 2, "layers": 1, "planes": _planes(cold_same, cold_rel), "matches": [], "error": None},
        "1": {"kind": "reused", "num_blocks": 2, "layers": 1, "planes": _planes(reuse_identical or same, reuse_rel),
              "matches": [], "error": None},
    }}}}  # fmt: skip


def test_the_floor_is_the_arms_own_cold_prefill_and_classes_follow_it():
    zero = {"K": [0.0, 0.0], "V": [0.0, 0.0]}
    drift = {"K": [0.0, 1e-3], "V": [2e-3, 0.0]}
    results = _results(_record(1, reused=2))
    job = compare_job(results["baseline"], {"A": results["A"]})
    assert job["reference"]["probes"] == {"p": 0}
    assert [(r["index"], r["kind"]) for r in job["arms"][0]["requests"]] == [(0, "computed"), (1, "reused")]
    # loaded KV within the cold prefill's drift: NUMERIC; beyond it: CORRUPT at that block and plane
    for reuse_rel, want, blame in (
        ({"K": [1e-3, 0.0], "V": [0.0, 0.0]}, "NUMERIC", None),
        ({"K": [0.0, 0.5], "V": [0.0, 0.0]}, "CORRUPT", {"blocks": [1], "planes": ["K"], "layers": [0]}),
    ):
        ident = {p: [r == 0.0 for r in reuse_rel[p]] for p in ("K", "V")}
        entries = _entries()
        annotate(entries, results, _raw(drift, ident, reuse_rel), None, 16)
        arm = entries[1]
        assert arm["kv_audit"]["floor"] == {
            "rel": 0.002, "max_abs": 1.0, "cells": 4, "identical": False, "by_layer": {"K": [0.001], "V": [0.002]}
        }  # fmt: skip
        kv = arm["probes"][0]["kv"]
        assert kv["verdict"] == want
        assert (kv["blame"] and {k: kv["blame"][k] for k in ("blocks", "planes", "layers")}) == blame
        assert arm["verdict"] == "PASS" and arm["probes"][0]["verdict"] == "PASS"  # the token verdict is untouched
    # a floor of zero: any difference is corrupt
    entries = _entries()
    annotate(
        entries,
        results,
        _raw(zero, {"K": [False, True], "V": [True, True]}, {"K": [1e-6, 0.0], "V": [0.0, 0.0]}),
        None,
        16,
    )
    assert entries[1]["probes"][0]["kv"]["verdict"] == "CORRUPT"
    assert arm_floor(_raw(zero, None, zero)["arms"]["A"])["identical"] is True


def test_an_audit_that_failed_is_unavailable_never_a_token_verdict_change():
    results = _results(_record(1, reused=2))
    entries = _entries()
    annotate(entries, results, None, "the KV comparison exited 1: boom", 16)
    arm = entries[1]
    assert arm["kv_audit"]["status"] == "unavailable" and "boom" in arm["kv_audit"]["reason"]
    assert arm["probes"][0]["kv"]["verdict"] == "UNAVAILABLE"
    assert arm["verdict"] == "PASS" and arm["probes"][0]["verdict"] == "PASS"
    # an asynchronous loader: the record says why, the probe is UNAVAILABLE with that reason
    results = _results(_record(1, reused=2, unavailable="the connector loads asynchronously"))
    entries = _entries()
    annotate(
        entries, results, _raw({"K": [0.0, 0.0], "V": [0.0, 0.0]}, None, {"K": [0.0, 0.0], "V": [0.0, 0.0]}), None, 16
    )
    kv = entries[1]["probes"][0]["kv"]
    assert kv["verdict"] == "UNAVAILABLE" and "asynchronously" in kv["reasons"][0]
    # audit off: explicit nulls everywhere
    entries = _entries()
    annotate(entries, {n: ArmResult(n) for n in ("baseline", "A")}, None, None, 16)
    assert entries[1]["kv_audit"] is None and entries[1]["probes"][0]["kv"] is None
    assert entries[1]["probes"][0]["requests"][1]["kv_audit"] is None


class _Target:
    """A stand-in for a connector class: what vLLM's hooks return, nothing loaded."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        self.matched, self.received = (0, False), None

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self.matched

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        return None

    def build_connector_meta(self, scheduler_output):
        return "inner"

    def register_kv_caches(self, kv_caches):
        return None

    def bind_connector_metadata(self, metadata):
        self.bound = metadata

    def get_finished(self, finished_req_ids):
        return None, self.received

    def wait_for_layer_load(self, layer_name):
        return None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return None

    def wait_for_save(self):  # a connector may write into a request's blocks after the forward
        for block_id, value in getattr(self, "writes_after", ()):
            for kv in self.kv.values():
                kv[block_id] = value


def _vllm_config():
    from types import SimpleNamespace

    return SimpleNamespace(
        cache_config=SimpleNamespace(block_size=BS), model_config=SimpleNamespace(get_head_size=lambda: D)
    )


def _new_req(req_id, computed, prompt_len=14):
    from types import SimpleNamespace

    return SimpleNamespace(req_id=req_id, prompt_token_ids=list(range(prompt_len)), block_ids=([5, 1, 7, 2],),
                           num_computed_tokens=computed)  # fmt: skip


def _output(*new_reqs):
    from types import SimpleNamespace

    sched = {r.req_id: 14 - r.num_computed_tokens for r in new_reqs}
    return SimpleNamespace(scheduled_new_reqs=list(new_reqs), num_scheduled_tokens=sched)


def _wrapped(monkeypatch, tmp_path):
    from repro.engine import kvaudit
    from repro.engine.kvaudit_hooks import AUDIT_DIR_ENV

    monkeypatch.setenv(AUDIT_DIR_ENV, str(tmp_path))
    return kvaudit.make_wrapped(_Target)


def test_an_asynchronous_load_is_described_when_the_request_is_promoted(monkeypatch, tmp_path):
    """vLLM's order (0.26, 0.28 and 0.32): match (n, True); allocate with n; steps that schedule nothing for
    the request; promotion: allocate again with 0, scheduled as new with num_computed_tokens = n."""
    from types import SimpleNamespace

    sched = _wrapped(monkeypatch, tmp_path)(_vllm_config(), "scheduler")
    req = SimpleNamespace(request_id="r1")
    sched.matched = (12, True)
    assert sched.get_num_new_matched_tokens(req, 0) == (12, True)
    sched.update_state_after_alloc(req, None, 12)
    assert sched.build_connector_meta(_output()).requests == []  # loading: not scheduled
    sched.update_state_after_alloc(req, None, 0)  # the promotion's allocation
    (audited,) = sched.build_connector_meta(_output(_new_req("r1", 12))).requests
    assert audited.async_load and audited.computed_tokens == 12
    assert (audited.local_tokens, audited.external_tokens) == (0, 12)
    assert audited.reused_blocks(BS) == [0, 1, 2]
    # a load that came back short (a load error: vLLM schedules fewer computed tokens) reads only those
    sched.get_num_new_matched_tokens(SimpleNamespace(request_id="r2"), 0)
    sched.update_state_after_alloc(SimpleNamespace(request_id="r2"), None, 12)
    (short,) = sched.build_connector_meta(_output(_new_req("r2", 4))).requests
    assert short.async_load and short.external_tokens == 12 and short.reused_blocks(BS) == [0]
    # a synchronous load, and an asynchronous answer the scheduler turned synchronous (0 external)
    sched.matched = (8, False)
    sched.get_num_new_matched_tokens(SimpleNamespace(request_id="r3"), 4)
    sched.update_state_after_alloc(SimpleNamespace(request_id="r3"), None, 8)
    sched.matched = (4, True)
    sched.get_num_new_matched_tokens(SimpleNamespace(request_id="r4"), 4)
    sched.update_state_after_alloc(SimpleNamespace(request_id="r4"), None, 0)
    r3, r4 = sched.build_connector_meta(_output(_new_req("r3", 12), _new_req("r4", 4))).requests
    assert (r3.async_load, r3.local_tokens, r3.external_tokens) == (False, 4, 8)
    assert (r4.async_load, r4.local_tokens, r4.external_tokens) == (False, 4, 0)


def test_the_worker_reads_an_asynchronous_load_only_after_get_finished_reported_it(monkeypatch, tmp_path):
    from repro.engine.kvaudit_hooks import AuditMetadata

    worker = _wrapped(monkeypatch, tmp_path)(_vllm_config(), "worker")
    kv = torch.randn(NB, H, BS, 2 * D)
    worker.register_kv_caches({"model.layers.0.attn": kv})

    def request(seq, req_id):
        return AuditRequest(seq, req_id, "sha", 14, [5, 1, 7, 2], 0, 12, 14, True, 12)

    worker.received = {"r1"}
    assert worker.get_finished(set()) == (None, {"r1"})
    worker.bind_connector_metadata(AuditMetadata(inner="inner", requests=[request(0, "r1"), request(1, "r2")]))
    assert worker.bound == "inner"  # the connector gets its own metadata back
    worker.wait_for_layer_load("model.layers.0.attn")
    seen = json.loads((tmp_path / "000000.json").read_text())
    assert seen["unavailable"] is None and seen["async_load"] and seen["load_finished_reported"]
    assert seen["reused_blocks"] == 3 and seen["external_tokens"] == 12
    read = torch.load(tmp_path / "000000.reused.000.pt")
    assert torch.equal(read, split_planes(kv, [5, 1, 7], "cpu-rows"))
    # promoted without this worker's get_finished naming it: unavailable, with that reason, nothing read
    blind = json.loads((tmp_path / "000001.json").read_text())
    assert blind["load_finished_reported"] is False and "get_finished never reported" in blind["unavailable"]
    assert not (tmp_path / "000001.reused.000.pt").exists()
    assert not list(tmp_path.glob("audit-error*"))


def test_computed_blocks_are_read_at_the_end_of_the_step_after_the_connectors_own_writes(monkeypatch, tmp_path):
    """A request that reused nothing is read once the step's every write landed (wait_for_save, after the
    connector's own): a connector that writes into its blocks after the forward, counting no load, shows there."""
    from repro.engine.kvaudit_hooks import AuditMetadata

    worker = _wrapped(monkeypatch, tmp_path)(_vllm_config(), "worker")
    kv = torch.randn(NB, H, BS, 2 * D)
    worker.kv = {"model.layers.0.attn": kv}
    worker.register_kv_caches(worker.kv)
    worker.bind_connector_metadata(
        AuditMetadata(inner="inner", requests=[AuditRequest(0, "r1", "sha", 14, [5, 1, 7, 2], 0, 0, 14, False, 0)])
    )
    worker.save_kv_layer("model.layers.0.attn", kv, None)
    assert not list(tmp_path.glob("*.computed.*"))  # not during the forward
    worker.writes_after = [(1, 7.0)]
    worker.wait_for_save()
    read = torch.load(tmp_path / "000000.computed.000.pt")
    assert torch.equal(read, split_planes(kv, [5, 1, 7], "cpu-rows"))
    assert float(kv[1].min()) == float(kv[1].max()) == 7.0  # the write after the forward is what was read


def test_a_request_resumed_after_preemption_keeps_its_first_record_and_is_not_read_again(monkeypatch, tmp_path):
    """vLLM 0.28's model runner v2 (CUDA) sends a request resumed after preemption as new again. It gets no
    new seq: one record per request, and a request preempted over and over writes its blocks once (on an
    H200 a preemption scenario's run directory grew about 450 MB/s until the disk was full)."""
    sched = _wrapped(monkeypatch, tmp_path)(_vllm_config(), "scheduler")
    (first,) = sched.build_connector_meta(_output(_new_req("r1", 0))).requests
    assert first.seq == 0
    for _ in range(3):  # preempted and resumed, as new each time; another request meanwhile
        assert sched.build_connector_meta(_output(_new_req("r1", 0))).requests == []
    (other,) = sched.build_connector_meta(_output(_new_req("r2", 0), _new_req("r1", 0))).requests
    assert (other.seq, other.req_id) == (1, "r2")


def test_the_audit_stops_recording_at_its_write_limit_and_says_so(monkeypatch, tmp_path):
    from repro.engine import kvaudit_hooks as hooks
    from repro.engine.kvaudit_hooks import AuditMetadata

    assert hooks.max_bytes_from_env({}) == hooks.DEFAULT_MAX_BYTES == 8 * 1024**3
    assert hooks.max_bytes_from_env({hooks.MAX_BYTES_ENV: "nonsense"}) == hooks.DEFAULT_MAX_BYTES
    monkeypatch.setenv(hooks.MAX_BYTES_ENV, "2000")  # one layer of one request's three blocks is more
    worker = _wrapped(monkeypatch, tmp_path)(_vllm_config(), "worker")
    kv = torch.randn(NB, H, BS, 2 * D)
    worker.register_kv_caches({"model.layers.0.attn": kv, "model.layers.1.attn": kv.clone()})

    def request(seq, req_id):
        return AuditRequest(seq, req_id, "sha", 14, [5, 1, 7, 2], 12, 0, 14, False, 12)

    worker.bind_connector_metadata(AuditMetadata(inner="inner", requests=[request(0, "r1")]))
    worker.wait_for_layer_load("model.layers.0.attn")
    written = (tmp_path / "000000.reused.000.pt").stat().st_size
    assert written > 2000
    (error,) = tmp_path.glob("audit-error.*.json")
    said = json.loads(error.read_text())["error"]
    assert f"had written {written} bytes" in said and "limit of 2000" in said and hooks.MAX_BYTES_ENV in said
    worker.wait_for_layer_load("model.layers.1.attn")  # stopped: nothing more is written
    worker.bind_connector_metadata(AuditMetadata(inner="inner", requests=[request(1, "r2")]))
    worker.wait_for_layer_load("model.layers.0.attn")
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".pt") == ["000000.reused.000.pt"]
    assert worker.bound == "inner"  # the connector still gets its own metadata: the engine goes on


def test_the_observer_is_a_producer_that_hands_nothing_off():
    """vLLM 0.28's scheduler reads a connector's role as what it does: a consumer (kv_consumer or kv_both)
    under async scheduling defers every preempted or finished request's block frees by a step
    (Scheduler.defer_block_free), and a connector that requires delivery drops a preempted request's
    in-flight output. The observer loads and stores nothing, so it must claim neither; then the audited
    control schedules as the unaudited one."""
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    from repro.engine import kvaudit

    ktc = KVTransferConfig(
        kv_connector=kvaudit.OBSERVER, kv_role=kvaudit.OBSERVER_ROLE, kv_connector_module_path=kvaudit.MODULE
    )
    assert ktc.is_kv_transfer_instance and not ktc.is_kv_consumer
    # the base class ties delivery to the producer role; the observer overrides it
    assert isinstance(vars(KVConnectorBase_V1).get("requires_kv_delivery"), property)
    assert kvaudit.KVAuditObserver.requires_kv_delivery.fget(object()) is False
