"""LMCache log parsing on real lines captured on an H200 (vLLM 0.26.0 + LMCache 0.5.4)."""

from pathlib import Path

from repro.judge.verdict import ERROR, INCONCLUSIVE, PASS, ArmVerdict, decide_lmcache_degraded
from repro.lmcache.signals import copy_paths, cross_check, lmcache_evidence, scan_log

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
    signals = lmcache_evidence([], HITS).signals
    assert signals["cuda_ops"] == "not loaded: fell back to torch ops"  # the old key, for old readers
    assert [(p["process"], p["path"]) for p in signals["copy_paths"]] == [("engine", "fallback")]
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
    assert not hasattr(evidence, "verdict")  # the log scan reports; repro.judge.verdict decides
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


# Lines of an LMCacheMPConnector arm's own log (same H200 run): the engine's LMCache import, no
# retrieve, store, lookup or configuration line (those are the MP server's, in its own log).
MP_ARM_LOG = (
    "(EngineCore pid=983) [2026-11-30 12:24:29,515] LMCache WARNING: lmcache.cuda_ops compiled extension not found; "
    "CudaDeviceOps stays on the torch baseline for all ops. (device_ops.py:34:lmcache.v1.platform.cuda.device_ops)\n"
    "(EngineCore pid=983) [2026-11-30 12:24:29,759] LMCache INFO: Using external LMCacheMPConnector from "
    "lmcache.integration.vllm.lmcache_mp_connector (lmcache_mp_connector.py:1212:"
    "vllm.distributed.kv_transfer.kv_connector.v1.lmcache_mp_connector)\n"
)
MP_SERVER_LOG = "h200.logs/LMCacheMPConnector.lmcache-server.log"
IN_PROCESS_NOTES = ("no per-request hit count", "no LMCache retrieve was logged", "LMCache retrieved")


def _hit_probes() -> list[dict]:
    """A cold request and three vLLM hits that the MP connector reports no per-request count for."""
    reuse = [{"role": "reuse", "request_id": str(i), "cached_tokens": 1280, "kv_transfer_params": None} for i in (1, 2)]
    return [
        {
            "name": "fixture",
            "requests": [{"role": "cold", "request_id": "0", "cached_tokens": 0, "kv_transfer_params": None}, *reuse],
        },
        {
            "name": "chat-511",
            "requests": [{"role": "reuse", "request_id": "9", "cached_tokens": 256, "kv_transfer_params": None}],
        },
    ]


def test_in_process_connector_arm_still_gets_the_log_notes():
    """The V1 connector (and an unnamed connector, the old call) keeps every per-request note."""
    for connector in (None, "LMCacheConnectorV1"):
        findings = lmcache_evidence(_hit_probes(), MP_ARM_LOG, connector=connector).findings
        assert sum("no per-request hit count" in f for f in findings) == 3
        assert "chat-511 reuse 0: vLLM counted 256 cached tokens but no LMCache retrieve was logged" in findings
        assert not any("MP server" in f for f in findings)


def test_mp_connector_arm_gets_no_in_process_log_notes_and_one_pointer_to_the_server_log():
    evidence = lmcache_evidence(_hit_probes(), MP_ARM_LOG, connector="LMCacheMPConnector", server_log=MP_SERVER_LOG)
    assert not [f for f in evidence.findings if any(note in f for note in IN_PROCESS_NOTES)]
    pointers = [f for f in evidence.findings if "happen in the LMCache MP server" in f]
    assert len(pointers) == 1 and MP_SERVER_LOG in pointers[0]
    assert evidence.findings[0] == pointers[0] and len(evidence.findings) == 2
    assert evidence.findings[1].startswith("LMCache copy path: engine fallback (LMCache logged: ")
    assert evidence.findings[1].endswith("; MP server not recorded (the kit passed no copy path for its MP server)")
    # counts of lines this arm's log never has are not recorded as zero
    assert evidence.signals["retrieves"] is None and evidence.signals["stores"] is None
    assert evidence.request_views[("fixture", 1)] == {
        "reported_hit_tokens": None,
        "retrieved": None,
        "required": None,
        "lookup_hit_tokens": None,
    }
    without_path = lmcache_evidence(_hit_probes(), MP_ARM_LOG, connector="LMCacheMPConnector").findings
    assert sum("happen in the LMCache MP server" in f for f in without_path) == 1


def test_mp_connector_arm_ignores_in_process_retrieve_lines_but_keeps_degraded_mode():
    """Even a log with V1 retrieve lines (and mismatches) is not cross-checked on an MP arm; degraded
    mode, which the MP connector logs too, still counts."""
    probes = [
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
    v1 = lmcache_evidence(probes, HITS, connector="LMCacheConnectorV1").findings
    assert "chat-512 reuse 0: LMCache retrieved 512 tokens where vLLM counted 511 cached" in v1
    mp = lmcache_evidence(probes, HITS, connector="LMCacheMPConnector", server_log=MP_SERVER_LOG)
    assert not [f for f in mp.findings if any(note in f for note in IN_PROCESS_NOTES)]
    assert mp.request_views[("chat-512", 0)]["reported_hit_tokens"] == 512
    assert any("'Double unpin' warnings in this arm's log" in f for f in mp.findings)
    degraded = lmcache_evidence([], DEGRADED, connector="LMCacheMPConnector")
    assert degraded.degraded and degraded.signals["degraded_mode"] is True


# ---- each LMCache process's copy path (compiled ops or LMCache's torch fallback) -----------------

UNDEFINED = "ImportError: /site-packages/lmcache/cuda_ops.cpython-312-x86_64-linux-gnu.so: undefined symbol: _ZN3c10"
WHEEL_BUILD = {"version": "0.5.4", "cuda_ops": "loaded", "copy_path": "compiled", "ops_source": "wheel"}
FAILED_BUILD = {
    "version": "0.5.4",
    "cuda_ops": f"not loaded: {UNDEFINED}",
    "copy_path": "fallback",
    "ops_source": None,
    "ops_import_error": UNDEFINED,
}
SERVER_FALLBACK = {"path": "fallback", "source": None, "detail": f"lmcache.cuda_ops: {UNDEFINED}"}


def test_copy_paths_read_the_fallback_warning_of_a_real_log_and_the_childs_import():
    logged = copy_paths(None, HITS, None)
    assert logged == [
        {
            "process": "engine",
            "path": "fallback",
            "source": None,
            "detail": "LMCache logged: lmcache.cuda_ops compiled extension not found; CudaDeviceOps "
            "stays on the torch baseline for all ops. (device_ops.py:34:lmcache.v1.platform.cuda.device_ops)",
        }
    ]
    both = copy_paths(FAILED_BUILD, HITS, None)  # the child's import error says why
    assert both[0]["path"] == "fallback" and both[0]["detail"] == f"lmcache.cuda_ops: {UNDEFINED}"
    # the degraded log has no warning: the child's import decides
    assert copy_paths(WHEEL_BUILD, DEGRADED, None)[0] == {
        "process": "engine",
        "path": "compiled",
        "source": "wheel",
        "detail": "lmcache.cuda_ops imported",
    }
    kit = {**WHEEL_BUILD, "ops_source": "kit build", "ops_build_dir": "/kit/.cache/lmcache-ops/0.5.4-torch2.11.0-sm9.0"}
    assert copy_paths(kit, DEGRADED, None)[0]["detail"].endswith("sm9.0")
    assert copy_paths(FAILED_BUILD, DEGRADED, None)[0]["path"] == "fallback"


def test_copy_paths_disagreement_and_nothing_recorded_are_said_never_unknown():
    warned_but_imported = copy_paths(WHEEL_BUILD, HITS, None)[0]
    assert (
        warned_but_imported["path"] == "fallback"
        and "own import of lmcache.cuda_ops worked" in warned_but_imported["detail"]
    )
    nothing = copy_paths(None, DEGRADED, None)[0]
    assert nothing["path"] == "not recorded"
    assert nothing["detail"] == "the arm recorded no LMCache build; no fallback warning in its log"
    old_child = copy_paths({"version": "0.5.4", "cuda_ops": "loaded", "cuda_ops_file": "cuda_ops.so"}, DEGRADED, None)
    assert old_child[0]["path"] == "compiled" and old_child[0]["source"] == "wheel"
    old_failed = copy_paths({"cuda_ops": f"not loaded: {UNDEFINED}"}, DEGRADED, None)
    assert old_failed[0]["path"] == "fallback" and UNDEFINED in old_failed[0]["detail"]


def test_an_mp_arm_gets_its_servers_copy_path_in_signals_and_one_finding_line():
    evidence = lmcache_evidence(
        [], DEGRADED, connector="LMCacheMPConnector", engine_build=WHEEL_BUILD, server_copy_path=SERVER_FALLBACK
    )
    paths = evidence.signals["copy_paths"]
    assert [(p["process"], p["path"], p["source"]) for p in paths] == [
        ("engine", "compiled", "wheel"),
        ("MP server", "fallback", None),
    ]
    line = f"LMCache copy path: engine compiled (wheel); MP server fallback (lmcache.cuda_ops: {UNDEFINED})"
    assert line in evidence.findings
    assert evidence.signals["cuda_ops"] == "loaded: wheel"  # the old key: the engine's
    assert not any("unknown" in f for f in evidence.findings)
    v1 = lmcache_evidence([], HITS, connector="LMCacheConnectorV1", engine_build=FAILED_BUILD)
    assert [p["process"] for p in v1.signals["copy_paths"]] == ["engine"]
    assert v1.signals["cuda_ops"] == f"not loaded: lmcache.cuda_ops: {UNDEFINED}"
