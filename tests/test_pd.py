"""The P→D arm's logic, engine-free: the cases through fake NixlConnector pairs (tests/pd_fakes.py), the verdicts, the
report, the real driver's pure parts and the command's refusals. NIXL itself needs a CUDA GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pd_fakes import answer_from_kv, bad_ids_pair, foreign_blocks_pair, re_prefill_pair, transferring_pair

from repro.disagg import report as pd_report
from repro.disagg import servers
from repro.disagg.cases import load_cases, parse_cases
from repro.disagg.pair import controls, out_of_range, probe_requests, run_cases
from repro.errors import UsageError
from repro.judge.pd_verdict import NOT_EXERCISED, Transfer, decide_control, decide_pd_arm, decide_pd_request
from repro.judge.verdict import ERROR, FAIL, INCONCLUSIVE, PASS

ROOT = Path(__file__).resolve().parents[1]
GPU_CASES = ROOT / "fixtures" / "pd" / "cases-gpu.json"


def small_cases(extra_cases=(), extra_prompts=()):
    doc = {
        "kind": "kvkit-pd-cases",
        "schema_version": 1,
        "name": "small",
        "block_size": 4,
        "max_tokens": 8,
        "vocab": [10, 500],
        "prompts": [
            {"name": "a", "seed": 1, "length": 24},
            {"name": "b", "seed": 2, "length": 24},
            {"name": "c", "seed": 3, "length": 24},
            *extra_prompts,
        ],
        "cases": [
            {"name": "plain-a", "kind": "plain", "prompt": "a"},
            {"name": "plain-b", "kind": "plain", "prompt": "b"},
            *extra_cases,
        ],
    }
    return parse_cases(doc, "small.json", "0" * 64)


def report_of(run, cases):
    return pd_report.build_report(run, cases, {"trials": 1}, {"ports": {}}, {"nixl": "1.2.0"})


def test_a_pair_that_transfers_passes_every_probe_and_both_controls_hold():
    cases = load_cases(GPU_CASES)
    run = run_cases(transferring_pair(cases.block_size), cases, trials=3)
    probes = probe_requests(run)
    assert len(probes) == 3 * 8  # per trial: four probe cases, and the controls' four requests with fresh references
    assert {j.verdict.verdict for j in probes} == {PASS}
    assert all(j.answer.transfer.external_tokens == j.expected_external > 0 for j in probes)
    partial = [j for j in probes if j.case == "partial-hit"]
    assert [(j.answer.transfer.local_tokens, j.answer.transfer.external_tokens) for j in partial] == [(96, 104)] * 3
    short = [j for j in probes if j.case == "short-prompt"]
    assert [j.answer.transfer.external_tokens for j in short] == [10] * 3
    by_case = {(j.case, j.trial): j for j in controls(run)}
    assert all(j.control.held for j in by_case.values()) and len(by_case) == 9
    stale = by_case[("stale-reference", 1)]
    assert (stale.verdict.verdict, stale.verdict.answers_as, stale.reference) == (FAIL, "probe-a", "probe-a")
    assert "answers as probe-a" in " ".join(stale.verdict.reasons)
    assert by_case[("consumed-reference", 2)].verdict.answers_as == "probe-c"  # the producer reused the blocks
    oor = by_case[("out-of-range-reference", 1)]  # the fake refuses as the kit predicts of vLLM 0.26.0
    assert (oor.verdict.verdict, oor.control.predicted) == (ERROR, True)
    assert oor.control.reason == "ERROR, as expected; predicted ERROR: as predicted"
    report = report_of(run, cases)
    assert (report["verdict"], report["controls"]) == (PASS, {"run": 9, "held": 9})


def test_a_consumer_that_re_prefills_is_transfer_not_exercised_never_pass():
    cases = load_cases(GPU_CASES)
    run = run_cases(re_prefill_pair(cases.block_size), cases)
    probes = probe_requests(run)
    assert {j.verdict.verdict for j in probes} == {INCONCLUSIVE}
    assert all(j.answer.token_ids == run.baselines[j.prompt].token_ids for j in probes)  # right answers, no transfer
    assert all(j.verdict.reasons[0].startswith(NOT_EXERCISED) for j in probes)
    report = report_of(run, cases)
    assert report["verdict"] == INCONCLUSIVE and report["counts"] == {INCONCLUSIVE: 8}
    assert report["controls"] == {"run": 3, "held": 0}  # a stale reference it never pulled shows nothing


def test_a_producer_that_hands_over_another_requests_blocks_fails_naming_that_request():
    cases = small_cases()
    run = run_cases(foreign_blocks_pair(cases.block_size), cases)
    first, second = probe_requests(run)
    assert first.verdict.verdict == PASS  # the first request has no earlier one to be given
    assert (second.prompt, second.verdict.verdict, second.verdict.answers_as) == ("b", FAIL, "a")
    assert second.verdict.first_diff == 0 and second.answer.transfer.external_tokens == 24
    assert second.answer.token_ids == run.baselines["a"].token_ids
    assert report_of(run, cases)["verdict"] == FAIL


def test_the_stale_reference_is_named_as_the_previous_prompts_answer():
    cases = small_cases(
        [
            {
                "name": "stale",
                "kind": "stale",
                "prompt": "c",
                "previous": "b",
                "expect": ["FAIL"],
                "expect_answers_as": "b",
            }
        ]
    )
    pair = transferring_pair(cases.block_size)
    run = run_cases(pair, cases)
    (stale,) = controls(run)
    assert stale.prompt == "c" and stale.reference == "b"
    assert stale.verdict.verdict == FAIL and stale.verdict.answers_as == "b"
    assert stale.verdict.replays[0].as_dict() == {"probe": "b", "request": "baseline", "from": 0, "tokens": 8}
    assert stale.control.held and stale.control.reason == "FAIL answers as b, as expected"
    assert ("prefill", "stale-t1-previous") in pair.sent and ("decode", "stale-t1-stale") in pair.sent


def test_the_gate_passes_only_a_matching_answer_with_external_tokens_and_no_failed_transfer():
    base, other = answer_from_kv((1, 2, 3, 4), 8), answer_from_kv((5, 6, 7, 8), 8)
    answers = {"me": base, "other": other}
    ok = Transfer(external_tokens=4, transfers=1, failed_transfers=0)
    assert decide_pd_request("me", base, base, ok, answers).verdict == PASS
    for transfer, why in [
        (Transfer(None), "the consumer external token hit counter missing"),
        (Transfer(-1), "(-1 (vLLM's 'not checked yet'): not a count)"),
        (Transfer(0, transfers=0), f"{NOT_EXERCISED}: the consumer loaded no external tokens"),
        (Transfer(4, transfers=1, failed_transfers=2), f"{NOT_EXERCISED}: 2 NIXL transfer(s) failed"),
        (Transfer(4, transfers=0), f"{NOT_EXERCISED}: 4 external tokens counted but no NIXL transfer"),
    ]:
        pv = decide_pd_request("me", base, base, transfer, answers)
        assert pv.verdict == INCONCLUSIVE and why in pv.reasons[0], (transfer, pv.reasons)
    wrong = decide_pd_request("me", base, other, ok, answers)
    assert (wrong.verdict, wrong.answers_as, wrong.first_diff) == (FAIL, "other", 0)
    assert wrong.reasons[1] == "answers as other: its baseline's tokens @0-7, not its own"
    garbage = decide_pd_request("me", base, (999,) * 8, Transfer(0), answers)
    assert garbage.verdict == FAIL and garbage.answers_as is None
    assert "no external tokens: the consumer's own prefill" in garbage.reasons[0]
    refused = decide_pd_request("me", base, None, None, answers, error="consumer answered HTTP 500")
    assert refused.verdict == ERROR and "HTTP 500" in refused.reasons[0]
    warm_ref = decide_pd_request("me", base, base, ok, answers, baseline_cached=16)
    assert warm_ref.verdict == INCONCLUSIVE and "16 cached tokens with caching off" in warm_ref.reasons[0]


def test_a_control_holds_only_as_its_case_says():
    base, other = answer_from_kv((1, 2, 3), 8), answer_from_kv((4, 5, 6), 8)
    answers = {"me": base, "prev": other, "third": answer_from_kv((7, 8, 9), 8)}
    named_prev = decide_pd_request("me", base, other, Transfer(3, transfers=1), answers)
    assert decide_control(named_prev, [FAIL, ERROR], "prev").held
    missed = decide_control(named_prev, [FAIL], "third")
    assert not missed.held and missed.reason == "expected the answer named as third's, it answers as prev"
    passed = decide_pd_request("me", base, base, Transfer(3, transfers=1, failed_transfers=0), answers)
    assert decide_control(passed, [FAIL, ERROR]).reason == "expected FAIL or ERROR, got PASS"
    with pytest.raises(ValueError):
        decide_control(passed, ["WRONG"])
    arm, reasons = decide_pd_arm([PASS, PASS], [decide_control(passed, [FAIL])])
    assert arm == PASS and reasons == ("a negative control did not hold: expected FAIL, got PASS",)
    assert decide_pd_arm([], []) == (INCONCLUSIVE, ("no probe request was run",))
    assert decide_pd_arm([PASS, INCONCLUSIVE, FAIL], [])[0] == FAIL


OUT_OF_RANGE = {"name": "oor", "kind": "out-of-range", "prompt": "a", "expect": ["FAIL", "ERROR"], "predict": "ERROR"}


@pytest.mark.parametrize(
    ("bad_ids", "verdict", "held", "predicted", "said"),
    [
        ("refuse", ERROR, True, True, "the pair gave no answer: consumer answered HTTP 500"),
        (
            "reported",
            FAIL,
            True,
            False,
            "answered with HTTP 200 although the consumer counted 1 failed NIXL transfer(s)",
        ),
        ("silent", FAIL, True, False, "differs from the baseline @0 (24 external tokens loaded"),
        ("recompute", INCONCLUSIVE, False, False, f"{NOT_EXERCISED}: the consumer loaded no external tokens"),
    ],
)
def test_the_out_of_range_reference_is_judged_by_what_the_stack_reported(bad_ids, verdict, held, predicted, said):
    """vLLM #52234's out-of-range block IDs: a refusal is ERROR (what the kit predicts); HTTP 200 with a wrong answer
    is FAIL, with the consumer's count of failed transfers in its reasons where it counted one; a recomputed right
    answer shows nothing (INCONCLUSIVE, the control does not hold)."""
    cases = small_cases([OUT_OF_RANGE])
    pair = bad_ids_pair(bad_ids)(cases.block_size)
    run = run_cases(pair, cases)
    (oor,) = controls(run)
    assert oor.prompt == oor.reference == "a" and ("decode", "oor-t1-out-of-range") in pair.sent
    assert {j.verdict.verdict for j in probe_requests(run)} == {PASS}  # the real reference before it passes
    assert (oor.verdict.verdict, oor.control.held, oor.control.predicted) == (verdict, held, predicted)
    assert oor.verdict.reasons[0].startswith(said) or said in oor.verdict.reasons
    assert ("as predicted" if predicted else "not as predicted") in oor.control.reason
    assert report_of(run, cases)["verdict"] == PASS  # a control never changes the arm's verdict


def test_out_of_range_moves_every_remote_block_id_past_any_pool():
    params = {"remote_block_ids": [[1, 2], [7]], "remote_request_id": "r"}
    moved = out_of_range(params)
    assert moved == {"remote_block_ids": [[2**30 + 1, 2**30 + 2], [2**30 + 7]], "remote_request_id": "r"}
    assert params["remote_block_ids"] == [[1, 2], [7]] and out_of_range({"remote_block_ids": [3]})[
        "remote_block_ids"
    ] == [2**30 + 3]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kind": "kvkit-fixture"}, "kind: must be 'kvkit-pd-cases'"),
        ({"schema_version": 2}, "schema_version 2: upgrade the kit"),
        ({"vocab": [5, 5]}, "vocab: must be [low, high)"),
        ({"surprise": 1}, "unknown key 'surprise'"),
        ({"cases": []}, "cases: must be a non-empty list"),
        ({"cases": [{"name": "x", "kind": "plain", "prompt": "nope"}]}, "cases[0].prompt: 'nope' is not a prompt"),
        ({"cases": [{"name": "x", "kind": "teleport", "prompt": "probe-a"}]}, "cases[0].kind: must be one of"),
        (
            {"cases": [{"name": "x", "kind": "stale", "prompt": "probe-a", "previous": "probe-a", "expect": ["FAIL"]}]},
            "cases[0].previous: must name another prompt",
        ),
        (
            {"cases": [{"name": "x", "kind": "stale", "prompt": "probe-a", "previous": "probe-b"}]},
            "cases[0].expect: a control",
        ),
        (
            {"cases": [{"name": "x", "kind": "stale", "prompt": "probe-a", "previous": "probe-b", "expect": ["FAIL"]}]},
            "needs at least one probe",
        ),
        ({"cases": [{"name": "x", "kind": "plain", "prompt": "probe-a", "expect": ["FAIL"]}]}, "only a control"),
        (
            {
                "cases": [
                    {"name": "x", "kind": "out-of-range", "prompt": "probe-a", "expect": ["FAIL"], "predict": "ERROR"}
                ]
            },
            "cases[0].predict: must be one of the case's expect verdicts",
        ),
        ({"prompts": [{"name": "a", "seed": 1, "length": 0}]}, "prompts[0].length: must be an integer >= 1"),
        (
            {"prompts": [{"name": "a", "seed": 1, "length": 8, "prefix": {"of": "a", "length": 4}}]},
            "prompts[0].prefix.of: must name another prompt",
        ),
    ],
)
def test_a_bad_cases_file_is_one_line(change, message):
    doc = json.loads(GPU_CASES.read_text())
    if "prompts" in change:
        doc["cases"] = [{"name": "x", "kind": "plain", "prompt": "a"}]
    doc.update(change)
    with pytest.raises(UsageError) as info:
        parse_cases(doc)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_seeded_prompts_are_the_same_everywhere_and_a_prefix_is_shared():
    cases = load_cases(GPU_CASES)
    assert cases.prompts["probe-a"][:5] == (74, 185, 245, 235, 56)  # random.Random(1) over [40, 250)
    assert cases.prompts["partial"][:100] == cases.prompts["warm"][:100]
    assert cases.prompts["partial"][100] != cases.prompts["warm"][100]
    assert all(40 <= t < 250 for p in cases.prompts.values() for t in p)


def test_the_real_driver_starts_a_producer_and_a_consumer_as_vllms_nixl_tests_do():
    s = servers.ServeSettings("/py", "/m", 16, 2048)
    producer = servers.serve_argv(s, 8100, "kv_producer", False)
    consumer = servers.serve_argv(s, 8200, "kv_consumer", True)
    assert json.loads(producer[producer.index("--kv-transfer-config") + 1]) == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer",
    }
    assert "kv_consumer" in consumer[consumer.index("--kv-transfer-config") + 1]
    assert {"--enforce-eager", "--no-enable-prefix-caching", "--enable-prompt-tokens-details"} <= set(producer)
    assert "--enable-prefix-caching" in consumer and producer[producer.index("--gpu-memory-utilization") + 1] == "0.2"
    assert "--kv-transfer-config" not in servers.serve_argv(s, 8000, None, False)
    env = servers.serve_env({"CUDA_VISIBLE_DEVICES": "0"}, 5601)
    assert {k: env[k] for k in ("VLLM_KV_CACHE_LAYOUT", "UCX_NET_DEVICES", "VLLM_NIXL_SIDE_CHANNEL_PORT")} == {
        "VLLM_KV_CACHE_LAYOUT": "HND",
        "UCX_NET_DEVICES": "all",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": "5601",
    }
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "0"
    body = servers.completion_body((5, 6), 1, dict(servers.PRODUCER_PARAMS))
    assert body["prompt"] == [5, 6] and body["kv_transfer_params"]["do_remote_decode"] is True
    assert "kv_transfer_params" not in servers.completion_body((5,), 16, None)
    ports = servers.free_ports(4)
    assert len(set(ports)) == 4 and all(p > 0 for p in ports)


def test_the_consumer_counters_come_from_its_metrics_around_a_request():
    before = servers.parse_metrics(
        '# HELP x\nvllm:external_prefix_cache_hits_total{engine="0",model_name="kvkit"} 96.0\n'
        'vllm:prefix_cache_hits_total{engine="0"} 16.0\nvllm:nixl_xfer_time_seconds_count{engine="0"} 2.0\n'
        'vllm:nixl_num_failed_transfers_total{engine="0"} 0.0\nvllm:other 5\n'
    )
    assert before == {
        servers.EXTERNAL_HITS: 96.0,
        servers.LOCAL_HITS: 16.0,
        servers.XFER_COUNT: 2.0,
        servers.XFER_FAILED: 0.0,
    }
    after = before | {servers.EXTERNAL_HITS: 200.0, servers.XFER_COUNT: 3.0}
    t = servers.transfer_of(before, after, 104)
    assert t == Transfer(104, 0, 104, 1, 0)
    no_nixl = {k: v for k, v in after.items() if not k.startswith("vllm:nixl")}
    assert servers.transfer_of(before, no_nixl, None).transfers is None  # not exported: missing, never zero
    ids, cached = servers.answer_of(
        {"choices": [{"token_ids": [1, 2]}], "usage": {"prompt_tokens_details": {"cached_tokens": 104}}}
    )
    assert (ids, cached) == ((1, 2), 104)
    assert servers.answer_of({"choices": [{"text": "x"}], "usage": {}}) == (None, None)


def test_the_report_is_versioned_written_atomically_and_names_nixl(tmp_path):
    cases = load_cases(GPU_CASES)
    run = run_cases(transferring_pair(cases.block_size), cases)
    engine = {"packages": {"vllm": "0.26.0", "torch": "2.11.0", "nixl": "1.2.0", "nixl-cu13": "1.2.0"}}
    prov = pd_report.provenance(["--cases", "x"], {"VLLM_KV_CACHE_LAYOUT": "HND", "HF_TOKEN": "s3cret"}, "t", engine)
    report = pd_report.build_report(run, cases, {"trials": 1}, {"ports": {"consumer_http": 1}}, prov)
    path = tmp_path / "pd.json"
    pd_report.write_report(str(path), report)
    back = json.loads(path.read_text())
    assert (back["kind"], back["schema_version"], back["verdict"]) == ("kvkit-pd-report", 1, PASS)
    assert back["provenance"]["nixl"] == "1.2.0" and back["provenance"]["packages"]["nixl-cu12"].startswith("unav")
    assert back["provenance"]["env"] == {"HF_TOKEN": "<redacted>", "VLLM_KV_CACHE_LAYOUT": "HND"}
    assert back["cases"]["sha256"] == cases.sha256 and len(back["requests"]) == len(run.judged) == 12
    stale = next(r for r in back["requests"] if r["case"] == "stale-reference" and r["control"])
    assert stale["answers_as"] == "probe-a" and stale["transfer"]["external_tokens"] == 200
    assert sorted(back["baselines"]) == sorted(cases.prompts)
    head, arm = pd_report.summary_lines(back)[:2]  # the headline sentence, then the arm's line
    assert head == (
        "P→D (NixlConnector, NIXL 1.2.0, vLLM 0.26.0): matched caching off token for token on 8 of 8 probe requests; "
        "negative controls held 3 of 3; exit 0: acceptance matched"
    )
    assert arm.startswith("P→D (NixlConnector): PASS (probe requests: PASS 8;")
    assert [p.name for p in tmp_path.iterdir()] == ["pd.json"]  # no temp file left


@pytest.mark.parametrize(
    ("info", "problem"),
    [
        ({"problem": "is not a working Python 3"}, "the engine interpreter is not a working Python 3"),
        ({"packages": {"vllm": None}}, "vllm is not installed"),
        (
            {"packages": {"vllm": "0.28.0"}, "nixl_importable": False, "nixl_problem": "ModuleNotFoundError"},
            "NIXL is not importable there",
        ),
        ({"packages": {"vllm": "0.28.0"}, "nixl_importable": True, "cuda_devices": 0}, "NIXL needs a CUDA GPU"),
        ({"packages": {"vllm": "0.28.0"}, "nixl_importable": True, "cuda_devices": 1}, None),
    ],
)
def test_what_the_engine_interpreter_lacks_is_named(info, problem):
    got = pd_report.environment_problem(info)
    assert got == problem if problem is None else problem in got


def _pd(*args, cwd=ROOT):
    argv = [sys.executable, "-m", "repro", "pd", *args]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    base = ["--cases", str(GPU_CASES), "--model", str(tmp_path), "--report", str(tmp_path / "r.json")]
    for extra, message in [
        (["--device", "cpu"], "--device cpu: NIXL needs a CUDA GPU"),
        (["--trials", "0"], "--trials must be at least 1"),
        (["--cases", str(tmp_path / "none.json")], "cannot read"),
        (["--max-model-len", "512"], "exceed --max-model-len 512"),
        (["--python", str(tmp_path / "nopython")], "the engine interpreter cannot run"),
    ]:
        proc = _pd(*base, *extra)
        assert proc.returncode == 2, (extra, proc.stderr)
        assert proc.stderr.count("\n") == 1 and message in proc.stderr, (extra, proc.stderr)
    assert not (tmp_path / "r.json").exists()


def test_an_interpreter_without_nixl_is_refused_before_any_server_starts(tmp_path):
    """An engine interpreter without vLLM, NIXL or a CUDA device (this one, on the CPU machine): one line, exit 2, no
    report. Where this interpreter has all three the command would start servers: skipped there."""
    if pd_report.environment_problem(pd_report.probe_engine(sys.executable)) is None:
        pytest.skip("this interpreter has vLLM, NIXL and a CUDA device: nothing to refuse")
    argv = ["--cases", str(GPU_CASES), "--model", str(tmp_path), "--report", str(tmp_path / "r.json")]
    proc = _pd(*argv)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "NIXL is not importable" in proc.stderr or "NIXL needs a CUDA GPU" in proc.stderr or "vllm" in proc.stderr
    assert list(tmp_path.iterdir()) == []


class _StubVllm:
    """One loopback HTTP server answering as vLLM's producer, consumer and reference do (only what the real driver
    reads): the driver's own HTTP, JSON and metrics code runs against it."""

    def __init__(self):
        import http.server
        import threading

        stub = self
        self.external, self.transfers, self.resets, self.bodies = 0, 0, 0, []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, payload, ctype="application/json"):
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/metrics":
                    text = (f'vllm:external_prefix_cache_hits_total{{engine="0"}} {stub.external}.0\n'
                            f'vllm:prefix_cache_hits_total{{engine="0"}} 0.0\n'
                            f'vllm:nixl_xfer_time_seconds_count{{engine="0"}} {stub.transfers}.0\n')  # fmt: skip
                    return self._send(200, text, "text/plain")
                return self._send(200, {})

            def do_POST(self):
                if self.path == "/reset_prefix_cache":
                    stub.resets += 1
                    return self._send(200, {"success": stub.resets > 1})
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.bodies.append(body)
                params, prompt = body.get("kv_transfer_params") or {}, body["prompt"]
                out = {"choices": [{"token_ids": [t % 7 for t in prompt[: body["max_tokens"]]]}], "usage": {}}
                if params.get("do_remote_decode"):
                    out["kv_transfer_params"] = {"do_remote_prefill": True, "remote_block_ids": [[1]],
                                                 "remote_num_tokens": len(prompt)}  # fmt: skip
                elif params.get("do_remote_prefill"):
                    stub.external += params["remote_num_tokens"]
                    stub.transfers += 1
                    out["usage"] = {"prompt_tokens_details": {"cached_tokens": params["remote_num_tokens"]}}
                return self._send(200, out)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_the_real_driver_speaks_to_vllms_http_as_the_toy_proxy_does(tmp_path):
    stub = _StubVllm()
    try:
        pair = servers.NixlPair(servers.ServeSettings("/py", "/m", 16, 2048), tmp_path, {})
        for role in ("reference", "producer", "consumer"):
            setattr(pair, role, servers.Server(role, [], {}, stub.port, tmp_path / f"{role}.log", 10))
        prompt = (10, 11, 12, 13, 14)
        assert pair.baseline("b", prompt, 3).token_ids == (3, 4, 5)
        assert stub.bodies[0]["logprobs"] == 2 and "kv_transfer_params" not in stub.bodies[0]
        pair.reset()
        assert stub.resets == 2  # the first answered success false: tried again
        params = pair.prefill("p", prompt)
        assert stub.bodies[-1]["max_tokens"] == 1 and stub.bodies[-1]["kv_transfer_params"]["do_remote_decode"]
        got = pair.decode("d", prompt, params, 3)
        assert stub.bodies[-1]["kv_transfer_params"] == params and stub.bodies[-1]["return_token_ids"] is True
        assert got.token_ids == (3, 4, 5) and got.transfer == Transfer(5, 0, 5, 1, None)
        own = pair.decode("own", prompt, None, 3)
        assert own.transfer.external_tokens == 0 and own.transfer.transfers == 0
        pair.close()  # no child was started: nothing to stop
    finally:
        stub.httpd.shutdown()
    assert servers.reset_succeeded("") and servers.reset_succeeded('{"success": true}')
    assert not servers.reset_succeeded('{"success": false}')


def _command_with(monkeypatch, tmp_path, pair, *extra):
    """`python -m repro pd` in this process with the pair replaced (NIXL needs a GPU) and the engine probe answered."""
    from repro.disagg import commands

    class Closing:
        def __init__(self, inner):
            self.inner, self.closed = inner, False

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def facts(self):
            return {"ports": {"consumer_http": 1}}

        def close(self):
            self.closed = True

    made = []
    monkeypatch.setattr(commands, "NixlPair", lambda *a: made.append(Closing(pair)) or made[-1])
    ok = {"packages": {"vllm": "0.26.0", "nixl": "1.2.0", "nixl-cu13": "1.2.0"}, "nixl_importable": True,
          "nixl_backend": "nixl_cu13", "cuda_devices": 1}  # fmt: skip
    monkeypatch.setattr(commands.pd_report, "probe_engine", lambda python: ok)
    report = tmp_path / "pd.json"
    argv = ["--cases", str(GPU_CASES), "--model", str(tmp_path), "--report", str(report), "--trials", "1", *extra]
    code = commands.pd(argv)
    assert made and made[0].closed  # every server is stopped, whatever happened
    return code, json.loads(report.read_text())


def test_the_command_writes_the_report_and_exits_0_only_for_a_pass_with_every_control_held(monkeypatch, tmp_path):
    code, report = _command_with(monkeypatch, tmp_path, transferring_pair(16))
    assert code == 0 and report["verdict"] == PASS and report["controls"] == {"run": 3, "held": 3}
    assert report["provenance"]["nixl"] == "1.2.0" and report["pair"] == {"ports": {"consumer_http": 1}}
    assert report["settings"]["trials"] == 1 and (tmp_path / "pd.json.logs").is_dir()
    code, report = _command_with(monkeypatch, tmp_path, re_prefill_pair(16), "--force")  # over the first's report
    assert code == 1 and report["verdict"] == INCONCLUSIVE


def test_a_server_that_fails_is_an_error_report_and_exit_3(monkeypatch, tmp_path):
    class Broken:
        def __init__(self):
            self.inner = transferring_pair(16)

        def baseline(self, *args):
            return self.inner.baseline(*args)

        def reset(self):
            raise servers.PairError("consumer exited 1 while starting: CUDA out of memory")

    code, report = _command_with(monkeypatch, tmp_path, Broken())
    assert code == 3 and report["verdict"] == ERROR
    assert report["reasons"][0] == "pair: PairError: consumer exited 1 while starting: CUDA out of memory"
    assert len(report["baselines"]) == 7 and report["requests"] == []  # what came back before it failed is kept


def test_a_divergence_is_classed_from_the_baselines_top_two_gap_and_stays_a_fail():
    base, other = (1, 2, 3, 4), (1, 2, 9, 9)
    near = decide_pd_request("me", base, other, Transfer(4, transfers=1), {"me": base}, None, 0, (2.0, 1.0, 0.03, 1.0))
    assert (near.verdict, near.divergence, near.first_diff) == (FAIL, "near-tie", 2)
    assert near.reasons[0] == (
        "differs from the baseline @2 (4 external tokens loaded; near-tie, the baseline's top-1/top-2 gap 0.0300 nats)"
    )
    far = decide_pd_request("me", base, other, Transfer(4, transfers=1), {"me": base}, None, 0, (2.0, 1.0, 0.5))
    assert far.divergence == "decisive"
    unknown = decide_pd_request("me", base, other, Transfer(4, transfers=1), {"me": base})
    assert unknown.divergence == "unclassed" and unknown.as_dict()["divergence"] == "unclassed"
    top = [{"token_id:5": -0.01, "token_id:7": -4.61}, {"token_id:1": -0.2}, None]
    gaps = servers.top_gaps_of({"choices": [{"logprobs": {"top_logprobs": top}}]})
    assert gaps == (pytest.approx(4.6), None, None)
    assert servers.top_gaps_of({"choices": [{"token_ids": [1]}]}) is None
    body = servers.completion_body((1,), 4, None, logprobs=True)
    assert body["logprobs"] == 2 and body["return_tokens_as_token_ids"] is True
