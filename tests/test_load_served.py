"""A served load round's cancellations (repro.engine.load_served) against stand-in streaming servers: a close at its
point is recorded with what came; a point that passed is recorded as missed, never hidden, and its answer read to its
end; an error answer is a server failure; the server's abort counter is read from /metrics
(tests/test_e2e_load_served.py runs vLLM's; tests/test_load_defects.py whole rounds and their KV audit records)."""

from __future__ import annotations

import http.server
import json
import threading
from contextlib import contextmanager

import pytest
from kvkit_testutil import serving

from repro.engine import load_served
from repro.engine.served import ServerFailed


def _event(ids: list[int], finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": "", "token_ids": ids, "finish_reason": finish}
    return f"data: {json.dumps({'id': 'cmpl-s', 'choices': [choice]})}\n\n".encode()


@contextmanager
def streaming(plan, status: int = 200, raw: bytes = b""):
    """A server whose POST /v1/completions answers status, then plan's events (bytes), each written and flushed; an
    event None waits until the test ends (the request stays in its prefill); raw: these bytes (headers and body in
    one write), then the end of the answer."""
    done = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            if raw:
                self.wfile.write(raw)
                return
            self.send_response(status)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.flush()
            try:
                for event in plan:
                    if event is None:
                        done.wait()
                        return
                    self.wfile.write(event)
                    self.wfile.flush()
            except OSError:  # the kit closed the connection
                pass

        def log_message(self, *args):
            pass

    with serving(Handler, done.set) as url:
        yield url


BODY = {"prompt": [1, 2, 3], "max_tokens": 4}


def test_a_last_step_cancel_closes_after_all_but_the_last_token():
    with streaming([_event([7]), _event([8, 9]), _event([10], "length"), b"data: [DONE]\n\n"]) as url:
        got, answer = load_served.cancel_once(url, BODY, "last-step", 4)
    assert got == {"when": "last-step", "chunks": 2, "generated": 3, "observed": True, "over": "http", "streamed": True}
    assert answer is None  # closed: it is sent again


@pytest.mark.parametrize(
    "plan, said, tokens",
    [
        (
            [_event([7, 8, 9, 10], "length")],
            "its last token came in the chunk that brought 4; not closed, read to its end",
            [7, 8, 9, 10],
        ),
        ([_event([7]), b"data: [DONE]\n\n"], "the stream ended after 1 tokens with no finish reason: sent again", None),
        ([_event([7])], "the stream ended after 1 tokens with no finish reason: sent again", None),  # no [DONE]
    ],
)
def test_a_last_step_point_that_passed_is_missed(plan, said, tokens):
    """A point that passed with the answer finished: read to its end, the answer judged; a stream that ended with no
    finish reason: no answer, sent again."""
    with streaming(plan) as url:
        got, answer = load_served.cancel_once(url, BODY, "last-step", 4)
    assert got["when"] == "last-step" and got["missed"] == said and got["streamed"]
    assert (answer and answer["choices"][0]["token_ids"]) == tokens


def test_a_prefill_cancel_closes_before_the_first_chunk():
    with streaming([None]) as url:
        got, answer = load_served.cancel_once(url, BODY, "prefill", 4)
    assert got == {"when": "prefill", "chunks": 0, "generated": 0, "observed": False, "over": "http", "streamed": True}
    assert answer is None


def test_a_prefill_point_that_passed_is_missed():
    """The first chunk is sent with the headers, in one write: it is there when the kit would close."""
    rest = _event([8, 9]) + _event([10], "length") + b"data: [DONE]\n\n"
    with streaming([], raw=b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + _event([7]) + rest) as url:
        got, answer = load_served.cancel_once(url, BODY, "prefill", 4)
    said = "a token chunk had come before the close: its prefill was over; not closed, read to its end"
    assert got["missed"] == said and got["streamed"]
    assert answer["choices"][0]["token_ids"] == [7, 8, 9, 10] and answer["choices"][0]["finish_reason"] == "length"


def test_max_tokens_one_has_no_last_step_and_an_error_answer_is_a_failure():
    assert load_served.cancel_once("http://127.0.0.1:1", BODY, "last-step", 1)[0]["missed"].startswith(
        "max_tokens is 1"
    )
    with streaming([], status=400) as url, pytest.raises(ServerFailed, match="HTTP 400"):
        load_served.cancel_once(url, BODY, "last-step", 4)


class _Metrics:
    def __init__(self, text):
        self.text = text

    def metrics_text(self):
        return self.text


def test_the_servers_counts_are_read_by_their_labels_and_a_round_is_what_moved():
    lines = (
        "# TYPE vllm:request_success_total counter",
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 5.0',
        'vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 3.0',
        'vllm:request_success_total{engine="1",finished_reason="abort",model_name="m"} 1.0',
        'vllm:num_requests_running{engine="0",model_name="m"} 0.0',
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0',
    )
    before = load_served.server_counts(_Metrics("\n".join(lines)))
    assert before == {"aborted": 4, "finished": 9, "running": 0, "waiting": 2}
    after = {**before, "finished": 17, "waiting": 0}
    assert load_served.round_counts(before, after, 12, 4) == {
        "sent": 12, "closed": 4, "server_aborted": 0, "server_finished": 8, "server_running_at_end": 0,
        "server_waiting_at_end": 0}  # fmt: skip
    nothing = load_served.server_counts(_Metrics("vllm:num_preemptions_total 0.0"))
    assert nothing == {"aborted": None, "finished": None, "running": None, "waiting": None}
    assert load_served.round_counts(nothing, nothing, 1, 0)["server_aborted"] is None


@pytest.mark.parametrize("frontend", ["sync", "server", "async", "endpoint"])
def test_a_load_scenario_runs_offline_or_served_and_nowhere_else(frontend):
    from types import SimpleNamespace

    from repro.errors import UsageError
    from repro.plan.scenarios import check_load

    sc = SimpleNamespace(name="production-load", load=object(), generated=())
    if frontend in ("sync", "server"):
        check_load([sc], ["baseline", "native"], frontend, lambda probes, where: None)
    else:
        with pytest.raises(UsageError, match=f"--frontend sync or server, not {frontend}"):
            check_load([sc], ["baseline", "native"], frontend, lambda probes, where: None)
