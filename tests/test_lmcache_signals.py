"""LMCache log parsing on real lines captured on an H200 (vLLM 0.26.0 + LMCache 0.5.4)."""

from pathlib import Path

from repro.lmcache_signals import cross_check, lmcache_evidence, scan_log
from repro.verdict import ERROR, INCONCLUSIVE, PASS, ArmVerdict, decide_lmcache_degraded

DATA = Path(__file__).parent / "data" / "lmcache"
HITS = (DATA / "h200-v026-l054-hits.log").read_text()
DEGRADED = (DATA / "h200-v026-l054-degraded.log").read_text()


def test_hits_retrieves_and_lookups_are_read_per_request():
    scan = scan_log(HITS)
    assert scan["degraded"] == []
    assert [r["retrieved"] for r in scan["retrieves"]] == [1280, 1280, 1280, 256, 512, 512]
    assert all(r["retrieved"] == r["required"] for r in scan["retrieves"])
    assert scan["retrieves"][0]["req_id"] == "1-b2fa0fc3"
    hits = [(lk["total"], lk["hit"], lk["need_to_load"]) for lk in scan["lookups"]]
    assert hits[:2] == [(1502, 0, 0), (1502, 1280, 1280)]
    assert scan["stores"][0] == {"req_id": "0-9c0bc2f9", "stored": 1280, "total": 1280}


def test_double_unpins_and_cuda_ops_fallback_are_counted():
    scan = scan_log(HITS)
    assert scan["double_unpin_warnings"] == 20
    assert scan["cuda_ops"] == "not loaded: fell back to torch ops"
    assert scan["versions"] == ["0.5.4-g3e11b8ed"]
    assert scan["config"].startswith("{'chunk_size': 256")


def test_health_monitor_degraded_mode_is_detected_and_makes_the_arm_error():
    scan = scan_log(DEGRADED)
    assert scan["degraded"] and "degraded mode" in scan["degraded"][0]
    evidence = lmcache_evidence([], DEGRADED)
    assert evidence.signals["degraded_mode"] is True
    assert evidence.degraded and "degraded mode" in evidence.degraded[0]
    before = ArmVerdict(INCONCLUSIVE, ("fixture: reuse 1: zero cached tokens",))
    after = decide_lmcache_degraded(before, evidence.degraded)
    assert after.verdict == ERROR and after.error_kind == "lmcache-degraded"
    assert after.reasons[1:] == before.reasons  # the arm's own reasons are kept after the degraded one


def test_degraded_mode_never_leaves_a_pass_and_the_scan_never_decides():
    evidence = lmcache_evidence([], DEGRADED)
    assert not hasattr(evidence, "verdict")  # the log scan reports; repro.verdict decides
    assert decide_lmcache_degraded(ArmVerdict(PASS, ()), evidence.degraded).verdict == ERROR
    healthy = lmcache_evidence([], HITS)
    assert healthy.degraded == () and decide_lmcache_degraded(ArmVerdict(PASS, ()), healthy.degraded).verdict == PASS


def test_full_prompt_hit_retrieving_more_than_vllm_loaded_is_a_finding():
    """chat-512 on the H200: vLLM loaded 511 tokens, LMCache retrieved the whole 512 (LMCache #4614's edge)."""
    entry = {
        "probes": [
            {
                "name": "chat-512",
                "requests": [
                    {
                        "role": "reuse",
                        "request_id": "7",
                        "cached_tokens": 511,
                        "kv_transfer_params": {"num_lmcache_cached_tokens": 512},
                    }
                ],
            }
        ]
    }
    views, findings = cross_check(entry["probes"], scan_log(HITS))
    assert views[("chat-512", 0)]["retrieved"] == 512
    assert findings == ["chat-512 reuse 0: LMCache retrieved 512 tokens where vLLM counted 511 cached"]


def test_cross_check_matches_requests_by_vllm_request_id_prefix():
    entry = {
        "probes": [
            {
                "name": "fixture",
                "requests": [
                    {
                        "role": "cold",
                        "request_id": "0",
                        "cached_tokens": 0,
                        "kv_transfer_params": {"num_lmcache_cached_tokens": 0},
                    },
                    {
                        "role": "reuse",
                        "request_id": "1",
                        "cached_tokens": 1280,
                        "kv_transfer_params": {"num_lmcache_cached_tokens": 1280},
                    },
                    {
                        "role": "reuse",
                        "request_id": "2",
                        "cached_tokens": 1024,
                        "kv_transfer_params": {"num_lmcache_cached_tokens": 1280},
                    },
                    {"role": "reuse", "request_id": "99", "cached_tokens": 256, "kv_transfer_params": None},
                ],
            }
        ]
    }
    views, findings = cross_check(entry["probes"], scan_log(HITS))
    assert views[("fixture", 1)] == {
        "reported_hit_tokens": 1280,
        "retrieved": 1280,
        "required": 1280,
        "lookup_hit_tokens": 1280,
    }
    assert any("reuse 2: LMCache reports 1280 hit tokens, vLLM 1024 cached" in f for f in findings)
    assert any("reuse 3: LMCache reported no per-request hit count" in f for f in findings)
    assert any("reuse 3: vLLM counted 256 cached tokens but no LMCache retrieve was logged" in f for f in findings)
