"""Prompt-logprob probes without an engine: a fixture probe's prompt_logprobs read and checked (bad input one line,
exit 2), the child's sampling parameters and compact record (fakes of vLLM's objects), the comparison with the
baseline's, the check that flags reuse turned off by prompt_logprobs, and both hooks (plain probes, scenario
requests) with the report's summary and schema."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
from kvkit_testutil import run_cli
from test_adapters_judge import _arm, _probe

from repro.contract.result import RequestResult
from repro.engine.prompt_logprobs import record, sampling_for
from repro.errors import UsageError
from repro.judge import prompt_logprobs as plp
from repro.judge.evaluate import judge_arm
from repro.judge.scenario_verdict import decide_scenario_request
from repro.judge.verdict import FAIL, INCONCLUSIVE, PASS, Request
from repro.models import tiny
from repro.plan.fixtures import load_fixture
from repro.plan.prompt_logprobs import MAX_PROMPT_LOGPROBS
from repro.readmodel.requests import Request as ReadRequest

ANSWER = [265, 82, 40, 58, 183, 274, 144, 98, 147, 217, 3, 10, 55, 151, 81, 100]
BASE = {"k": 1, "logprobs": [-5.5, -4.25, -6.0, -3.0], "top1": [7, 9, 11, 13], "nonfinite": 0}


def _fixture(tmp: Path, value: object, version: int = 3) -> Path:
    probe = {"name": "p", "prompt": {"token_ids": list(range(3, 40))}, "prompt_logprobs": value}
    data = {"kind": "kvkit-fixture", "schema_version": version, "name": "t", "tokenizer": {"name": "t"},
            "probes": [probe]}  # fmt: skip
    path = tmp / "fixture.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# ---- the fixture


@pytest.mark.parametrize("k", [0, 1, MAX_PROMPT_LOGPROBS])
def test_a_probe_asks_for_prompt_logprobs_and_its_spec_carries_them(tmp_path, k):
    probe = load_fixture(_fixture(tmp_path, k)).probes[0]
    assert probe.prompt_logprobs == k and probe.prompt_spec()["prompt_logprobs"] == k


def test_a_probe_that_asks_for_none_has_the_spec_it_always_had(tmp_path):
    data = json.loads(_fixture(tmp_path, 1).read_text())
    del data["probes"][0]["prompt_logprobs"]
    (tmp_path / "fixture.json").write_text(json.dumps(data))
    assert load_fixture(tmp_path / "fixture.json").probes[0].prompt_spec() == {"token_ids": list(range(3, 40))}


@pytest.mark.parametrize("value", [-1, MAX_PROMPT_LOGPROBS + 1, 1.5, True, "1", None])
def test_a_bad_prompt_logprobs_is_one_line(tmp_path, value):
    with pytest.raises(UsageError, match=r"probes\[0\]\.prompt_logprobs: must be an integer from 0 to 20") as err:
        load_fixture(_fixture(tmp_path, value))
    assert "\n" not in str(err.value)


def test_prompt_logprobs_need_schema_version_3(tmp_path):
    with pytest.raises(UsageError, match="a probe's prompt_logprobs needs schema_version 3"):
        load_fixture(_fixture(tmp_path, 1, version=2))


def test_a_bad_prompt_logprobs_on_the_command_line_is_one_line_exit_2(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(tiny.CONFIG), encoding="utf-8")
    report = tmp_path / "out" / "report.json"
    args = ["--model", str(model), "--device", "cpu", "--fixture", str(_fixture(tmp_path, 99)), "--report",
            str(report), "--compare-native", "--engine-module", "tests.fake_engine"]  # fmt: skip
    proc = run_cli(args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert "prompt_logprobs: must be an integer from 0 to 20" in proc.stderr and not report.exists()


# ---- the child's side, on fakes of vLLM's objects


class _Params:
    def __init__(self, temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=2, seed=0, prompt_logprobs=None,
                 detokenize=True):  # fmt: skip
        self.temperature, self.max_tokens, self.ignore_eos = temperature, max_tokens, ignore_eos
        self.logprobs, self.seed, self.prompt_logprobs, self.detokenize = logprobs, seed, prompt_logprobs, detokenize


@dataclass
class _Lp:
    logprob: float
    rank: int


@dataclass
class _Out:
    prompt_token_ids: list
    prompt_logprobs: list


def test_sampling_params_are_untouched_where_no_prompt_asks():
    sp = _Params()
    assert sampling_for(sp, [{"token_ids": [1, 2]}]) is sp


def test_sampling_params_are_built_afresh_per_prompt_where_one_asks():
    sp = _Params()
    plain, asks = sampling_for(sp, [{"token_ids": [1]}, {"token_ids": [2], "prompt_logprobs": 3}])
    assert plain is sp and asks.prompt_logprobs == 3 and not asks.detokenize  # IDs only: no text decoded
    assert (asks.max_tokens, asks.logprobs, asks.seed, asks.ignore_eos) == (16, 2, 0, True)


def test_the_record_keeps_each_prompt_tokens_logprob_and_the_top_1():
    steps = [None, {5: _Lp(-1.5, 2), 9: _Lp(-0.5, 1)}, {6: _Lp(-0.25, 1)}, {7: _Lp(math.nan, 1)}]
    got = record(_Out([4, 5, 6, 7], steps), 1)
    assert got == {"k": 1, "logprobs": [-1.5, -0.25, None], "top1": [9, 6, 7], "nonfinite": 1, "prompt_tokens": 4}
    assert record(_Out([4, 5], [None, {5: _Lp(-1.0, 3)}]), 0)["top1"] == [None]  # k=0: no alternative returned
    assert record(_Out([4, 5], []), None) is None


def test_the_record_travels_in_the_result_and_is_absent_otherwise():
    req = RequestResult("cold", 0, (1, 2), (), "length", None, None, prompt_logprobs=BASE)
    assert RequestResult.from_json(req.to_json(), "r") == req
    assert "prompt_logprobs" not in RequestResult("cold", 0, (1,), (), "length", None, None).to_json()


# ---- the comparison and the check


def test_equal_records_are_exact():
    c = plp.compare(BASE, BASE)
    assert (c.cls, c.top1_first_diff, c.value_first_diff, c.max_abs_diff) == (plp.EXACT_VALUES, None, None, 0.0)


def test_values_that_differ_are_reported_and_classed_but_decide_nothing():
    c = plp.compare({**BASE, "logprobs": [-5.5, -4.25, -6.00001, -3.0]}, BASE)
    assert (c.cls, c.value_first_diff, c.value_last_diff, c.top1_first_diff) == (plp.VALUES_DIFFER, 2, 2, None)
    assert c.max_abs_diff == pytest.approx(1e-5)
    assert plp.findings(BASE, c, hits=288, expect_reuse=True) == []


def test_a_top_1_that_differs_fails_a_hit_and_is_inconclusive_on_a_miss():
    c = plp.compare({**BASE, "top1": [7, 9, 12345, 13]}, BASE)
    assert (c.cls, c.top1_first_diff, c.top1_differ) == (plp.TOP1_DIFFERS, 2, 1)
    [(verdict, reason)] = plp.findings(BASE, c, hits=288, expect_reuse=True)
    assert (
        verdict == FAIL and reason.startswith("288 cached tokens, prompt logprobs' top-1 IDs differ") and "@2" in reason
    )
    [(verdict, reason)] = plp.findings(BASE, c, hits=0, expect_reuse=False)
    assert verdict == INCONCLUSIVE and reason.endswith("on a miss: no reuse to blame")


def test_fewer_positions_or_a_value_no_logprob_can_be_is_a_finding():
    assert (
        plp.compare({**BASE, "logprobs": BASE["logprobs"][:3], "top1": BASE["top1"][:3]}, BASE).cls == plp.TOP1_DIFFERS
    )
    c = plp.compare({**BASE, "logprobs": [-5.5, 3.0, None, -3.0]}, BASE)
    assert (c.cls, c.invalid, c.max_abs_diff) == (plp.INVALID, 2, 0.0)
    assert plp.findings(BASE, c, hits=16, expect_reuse=True)[0][0] == FAIL


def test_a_reuse_expected_to_hit_that_asked_for_prompt_logprobs_and_reports_0_is_turned_off():
    [(verdict, reason)] = plp.findings(BASE, plp.compare(BASE, BASE), hits=0, expect_reuse=True)
    assert verdict == INCONCLUSIVE and reason.startswith(plp.TURNED_OFF)
    assert plp.findings(BASE, plp.compare(BASE, BASE), hits=0, expect_reuse=False) == []  # a miss was expected
    assert plp.findings(None, None, hits=0, expect_reuse=True) == []  # it asked for none: the plain rules alone


def test_the_summary_is_small_and_its_digest_tells_records_apart():
    s = plp.summary(BASE, plp.compare(BASE, BASE))
    assert set(s) == {"k", "positions", "digest", "vs_baseline"} and s["positions"] == 4
    assert s["digest"] != plp.summary({**BASE, "top1": [7, 9, 11, 14]}, None)["digest"]
    assert "logprobs" not in json.dumps(s).replace("prompt_logprobs", "")


# ---- the hooks: plain probes and scenario requests


def _with(probe, records):
    reqs = tuple(r.__class__(**{**r.__dict__, "prompt_logprobs": rec}) for r, rec in zip(probe.requests, records))
    return probe.__class__(probe.name, probe.prompt_token_ids, probe.messages, reqs, probe.adapter)


def _judged(reuse_record, cached=288):
    base = _with(_probe("p", None, [ANSWER]), [BASE])
    arm = _with(_probe("p", None, [ANSWER, ANSWER], cached=cached), [BASE, reuse_record])
    entries, verdict = judge_arm(_arm("Conn", [arm]), _arm("baseline", [base]), "connector", 16)
    return entries[0], verdict


def test_a_native_reuse_turned_off_by_prompt_logprobs_is_never_a_pass():
    entry, verdict = _judged(BASE, cached=0)
    assert verdict.verdict == INCONCLUSIVE
    assert any(plp.TURNED_OFF in r for r in verdict.reasons), verdict.reasons
    assert entry["requests"][1]["prompt_logprobs"]["vs_baseline"]["class"] == plp.EXACT_VALUES


def test_a_connector_reuse_whose_prompt_logprobs_are_stale_fails_with_its_tokens_equal():
    stale = {**BASE, "logprobs": [0.0, 0.0, -6.0, -3.0], "top1": [0, 0, 11, 13]}
    entry, verdict = _judged(stale)
    assert verdict.verdict == FAIL and entry["requests"][1]["first_diff"] is None  # the tokens matched
    assert any("top-1 IDs differ from the baseline's @0 (2 of 4" in r for r in verdict.reasons), verdict.reasons
    assert "logprobs" not in entry["requests"][1]["prompt_logprobs"]  # a summary, never the values


def test_a_connector_reuse_with_exact_prompt_logprobs_passes():
    entry, verdict = _judged(BASE)
    assert verdict.verdict == PASS and entry["requests"][1]["prompt_logprobs"]["vs_baseline"]["top1_differ"] == 0


def test_a_scenario_request_is_judged_the_same_way():
    base = RequestResult("cold", 0, tuple(ANSWER), (), "length", None, None, prompt_logprobs=BASE)
    for cached, rec, want in (
        (0, BASE, INCONCLUSIVE),
        (288, {**BASE, "top1": [1, 9, 11, 13]}, FAIL),
        (288, BASE, PASS),
    ):
        req = RequestResult("reuse", cached, tuple(ANSWER), (), "length", None, None, prompt_logprobs=rec)
        v = decide_scenario_request(tuple(ANSWER), Request(tuple(ANSWER), cached), "reuse", True)
        judged, summary = plp.judge_request(v, req, base, expect_reuse=True)
        assert judged.verdict == want and summary["vs_baseline"] is not None, judged.reasons


def test_the_views_say_what_a_requests_prompt_logprobs_show():
    stale = {**BASE, "logprobs": [1.0, 1.0, -6.0, -3.0], "top1": [0, 0, 11, 13]}
    summary = plp.summary(stale, plp.compare(stale, BASE))
    text = ReadRequest.from_json({"role": "reuse", "cached_tokens": 2, "prompt_logprobs": summary}).prompt_logprobs_text
    assert (
        text
        == "prompt logprobs' top-1 IDs differ @0 at 2 of 4 positions; values differ @0-1 (2 no logprob; max |diff| 0.0 where both are)"
    )
    off = ReadRequest.from_json(
        {"role": "reuse", "cached_tokens": 0, "prompt_logprobs": plp.summary(BASE, plp.compare(BASE, BASE))}
    )
    assert off.prompt_logprobs_text == f"{plp.TURNED_OFF} (prompt_logprobs=1)"
    assert ReadRequest.from_json({"role": "reuse", "cached_tokens": 2}).prompt_logprobs_text == ""
