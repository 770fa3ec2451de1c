"""Issue 55's P→D defects (review 2026-12-05: D2, D3, D9, D10, D12), each shown engine-free over the fakes of
tests/pd_fakes.py, the pure judge or the real driver with its HTTP replaced."""

from __future__ import annotations

import json
import os

from pd_fakes import FakePair, audited_pair, reference_blocks
from test_pd import GPU_CASES, _command_with
from test_pd_kvaudit import _record

from repro.disagg import audit, servers
from repro.disagg.cases import load_cases
from repro.disagg.pair import Answer
from repro.judge.pd_kvaudit import name_loaded_blocks
from repro.judge.pd_verdict import Transfer, decide_pd_request
from repro.judge.verdict import ERROR, FOREIGN, INCONCLUSIVE, MISPLACED, PASS


class _ForeignKvPair(FakePair):
    """The consumer answers right, but the blocks its audit read for probe-a are probe-b's (D2)."""

    def __init__(self, block_size: int):
        super().__init__(block_size, audit=True)
        self.consumer.audit = True
        self.prompts = load_cases(GPU_CASES).prompts

    def decode(self, request_id, prompt, params, max_tokens):
        got = super().decode(request_id, prompt, params, max_tokens)
        if prompt != self.prompts["probe-a"] or not got.kv_blocks:
            return got
        other = reference_blocks(self.prompts["probe-b"], self.block_size)
        first = got.kv_first_slot
        foreign = other[first : first + len(got.kv_blocks)]
        return Answer(got.token_ids, got.transfer, got.error, got.cached_tokens, kv_blocks=foreign,
                      kv_first_slot=first)  # fmt: skip


def test_d2_a_probe_that_loaded_another_prompts_kv_is_not_exit_0(monkeypatch, tmp_path):
    code, report = _command_with(monkeypatch, tmp_path, _ForeignKvPair(16), "--kv-audit", str(tmp_path / "kv"))
    probe_a = [r for r in report["requests"] if r["prompt"] == "probe-a" and r["control"] is None]
    assert any(r["kv_audit"]["verdict"] == FOREIGN and r["verdict"] == PASS for r in probe_a)
    assert report["verdict"] == PASS  # the token verdict stands; the KV finding decides the exit
    assert code == 1


def test_d2_an_audited_pair_that_loads_its_own_blocks_still_exits_0(monkeypatch, tmp_path):
    """The stale and consumed controls load another prompt's blocks on purpose: what they expose is judged by the
    case's expected verdicts, not as a finding of the probes."""
    code, report = _command_with(monkeypatch, tmp_path, audited_pair()(16), "--kv-audit", str(tmp_path / "kv"))
    assert any((r.get("kv_audit") or {}).get("verdict") == FOREIGN for r in report["requests"] if r["control"])
    assert (code, report["verdict"]) == (0, PASS)


def test_d3_nixl_transfer_counters_not_exported_are_inconclusive_naming_the_counter():
    base = (1, 2, 3, 4)
    no_count = decide_pd_request("me", base, base, Transfer(4, 0, 4, None, 0), {"me": base})
    assert no_count.verdict == INCONCLUSIVE
    assert "vllm:nixl_xfer_time_seconds" in no_count.reasons[0] and "missing" in no_count.reasons[0]
    no_failed = decide_pd_request("me", base, base, Transfer(4, 0, 4, 1, None), {"me": base})
    assert no_failed.verdict == INCONCLUSIVE
    assert "vllm:nixl_num_failed_transfers" in no_failed.reasons[0] and "missing" in no_failed.reasons[0]
    # what the real driver reads from a consumer that exports no vllm:nixl_* metric
    transfer = servers.transfer_of({}, {servers.EXTERNAL_HITS: 4.0, servers.LOCAL_HITS: 0.0}, 4)
    assert decide_pd_request("me", base, base, transfer, {"me": base}).verdict == INCONCLUSIVE
    assert decide_pd_request("me", base, base, Transfer(4, 0, 4, 1, 0), {"me": base}).verdict == PASS


class _Quiet:
    """A started server as the driver sees it, with nothing behind it (no HTTP)."""

    name = "consumer"

    def metrics(self):
        return {}


def test_d9_the_audit_reads_the_record_its_own_request_wrote_never_an_earlier_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(servers.time, "sleep", lambda s: None)
    prompt = tuple(range(40, 88))
    folder = tmp_path / "consumer"
    for seq in (0, 20):  # an earlier run into the same folder (its seqs went further)
        _record(folder, seq, prompt, "reused", [7, 7, 7])
    pair = servers.NixlPair(servers.ServeSettings("/py", "/m", 16, 2048, kv_audit_dir=str(tmp_path)), tmp_path, {})
    pair.producer, pair.consumer = _Quiet(), _Quiet()

    def write_seq_0():  # as the audit writes: each file replaced whole (os.replace), the earlier run's seq 0 with it
        _record(tmp_path / "staging", 0, prompt, "reused", [0, 1, 2])
        for made in sorted((tmp_path / "staging").iterdir()):
            os.replace(made, folder / made.name)

    writes = [write_seq_0, lambda: None]  # the second request writes no record

    def complete(server, prompt_, max_tokens, params):
        writes.pop(0)()
        return {"choices": [{"token_ids": [1, 2]}], "usage": {}}, None

    monkeypatch.setattr(pair, "_complete", complete)
    own = tmp_path / "own"
    _record(own, 0, prompt, "reused", [0, 1, 2])
    want = audit.block_digests(own, json.loads((own / "000000.json").read_text()), "reused")
    assert pair.decode("d", prompt, {"x": 1}, 2).kv_blocks == want  # this run's seq 0, not the earlier seq 20
    assert pair.decode("d2", prompt, {"x": 1}, 2).kv_blocks is None  # no record of its own: never another's


def test_d10_a_prompts_own_block_from_a_shared_prefix_is_misplaced_not_foreign():
    warm = tuple(range(100, 120))
    partial = warm[:12] + tuple(range(200, 220))  # shares warm's first three blocks of 4
    ref = {"warm": reference_blocks(warm, 4), "partial": reference_blocks(partial, 4)}  # warm first, as in the cases
    received = [ref["partial"][3], ref["partial"][1]]  # slot 3 its own; slot 4 its own block 1 (also warm's)
    got = name_loaded_blocks("partial", received, 3, ref)
    assert got.verdict == MISPLACED and got.slots[1] == (4, "partial", 1)
    assert got.shape is not None and "warm" not in got.shape


class _RefusingPair(FakePair):
    """The consumer answers HTTP 500 to the plain-a probe request (D12)."""

    def __init__(self, block_size: int):
        super().__init__(block_size)
        self.prompt = load_cases(GPU_CASES).prompts["probe-a"]

    def decode(self, request_id, prompt, params, max_tokens):
        if request_id.startswith("plain-a-") and prompt == self.prompt:
            return Answer(None, Transfer(0, 0, None, 0, 0), "consumer answered HTTP 500: Internal Server Error")
        return super().decode(request_id, prompt, params, max_tokens)


def test_d12_a_probe_request_the_consumer_refused_is_error_and_exit_3(monkeypatch, tmp_path):
    code, report = _command_with(monkeypatch, tmp_path, _RefusingPair(16))
    assert report["verdict"] == ERROR
    assert code == 3


def test_the_committed_pd_reports_exit_as_they_did_through_the_one_exit_rule():
    """Both H200 reports: the arm PASS, the stale control not held (a hybrid answer, named as no request): exit 1,
    before the one exit rule and through it."""
    from pathlib import Path

    from repro.disagg.report import exit_view
    from repro.record.exit_rule import exit_reason

    for path in sorted((Path(GPU_CASES).parents[2] / "reports" / "pd").glob("*.json")):
        report = json.loads(path.read_text())
        code, why = exit_reason(exit_view(report))
        assert (report["verdict"], code) == (PASS, 1), path
        assert why.startswith("acceptance not matched: P→D (NixlConnector) stale-reference (trial 1) control: "
                              "expected held, observed not held (expected the answer named as probe-a's"), why  # fmt: skip
