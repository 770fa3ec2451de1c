"""`repro endpoint` refuses a real vLLM CPU server whose tokenizer is not `--model`'s: one line, exit 2, no traceback.

The server serves the tiny model under its own name (so the name check passes) with another tokenizer
(`--tokenizer`: the tiny model's, two bytes' IDs swapped, as another model's vocabulary would number them): only the
token IDs its `POST /tokenize` gives tell them apart."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, have_vllm
from e2e_runs import SELFTEST_KERNELS

from repro.engine.engine_args import kv_bytes_per_token
from repro.plan.options import CPU_KV_CACHE_TOKENS
from repro.plan.settings import engine_layout_env
from repro.record.provenance import KERNEL_VARIANTS

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _other_tokenizer(model: str, where: Path) -> str:
    """The tiny model's tokenizer files with the IDs of 'e' and 't' swapped."""
    where.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(Path(model) / name, where / name)
    tok = json.loads((where / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["e"], vocab["t"] = vocab["t"], vocab["e"]
    (where / "tokenizer.json").write_text(json.dumps(tok))
    return str(where)


def test_endpoint_refuses_a_real_server_of_another_tokenizer(tmp_path, tiny_model):
    url = f"http://127.0.0.1:{_port()}"
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port",
            url.rsplit(":", 1)[1], "--model", tiny_model, "--tokenizer", _other_tokenizer(tiny_model, tmp_path / "tok"),
            "--dtype", "float32", "--gpu-memory-utilization", "0.1", "--max-model-len", "2048", "--block-size", "16", "--seed", "0", "--enforce-eager",
            "--kv-cache-memory-bytes", str(CPU_KV_CACHE_TOKENS * kv_bytes_per_token(tiny_model, None, "float32")),  # the self-test's pool
            "--max-num-seqs", "1"]  # fmt: skip
    log = tmp_path / "server.log"
    env = dict(os.environ, **KERNEL_VARIANTS[SELFTEST_KERNELS])
    env.update(engine_layout_env("one-process"))  # the engine core with its worker inside: one interpreter less
    server = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, env=env)
    report = tmp_path / "endpoint.json"
    try:
        deadline = time.monotonic() + 600
        while not _healthy(url):
            said = [line for line in log.read_text().splitlines() if "Error" in line]
            assert time.monotonic() < deadline and server.poll() is None, said[-10:]
            time.sleep(1)
        # the baseline is never reached: the server judged is refused first
        args = ["--url", url, "--baseline-url", f"http://127.0.0.1:{_port()}", "--model", tiny_model, "--fixture",
                "fixtures/selftest-cpu.json", "--report", str(report)]  # fmt: skip
        proc = subprocess.run([sys.executable, "-m", "repro", "endpoint", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=300, check=False)  # fmt: skip
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    assert "Traceback" not in proc.stderr and proc.stdout == "" and not report.exists(), proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: --url {url}: its tokenizer is not --model {tiny_model}'s: "), lines[0]
    assert "'The quick brown fox jump'... is 44 tokens there, 44 here, first different at token 2" in lines[0]
