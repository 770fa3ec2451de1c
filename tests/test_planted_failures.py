"""The planted connector's failures reported as success without an engine (repro/engine/connectors/planted_failures.py):
a scheduler-side and a worker-side PlantedFaultConnector driven through vLLM's connector calls in vLLM's order, on
fake KV tensors, with a stand-in forward that writes each computed block's KV and records what attention read."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import have_vllm

pytestmark = pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")

BS = 4  # block size
LAYERS = 4
NUM_BLOCKS = 64


def _kv(tokens: list[int], block: int, layer: int) -> float:
    """The stand-in KV of a prompt's block in one layer: set by the prefix it closes, as real KV is."""
    return float(sum((i + 1) * t for i, t in enumerate(tokens[: (block + 1) * BS])) % 9973 + 1) + layer / 4


class Engine:
    """One arm's engine, reduced to the connector's calls: a scheduler connector, a worker connector, the KV pool."""

    def __init__(self, tmp_path, **extra):
        import torch
        from vllm.config import KVTransferConfig
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        from repro.engine.connectors.planted_fault import PlantedFaultConnector

        config = {"store_dir": str(tmp_path / "store"), "audit_path": str(tmp_path / "audit.jsonl"), **extra}
        self.ktc = KVTransferConfig(
            kv_connector="PlantedFaultConnector", kv_role="kv_both", kv_connector_extra_config=config
        )
        vllm_config = SimpleNamespace(kv_transfer_config=self.ktc, cache_config=SimpleNamespace(block_size=BS))
        self.sched = PlantedFaultConnector(vllm_config, KVConnectorRole.SCHEDULER, None)
        self.worker = PlantedFaultConnector(vllm_config, KVConnectorRole.WORKER, None)
        self.layers = {f"model.layers.{i}.self_attn.attn": torch.zeros(NUM_BLOCKS, 2, BS, 8) for i in range(LAYERS)}
        self.worker.register_kv_caches(self.layers)
        self.next_block = 1
        self.steps_without_forward = 0

    def _step(self, new: list, forward):
        """One scheduler step: metadata built, the worker's calls around the forward, what the worker reported."""
        cached = SimpleNamespace(req_ids=[], resumed_req_ids=set(), new_block_ids=[], num_computed_tokens=[])
        out = SimpleNamespace(
            scheduled_new_reqs=new,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens={r.req_id: len(r.prompt_token_ids) - r.num_computed_tokens for r in new},
        )
        meta = self.sched.build_connector_meta(out)
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(None)
        read = forward() if forward else None
        if forward:  # vLLM calls wait_for_save only after a forward (kv_connector_no_forward skips it)
            self.worker.wait_for_save()
        received = self.worker.get_finished(set())[1]
        errors = self.worker.get_block_ids_with_load_errors()
        self.worker.clear_connector_metadata()
        return read, received, errors

    def run(self, req_id: str, tokens: list[int], blocks: list[int] | None = None) -> dict:
        """One request of `tokens`, one forward for its prompt, as vLLM schedules it with this connector; `blocks`:
        the pool's blocks it is given (default: never-used ones)."""
        import torch

        if blocks is None:
            blocks = list(range(self.next_block, self.next_block + len(tokens) // BS + 1))
            self.next_block += len(blocks)
        request = SimpleNamespace(request_id=req_id, prompt_token_ids=tokens, lora_request=None, mm_features=None)
        hit, is_async = self.sched.get_num_new_matched_tokens(request, 0)
        self.sched.update_state_after_alloc(request, SimpleNamespace(get_block_ids=lambda: (blocks,)), hit)
        received = None
        if is_async:  # the request waits for its load; the step has no forward
            _, received, _ = self._step([], None)
        new = SimpleNamespace(req_id=req_id, prompt_token_ids=tokens, block_ids=(blocks,), num_computed_tokens=hit)

        def forward():
            reused = hit // BS
            read = {li: [float(kv[b].mean()) for b in blocks[:reused]] for li, kv in enumerate(self.layers.values())}
            for li, kv in enumerate(self.layers.values()):
                for i in range(reused, len(tokens) // BS):
                    kv[blocks[i]] = torch.full_like(kv[blocks[i]], _kv(tokens, i, li))
            return read

        read, received_after, errors = self._step([new], forward)
        _, params = self.sched.request_finished(request, blocks)
        after = {li: [float(kv[b].mean()) for b in blocks[: hit // BS]] for li, kv in enumerate(self.layers.values())}
        return {
            "hit": hit,
            "async": is_async,
            "received": received,
            "received_after": received_after,
            "errors": errors,
            "read": read,
            "after": after,
            "blocks": blocks,
            "report": params["planted_fault"],
        }


def _truth(tokens: list[int], n: int) -> dict:
    return {li: [_kv(tokens, i, li) for i in range(n)] for li in range(LAYERS)}


A = list(range(1, 26))  # 25 tokens: 6 full blocks, a reuse loads (25 - 1) // 4 = 6
B = list(range(101, 126))


def test_fault_none_loads_every_block_faithfully(tmp_path):
    """The control: what attention reads on a reuse is the stored KV, and the report says nothing was faulted."""
    eng = Engine(tmp_path, fault="none")
    eng.run("a0", A)
    reuse = eng.run("a1", A)
    assert reuse["hit"] == 24 and reuse["async"] is False
    assert reuse["read"] == _truth(A, 6)
    assert reuse["report"] == {"loaded_tokens": 24, "fault": "none", "faulted_blocks": []}


def test_async_control_loads_before_reporting_received(tmp_path):
    eng = Engine(tmp_path, fault="none", async_load=True)
    eng.run("a0", A)
    reuse = eng.run("a1", A)
    assert reuse["async"] is True and reuse["received"] == {"a1"}  # reported in the step without a forward
    assert reuse["read"] == _truth(A, 6)
    assert reuse["report"]["async_load"] is True and reuse["report"]["faulted_blocks"] == []


def test_dropped_load_counts_every_block_and_writes_none(tmp_path):
    eng = Engine(tmp_path, fault="dropped_load")
    eng.run("a0", A)
    reuse = eng.run("a1", A)
    assert reuse["hit"] == 24  # vLLM is told the tokens are loaded ...
    assert reuse["read"] == {li: [0.0] * 6 for li in range(LAYERS)}  # ... and attention reads a fresh pool's zeros
    assert reuse["report"]["loaded_tokens"] == 24 and reuse["report"]["faulted_blocks"] == list(range(6))
    assert reuse["errors"] == set()  # nothing tells vLLM


def _audit_lines(tmp_path) -> list[dict]:
    import json

    return [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]


def test_a_dropped_load_on_its_own_freed_blocks_names_the_block_it_left_right(tmp_path):
    """vLLM gives a reuse the blocks its cold request freed, last first: the middle one of the mirror holds its own
    KV at its own position, so the load audit names it unchanged (no audit can blame it); the others differ."""
    eng = Engine(tmp_path, fault="dropped_load")
    cold = eng.run("a0", A)
    mirrored = cold["blocks"][::-1]  # 7 blocks: the reuse's block 3 is the cold request's block 3
    reuse = eng.run("a1", A, blocks=mirrored)
    assert reuse["report"]["faulted_blocks"] == list(range(6))
    line = _audit_lines(tmp_path)[-1]
    assert line["unchanged_blocks"] == [3]
    assert [b for b, d in line["faulted_max_abs_diff"] if d == 0.0] == [3]


def test_a_failed_store_is_measured_against_the_whole_block_it_lost(tmp_path):
    """The load audit compares a failed store's blocks with the whole block the request computed (kept beside the
    partial save for the audit alone), so the layers the store lost count: not the partial save against itself."""
    eng = Engine(tmp_path, fault="failed_store", first_block=1, num_blocks=2)
    eng.run("a0", A)
    assert len([p for p in (tmp_path / "store").iterdir() if p.name.endswith(".truth")]) == 2
    reuse = eng.run("a1", A)
    line = _audit_lines(tmp_path)[-1]
    truth = _truth(A, 6)
    for block, diff in line["faulted_max_abs_diff"]:  # layers 2 and 3 read zeros where the truth is not
        assert diff == max(truth[li][block] for li in (2, 3)), block
    assert line["unchanged_blocks"] == [] and line["clean_max_abs_diff"] == 0.0
    assert reuse["read"][2][1] == 0.0  # the truth copy is never loaded


def test_failed_store_stays_visible_and_loads_half_the_layers(tmp_path):
    """Blocks 1 and 2 of the store keep layers 0 and 1 only; their keys are found, and the reuse loads them."""
    eng = Engine(tmp_path, fault="failed_store", first_block=1, num_blocks=2)
    cold = eng.run("a0", A)
    assert cold["report"]["faulted_blocks"] == [] and cold["hit"] == 0
    reuse = eng.run("a1", A)
    assert reuse["hit"] == 24  # the broken keys answer lookups
    truth = _truth(A, 6)
    for li in range(LAYERS):
        want = [0.0 if (li >= 2 and i in (1, 2)) else truth[li][i] for i in range(6)]
        assert reuse["read"][li] == want, li
    assert reuse["report"]["faulted_blocks"] == [1, 2]
    again = eng.run("a2", A)  # never stored again: every later hit reads the same partial blocks
    assert again["read"] == reuse["read"]


def test_failed_store_with_no_layers_registers_the_key_alone(tmp_path):
    eng = Engine(tmp_path, fault="failed_store", first_block=0, num_blocks=1, stored_layers=0)
    eng.run("a0", A)
    reuse = eng.run("a1", A)
    assert [reuse["read"][li][0] for li in range(LAYERS)] == [0.0] * LAYERS
    assert reuse["report"]["faulted_blocks"] == [0]


def test_late_load_is_reported_received_before_its_bytes_arrive(tmp_path):
    """Received in the step without a forward; the forward reads zeros; the bytes are there after it."""
    eng = Engine(tmp_path, fault="late_load")
    eng.run("a0", A)
    reuse = eng.run("a1", A)
    assert reuse["async"] is True and reuse["received"] == {"a1"}
    assert reuse["read"] == {li: [0.0] * 6 for li in range(LAYERS)}
    assert reuse["after"] == _truth(A, 6)  # written after the forward: every later step reads them
    assert reuse["report"]["faulted_blocks"] == list(range(6)) and reuse["report"]["async_load"] is True


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_load_error_reports_the_unwritten_blocks_under_the_policy(tmp_path, policy):
    eng = Engine(tmp_path, fault="load_error", first_block=-2, num_blocks=2, load_failure_policy=policy)
    assert eng.ktc.kv_load_failure_policy == policy  # what vLLM's scheduler reads after building its connector
    eng.run("a0", A)
    reuse = eng.run("a1", A)
    assert reuse["errors"] == {reuse["blocks"][4], reuse["blocks"][5]}
    assert [reuse["read"][0][i] for i in (4, 5)] == [0.0, 0.0]
    assert reuse["read"][0][:4] == _truth(A, 4)[0]
    assert reuse["report"]["faulted_blocks"] == [4, 5] and reuse["report"]["load_failure_policy"] == policy


def test_a_policy_vllm_does_not_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="load_failure_policy='retry'; choose one of fail, recompute"):
        Engine(tmp_path, fault="load_error", load_failure_policy="retry")


def test_unreported_load_reports_no_hit_and_overwrites_after_the_prefill(tmp_path):
    """B stored after A: A's reuse finds its blocks, says 0, computes them, then holds B's KV at those indices."""
    eng = Engine(tmp_path, fault="unreported_load")
    first = eng.run("a0", A)
    assert first["report"] == {"loaded_tokens": 0, "fault": "unreported_load", "faulted_blocks": []}
    eng.run("b0", B)
    reuse = eng.run("a1", A)
    assert reuse["hit"] == 0 and reuse["async"] is False  # vLLM's counter: no hit
    assert reuse["read"] == {li: [] for li in range(LAYERS)}
    stored = {li: [_kv(B, i, li) for i in range(6)] for li in range(LAYERS)}
    got = {li: [float(eng.layers[name][b].mean()) for b in reuse["blocks"][:6]] for li, name in enumerate(eng.layers)}
    assert got == stored  # what every decode step then reads
    assert reuse["report"] == {
        "loaded_tokens": 0,
        "fault": "unreported_load",
        "faulted_blocks": list(range(6)),
        "unreported_tokens": 24,
    }


def test_settings_that_do_not_apply_are_refused(tmp_path):
    with pytest.raises(ValueError, match="stored_layers applies only to failed_store"):
        Engine(tmp_path, fault="dropped_load", stored_layers=1)
    with pytest.raises(ValueError, match="async_load='yes': true or false"):
        Engine(tmp_path, fault="none", async_load="yes")


def test_the_faults_that_name_no_blocks_touch_every_loaded_one():
    from repro.engine.connectors import planted_fault as pf

    for fault in ("dropped_load", "late_load"):
        assert pf.faulted_indices(fault, 2, 1, 5) == [0, 1, 2, 3, 4]
    assert pf.faulted_indices("load_error", -2, 2, 5) == [3, 4]
    assert pf.faulted_indices("failed_store", 0, 16, 5) == []  # decided by the broken keys, not by the load
    assert pf.faulted_indices("unreported_load", 0, 16, 5) == []
