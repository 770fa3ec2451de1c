"""A stand-in engine child for the failure-handling tests only; it never proves verification works.

Run as `python -m tests.fake_engine JOB.json` (through run_arm(module=...) or the CLI's hidden
--engine-module). It follows the real child's file contract, and the environment variable
KVKIT_FAKE (JSON) tells it how to behave per arm:
  {"modes": {"ARM or *": MODE}, "pid_dir": DIR, "echo_env": [NAMES], "config": {"ARM": {...}},
   "sleep_s": S, "result_schema_version": N}
MODE is one of ok, sigkill, segfault, hang, hang-ignore-term, oom, exit7, missing, garbage,
wrong-kind, raise, raise-no-record, slow, spin (logs the same three lines, each with a time stamp and a
request id that change, until it is killed: an engine that stopped making progress), linger (writes its result, then waits sleep_s before it
exits: the chaos run damages the result file meanwhile), flood-kv and flood-log (a runaway writer:
flood_mb_s MB a second, default 20, for ever, into files of its KV audit directory, or to its log;
with pid_dir, the MB written so far in DIR/ARM.flooded, as the test's own count).
With pid_dir, the child first starts a grandchild that sleeps and writes its pid to
DIR/ARM.grandchild.pid (and its own to DIR/ARM.child.pid).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time

from repro.contract.result import ARM_RESULT_SCHEMA_VERSION
from repro.record.atomic import write_json_atomic


def _result(job: dict, config: dict) -> dict:
    mode = job["arm"]["mode"]
    probes = []
    for p in job["probes"]:
        ids = (
            p["prompt"]["token_ids"]
            if "token_ids" in p["prompt"]
            else list(range(1, p["prompt"]["chat"]["length"] + 1))
        )
        full = (len(ids) - 1) // job["engine"]["block_size"] * job["engine"]["block_size"]
        requests = [
            {
                "role": "cold" if i == 0 else "reuse",
                "cached_tokens": 0 if i == 0 or mode == "baseline" else full,
                "token_ids": [(sum(ids) + k) % 97 for k in range(job["max_tokens"])],
                "logprobs": [],
                "finish_reason": "length",
                "kv_transfer_params": None,
                "text": "",
            }
            for i in range(p["requests"])
        ]
        probes.append({"name": p["name"], "prompt_token_ids": ids, "messages": None, "requests": requests})
    e = job["engine"]
    effective = {
        "model": e["model"],
        "revision": e["revision"],
        "dtype": e["dtype"],
        "max_model_len": e["max_model_len"],
        "seed": e["seed"],
        "enforce_eager": True,
        "block_size": e["block_size"],
        "enable_prefix_caching": mode == "native",
    }
    effective.update(config.get("config", {}).get(job["arm"]["name"], {}))
    return {
        "kind": "kvkit-arm-result",
        "schema_version": config.get("result_schema_version", ARM_RESULT_SCHEMA_VERSION),
        "arm": job["arm"]["name"],
        "pid": os.getpid(),
        "versions": {"vllm": "fake", "torch": "fake", "lmcache": "fake"},
        "effective_config": effective,
        "probes": probes,
        "error": None,
        "engine_start_s": 0.0,
        "import_s": 0.0,
        "generation_s": 0.0,
    }


def _spawn_grandchild(pid_dir: str, arm: str, mode: str) -> None:
    # Same process group as this child, like vLLM's engine core and workers.
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if mode == "hang-ignore-term":  # before the pid files say this child is up (the grandchild keeps SIGTERM)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(os.path.join(pid_dir, f"{arm}.grandchild.pid"), "w") as fh:
        fh.write(str(sleeper.pid))
    with open(os.path.join(pid_dir, f"{arm}.child.pid"), "w") as fh:
        fh.write(str(os.getpid()))


def _flood(job: dict, mode: str, mb_s: float, count: str | None) -> None:
    """Write mb_s MB a second for ever, in 1 MB pieces: into the KV audit directory (a new file every
    16 MB, as a runaway audit would) or to stdout, which is the arm's log."""
    piece = b"x" * 999_999 + b"\n"
    kv = job.get("kv_audit_dir")
    if mode == "flood-kv":
        os.makedirs(kv, exist_ok=True)
    t0, written, fh = time.monotonic(), 0, None
    while True:
        if mode == "flood-kv":
            if written % 16 == 0:
                fh = open(os.path.join(kv, f"{written // 16:06d}.computed.000.pt"), "wb")  # noqa: SIM115
            fh.write(piece)
            fh.flush()
        else:
            sys.stdout.write(piece.decode())
            sys.stdout.flush()
        written += 1
        if count:  # whole or not at all: the kill lands between any two writes, and the test reads the last count
            with open(count + ".tmp", "w") as out:
                out.write(str(written))
            os.replace(count + ".tmp", count)
        time.sleep(max(0.0, t0 + written / mb_s - time.monotonic()))


def main(argv: list[str]) -> int:
    with open(argv[0], encoding="utf-8") as fh:
        job = json.load(fh)
    spec = json.loads(os.environ.get("KVKIT_FAKE", "{}"))
    arm = job["arm"]["name"]
    mode = spec.get("modes", {}).get(arm, spec.get("modes", {}).get("*", "ok"))
    print(f"fake-engine: arm={arm} mode={mode} pid={os.getpid()}", flush=True)
    for name in spec.get("echo_env", []):
        print(f"fake-engine: {name}={os.environ.get(name, '')}", flush=True)
    if spec.get("pid_dir"):
        _spawn_grandchild(spec["pid_dir"], arm, mode)
    out = job["output"]
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "segfault":
        ctypes.string_at(0)
    if mode == "hang-ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode in ("hang", "hang-ignore-term"):
        while True:
            time.sleep(1)
    if mode == "spin":
        for i in range(10**9):
            stamp = time.strftime("%Y-%m-%d %H:%M:%S") + f",{i % 1000:03d}"
            for total, hit in ((1504, 1280), (513, 256), (512, 512)):
                print(
                    f"[{stamp}] LMCache INFO: Reqid: {i}-{total:x}, Total tokens {total}, hit tokens: {hit}", flush=True
                )
            time.sleep(0.0002)
    if mode == "slow":
        time.sleep(float(spec.get("sleep_s", 30)))
    if mode in ("flood-kv", "flood-log"):
        count = os.path.join(spec["pid_dir"], f"{arm}.flooded") if spec.get("pid_dir") else None
        _flood(job, mode, float(spec.get("flood_mb_s", 20)), count)
    if mode == "oom":
        bytearray(1 << 50)  # a real MemoryError: nothing can allocate a petabyte
    if mode == "exit7":
        return 7
    if mode == "missing":
        return 0
    if mode == "garbage":
        with open(out, "w") as fh:
            fh.write('{"kind": "kvkit-arm-result", "probes": [')
        return 0
    if mode == "wrong-kind":
        write_json_atomic(out, {"kind": "something-else"})
        return 0
    if mode == "raise":
        write_json_atomic(
            out,
            {
                "kind": "kvkit-arm-result",
                "schema_version": ARM_RESULT_SCHEMA_VERSION,
                "arm": arm,
                "probes": [],
                "error": {"type": "ValueError", "message": "fake engine raised"},
            },
        )
        return 3
    if mode == "raise-no-record":
        return 3
    if job.get("probes_file"):  # native-matched: its probes come once its connector arm is done, as in the real child
        while not os.path.exists(job["probes_file"]):
            time.sleep(0.05)
        with open(job["probes_file"], encoding="utf-8") as fh:
            given = json.load(fh)
        if "probes" not in given:
            return 3
        job["probes"] = given["probes"]
    write_json_atomic(out, _result(job, spec))
    if mode == "linger":
        time.sleep(float(spec.get("sleep_s", 30)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
