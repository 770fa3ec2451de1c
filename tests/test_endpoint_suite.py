"""`repro endpoint` checking one's own deployment, without an engine: the suite's probes sent by default (the plan,
with the tiny model's tokenizer), the hit counter asked of each server before the run (a tiny completion against
stand-in HTTP servers), the judged server's prefix cache reset only under --reset-prefix-cache (the check, the mark
its child reads, the child's reset over HTTP), and the line a cold hit left by an earlier run prints
(tests/test_e2e_served.py runs all of it against vLLM's real servers)."""

from __future__ import annotations

import http.server
import json
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest
from kvkit_testutil import ROOT, serving
from test_served import _endpoint

from repro import verify
from repro.engine import served
from repro.errors import UsageError
from repro.plan import endpoint
from repro.plan.options import SELFTEST_CPU_FIXTURE
from repro.readmodel import as_report

DETAILS = {"prompt_tokens": 2, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 0}}


@contextmanager
def stand_in(model: str = "m", usage: dict | None = DETAILS, reset: bool = True):
    """A server that lists model, has no /tokenize (so the tokenizer is not checked here), answers a completion with
    usage (None: no usage at all) and, where reset, POST /reset_prefix_cache; it yields its URL and every request it
    got as (method, path with query, body)."""
    got: list[tuple[str, str, dict | None]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _send(self, code: int, body: dict):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            got.append(("GET", self.path, None))
            if self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": model, "root": model}]})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            got.append(("POST", self.path, body))
            route = urlsplit(self.path).path
            if route == "/v1/completions":
                answer = {"id": "cmpl-1", "choices": [{"text": "!", "token_ids": [33], "finish_reason": "length"}]}
                self._send(200, answer | ({"usage": usage} if usage is not None else {}))
            elif route == "/reset_prefix_cache" and reset:
                self._send(200, {"success": True})
            else:
                self._send(404, {"detail": "Not Found"})

        def log_message(self, *args):
            pass

    with serving(Handler) as url:
        yield url, got


def _resets(got: list) -> list[str]:
    return [path for method, path, _ in got if method == "POST" and path.startswith("/reset_prefix_cache")]


# ---- the hit counter, asked before the run ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "usage",
    [None, {"prompt_tokens": 2}, {"prompt_tokens": 2, "prompt_tokens_details": None},
     {"prompt_tokens": 2, "prompt_tokens_details": {"cached_tokens": None}}],
)  # fmt: skip
def test_a_server_whose_answers_carry_no_hit_counter_is_refused_naming_the_flag(usage):
    with stand_in(usage=usage) as (url, got), pytest.raises(UsageError) as caught:
        endpoint.check_usage("--url", url, "m")
    assert str(caught.value) == (
        f"--url {url}: its answers carry no usage.prompt_tokens_details.cached_tokens, the hit counter every verdict "
        "reads: restart it with --enable-prompt-tokens-details"
    )
    (sent,) = [body for method, path, body in got if path == "/v1/completions"]
    assert sent == {"model": "m", "prompt": endpoint.USAGE_PROMPT, "max_tokens": 1, "temperature": 0.0}


def test_a_server_with_the_hit_counter_passes_and_one_without_completions_is_refused():
    with stand_in() as (url, _):
        assert endpoint.check_usage("--url", url, "m") == 0
    with stand_in(usage=None) as (url, _), pytest.raises(UsageError, match="--baseline-url"):
        endpoint.check_usage("--baseline-url", url, "m")


@pytest.mark.parametrize("which", ["--url", "--baseline-url"])
def test_the_cli_refuses_a_server_without_the_hit_counter_in_one_line_and_resets_nothing(tmp_path, which):
    with stand_in() as (good, good_got), stand_in(usage={"prompt_tokens": 2}) as (bad, bad_got):
        url, baseline = (bad, good) if which == "--url" else (good, bad)
        proc = _endpoint(url, baseline, tmp_path, "m")  # one line, exit 2, nothing written (test_served._endpoint)
    assert proc.stderr.strip() == (
        f"error: {which} {bad}: its answers carry no usage.prompt_tokens_details.cached_tokens, the hit counter every "
        "verdict reads: restart it with --enable-prompt-tokens-details"
    )
    assert _resets(good_got) == _resets(bad_got) == []  # never reset without --reset-prefix-cache


# ---- --reset-prefix-cache: asked for, never by default -----------------------------------------------------------


def test_without_the_flag_neither_server_is_reset_and_the_child_reads_a_plain_url():
    with stand_in() as (url, got), stand_in() as (baseline, base_got):
        servers = endpoint.check_endpoints(url + "/", baseline, "m")
    assert servers == {"endpoint": url, "baseline": baseline}
    assert _resets(got) == _resets(base_got) == []
    assert [path for _, path, _ in got] == ["/v1/models", "/v1/completions"]  # no local tokenizer for "m": unchecked


def test_with_the_flag_the_judged_server_is_reset_once_and_its_child_is_told_to_reset():
    with stand_in() as (url, got), stand_in(reset=False) as (baseline, base_got):
        servers = endpoint.check_endpoints(url, baseline, "m", reset=True)
    assert servers == {"endpoint": f"{url} {endpoint.RESET_MARK}", "baseline": baseline}
    assert _resets(got) == ["/reset_prefix_cache?reset_running_requests=false&reset_external=false"]
    assert _resets(base_got) == []  # its caching is off: nothing to reset, and a hit there is the finding


def test_with_the_flag_a_server_without_the_reset_route_is_refused_in_one_line():
    with stand_in(reset=False) as (url, _), stand_in() as (baseline, _), pytest.raises(UsageError) as caught:
        endpoint.check_endpoints(url, baseline, "m", reset=True)
    assert str(caught.value) == (
        f"--url {url}: --reset-prefix-cache cannot reset its prefix cache (POST /reset_prefix_cache answered HTTP "
        "404; vLLM's server offers /reset_prefix_cache only when started with VLLM_SERVER_DEV_MODE=1): start it so, "
        "or restart it instead"
    )


def test_a_url_with_white_space_is_refused_so_the_mark_after_it_is_unambiguous():
    assert endpoint.RESET_MARK == served.RESET_MARK  # the child reads the parent's mark
    with pytest.raises(UsageError, match="not an http"):
        endpoint.check_url("--url", "http://127.0.0.1:8000 reset-prefix-cache")


@pytest.mark.parametrize("marked", [True, False])
def test_the_endpoint_child_resets_over_http_only_where_its_server_is_marked(monkeypatch, marked):
    monkeypatch.setattr(served, "check_tokenizer", lambda front: {"checked": False, "why": "a stand-in"})
    with stand_in() as (url, got):
        front = served.EndpointFrontend({"model": "m"}, f"{url} {served.RESET_MARK}" if marked else url)
        assert front.base == url
        assert front.reset_prefix_cache() is marked
        facts = front.served_facts()
    if marked:
        assert _resets(got) == ["/reset_prefix_cache?reset_running_requests=false&reset_external=false"]
        assert facts["prefix_cache_resets"] == [{"over": "http", "answer": {"success": True}}]
    else:
        assert _resets(got) == []
        assert facts["prefix_cache_resets"] == [
            {"over": "none", "why": "a server the kit did not start: its cache is left as it is"}
        ]


# ---- the probes: the suite's by default ---------------------------------------------------------------------------


def _plan(tiny_model: str, tmp_path, *extra: str):
    own = verify._endpoint_parser().parse_args(
        ["--url", "http://127.0.0.1:1", "--baseline-url", "http://127.0.0.1:2", "--model", tiny_model,
         "--fixture", str(ROOT / SELFTEST_CPU_FIXTURE), "--report", str(tmp_path / "endpoint.json"), *extra]
    )  # fmt: skip
    argv = verify.endpoint_argv(own)
    servers = {"endpoint": "http://127.0.0.1:1", "baseline": "http://127.0.0.1:2"}
    return verify.plan_endpoint(verify.endpoint_options(servers)(argv), argv)


def test_every_probe_of_the_suite_is_sent_by_default_and_judged_without_the_fixtures_tables(tiny_model, tmp_path):
    for extra in ((), ("--suite", "acceptance")):
        plan = _plan(tiny_model, tmp_path, *extra)
        assert [p.name for p in plan.inputs.probes] == ["fixture", "chat-511", "chat-512", "chat-513"]
        assert plan.inputs.suite is None  # every verdict PASS, not the fixture's tables (which name no endpoint)
        assert [(a.name, a.spec.mode) for a in plan.arms] == [("baseline", "baseline"), ("endpoint", "native")]
        assert plan.engine.frontend == "endpoint" and "--suite" in plan.argv


def test_no_suite_sends_the_fixtures_probes_only_and_cannot_be_given_with_the_suite(tiny_model, tmp_path):
    plan = _plan(tiny_model, tmp_path, "--no-suite")
    assert [p.name for p in plan.inputs.probes] == ["fixture"] and "--suite" not in plan.argv
    with pytest.raises(UsageError, match="not allowed with argument --no-suite"):
        _plan(tiny_model, tmp_path, "--no-suite", "--suite", "acceptance")


# ---- a cold hit: the line after the summary -----------------------------------------------------------------------


def _report(colds: dict[str, list]) -> dict:
    """A report whose arms' probes have these cold requests' cached tokens (arm -> [per probe])."""

    def probes(cached: list) -> list[dict]:
        return [
            {"name": f"p{i}", "requests": [{"cached_tokens": c}, {"cached_tokens": 9}]} for i, c in enumerate(cached)
        ]

    return {"arms": [{"name": arm, "probes": probes(cached)} for arm, cached in colds.items()]}


def test_a_cold_hit_on_the_judged_server_says_how_to_clear_it():
    url = "http://127.0.0.1:8000"
    report = as_report(_report({"baseline": [0, 0], "endpoint": [1488, 0]}))
    assert verify.cold_hit_hint(report, url, reset=False) == (
        f"endpoint: 1 cold request (p0) hit {url}'s prefix cache, left there by an earlier run: restart that server, "
        "or run again with --reset-prefix-cache (the server started with VLLM_SERVER_DEV_MODE=1)"
    )
    after_reset = verify.cold_hit_hint(report, url, reset=True)
    assert after_reset.startswith(f"endpoint: 1 cold request (p0) hit {url}'s prefix cache although it was reset")
    assert after_reset.endswith("restart that server")


@pytest.mark.parametrize(
    "colds", [{"baseline": [0], "endpoint": [0]}, {"baseline": [1488], "endpoint": [0]}, {"endpoint": [None, -1]}]
)
def test_no_cold_hit_on_the_judged_server_says_nothing(colds):
    """A baseline's hit is the baseline's own INCONCLUSIVE (its caching should be off); a missing counter is not a hit."""
    assert verify.cold_hit_hint(as_report(_report(colds)), "http://127.0.0.1:8000", reset=False) is None
