"""The served stack without an engine: `--frontend server`'s flags and answers (repro.engine.served), and
`repro endpoint`'s checks of servers the kit did not start (repro.plan.endpoint), against stand-in HTTP servers
that only ever fail (tests/test_e2e_served.py runs both on vLLM's real server)."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import ClassVar

import pytest
from kvkit_testutil import ROOT

from repro.engine import frontend, served
from repro.errors import UsageError
from repro.plan import endpoint
from repro.plan import options as cli


def test_the_parent_and_the_child_name_the_same_front_ends_and_endpoint_variable():
    assert cli.FRONTENDS == frontend.FRONTENDS and cli.FRONTEND_CHOICES == ("sync", "async", "server")
    assert endpoint.ENDPOINT_URL_ENV == served.ENDPOINT_URL_ENV and cli.STREAM_ENV == served.STREAM_ENV


def test_a_streamed_answer_joins_into_the_answer_it_stands_for():
    chunks = [
        {"id": "cmpl-s", "choices": [{"text": "a", "token_ids": [7], "prompt_token_ids": [1, 2, 3],
                                      "logprobs": {"top_logprobs": [{"token_id:7": -0.1, "token_id:9": -2.5}]}}]},
        {"id": "cmpl-s", "choices": [{"text": "b", "token_ids": [8], "finish_reason": "length",
                                      "logprobs": {"top_logprobs": [{"token_id:8": -0.2, "token_id:1": -3.0}]}}]},
        {"id": "cmpl-s", "choices": [], "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}}},
    ]  # fmt: skip
    raw = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    joined = served.as_output(served.joined_stream(raw.encode()), [1, 2, 3])
    plain = served.as_output({**_answer(0), "id": "cmpl-s"}, [1, 2, 3])
    for key in ("request_id", "num_cached_tokens", "prompt_token_ids"):
        assert getattr(joined, key) == getattr(plain, key), key
    for key in ("token_ids", "finish_reason", "text"):
        assert getattr(joined.outputs[0], key) == getattr(plain.outputs[0], key), key
    assert [{t: lp.logprob for t, lp in step.items()} for step in joined.outputs[0].logprobs] == [
        {t: lp.logprob for t, lp in step.items()} for step in plain.outputs[0].logprobs
    ]


def test_stream_needs_a_served_front_end(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    args = cli.build_parser().parse_args(["--model", str(tmp_path), "--fixture", "fixtures/selftest-cpu.json",
                                          "--report", str(tmp_path / "r.json"), "--device", "cpu", "--stream"])  # fmt: skip
    with pytest.raises(UsageError, match="--stream needs --frontend server"):
        cli.validate(args)


def test_the_engine_arguments_become_vllm_serve_flags():
    argv = served.serve_argv(
        {"model": "/m", "tokenizer": "/m", "revision": None, "dtype": "float32", "seed": 0, "enforce_eager": True,
         "max_model_len": 2048, "enable_prefix_caching": False, "disable_log_stats": False, "async_scheduling": True}
    )  # fmt: skip
    assert argv == ["--model", "/m", "--tokenizer", "/m", "--dtype", "float32", "--seed", "0", "--enforce-eager",
                    "--max-model-len", "2048", "--no-enable-prefix-caching", "--async-scheduling"]  # fmt: skip


def _answer(cached="absent", logprobs=True) -> dict:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    if cached != "absent":
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    top = [{"token_id:7": -0.1, "token_id:9": -2.5}, {"token_id:8": -0.2, "token_id:1": -3.0}]
    choice = {"index": 0, "text": "ab", "finish_reason": "length", "token_ids": [7, 8], "prompt_token_ids": [1, 2, 3],
              "logprobs": {"top_logprobs": top, "tokens": ["token_id:7", "token_id:8"]} if logprobs else None}  # fmt: skip
    return {"id": "cmpl-x", "choices": [choice], "usage": usage, "kv_transfer_params": None}


@pytest.mark.parametrize("cached, expected", [("absent", None), (None, None), (0, 0), (288, 288)])
def test_an_answer_becomes_the_request_the_child_records_and_a_missing_counter_is_never_zero(cached, expected):
    from repro.engine.outputs import _request

    req = _request(served.as_output(_answer(cached), [1, 2, 3]), "reuse")
    assert req.cached_tokens == expected
    assert req.token_ids == (7, 8) and req.finish_reason == "length" and req.request_id == "cmpl-x"
    assert req.logprobs == ([[7, -0.1], [9, -2.5]], [[8, -0.2], [1, -3.0]])


@pytest.mark.parametrize(
    "answer, match",
    [
        ({"choices": []}, "0 choices"),
        ({"choices": [{"text": "ab"}]}, "no token_ids"),
        ({"choices": [{"token_ids": [1], "logprobs": {"top_logprobs": [{"ab": -0.1}]}}]}, "token_id:N"),
    ],
)
def test_an_answer_without_token_ids_is_a_server_failure_never_text(answer, match):
    with pytest.raises(served.ServerFailed, match=match):
        served.as_output(answer, [1])


def test_the_counters_are_read_from_the_servers_metrics():
    lines = ["# TYPE vllm:num_preemptions_total counter", 'vllm:num_preemptions_total{engine="0",model_name="m"} 3.0',
             'vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e9',
             'vllm:external_prefix_cache_hits_total{engine="0"} 0.0']  # fmt: skip
    text = "\n".join(lines)
    assert served.parse_metric(text, "vllm:num_preemptions") == 3
    assert served.parse_metric(text, "vllm:external_prefix_cache_hits") == 0
    assert served.parse_metric(text, "vllm:absent") is None


def test_a_served_arm_runs_in_one_process_only_on_the_cpu(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    argv = ["--model", str(tmp_path), "--fixture", "fixtures/selftest-cpu.json", "--report", str(tmp_path / "r.json"),
            "--frontend", "server", "--engine-layout", "one-process"]  # fmt: skip
    cli.validate(cli.build_parser().parse_args([*argv, "--device", "cpu"]))  # the engine core with its worker inside
    with pytest.raises(UsageError, match="one-process is for the CPU engine"):
        cli.validate(cli.build_parser().parse_args([*argv, "--device", "cuda"]))


# ---- repro endpoint's checks, against stand-ins that fail ----------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    answers: ClassVar[dict] = {}

    def do_GET(self):
        code, body = self.answers.get(self.path, (404, b"not found"))
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextmanager
def stand_in(answers: dict):
    handler = type("H", (_Handler,), {"answers": answers})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _endpoint(url: str, baseline: str, tmp_path, model: str) -> subprocess.CompletedProcess:
    report = tmp_path / "endpoint.json"
    argv = ["--url", url, "--baseline-url", baseline, "--model", model, "--fixture", "fixtures/selftest-cpu.json",
            "--report", str(report)]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "repro", "endpoint", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert not report.exists() and "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return proc


def _models(model: str) -> dict:
    return {"/v1/models": (200, json.dumps({"object": "list", "data": [{"id": model, "root": model}]}).encode())}


def test_an_unreachable_server_is_one_line_exit_2(tmp_path):
    with stand_in(_models("m")) as good:
        proc = _endpoint(f"http://127.0.0.1:{_closed_port()}", good, tmp_path, "m")
    assert "--url http://127.0.0.1:" in proc.stderr and "unreachable" in proc.stderr


@pytest.mark.parametrize(
    "answers, said",
    [({}, "GET /v1/models answered HTTP 404"), ({"/v1/models": (200, b"<html>hi</html>")}, "GET /v1/models is not JSON"),
     ({"/v1/models": (200, b'{"data": []}')}, "GET /v1/models lists no model")],
)  # fmt: skip
def test_a_server_that_is_not_openai_compatible_is_one_line_exit_2(tmp_path, answers, said):
    with stand_in(_models("m")) as good, stand_in(answers) as bad:
        proc = _endpoint(good, bad, tmp_path, "m")
    assert f"--baseline-url {bad}: not an OpenAI-compatible server ({said})" in proc.stderr


def test_a_server_of_another_model_is_one_line_exit_2(tmp_path):
    with stand_in(_models("m")) as good, stand_in(_models("Qwen/Qwen3-0.6B")) as other:
        proc = _endpoint(other, good, tmp_path, "m")
    assert f"--url {other}: serves Qwen/Qwen3-0.6B, not --model m" in proc.stderr


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:1", "127.0.0.1:8000", "http://user:pw@127.0.0.1:1"])
def test_a_url_that_is_no_server_address_is_refused(url):
    with pytest.raises(UsageError, match="--url"):
        endpoint.check_url("--url", url)


def test_the_same_server_twice_is_refused():
    with pytest.raises(UsageError, match="the same server"):
        endpoint.check_endpoints("http://127.0.0.1:1/", "http://127.0.0.1:1", "m")


class _ExitsLate:
    """A server process whose exit becomes readable a moment after its sockets closed (as a killed `vllm serve`'s
    can: the kernel closes a dying process's files before its parent can read its exit)."""

    pid = 4242

    def __init__(self, after: float):
        self.at = time.monotonic() + after

    def poll(self):
        return -9 if time.monotonic() >= self.at else None

    def wait(self, timeout=None):
        left = self.at - time.monotonic()
        if timeout is not None and left > timeout:
            time.sleep(timeout)
            raise subprocess.TimeoutExpired("vllm serve", timeout)
        time.sleep(max(left, 0.0))
        return -9


def _drops_every_connection() -> int:
    """A loopback port whose listener reads each request and closes the connection without an answer."""
    sock = socket.socket()
    sock.bind((served.HOST, 0))
    sock.listen()

    def serve():
        while True:
            conn, _ = sock.accept()
            conn.recv(65536)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return sock.getsockname()[1]


def test_a_request_the_server_dropped_names_the_servers_exit_once_it_can_be_read():
    """The connection drops while the server's exit is not yet readable: the error still names the dead server (pid,
    exit code), having waited for its exit (served.EXIT_GRACE_S), never only the dropped connection."""
    front = served.ServerFrontend.__new__(served.ServerFrontend)
    front.base = f"http://{served.HOST}:{_drops_every_connection()}"
    front.proc = _ExitsLate(0.5)
    with pytest.raises(served.ServerFailed, match=r"vllm serve \(pid 4242\) exited with code -9"):
        front._call("POST", "/v1/completions", {"prompt": [1, 2, 3]})


def test_a_request_the_server_dropped_while_it_lives_says_what_the_connection_did():
    """A live server that drops a request: the error says what the connection did, after the grace, and no exit."""
    front = served.ServerFrontend.__new__(served.ServerFrontend)
    front.base = f"http://{served.HOST}:{_drops_every_connection()}"
    front.proc = _ExitsLate(3600)
    with pytest.raises(served.ServerFailed, match="no answer: (RemoteDisconnected|ConnectionResetError)") as failed:
        front._call("POST", "/v1/completions", {"prompt": [1, 2, 3]})
    assert "exited" not in str(failed.value)


# A stand-in `vllm serve` (a failure-handling test: no engine) that answers /health, then kills itself with SIGKILL
# while a request is in it: the request's connection closes as the process dies, before its exit can be read.
_DIES_MID_REQUEST = """
import http.server, os, signal, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        os.kill(os.getpid(), signal.SIGKILL)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_server_killed_mid_request_is_named_with_its_pid_and_exit_code():
    """A real process killed (SIGKILL) inside a request: the request's error names it (pid, exit code -9)."""
    front = served.ServerFrontend.__new__(served.ServerFrontend)
    front.port = served.free_port()
    front.base = f"http://{served.HOST}:{front.port}"
    front.proc = subprocess.Popen([sys.executable, "-c", _DIES_MID_REQUEST, str(front.port)])
    try:
        for _ in range(200):  # until it listens
            assert front.proc.poll() is None, "the stand-in server did not start"
            try:
                socket.create_connection((served.HOST, front.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        with pytest.raises(served.ServerFailed) as failed:
            front._call("POST", "/v1/completions", {"prompt": [1, 2, 3]})
        said = str(failed.value)
        assert f"vllm serve (pid {front.proc.pid}) exited with code -9" in said, said
    finally:
        if front.proc.poll() is None:
            front.proc.kill()
        front.proc.wait()
