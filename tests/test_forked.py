"""How a process forked from a warm launcher leaves (repro.engine.forked.exit_now) and a served arm's forked server
(repro.engine.served.ForkedServer), without vLLM: each case runs in a fresh interpreter, as a forked child would, so
that pytest's own threads do not stand in the way of a fork."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

EXIT = """
import atexit, sys, threading, time
from repro.engine.forked import exit_now
atexit.register(lambda: sys.stdout.write("atexit ran\\n"))  # not flushed: the exit must flush it
threading.Thread(target=lambda: (time.sleep(0.3), print("thread joined", flush=True))).start()
sys.stdout.write("buffered, not flushed\\n")
code = sys.argv[1]
exit_now(None if code == "none" else int(code) if code.lstrip("-").isdigit() else code)
print("never", flush=True)
"""


def _python(code: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd or ROOT, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


@pytest.mark.parametrize(("code", "status"), [("none", 0), ("7", 7), ("-1", 255), ("why not", 1)])
def test_exit_now_leaves_as_the_interpreter_would(code, status):
    proc = _python(EXIT, code)
    assert proc.returncode == status, proc.stderr
    # the non-daemon thread is joined before the atexit handlers, as Py_FinalizeEx does; what they wrote is flushed
    assert proc.stdout.splitlines() == ["buffered, not flushed", "thread joined", "atexit ran"], proc.stdout
    assert ("why not" in proc.stderr) == (code == "why not")
    spawned = subprocess.run([sys.executable, "-c", EXIT.replace("exit_now(", "sys.exit("), code], cwd=ROOT,
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert (spawned.returncode, spawned.stdout) == (proc.returncode, proc.stdout)  # what sys.exit gives


SERVER = """
import os, signal, sys, time
from repro.engine import forked
from repro.engine.served import ForkedServer
argv = [sys.executable, "-m", "fake_server", "--port", "1"]
print("not forked:", ForkedServer.start(argv, dict(os.environ)), flush=True)
forked.FORKED = True
env = {k: v for k, v in os.environ.items() if k != "DROPPED"}
env["KVKIT_ONLY_IN_SERVER"] = "1"
for how in ("exit", "kill"):
    server = ForkedServer.start(argv + [how], env)
    assert server is not None
    if how == "kill":
        time.sleep(1.0)
        title = open(f"/proc/{server.pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode().strip()
        print("title:", title, flush=True)
        print("running:", server.poll(), flush=True)
        os.kill(server.pid, signal.SIGKILL)
    print(how, server.wait(timeout=30), flush=True)
print("back in the arm, unchanged:", os.environ.get("KVKIT_ONLY_IN_SERVER"), os.environ.get("DROPPED"), flush=True)
"""

FAKE_SERVER = """
import os, sys, time
print("server", sys.argv[1:], os.environ.get("KVKIT_ONLY_IN_SERVER"), os.environ.get("DROPPED"), sys.stdin.read(),
      __name__, flush=True)
if sys.argv[-1] == "exit":
    sys.exit(5)
time.sleep(60)
"""


def test_a_forked_server_runs_its_module_with_its_environment_and_title_and_reports_its_end(tmp_path):
    (tmp_path / "fake_server.py").write_text(textwrap.dedent(FAKE_SERVER))
    code = f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(tmp_path)!r}]\n" + SERVER
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False, env={"PATH": "/usr/bin:/bin", "DROPPED": "x"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "not forked: None"  # a spawned child (FORKED unset) starts its server as before
    # the module ran as `python -m` runs it, with the environment asked for (one variable added, one removed),
    # stdin empty; the exit code and a SIGKILL come back as Popen gives them
    assert "server ['--port', '1', 'exit'] 1 None  __main__" in lines
    assert "exit 5" in lines
    assert f"title: {sys.executable} -m fake_server --port 1 kill" in lines
    assert "running: None" in lines and f"kill {-signal.SIGKILL}" in lines
    assert lines[-1] == "back in the arm, unchanged: None x"
