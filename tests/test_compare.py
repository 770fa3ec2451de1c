from repro.judge.compare import NEAR_TIE_NATS, first_diff, margin_at


def test_identical_sequences_have_no_diff():
    assert first_diff([1, 2, 3], [1, 2, 3]) is None


def test_first_differing_index_is_reported():
    assert first_diff([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert first_diff([5], [6]) == 0


def test_length_difference_counts_as_a_difference():
    assert first_diff([1, 2, 3], [1, 2]) == 2
    assert first_diff([], [7]) == 0


def test_margin_both_sides_when_tokens_are_in_top_k():
    m = margin_at(1, [10, 11], [10, 12], [[11, -0.1], [12, -2.6]], [[12, -0.3], [11, -1.0]])
    assert m.baseline_token == 11 and m.reuse_token == 12
    assert abs(m.baseline_margin - 2.5) < 1e-9
    assert abs(m.reuse_margin - 0.7) < 1e-9
    assert abs(m.baseline_top_gap - 2.5) < 1e-9
    assert not m.near_tie


def test_near_tie_is_flagged_below_threshold():
    m = margin_at(0, [3], [4], [[3, -0.70], [4, -0.75]], [[4, -0.6], [3, -0.8]])
    assert m.baseline_top_gap < NEAR_TIE_NATS
    assert m.near_tie


def test_reuse_token_outside_baseline_top_k_gives_a_lower_bound():
    m = margin_at(0, [3], [9], [[3, -0.1], [4, -3.0]], [[9, -0.2]])
    assert m.baseline_margin is None
    assert abs(m.baseline_gap_lower_bound - 2.9) < 1e-9
    assert m.reuse_margin is None
