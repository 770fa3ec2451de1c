"""The real pair: two `vllm serve` processes with NixlConnector on one host, and the cache-off reference, over HTTP.

As vLLM's own tests/v1/kv_connector/nixl_integration/ (run_accuracy_test.sh, toy_proxy_server.py) run a pair, with
the roles vLLM 0.26 and 0.28 expect (kv_role kv_producer for the prefill instance, kv_consumer for the decode one;
kv_both is deprecated for NIXL in 0.28): both on the one GPU this process sees at a small memory share each
(--gpu-memory-utilization 0.2), VLLM_KV_CACHE_LAYOUT=HND, UCX_NET_DEVICES=all, --enforce-eager, every HTTP port and
VLLM_NIXL_SIDE_CHANNEL_PORT found free on loopback. A request goes to the producer with kv_transfer_params
{"do_remote_decode": true} and max_tokens 1; the kv_transfer_params it returns go to the consumer with the same
token-ID prompt on /v1/completions, greedy, ignore_eos, return_token_ids. The consumer runs with its prefix cache
on (the partial-hit case needs it; /reset_prefix_cache, VLLM_SERVER_DEV_MODE=1, empties it before each case), the
producer and the reference with it off.

What the consumer loaded is read from its Prometheus counters around each request, one request at a time (vLLM
0.28's scheduler records the connector's num_external_tokens as vllm:external_prefix_cache_hits and its own hit as
vllm:prefix_cache_hits; NixlConnector's stats give vllm:nixl_xfer_time_seconds, one observation per completed
transfer, and vllm:nixl_num_failed_transfers), and the served usage.prompt_tokens_details.cached_tokens (local plus
external, --enable-prompt-tokens-details). Standard library only (http.client, subprocess): this module never
imports vLLM; it cannot run without a CUDA GPU and NIXL (repro.disagg.commands refuses that in one line).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from repro.disagg import audit
from repro.disagg.pair import Answer
from repro.judge.pd_verdict import Transfer

MODEL_NAME = "kvkit"
PRODUCER_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                   "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip
# Prometheus names (counters end in _total; a histogram's observations in _count)
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
LOCAL_HITS = "vllm:prefix_cache_hits_total"
XFER_COUNT = "vllm:nixl_xfer_time_seconds_count"
XFER_FAILED = "vllm:nixl_num_failed_transfers_total"
WATCHED = (EXTERNAL_HITS, LOCAL_HITS, XFER_COUNT, XFER_FAILED)


class PairError(RuntimeError):
    """A server that did not start or stopped answering: the run is an ERROR with its log's tail."""


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct TCP ports free on loopback now (bound together, so the OS gives n different ones)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass(frozen=True)
class ServeSettings:
    python: str
    model: str
    block_size: int
    max_model_len: int
    gpu_memory_utilization: float = 0.2
    dtype: str = "float16"
    seed: int = 0
    start_timeout_s: float = 600.0
    request_timeout_s: float = 300.0
    kv_audit_dir: str | None = None  # the KV audit's records (repro.disagg.audit): the reference's and the consumer's


def audited(s: ServeSettings, role: str | None) -> bool:
    """Whether this server runs under the KV audit: the reference (role None) and the consumer, with --kv-audit."""
    return s.kv_audit_dir is not None and role in (None, "kv_consumer")


def kv_transfer_config(role: str) -> dict:
    return {"kv_connector": "NixlConnector", "kv_role": role}


def serve_argv(s: ServeSettings, port: int, role: str | None, prefix_cache: bool) -> list[str]:
    """`vllm serve` for one instance (vllm.entrypoints.cli.main, the `vllm` script's module in 0.26 and 0.28, run by
    the engine interpreter itself); role None: no connector."""
    argv = [s.python, "-m", "vllm.entrypoints.cli.main", "serve", s.model,
            "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
            "--gpu-memory-utilization", str(s.gpu_memory_utilization), "--block-size", str(s.block_size),
            "--max-model-len", str(s.max_model_len), "--dtype", s.dtype, "--seed", str(s.seed),
            "--enable-prompt-tokens-details", "--max-num-seqs", "1"]  # fmt: skip
    argv.append("--enable-prefix-caching" if prefix_cache else "--no-enable-prefix-caching")
    if audited(s, role):
        argv += ["--kv-transfer-config", json.dumps(audit.audited_transfer_config(role), sort_keys=True)]
    elif role is not None:
        argv += ["--kv-transfer-config", json.dumps(kv_transfer_config(role), sort_keys=True)]
    return argv


def serve_env(base: dict[str, str], side_channel_port: int | None) -> dict[str, str]:
    env = dict(base) | {"VLLM_SERVER_DEV_MODE": "1", "PYTHONUNBUFFERED": "1"}
    if side_channel_port is not None:
        env |= {"VLLM_KV_CACHE_LAYOUT": "HND", "UCX_NET_DEVICES": "all",
                "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_channel_port)}  # fmt: skip
    return env


def completion_body(prompt: tuple[int, ...], max_tokens: int, params: dict | None, logprobs: bool = False) -> dict:
    """A greedy /v1/completions body; logprobs: the top 2 at each position, keyed by token ID (the reference's, for
    the top-1/top-2 gap at a divergence)."""
    body = {"model": MODEL_NAME, "prompt": list(prompt), "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True, "stream": False}  # fmt: skip
    if logprobs:
        body |= {"logprobs": 2, "return_tokens_as_token_ids": True}
    return body | ({"kv_transfer_params": params} if params is not None else {})


def top_gaps_of(response: dict) -> tuple[float | None, ...] | None:
    """Each generated position's top-1 minus top-2 logprob (nats) from a completion's top_logprobs; None at a
    position with fewer than two, and None for a response without logprobs."""
    choices = response.get("choices") or [{}]
    top = (choices[0].get("logprobs") or {}).get("top_logprobs")
    if not isinstance(top, list):
        return None
    gaps: list[float | None] = []
    for entry in top:
        values = sorted((v for v in (entry or {}).values() if isinstance(v, (int, float))), reverse=True)
        gaps.append(values[0] - values[1] if len(values) >= 2 else None)
    return tuple(gaps)


def parse_metrics(text: str, names: tuple[str, ...] = WATCHED) -> dict[str, float]:
    """Prometheus text: each watched name's value summed over its label sets (one engine: one set)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0].strip()
        if name in names:
            with contextlib.suppress(ValueError):
                out[name] = out.get(name, 0.0) + float(value)
    return out


def transfer_of(before: dict[str, float], after: dict[str, float], cached_tokens: int | None) -> Transfer:
    """The consumer's counters for one request from its metrics around it; a metric it does not export is None."""

    def delta(name: str) -> int | None:
        if name not in after:
            return None
        return round(after[name] - before.get(name, 0.0))

    return Transfer(delta(EXTERNAL_HITS), delta(LOCAL_HITS), cached_tokens, delta(XFER_COUNT), delta(XFER_FAILED))


def answer_of(response: dict) -> tuple[tuple[int, ...] | None, int | None]:
    """A completion's greedy token IDs and its served cached_tokens (None where absent)."""
    choices = response.get("choices") or [{}]
    ids = choices[0].get("token_ids")
    details = (response.get("usage") or {}).get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    return (tuple(ids) if isinstance(ids, list) else None), (cached if isinstance(cached, int) else None)


def reset_succeeded(text: str) -> bool:
    """/reset_prefix_cache's answer: 0.28 says {"success": bool}; an empty or other body with HTTP 200 (older
    releases) is taken as done."""
    try:
        body = json.loads(text)
    except ValueError:
        return True
    return not (isinstance(body, dict) and body.get("success") is False)


class Server:
    """One `vllm serve` child in its own process group, its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int, log: Path, timeout_s: float):
        self.name, self.argv, self.env, self.port, self.log, self.timeout_s = name, argv, env, port, log, timeout_s
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=fh, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip

    def wait_ready(self, deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.proc is not None and self.proc.poll() is not None:
                raise PairError(f"{self.name} exited {self.proc.returncode} while starting: {self.tail()}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if self.request("GET", "/health", None, 5)[0] == 200:
                    return
            time.sleep(1)
        raise PairError(f"{self.name} not ready after {deadline_s:.0f} s: {self.tail()}")

    def request(self, method: str, path: str, body: dict | None, timeout: float | None = None) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout or self.timeout_s)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read().decode("utf-8", "replace")
        finally:
            conn.close()

    def metrics(self) -> dict[str, float]:
        status, text = self.request("GET", "/metrics", None)
        if status != 200:
            raise PairError(f"{self.name}: /metrics answered HTTP {status}")
        return parse_metrics(text)

    def tail(self, n: int = 1200) -> str:
        with contextlib.suppress(OSError):
            return " | ".join(self.log.read_text(errors="replace")[-n:].splitlines()[-8:])
        return "(no log)"

    def stop(self) -> None:
        """SIGTERM to the child's own process group (it and its engine core), SIGKILL after 30 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


class NixlPair:
    """The PairDriver of a real pair on this host: the cache-off reference first (alone on the GPU), then the
    producer and the consumer (both on the GPU at once). Every child is stopped by close()."""

    def __init__(self, settings: ServeSettings, workdir: Path, env: dict[str, str]):
        self.s, self.workdir, self.env = settings, workdir, env
        self.reference: Server | None = None
        self.producer: Server | None = None
        self.consumer: Server | None = None
        self.ports: dict[str, int] = {}

    def _server(self, name: str, role: str | None, prefix_cache: bool, port: int, side: int | None) -> Server:
        argv = serve_argv(self.s, port, role, prefix_cache)
        env = serve_env(self.env, side)
        if audited(self.s, role):
            folder = Path(self.s.kv_audit_dir) / name
            folder.mkdir(parents=True, exist_ok=True)
            env = audit.audit_env(env, folder, role)
        return Server(name, argv, env, port, self.workdir / f"{name}.log", self.s.request_timeout_s)

    def _start_reference(self) -> Server:
        if self.reference is None:
            (port,) = free_ports(1)
            self.ports["reference_http"] = port
            self.reference = self._server("reference", None, False, port, None)
            self.reference.start()
            self.reference.wait_ready(self.s.start_timeout_s)
        return self.reference

    def _start_pair(self) -> tuple[Server, Server]:
        if self.producer is None or self.consumer is None:
            if self.reference is not None:  # the reference had the GPU alone; the pair shares it
                self.reference.stop()
            p_http, c_http, p_side, c_side = free_ports(4)
            self.ports |= {"producer_http": p_http, "consumer_http": c_http,
                           "producer_side_channel": p_side, "consumer_side_channel": c_side}  # fmt: skip
            self.producer = self._server("producer", "kv_producer", False, p_http, p_side)
            self.consumer = self._server("consumer", "kv_consumer", True, c_http, c_side)
            self.producer.start()
            self.consumer.start()
            self.producer.wait_ready(self.s.start_timeout_s)
            self.consumer.wait_ready(self.s.start_timeout_s)
        return self.producer, self.consumer

    def _complete(self, server: Server, prompt: tuple[int, ...], max_tokens: int, params: dict | None):
        status, text = server.request("POST", "/v1/completions", completion_body(prompt, max_tokens, params))
        if status != 200:
            return None, f"{server.name} answered HTTP {status}: {text[:300]}"
        return json.loads(text), None

    def baseline(self, request_id: str, prompt: tuple[int, ...], max_tokens: int) -> Answer:
        reference = self._start_reference()
        before = self._audit_files("reference")
        status, text = reference.request("POST", "/v1/completions", completion_body(prompt, max_tokens, None, True))
        if status != 200:
            return Answer(None, error=f"reference answered HTTP {status}: {text[:300]}")
        response = json.loads(text)
        ids, cached = answer_of(response)
        error = None if ids is not None else "no token_ids in the response"
        blocks, _ = self._audited("reference", prompt, "computed", before)
        return Answer(ids, cached_tokens=cached, error=error, top_gaps=top_gaps_of(response), kv_blocks=blocks)

    def _audit_files(self, name: str) -> dict[str, tuple[int, int]]:
        """The audit's records in `name`'s folder before a request is sent ({} without the audit): the lower bound
        that makes the record read after it the request's own (repro.disagg.audit.new_record)."""
        if self.s.kv_audit_dir is None:
            return {}
        return audit.record_files(Path(self.s.kv_audit_dir) / name)

    def _audited(
        self, name: str, prompt: tuple[int, ...], kind: str, before: dict[str, tuple[int, int]]
    ) -> tuple[tuple[str | None, ...] | None, int]:
        """With the KV audit: the digests of the blocks `name` recorded for this prompt's request, the record
        written since `before` (_audit_files taken before it was sent; the consumer's reused blocks from the first
        one it received on) and that first block's slot; None without the audit or a record of its own, () where it
        recorded no block (repro.judge.pd_kvaudit says so)."""
        if self.s.kv_audit_dir is None:
            return None, 0
        folder = Path(self.s.kv_audit_dir) / name
        record = audit.new_record(folder, audit.prompt_sha256(prompt), before)
        if record is None:
            return None, 0
        blocks = audit.block_digests(folder, record, kind)
        if blocks is None or kind == "computed":
            return blocks, 0
        first = int(record.get("local_tokens") or 0) // self.s.block_size
        return blocks[first:], first

    def reset(self) -> None:
        """Empty the consumer's prefix cache (the producer and the reference run without one). vLLM refuses while
        blocks are held ({"success": false}); the consumer frees a request's blocks as it finishes, so a few tries."""
        _, consumer = self._start_pair()
        for _ in range(20):
            status, text = consumer.request("POST", "/reset_prefix_cache", None)
            if status != 200:
                raise PairError(f"consumer: /reset_prefix_cache answered HTTP {status}: {text[:200]}")
            if reset_succeeded(text):
                return
            time.sleep(0.5)
        raise PairError("consumer: /reset_prefix_cache kept answering success false (blocks still held)")

    def prefill(self, request_id: str, prompt: tuple[int, ...]) -> dict:
        producer, _ = self._start_pair()
        response, error = self._complete(producer, prompt, 1, dict(PRODUCER_PARAMS))
        if error is not None:
            raise PairError(error)
        params = response.get("kv_transfer_params")
        if not isinstance(params, dict):
            raise PairError(f"the producer returned no kv_transfer_params for {request_id} (is it a kv_producer?)")
        return params

    def decode(self, request_id: str, prompt: tuple[int, ...], params: dict | None, max_tokens: int) -> Answer:
        _, consumer = self._start_pair()
        before, files = consumer.metrics(), self._audit_files("consumer")
        response, error = self._complete(consumer, prompt, max_tokens, params)
        after = _settled_metrics(consumer)
        if error is not None:
            return Answer(None, transfer_of(before, after, None), error)
        ids, cached = answer_of(response)
        blocks, first = self._audited("consumer", prompt, "reused", files)
        return Answer(ids, transfer_of(before, after, cached), None if ids is not None else "no token_ids",
                      kv_blocks=blocks, kv_first_slot=first)  # fmt: skip

    def facts(self) -> dict:
        return {
            "ports": dict(self.ports),
            "argv": {s.name: s.argv for s in (self.reference, self.producer, self.consumer) if s is not None},
            "logs": {s.name: str(s.log) for s in (self.reference, self.producer, self.consumer) if s is not None},
        }

    def close(self) -> None:
        for server in (self.consumer, self.producer, self.reference):
            if server is not None:
                server.stop()


def _settled_metrics(server: Server, tries: int = 10) -> dict[str, float]:
    """The metrics after a request, read until two readings 0.2 s apart agree: the engine records its stats as it
    emits outputs, the transfer's a step later."""
    last = server.metrics()
    for _ in range(tries):
        time.sleep(0.2)
        now = server.metrics()
        if now == last:
            return now
        last = now
    return last
