"""The production-load scenario's review findings (2026-12-05), engine-free. A served round (repro.engine.load_served)
against a stand-in server that writes a KV audit record per request as vLLM's scheduler does: a missed cancellation
is not aborted (its answer is read to its end and judged, never sent again), and every request's record is the one
its own request wrote, matched by the request ID the kit gave it (D11). A round's figures count KV findings beside
token differences, and what a reader sees numbers a load request by its round, as the rates do."""

from __future__ import annotations

import hashlib
import http.server
import itertools
import json
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT
from kvkit_testutil import committed_or_skip, serving
from test_kvaudit import _planes, _record
from test_scenario_lmcache_checks import BASE

from repro.contract.result import ArmResult, RequestResult, ScenarioResult, StepRequest
from repro.engine import load_served
from repro.engine.audit_records import AuditRecords
from repro.judge.verdict import CORRUPT, PASS
from repro.publish.scenario_md import format_scenarios
from repro.publish.site_scenarios import scenario_block
from repro.readmodel import read_report
from repro.readmodel.scenario_load import arm_rates_text
from repro.run import load_scenario
from repro.run.scenarios import annotate_kv

ANSWER = [11, 12, 13, 14]  # every answer's tokens: max_tokens 4
LOAD_REPORT = ROOT / "reports" / "offloading" / "load-offloading-tiny-bi.json"


def _sse(sid: str, ids: list[int], finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": "", "token_ids": ids, "finish_reason": finish}
    return f"data: {json.dumps({'id': sid, 'choices': [choice]})}\n\n".encode()


class StandIn:
    """A /v1/completions server as vLLM's: it names a request cmpl-<request_id> (its own ID where the body has none)
    and, as its scheduler takes the request, writes the KV audit's record of it (<seq>.json, req_id
    cmpl-<id>-0-<8 random>). A streamed request's prompt decides how its stream goes: `missed` sends its first token
    chunk with the headers (the prefill was over before any close could land), `held` sends nothing until the client
    closes, `cut` ends after one token with no finish reason."""

    def __init__(self, audit_dir: Path, streams: dict[tuple, str]):
        self.audit_dir, self.streams, self.seq = audit_dir, streams, itertools.count()
        self.lock, self.seen, self.closed_by_client = threading.Lock(), {}, []

    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        body = json.loads(h.rfile.read(int(h.headers["Content-Length"])))
        prompt = tuple(body["prompt"])
        sid = f"cmpl-{body.get('request_id') or uuid.uuid4().hex}"
        with self.lock:
            seq = next(self.seq)
            self.seen.setdefault(prompt, []).append((sid, bool(body.get("stream"))))
            record = {"seq": seq, "req_id": f"{sid}-0-{uuid.uuid4().hex[:8]}", "prompt_sha256": _sha(prompt)}
            (self.audit_dir / f"{seq:06d}.json").write_text(json.dumps(record), encoding="utf-8")
        if not body.get("stream"):
            answer = {"id": sid, "choices": [{"index": 0, "text": "", "token_ids": ANSWER, "finish_reason": "length"}],
                      "usage": {"prompt_tokens": len(prompt), "prompt_tokens_details": {"cached_tokens": 0}}}  # fmt: skip
            data = json.dumps(answer).encode()
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
            return
        how = self.streams[prompt]
        try:
            if how == "missed":  # the first chunk in one write with the headers, then the rest
                h.wfile.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + _sse(sid, ANSWER[:1]))
                h.wfile.flush()
                h.wfile.write(_sse(sid, ANSWER[1:3]) + _sse(sid, ANSWER[3:], "length") + b"data: [DONE]\n\n")
                return
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream")
            h.end_headers()
            h.wfile.flush()
            if how == "held":  # in its prefill until the client closes
                h.connection.settimeout(30)
                if h.connection.recv(1) == b"":
                    self.closed_by_client.append(sid)
            elif how == "cut":
                h.wfile.write(_sse(sid, ANSWER[:1]))
        except OSError:  # the client closed the connection
            self.closed_by_client.append(sid)


def _sha(prompt) -> str:
    return hashlib.sha256(json.dumps([int(t) for t in prompt]).encode()).hexdigest()


class _Client:
    """The served front end's side that a round uses: its address, its pool, an ordinary request, /metrics."""

    def __init__(self, base: str):
        self.base, self._pool = base, ThreadPoolExecutor(8)

    def _complete(self, body: dict) -> dict:
        import urllib.request

        req = urllib.request.Request(self.base + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())

    def metrics_text(self) -> str:
        return ""


def _round(tmp_path: Path, monkeypatch, cancel: dict[str, str], streams: dict[str, str]):
    """One served round of the prompts a, b, c, d (3 tokens each) with these cancellations: (stand-in, results)."""
    prompts = {name: [i, i + 1, i + 2] for i, name in enumerate("abcd", start=1)}
    stand_in = StandIn(tmp_path, {tuple(prompts[n]): how for n, how in streams.items()})

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            stand_in.handle(self)

        def log_message(self, *args):
            pass

    monkeypatch.setattr(load_served, "preemption_count", lambda: (0, "stand-in"))
    monkeypatch.setattr(load_served, "reference_probes", lambda *args: [])  # no reference run asked for here
    job = SimpleNamespace(
        probes=[SimpleNamespace(name=n, prompt={"token_ids": ids}) for n, ids in prompts.items()],
        scenario=SimpleNamespace(
            name="production-load", reference=False, steps=[SimpleNamespace(submit=tuple(prompts), cancel=cancel)]
        ),
        max_tokens=4,
    )
    sp = SimpleNamespace(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=None, seed=None, prompt_logprobs=None)
    with serving(Handler) as url:
        _, scenario = load_served.run_load_served(
            _Client(url), job, sp, AuditRecords(str(tmp_path)), lambda *a, **k: None
        )
    return stand_in, {sr.probe: sr for sr in scenario.requests}, prompts


def test_d11_a_missed_cancellation_is_read_to_its_end_and_every_request_keeps_its_own_kv_record(tmp_path, monkeypatch):
    """a: cancelled in prefill, but its first chunk had come (missed); b: cancelled in prefill, landed; c: cancelled
    at its last step, its stream cut with no finish reason; d: not cancelled. Before: a's attempt was closed anyway
    (aborted mid-decode, under the word "missed") and sent again, and a's and c's retries carried their aborted
    attempt's KV audit record (the first of the prompt's), b's none."""
    cancel = {"a": "prefill", "b": "prefill", "c": "last-step"}
    stand_in, got, prompts = _round(tmp_path, monkeypatch, cancel, {"a": "missed", "b": "held", "c": "cut"})
    seen = {name: stand_in.seen[tuple(ids)] for name, ids in prompts.items()}
    # a missed cancellation is what it says: no abort, its answer read to its end and judged, nothing sent again
    assert [streamed for _, streamed in seen["a"]] == [True]
    assert "not closed, read to its end" in got["a"].cancel["missed"]
    assert got["a"].request.request_id == seen["a"][0][0] and list(got["a"].request.token_ids) == ANSWER
    # a landed one: the attempt closed by the client, sent again, the retry judged
    assert [streamed for _, streamed in seen["b"]] == [True, False] and not got["b"].cancel.get("missed")
    assert stand_in.closed_by_client == [seen["b"][0][0]] and got["b"].request.request_id == seen["b"][1][0]
    # a stream that ended with no finish reason is no answer: missed, and sent again
    assert [streamed for _, streamed in seen["c"]] == [True, False] and "sent again" in got["c"].cancel["missed"]
    # every request's KV audit record is the one its own (judged) request wrote, never its attempt's
    for name, sr in got.items():
        record = sr.request.kv_audit_record
        assert record.get("seq") is not None, (name, record)
        assert record["req_id"].startswith(sr.request.request_id + "-"), (name, record, sr.request.request_id)
    # the round's counts: the HTTP requests the server saw, and the one connection the kit closed mid-answer
    counts = got["a"].cancel["round"]
    assert counts["sent"] == sum(len(s) for s in seen.values()) == 6 and counts["closed"] == 1


def test_d11_a_record_is_a_served_requests_by_the_id_the_kit_gave_it():
    from repro.engine.audit_records import served_request

    kit = load_served.new_request_id()
    assert served_request(f"cmpl-{kit}-0-1a2b3c4d", kit) and served_request(f"cmpl-{kit}", kit)
    assert not served_request(f"cmpl-{load_served.new_request_id()}-0-1a2b3c4d", kit)
    assert not served_request(f"chatcmpl-{kit}-0-1a2b3c4d", kit) and not served_request(None, kit)
    assert not served_request(f"cmpl-{kit}0-0-1a2b3c4d", kit)  # another ID that begins with this one's text


# --- a round's figures count KV findings beside token differences ---------------------------------------------


def _arm(name: str) -> dict:
    committed_or_skip(LOAD_REPORT)
    (scenario,) = json.loads(LOAD_REPORT.read_text(encoding="utf-8"))["scenarios"]
    return next(a for a in scenario["arms"] if a["arm"] == name)


def test_a_load_rounds_figures_count_kv_findings_whose_tokens_match():
    """The committed H200 load report's offload-simple arm: round 2's 64 answers all give the cache-off tokens or
    one the reuse control explains ('0 of 64 differ'), and 35 of them read CORRUPT KV. Its rounds, written before
    they counted KV, said nothing of it; computed again they count it, by class, and say how many of those the
    tokens alone would not show."""
    arm = _arm("offload-simple")
    rounds = load_scenario.rates(arm)
    two = rounds[1]
    assert (two["differ"], two["fail"]) == (0, 0)
    assert (two["kv_findings"], two["kv_corrupt"], two["kv_foreign"], two["kv_misplaced"]) == (35, 35, 0, 0)
    assert two["kv_findings_tokens_match"] == 33 and two["kv_audited"] == 64 and two["kv_unavailable"] == 0
    assert [r["kv_findings"] for r in rounds] == [2, 35, 42]
    text = arm_rates_text({"rounds": rounds})
    assert "round 2: 0 of 64 differ (0 FAIL), 2 as the reuse control, 64 of 64 reused, KV findings 35 of 64 " \
           "(35 CORRUPT, 33 with cache-off tokens), 8 cancelled" in text  # fmt: skip
    # the rounds as committed (no KV figures) say nothing of KV, never "0 of 64"; an arm not KV-audited has none
    assert "KV" not in arm_rates_text(arm["load"])
    unaudited = {**arm, "kv": None, "requests": [{**r, "kv": None} for r in arm["requests"]]}
    assert not any(k.startswith("kv_") for r in load_scenario.rates(unaudited) for k in r)


def test_the_kv_audit_gives_a_load_arms_rounds_their_kv_figures():
    """A load arm's rates are computed when its requests are judged, before the KV audit has classed any: the audit
    (repro.run.scenarios.annotate_kv) computes them again. Round 2's one request reused corrupt KV with the
    cache-off tokens."""
    cold_rec, reuse_rec = _record(0, computed=2), _record(1, reused=2)
    requests = [
        {"step": k, "probe": "fixture", "role": role, "cached_tokens": cached, "first_diff": None, "class": None,
         "verdict": PASS, "cancel": None, "kv": None}
        for k, role, cached in ((0, "miss", 0), (1, "reuse", 32))
    ]  # fmt: skip
    entry = {"requests": requests}
    entry["load"] = {"rounds": load_scenario.rates(entry), "reuse_control": True}
    reqs = tuple(
        StepRequest(k, "fixture", RequestResult(role, cached, BASE, (), "length", None, "", kv_audit_record=rec), 0)
        for k, role, cached, rec in ((0, "cold", 0, cold_rec), (1, "reuse", 32, reuse_rec))
    )
    result = ArmResult("native", scenario=ScenarioResult("production-load", reqs, 0, "vllm:num_preemptions"),
                       kv_audit={"dir": "/a", "errors": []})  # fmt: skip
    same, zero = {"K": [True, True], "V": [True, True]}, {"K": [0.0, 0.0], "V": [0.0, 0.0]}
    wrong = {"K": [False, True], "V": [True, True]}
    raw = {"arms": {"native": {"production-load": {
        "0": {"kind": "computed", "num_blocks": 2, "layers": 1, "planes": _planes(same, zero), "matches": [], "error": None},
        "1": {"kind": "reused", "num_blocks": 2, "layers": 1, "planes": _planes(wrong, {"K": [0.5, 0.0], "V": [0.0, 0.0]}),
              "matches": [], "error": None},
    }}}}  # fmt: skip
    annotate_kv(entry, result, raw, None, 16)
    assert entry["requests"][1]["kv"]["verdict"] == CORRUPT
    one, two = entry["load"]["rounds"]
    assert (one["kv_audited"], one["kv_findings"]) == (0, 0)  # a miss is not audited
    assert (two["kv_audited"], two["kv_findings"], two["kv_corrupt"], two["kv_findings_tokens_match"]) == (1, 1, 1, 1)


# --- one numbering: a load request is read by its round ---------------------------------------------------------


@pytest.mark.parametrize("where", ["page", "issue"])
def test_a_load_request_is_read_by_its_round_as_its_rates_are(where):
    """The committed load report's requests keep the JSON key `step` (0-based); the page's rows and steps and the
    issue's table, request lines and steps call the first round's requests round 1, as its rates do, never step 0."""
    committed_or_skip(LOAD_REPORT)
    report = read_report(LOAD_REPORT)
    (scenario,) = report.scenarios
    if where == "page":
        block = scenario_block(scenario, 0)
        arm = next(a for a in block.arms if a.title.startswith("offload-simple"))
        assert block.step_label == "round" and {r.step for r in arm.rows} == {"1", "2", "3"}
        assert block.steps[0].startswith("round 1: 64 prompts in flight together")
    else:
        text = format_scenarios(report, None)
        assert "round 1 load-p011-s02 FAIL" in text and "- **round 1 load-p011-s02** (" in text
        assert "- steps: round 1: 64 prompts in flight together" in text
