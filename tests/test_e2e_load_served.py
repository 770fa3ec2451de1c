"""The production-load scenario served (`--frontend server`) on the real vLLM CPU engine: its cancellations are
client disconnects over HTTP (repro.engine.load_served), each retried at once (a missed one is read to its end
instead, and judged); with native prefix caching the retries and the untouched requests PASS, every cancellation is
recorded (closed, or missed with why), and the server's own counts agree with what the kit sent and closed (a closed
attempt is finished or aborted there, as the disconnect reaches the server before its last token or not) and
nothing was left running."""

from __future__ import annotations

import json

import pytest
from conftest import have_vllm, run_cli
from planted_fixtures import fixture_argv, write_arms_fixture

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

# 8 prompts (4 shared prefixes of 192 tokens, 2 suffixes each), 2 rounds; prefills span several engine steps
LOAD = {"prefixes": 4, "suffixes": 2, "prefix_tokens": 192, "suffix_tokens": 32, "rounds": 2, "seed": 5,
        "cancel_in_prefill": 2, "cancel_at_last_step": 2}  # fmt: skip
ENGINE = {"kv_cache_tokens": 5120, "long_prefill_token_threshold": 32}


def test_served_load_cancels_over_http_and_the_retries_pass_on_native(tiny_model, tmp_path):
    fixture = write_arms_fixture(tmp_path / "f.json", "served-load", "the load scenario served", [],
                                 scenarios=[{"name": "production-load", "engine": ENGINE, "load": LOAD}])  # fmt: skip
    report = tmp_path / "r.json"
    # the servers in the CPU's one-process layout (the engine core with its worker inside, beside the API server):
    # cancellations go from the API server to the engine core, which either layout has apart; vLLM's own served
    # layout is held to the offline bits by tests/test_e2e_served.py
    argv = fixture_argv(tiny_model, fixture, report, "--compare-native", "--no-native-matched", "--scenarios", "all",
                        "--frontend", "server", "--engine-layout", "one-process", "--reuses", "1", "--no-kv-audit",
                        "--no-confirm", "--jobs", "2", "--quiet")  # fmt: skip
    proc = run_cli(argv)
    assert report.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(report.read_text())
    assert data["config"]["engine_layout"] == "one-process"
    assert {(a["effective_config"]["engine_layout"], a["effective_config"]["executor"]) for a in data["arms"]} == {
        ("one-process", "uni")
    }  # no worker process of its own: vLLM's in-process executor
    scenario = next(s for s in data["scenarios"] if s["name"] == "production-load")
    native = next(a for a in scenario["arms"] if a["arm"] == "native")
    assert native["verdict"] == "PASS", (native.get("reasons"), proc.stdout[-2000:])
    requests = native["requests"]
    assert len(requests) == 8 * 2
    cancels = [r["cancel"] for r in requests if r.get("cancel")]
    assert len(cancels) == 4 * 2  # every cancellation the plan made is recorded, closed or missed
    closed = [c for c in cancels if not c.get("missed")]
    assert closed and all(c["over"] == "http" for c in closed), cancels
    rounds = {r["step"]: r["cancel"]["round"] for r in requests if r.get("cancel")}
    assert len(rounds) == 2
    for k, counts in rounds.items():
        attempts = [r["cancel"] for r in requests if r["step"] == k and (r.get("cancel") or {}).get("streamed")]
        # a missed attempt is read to its end and is the request judged (never sent again); a stream that ended with
        # no finish reason is sent again; a closed one (not missed) is sent again, and the server finishes it or
        # aborts it, as the disconnect reaches it before its last token or not (a race over HTTP)
        read = sum(1 for c in attempts if "read to its end" in c.get("missed", ""))
        ended = sum(1 for c in attempts if "stream ended" in c.get("missed", ""))
        cut = sum(1 for c in attempts if not c.get("missed"))
        assert counts["sent"] == 8 + ended + cut, counts  # every request once, and each attempt sent again
        assert cut == counts["closed"] and read + ended + cut == len(attempts), counts
        # every request of the round finished once (its retry, for a cancelled one), the attempts that ran out too;
        # no more than those and the cut ones: nothing the kit sent was finished twice or invented
        assert 8 + ended <= counts["server_finished"] <= 8 + ended + cut, counts
        assert counts["server_running_at_end"] == 0 and counts["server_waiting_at_end"] == 0, counts
        assert counts["server_aborted"] is not None, counts  # recorded as the server counts it (see docs/usage.md)
    assert all(r["verdict"] == "PASS" for r in requests), [(r["step"], r["probe"], r["reasons"]) for r in requests]
    print(json.dumps({"cancels": cancels, "rounds": rounds}))
