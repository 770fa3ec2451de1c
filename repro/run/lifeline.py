"""The lifeline: every child the kit starts, with its whole process group, dies when the kit does.

The kit starts each child (an engine arm, the KV comparison, a calibration run) as the leader of a
new session, so that a terminal's Ctrl-C reaches the kit alone, which then stops the group
(repro.run.runner.kill_group). If the kit itself is killed with SIGKILL nothing runs in it, so the
group must stop itself. How:

- The kit makes a pipe for each child and keeps its write end; the child's group gets the read end
  only. The kernel closes the write end when the kit's process ends, however it ends (kill -9 too,
  whichever thread started the child), and the reader sees end-of-file. vLLM's own MultiprocExecutor
  ties its workers to their parent the same way (its death pipe).
- The child is started through this file: `python -I -S lifeline.py FD -- ARGV...` forks a small
  watcher, then execs ARGV in place (the same pid: the kit's exit status, signals and timeouts
  apply to the real child unchanged). The watcher is a member of the group; it blocks on the read
  end. At end-of-file it prints one line to the arm log, sends SIGTERM to the group, waits up to
  GRACE_S for the others to go (vLLM's engine core releases its shared memory on SIGTERM), then
  sends SIGKILL to the whole group, itself included.
- No cooperation from the child: the watcher is its own process with its own interpreter, so an
  engine stuck in C code, holding the GIL, or replacing its signal handlers is stopped all the
  same, and so are the grandchildren (vLLM's engine core and workers) wherever the child started
  them, because they are in the group. It covers every child the runner starts, not only those whose
  entry point remembers to install a guard.
- It never fires in normal operation: the kit closes its write end only after it reaped the group
  (the watcher with it); a group the kit could not reap is one it wanted dead anyway. The pipe is
  close-on-exec in the kit and subprocess closes every other descriptor in each child, so
  concurrent children never hold one another's write ends; only a process forked from the kit
  without exec could (the kit forks none).

Why not PR_SET_PDEATHSIG: it fires when the *thread* that forked the child ends, not the process
(a child started from a worker thread dies when that thread returns); it is cleared on fork, so
vLLM's grandchildren never carry it; it is lost if the kit dies before the child sets it; and it
signals the leader alone: SIGKILL would orphan the rest of the group, while a catchable signal
needs the child's main thread to run its handler (which vLLM may replace). The pipe has none of
these gaps, so it is the only mechanism.

Standard library only: this file is run as a script, outside the package.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

GRACE_S = 3.0  # the watcher's SIGTERM to SIGKILL
_POLL_S = 0.05
SCRIPT = str(Path(__file__).resolve())


def launch_command(argv: list[str], read_fd: int, python: str = sys.executable) -> list[str]:
    """ARGV started through the watcher; the caller passes read_fd to the child (pass_fds)."""
    return [python, "-I", "-S", SCRIPT, str(read_fd), "--", *argv]


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in a process group; a zombie already released its resources."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: ask the kernel whether anything (zombies included) is left
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except (ProcessLookupError, PermissionError):
            return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def watch(read_fd: int, pgid: int, grace_s: float = GRACE_S) -> None:
    """Block until every write end of the lifeline is closed, then stop the group (never returns)."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # no KeyboardInterrupt traceback from a stray SIGINT
        while os.read(read_fd, 64):
            pass  # nothing writes; end-of-file is the only message
        print(
            f"kvkit lifeline: the kit is gone; stopping process group {pgid} (SIGTERM, SIGKILL after {grace_s:g} s)",
            file=sys.stderr,
            flush=True,
        )
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the watcher outlives its own SIGTERM
        os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and set(group_members(pgid)) - {os.getpid()}:
            time.sleep(_POLL_S)
        os.killpg(pgid, signal.SIGKILL)
    finally:
        os._exit(0)


def launch(read_fd: int, argv: list[str]) -> None:
    """Fork the watcher of this process's group, then become ARGV (same pid); never returns."""
    watcher = None
    if os.getpgrp() == os.getpid():
        watcher = os.fork()
        if watcher == 0:
            watch(read_fd, os.getpgrp())
    else:  # never stop a group this process does not lead (the kit's own, for one)
        print("kvkit lifeline: not a process-group leader; running without a watcher", file=sys.stderr, flush=True)
    os.close(read_fd)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"kvkit lifeline: cannot run {argv[0]}: {exc}", file=sys.stderr, flush=True)
        if watcher:
            os.kill(watcher, signal.SIGKILL)
        os._exit(127)


def main(args: list[str]) -> None:
    if len(args) < 3 or args[1] != "--":
        print("usage: lifeline.py FD -- ARGV...", file=sys.stderr)
        sys.exit(2)
    launch(int(args[0]), args[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
