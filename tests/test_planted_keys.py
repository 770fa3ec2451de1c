"""PlantedKeyConnector's keys without an engine (repro/engine/connectors/planted_keys.py): "tokens" leaves the
request's LoRA adapter out of every block key (the planted fault), "tokens+adapter" puts its name, id and path in;
PlantedFaultConnector's own keys are the chain they always were."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest
from conftest import have_vllm

pytestmark = pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")


def _connector(key: str):
    from repro.engine.connectors.planted_keys import PlantedKeyConnector

    conn = PlantedKeyConnector.__new__(PlantedKeyConnector)
    conn.key, conn.block_size = key, 4
    return conn


def _request(name: str | None, lora_id: int = 1, path: str = "/a"):
    lora = None if name is None else SimpleNamespace(lora_name=name, lora_int_id=lora_id, lora_path=path)
    return SimpleNamespace(lora_request=lora)


def test_token_keys_are_the_same_under_every_adapter():
    conn = _connector("tokens")
    tokens = list(range(12))
    salts = {conn._salt(_request(n, i, p)) for n, i, p in (("A", 1, "/a"), ("B", 2, "/b"), (None, 1, ""))}
    assert salts == {""}
    assert conn._keys(tokens, 3, "") == conn._keys(tokens, 3)


def test_adapter_keys_differ_by_name_id_and_path():
    conn = _connector("tokens+adapter")
    tokens = list(range(12))
    requests = [_request("A", 1, "/a"), _request("B", 1, "/a"), _request("A", 3, "/a"), _request("A", 1, "/a2")]
    keys = [tuple(conn._keys(tokens, 3, conn._salt(r))) for r in requests]
    assert len(set(keys)) == len(keys)
    assert conn._salt(_request(None)) == ""  # the base model keys as the planted store always did


def test_the_planted_fault_connectors_keys_are_unchanged():
    """The unsalted chain is the one every earlier report's store used: sha256 over each block's token list."""
    conn = _connector("tokens")
    h, want = hashlib.sha256(), []
    for i in range(3):
        h.update(repr(list(range(12))[i * 4 : (i + 1) * 4]).encode())
        want.append(h.copy().hexdigest())
    assert conn._keys(list(range(12)), 3) == want


def test_an_unknown_key_is_refused():
    from repro.engine.connectors import planted_keys

    config = SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_connector_extra_config={"key": "names"}))
    with pytest.raises(ValueError, match="unknown planted key 'names'; choose one of tokens, tokens\\+adapter"):
        planted_keys.PlantedKeyConnector(config, None)
