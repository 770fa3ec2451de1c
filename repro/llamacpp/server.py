"""llama-server as the kit drives it: one process per arm, started by the arm's child on a loopback port the kernel
picked, its output in the child's log, in the child's process group (the parent's stop of the group, and the
lifeline, stop it too).

Every request goes to `/completion`: the prompt as token IDs, greedy (temperature 0, top_k 1, the penalties off),
`n_predict` = max_tokens with `ignore_eos` (llama.cpp biases the end-of-generation tokens away, so the answer is
exactly max_tokens tokens in every arm of a run alike), `return_tokens` (the generated token IDs: the comparison is
on IDs, never text), `n_probs` = the run's logprobs (each step's top log-probabilities from the whole distribution,
not after sampling), `cache_prompt` as the arm says and, where given, `id_slot`. The hit counter is the response's
`timings.cache_n` (the prompt tokens taken from the slot, llama-server's own per-request count: `prompt_n +
cache_n` is the prompt's length); a response without it is said (None), never read as 0. An answer without token
IDs, or not of max_tokens tokens, is the judge's to refuse (repro.judge.answer); an HTTP error, a server that exits
or does not come up, is ServerFailed with the log's tail. Standard library HTTP only (the llama.cpp environment
holds llama-cpp-python and its pins, nothing else)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

# as repro.engine.served's, which llama.cpp's child may not import (the vLLM boundary: tests/test_imports.py)
HOST = "127.0.0.1"
BINARY = "llama-server"  # in the environment's bin/ (tasks.py installs the kit's build there)
READY_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 1800.0


class ServerFailed(RuntimeError):
    """llama-server did not come up, exited, or answered an error (the arm's log holds its output)."""


def binary_path(prefix: str = sys.prefix) -> str:
    return os.path.join(prefix, "bin", BINARY)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def greedy_body(ids: list[int], n_predict: int, n_probs: int, cache_prompt: bool, slot: int | None, seed: int) -> dict:
    body = {
        "prompt": [int(t) for t in ids],
        "n_predict": n_predict,
        "ignore_eos": True,
        "temperature": 0.0,
        "top_k": 1,
        "top_p": 1.0,
        "min_p": 0.0,
        "repeat_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "seed": seed,
        "return_tokens": True,
        "n_probs": n_probs,
        "cache_prompt": cache_prompt,
        "stream": False,
    }
    if slot is not None:
        body["id_slot"] = slot
    return body


def answer_of(response: dict) -> dict:
    """What the kit keeps of a /completion response: token IDs, the hit counter (None when absent), each step's top
    log-probabilities as [[id, logprob], ...], the slot and why it stopped."""
    timings = response.get("timings") if isinstance(response.get("timings"), dict) else {}
    cache_n = timings.get("cache_n")
    steps = []
    for step in response.get("completion_probabilities") or []:
        top = step.get("top_logprobs") or []
        steps.append([[int(t["id"]), float(t["logprob"])] for t in top if "id" in t and "logprob" in t])
    tokens = response.get("tokens")
    return {
        "token_ids": [int(t) for t in tokens] if isinstance(tokens, list) else [],
        "cached_tokens": int(cache_n) if isinstance(cache_n, int) else None,
        "prompt_n": timings.get("prompt_n"),
        "logprobs": steps,
        "slot": response.get("id_slot"),
        "stop_type": response.get("stop_type"),
        "text": response.get("content", ""),
    }


class LlamaServer:
    """One llama-server process: `binary -m model --host 127.0.0.1 --port P` and the arm's flags."""

    def __init__(self, binary: str, model: str, flags: list[str]):
        if not os.access(binary, os.X_OK):
            raise ServerFailed(f"unavailable: no llama-server at {binary} (`make repro ENGINE=llamaserver` builds it)")
        self.port = free_port()
        self.argv = [binary, "-m", model, "--host", HOST, "--port", str(self.port), *flags]
        # its output is the child's (the arm's log): read back for the tail of a failure
        self.log_path = os.path.realpath("/proc/self/fd/1") if os.path.isfile("/proc/self/fd/1") else None
        sys.stdout.flush()
        self.proc = subprocess.Popen(self.argv, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._wait_ready()

    def _tail(self) -> str:
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, "rb") as fh:
                lines = fh.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in lines[-4:])

    def _dead(self) -> str | None:
        code = self.proc.poll()
        return None if code is None else f"llama-server exited with {code}: {self._tail()}"

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if (why := self._dead()) is not None:
                raise ServerFailed(why)
            try:
                with urllib.request.urlopen(f"http://{HOST}:{self.port}/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        self.stop()
        raise ServerFailed(f"llama-server was not healthy within {READY_TIMEOUT_S:.0f} s: {self._tail()}")

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://{HOST}:{self.port}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:300]
            raise ServerFailed(f"{method} {path}: HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ServerFailed(
                f"{method} {path}: {type(exc).__name__}: {exc}; {self._dead() or 'server alive'}"
            ) from exc

    def complete(self, body: dict) -> dict:
        return answer_of(self.call("POST", "/completion", body))

    def slot(self, slot: int, action: str, filename: str | None = None) -> dict:
        return self.call("POST", f"/slots/{slot}?action={action}", {"filename": filename} if filename else {})

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def version(binary: str) -> str:
    """What `llama-server --version` says of itself (its build and commit), or why nothing."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {type(exc).__name__}: {exc}"
    lines = (done.stdout + done.stderr).strip().splitlines()
    return (
        "; ".join(line.strip() for line in lines[:2]) or f"unavailable: --version printed nothing ({done.returncode})"
    )
