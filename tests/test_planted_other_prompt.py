"""The planted other_prompt fault without an engine: which blocks a load takes from another prompt's stored
KV, and from which (end to end on the engine: tests/test_e2e_replays.py)."""

from __future__ import annotations

import pytest
from conftest import have_vllm

pytestmark = pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")


@pytest.fixture(scope="module")
def pf():
    from repro.engine.connectors import planted_fault

    return planted_fault


def _connector(pf, stored: list[list[str]]):
    """A scheduler-side connector whose store holds the given prompts' block keys, oldest first."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    conn = pf.PlantedFaultConnector.__new__(pf.PlantedFaultConnector)
    conn.fault, conn.first_block, conn.num_blocks = "other_prompt", 0, 16
    conn._init_gates({}, KVConnectorRole.SCHEDULER)
    conn._stored_prompts = stored
    conn._have = lambda key: True  # every stored key is on disk
    return conn


def test_other_prompt_touches_every_loaded_block_whatever_first_block_and_num_blocks_say(pf):
    assert "other_prompt" in pf.FAULTS
    for first, num in ((0, 16), (-1, 1), (3, 2), (None, 1)):
        assert pf.faulted_indices("other_prompt", first, num, 5) == [0, 1, 2, 3, 4]
    assert pf.faulted_indices("other_prompt", 0, 16, 0) == []


def test_each_block_comes_from_the_latest_other_prompt_that_has_it(pf):
    """The load's own prompt is stored last (its cold request); the previous prompt is shorter, so the blocks
    past its end come from an older, longer one; a block no other prompt has loads faithfully."""
    ours = ["c0", "c1", "c2", "c3", "c4"]
    conn = _connector(pf, [["a0", "a1", "a2", "a3"], ["b0", "b1"], ours])
    op = pf._Op("r", "load", ours, list(range(5)))
    conn._plan_load(op)
    assert op.faulted == [0, 1, 2, 3]
    assert op.sources == {0: "b0", 1: "b1", 2: "a2", 3: "a3"}
    assert conn._corrupt("blob", 0) == "blob"  # the bytes come whole from the source block
