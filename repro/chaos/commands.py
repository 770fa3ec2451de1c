"""`python -m repro chaos [--faults N] [--seed S]`: the faults, one kit run each, a table, the shortfall."""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from repro.chaos import inject, procs, sandbox
from repro.chaos.faults import CATEGORIES, DISK_FULL, RAY_WORKER, UNWRITABLE, Fault, draw_faults
from repro.chaos.inject import Context, Outcome
from repro.chaos.scenarios import Layout, prepare
from repro.commands import ArgumentParser
from repro.errors import EXIT_MISMATCH, EXIT_OK, UsageError
from repro.paths import KIT_ROOT

DEFAULT_FAULTS = 50


def _ray_python(given: str | None) -> str | None:
    """--ray-python, else the matrix environment (`make matrix` makes it), else this Python if it has Ray."""
    if given:
        if not Path(given).is_file():
            raise UsageError(f"--ray-python {given}: no such file")
        return given
    venv = KIT_ROOT / ".venvs" / "matrix" / "bin" / "python"
    if venv.is_file():
        return str(venv)
    return sys.executable if importlib.util.find_spec("ray") is not None else None


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in CATEGORIES]
    if unknown or not kinds:
        raise UsageError(f"--kinds: unknown fault kind {(unknown or [text])[0]!r}; choose from {', '.join(CATEGORIES)}")
    return kinds


def _parse(argv: list[str]):
    p = ArgumentParser(prog="python -m repro chaos", description="Run the kit again and again (fake engine, MP "
                       "stand-in, a 2-cell Ray matrix) with one fault each, drawn from a seed, and check what it left.")  # fmt: skip
    p.add_argument("--faults", type=int, default=DEFAULT_FAULTS, help=f"how many faults (default {DEFAULT_FAULTS})")
    p.add_argument("--seed", type=int, default=None, help="the seed the faults are drawn from (default: a new one)")
    p.add_argument("--kinds", default=",".join(CATEGORIES), help="the fault kinds to draw from, comma-separated")
    p.add_argument("--ray-python", default=None, help="a Python with Ray for the matrix (default .venvs/matrix)")
    p.add_argument("--work", default=None, help="where the runs go (default: a new temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (every run's output is in runs/)")
    args = p.parse_args(argv)
    if args.faults < 1:
        raise UsageError(f"--faults {args.faults}: give at least 1")
    if args.seed is not None and args.seed < 0:
        raise UsageError(f"--seed {args.seed}: give a number of 0 or more")
    if args.work and Path(args.work).exists() and any(Path(args.work).iterdir()):
        raise UsageError(f"--work {args.work}: give a new or empty folder (an earlier run's reports would be judged)")
    args.kinds = _kinds(args.kinds)
    args.ray_python = _ray_python(args.ray_python)
    if RAY_WORKER in args.kinds and args.ray_python is None:
        raise UsageError("ray-worker faults need a Python with Ray: `make matrix` sets up .venvs/matrix, or give "
                         "--ray-python PY, or leave them out with --kinds")  # fmt: skip
    if not Path("/proc/self/stat").exists():
        raise UsageError("the chaos run reads /proc to find what a run left: it needs Linux")
    return args


def _on_term(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def hear_sigint() -> bool:
    """Make SIGINT heard again if this process was started with it ignored (True then). A chaos run started
    in the background by a non-interactive shell (`make chaos &`, nohup) inherits SIGINT ignored and hands
    that on to every kit it runs: each SIGINT fault then hits a process that cannot hear it, and is called
    unnamed (a chaos run of seed 2101 started so: all 7 of its SIGINT faults). Python's own handler here
    becomes the default disposition again in each program a run execs, as in an interactive shell."""
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        return False
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return True


def chaos(argv: list[str]) -> int:
    args = _parse(argv)
    signal.signal(signal.SIGTERM, _on_term)  # as Ctrl-C: the run under way is killed, mounts and folders undone
    if hear_sigint():
        print("[kvkit] chaos: started with SIGINT ignored (in the background?): restored, so that the runs hear it",
              flush=True)  # fmt: skip
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    faults = draw_faults(args.faults, seed, args.kinds)
    root = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="kvkit-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        ctx = _context(root, args, seed, faults)
        inject.warm_up(ctx, with_ray=any(f.category == RAY_WORKER for f in faults))
        rows = [_say(inject.run_clean(ctx, s)) for s in dict.fromkeys(f.scenario for f in faults)]
        rows += [_say(_one(ctx, f)) for f in faults]
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    wall = time.monotonic() - t0
    print(format_rows(rows))
    print()
    print(format_table(rows))
    short = shortfall(rows)
    print()
    print(summary_line(rows, seed, wall))
    for line in short:
        print(f"shortfall: {line}")
    if args.keep:
        print(f"runs kept in {root}")
    return EXIT_MISMATCH if short else EXIT_OK


def _context(root: Path, args, seed: int, faults: list[Fault]) -> Context:
    layout = Layout(root)
    prepare(layout, sys.executable)
    reaper = procs.become_subreaper()
    kinds = {f.category for f in faults}
    disk = sandbox.disk_mechanism(root) if DISK_FULL in kinds else ""
    unwritable = sandbox.unwritable_mechanism(root) if UNWRITABLE in kinds else None
    print(f"[kvkit] chaos: seed {seed}, {len(faults)} faults; work folder {root}", flush=True)
    print(f"[kvkit] chaos: orphans found as {'descendants of this subreaper and ' if reaper else ''}"
          "every process seen in a run's tree", flush=True)  # fmt: skip
    if disk:
        print(f"[kvkit] chaos: a full disk is {disk}", flush=True)
    if UNWRITABLE in kinds:
        print(f"[kvkit] chaos: an unwritable folder is {unwritable or 'impossible here (root ignores modes)'}",
              flush=True)  # fmt: skip
    return Context(layout, sys.executable, args.ray_python, os.getpid() if reaper else None, disk, unwritable)


def _one(ctx: Context, fault: Fault) -> Outcome:
    if fault.category == UNWRITABLE and ctx.unwritable is None:
        return Outcome(fault, fault.scenario, problems=["no way to make a folder unwritable on this machine"])
    return inject.run_fault(ctx, fault)


def _say(row: Outcome) -> Outcome:
    what = row.fault.label if row.fault else f"clean {row.scenario}"
    n = f"{row.fault.index}" if row.fault else "-"
    status = "ok" if not row.problems else "SHORTFALL: " + "; ".join(row.problems)
    print(f"[kvkit] chaos {n} {what}: {row.named or row.seen} · {row.report} · {row.wall_s:.1f} s · {status}"[:400],
          flush=True)  # fmt: skip
    return row


def format_rows(rows: list[Outcome]) -> str:
    """One line per run: the fault, when it hit, what it hit, the exit code, the kit's named failure,
    the report after it, the processes left, and whether every check held."""
    head = f"{'#':>3}  {'fault':<22} {'run':<9} {'at s':>6}  {'target':<20} {'exit':>4}  {'named failure':<44} " \
           f"{'report':<10} {'left':>4}  ok"  # fmt: skip
    lines = [head]
    for r in rows:
        n = str(r.fault.index) if r.fault else "-"
        what = r.fault.label if r.fault else "(clean run)"
        at = f"{r.at_s:.1f}" if r.at_s is not None else "-"
        state = r.report.split(": ")[1].split(";")[0] if ": " in r.report else r.report
        named = (r.named or "UNNAMED: " + r.seen)[:44]
        ok = "yes" if not r.problems else "NO"
        lines.append(f"{n:>3}  {what:<22} {r.scenario:<9} {at:>6}  {r.target[:20]:<20} {r.rc!s:>4}  {named:<44} "
                     f"{state:<10} {len(r.orphans):>4}  {ok}")  # fmt: skip
    return "\n".join(lines)


def _outcome_class(r: Outcome) -> str:
    if r.named is None:
        return "unnamed"
    return r.named.split(" (")[0].split(":")[0]


def format_table(rows: list[Outcome]) -> str:
    """Fault x outcome, as a Markdown table: per fault kind, how often each named outcome came, the
    processes left, the partial reports and the failures the kit did not name."""
    faults = [r for r in rows if r.fault]
    kinds = list(dict.fromkeys(r.fault.label for r in sorted(faults, key=lambda r: r.fault.label)))
    lines = ["| fault | runs | outcome (as the kit named it) × runs | orphans | partial reports | unnamed |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for kind in kinds:
        these = [r for r in faults if r.fault.label == kind]
        outcomes = Counter(_outcome_class(r) for r in these)
        said = ", ".join(f"{name} ×{n}" for name, n in sorted(outcomes.items()))
        lines.append(f"| {kind} | {len(these)} | {said} | {sum(len(r.orphans) for r in these)} | "
                     f"{sum(_partial(r) for r in these)} | {sum(r.named is None for r in these)} |")  # fmt: skip
    return "\n".join(lines)


def _partial(r: Outcome) -> int:
    return sum(p.startswith("partial report") for p in r.problems)


def summary_line(rows: list[Outcome], seed: int, wall: float) -> str:
    faults = [r for r in rows if r.fault]
    landed = sum(r.landed for r in faults)
    return (f"chaos: {len(faults)} faults ({landed} landed, {len(faults) - landed} missed: the run had ended), "
            f"{sum(len(r.orphans) for r in rows)} orphans, {sum(_partial(r) for r in rows)} partial reports, "
            f"{sum(r.fault is not None and r.named is None for r in rows)} unnamed failures; seed {seed}; "
            f"wall {wall:.0f} s")  # fmt: skip


def shortfall(rows: list[Outcome]) -> list[str]:
    """Every check that did not hold, one line each (the clean runs' included)."""
    out = []
    for r in rows:
        where = f"fault {r.fault.index} ({r.fault.label}, {r.scenario})" if r.fault else f"clean {r.scenario} run"
        out += [f"{where}: {p}"[:400] for p in r.problems]
    return out
