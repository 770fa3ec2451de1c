"""The `server` front end: the arm's engine is a `vllm serve` process this child starts, driven over HTTP.

`--frontend server` runs each arm as production does: vLLM's OpenAI-compatible server
(`python -m vllm.entrypoints.openai.api_server`, what `vllm serve` runs), started by the engine child on a
loopback port found free, with the arm's engine arguments translated from the same keyword arguments the
offline front ends build their engine from (repro.engine.engine_args). The translation is checked before the
server starts: vLLM's own parser reads the command line back into AsyncEngineArgs, and every argument must come
back as given (else the arm fails, naming it). The child waits for `/health`, then sends each request to
`/v1/completions`: the prompt as token IDs, greedy, `ignore_eos`, `max_tokens`, `logprobs` with the IDs
(`return_tokens_as_token_ids`) and the generated token IDs (`return_token_ids`), so the comparison is on token
IDs, never text; a probe's tenant salt goes in the body as `cache_salt`. An answer without them (plain, or a stream in which no chunk carried any), or not of the
max_tokens asked (repro.judge.answer), is ServerFailed: never an empty or partial answer. The hit counter is
`usage.prompt_tokens_details.cached_tokens` (the server runs with `--enable-prompt-tokens-details`): absent, the
request's `num_cached_tokens` is None, which the judge reads as missing (INCONCLUSIVE, naming the flag), never 0. Several prompts of one call (a scenario's together step) are sent at once, each
its own HTTP request, so they are in flight together. `reset_prefix_cache` is `POST /reset_prefix_cache`
(vLLM's dev-mode route: the server runs with VLLM_SERVER_DEV_MODE=1). Counters come from `/metrics`. Before the
first request the server's tokenizer is checked against the one the child builds prompts with (check_tokenizer:
fixed texts through `POST /tokenize`, token ID by token ID); a difference is ServerFailed, and a server without
/tokenize is recorded as not checked, with why (`served.tokenizer` in the report).

Where this child was forked by the kit's warm-import launcher (the test suite's), the server's first process is
forked from it instead of started afresh (ForkedServer: same argv, environment and process title).

The server's output goes to this child's log; it runs in the child's process group, so the parent's stop of the
group (and the lifeline, if the kit dies) stops it too. A server that exits before it is healthy, dies, or
answers an error raises ServerFailed: the arm is an ERROR with the log's tail. Standard library HTTP only.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from repro.contract.served import TOKENIZER_TEXTS
from repro.engine import forked
from repro.judge.answer import NO_TOKEN_IDS, answer_problem

HOST = "127.0.0.1"
STREAM_ENV = "KVKIT_SERVER_STREAM"  # "1": every request streamed (--stream; repro.plan.options.STREAM_ENV)
STREAM = {"stream": True, "stream_options": {"include_usage": True}}
HEALTH_POLL_S = 0.5
REQUEST_TIMEOUT_S = 1800.0
# A server killed mid-request: the kernel closes its sockets before its exit status can be read, so a request that
# got no answer waits up to this long for the process's exit before it says the server is alive (ServerFrontend._dead).
EXIT_GRACE_S = 5.0


class ServerFailed(RuntimeError):
    """The arm's `vllm serve` did not come up, died, or answered an error (the arm's log holds its output)."""


def free_port() -> int:
    """A loopback port free now (the kernel's choice, never a fixed one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def ktc_dict(ktc) -> dict:
    """A KVTransferConfig's settings that the kit sets, as the server's --kv-transfer-config JSON."""
    out = {"kv_connector": ktc.kv_connector, "kv_role": ktc.kv_role}
    if ktc.kv_connector_extra_config:
        out["kv_connector_extra_config"] = dict(ktc.kv_connector_extra_config)
    if ktc.kv_connector_module_path:
        out["kv_connector_module_path"] = ktc.kv_connector_module_path
    return out


def serve_argv(engine_kwargs: dict) -> list[str]:
    """The engine's keyword arguments (repro.engine.engine_args) as `vllm serve` flags."""
    argv: list[str] = []
    for key, value in engine_kwargs.items():
        if value is None:
            continue
        if key == "model":
            argv += ["--model", str(value)]
        elif key == "kv_transfer_config":
            argv += [_flag(key), json.dumps(ktc_dict(value), sort_keys=True)]
        elif isinstance(value, bool):
            if key == "disable_log_stats":
                argv += [_flag(key)] if value else []
            else:  # vLLM's boolean flags take --x / --no-x
                argv.append(_flag(key) if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            argv += [_flag(key), json.dumps(value, sort_keys=True)]
        else:
            argv += [_flag(key), str(value)]
    return argv


def check_argv(argv: list[str], engine_kwargs: dict) -> None:
    """vLLM's own parser reads the flags back: every keyword argument must come back as given (a translation that
    drops or alters one would make the served arm another engine than the offline one)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from repro.engine.capabilities import served_arg_parser

    make_arg_parser = served_arg_parser()  # vLLM 0.32 moved it (repro.engine.capabilities.SERVED_PARSER_MODULES)
    parsed = AsyncEngineArgs.from_cli_args(make_arg_parser(FlexibleArgumentParser()).parse_args(argv))
    for key, want in engine_kwargs.items():
        got = getattr(parsed, key, None)
        if key == "kv_transfer_config" and want is not None:
            same = got is not None and ktc_dict(got) == ktc_dict(want)
        else:
            same = got == want or (want is None and got in (None, False))
        if not same:
            raise ServerFailed(
                f"vllm serve's parser reads {key} as {got!r}, not {want!r}: the served engine would differ"
            )


class ForkedServer:
    """The server's first process forked from this child rather than started afresh, where this child was itself
    forked by the kit's warm-import launcher (repro.engine.warm: vLLM and the server's modules are imported already,
    and no thread runs), so it skips an interpreter's start and vLLM's import (about 10 s of each served arm on two
    cores). The fork then runs the server's module as `python -m` would, with the same argv and environment; the
    engine core and worker processes vLLM starts from it are started as vLLM starts them (on the CPU: spawned).
    Its process title is the command a started server would have. Popen's poll, wait and pid; the status is the
    fork's exit code (or -signal)."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str]) -> ForkedServer | None:
        """The fork running argv (`PYTHON -m MODULE ARGS`) under env, or None where this child may not fork it."""
        if not forked.FORKED or forked.fork_refusal() is not None:
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            print(f"kvkit-engine: vllm serve forked from this child (pid {pid})", flush=True)
            return cls(pid)
        try:  # the server: the arm's log as stdout and stderr (inherited), stdin empty, argv and environment as given
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            with contextlib.suppress(ImportError):  # what ps shows: the command a started server would have
                import setproctitle  # a dependency of vLLM's (first: it finds the title's memory by the environment's)

                setproctitle.setproctitle(" ".join(argv))
            for name in set(os.environ) - set(env):
                del os.environ[name]
            os.environ.update(env)
            code = forked.run_module(argv)
        except BaseException:  # noqa: BLE001 - the fork must never return into the arm's code: Python's own report
            traceback.print_exc()
            code = 1
        forked.exit_now(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["vllm serve"], timeout or 0.0)
            time.sleep(0.05)
        return self.returncode


class ServerFrontend:
    """A `vllm serve` process behind the calls the child makes (generate, reset_prefix_cache, get_tokenizer)."""

    def __init__(self, engine_kwargs: dict, python: str | None = None):
        self.kwargs = dict(engine_kwargs)
        self.stream = os.environ.get(STREAM_ENV) == "1"
        self.argv_engine = serve_argv(self.kwargs)
        check_argv(self.argv_engine, self.kwargs)
        self.port = free_port()
        self.base = f"http://{HOST}:{self.port}"
        self.resets: list[dict] = []  # each /reset_prefix_cache: what the server answered
        argv = [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", HOST,
                "--port", str(self.port), *self.argv_engine, "--enable-prompt-tokens-details",
                "--disable-uvicorn-access-log"]  # fmt: skip
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}  # /reset_prefix_cache is a dev-mode route
        print(f"kvkit-engine: starting vllm serve on {self.base}: {' '.join(argv)}", flush=True)
        # In this child's process group (no new session): the parent's stop of the group, or the lifeline, stops it.
        self.proc = ForkedServer.start(argv, env) or subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
        self._wait_healthy()
        self._tokenizer = self._config = None
        self._pool = ThreadPoolExecutor(max_workers=64)
        self.tokenizer_check = check_tokenizer(self)

    def _dead(self, grace: float = 0.0) -> str | None:
        """Why the server is gone (its pid and exit code), or None while it runs; grace: seconds to wait for an exit."""
        try:
            code = self.proc.wait(timeout=grace) if grace > 0 else self.proc.poll()
        except subprocess.TimeoutExpired:
            code = None
        return None if code is None else f"vllm serve (pid {self.proc.pid}) exited with code {code}"

    def _wait_healthy(self) -> None:
        t0 = time.monotonic()
        while True:
            if (why := self._dead()) is not None:
                raise ServerFailed(f"{why} before /health answered (its output is in this arm's log)")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        print(f"kvkit-engine: vllm serve healthy after {time.monotonic() - t0:.1f} s", flush=True)
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(HEALTH_POLL_S)

    def _call(self, method: str, path: str, body: dict | None = None) -> bytes:
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace")[:500]
            raise ServerFailed(f"{method} {path} answered HTTP {exc.code}: {text}") from None
        except (urllib.error.URLError, OSError) as exc:
            why = self._dead(EXIT_GRACE_S) or f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
            raise ServerFailed(f"{method} {path}: no answer: {why} (its output is in this arm's log)") from None

    @property
    def vllm_config(self):
        """The VllmConfig vLLM derives from the server's engine arguments (built here as the server builds its own:
        the sizes vLLM computes at start-up, such as the KV cache's blocks, are the server's and not in it)."""
        if self._config is None:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.usage.usage_lib import UsageContext

            self._config = AsyncEngineArgs(**self.kwargs).create_engine_config(UsageContext.OPENAI_API_SERVER)
        return self._config

    def served_facts(self) -> dict:
        """What the report keeps of the server: its address, flags, what it says of itself, every reset over HTTP."""
        facts: dict = {"url": self.base, "argv": self.argv_engine, "prefix_cache_resets": self.resets,
                       "stream": self.stream, "tokenizer": self.tokenizer_check}  # fmt: skip
        for key, path in (("version", "/version"), ("models", "/v1/models")):
            try:
                facts[key] = self.get_json(path)
            except (ServerFailed, ValueError) as exc:
                facts[key] = f"unavailable: {exc}"[:300]
        return facts

    def get_json(self, path: str) -> dict:
        return json.loads(self._call("GET", path))

    def metrics_text(self) -> str:
        return self._call("GET", "/metrics").decode("utf-8", "replace")

    def get_tokenizer(self):
        """The model's tokenizer as vLLM loads it (chat probes are rendered here, then sent as token IDs)."""
        if self._tokenizer is None:
            from vllm.tokenizers import get_tokenizer

            self._tokenizer = get_tokenizer(self.kwargs["tokenizer"], revision=self.kwargs.get("revision"))
        return self._tokenizer

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        query = f"?reset_running_requests={str(reset_running_requests).lower()}&reset_external={str(reset_connector).lower()}"
        answer = json.loads(self._call("POST", "/reset_prefix_cache" + query))
        self.resets.append({"over": "http", "answer": answer})
        return bool(answer.get("success"))

    def generate(self, prompts: list, sampling_params, use_tqdm: bool = False, lora_request=None) -> list:
        """Like LLM.generate: every prompt sent (at once, each its own HTTP request, where there are several), their
        answers as RequestOutput-like records in the same order."""
        if lora_request is not None and any(lr is not None for lr in (lora_request if isinstance(lora_request, list)
                                                                        else [lora_request])):  # fmt: skip
            raise ServerFailed(
                "LoRA adapters are not sent to a served arm (the kit does not load them into vllm serve)"
            )
        each = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        bodies = [completion_body(p["prompt_token_ids"], sp, p.get("cache_salt")) for p, sp in zip(prompts, each)]
        if len(bodies) == 1:
            answers = [self._complete(bodies[0])]
        else:
            answers = list(self._pool.map(self._complete, bodies))
        return [as_output(a, p["prompt_token_ids"]) for a, p in zip(answers, prompts)]

    def _complete(self, body: dict) -> dict:
        """The answer to one request (a stream joined), held to what the body asked (the_choice)."""
        if not self.stream:
            answer = json.loads(self._call("POST", "/v1/completions", body))
        else:
            answer = joined_stream(self._call("POST", "/v1/completions", {**body, **STREAM}))
        the_choice(answer, body)
        return answer


ENDPOINT_URL_ENV = "KVKIT_ENDPOINT_URL"  # the server an endpoint arm talks to (repro.plan.endpoint sets it per arm)
RESET_MARK = "reset-prefix-cache"  # after the URL there: --reset-prefix-cache (repro.plan.endpoint.RESET_MARK)


class EndpointFrontend(ServerFrontend):
    """A server the kit did not start (`repro endpoint`): the same requests, no process of the kit's, and nothing
    sent but the probes' requests and what the server says of itself: its prefix cache is reset only where
    --reset-prefix-cache put RESET_MARK after its URL (each reset's answer, or that none was made, is in the report),
    there is no KV audit, and its engine settings are what /v1/models says, nothing more."""

    def __init__(self, engine_kwargs: dict, server: str):
        url, *marks = server.split()
        self.kwargs, self.base, self.argv_engine, self.proc = dict(engine_kwargs), url.rstrip("/"), [], None
        self.stream, self.may_reset = os.environ.get(STREAM_ENV) == "1", RESET_MARK in marks
        self.resets = []
        self._tokenizer = self._config = None
        self._pool = ThreadPoolExecutor(max_workers=64)
        print(f"kvkit-engine: a server the kit did not start: {self.base}", flush=True)
        self.tokenizer_check = check_tokenizer(self)

    def _dead(self, grace: float = 0.0) -> str | None:
        return None

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        if self.may_reset:  # over HTTP, as a served arm's; its local prefix cache only, never a connector's store
            return super().reset_prefix_cache(reset_running_requests, False)
        self.resets.append({"over": "none", "why": "a server the kit did not start: its cache is left as it is"})
        return False

    def endpoint_config(self) -> dict:
        """The effective config the judge compares (model, max_model_len from /v1/models; the rest unknown)."""
        try:
            models = self.get_json("/v1/models").get("data") or [{}]
        except (ServerFailed, ValueError, AttributeError):
            models = [{}]
        first = models[0] if isinstance(models[0], dict) else {}
        return {"frontend": "endpoint", "model": first.get("root") or first.get("id"),
                "max_model_len": first.get("max_model_len"), "engine_layout": "unknown (a server the kit did not start)",
                "served": self.served_facts()}  # fmt: skip


def check_tokenizer(front: ServerFrontend) -> dict:
    """The server's tokenizer against the child's (vLLM's load of the arm's tokenizer, which builds the prompts), token
    ID by token ID on TOKENIZER_TEXTS through POST /tokenize: a difference is ServerFailed (the probes' token IDs would
    mean other text there); a server that does not tokenize is recorded as not checked, with why."""
    served_as = front.kwargs.get("served_model_name") or front.kwargs.get("model")
    try:
        models = front.get_json("/v1/models").get("data") or []
        served_as = models[0].get("id") or served_as
    except (ServerFailed, ValueError, AttributeError, IndexError):
        pass
    tok = front.get_tokenizer()
    for text in TOKENIZER_TEXTS:
        try:
            theirs = json.loads(front._call("POST", "/tokenize", {"model": served_as, "prompt": text,
                                                                  "add_special_tokens": False})).get("tokens")  # fmt: skip
        except (ServerFailed, ValueError, AttributeError) as exc:
            return {"checked": False, "why": f"no token IDs from POST /tokenize: {exc}"[:300]}
        ours = list(tok.encode(text, add_special_tokens=False))
        if theirs != ours:
            raise ServerFailed(
                f"the server's tokenizer is not the arm's: POST /tokenize gives {text[:24]!r}... {len(theirs or [])} "
                f"token IDs, the arm's tokenizer {len(ours)}, not the same (the probes' token IDs would mean other text)"
            )
    return {"checked": True, "texts": len(TOKENIZER_TEXTS), "over": "POST /tokenize"}


def completion_body(ids: list[int], sp, salt: str | None = None) -> dict:
    """One /v1/completions request for these token IDs with the arm's sampling parameters (vllm.SamplingParams) and
    the probe's tenant salt (vLLM's cache_salt, repro.plan.salts) where it names one."""
    body = {
        "prompt": [int(t) for t in ids],
        "max_tokens": sp.max_tokens,
        "temperature": sp.temperature,
        "ignore_eos": bool(sp.ignore_eos),
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": True,
    }
    optional = {"logprobs": sp.logprobs, "seed": sp.seed, "prompt_logprobs": sp.prompt_logprobs, "cache_salt": salt}
    return body | {key: value for key, value in optional.items() if value is not None}


def joined_stream(raw: bytes) -> dict:
    """A streamed /v1/completions answer (server-sent events, one choice) joined into the answer it stands for: the
    token IDs, logprobs and text of every chunk in order, the finish reason of the last, the usage of the final
    chunk (include_usage: where prompt_tokens_details comes), the prompt's IDs from the first. token_ids is None
    where no chunk carried any (a server that ignores return_token_ids), never an empty answer."""
    ids, tops, text, finish, usage, prompt, first, carried = [], [], "", None, None, None, None, False
    for line in raw.decode("utf-8", "replace").splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: ") :])
        first = first or chunk
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            carried = carried or choice.get("token_ids") is not None
            ids += choice.get("token_ids") or []
            tops += ((choice.get("logprobs") or {}).get("top_logprobs")) or []
            text += choice.get("text") or ""
            finish = choice.get("finish_reason") or finish
            prompt = prompt or choice.get("prompt_token_ids")
    if first is None:
        raise ServerFailed("the streamed answer held no chunk")
    choice = {"token_ids": ids if carried else None, "text": text, "finish_reason": finish, "prompt_token_ids": prompt,
              "logprobs": {"top_logprobs": tops} if tops else None}  # fmt: skip
    return {"id": first.get("id"), "choices": [choice], "usage": usage, "streamed": True}


def _token_id(key: str) -> int:
    """A logprob entry's token under return_tokens_as_token_ids: 'token_id:N'."""
    prefix, _, number = key.rpartition(":")
    if prefix != "token_id" or not number.lstrip("-").isdigit():
        raise ServerFailed(f"a logprob key {key!r} is not 'token_id:N' (return_tokens_as_token_ids ignored?)")
    return int(number)


def the_choice(answer: dict, body: dict | None = None) -> dict:
    """An answer's one choice, or ServerFailed: not one choice, no token IDs (plain, or no chunk of a stream), or,
    where body (the request sent) is given, not the max_tokens it asked under its ignore_eos
    (repro.judge.answer.answer_problem)."""
    choices = answer.get("choices") or []
    if len(choices) != 1:
        raise ServerFailed(f"/v1/completions answered {len(choices)} choices, not 1")
    choice = choices[0]
    asked, ignore_eos = (None, False) if body is None else (body.get("max_tokens"), bool(body.get("ignore_eos")))
    problem = answer_problem(choice.get("token_ids"), asked, ignore_eos)
    if problem == NO_TOKEN_IDS:
        how = "streamed no token_ids in any chunk" if answer.get("streamed") else "answered no token_ids"
        raise ServerFailed(f"/v1/completions {how} (return_token_ids not supported by this server)")
    if problem is not None:
        raise ServerFailed(f"/v1/completions: {problem}")
    return choice


def as_output(answer: dict, prompt_ids: list[int], body: dict | None = None):
    """A /v1/completions answer as the RequestOutput fields the child reads (repro.engine.outputs._request); body:
    the request sent, where the caller has it and its answer did not come through _complete (which holds it)."""
    choice = the_choice(answer, body)
    steps = None
    lp = choice.get("logprobs")
    if lp is not None:
        steps = [
            None if top is None else {_token_id(k): SimpleNamespace(logprob=float(v)) for k, v in top.items()}
            for top in lp.get("top_logprobs") or []
        ]
    plp = choice.get("prompt_logprobs")
    if plp is not None:
        plp = [
            None
            if step is None
            else {int(t): SimpleNamespace(logprob=e.get("logprob"), rank=e.get("rank")) for t, e in step.items()}
            for step in plp
        ]
    details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")  # absent: missing (None), never 0
    completion = SimpleNamespace(
        token_ids=[int(t) for t in choice["token_ids"]],
        logprobs=steps,
        finish_reason=choice.get("finish_reason"),
        text=choice.get("text"),
    )
    return SimpleNamespace(
        request_id=str(answer.get("id")),
        outputs=[completion],
        num_cached_tokens=None if cached is None else int(cached),
        kv_transfer_params=answer.get("kv_transfer_params"),
        prompt_token_ids=choice.get("prompt_token_ids") or list(prompt_ids),
        prompt_logprobs=plp,
    )


def parse_metric(text: str, name: str) -> int | None:
    """The sum of a Prometheus counter's samples in /metrics text (vLLM names it name_total there); None: absent."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        metric = line.split("{", 1)[0].split(" ", 1)[0]
        if metric in (name, name + "_total"):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            seen = True
    return int(total) if seen else None
