"""Parent side: start one engine child per arm, time it out, reap its process group, collect.

The parent never imports vllm, torch or lmcache. Each child's stdout and stderr are the arm log
file itself (file-descriptor level), so what vLLM workers and LMCache print from grandchildren
lands there too. Every way a child can go wrong becomes a named failure kind with the log tail
(repro.run.exits reads how it ended).
Each child's group hangs on a lifeline (repro.run.lifeline): if the kit is killed outright, the group
stops itself. While a child runs, its disk use is watched (repro.run.diskwatch): a child whose files grow
past the cap, or that runs while the free space where it writes falls under the floor, is killed with
its group, and no child starts below the floor.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from repro.contract.failure import DISK_LOW, Failure
from repro.contract.job import Job, progress_path
from repro.contract.result import ArmResult
from repro.judge import logscan
from repro.paths import KIT_ROOT
from repro.plan.arms import scratch_dirs
from repro.plan.options import FRONTEND_ENV
from repro.record.atomic import write_bytes_atomic, write_json_atomic
from repro.record.provenance import KERNEL_ENV_NAMES, redact_text
from repro.run import warm
from repro.run.diskwatch import DiskLimits, DiskWatch, cut_log, empty_dir
from repro.run.exits import collect_outcome
from repro.run.lifeline import group_members, launch_command

INTERRUPTED = "interrupted"
_CGROUP_EVENTS = Path("/sys/fs/cgroup/memory.events")
GRACE_S = 10.0  # SIGTERM to SIGKILL, for a child that is still running when it must stop
_REAP_S = 5.0
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@dataclass(frozen=True)
class ArmOutcome:
    name: str
    result: ArmResult | None
    failure: Failure | None  # when the child did not deliver
    log_path: Path
    log_text: str
    wall_s: float
    returncode: int | None = None
    server_copy_path: dict | None = None  # an LMCacheMPConnector arm: its MP server's (repro.lmcache.mp)
    # what its job asked for: probe name -> requests (cold + reuses); judging holds the result to it
    asked: dict[str, int] | None = None
    # the max_tokens every request of its job was sent with (greedy, ignore_eos): an answer of another length is none
    max_tokens: int | None = None


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the kit: children are killed, no complete report is written."""


def kernel_cache_env(env: dict[str, str]) -> dict[str, str]:
    """A kernel variable (provenance.KERNEL_ENV_NAMES) passes through as the caller set it. With one set, the
    engines do not share inductor's FX graph and AOT caches: torch 2.13 keys them without the vector ISA, so
    vLLM's compiled sampler op (logprob ranks) built for AVX-512 ran 16-wide code on 8-wide vectors under
    ATEN_CPU_CAPABILITY=avx2 (wrong counts, both ways) and failed to build under `default`."""
    if any(env.get(name) for name in KERNEL_ENV_NAMES):
        return {"TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
    return {}


def child_env(base: dict[str, str], *, hashseed: str, extra: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    env.update(
        {
            "PYTHONHASHSEED": hashseed,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join([str(KIT_ROOT)] + ([base["PYTHONPATH"]] if base.get("PYTHONPATH") else [])),
            # no telemetry leaves the machine, and logs stay greppable
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "LMCACHE_TRACK_USAGE": "false",
            "VLLM_LOGGING_COLOR": "0",
            "NO_COLOR": "1",
        }
    )
    # vLLM's CPU backend reserves one more core for any process that has a KV connector
    # (ompmultiprocessing.py), so a connector arm would run its kernels on fewer OpenMP threads than
    # the baseline: different reduction orders, different bits. One reserved core for every arm
    # keeps the kernels the same (a user's own setting wins; it is recorded with the environment).
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    env.update(kernel_cache_env(env))
    # the engine's front end is what the kit's flag says (the verifier passes it in extra), never what the
    # caller's shell holds: the detection study, the margins and the model checks run vLLM's LLM
    env.pop(FRONTEND_ENV, None)
    env.update(extra)
    return env


@contextlib.contextmanager
def deferred_signals():
    """Hold SIGINT and SIGTERM until the block ends: a second Ctrl-C must not cut a clean-up or a
    publish in half. A signal that arrives meanwhile is handed to its own handler when the block
    exits. Python-level handlers (not a thread's signal mask) so that the hold works whichever
    thread the kernel picks to receive the signal; outside the main thread nothing can be held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: pending.append(signum)) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if pending:
            handler = previous[pending[0]]
            if callable(handler):
                handler(
                    pending[0], None
                )  # SIGINT's default raises KeyboardInterrupt; the verifier's SIGTERM, Interrupted
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), pending[0])


def kill_group(proc: subprocess.Popen, grace_s: float | None = None) -> None:
    """SIGTERM the child's whole group, then SIGKILL what is left, and reap the child.

    vLLM's engine core and workers are grandchildren in the same group; once the child itself
    has exited (its result is on disk) the leftovers get SIGKILL at once (grace_s=0)."""
    grace = GRACE_S if grace_s is None else grace_s
    steps = ((signal.SIGTERM, grace), (signal.SIGKILL, _REAP_S)) if grace > 0 else ((signal.SIGKILL, _REAP_S),)
    for sig, wait in steps:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader, or it lingers as a zombie in the group
            if not group_members(proc.pid):
                break
            time.sleep(0.05)
        else:
            continue
        break
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_REAP_S)


def oom_kill_count() -> int | None:
    """The cgroup's out-of-memory kill counter (cgroup v2), or None where it cannot be read."""
    try:
        for line in _CGROUP_EVENTS.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


# Children started by run_child and not yet reaped, from any thread: when arms run concurrently
# an interrupt reaches the main thread only, which then stops every one (stop_all_children).
_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()
# Set by a stop, under _LIVE_LOCK, where a child registers as it starts (starting): a thread that
# passed its own stop check either registered its child before the stop's sweep (which then stops
# it) or never starts one. The MP servers register the same way (repro.lmcache.mp).
_stopping = False


def stop_starting() -> None:
    """From now on no child starts (starting raises Interrupted): the run is stopping."""
    global _stopping
    with _LIVE_LOCK:
        _stopping = True


def allow_children() -> None:
    """Let children start again after a stop (a later run in the same process: the tests)."""
    global _stopping
    with _LIVE_LOCK:
        _stopping = False


@contextlib.contextmanager
def starting():
    """Hold this while a child is started and registered (in _LIVE, or a caller's own set): a stop
    waits until the block ends, and once the run is stopping the block never runs (Interrupted)."""
    with _LIVE_LOCK:
        if _stopping:
            raise Interrupted("the run is stopping: no new child")
        yield


def stop_all_children() -> None:
    """No child starts any more (stop_starting), and the process group of every child still running
    is killed (the threads that wait on them then return); for the verifier's interrupt and for a
    run that must stop early."""
    global _stopping
    with _LIVE_LOCK:
        _stopping = True
        live = list(_LIVE)
    for proc in live:
        kill_group(proc)


def start_child(
    argv: list[str], *, log_path: Path, env: dict[str, str], warm_ok: bool = False
) -> tuple[subprocess.Popen, int]:
    """Start argv as the leader of a new session, its output in log_path, on a lifeline.

    A new session: the terminal's Ctrl-C reaches the kit only, which then stops the group. The
    child runs under repro.run.lifeline's watcher; the kit holds the returned write end of the group's
    lifeline and must close it only once the group is reaped (if the kit dies first, the kernel
    closes it and the watcher stops the whole group). warm_ok: argv is a CPU engine child that a warm-import
    launcher may fork (repro.run.warm, when KVKIT_WARM_IMPORT=1); the handle is then a WarmChild."""
    if shutil.which(argv[0], path=env.get("PATH", os.defpath)) is None:  # what Popen would raise
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
    read_fd, write_fd = os.pipe()  # close-on-exec: no other child inherits either end
    try:
        if warm_ok and warm.enabled():
            forked = warm.start(argv, log_path=log_path, env=env, read_fd=read_fd, spawn=start_child)
            if forked is not None:
                return forked, write_fd
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                launch_command(argv, read_fd),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                pass_fds=(read_fd,),
            )
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    return proc, write_fd


def run_child(
    argv: list[str],
    *,
    log_path: Path,
    env: dict[str, str],
    timeout_s: float,
    watch: DiskWatch | None = None,
    warm_ok: bool = False,
) -> tuple[int | None, bool, bool, float]:
    """Run one child in its own process group with its output in log_path; always reap the group.

    Returns (returncode, timed_out, oom_killed, wall seconds). An interrupt (KeyboardInterrupt,
    Interrupted) kills the group and propagates; once the run is stopping (stop_all_children) no
    child starts: Interrupted. watch: the child's files (default: its log) and their limits; when it
    says stop (watch.stop) the group is killed at once, and a caller that gave no watch gets a line
    on stderr saying why."""
    t0 = time.monotonic()
    oom_before = oom_kill_count()
    own_watch = watch is None
    watch = watch or DiskWatch([log_path], log_path.parent)
    if warm_ok and warm.enabled():
        warm.prepare(argv, env, spawn=start_child)  # a launcher's import, outside the lock of starting()
    with starting():
        proc, lifeline = start_child(argv, log_path=log_path, env=env, warm_ok=warm_ok)
        _LIVE.add(proc)
    try:
        try:
            timed_out = wait_watched(proc, t0 + timeout_s, watch)
        except BaseException:
            with deferred_signals():
                kill_group(proc)
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(proc)
        # A runaway writer is not asked to stop: at the 450 MB/s measured, GRACE_S of SIGTERM is 4.5 GB more.
        done = proc.returncode is not None or watch.stop is not None
        with deferred_signals():
            kill_group(proc, grace_s=0 if done else None)  # its workers may live on
    finally:
        os.close(lifeline)  # only now: its watcher was reaped with the group
    if own_watch and watch.stop is not None:
        said = f"[kvkit] the child that logs to {log_path} was stopped: {watch.stop[0]}: {watch.stop[1]}"
        print(said, file=sys.stderr, flush=True)
    oom_after = oom_kill_count()
    oom_killed = oom_before is not None and oom_after is not None and oom_after > oom_before
    return proc.returncode, timed_out, oom_killed, time.monotonic() - t0


def wait_watched(proc: subprocess.Popen, deadline: float, watch: DiskWatch) -> bool:
    """Wait for the child until the deadline, measuring its disk use every poll; True when it ran past
    the deadline (False when it exited, or when the watch says stop)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        try:
            proc.wait(timeout=min(left, watch.limits.poll_s))
            return False
        except subprocess.TimeoutExpired:
            if watch.poll() is not None:
                return False


def run_arm(
    job: Job,
    *,
    workdir: Path,
    log_path: Path,
    env: dict[str, str],
    timeout_s: float,
    python: str = sys.executable,
    module: str = "repro.engine",
    disk: DiskLimits | None = None,
) -> ArmOutcome:
    """Run one arm's child to completion (or failure) and reap everything it started. Its disk use is
    watched (disk: the limits; default repro.run.diskwatch's): it never starts where the free space is under
    the floor, and once stopped its KV audit files and connector stores are emptied and its log is cut."""
    name = job.arm.name
    job_path = workdir / f"{name}.job.json"
    out_path = workdir / f"{name}.result.json"
    watch = DiskWatch(child_paths(job, log_path, out_path), workdir, disk)
    if (low := watch.low_space()) is not None:
        return not_started(name, log_path, DISK_LOW, f"{low}: the arm was not started so that the disk does not fill")
    write_json_atomic(job_path, replace(job, output=str(out_path)).to_json())
    returncode, timed_out, oom_killed, wall = run_child(
        [python, "-m", module, str(job_path)],
        log_path=log_path,
        env=env,
        timeout_s=timeout_s,
        watch=watch,
        warm_ok=module == "repro.engine" and job.engine.device == "cpu",  # never where CUDA could be initialised
    )
    stopped = None if watch.stop is None else (watch.stop[0], watch.stop[1] + give_back(watch, log_path))
    text = redact_log(log_path, env)
    result, failure = collect_outcome(returncode, timed_out, oom_killed, text, out_path, stopped)
    if result is not None and job.fixture_sha256 and result.fixture_sha256 is None:
        result = replace(result, fixture_sha256=job.fixture_sha256)  # what this child was fed
    return ArmOutcome(
        name=name,
        result=result,
        failure=None if failure is None else Failure(failure[0], failure[1], logscan.tail(text)),
        log_path=log_path,
        log_text=text,
        wall_s=round(wall, 3),
        returncode=returncode,
        asked=None if job.scenario is not None else {p.name: p.requests for p in job.probes},
        max_tokens=job.max_tokens,
    )


def child_paths(job: Job, log_path: Path, out_path: Path) -> list[Path]:
    """What an engine child writes: its log, result and progress files, KV audit directory, and the
    connector stores the kit made for its arm (repro.plan.arms.materialize)."""
    paths = [log_path, out_path, Path(progress_path(str(out_path)))]
    if job.kv_audit_dir:
        paths.append(Path(job.kv_audit_dir))
    return paths + scratch_dirs(job.arm)


def give_back(watch: DiskWatch, log_path: Path) -> str:
    """After a stop, the space of a child whose result will not be used: its KV audit directory and
    connector stores emptied, its log cut to its first and last MiB (repro.run.diskwatch.cut_log); what was
    done, as the end of the failure's detail."""
    said = "; its process group was killed (SIGKILL)"
    emptied = [p for p in watch.paths if p.is_dir()]
    for p in emptied:
        empty_dir(p)
    if emptied:
        said += f"; emptied to give the space back: {', '.join(watch.rel(p) for p in emptied)}"
    cut = cut_log(log_path)
    if cut:
        said += f"; its log was cut to its first and last MiB ({cut} bytes cut)"
    return said


def not_started(name: str, log_path: Path, kind: str, detail: str) -> ArmOutcome:
    """An arm the kit did not start: its failure, and a log of one line saying why (the report cites it)."""
    line = f"kvkit: {name} was not started: {kind}: {detail}\n"
    with contextlib.suppress(OSError):  # the disk may be too full for it too: the failure still says why
        write_bytes_atomic(log_path, line.encode())
    return ArmOutcome(name, None, Failure(kind, detail, line), log_path, line, 0.0)


def redacted_tail(log_path: Path, env: dict[str, str]) -> str:
    """A log's tail, secrets blanked; read without rewriting the file (its writer may still write)."""
    try:
        raw = log_path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return logscan.tail(redact_text(raw, env))


def redact_log(log_path: Path, env: dict[str, str]) -> str:
    """Read the arm log back and blank any secret values before it is kept next to a report."""
    try:
        raw = log_path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ""
    clean = redact_text(raw, env)
    if clean != raw:
        write_bytes_atomic(log_path, clean.encode("utf-8"))
    return clean
