"""Answers that compare nothing (review 2026-12-05, D1 and D7) and answers shorter than asked, without an engine.

A stream in which no chunk carries token IDs is refused as a plain answer without them is; an answer that is not the
greedy ignore_eos window of max_tokens is refused on the served side and is an ERROR in the judge (plain probes and
P→D requests), never a PASS of two empty answers; prompt logprobs a stream does not carry are missing evidence, never
`exact`, and --stream with a prompt-logprob probe is one line, exit 2; a served answer without
usage.prompt_tokens_details names the server flag that sends it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from kvkit_testutil import run_cli

from repro.contract.result import ArmResult, ProbeResult, RequestResult
from repro.engine import served
from repro.engine.outputs import _request
from repro.engine.prompt_logprobs import record as plp_record
from repro.errors import UsageError
from repro.judge import evaluate
from repro.judge import prompt_logprobs as plp
from repro.judge.pd_verdict import Transfer, decide_pd_request
from repro.judge.verdict import ERROR, INCONCLUSIVE, PASS, Request, decide_baseline_probe, decide_probe

PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]


def _sse(chunks: list[dict]) -> bytes:
    return ("".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n").encode()


def _answer(ids: list[int] | None, details: bool = True) -> dict:
    usage = {"prompt_tokens": len(PROMPT), "completion_tokens": len(ids or [])}
    if details:
        usage["prompt_tokens_details"] = {"cached_tokens": 0}
    choice = {"index": 0, "text": "x" * len(ids or []), "finish_reason": "length", "prompt_token_ids": PROMPT}
    if ids is not None:
        choice["token_ids"] = ids
    return {"id": "cmpl-x", "choices": [choice], "usage": usage}


def _front(reply: bytes, stream: bool) -> served.ServerFrontend:
    """A served front end whose every HTTP call answers `reply` (no server, no engine)."""
    front = served.ServerFrontend.__new__(served.ServerFrontend)
    front.stream = stream
    front._call = lambda method, path, body=None: reply
    return front


def _sp(max_tokens: int, ignore_eos: bool = True) -> SimpleNamespace:
    return SimpleNamespace(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos, logprobs=None, seed=None,
                           prompt_logprobs=None)  # fmt: skip


# ---- D1: a stream with no token IDs ---------------------------------------------------------------------------------


def test_a_stream_in_which_no_chunk_carries_token_ids_is_refused_as_a_plain_answer_without_them_is():
    """A server that ignores return_token_ids while streaming: text chunks, a hit counter, no token IDs. Before, the
    joined answer held token_ids [] and passed as an answer of zero tokens."""
    raw = _sse([
        {"id": "cmpl-s", "choices": [{"index": 0, "text": "a"}]},
        {"id": "cmpl-s", "choices": [{"index": 0, "text": "b", "finish_reason": "length"}]},
        {"id": "cmpl-s", "choices": [], "usage": {"prompt_tokens": 8, "prompt_tokens_details": {"cached_tokens": 0}}},
    ])  # fmt: skip
    with pytest.raises(served.ServerFailed, match="no token_ids.*return_token_ids not supported by this server"):
        served.as_output(served.joined_stream(raw), PROMPT)
    with pytest.raises(served.ServerFailed, match="return_token_ids not supported by this server"):
        served.as_output(_answer(None), PROMPT)  # the plain answer, refused as before


# ---- an answer shorter or longer than asked -------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "ids, match", [([7, 8], r"answer has 2 of 4 tokens asked \(greedy, ignore_eos\)"), ([], r"answer has 0 of 4"),
                   ([1, 2, 3, 4, 5], r"answer has 5 tokens, over the 4 asked")],
)  # fmt: skip
def test_a_served_answer_that_is_not_its_greedy_ignore_eos_window_is_refused(stream, ids, match):
    """The child's generate (plain and --stream, served and repro endpoint alike): an answer of 2 (or 0, or 5) of the
    4 tokens asked is a ServerFailed, as an answer without token IDs is. Before, it was the arm's answer."""
    if stream:
        choice = {"index": 0, "text": "t", "token_ids": ids, "finish_reason": "length"}
        reply = _sse([{"id": "c", "choices": [choice]},
                      {"id": "c", "choices": [], "usage": {"prompt_tokens_details": {"cached_tokens": 0}}}])  # fmt: skip
    else:
        reply = json.dumps(_answer(ids)).encode()
    with pytest.raises(served.ServerFailed, match=match):
        _front(reply, stream).generate([{"prompt_token_ids": PROMPT}], _sp(4))


def test_a_served_answer_of_the_window_asked_passes_and_one_without_ignore_eos_may_stop_early():
    out = _front(json.dumps(_answer([7, 8, 9, 10])).encode(), False).generate([{"prompt_token_ids": PROMPT}], _sp(4))
    assert out[0].outputs[0].token_ids == [7, 8, 9, 10]
    # a request without ignore_eos (the child's priming request: max_tokens 1) may end at the end-of-sequence token
    primed = _front(json.dumps(_answer([])).encode(), False).generate([{"prompt_token_ids": PROMPT}], _sp(1, False))
    assert primed[0].outputs[0].token_ids == []


def test_an_empty_answer_is_never_a_pass_in_the_judge():
    """D1's shape in the judge: both servers answered (), and () equals (). Before: PASS."""
    pv = decide_probe((), Request((), 0), [Request((), 1280)])
    assert pv.verdict == ERROR, pv
    assert pv.reasons == ("cold request: answer has 0 tokens, at least 1 asked (greedy, ignore_eos)",
                          "reuse 1: answer has 0 tokens, at least 1 asked (greedy, ignore_eos)")  # fmt: skip
    assert decide_baseline_probe(Request((), 0)).verdict == ERROR


def test_an_answer_shorter_than_asked_is_an_error_for_its_probe_never_a_pass_or_a_finding():
    base = (1, 2, 3, 4)
    pv = decide_probe((1, 2), Request((1, 2), 0), [Request((1, 2), 1280)], asked=4)  # all cut alike
    assert pv.verdict == ERROR and pv.reasons[0] == "cold request: answer has 2 of 4 tokens asked (greedy, ignore_eos)"
    pv = decide_probe(base, Request(base, 0), [Request((1, 2), 1280)], asked=4)  # was a FAIL @2: not an answer
    assert pv.verdict == ERROR and pv.reasons == ("reuse 1: answer has 2 of 4 tokens asked (greedy, ignore_eos)",)
    pv = decide_probe((1, 2), Request(base, 0), [Request(base, 1280)], asked=4)  # the reference is cut
    assert pv.verdict == INCONCLUSIVE and "the baseline's answer has 2 of 4 tokens asked" in pv.reasons[0], pv
    assert decide_baseline_probe(Request((1, 2), 0), asked=4).verdict == ERROR
    assert decide_probe(base, Request(base, 0), [Request(base, 1280)], asked=4).verdict == PASS


def _arm(name: str, requests: tuple[RequestResult, ...]) -> ArmResult:
    config = {"model": "m", "revision": None, "dtype": "float32", "block_size": 4, "max_model_len": 64, "seed": 0,
              "enforce_eager": True}  # fmt: skip
    probe = ProbeResult("p", tuple(PROMPT), None, requests)
    return ArmResult(arm=name, probes=(probe,), effective_config=config, versions={"vllm": "x"}, fixture_sha256="f")


def _req(role: str, cached: int, ids: tuple = (), plp_rec: dict | None = None) -> RequestResult:
    return RequestResult(role, cached, ids, (), "length", None, "", prompt_logprobs=plp_rec)


def test_two_arms_that_answered_nothing_are_errors_never_a_pass():
    """The judged arms of `repro endpoint --stream` against a server that ignores return_token_ids, had the answers
    reached the judge: before, both arms PASSed (exit 0)."""
    base = _arm("baseline", (_req("cold", 0),))
    other = _arm("native", (_req("cold", 0), _req("reuse", 8)))
    _, bv = evaluate.judge_arm(base, None, "baseline", 4)
    _, ov = evaluate.judge_arm(other, base, "native", 4)
    assert (bv.verdict, ov.verdict) == (ERROR, ERROR), (bv, ov)


def test_a_pd_request_whose_answers_are_empty_or_cut_is_an_error():
    """P→D: a consumer and a reference that both answered () after a transfer that loaded. Before: PASS."""
    good = Transfer(external_tokens=32, local_tokens=0, cached_tokens=32, transfers=1, failed_transfers=0)
    pv = decide_pd_request("a", (), (), good, {})
    assert pv.verdict == ERROR and pv.reasons[0] == "answer has 0 tokens, at least 1 asked (greedy, ignore_eos)", pv
    pv = decide_pd_request("a", (1, 2), (1, 2), good, {}, asked=4)
    assert pv.verdict == ERROR
    assert pv.reasons == ("answer has 2 of 4 tokens asked (greedy, ignore_eos)",
                          "the baseline's answer has 2 of 4 tokens asked (greedy, ignore_eos)")  # fmt: skip
    assert decide_pd_request("a", (1, 2, 3, 4), (1, 2, 3, 4), good, {}, asked=4).verdict == PASS


# ---- D7: prompt logprobs a stream does not carry --------------------------------------------------------------------


def _streamed_plp() -> dict:
    """What the child records for a streamed request that asked for prompt logprobs: the stream carries none."""
    out = served.as_output(_answer([7, 8, 9, 10]), PROMPT)  # no prompt_logprobs field, as in vLLM's stream
    return plp_record(out, 1)


def test_prompt_logprobs_a_stream_does_not_carry_are_missing_never_exact():
    rec = _streamed_plp()
    c = plp.compare(rec, rec)
    assert c.cls != plp.EXACT_VALUES, c  # before: exact, 0 positions against 0
    assert rec["logprobs"] == [] and rec["prompt_tokens"] == len(PROMPT)
    found = plp.findings(rec, c, 8, expect_reuse=True)
    why = "prompt logprobs missing: 0 of 7 prompt positions returned; the baseline's record: 0 of 7 prompt positions"
    assert found == [(INCONCLUSIVE, why + " returned (nothing compared)")], found
    assert "vs_baseline" not in plp.summary(rec, c)  # the report's class stays one of a comparison made


def test_a_probe_with_missing_prompt_logprobs_is_inconclusive_and_the_report_keeps_no_class():
    """The probe judged end to end (repro.judge.evaluate): before, PASS with vs_baseline class exact."""
    full = {"k": 1, "logprobs": [-1.0] * 7, "top1": [5] * 7, "nonfinite": 0, "prompt_tokens": len(PROMPT)}
    base = _arm("baseline", (_req("cold", 0, (7, 8), _streamed_plp()),))  # both arms streamed, as with --stream
    streamed = _arm("native", (_req("cold", 0, (7, 8), _streamed_plp()), _req("reuse", 4, (7, 8), _streamed_plp())))
    entries, verdict = evaluate.judge_arm(streamed, base, "native", 4)
    assert verdict.verdict == INCONCLUSIVE, verdict
    assert any("reuse 1: prompt logprobs missing: 0 of 7 prompt positions returned" in r for r in verdict.reasons)
    assert all("vs_baseline" not in r["prompt_logprobs"] for r in entries[0]["requests"])
    _, own = evaluate.judge_arm(base, None, "baseline", 4)  # the baseline's own probe lacks them too
    assert own.verdict == INCONCLUSIVE and "prompt logprobs missing" in own.reasons[0], own
    cut = dict(full, logprobs=[-1.0] * 3, top1=[5] * 3)  # a record cut short on a hit: missing, not a FAIL
    found = plp.findings(cut, plp.compare(cut, full), 4, expect_reuse=True)
    assert [v for v, _ in found] == [INCONCLUSIVE] and "3 of 7 prompt positions returned" in found[0][1]


def _plp_fixture(tmp_path) -> str:
    data = {"kind": "kvkit-fixture", "schema_version": 3, "name": "t", "tokenizer": {"name": "fake"},
            "probes": [{"name": "asks", "prompt": {"token_ids": list(range(1, 40))}, "prompt_logprobs": 1},
                       {"name": "plain", "prompt": {"token_ids": list(range(2, 60))}}]}  # fmt: skip
    path = tmp_path / "fixture.json"
    path.write_text(json.dumps(data))
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    return str(path)


def _argv(tmp_path, *extra: str) -> list[str]:
    return ["--model", str(tmp_path / "model"), "--fixture", _plp_fixture(tmp_path), "--report",
            str(tmp_path / "out" / "r.json"), "--device", "cpu", "--max-model-len", "256", "--max-tokens", "4",
            "--block-size", "16", "--frontend", "server", "--compare-native", "--engine-module", "tests.fake_engine",
            *extra]  # fmt: skip


def test_stream_with_a_prompt_logprob_probe_is_refused_when_planned(tmp_path):
    from repro.plan.options import parse_args
    from repro.plan.run_plan import build_plan

    build_plan(parse_args(_argv(tmp_path)), _argv(tmp_path))  # without --stream: planned
    argv = _argv(tmp_path, "--stream")
    with pytest.raises(UsageError, match="probe 'asks' asks for prompt_logprobs.*without --stream"):
        build_plan(parse_args(argv), argv)


def test_stream_with_a_prompt_logprob_probe_is_one_line_exit_2(tmp_path):
    proc = run_cli(_argv(tmp_path, "--stream"), timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().count("\n") == 0 and "asks for prompt_logprobs" in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "r.json").exists()


# ---- the hit counter a served answer did not send -------------------------------------------------------------------


def test_a_served_answer_without_prompt_tokens_details_names_the_flag_that_sends_it():
    """A server started without --enable-prompt-tokens-details (one repro endpoint did not start, say): its reuse's
    hit counter is missing, and the INCONCLUSIVE reason says which flag sends it."""
    got = _request(served.as_output(_answer([7, 8], details=False), PROMPT), "reuse")
    assert got.cached_tokens is None
    pv = decide_probe((7, 8), Request((7, 8), 0), [Request(got.token_ids, got.cached_tokens)])
    assert pv.verdict == INCONCLUSIVE and len(pv.reasons) == 1, pv
    assert (
        pv.reasons[0].startswith("reuse 1: hit counter missing") and "--enable-prompt-tokens-details" in pv.reasons[0]
    )
    cold = decide_probe((7, 8), Request((7, 8), None), [Request((7, 8), 8)])
    assert "--enable-prompt-tokens-details" in cold.reasons[0], cold
