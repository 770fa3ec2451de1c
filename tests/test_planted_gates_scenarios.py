"""The planted connector's scenario gates without an engine: `when: in_flight` (a load faults only when
another request is in flight with it) and `when: after_eviction` (only when some of its blocks were
evicted from the local tier). The scheduler side runs as vLLM drives it (lookup, allocation, one
build_connector_meta per step, request_finished), on stand-in requests and scheduler outputs; the
worker's save is the test marking the planned store's keys as written. End to end on the engine:
tests/test_e2e_planted_scenario_gates.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from conftest import have_vllm

pytestmark = pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")

BLOCK = 4


@pytest.fixture(scope="module")
def pf():
    from repro.engine.connectors import planted_fault

    return planted_fault


@pytest.fixture(scope="module")
def gates():
    from repro.engine.connectors import planted_gates

    return planted_gates


class Engine:
    """The scheduler side of one engine: a connector with a block size of 4 and a store of key names."""

    def __init__(self, pf, **extra):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        conn = pf.PlantedFaultConnector.__new__(pf.PlantedFaultConnector)
        conn.fault, conn.first_block, conn.num_blocks = extra.pop("fault", "zero_blocks"), 0, 16
        conn.block_size, conn.audit_path = BLOCK, None
        conn._external, conn._loaded, conn._stored_prompts, conn._resume_prompts = {}, {}, [], {}
        conn._landed, conn._salts = {}, {}
        conn._init_gates(extra, KVConnectorRole.SCHEDULER)
        conn._init_failures({}, None)  # no failure reported as success: its settings' defaults
        self.stored: set[str] = set()
        conn._have = self.stored.__contains__
        self.conn, self.ops, self.params = conn, {}, {}

    def admit(self, rid: str, tokens: list[int]) -> SimpleNamespace:
        """Lookup and allocation of a waiting request: what the step that schedules it sees."""
        request = SimpleNamespace(prompt_token_ids=tokens, request_id=rid)
        hit, _ = self.conn.get_num_new_matched_tokens(request, 0)
        self.conn.update_state_after_alloc(request, None, hit)
        blocks = (list(range(100)),)
        return SimpleNamespace(req_id=rid, prompt_token_ids=tokens, block_ids=blocks, num_computed_tokens=hit)

    def step(self, new: list[SimpleNamespace], running: tuple[str, ...] = (), resumed=None) -> None:
        """One scheduler step: new requests, running ones given a token each, and at most one request
        resumed after preemption (admitted again, its block IDs anew)."""
        scheduled = {r.req_id: len(r.prompt_token_ids) - r.num_computed_tokens for r in new}
        scheduled.update({rid: 1 for rid in running})
        cached = SimpleNamespace(req_ids=list(running), resumed_req_ids=set(), new_block_ids=[None] * len(running))
        cached.num_computed_tokens = [0] * len(running)
        if resumed is not None:
            scheduled[resumed.req_id] = len(resumed.prompt_token_ids) - resumed.num_computed_tokens
            cached.req_ids.append(resumed.req_id)
            cached.resumed_req_ids.add(resumed.req_id)
            cached.new_block_ids.append((list(range(200, 300)),))
            cached.num_computed_tokens.append(resumed.num_computed_tokens)
        output = SimpleNamespace(scheduled_new_reqs=new, num_scheduled_tokens=scheduled, scheduled_cached_reqs=cached)
        meta = self.conn.build_connector_meta(output)
        for op in meta.ops:
            self.ops[op.req_id] = op
            if op.kind == "store":
                self.stored.update(op.keys)  # the worker's save, in the same step

    def finish(self, rid: str) -> dict:
        _, params = self.conn.request_finished(SimpleNamespace(request_id=rid), [])
        self.params[rid] = params["planted_fault"]
        return params["planted_fault"]

    def run(self, rid: str, tokens: list[int]) -> dict:
        """One request alone, start to finish (a plain probe's request): its kv_transfer_params."""
        self.step([self.admit(rid, tokens)])
        return self.finish(rid)

    def together(self, requests: dict[str, list[int]]) -> dict[str, dict]:
        """Several requests admitted and scheduled in one step (one generate call with several prompts)."""
        self.step([self.admit(rid, tokens) for rid, tokens in requests.items()])
        return {rid: self.finish(rid) for rid in requests}


def prompt(first: int, n_tokens: int) -> list[int]:
    """A prompt whose first block is its own (no two prompts share a block, as the kit's probes)."""
    return [first] + list(range(1000 + first, 1000 + first + n_tokens - 1))


A, B, C = prompt(1, 17), prompt(2, 13), prompt(3, 21)  # 4, 3 and 5 loadable blocks of 4 tokens


# ---- in_flight
def figures(scheduled: int, unfinished: int, in_flight: int) -> dict:
    return {"scheduled": scheduled, "unfinished": unfinished, "in_flight": in_flight, "min": 2, "open": in_flight >= 2}


def test_in_flight_figures(gates):
    assert gates.in_flight_figures({"a"}, {"a"}) == figures(1, 1, 1)
    assert gates.in_flight_figures({"a", "b"}, {"a", "b"})["open"] is True
    # a running request the step left out still shares the engine with the load
    assert gates.in_flight_figures({"a"}, {"a", "b"}) == figures(1, 2, 2)


def test_in_flight_plain_probes_never_fault(pf):
    """Each probe's cold request, then its reuses, one request at a time: every reuse loads, none faults."""
    eng = Engine(pf, when="in_flight")
    for name, tokens in (("a", A), ("b", B), ("c", C)):
        assert eng.run(f"{name}-cold", tokens)["loaded_tokens"] == 0
        for i in range(3):
            params = eng.run(f"{name}-reuse{i}", tokens)
            assert params["loaded_tokens"] > 0 and params["faulted_blocks"] == []
            assert params["gate"] == {"apply": False, "in_flight": figures(1, 1, 1)}


def test_in_flight_requests_submitted_together_fault(pf):
    """Cold together (no loads), then the same prompts together: every load shares its step, and faults."""
    eng = Engine(pf, when="in_flight")
    cold = eng.together({"a0": A, "b0": B, "c0": C})
    assert all(p["loaded_tokens"] == 0 and "gate" not in p for p in cold.values())
    reused = eng.together({"a1": A, "b1": B, "c1": C})
    for rid, n_blocks in (("a1", 4), ("b1", 3), ("c1", 5)):
        p = reused[rid]
        assert p["loaded_tokens"] == n_blocks * BLOCK and p["faulted_blocks"] == list(range(n_blocks))
        assert p["gate"]["apply"] is True and p["gate"]["in_flight"]["scheduled"] == 3
    # afterwards, alone again: faithful
    assert eng.run("a2", A)["faulted_blocks"] == []


def test_in_flight_counts_a_running_request_the_step_left_out(pf):
    """b is running (scheduled before, not finished) but gets no tokens in the step that loads a: a faults."""
    eng = Engine(pf, when="in_flight")
    eng.run("a0", A)
    eng.step([eng.admit("b0", B)])  # b starts and keeps running
    eng.step([eng.admit("a1", A)])  # the step schedules a alone
    p = eng.finish("a1")
    assert p["faulted_blocks"] == [0, 1, 2, 3]
    assert p["gate"]["in_flight"] == figures(1, 2, 2)
    eng.finish("b0")
    assert eng.run("a2", A)["faulted_blocks"] == []  # b finished: alone again


def test_in_flight_gate_is_recorded_in_the_audit_line(pf, tmp_path):
    eng = Engine(pf, when="in_flight")
    eng.conn.audit_path = str(tmp_path / "audit.jsonl")
    eng.together({"a0": A, "b0": B})
    eng.together({"a1": A, "b1": B})
    op = eng.ops["a1"]
    eng.conn._write_audit(op, [0.0] * len(op.keys))  # what start_load_kv writes after the copy
    line = json.loads((tmp_path / "audit.jsonl").read_text())
    assert line["gate"]["in_flight"]["in_flight"] == 2 and line["faulted_blocks"] == [0, 1, 2, 3]


# ---- after_eviction
def test_local_tier_evicts_the_least_recently_used(gates):
    tier = gates.LocalTier(3)
    tier.put(["a", "b", "c"])
    figures = tier.load(["a"])  # a becomes the most recently used
    assert figures["local_blocks"] == 1 and figures["open"] is False
    tier.put(["d"])  # evicts b, the least recently used
    assert "b" not in tier and "a" in tier and tier.evictions == 1
    figures = tier.load(["b", "c"], first_block=5)
    assert figures == {
        "capacity_blocks": 3,
        "local_blocks": 1,
        "next_tier_blocks": 1,
        "evicted_blocks": [5],
        "never_local_blocks": 0,
        "evictions": 2,  # promoting b pushed out a
        "open": True,
    }
    # a block the next tier holds that this tier never held is counted apart and does not open the gate
    figures = tier.load(["x"])
    assert figures["never_local_blocks"] == 1 and figures["evicted_blocks"] == [] and figures["open"] is False


def test_after_eviction_plain_probes_never_fault(pf):
    """Capacity 5 blocks, at least the longest probe's: each probe's reuses find its blocks local, though
    the probes together (12 blocks) overflow the tier and earlier probes' blocks are evicted."""
    eng = Engine(pf, when="after_eviction", local_capacity_blocks=5)
    for name, tokens in (("a", A), ("b", B), ("c", C)):
        eng.run(f"{name}-cold", tokens)
        for i in range(3):
            params = eng.run(f"{name}-reuse{i}", tokens)
            n = params["loaded_tokens"] // BLOCK
            assert n > 0 and params["faulted_blocks"] == []
            gate = params["gate"]["after_eviction"]
            assert params["gate"]["apply"] is False and gate["local_blocks"] == n and gate["next_tier_blocks"] == 0
    assert eng.conn.local_tier.evictions > 0  # the tier did overflow, between probes


def test_after_eviction_a_b_a_faults_the_reload(pf):
    """A (4 blocks), B (3): 7 > 6, so A's first block is evicted; A again loads it from the next tier and
    faults; that reload promoted A's blocks, so A once more is served locally and loads faithfully."""
    eng = Engine(pf, when="after_eviction", local_capacity_blocks=6)
    eng.run("a0", A)
    assert eng.run("a1", A)["faulted_blocks"] == []  # the plain reuse, right after
    eng.run("b0", B)
    p = eng.run("a2", A)
    assert p["loaded_tokens"] == 16 and p["faulted_blocks"] == [0, 1, 2, 3]
    gate = p["gate"]["after_eviction"]
    assert p["gate"]["apply"] is True
    assert (gate["local_blocks"], gate["next_tier_blocks"], gate["evicted_blocks"]) == (3, 1, [0])
    assert eng.run("a3", A)["faulted_blocks"] == []


def test_after_eviction_capacity_above_the_sum_never_faults(pf):
    eng = Engine(pf, when="after_eviction", local_capacity_blocks=7)
    for rid, tokens in (("a0", A), ("b0", B), ("a1", A), ("b1", B)):
        assert eng.run(rid, tokens)["faulted_blocks"] == []
    assert eng.conn.local_tier.evictions == 0


@pytest.mark.parametrize("capacity", [None, 0, -3, "8", 2.5, True])
def test_after_eviction_needs_a_positive_integer_capacity(pf, capacity):
    extra = {"when": "after_eviction"}
    if capacity is not None:
        extra["local_capacity_blocks"] = capacity
    with pytest.raises(ValueError, match="needs local_capacity_blocks, a positive integer"):
        Engine(pf, **extra)


@pytest.mark.parametrize("when", ["always", "in_flight", "contended"])
def test_local_capacity_without_after_eviction_is_refused(pf, when):
    with pytest.raises(ValueError, match="applies only to when=after_eviction"):
        Engine(pf, when=when, local_capacity_blocks=8)


def test_scenario_gates_combine_with_once_in(pf, tmp_path):
    winner = Engine(pf, when="in_flight", once_in=str(tmp_path))
    loser = Engine(pf, when="in_flight", once_in=str(tmp_path))
    for eng in (winner, loser):
        eng.together({"a0": A, "b0": B})
    won, lost = winner.together({"a1": A, "b1": B})["a1"], loser.together({"a1": A, "b1": B})["a1"]
    assert won["faulted_blocks"] == [0, 1, 2, 3] and won["gate"]["once_in"]["claimed"] is True
    assert lost["faulted_blocks"] == [] and lost["gate"]["in_flight"]["open"] is True


# ---- preemption: a resumed request loads its prompt's blocks again
def test_a_request_resumed_after_preemption_loads_its_blocks(pf):
    """a runs cold (stores A), is preempted, and resumes: the connector promises A's 4 blocks again and
    must load them into a's new blocks, among the step's cached requests; without the load attention
    would read whatever those blocks held. The load is reported with the request's others."""
    eng = Engine(pf, fault="none")
    eng.step([eng.admit("a", A)])  # cold: stores
    eng.step([], resumed=eng.admit("a", A))  # preempted, admitted again: resumes with a hit
    op = eng.ops["a"]
    assert op.kind == "load" and op.resumed is True and op.block_ids == [200, 201, 202, 203]
    assert op.keys == eng.conn._keys(A, 4)
    params = eng.finish("a")
    assert params["loaded_tokens"] == 16 and params["faulted_blocks"] == []  # its first load is the resumed one
    assert params["loads"] == [{"loaded_tokens": 16, "faulted_blocks": [], "resumed": True}]


def test_a_resumed_load_faults_and_is_gated_like_any(pf):
    """A reuse that loaded (faithfully, alone), was preempted and resumed while b ran: its second load is in
    flight with b and faults; faulted_blocks is the union over its loads."""
    eng = Engine(pf, when="in_flight")
    eng.run("a0", A)
    eng.step([eng.admit("a1", A)])  # loads alone: faithful
    eng.step([eng.admit("b", B)], running=("a1",))
    eng.step([], running=("b",), resumed=eng.admit("a1", A))
    params = eng.finish("a1")
    assert params["faulted_blocks"] == [0, 1, 2, 3] and params["gate"]["apply"] is False
    assert [(ld["resumed"], ld["faulted_blocks"], ld["gate"]["apply"]) for ld in params["loads"]] == [
        (False, [], False),
        (True, [0, 1, 2, 3], True),
    ]
