"""Blocks a connector reports to vLLM as not loaded (get_block_ids_with_load_errors), without an engine.

vLLM's kv_load_failure_policy decides what follows such a report: "fail" ends the request in an error, "recompute"
discards the step that read the blocks and computes from the first of them. Either way vLLM was told, so the KV
audit reads those blocks but never blames them: before this, a recompute that gave the baseline's answer was blamed
MISPLACED on exactly the reported blocks (the detection study's load_error policy-recompute row, vLLM 0.28 CPU), a
false finding against vLLM. The audit's worker hook files them per request (repro.engine.kvaudit_hooks), the child
attaches them to the request's record (repro.engine.audit_records), the judge keeps them out of the verdict and
says so (repro.judge.kvaudit), and the read model and the detection study's blame leave them unblamed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from repro.contract.result import LOAD_ERRORS_PREFIX
from repro.detection.blame import blamed_blocks, probe_blame, reported_blocks
from repro.engine.audit_records import AuditRecords
from repro.judge.kvaudit import LOAD_ERRORS_NOTE, arm_floor, reuse_entry
from repro.readmodel.requests import RequestAudit


def _raw(n: int = 4) -> dict:
    """A comparison of n blocks, one layer: block 2 is this prompt's block 1 (misplaced), the rest exact."""
    same = [True] * n
    same[2] = False
    return {
        "kind": "reused", "num_blocks": n, "layers": 1, "error": None,
        "planes": {p: {"identical": [same], "max_abs": [[0.0 if s else 1.0 for s in same]],
                       "rel": [[0.0 if s else 0.5 for s in same]]} for p in ("K", "V")},
        "matches": [{"layer": 0, "plane": p, "block": 2, "source": "block 1", "probe": "p", "src_block": 1,
                     "src_plane": p, "rel": 0.0} for p in ("K", "V")],
    }  # fmt: skip


FLOOR = arm_floor({})  # no cold prefill measured: only bit-identical cells are exact


def test_a_reported_block_is_read_classed_and_never_a_finding():
    entry, audit = reuse_entry(_raw(), {"block_size": 16, "local_tokens": 0, "load_errors": [2]}, FLOOR, "p")
    assert entry["load_errors"] == {"blocks": [2], "note": LOAD_ERRORS_NOTE}
    assert entry["planes"]["K"]["class"][0][2] != "="  # the grid still shows what was read
    assert audit.misplaced == () and audit.corrupt == () and audit.foreign == ()
    assert blamed_blocks(entry) == [] and reported_blocks(entry) == [2]


def test_without_a_report_the_same_bytes_are_a_finding():
    entry, audit = reuse_entry(_raw(), {"block_size": 16, "local_tokens": 0}, FLOOR, "p")
    assert "load_errors" not in entry and {b for b, _, _ in audit.misplaced} == {2}
    assert blamed_blocks(entry) == [2] and reported_blocks(entry) == []


def test_the_read_model_leaves_reported_blocks_unblamed():
    entry, _ = reuse_entry(_raw(), {"block_size": 16, "local_tokens": 0, "load_errors": [2]}, FLOOR, "p")
    view = RequestAudit(entry)
    assert view.reported_blocks == (2,) and view.blamed_blocks == () and view.blamed_chunks == ()


@pytest.mark.parametrize(
    "reported, planted, outcome",
    [([[2], [2]], [[2], [2]], "reported"), ([[2], []], [[2], [2]], "under"), ([[], []], [[], []], "exact")],
)
def test_the_study_calls_a_planted_failure_vllm_was_told_of_reported(reported, planted, outcome):
    kv = {"verdict": "EXACT", "reasons": [], "blame": None, "blamed_blocks": [[], []], "reported_blocks": reported}
    assert probe_blame(kv, planted, tokens_changed=False)["outcome"] == outcome


def test_the_child_attaches_a_requests_reported_blocks_to_its_record(tmp_path):
    rec = {"seq": 3, "prompt_sha256": "x"}
    (tmp_path / "000003.json").write_text(json.dumps(rec))
    (tmp_path / f"{LOAD_ERRORS_PREFIX}000003.json").write_text(json.dumps({"seq": 3, "blocks": [5, 4]}))
    (tmp_path / "000004.json").write_text(json.dumps({"seq": 4}))
    got = AuditRecords(str(tmp_path))._new_records()
    assert got == [{**rec, "load_errors": [4, 5]}, {"seq": 4}]  # the errors file is no record of its own


def test_the_worker_files_reported_blocks_under_the_request_that_read_them(monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("vllm")
    from repro.engine import kvaudit
    from repro.engine.kvaudit_hooks import AUDIT_DIR_ENV, AuditMetadata, AuditRequest

    class _Target:
        def __init__(self, vllm_config, role, kv_cache_config=None):
            self.errors: set[int] = set()

        def register_kv_caches(self, kv_caches):
            return None

        def bind_connector_metadata(self, metadata):
            return None

        def get_finished(self, finished_req_ids):
            return None, None

        def get_block_ids_with_load_errors(self):
            return set(self.errors)

    monkeypatch.setenv(AUDIT_DIR_ENV, str(tmp_path))
    cfg = SimpleNamespace(
        cache_config=SimpleNamespace(block_size=4), model_config=SimpleNamespace(get_head_size=lambda: 3)
    )
    worker = kvaudit.make_wrapped(_Target)(cfg, "worker")
    worker.register_kv_caches({"model.layers.0.attn": torch.randn(10, 2, 4, 6)})
    # seq 0 reuses 12 tokens in blocks 5, 1, 7 (prompt blocks 0-2); seq 1 computes from scratch in blocks 2, 3
    reqs = [
        AuditRequest(0, "a", "sha", 14, [5, 1, 7, 9], 0, 12, 2, False),
        AuditRequest(1, "b", "sha2", 8, [2, 3], 0, 0, 8, False),
    ]
    worker.bind_connector_metadata(AuditMetadata(inner=None, requests=reqs))
    worker.errors = {7, 1, 3}  # 3 is seq 1's computed block: not a load of anyone's
    assert worker.get_block_ids_with_load_errors() == {7, 1, 3}
    worker.errors = {5}  # a later step's report (an asynchronous load's may come late): merged
    worker.get_block_ids_with_load_errors()
    assert json.loads((tmp_path / f"{LOAD_ERRORS_PREFIX}000000.json").read_text())["blocks"] == [0, 1, 2]
    assert not (tmp_path / f"{LOAD_ERRORS_PREFIX}000001.json").exists()
    assert not list(tmp_path.glob("audit-error*"))
