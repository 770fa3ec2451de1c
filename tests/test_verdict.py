from repro.judge.verdict import ERROR, FAIL, INCONCLUSIVE, PASS, Request, decide_baseline_probe, decide_probe, worst

BASE = (1, 2, 3, 4)


def r(ids, cached):
    return Request(tuple(ids), cached)


def test_pass_needs_hits_and_exact_match():
    v = decide_probe(BASE, r(BASE, 0), [r(BASE, 1280), r(BASE, 1280)])
    assert v.verdict == PASS and v.reasons == ()
    assert v.reuse_first_diffs == (None, None)


def test_fail_records_every_reuse_first_diff():
    v = decide_probe(BASE, r(BASE, 0), [r((1, 2, 3, 9), 1280), r((1, 9, 3, 4), 1280), r(BASE, 1280)])
    assert v.verdict == FAIL
    assert v.reuse_first_diffs == (3, 1, None)
    assert any("@3" in x for x in v.reasons) and any("@1" in x for x in v.reasons)


def test_zero_hit_reuse_is_inconclusive_not_pass():
    v = decide_probe(BASE, r(BASE, 0), [r(BASE, 0)])
    assert v.verdict == INCONCLUSIVE
    assert "zero cached" in v.reasons[0]


def test_missing_counter_is_never_read_as_zero_or_hit():
    v = decide_probe(BASE, r(BASE, 0), [r(BASE, None)])
    assert v.verdict == INCONCLUSIVE and "missing" in v.reasons[0]
    # a differing reuse without a counter cannot be blamed either
    v = decide_probe(BASE, r(BASE, 0), [r((9, 9, 9, 9), None)])
    assert v.verdict == INCONCLUSIVE


def test_cold_hit_makes_probe_inconclusive_even_if_reuse_differs():
    v = decide_probe(BASE, r(BASE, 16), [r((9, 2, 3, 4), 1488)])
    assert v.verdict == INCONCLUSIVE
    assert "not a verified miss" in v.reasons[0]


def test_cold_missing_counter_is_inconclusive():
    assert decide_probe(BASE, r(BASE, None), [r(BASE, 1488)]).verdict == INCONCLUSIVE


def test_cold_differs_from_baseline_blames_nothing():
    v = decide_probe(BASE, r((1, 2, 7, 4), 0), [r((1, 2, 7, 4), 1488)])
    assert v.verdict == INCONCLUSIVE
    assert v.cold_first_diff == 2
    assert "cannot be blamed" in v.reasons[0]


def test_no_reuses_is_inconclusive():
    assert decide_probe(BASE, r(BASE, 0), []).verdict == INCONCLUSIVE


def test_fail_outranks_an_unproven_sibling_reuse():
    v = decide_probe(BASE, r(BASE, 0), [r(BASE, 0), r((1, 2, 3, 5), 256)])
    assert v.verdict == FAIL


def test_baseline_probe_must_report_zero():
    assert decide_baseline_probe(r(BASE, 0)).verdict == PASS
    assert decide_baseline_probe(r(BASE, 16)).verdict == INCONCLUSIVE
    assert decide_baseline_probe(r(BASE, None)).verdict == INCONCLUSIVE


def test_worst_orders_error_fail_inconclusive_pass():
    assert worst([PASS, INCONCLUSIVE]) == INCONCLUSIVE
    assert worst([PASS, FAIL, INCONCLUSIVE]) == FAIL
    assert worst([FAIL, ERROR]) == ERROR
    assert worst([PASS, PASS]) == PASS
    assert worst([]) == INCONCLUSIVE


# ---- the verdict authority: arm verdicts, downgrades, skips, failures -------------------------------

from repro.judge.verdict import (
    SKIPPED,
    VERDICTS,
    ArmVerdict,
    ProbeVerdict,
    decide_arm,
    decide_child_failure,
    decide_incomparable,
    decide_lmcache_degraded,
    decide_shared_first_block,
    decide_skipped,
)


def test_a_reuse_against_a_baseline_probe_that_is_not_pass_is_inconclusive():
    """Bug a: the baseline reported cached tokens with caching off; a matching reuse must not PASS."""
    v = decide_probe(BASE, r(BASE, 0), [r(BASE, 1280)], baseline_verdict=INCONCLUSIVE)
    assert v.verdict == INCONCLUSIVE
    assert v.reasons[0] == "the baseline's own probe is INCONCLUSIVE: it is not a reference"
    # nor can it blame: a differing reuse against such a baseline is not a FAIL either
    assert decide_probe(BASE, r(BASE, 0), [r((9,), 1280)], baseline_verdict=INCONCLUSIVE).verdict == INCONCLUSIVE


def test_skipped_is_a_verdict_and_never_judged():
    assert SKIPPED in VERDICTS
    skipped = decide_skipped("cannot hit 513 tokens")
    assert skipped == ProbeVerdict(SKIPPED, ("cannot hit 513 tokens",), None)
    arm = decide_arm([("a", ProbeVerdict(PASS, (), None)), ("b", skipped)])
    assert arm == ArmVerdict(PASS, ())
    assert decide_arm([("b", skipped)]) == ArmVerdict(INCONCLUSIVE, ("no probe was run",))


def test_the_arm_takes_its_worst_probe_with_every_non_pass_reason():
    arm = decide_arm(
        [
            ("a", ProbeVerdict(PASS, (), None)),
            ("b", ProbeVerdict(INCONCLUSIVE, ("reuse 1: zero cached tokens",), None)),
            ("c", ProbeVerdict(FAIL, ("reuse 1: 256 cached tokens, differs from baseline @2",), None)),
        ]
    )
    assert arm.verdict == FAIL and arm.error_kind is None
    assert arm.reasons == ("b: reuse 1: zero cached tokens", "c: reuse 1: 256 cached tokens, differs from baseline @2")


def test_a_shared_first_block_downgrades_pass_and_fail_but_not_error():
    for verdict in (PASS, FAIL):
        got = decide_shared_first_block(ProbeVerdict(verdict, ("x",), None), "p1")
        assert got.verdict == INCONCLUSIVE
        assert got.reasons == ("x", "shares its first block with probe p1: probes are not isolated")
    error = ProbeVerdict(ERROR, ("boom",), None)
    assert decide_shared_first_block(error, "p1") is error


def test_child_failures_refusals_and_degraded_mode_are_named_errors():
    crash = decide_child_failure("crash", "killed by SIGKILL")
    assert crash == ArmVerdict(ERROR, ("crash: killed by SIGKILL",), "crash", "killed by SIGKILL")
    refused = decide_incomparable(["dtype differs: baseline 'float32' vs x 'float16'"])
    assert refused.verdict == ERROR
    assert refused.reasons == ("refusing to compare: dtype differs: baseline 'float32' vs x 'float16'",)
    ok = ArmVerdict(PASS, ())
    assert decide_lmcache_degraded(ok, []) is ok
    assert decide_lmcache_degraded(crash, ["entering degraded mode"]) is crash  # an ERROR keeps its own error
    degraded = decide_lmcache_degraded(ok, ["entering degraded mode"])
    assert degraded.verdict == ERROR and degraded.error_kind == "lmcache-degraded"


def _beneath(cached, external, ids=(1, 2, 3)):
    """A reuse on an arm whose connector sits beneath the GPU prefix cache (repro.plan.offloading)."""
    return Request(ids, cached, external, counts_external=True)


def test_beneath_the_gpu_cache_only_the_connectors_own_hits_clear_it():
    cold = Request((1, 2, 3), 0)
    # every hit from the connector: PASS
    assert decide_probe((1, 2, 3), cold, [_beneath(32, 32)]).verdict == PASS
    # the GPU cache served it all: not a PASS of the connector
    pv = decide_probe((1, 2, 3), cold, [_beneath(32, 0)])
    assert pv.verdict == INCONCLUSIVE and "connector not exercised" in pv.reasons[0]
    # the connector's count missing (or vLLM's -1): inconclusive, never read as zero or a hit
    for missing in (None, -1):
        pv = decide_probe((1, 2, 3), cold, [_beneath(32, missing)])
        assert pv.verdict == INCONCLUSIVE and "the connector's hit counter missing" in pv.reasons[0], pv.reasons
    # one reuse served by the connector, one not: the unproven one keeps the probe from a PASS
    assert decide_probe((1, 2, 3), cold, [_beneath(32, 32), _beneath(32, 0)]).verdict == INCONCLUSIVE


def test_beneath_the_gpu_cache_a_changed_answer_fails_whoever_served_it():
    cold = Request((1, 2, 3), 0)
    for external, says in ((16, "16 from the connector"), (0, "0 from the connector"), (None, "count missing")):
        pv = decide_probe((1, 2, 3), cold, [_beneath(32, external, ids=(1, 9, 3))])
        assert pv.verdict == FAIL and "@1" in pv.reasons[0] and says in pv.reasons[0], pv.reasons
    # no hit at all: nothing was reused, whatever the connector's count says
    assert decide_probe((1, 2, 3), cold, [_beneath(0, 0)]).verdict == INCONCLUSIVE
