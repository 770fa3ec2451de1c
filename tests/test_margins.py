"""The calibration's pure half (repro.measure.margins): float16 ULPs, steps compared up to a flipped token, the
summary of how far gaps moved, the table, and the line the engine child prints. No engine."""

from __future__ import annotations

import json

import pytest

from repro.engine import margins as engine_margins
from repro.measure import margins
from repro.measure.margins import Step, compare_steps, format_comparison, parse_steps, summarize, ulp


def run(**probes) -> dict:
    """A variant's steps: probe name -> [(token, top-1 logit, runner-up logit), ...]."""
    return {
        "probes": {
            name: {"tokens": [t for t, _, _ in steps], "top": [[[t, a], [t + 1, b]] for t, a, b in steps]}
            for name, steps in probes.items()
        }
    }


def test_ulp_is_the_spacing_of_the_dtype_at_that_magnitude():
    assert ulp(100.0) == 2.0**-4  # [64, 128): 2^(6-10)
    assert ulp(-100.0) == 2.0**-4
    assert ulp(64.0) == 2.0**-4 and ulp(63.99) == 2.0**-5
    assert ulp(1.0) == 2.0**-10
    assert ulp(100.0, "bfloat16") == 0.5
    assert ulp(1.0, "float32") == 2.0**-23
    assert ulp(0.0) == 0.0


def test_steps_are_compared_up_to_and_including_the_first_flipped_token():
    reference = run(a=[(5, 100.0, 99.9), (6, 90.0, 80.0), (7, 70.0, 60.0)], b=[(1, 10.0, 9.0)])
    variant = run(a=[(5, 100.0, 99.7), (8, 90.0, 89.0), (9, 70.0, 69.0)], b=[(1, 10.0, 9.0)], c=[(1, 1.0, 0.0)])
    steps = compare_steps(reference, variant)
    assert [(s.probe, s.index, s.flipped) for s in steps] == [("a", 0, False), ("a", 1, True), ("b", 0, False)]
    assert steps[0].delta == pytest.approx(0.2) and steps[0].gap == pytest.approx(0.1)
    assert steps[1].delta == pytest.approx(-9.0)
    assert steps[0].gap_ulps == pytest.approx(0.1 / 2**-4)


def test_the_summary_names_the_largest_move_and_every_flip():
    steps = [
        Step("a", 0, 100.0, 0.1875, 0.0625, False),
        Step("a", 1, 10.0, 2.0, -0.25, True),
        Step("b", 0, 200.0, 5.0, 0.0, False),
    ]
    s = summarize("float16", steps)
    assert (s.steps, s.max_abs, s.max_at, s.median_abs) == (3, 0.25, "a @1", 0.0625)
    assert s.max_abs_ulps == pytest.approx(32.0)  # 0.0625 at |100| is 1 ulp; 0.25 at |10| (ulp 2^-7) is 32
    assert s.flips == ("a @1 (gap 2.0000)",)


def test_the_table_has_a_row_per_step_and_a_line_per_variant():
    reference = run(a=[(5, 100.0, 99.9), (6, 90.0, 80.0)])
    text = format_comparison(reference, {"again": reference, "f16": run(a=[(5, 100.0, 99.8), (9, 90.0, 89.0)])})
    rows = [line for line in text.splitlines() if line.startswith("a ")]
    assert len(rows) == 2
    assert "+0.00000" in rows[0] and "-9.00000*" in rows[1]
    assert "again: 2 steps, every gap bit-identical; flips: none" in text
    assert "f16: 2 steps, max |Δgap| 9.00000 nats at a @1" in text and "flips: a @1 (gap 10.0000)" in text


def test_the_parent_reads_the_last_line_the_child_marks():
    assert margins.STEPS_MARK == engine_margins.STEPS_MARK
    log = "noise\n" + margins.STEPS_MARK + json.dumps({"x": 1}) + "\n" + margins.STEPS_MARK + '{"x": 2}\nmore\n'
    assert parse_steps(log) == {"x": 2}
    assert parse_steps("an engine that died\n") is None


def test_the_variants_are_named_once_and_the_reference_is_the_default_kernels():
    names = [n for n, _, _ in margins.VARIANTS]
    assert len(names) == len(set(names)) and margins.VARIANTS[0] == ("default", "float32", {})
    assert margins.VARIANT_KEYS == {"ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"}
