"""repro.judge.trials and repro.run.sharing: runs reduced to findings, rates per probe, the class of a finding
made while sharing, and who overlapped whom (pure functions, no engine)."""

from repro.judge import trials
from repro.judge.verdict import CORRUPT, FOREIGN, MISPLACED
from repro.run.sharing import ARM, CPU_CORES, GPU_LOAD, SERVER, Window, sharing_of, who_shared


def _entry(verdict="PASS", probes=(), error=None):
    return {
        "verdict": verdict,
        "error": error,
        "timing": {"wall_s": 10.0},
        "probes": [
            {
                "name": name,
                "verdict": v,
                "skipped": None,
                "kv": None if kv is None else {"verdict": kv},
                "requests": [{"first_diff": d, "cached_tokens": c} for d, c in reqs],
            }
            for name, v, kv, reqs in probes
        ],
    }


CLEAN = ("chat", "PASS", "EXACT", [(None, 0), (None, 256)])
FAILED = ("chat", "FAIL", "EXACT", [(None, 0), (6, 256)])
FAILED_ELSEWHERE = ("chat", "FAIL", "EXACT", [(None, 0), (9, 256)])
FAILED_OTHER_PROBE = ("other", "FAIL", "EXACT", [(None, 0), (6, 256)])
CORRUPTED = ("chat", "PASS", "CORRUPT", [(None, 0), (None, 256)])
MISPLACED_KV = ("chat", "PASS", MISPLACED, [(None, 0), (None, 256)])
FOREIGN_KV = ("chat", "PASS", FOREIGN, [(None, 0), (None, 256)])
NO_KV = {"kv_corrupt": 0, "kv_foreign": 0, "kv_misplaced": 0}


def _run(probe, trial=1, shared=True, verdict=None):
    return trials.run_summary(_entry(verdict or probe[1], [probe]), trial, shared)


def test_run_summary_keeps_first_diffs_cached_tokens_and_kv_and_drops_skipped_probes():
    entry = _entry("FAIL", [FAILED])
    entry["probes"].append({"name": "gone", "skipped": "no prefix", "requests": [], "verdict": "SKIPPED"})
    run = trials.run_summary(entry, 3, False)
    assert run == {
        "trial": 3,
        "verdict": "FAIL",
        "error": None,
        "wall_s": 10.0,
        "shared": False,
        "probes": [
            {"name": "chat", "verdict": "FAIL", "first_diffs": [None, 6], "cached_tokens": [0, 256], "kv": "EXACT"}
        ],
    }


def test_one_failing_trial_of_three_is_intermittent_with_its_rate():
    runs = [_run(FAILED, 1), _run(CLEAN, 2), _run(CLEAN, 3)]
    out = trials.trial_rates(runs)
    assert out["class"] == trials.INTERMITTENT
    assert out["rates"] == [{"probe": "chat", "failed": 1, **NO_KV, "of": 3, "class": trials.INTERMITTENT}]
    assert trials.rate_text(out) == "chat FAIL 1/3 (intermittent)"


def test_every_trial_failing_is_consistent_and_none_is_clean():
    assert trials.trial_rates([_run(FAILED, k) for k in (1, 2, 3)])["class"] == trials.CONSISTENT
    assert trials.trial_rates([_run(CLEAN, k) for k in (1, 2)])["class"] == trials.CLEAN
    # a CORRUPT block with the right tokens is a finding too
    rates = trials.trial_rates([_run(CORRUPTED, 1), _run(CLEAN, 2)])
    assert rates["rates"][0]["kv_corrupt"] == 1 and rates["class"] == trials.INTERMITTENT


def test_every_kv_finding_is_a_finding_counted_by_its_class():
    """MISPLACED and FOREIGN with the right tokens are findings as CORRUPT is, each counted apart and named."""
    rates = trials.trial_rates([_run(MISPLACED_KV, 1), _run(CLEAN, 2), _run(FOREIGN_KV, 3), _run(CORRUPTED, 4)])
    rate = rates["rates"][0]
    assert (rate["kv_corrupt"], rate["kv_foreign"], rate["kv_misplaced"]) == (1, 1, 1)
    assert rate["class"] == rates["class"] == trials.INTERMITTENT and trials.kv_found(rate) == 3
    assert trials.rate_text(rates) == "chat FAIL 0/4, KV CORRUPT 1/4, KV FOREIGN 1/4, KV MISPLACED 1/4 (intermittent)"
    every = trials.trial_rates([_run(MISPLACED_KV, k) for k in (1, 2)])
    assert every["class"] == trials.CONSISTENT and every["rates"][0]["kv_misplaced"] == 2
    # a rate written before the finer classes has kv_corrupt only: the others read as none
    assert trials.kv_rate_counts({"kv_corrupt": 2}) == [(CORRUPT, 2)] and trials.kv_found({"kv_corrupt": 0}) == 0
    assert trials.needs_confirmation([_run(FOREIGN_KV, 1)])["trial"] == 1


def test_a_run_alone_that_blames_another_kv_class_is_not_deterministic():
    """The same probe blamed again alone, but MISPLACED where the shared run said CORRUPT: not the same finding."""
    shared = [_run(CORRUPTED, 1)]
    assert trials.classify_confirmation(shared, _run(CORRUPTED, None, shared=False))[0] == trials.DETERMINISTIC
    assert trials.classify_confirmation(shared, _run(MISPLACED_KV, None, shared=False))[0] == trials.REPRODUCED_VARYING
    assert trials.classify_confirmation([_run(MISPLACED_KV, 1)], _run(CLEAN, None, False))[0] == (
        trials.CONTENTION_DEPENDENT
    )


def test_only_a_finding_made_while_sharing_needs_confirming():
    assert trials.needs_confirmation([_run(FAILED, 1, shared=False)]) is None
    assert trials.needs_confirmation([_run(CLEAN, 1, shared=True)]) is None
    assert trials.needs_confirmation([_run(CLEAN, 1), _run(FAILED, 2)])["trial"] == 2


def test_confirmation_classes():
    shared = [_run(FAILED, 1)]
    alone_same = _run(FAILED, None, shared=False)
    alone_clean = _run(CLEAN, None, shared=False)
    alone_other = _run(FAILED_ELSEWHERE, None, shared=False)
    alone_error = trials.run_summary(_entry("ERROR", [], {"kind": "timeout", "detail": "x"}), None, False)
    assert trials.classify_confirmation(shared, alone_same)[0] == trials.DETERMINISTIC
    assert trials.classify_confirmation(shared, alone_clean)[0] == trials.CONTENTION_DEPENDENT
    cls, reason = trials.classify_confirmation(shared, alone_other)
    assert cls == trials.REPRODUCED_VARYING and "the same probes wrong again" in reason
    alone_other_probe = _run(FAILED_OTHER_PROBE, None, shared=False)
    assert trials.classify_confirmation(shared, alone_other_probe)[0] == trials.NOT_REPRODUCED
    cls, reason = trials.classify_confirmation(shared, alone_error)
    assert cls == trials.UNCONFIRMED and "timeout" in reason


def test_a_clean_run_alone_after_intermittent_shared_trials_is_not_called_contention():
    """One shared trial was clean too: a clean run alone cannot tell contention from chance."""
    shared = [_run(FAILED, 1), _run(CLEAN, 2)]
    cls, reason = trials.classify_confirmation(shared, _run(CLEAN, None, shared=False))
    assert cls == trials.NOT_REPRODUCED and "chance" in reason


def test_sharing_counts_other_arms_other_servers_and_the_load_not_the_arms_own_server():
    windows = [
        Window("arm mp", ARM, "mp", ("GPU 0",), 10.0, 70.0),
        Window("LMCache MP server of mp", SERVER, "mp", ("GPU 0",), 5.0, 72.0),
        Window("arm native", ARM, "native", ("GPU 0",), 0.0, 40.0),
        Window("arm other-gpu", ARM, "other", ("GPU 1",), 0.0, 90.0),
        Window("gpu-load", GPU_LOAD, None, ("GPU 0", "GPU 1"), 60.0, 100.0),
    ]
    s = sharing_of("mp", windows)
    assert s["shared"] is True and s["resource"] == "GPU 0" and s["window_s"] == [10.0, 70.0]
    assert [(o["process"], o["overlap_s"], o["own"]) for o in s["others"]] == [
        ("LMCache MP server of mp", 60.0, True),
        ("arm native", 30.0, False),
        ("gpu-load", 10.0, False),
    ]
    assert who_shared(s) == "shared GPU 0 with arm native (30 s), gpu-load (10 s)"
    alone = sharing_of("mp", windows[:2])
    assert alone["shared"] is False and who_shared(alone) == "alone on GPU 0"
    assert sharing_of("nobody", windows) is None


def test_cpu_arms_that_overlap_in_time_share_the_cores():
    windows = [
        Window("arm a", ARM, "a", (CPU_CORES,), 0.0, 10.0),
        Window("arm b", ARM, "b", (CPU_CORES,), 10.0, 20.0),  # touching, not overlapping
    ]
    assert sharing_of("a", windows)["shared"] is False
    windows.append(Window("arm c", ARM, "c", (CPU_CORES,), 5.0, 6.0))
    assert who_shared(sharing_of("a", windows)) == "shared CPU cores with arm c (1 s)"
