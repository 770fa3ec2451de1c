"""How the KV audit learns that an asynchronous load completed, or that its receive failed, without an engine.

vLLM's worker asks the connector through get_finished before 0.30 and through get_transfer_results from 0.30
(KVConnectorTransferResults: finished_recving, and failed_recving for a failed receive, which vLLM lists as finished
too). The base class's get_transfer_results calls get_finished; MultiConnector's and NixlConnector's do not, and
0.32's MultiConnector.get_finished calls get_transfer_results. The fakes below are those three shapes; the audit
(repro.engine.kvaudit.make_wrapped, repro.engine.kvaudit_hooks) must read a load where any of them reports it,
count one report per worker call, and never read a failed receive as loaded."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from repro.engine import kvaudit
from repro.engine.kv_blocks import split_planes
from repro.engine.kvaudit_hooks import (
    AUDIT_DIR_ENV,
    HOOKS_BEFORE_030,
    HOOKS_SINCE_030,
    NO_FAILED_RECVING,
    AuditMetadata,
    AuditRequest,
)

H, BS, D, NB = 2, 4, 3, 10
LAYER = "model.layers.0.attn"
BLOCKS = [5, 1, 7, 2]


@dataclass
class _Results:
    """vLLM's KVConnectorTransferResults (0.30 on), without importing it: the pinned vLLM has none."""

    finished_sending: set = field(default_factory=set)
    finished_recving: set = field(default_factory=set)
    failed_recving: set = field(default_factory=set)


class _Legacy:
    """A connector class of vLLM before 0.30: get_finished only."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        self.recving, self.failed = set(), set()
        self.finished_calls = 0

    def build_connector_meta(self, scheduler_output):
        return "inner"

    def register_kv_caches(self, kv_caches):
        return None

    def bind_connector_metadata(self, metadata):
        self.bound = metadata

    def get_finished(self, finished_req_ids):
        self.finished_calls += 1
        return None, set(self.recving) or None

    def wait_for_layer_load(self, layer_name):
        return None


class _Default(_Legacy):
    """The base class's get_transfer_results (vLLM 0.30 on): it asks get_finished, and knows no failure."""

    def get_transfer_results(self, finished_req_ids):
        sending, recving = self.get_finished(finished_req_ids)
        return _Results(set(sending or ()), set(recving or ()))


class _Overriding(_Legacy):
    """MultiConnector's and NixlConnector's shape (vLLM 0.30 on): get_transfer_results reads the transfers itself,
    with the failed receives, and get_finished is a view of it (0.32's MultiConnector.get_finished)."""

    def get_transfer_results(self, finished_req_ids):
        return _Results(set(), set(self.recving), set(self.failed))

    def get_finished(self, finished_req_ids):
        self.finished_calls += 1
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None


def _vllm_config():
    return SimpleNamespace(
        cache_config=SimpleNamespace(block_size=BS), model_config=SimpleNamespace(get_head_size=lambda: D)
    )


def _worker(monkeypatch, tmp_path, target):
    tmp_path.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv(AUDIT_DIR_ENV, str(tmp_path))
    worker = kvaudit.make_wrapped(target)(_vllm_config(), "worker")
    kv = torch.randn(NB, H, BS, 2 * D)
    worker.register_kv_caches({LAYER: kv})
    return worker, kv


def _promoted(seq: int, req_id: str, computed: int = 12, local: int = 0) -> AuditRequest:
    """A request promoted after an asynchronous load of 12 tokens: vLLM counts `computed` of them as computed."""
    return AuditRequest(seq, req_id, "sha", 14, BLOCKS, local, 12, 14, True, computed)


def _records(directory, worker, *requests: AuditRequest) -> list[dict]:
    """The forward step that computes the promoted requests (bind, then a layer's load): their records."""
    worker.bind_connector_metadata(AuditMetadata(inner="inner", requests=list(requests)))
    worker.wait_for_layer_load(LAYER)
    return [json.loads((directory / f"{r.seq:06d}.json").read_text()) for r in requests]


def test_the_wrapper_offers_get_transfer_results_only_where_the_audited_class_does():
    """Probed on the class (never from a version): the wrapped class offers what the installed vLLM's does."""
    assert not hasattr(kvaudit.make_wrapped(_Legacy), "get_transfer_results")
    assert kvaudit.make_wrapped(_Legacy)._audit_completion_hooks == HOOKS_BEFORE_030
    for target in (_Default, _Overriding):
        assert hasattr(kvaudit.make_wrapped(target), "get_transfer_results")
        assert kvaudit.make_wrapped(target)._audit_completion_hooks == HOOKS_SINCE_030
    # the installed vLLM's own base class decides for every in-tree connector
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    has = hasattr(KVConnectorBase_V1, "get_transfer_results")
    assert hasattr(kvaudit.make_wrapped(KVConnectorBase_V1), "get_transfer_results") is has


def test_a_load_reported_only_by_an_overriding_get_transfer_results_is_read(monkeypatch, tmp_path):
    """vLLM 0.30 on, MultiConnector or NIXL: the worker calls get_transfer_results, which never calls get_finished.
    Before this was read, such a load stayed UNAVAILABLE ("get_finished never reported")."""
    worker, kv = _worker(monkeypatch, tmp_path, _Overriding)
    worker.recving = {"r1"}
    assert worker.get_transfer_results(set()).finished_recving == {"r1"}
    assert worker.finished_calls == 0
    (seen,) = _records(tmp_path, worker, _promoted(0, "r1"))
    assert seen["unavailable"] is None and seen["load_finished_reported"] is True
    assert seen["load_reported_by"] == "get_transfer_results" and seen["load_failed_reported"] is False
    assert torch.equal(torch.load(tmp_path / "000000.reused.000.pt"), split_planes(kv, BLOCKS[:3], "cpu-rows"))
    assert worker.bound == "inner"


def test_a_failed_receive_is_never_read_and_its_record_says_why(monkeypatch, tmp_path):
    """failed_recving: vLLM lists the id as finished too (so that the scheduler releases it). Counted as a hit
    anyway (tokens beyond the local hit counted as computed): "a failed load counted as a hit", the failure
    reported as success; recomputed (vLLM's recompute policy): nothing received to audit. Neither is read."""
    worker, _ = _worker(monkeypatch, tmp_path, _Overriding)
    worker.recving, worker.failed = {"hit", "recomputed", "ok"}, {"hit", "recomputed", "failed-only"}
    worker.get_transfer_results(set())
    hit, recomputed, failed_only, ok = _records(
        tmp_path,
        worker,
        _promoted(0, "hit", computed=12, local=4),
        _promoted(1, "recomputed", computed=4, local=4),
        _promoted(2, "failed-only", computed=12),
        _promoted(3, "ok"),
    )
    assert "receive failed (failed_recving)" in hit["unavailable"]
    assert "12 tokens counted as computed, 8 beyond its own prefix-cache hit of 4" in hit["unavailable"]
    assert "a failed load counted as a hit" in hit["unavailable"]
    assert "vLLM recomputed it" in recomputed["unavailable"] and "no received block" in recomputed["unavailable"]
    assert "a failed load counted as a hit" in failed_only["unavailable"]  # failed, though not listed as finished
    for rec in (hit, recomputed, failed_only):
        assert rec["load_failed_reported"] is True and rec["load_finished_reported"] is True
        assert not (tmp_path / f"{rec['seq']:06d}.reused.000.pt").exists()
    assert ok["unavailable"] is None and ok["load_failed_reported"] is False
    assert (tmp_path / "000003.reused.000.pt").exists()
    assert not list(tmp_path.glob("audit-error*"))


def test_a_receive_that_succeeds_after_a_failed_one_is_read(monkeypatch, tmp_path):
    """The latest report of an id stands: vLLM's recompute policy may load a request again after a failed receive,
    and a later report of it finished without failing is that load."""
    worker, _ = _worker(monkeypatch, tmp_path, _Overriding)
    worker.recving, worker.failed = {"r1"}, {"r1"}
    worker.get_transfer_results(set())
    worker.failed = set()
    worker.get_transfer_results(set())
    (seen,) = _records(tmp_path, worker, _promoted(0, "r1"))
    assert seen["unavailable"] is None and seen["load_failed_reported"] is False


def test_one_worker_call_is_one_report_whichever_hook_calls_the_other(monkeypatch, tmp_path):
    """The base class's get_transfer_results calls get_finished, and 0.32's MultiConnector.get_finished calls
    get_transfer_results: both hooks fire, the audit takes one report per call of the worker's, the outer
    get_transfer_results' (a get_finished around it would lose its failures: the failed receive stays failed)."""
    worker, _ = _worker(monkeypatch, tmp_path, _Default)
    reports = []
    note = worker._audit_note_received
    worker._audit_note_received = lambda done, failed, hook: (reports.append(hook), note(done, failed, hook))
    worker.recving = {"r1"}
    assert worker.get_transfer_results(set()).finished_recving == {"r1"}
    assert worker.finished_calls == 1 and reports == ["get_transfer_results"]
    (seen,) = _records(tmp_path, worker, _promoted(0, "r1"))
    assert seen["unavailable"] is None and seen["load_reported_by"] == "get_transfer_results"

    worker, _ = _worker(monkeypatch, tmp_path / "multi", _Overriding)
    worker.recving, worker.failed = {"r2"}, {"r2"}
    assert worker.get_finished(set()) == (None, {"r2"})  # get_finished around get_transfer_results
    (seen,) = _records(tmp_path / "multi", worker, _promoted(0, "r2"))
    assert seen["load_failed_reported"] is True and "a failed load counted as a hit" in seen["unavailable"]


def test_before_030_get_finished_is_read_and_failures_are_unavailable_not_false(monkeypatch, tmp_path):
    """The pinned vLLM (0.28) has no get_transfer_results: get_finished is read as before, and a record of an
    asynchronous load says that receive failures are unavailable, not that none happened."""
    worker, _ = _worker(monkeypatch, tmp_path, _Legacy)
    worker.recving = {"r1"}
    worker.get_finished(set())
    loaded, blind = _records(tmp_path, worker, _promoted(0, "r1"), _promoted(1, "r2"))
    assert loaded["unavailable"] is None and loaded["load_reported_by"] == "get_finished"
    assert loaded["load_failed_reported"] == NO_FAILED_RECVING and NO_FAILED_RECVING.startswith("unavailable: ")
    assert "this worker's get_finished never reported the request's load finished" in blind["unavailable"]
    assert blind["load_finished_reported"] is False


def test_a_load_nothing_reported_names_every_hook_it_watched(monkeypatch, tmp_path):
    worker, _ = _worker(monkeypatch, tmp_path, _Overriding)
    (blind,) = _records(tmp_path, worker, _promoted(0, "r1"))
    assert "get_transfer_results / get_finished never reported" in blind["unavailable"]
    assert blind["load_finished_reported"] is False and blind["load_reported_by"] is None
    assert blind["load_failed_reported"] is False
    # a synchronous load's record says nothing of reports
    (sync,) = _records(tmp_path, worker, AuditRequest(1, "s", "sha", 14, BLOCKS, 0, 12, 14, False, 12))
    assert (sync["load_finished_reported"], sync["load_reported_by"], sync["load_failed_reported"]) == (None,) * 3
