from repro.verdict import ERROR, FAIL, INCONCLUSIVE, PASS, Request, decide_baseline_probe, decide_probe, worst

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
