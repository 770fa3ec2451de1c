"""The KV audit of an asynchronous load, end to end on the real vLLM CPU engine: AsyncLoadConnector
(tests/connectors/async_connector.py) answers (n, True), vLLM parks each reuse in
WAITING_FOR_REMOTE_KVS while it loads, and promotes it one step after get_finished reported the load.
The audit reads the loaded blocks at the promotion's forward step: a planted fault is blamed at its
block, request by request, the clean reuses are EXACT, and the audit moves no token or logprob."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, have_vllm, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

ARM = "AsyncLoadConnector"
PROMPT_BLOCKS = 1488 // 16  # the fixture probe's full blocks below its last token: all loaded
LAYERS = [0, 1, 2, 3]


def _verify(model: str, tmp_path, name: str, extra: dict, *flags: str) -> tuple[int, dict, str]:
    from repro.plan.options import CPU_ENGINE_FLAGS

    config = {"shared_storage_path": str(tmp_path / f"{name}-store"), **extra}
    report = tmp_path / f"{name}.json"
    argv = ["--model", model, *CPU_ENGINE_FLAGS, "--kv-connector", ARM, "--kv-connector-module-path",
            "async_connector", "--kv-connector-extra-config", json.dumps(config), "--fixture",
            "fixtures/selftest-cpu.json", "--reuses", "2", "--no-confirm", "--report", str(report), *flags]  # fmt: skip
    proc = run_cli(argv, env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests' / 'connectors'}"})
    assert report.exists(), proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads(report.read_text()), proc.stdout


def _arm(data: dict, name: str = ARM) -> dict:
    return next(a for a in data["arms"] if a["name"] == name)


def _records(kept) -> list[dict]:
    """Every arm's audit records, as --keep-kv kept them (one per request)."""
    return [json.loads(p.read_text()) for p in sorted(kept.rglob("[0-9]*.json")) if p.name[:6].isdigit()]


def _assert_rows(audit: dict, wrong: set[int], cls: str = "c") -> None:
    for plane in ("K", "V"):
        assert len(audit["planes"][plane]["class"]) == len(LAYERS)
        for row in audit["planes"][plane]["class"]:
            assert row == "".join(cls if b in wrong else "e" for b in range(PROMPT_BLOCKS))


@pytest.fixture(scope="module")
def zeroed(tiny_model, tmp_path_factory):
    """Block 2 of the second load (reuse 2) zeroed; the first load (reuse 1) clean."""
    tmp = tmp_path_factory.mktemp("async-zero")
    rc, data, out = _verify(
        tiny_model, tmp, "zero", {"fault": "zero", "fault_loads": [1]}, "--keep-kv", str(tmp / "kv")
    )
    return rc, data, out, tmp / "kv"


def test_an_asynchronous_load_is_audited_and_its_zeroed_block_blamed(zeroed):
    rc, data, out, kept = zeroed
    assert rc == 1  # a KV finding (the zeroed block also changed a token)
    arm = _arm(data)
    assert arm["kv_audit"]["status"] == "ok" and arm["kv_audit"]["floor"]["identical"] is True
    (probe,) = arm["probes"]
    assert probe["kv"]["verdict"] == "CORRUPT"
    assert probe["kv"]["blame"]["blocks"] == [2] and probe["kv"]["blame"]["planes"] == ["K", "V"]
    assert probe["kv"]["blame"]["layers"] == LAYERS
    cold, clean, faulted = probe["requests"]
    assert cold["kv_audit"]["status"] == "floor"
    for r in (clean, faulted):
        assert r["cached_tokens"] == 1488  # vLLM counted the load
        assert r["kv_audit"]["status"] == "audited" and r["kv_audit"]["origin"] == "external"
        assert r["kv_audit"]["num_blocks"] == PROMPT_BLOCKS
    assert clean["kv_audit"]["counts"] == {
        "exact": PROMPT_BLOCKS * 8, "numeric": 0, "misplaced": 0, "foreign": 0, "corrupt": 0
    }  # fmt: skip
    _assert_rows(clean["kv_audit"], set())
    assert faulted["kv_audit"]["counts"]["corrupt"] == 8  # one block x 4 layers x 2 planes
    _assert_rows(faulted["kv_audit"], {2})
    assert {(m["block"], m["source"]) for m in faulted["kv_audit"]["matches"]} == {(2, "zeros")}
    assert "KV findings" in out
    # the audit saw the asynchronous path: each reuse's record says so, after get_finished named it
    reuses = [r for r in _records(kept) if r["async_load"]]
    assert len(reuses) == 2
    for r in reuses:
        assert r["load_finished_reported"] is True and r["unavailable"] is None
        assert (r["local_tokens"], r["external_tokens"], r["computed_tokens"]) == (0, 1488, 1488)


def test_a_swapped_pair_is_blamed_as_each_others_bytes(tiny_model, tmp_path):
    """Blocks 2 and 3 of the first load exchanged: reuse 1 MISPLACED at exactly those two blocks (issue 35: each
    holds the other's reference KV, this prompt's own in the wrong slot; before the finer classes, CORRUPT), and
    the shape says so; reuse 2 (clean) EXACT."""
    rc, data, _ = _verify(tiny_model, tmp_path, "swap", {"fault": "swap", "fault_block": 2, "fault_loads": [0]})
    assert rc == 1  # a KV finding no fixture states
    (probe,) = _arm(data)["probes"]
    _, faulted, clean = probe["requests"]
    _assert_rows(faulted["kv_audit"], {2, 3}, "m")
    assert {(m["block"], m["source"]) for m in faulted["kv_audit"]["matches"]} == {(2, "block 3"), (3, "block 2")}
    assert faulted["kv_audit"]["shape"] == (
        "slots 2–3 hold this prompt's blocks 3…2 in reverse; the reused prefix then holds a permutation of its own blocks"
    )
    _assert_rows(clean["kv_audit"], set())
    assert probe["kv"]["verdict"] == "MISPLACED" and probe["kv"]["blame"]["blocks"] == [2, 3]


def test_the_audit_moves_no_token_or_logprob(tiny_model, zeroed, tmp_path):
    """The same run without the audit: the baseline's and the asynchronous arm's generations, token
    for token and logprob for logprob."""
    _, audited, _, _ = zeroed
    rc, plain, _ = _verify(tiny_model, tmp_path, "plain", {"fault": "zero", "fault_loads": [1]}, "--no-kv-audit")
    assert rc == 1  # the zeroed block still changes a token
    for name in ("baseline", ARM):
        a, b = _arm(audited, name), _arm(plain, name)
        assert b["kv_audit"] is None
        for pa, pb in zip(a["probes"], b["probes"], strict=True):
            for ra, rb in zip(pa["requests"], pb["requests"], strict=True):
                assert ra["token_ids"] == rb["token_ids"]
                assert ra["logprobs"] == rb["logprobs"]
                assert ra["cached_tokens"] == rb["cached_tokens"]
