"""Which processes a chaos run started and which outlived it: the /proc table, the run's tree, orphans.

The chaos command makes itself the child subreaper of everything it starts (prctl PR_SET_CHILD_SUBREAPER),
so a process whose parent dies is re-parented to it, not to init: every process a kit run leaves behind is
then a live descendant of the chaos command. A watcher thread also remembers every process of the run's tree
with its start time while the run lasts, which finds a leftover even where no subreaper can be set.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    state: str  # /proc/PID/stat's state letter; Z and X have finished
    start: int  # clock ticks since boot: with the pid, who this is (a pid can be reused)
    args: tuple[str, ...]

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.start)

    def text(self) -> str:
        return f"pid {self.pid} ({' '.join(self.args)[:120] or '?'})"


def become_subreaper() -> bool:
    """Orphans of this process's descendants re-parent to it (Linux); False where that cannot be set."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def read_args(pid: int) -> tuple[str, ...]:
    """A process's arguments now (they change when it execs: a lifeline becomes the engine child)."""
    cmdline = _read(f"/proc/{pid}/cmdline") or b""
    return tuple(a.decode("utf-8", "replace") for a in cmdline.split(b"\0") if a)


def is_running(p: Proc) -> bool:
    """Whether this very process (pid and start time) runs now, read afresh: a watch's table can be a tenth
    of a second old, and a process that has just exited (a zombie) still takes signals, to no effect."""
    raw = _read(f"/proc/{p.pid}/stat")
    if raw is None:
        return False
    stat = raw.decode("utf-8", "replace")
    fields = stat[stat.rfind(")") + 2 :].split()
    return len(fields) >= 20 and fields[0] not in ("Z", "X") and int(fields[19]) == p.start


def read_table(args_of: set[int] | None = None) -> dict[int, Proc]:
    """Every process /proc shows now; the arguments of those in args_of only (None: of all)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        raw = _read(f"/proc/{entry}/stat")
        if raw is None:
            continue
        stat = raw.decode("utf-8", "replace")
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) < 20:
            continue
        pid = int(entry)
        args = read_args(pid) if args_of is None or pid in args_of else ()
        table[pid] = Proc(pid, int(fields[1]), int(fields[2]), fields[0], int(fields[19]), args)
    return table


def with_args(table: dict[int, Proc], pids: set[int]) -> dict[int, Proc]:
    """The table, the arguments of these processes read now."""
    return {pid: replace(p, args=read_args(pid)) if pid in pids else p for pid, p in table.items()}


def descendants(table: dict[int, Proc], roots: set[int]) -> set[int]:
    """The roots' descendants in the table (the roots not included)."""
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p.pid)
    found: set[int] = set()
    todo = [c for r in roots for c in children.get(r, [])]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def outlived(seen: dict[tuple[int, int], Proc], table: dict[int, Proc], reaper: int | None) -> list[Proc]:
    """The processes still alive after a run: each one seen in its tree that is alive with the same start
    time, and (reaper: the subreaper's pid) every live descendant of the subreaper."""
    left = {}
    for pid, start in seen:
        now = table.get(pid)
        if now is not None and now.alive and now.start == start:
            left[pid] = now
    if reaper is not None:
        for pid in descendants(table, {reaper}):
            if table[pid].alive:
                left[pid] = table[pid]
    return sorted(left.values(), key=lambda p: p.pid)


class Watch:
    """Follows one run's process tree (its root: the kit) until stopped: remembers every member with its
    start time, answers which live members match a test (fault targets), and reaps the zombies of members
    that re-parented to this process (the subreaper), never a child that someone else waits for."""

    def __init__(self, root: int, interval_s: float = 0.1, spans: dict[str, Callable[[Proc], bool]] | None = None):
        self.root = root
        self.seen: dict[tuple[int, int], Proc] = {}
        # per name: the first and the last time (monotonic) a live member matched its test
        self.spans: dict[str, list[float]] = {}
        self._span_tests = spans or {}
        self._table: dict[int, Proc] = {}
        self._interval = interval_s
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kvkit-chaos-watch", daemon=True)

    def __enter__(self):
        self.poll()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        self.poll()

    def _loop(self) -> None:
        while not self._done.wait(self._interval):
            self.poll()

    def poll(self) -> dict[int, Proc]:
        table = read_table(set())
        tree = descendants(table, {self.root}) | ({self.root} if self.root in table else set())
        table = with_args(table, tree)
        now = time.monotonic()
        with self._lock:
            self._table = table
            for pid in tree:
                self.seen[table[pid].key] = table[pid]
            for name, test in self._span_tests.items():
                if any(table[pid].alive and test(table[pid]) for pid in tree):
                    self.spans.setdefault(name, [now, now])[1] = now
        self.reap(table)
        return table

    def reap(self, table: dict[int, Proc]) -> None:
        me = os.getpid()
        for p in table.values():
            if p.ppid == me and p.state == "Z" and p.pid != self.root and p.key in self.seen:
                try:
                    os.waitpid(p.pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def table(self) -> dict[int, Proc]:
        """The process table of the last poll."""
        with self._lock:
            return self._table

    def members(self, match: Callable[[Proc], bool]) -> list[Proc]:
        """The run's live processes that match, as of the last poll, by pid."""
        table = self.table()
        tree = descendants(table, {self.root})
        return sorted((table[p] for p in tree if table[p].alive and match(table[p])), key=lambda p: p.pid)


def settle(watch: Watch, reaper: int | None, within_s: float) -> tuple[list[Proc], float]:
    """Wait up to within_s for the run's processes to end (a lifeline's watcher takes its grace period);
    return what is still alive then, and how long it took."""
    t0 = time.monotonic()
    while True:
        left = outlived(watch.seen, watch.poll(), reaper)
        if not left or time.monotonic() - t0 >= within_s:
            named = {p.key: p for p in watch.seen.values()}  # what each was while the run lasted
            return [named.get(p.key) or replace(p, args=read_args(p.pid)) for p in left], time.monotonic() - t0
        time.sleep(0.1)


def kill_leftovers(procs: list[Proc]) -> None:
    """SIGKILL each leftover (by pid, only if it is still the same process), so the next fault starts clean."""
    table = read_table(set())
    for p in procs:
        now = table.get(p.pid)
        if now is not None and now.start == p.start:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
