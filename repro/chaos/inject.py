"""One kit run under one fault: start it, inject the fault at its moment, wait for the end, and check what is left."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from repro.chaos import checks, procs, sandbox, scenarios
from repro.chaos.checks import NEW, PARTIAL, ReportState, Snapshot
from repro.chaos.faults import CHILD, DISK_FULL, KIT, MATRIX, RAY_WORKER, RESULT_FILE, SERVER, UNWRITABLE, Fault
from repro.chaos.scenarios import MATRIX_CELLS, MATRIX_NAME, Layout

HANG_S = 240.0  # a run still going this long after its fault is hung (the fake arms take seconds)
SETTLE_S = {MATRIX: 40.0}  # Ray's own processes take a while to go after ray.shutdown
DEFAULT_SETTLE_S = 15.0  # a lifeline's watcher: SIGTERM, then SIGKILL 3 s later
SURVIVE_S = 3.0  # a signalled process still alive this long after the signal ignored it
RELAY_S = 10.0  # a piped run's output: how long its copy may take once the kit has exited
CORRUPTION = b"\x00\xff\x00garbage\x00\xfe\x00"  # NUL is not JSON anywhere, 0xFF not UTF-8
# When each kind of target is up (the clean runs measure it): a cell's verifier stands for its Ray worker.
_SPAN_TESTS = {
    CHILD: scenarios.is_engine_child,
    SERVER: scenarios.is_mp_server,
    RESULT_FILE: lambda p: scenarios.is_engine_child(p) and scenarios.result_file(p).is_file(),
    RAY_WORKER: scenarios.is_verifier,
}


@dataclass
class Context:
    """What every fault of one chaos run shares."""

    layout: Layout
    python: str
    ray_python: str | None
    reaper: int | None  # this process's pid when it is the subreaper of the runs, else None
    disk: str  # repro.chaos.sandbox's mechanism for a full disk
    unwritable: str | None  # and for an unwritable folder (None: none works here)
    walls: dict[str, float] = field(default_factory=dict)  # per scenario: its clean run's wall time
    # per scenario and fault kind: how long its targets lived in the clean run (the first one's start to
    # the last one's end): a target fault's moment is a fraction of it, from the first target's start
    spans: dict[str, dict[str, float]] = field(default_factory=dict)
    normal_rc: dict[str, int] = field(default_factory=dict)
    stale: dict[Path, set[str]] = field(default_factory=dict)  # TMPDIR entries that kill -9 left, per folder


@dataclass
class Outcome:
    fault: Fault | None  # None: a scenario's calibration run
    scenario: str
    at_s: float | None = None  # when the fault hit, seconds after the run started
    target: str = ""
    landed: bool = False
    survived: bool = False  # the signalled process was alive SURVIVE_S after the signal
    rc: int | None = None
    named: str | None = None
    seen: str = ""
    report: str = ""
    orphans: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    settle_s: float = 0.0
    stderr_path: Path | None = None  # the run's stderr, as it is written


@dataclass
class Where:
    """The folders of one run: its report (or matrix summary), the cell reports, its TMPDIR."""

    report: Path
    tmpdir: Path
    extra: list[Path] = field(default_factory=list)  # matrix: the cell reports


def _where(ctx: Context, scenario: str, report: Path | None = None, tmpdir: Path | None = None) -> Where:
    report = report or ctx.layout.report(scenario)
    cells = [report.parent / MATRIX_NAME / f"{c}.json" for c in MATRIX_CELLS] if scenario == MATRIX else []
    return Where(report, tmpdir or ctx.layout.tmp, cells)


def _load(scenario: str):
    return checks.load_matrix_summary if scenario == MATRIX else checks.load_complete_report


def _states(scenario: str, where: Where, before: dict[Path, Snapshot]) -> dict[Path, ReportState]:
    states = {where.report: checks.report_state(where.report, before[where.report], _load(scenario),
                                                None if scenario == MATRIX else checks.report_logs)}  # fmt: skip
    for cell in where.extra:
        states[cell] = checks.report_state(cell, before[cell], checks.load_complete_report, checks.report_logs)
    return states


def copy_previous(src: Path, dest_dir: Path) -> Path:
    """The previous report and its logs, copied into another folder (a full disk's, an unwritable one)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / src.name
    if src.exists():
        shutil.copy2(src, dest)
    if checks.logs_dir(src).is_dir():
        shutil.copytree(checks.logs_dir(src), checks.logs_dir(dest))
    return dest


def warm_up(ctx: Context, with_ray: bool) -> None:
    """Import what the runs import once, so that the clean runs (whose wall times set the faults' moments)
    are not the only ones that start cold."""
    env = {**os.environ, "PYTHONPATH": str(scenarios.KIT_ROOT)}
    imports = "import repro.verify, repro.matrix.commands, tests.fake_engine, tests.stand_in_mp_server"
    commands = [[ctx.python, "-c", imports]] + ([[ctx.ray_python, "-c", "import ray"]] if with_ray else [])
    for argv in commands:
        subprocess.run(argv, cwd=scenarios.KIT_ROOT, env=env, capture_output=True, check=False, timeout=300)


def run_clean(ctx: Context, scenario: str) -> Outcome:
    """The scenario without a fault: its wall time (the faults' moments are fractions of it), its usual
    exit code, and the previous report for its first fault. It must pass the same checks."""
    where = _where(ctx, scenario)
    out = Outcome(None, scenario)
    result = _run(ctx, scenario, where, out, inject=None)
    ctx.walls[scenario] = out.wall_s
    ctx.spans[scenario] = {k: round(last - first, 3) for k, (first, last) in result.spans.items()}
    ctx.normal_rc[scenario] = out.rc if out.rc is not None else -1
    if out.rc not in (0, 1) or result.state != NEW:
        out.problems.append(f"the clean run ended with exit {out.rc} and a report that is {result.state}")
    out.named = f"clean run (exit {out.rc})"
    _check_files(ctx, None, where, result, out)
    return out


def run_fault(ctx: Context, fault: Fault) -> Outcome:
    out = Outcome(fault, fault.scenario)
    n = fault.index
    if fault.category == DISK_FULL:
        with sandbox.Disk(ctx.layout.root / f"disk-{n}", ctx.disk) as disk:
            report = copy_previous(ctx.layout.report(fault.scenario), disk.root / "reports")
            (disk.root / "tmp").mkdir()
            where = _where(ctx, fault.scenario, report, disk.root / "tmp")
            # RLIMIT_FSIZE covers every file the kit writes, its stdout and stderr too when they are files:
            # a user's terminal is not on the full disk, so the kit writes to pipes that this run keeps
            fill = _at_moment(ctx, fault, out, lambda proc: disk.fill(proc.pid))
            _judged(ctx, fault, where, out, fill, piped=ctx.disk == sandbox.FSIZE)
        if not disk.unmounted:
            out.problems.append("the full disk could not be unmounted")
        return out
    if fault.category == UNWRITABLE:
        folder = ctx.layout.root / f"unwritable-{n}"
        report = copy_previous(ctx.layout.report(fault.scenario), folder)
        if fault.variant == "before":
            sandbox.make_unwritable(folder, ctx.unwritable)
        try:
            lock = _at_moment(ctx, fault, out, lambda proc: sandbox.make_unwritable(folder, ctx.unwritable))
            _judged(ctx, fault, _where(ctx, fault.scenario, report), out, lock, unlock=(folder, ctx.unwritable),
                    at_start=fault.variant == "before")  # fmt: skip
        finally:
            sandbox.make_writable(folder, ctx.unwritable)
            shutil.rmtree(folder, ignore_errors=True)
        return out
    if fault.category == KIT:
        hit = _at_moment(ctx, fault, out, lambda proc: _send(proc.pid, fault.variant))
    else:
        hit = _target_hit(ctx, fault, out)
    _judged(ctx, fault, _where(ctx, fault.scenario), out, hit)
    return out


def _judged(
    ctx: Context, fault: Fault, where: Where, out: Outcome, inject, unlock=None, at_start=False, piped=False
) -> None:
    """Run the fault's scenario with its injection (at_start: the fault is in place before the run
    starts), then name the outcome and check the files."""
    if at_start:
        inject, out.at_s, out.landed = None, 0.0, True
    result = _run(ctx, fault.scenario, where, out, inject=inject, unlock=unlock, piped=piped)
    normal = ctx.normal_rc.get(fault.scenario, 1)
    run = checks.Run(out.rc, result.stdout, result.stderr, result.state_of_main, out.landed, out.target, out.survived)
    out.named, out.seen = checks.name_outcome(fault.category, fault.variant, run, normal)
    if out.named is None:
        out.problems.append(f"unnamed: {out.seen}")
    _check_files(ctx, fault, where, result, out)


@dataclass
class _Result:
    stdout: str
    stderr: str
    states: dict[Path, ReportState]
    main: Path
    work_before: set[str]
    work_after: set[str]
    tmp_before: set[str]
    tmp_after: set[str]
    cell_work_after: set[str]
    spans: dict[str, tuple[float, float]]  # per fault kind: when its targets lived, from the run's start

    @property
    def state_of_main(self) -> ReportState:
        return self.states[self.main]

    @property
    def state(self) -> str:
        return self.state_of_main.state


def _run(ctx: Context, scenario: str, where: Where, out: Outcome, inject, unlock=None, piped=False) -> _Result:
    """Run the scenario once (inject: function(proc, watch, t0) -> landed, which waits for its own moment),
    wait for it and for its processes, and read what it left. piped: the kit's stdout and stderr are pipes
    (copied into the run's files), not the files themselves."""
    before = {p: checks.take_snapshot(p) for p in [where.report, *where.extra]}
    work_before, tmp_before = checks.work_dirs(where.report.parent), checks.entries(where.tmpdir)
    argv, env = scenarios.command(ctx.layout, scenario, where.report, where.tmpdir, ctx.python, ctx.ray_python)
    logs = ctx.layout.root / "runs"
    logs.mkdir(exist_ok=True)
    tag = f"{out.fault.index:03d}" if out.fault else f"clean-{scenario}"
    out.stderr_path = logs / f"{tag}.err"
    with open(logs / f"{tag}.out", "w+b") as so, open(logs / f"{tag}.err", "w+b") as se:
        t0 = time.monotonic()
        outs = (subprocess.PIPE, subprocess.PIPE) if piped else (so, se)
        proc = subprocess.Popen(argv, cwd=scenarios.KIT_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=outs[0],
                                stderr=outs[1], start_new_session=True)  # fmt: skip
        relays = [_relay(proc.stdout, so), _relay(proc.stderr, se)] if piped else []
        with procs.Watch(proc.pid, spans=_SPAN_TESTS) as watch:
            try:
                if inject is not None:
                    out.landed = bool(inject(proc, watch, t0))
                out.rc = proc.wait(timeout=HANG_S + ctx.walls.get(scenario, 10.0))
            except subprocess.TimeoutExpired:
                out.problems.append(f"hung: the run had not ended {HANG_S:.0f} s after its fault; killed")
                _kill_group(proc)
                out.rc = proc.wait()
            except BaseException:  # the chaos run itself interrupted: the kit runs in its own session
                _kill_group(proc)  # its children's lifelines stop them
                proc.wait()
                raise
            out.wall_s = round(time.monotonic() - t0, 2)
        for relay in relays:
            relay.join(RELAY_S)
        for pipe in (proc.stdout, proc.stderr) if piped else ():
            pipe.close()
        if unlock is not None:
            sandbox.make_writable(*unlock)  # the checks below read and the clean-up removes
        left, out.settle_s = procs.settle(watch, ctx.reaper, SETTLE_S.get(scenario, DEFAULT_SETTLE_S))
        out.settle_s = round(out.settle_s, 2)
        out.orphans = [p.text() for p in left]
        procs.kill_leftovers(left)
        so.seek(0)
        se.seek(0)
        stdout, stderr = so.read().decode("utf-8", "replace"), se.read().decode("utf-8", "replace")
    states = _states(scenario, where, before)
    out.report = "; ".join(f"{p.name}: {s.state}" for p, s in states.items())
    for path, state in states.items():
        if state.state == PARTIAL:
            out.problems.append(f"partial report {path.name}: {state.detail}")
        if state.missing_logs:
            out.problems.append(f"dangling log: the new {path.name} cites {', '.join(state.missing_logs)}, not there")
    if out.orphans:
        out.problems.append(f"{len(out.orphans)} process(es) outlived the run: {', '.join(out.orphans)[:300]}")
    cell_folder = where.report.parent / MATRIX_NAME
    return _Result(stdout, stderr, states, where.report, work_before, checks.work_dirs(where.report.parent),
                   tmp_before, checks.entries(where.tmpdir), checks.work_dirs(cell_folder),
                   {k: (a - t0, b - t0) for k, (a, b) in watch.spans.items()})  # fmt: skip


def _relay(pipe, dest) -> threading.Thread:
    """Copy a pipe into a file until its end (the kit's exit, and that of whatever inherited it)."""

    def copy() -> None:
        with contextlib.suppress(OSError, ValueError):
            for chunk in iter(lambda: pipe.read1(65536), b""):
                dest.write(chunk)

    thread = threading.Thread(target=copy, name="kvkit-chaos-relay", daemon=True)
    thread.start()
    return thread


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _sleep_until(when: float, proc: subprocess.Popen) -> None:
    while time.monotonic() < when and proc.poll() is None:
        time.sleep(min(0.05, max(0.0, when - time.monotonic())))


def _alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


def _at_moment(ctx: Context, fault: Fault, out: Outcome, act):
    """An injection at fault.fraction of the scenario's clean wall time: act(proc) -> landed, if the run is
    still going then (else the fault missed). A signal for the kit misses too once the kit has said its
    last word on stderr: its run is over, only its interpreter's exit is left."""

    def inject(proc: subprocess.Popen, watch: procs.Watch, t0: float) -> bool:
        _sleep_until(t0 + fault.fraction * ctx.walls.get(fault.scenario, 10.0), proc)
        out.at_s = round(time.monotonic() - t0, 2)
        if fault.category == KIT and out.stderr_path is not None and checks.said_last_word(_read(out.stderr_path)):
            return False
        return _alive(proc) and bool(act(proc))

    return inject


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except OSError:
        return ""


def _send(pid: int, signal_name: str) -> bool:
    """Signal a process; False when it is gone already."""
    try:
        os.kill(pid, int(getattr(signal, signal_name)))
    except ProcessLookupError:
        return False
    return True


def _target_hit(ctx: Context, fault: Fault, out: Outcome):
    """An injection into one of the run's processes (an engine child, the MP server, a cell's Ray worker) or
    a child's result file: once the first target is up, at fault.fraction of the time targets lived in the
    clean run, the target fault.pick chooses among those alive (waited for while the run lasts)."""
    span = ctx.spans.get(fault.scenario, {}).get(fault.category, 0.0)

    def inject(proc: subprocess.Popen, watch: procs.Watch, t0: float) -> bool:
        while _alive(proc) and not _targets(fault.category, watch):
            time.sleep(0.05)
        _sleep_until(time.monotonic() + fault.fraction * span, proc)
        while _alive(proc):
            targets = _targets(fault.category, watch)
            if targets:
                target, name = targets[min(int(fault.pick * len(targets)), len(targets) - 1)]
                out.target, out.at_s = name, round(time.monotonic() - t0, 2)
                if fault.category == RESULT_FILE:
                    return _damage(scenarios.result_file(target), fault)
                if procs.is_running(target) and _send(target.pid, fault.variant):
                    out.survived = _survives(target, watch)
                    return True
            time.sleep(0.05)
        return False

    return inject


def _survives(target: procs.Proc, watch: procs.Watch) -> bool:
    """Whether the process is still the same live process SURVIVE_S after it was signalled."""
    deadline = time.monotonic() + SURVIVE_S
    while time.monotonic() < deadline:
        if not procs.is_running(target):
            return False
        time.sleep(0.1)
    return True


def _targets(category: str, watch: procs.Watch) -> list[tuple[procs.Proc, str]]:
    if category == CHILD:
        return [(p, scenarios.arm_of(p)) for p in watch.members(scenarios.is_engine_child)]
    if category == SERVER:
        return [(p, scenarios.MP_CONNECTOR) for p in watch.members(scenarios.is_mp_server)]
    if category == RESULT_FILE:  # a child that wrote its result and has not exited: the parent reads it then
        return [(p, scenarios.arm_of(p)) for p in watch.members(scenarios.is_engine_child)
                if scenarios.result_file(p).is_file()]  # fmt: skip
    if category == RAY_WORKER:  # a worker that runs a cell: a cell's verifier below it
        table = watch.table()
        found = []
        for worker in watch.members(scenarios.is_ray_worker):
            below = [table[d] for d in procs.descendants(table, {worker.pid}) if scenarios.is_verifier(table[d])]
            if below:
                found.append((worker, scenarios.cell_of(below[0])))
        return found
    raise ValueError(f"no targets for {category!r}")


def _damage(path: Path, fault: Fault) -> bool:
    """Truncate the result file, or overwrite bytes in place (no atomic write: as a failing disk would)."""
    try:
        size = path.stat().st_size
        at = min(int(fault.damage_at * size), max(size - 1, 0))
        with open(path, "r+b") as fh:
            if fault.variant == "truncate":
                fh.truncate(at)
            else:
                fh.seek(at)
                fh.write(CORRUPTION)
    except FileNotFoundError:
        return False
    return True


def _check_files(ctx: Context, fault: Fault | None, where: Where, result: _Result, out: Outcome) -> None:
    """Files the run should not have left: its own work folder and TMPDIR entries (kill -9 of the kit
    aside, and an unwritable folder's work folder, which nothing can remove), and the leftovers of
    an earlier kill -9, which a run that wrote a new report must have swept."""
    new_work = result.work_after - result.work_before
    new_tmp = result.tmp_after - result.tmp_before
    killed = fault is not None and fault.category == KIT and fault.variant == "SIGKILL" and out.rc == -9
    stale_tmp = ctx.stale.setdefault(where.tmpdir, set())
    if killed:
        stale_tmp |= new_tmp
    elif (fault is None or fault.category != UNWRITABLE) and new_work:
        out.problems.append(f"left its work folder: {', '.join(sorted(new_work))}")
    if not killed and new_tmp:
        out.problems.append(f"left in TMPDIR: {', '.join(sorted(new_tmp))[:200]}")
    if result.cell_work_after:
        out.problems.append(f"a cell left its work folder: {', '.join(sorted(result.cell_work_after))}")
    if result.state == NEW and out.scenario != MATRIX:
        unswept = sorted(result.work_before & result.work_after) + sorted(stale_tmp & result.tmp_after)
        if unswept:
            out.problems.append(f"kill -9's leftovers not swept by this run: {', '.join(unswept)[:200]}")
        stale_tmp &= result.tmp_after
