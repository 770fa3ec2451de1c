"""The served stack end to end on the real vLLM CPU engine: `--frontend server` (each arm a `vllm serve` process the
kit starts, over HTTP) against the offline front end on the CPU self-test, request by request; a server killed
mid-run; and `repro endpoint` against two `vllm serve` servers this test starts itself (in the CPU's one-process
layout: the engine core with its worker inside): every probe of the suite, then the same servers again (a cold hit
left by the first run, and the line saying how to clear it), then again with --reset-prefix-cache.

The offline side is the session's shared self-test (tests/e2e_runs.py: --jobs 2, ATen's portable kernels), which
the served run mirrors, two arms at a time with the same kernels. The served run takes the served default, vLLM's own
engine layout (the engine core and its worker in processes of their own, the engine spawned), the offline run the
CPU's one-process one (its arm children forked by the warm launcher), so the comparison below holds the front end,
the engine layout and the way the engine started to the same bits together (tests/test_e2e_cpu.py holds the offline
run equal to the same self-test one arm after another, every child spawned)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, have_vllm
from e2e_runs import SELFTEST_KERNELS
from test_e2e_cpu import _comparable

from repro.engine.engine_args import kv_bytes_per_token
from repro.plan.options import CPU_ENGINE_FLAGS, CPU_KV_CACHE_TOKENS, SELFTEST_CPU_FIXTURE
from repro.plan.settings import engine_layout_env
from repro.record.provenance import KERNEL_VARIANTS
from repro.run import runner

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")]

SAME = ("role", "token_ids", "logprobs", "cached_tokens", "kv_transfer_params", "finish_reason")


def _requests(report: dict) -> dict:
    return {
        (a["name"], p["name"], i): r for a in report["arms"] for p in a["probes"] for i, r in enumerate(p["requests"])
    }


@pytest.fixture(scope="module")
def both(served_selftest_run, selftest_run):
    for run in (served_selftest_run, selftest_run):
        assert run.data is not None, run.proc.stdout[-2000:] + run.proc.stderr[-3000:]
    return served_selftest_run, selftest_run


def test_served_self_test_matches_the_offline_one_request_by_request(both):
    served, offline = both
    assert served.proc.returncode == 0, served.proc.stdout[-3000:] + served.proc.stderr[-3000:]
    assert served.data["acceptance"]["matched"] is True
    verdicts = {r.data["config"]["frontend"]: [(a["name"], a["verdict"]) for a in r.data["arms"]] for r in both}
    assert verdicts["server"] == verdicts["sync"], verdicts
    s, o = _requests(served.data), _requests(offline.data)
    assert sorted(s) == sorted(o) and len(s) > 20
    for key, request in o.items():
        assert {k: s[key][k] for k in SAME} == {k: request[k] for k in SAME}, key
    kv = {
        r.data["config"]["frontend"]: {(a["name"], p["name"]): (p.get("kv") or {}).get("verdict") for a in
                                       r.data["arms"] for p in a["probes"]} for r in both
    }  # fmt: skip
    assert kv["server"] == kv["sync"]  # the KV audit wraps the connector inside the server too
    # and the whole comparable record (tests/test_e2e_cpu.py's: every arm's verdict and reasons, every request's
    # fields, the KV audit's figures, acceptance): vLLM's own engine layout (the server forked from its arm child, its
    # engine core and worker spawned by vLLM) against the CPU's one-process layout, forked, change nothing either
    assert _comparable(served.data) == _comparable(offline.data)


def test_the_planted_fault_fails_served_and_the_report_says_how_it_was_served(both):
    served, _ = both
    arms = {a["name"]: a for a in served.data["arms"]}
    assert arms["PlantedFault"]["verdict"] == "FAIL" and arms["native"]["verdict"] == "PASS"
    assert served.data["config"]["frontend"] == "server" and served.data["config"]["engine_layout"] == "vllm"
    for arm in arms.values():
        facts = arm["effective_config"]["served"]
        assert arm["effective_config"]["frontend"] == "server" and arm["effective_config"]["engine_layout"] == "vllm"
        assert facts["url"].startswith("http://127.0.0.1:") and facts["version"]["version"] == "0.28.0"
        assert "--enable-prompt-tokens-details" not in facts["argv"]  # the engine's own flags, as checked
    resets = arms["native"]["effective_config"]["served"]["prefix_cache_resets"]
    assert resets and all(r["over"] == "http" and r["answer"] == {"success": True} for r in resets)
    ports = {a["effective_config"]["served"]["url"] for a in arms.values()}
    assert len(ports) == len(arms)  # each arm its own server, on a port found free


# ---- a server killed mid-run ---------------------------------------------------------------------------------------


def _children_of(pid: int) -> list[int]:
    """Every live descendant of pid (from /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        found += kids
        todo += kids
    return found


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _healthy(port: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def test_a_server_killed_mid_run_is_an_error_citing_its_log_and_nothing_is_left(tmp_path, tiny_model):
    """Two served arms at once (--jobs 2); the first server that answers /health is killed with SIGKILL. The arm
    children are spawned (KVKIT_WARM_IMPORT=0), so their servers are started as a user's run starts them (every
    other served run of the suite forks them: repro.engine.served.ForkedServer, tests/test_forked.py)."""
    report = tmp_path / "killed.json"
    argv = ["--model", tiny_model, *CPU_ENGINE_FLAGS, "--kv-connector", "ExampleConnector", "--fixture",
            SELFTEST_CPU_FIXTURE, "--reuses", "1", "--no-kv-audit", "--jobs", "2", "--quiet", "--frontend", "server",
            "--no-confirm", "--report", str(report)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env["KVKIT_WARM_IMPORT"] = "0"
    proc = subprocess.Popen([sys.executable, "-m", "repro.verify_kv_reuse", *argv], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    killed, groups, deadline = None, set(), time.monotonic() + 600
    while killed is None and time.monotonic() < deadline and proc.poll() is None:
        for pid in _children_of(proc.pid):
            line = _cmdline(pid).split()
            if "vllm.entrypoints.openai.api_server" not in line:
                continue
            groups.add(_pgid(pid))  # every server's group: the arm's, which the kit stops with the arm
            if _healthy(line[line.index("--port") + 1]):
                os.kill(pid, signal.SIGKILL)
                killed = pid
                break
        time.sleep(0.5)
    out, err = proc.communicate(timeout=900)
    assert killed is not None, err[-3000:]
    assert proc.returncode == 3, out[-2000:] + err[-2000:]
    data = json.loads(report.read_text())
    hit = [a for a in data["arms"] if f"pid {killed}" in json.dumps(a.get("error"))]
    assert len(hit) == 1 and hit[0]["verdict"] == "ERROR", [(a["name"], a["verdict"]) for a in data["arms"]]
    said = json.dumps(hit[0]["error"])
    assert "vllm serve" in said and "exited with code -9" in said, said
    assert (report.parent / "killed.logs" / f"{hit[0]['name']}.log").is_file()
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _pgid(int(p.name)) in groups - {None}]
    left = [p for p in left if _state(p) not in ("Z", "X", None)]  # a zombie is dead: only init can reap it here
    assert left == [], [_cmdline(int(p.name)) for p in left]  # no server, engine core or worker of either arm


def _state(proc: Path) -> str | None:
    try:
        return (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


# ---- repro endpoint against two servers this test starts ----------------------------------------------------------


def _start_server(model: str, caching: bool, log: Path) -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port),
            "--model", model, "--dtype", "float32", "--gpu-memory-utilization", "0.1", "--max-model-len", "2048", "--block-size", "16", "--seed", "0",
            "--kv-cache-memory-bytes", str(CPU_KV_CACHE_TOKENS * kv_bytes_per_token(model, None, "float32")),  # the self-test's pool
            "--enforce-eager", "--max-num-seqs", "1", "--enable-prompt-tokens-details",
            "--enable-prefix-caching" if caching else "--no-enable-prefix-caching"]  # fmt: skip
    # the kernel variant as the kit runs it (runner.kernel_cache_env): with the variable alone, both servers loaded a
    # graph another run cached for the machine's own vector ISA and failed to build it at their first request (g++:
    # 'at::vec' has not been declared), in both end-to-end sessions run here on 2026-12-04
    env = dict(os.environ, **KERNEL_VARIANTS[SELFTEST_KERNELS])
    env.update(runner.kernel_cache_env(env))
    env.update(engine_layout_env("one-process"))  # the engine core with its worker inside: one interpreter less
    if caching:  # vLLM serves POST /reset_prefix_cache only so: --reset-prefix-cache's route
        env["VLLM_SERVER_DEV_MODE"] = "1"
    server = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, env=env)
    return server, f"http://127.0.0.1:{port}"


def _endpoint_run(servers: list, model: str, report: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    """`repro endpoint` against the two servers (the judged one first); its process and its report's arms by name."""
    argv = ["--url", servers[0][1], "--baseline-url", servers[1][1], "--model", model, "--fixture",
            SELFTEST_CPU_FIXTURE, "--report", str(report), "--quiet", *extra]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "repro", "endpoint", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, check=False)  # fmt: skip
    arms = {a["name"]: a for a in json.loads(report.read_text())["arms"]} if report.exists() else {}
    return proc, arms


def test_endpoint_judges_a_server_the_kit_did_not_start(tmp_path, tiny_model):
    model = tiny_model
    servers = [_start_server(model, caching, tmp_path / f"{name}.log") for name, caching in
               (("reuse", True), ("baseline", False))]  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not all(_healthy(url.rsplit(":", 1)[1]) for _, url in servers):
            assert time.monotonic() < deadline and all(s.poll() is None for s, _ in servers)
            time.sleep(1)
        report = tmp_path / "endpoint.json"
        proc, arms = _endpoint_run(servers, model, report, "--reuses", "2")  # the suite: every probe
        # the same servers again, the fixture's probe alone: its prompt is still in the judged server's prefix cache
        again, again_arms = _endpoint_run(servers, model, tmp_path / "again.json", "--no-suite", "--reuses", "1")
        reset, reset_arms = _endpoint_run(servers, model, tmp_path / "reset.json", "--no-suite", "--reuses", "1",
                                          "--reset-prefix-cache")  # fmt: skip
    finally:
        for server, _ in servers:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(report.read_text())
    assert sorted(arms) == ["baseline", "endpoint"] and data["config"]["frontend"] == "endpoint"
    assert data["config"]["suite"] is None and data["acceptance"]["matched"] is None  # judged: every verdict PASS
    assert arms["endpoint"]["verdict"] == "PASS", arms["endpoint"]["reasons"]
    for arm in arms.values():  # every probe of the suite sent to both servers
        assert [p["name"] for p in arm["probes"]] == ["fixture", "chat-511", "chat-512", "chat-513"]
    reuses = [r for p in arms["endpoint"]["probes"] for r in p["requests"][1:]]
    assert reuses and all(r["cached_tokens"] > 0 for r in reuses)
    colds = [p["requests"][0]["cached_tokens"] for a in arms.values() for p in a["probes"]]
    assert colds and set(colds) == {0}
    for name, arm in arms.items():
        facts = arm["effective_config"]["served"]
        assert facts["url"] == servers[name == "baseline"][1]
        assert facts["version"]["version"] == "0.28.0" and facts["models"]["data"][0]["root"] == model
        assert all(r["over"] == "none" for r in facts["prefix_cache_resets"])  # the kit reset nothing there
    assert "KV audit: off" in proc.stdout and "endpoint (a server the kit did not start): PASS" in proc.stdout

    # again: the cold request hits what the first run left; INCONCLUSIVE, and one line says how to clear it
    assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-3000:]
    (probe,) = again_arms["endpoint"]["probes"]
    assert again_arms["endpoint"]["verdict"] == "INCONCLUSIVE" and probe["requests"][0]["cached_tokens"] > 0
    cached = probe["requests"][0]["cached_tokens"]
    assert probe["reasons"] == [f"cold request reported {cached} cached tokens: not a verified miss"]
    hint = again.stderr.strip().splitlines()[-1]
    assert hint == (f"endpoint: 1 cold request (fixture) hit {servers[0][1]}'s prefix cache, left there by an earlier "
                    "run: restart that server, or run again with --reset-prefix-cache (the server started with "
                    "VLLM_SERVER_DEV_MODE=1)")  # fmt: skip
    assert all(r["over"] == "none" for r in again_arms["endpoint"]["effective_config"]["served"]["prefix_cache_resets"])

    # --reset-prefix-cache: the judged server's cache reset over HTTP before the cold request, which is a miss again
    assert reset.returncode == 0, reset.stdout[-3000:] + reset.stderr[-3000:]
    assert reset_arms["endpoint"]["verdict"] == "PASS", reset_arms["endpoint"]["reasons"]
    assert [p["requests"][0]["cached_tokens"] for a in reset_arms.values() for p in a["probes"]] == [0, 0]
    resets = reset_arms["endpoint"]["effective_config"]["served"]["prefix_cache_resets"]
    assert resets == [{"over": "http", "answer": {"success": True}}]
    assert all(r["over"] == "none" for r in reset_arms["baseline"]["effective_config"]["served"]["prefix_cache_resets"])
    assert "endpoint: " not in reset.stderr  # no cold hit: no line
