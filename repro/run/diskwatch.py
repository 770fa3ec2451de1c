"""A running child's disk use: what its own files take against a cap, the free space left where it writes
against a floor, and the figures that name a runaway (how much, which paths, how fast).

The parent polls it while it waits for the child (repro.run.runner.run_child): sizes come from os.scandir and
lstat, never a `du` subprocess, and count the blocks a file takes (st_blocks), which is what fills a disk.
"""

from __future__ import annotations

import collections
import heapq
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from repro.contract.failure import DISK_LOW, DISK_RUNAWAY
from repro.plan.settings import DEFAULT_MAX_CHILD_DISK_GB  # the cap on one child's files, and why
from repro.record.atomic import write_bytes_atomic

GB = 10**9
MIB = 1 << 20
# The free space a run leaves on each filesystem its children write to: no child starts below it and a
# running one is stopped. Once the children are stopped the kit still writes the report (a few MB), the
# KV comparison's output (KB) and a stopped child's cut log (2 MiB; the logs are moved by rename), under
# 100 MB; the rest is for the machine to keep answering (a shell, the journal, the package manager's
# temporary files). A child polled every POLL_S at the 450 MB/s measured writes 0.45 GB between two
# looks: 2 GB covers that four times over. On a small filesystem (a test's tmpfs, the chaos run's 16 MiB)
# the floor is 5% of it, what ext4 reserves for root by default (mke2fs -m 5).
FLOOR_BYTES = 2 * GB
FLOOR_FRACTION = 0.05
POLL_S = 1.0
RATE_WINDOW_S = 10.0  # "how fast": the growth over the last this many seconds, beside the average
LARGEST = 3  # files named in a runaway's detail


def floor_for(total_bytes: int, floor_bytes: int = FLOOR_BYTES) -> int:
    """The free space to keep on a filesystem of total_bytes: floor_bytes, or 5% of a small one."""
    return min(floor_bytes, int(total_bytes * FLOOR_FRACTION))


def size_text(n: float) -> str:
    """Bytes as a reader says them, in decimal units (the flag's GB): 12 KB, 450 MB, 10.7 GB."""
    for unit, scale in (("GB", GB), ("MB", 10**6), ("KB", 10**3)):
        if abs(n) >= scale:
            value = n / scale
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class DiskLimits:
    """How a child's disk use is bounded: the cap on its own files' growth, the floor, the poll interval."""

    cap_bytes: int = int(DEFAULT_MAX_CHILD_DISK_GB * GB)
    floor_bytes: int = FLOOR_BYTES
    poll_s: float = POLL_S

    @classmethod
    def from_gb(cls, gb: float | None) -> DiskLimits:
        return cls() if gb is None else cls(cap_bytes=int(gb * GB))


@dataclass(frozen=True)
class Usage:
    """What a path takes on disk: bytes (allocated blocks), files, and its largest files (bytes, path)."""

    bytes: int
    files: int
    largest: tuple[tuple[int, str], ...] = ()


def _taken(st: os.stat_result) -> int:
    return st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size


def measure(path: Path, largest: int = 0) -> Usage:
    """A file's or a directory tree's disk use (symlinks not followed; what vanishes meanwhile is skipped)."""
    try:
        st = os.lstat(path)
    except OSError:
        return Usage(0, 0)
    if not stat.S_ISDIR(st.st_mode):
        return Usage(_taken(st), 1, ((_taken(st), str(path)),) if largest else ())
    total, files, heap = 0, 0, []
    stack = [str(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                            continue
                        size = _taken(entry.stat(follow_symlinks=False))
                    except OSError:
                        continue
                    total += size
                    files += 1
                    if largest:
                        item = (size, entry.path)
                        if len(heap) < largest:
                            heapq.heappush(heap, item)
                        elif item > heap[0]:
                            heapq.heapreplace(heap, item)
        except OSError:
            continue
    return Usage(total, files, tuple(sorted(heap, reverse=True)))


class DiskWatch:
    """One child's files (paths: files or directories, made by the child or not yet) and the filesystems
    they are on. poll() says when the child must stop: its files grew past the cap (DISK_RUNAWAY), or a
    filesystem's free space fell under the floor (DISK_LOW); `stop` keeps that (kind, detail)."""

    def __init__(
        self,
        paths: Iterable[Path],
        base: Path,
        limits: DiskLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.paths = list(dict.fromkeys(Path(p) for p in paths))
        self.base = Path(base)
        self.limits = limits or DiskLimits()
        self.clock = clock
        self.start_bytes = self._total()
        self.t0 = clock()
        self.samples: collections.deque[tuple[float, int]] = collections.deque([(self.t0, 0)])
        self.grown = 0
        self.stop: tuple[str, str] | None = None
        self.places = self._filesystems()

    def _total(self) -> int:
        return sum(measure(p).bytes for p in self.paths)

    def _filesystems(self) -> list[Path]:
        """One existing directory per filesystem the child writes to: the base's, and each path's."""
        seen: dict[int, Path] = {}
        for p in [self.base, *self.paths]:
            while not p.exists() and p != p.parent:
                p = p.parent
            try:
                seen.setdefault(os.stat(p).st_dev, p if p.is_dir() else p.parent)
            except OSError:
                continue
        return list(seen.values())

    def rel(self, path: str | Path) -> str:
        """A path as the detail names it: relative to the base (the work directory) when under it."""
        try:
            return Path(path).relative_to(self.base).as_posix()
        except ValueError:
            return str(path)

    def low_space(self) -> str | None:
        """Why a filesystem the child writes to has too little free space (one clause), or None."""
        for place in self.places:
            try:
                total, _used, free = shutil.disk_usage(place)
            except OSError:
                continue
            floor = floor_for(total, self.limits.floor_bytes)
            if free < floor:
                return (
                    f"the filesystem of {place} has {size_text(free)} free ({free} bytes), under the kit's floor of "
                    f"{size_text(floor)} (the lesser of {size_text(self.limits.floor_bytes)} and "
                    f"{FLOOR_FRACTION:.0%} of its {size_text(total)})"
                )
        return None

    def poll(self) -> tuple[str, str] | None:
        """Measure once; the (kind, detail) the child must stop for, or None. A stop is kept in `stop`."""
        if self.stop is not None:
            return self.stop
        now = self.clock()
        self.grown = max(0, self._total() - self.start_bytes)
        self.samples.append((now, self.grown))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW_S:
            self.samples.popleft()
        if self.grown > self.limits.cap_bytes:
            self.stop = (DISK_RUNAWAY, self.runaway_detail())
        elif (low := self.low_space()) is not None:
            self.stop = (DISK_LOW, f"{low}: the arm was stopped so that the disk does not fill; {self.figures()}")
        return self.stop

    def runaway_detail(self) -> str:
        cap = self.limits.cap_bytes
        return (
            f"its files grew by {size_text(self.grown)} on disk ({self.grown} bytes), over the cap of "
            f"{size_text(cap)} per child (--max-child-disk-gb); {self.figures()}"
        )

    def figures(self) -> str:
        """Where the bytes are (each path's total, the largest files) and how fast they came."""
        parts, largest = [], []
        for p in self.paths:
            use = measure(p, LARGEST)
            if use.bytes:
                count = f" in {use.files} files" if p.is_dir() else ""
                parts.append((use.bytes, f"{self.rel(p)} {size_text(use.bytes)}{count}"))
            largest += use.largest
        where = ", ".join(text for _, text in sorted(parts, reverse=True)) or "no file of its own"
        top = ", ".join(f"{self.rel(path)} {size_text(n)}" for n, path in heapq.nlargest(LARGEST, largest))
        return f"{where}; largest: {top or 'none'}; {self.rate()}"

    def rate(self) -> str:
        (t_then, b_then), (t_now, b_now) = self.samples[0], self.samples[-1]
        whole = t_now - self.t0
        said = f"{size_text(b_now)} in {_seconds(whole)} since it started ({size_text(b_now / max(whole, 1e-3))}/s)"
        window = t_now - t_then
        if t_then > self.t0 and window > 0:
            recent = b_now - b_then
            said = f"{size_text(recent)} in the last {_seconds(window)} ({size_text(recent / window)}/s), " + said
        return "it grew " + said


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"


def cut_log(path: Path, head: int = MIB, tail: int = MIB) -> int:
    """Cut a log longer than head + tail to its first head and last tail bytes, with a line saying what
    went, so that a runaway log is not kept beside a report; the bytes cut (0: kept whole). Reads only
    what it keeps."""
    try:
        size = path.stat().st_size
        if size <= head + tail:
            return 0
        with open(path, "rb") as fh:
            first = fh.read(head)
            fh.seek(size - tail)
            last = fh.read(tail)
    except OSError:
        return 0
    cut = size - head - tail
    note = f"\n[kvkit] {cut} bytes of this log were cut here: it was {size} bytes, past what is kept beside a report\n"
    write_bytes_atomic(path, first + note.encode() + last)
    return cut


def empty_dir(path: Path) -> None:
    """Remove what a directory holds (it stays, for whoever else names it)."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            try:
                os.unlink(entry.path)
            except OSError:
                pass
