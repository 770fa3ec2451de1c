"""`repro endpoint` checks the server's tokenizer by token IDs (repro.plan.endpoint.check_tokenizer), and a served
child checks it again (repro.engine.served.check_tokenizer), against stand-in HTTP servers (engine-free;
tests/test_e2e_endpoint.py refuses a real vLLM server of another tokenizer)."""

from __future__ import annotations

import http.server
import json
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from kvkit_testutil import serving
from test_served import _endpoint

from repro.engine import served
from repro.errors import UsageError
from repro.models.tiny import build_tokenizer_json
from repro.plan import endpoint


@contextmanager
def stand_in(model: str, tokenize):
    """A server that lists model and answers POST /tokenize with tokenize(text) (None: HTTP 404, no such route)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _send(self, code: int, body: bytes):
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/v1/models":
                self._send(200, json.dumps({"data": [{"id": model, "root": model}]}).encode())
            else:
                self._send(404, b"not found")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            ids = tokenize(body["prompt"]) if self.path == "/tokenize" and not body["add_special_tokens"] else None
            if ids is None:
                self._send(404, b'{"detail": "Not Found"}')
            else:
                self._send(200, json.dumps({"count": len(ids), "tokens": ids, "max_model_len": 2048}).encode())

        def log_message(self, *args):
            pass

    with serving(Handler) as url:
        yield url


@pytest.fixture
def model(tmp_path):
    """A model folder with the tiny model's tokenizer (every byte a token, no merges), as `make model` writes it."""
    return _model_folder(tmp_path, {})


def _model_folder(folder, config: dict) -> str:
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (folder / "tokenizer.json").write_text(json.dumps(build_tokenizer_json()))
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", **config}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return str(folder)


def _bytes(text: str) -> list[int]:  # the tiny tokenizer's IDs for text without its chat markers
    return list(text.encode("utf-8"))


def _ours(text: str) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_str(json.dumps(build_tokenizer_json())).encode(text, add_special_tokens=False).ids


def test_the_same_tokenizer_is_checked_text_by_text(model):
    with stand_in(model, _ours) as url:
        assert endpoint.check_tokenizer("--url", url, model, model) == {"checked": True, "texts": 5}


def test_a_server_without_tokenize_is_not_checked_and_says_why(model):
    with stand_in(model, lambda text: None) as url:
        assert endpoint.check_tokenizer("--url", url, model, model) == {
            "checked": False,
            "why": "POST /tokenize answered HTTP 404",
        }


def test_no_local_tokenizer_is_not_checked_and_says_why(tmp_path):
    with stand_in("org/none", _ours) as url:
        got = endpoint.check_tokenizer("--url", url, "org/none", str(tmp_path / "absent"))
    assert got["checked"] is False and "no local tokenizer for --model" in got["why"]


def test_the_tokenizer_is_loaded_as_a_server_loads_it_with_its_tokenizer_config(tmp_path):
    """add_prefix_space in tokenizer_config.json changes how a server (transformers, under vLLM) splits text, which
    tokenizer.json alone does not say: a server giving those IDs is --model's tokenizer, the raw file's IDs are not."""
    model = _model_folder(tmp_path, {"tokenizer_class": "GPT2TokenizerFast", "add_prefix_space": True})
    from vllm.tokenizers import get_tokenizer  # how a vLLM server loads it: the IDs its POST /tokenize gives

    server = get_tokenizer(model)

    def spaced(text):
        return list(server.encode(text, add_special_tokens=False))

    assert spaced("The") != _ours("The")  # the setting splits text otherwise than tokenizer.json alone
    with stand_in(model, spaced) as url:
        assert endpoint.check_tokenizer("--url", url, model, model) == {"checked": True, "texts": 5}
    with stand_in(model, _ours) as url, pytest.raises(UsageError, match="its tokenizer is not --model"):
        endpoint.check_tokenizer("--url", url, model, model)


def _refused(url: str, baseline: str, tmp_path, model: str) -> str:
    return _endpoint(url, baseline, tmp_path, model).stderr.strip()


def test_a_server_of_the_same_name_but_another_tokenizer_is_one_line_exit_2(tmp_path, model):
    """The name matches --model; the IDs do not (one byte's ID swapped, as a vocabulary of another model would)."""

    def other(text):
        return [116 if t == 101 else 101 if t == 116 else t for t in _ours(text)]

    with stand_in(model, _ours) as good, stand_in(model, other) as bad:
        line = _refused(good, bad, tmp_path, model)
    assert f"--baseline-url {bad}: its tokenizer is not --model {model}'s" in line
    assert "'The quick brown fox jump'... is 44 tokens there, 44 here, first different at token 2" in line


def test_only_chat_markers_differing_is_refused(tmp_path, model):
    """A vocabulary that lacks the chat markers (it spells them in bytes) differs only on the last text."""
    with stand_in(model, _ours) as good, stand_in(model, _bytes) as bad:
        line = _refused(bad, good, tmp_path, model)
    assert (
        f"--url {bad}: its tokenizer is not --model {model}'s: '<|im_start|>user\\nhello<|'... is 53 tokens there, 21 here"
        in line
    )


class _Front:
    """What served.check_tokenizer reads of a front end: its arguments, GET/POST and its tokenizer."""

    def __init__(self, tokenize):
        self.kwargs, self.tokenize = {"model": "m"}, tokenize

    def get_json(self, path):
        return {"data": [{"id": "m"}]}

    def _call(self, method, path, body):
        ids = self.tokenize(body["prompt"])
        if ids is None:
            raise served.ServerFailed("POST /tokenize answered HTTP 404: not found")
        return json.dumps({"tokens": ids}).encode()

    def get_tokenizer(self):
        return SimpleNamespace(encode=lambda text, add_special_tokens: _ours(text))


def test_the_served_child_checks_the_tokenizer_and_records_it():
    assert served.check_tokenizer(_Front(_ours)) == {"checked": True, "texts": 5, "over": "POST /tokenize"}
    got = served.check_tokenizer(_Front(lambda text: None))
    assert got == {
        "checked": False,
        "why": "no token IDs from POST /tokenize: POST /tokenize answered HTTP 404: not found",
    }
    with pytest.raises(served.ServerFailed, match="the server's tokenizer is not the arm's"):
        served.check_tokenizer(_Front(_bytes))
