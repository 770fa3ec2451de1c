"""What one Ray task runs: a cell's verifier as a child process (standard library only, no Ray)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# The verifier must not outlive the Ray worker that started it (a cancelled task, a worker killed at
# shutdown, a lost node): it asks the kernel for SIGTERM when its parent dies (which survives exec),
# and on SIGTERM the verifier kills its engine children and writes no report. It runs on the cores
# its cell claimed (argv[2], comma-separated; empty: not pinned), which exec keeps.
_LAUNCH = (
    "import ctypes, os, signal, sys; ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM); "
    "os.getppid() == int(sys.argv[1]) or sys.exit(130); "
    "sys.argv[2] and os.sched_setaffinity(0, [int(c) for c in sys.argv[2].split(',')]); "
    "os.execv(sys.argv[3], sys.argv[3:])"
)
STOP_GRACE_S = 60.0
TAIL_LINES = 40
# One lock file per core, shared by every cell on this host (whichever Ray worker runs it).
CORE_LOCKS = Path(tempfile.gettempdir()) / f"kvkit-cores-{os.getuid()}"


@dataclass(frozen=True)
class CellJob:
    name: str
    python: str
    argv: tuple[str, ...]  # the verifier's arguments (Cell.verifier_argv)
    report: str  # the report's absolute path
    kit_root: str
    timeout_s: float
    driver_host: str
    cpus: int | None = None  # cores to claim and run on (a CPU cell's Ray CPUs); None: not pinned


@dataclass(frozen=True)
class CellOutcome:
    name: str
    returncode: int | None  # None: stopped at the cell's timeout
    wrote_report: bool  # this run replaced the report (else any report there is an older run's)
    output_tail: str
    wall_s: float
    node: str
    files: tuple[tuple[str, bytes], ...]  # the report and its logs, when the cell ran on another host


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
        return (st.st_mtime_ns, st.st_ino)
    except OSError:
        return None


def stop_verifier(proc: subprocess.Popen) -> None:
    """SIGTERM the verifier (it kills its engines and writes nothing), then SIGKILL its group."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _files(report: Path) -> tuple[tuple[str, bytes], ...]:
    """The report and its logs folder, relative to the report's folder."""
    out = [(report.name, report.read_bytes())]
    logs = report.with_name(report.stem + ".logs")
    if logs.is_dir():
        out += [
            (p.relative_to(report.parent).as_posix(), p.read_bytes()) for p in sorted(logs.rglob("*")) if p.is_file()
        ]
    return tuple(out)


@contextlib.contextmanager
def claim_cores(n: int | None) -> Iterator[list[int]]:
    """Up to n cores of this process's affinity set that no other cell on this host holds, held while
    the block runs: a lock file per core (flock, which the kernel drops when its holder dies, kill -9
    included). Ray counts a CPU cell's CPUs but pins nothing, and every verifier binds its arms to the
    cores it may use (repro.plan.devices.usable_cores): cells at once on one host would all use the first
    ones. Empty when n is None (not pinned), or when every core is held (then it runs unpinned)."""
    held: list[tuple[int, int]] = []
    try:
        if n and hasattr(os, "sched_getaffinity"):
            CORE_LOCKS.mkdir(parents=True, exist_ok=True)
            for core in sorted(os.sched_getaffinity(0)):
                if len(held) == n:
                    break
                fd = os.open(CORE_LOCKS / f"cpu{core}.lock", os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:  # another cell's
                    os.close(fd)
                    continue
                held.append((core, fd))
        yield [core for core, _ in held]
    finally:
        for _, fd in held:
            os.close(fd)


def run_cell(job: CellJob) -> CellOutcome:
    """Run the cell's verifier to completion (or its timeout), on cores of its own (claim_cores); an
    interrupt stops it and is re-raised."""
    report = Path(job.report)
    report.parent.mkdir(parents=True, exist_ok=True)
    before = _stat(report)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (job.kit_root, os.environ.get("PYTHONPATH")) if p))
    t0 = time.monotonic()
    with claim_cores(job.cpus) as cores, tempfile.TemporaryFile() as out:
        if job.cpus and len(cores) < job.cpus:
            on = ",".join(map(str, cores)) or "every core, unpinned"
            out.write(
                f"[kvkit] matrix: {len(cores)} of the cell's {job.cpus} cores free on this host: on {on}\n".encode()
            )
            out.flush()
        pin = ",".join(map(str, cores))
        cmd = [job.python, "-c", _LAUNCH, str(os.getpid()), pin, job.python, "-m", "repro.verify_kv_reuse", *job.argv]
        proc = subprocess.Popen(
            cmd, cwd=job.kit_root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            returncode = proc.wait(job.timeout_s)
        except subprocess.TimeoutExpired:
            stop_verifier(proc)
            returncode = None
        except BaseException:  # a cancelled Ray task gets KeyboardInterrupt here
            stop_verifier(proc)
            raise
        out.seek(0)
        tail = "\n".join(out.read().decode("utf-8", "replace").splitlines()[-TAIL_LINES:])
    wrote = _stat(report) not in (None, before)
    node = socket.gethostname()
    remote = wrote and node != job.driver_host
    return CellOutcome(job.name, returncode, wrote, tail, round(time.monotonic() - t0, 3), node,
                       _files(report) if remote else ())  # fmt: skip
