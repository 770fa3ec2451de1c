"""End to end on the real vLLM CPU engine: kill -9 of the kit mid-run takes every arm's engine
child, vLLM's engine core (in vLLM's own engine layout, where it is a grandchild) and the lifeline
watchers with it (repro.run.lifeline)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, have_vllm

from repro.plan.options import selftest_cpu_argv
from repro.run import lifeline

# one_core: the engines start, then the kit is killed and the test waits for them to go
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.one_core,
    pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed"),
]


def _children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if entry.isdigit() and int(stat[stat.rfind(")") + 2 :].split()[1]) == pid:
            out.append(int(entry))
    return out


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def test_kill_9_of_the_kit_stops_the_engines_it_started(tiny_model, tmp_path):
    report = tmp_path / "r.json"
    kit = subprocess.Popen(
        # vLLM's own engine layout: the engine core and its worker are the kit's grandchildren, which must go too
        [sys.executable, "-m", "repro.verify_kv_reuse", *selftest_cpu_argv(tiny_model, str(report))]
        + ["--jobs", "2", "--engine-layout", "vllm"],
        cwd=ROOT,
        # the kit's own launchers (no session pool: a pooled launcher outlives any one kit by design)
        env=dict(os.environ, PYTHONPATH=str(ROOT), KVKIT_WARM_POOL=""),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    groups: list[int] = []
    try:
        deadline = time.monotonic() + 300
        engine_core = None
        while engine_core is None:  # an arm whose child has started vLLM's engine core process
            assert kit.poll() is None and time.monotonic() < deadline, "no engine core appeared"
            # the arm children, and under KVKIT_WARM_IMPORT=1 the launchers' forked ones (the launcher's children)
            kids = _children_of(kit.pid)
            kids += [g for k in kids for g in _children_of(k)]
            groups = sorted(set(groups) | {c for c in kids if _leads_group(c)})
            engine_core = next(
                (p for g in groups for p in lifeline.group_members(g) if "EngineCor" in _comm(p) + _cmdline(p)), None
            )
            time.sleep(0.2)
        kit.kill()
        kit.wait()
        t0 = time.monotonic()
        while any(lifeline.group_members(g) for g in groups):
            assert time.monotonic() - t0 < lifeline.GRACE_S + 30, {g: lifeline.group_members(g) for g in groups}
            time.sleep(0.1)
    except BaseException:
        kit.kill()
        for g in groups:
            if lifeline.group_members(g):
                os.killpg(g, signal.SIGKILL)
        raise
    assert not report.exists()
