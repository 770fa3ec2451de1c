"""`python -m repro.watch versions|run`: what make watch asks the package index before it builds anything, and the
watch itself in the engine interpreter (make watch runs both: tasks.py)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from repro.commands import ArgumentParser
from repro.errors import EXIT_RUNTIME, UsageError
from repro.paths import KIT_ROOT
from repro.plan.interpreter import probe_python
from repro.record.provenance import study_provenance, utc_now
from repro.watch import index as idx
from repro.watch.comparison import NEW_FINDING, compare_runs, format_line, watch_exit_code
from repro.watch.outcome import RunOutcome
from repro.watch.result import WATCH_DIR, Baseline, claim_folder, find_baseline, watch_document, write_new_json
from repro.watch.runner import execute_run, relative, say, write_issue
from repro.watch.stack import (
    CPU,
    GPU,
    STACK_PACKAGES,
    STACKS,
    WatchRun,
    has_cuda,
    not_run_lines,
    plan_cpu_runs,
    plan_gpu_runs,
)

RUN_TIMEOUT_S = 3 * 3600.0  # one verifier run of the watch: the verifier's own per-arm limits come first


def versions(argv: list[str], ask: Callable[[str], idx.IndexAnswer] | None = None) -> int:
    """`python -m repro.watch versions [--vllm-cpu V] [--vllm V] [--lmcache V]`: each watched package's version to
    run (the one asked for, else the index's newest) as one JSON object; one line and exit 2 for a package or
    version the index does not publish, exit 3 when the index cannot be asked."""
    parser = ArgumentParser(prog="python -m repro.watch versions", description=versions.__doc__)
    for package in idx.WATCHED:
        parser.add_argument(
            f"--{package}", default="", metavar="VERSION", help=f"{package}'s version (default: newest)"
        )
    args = vars(parser.parse_args(argv))
    ask = ask or idx.ask_index
    out = {}
    for package in idx.WATCHED:
        asked = args[package.replace("-", "_")].strip()
        try:
            answer = ask(package)
        except idx.IndexUnreachable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_RUNTIME
        out[package] = {"asked": asked, "version": answer.pick(asked), "newest": answer.newest,
                        "listed": len(answer.versions), "source": idx.SOURCE}  # fmt: skip
    print(json.dumps(out, sort_keys=True))
    return 0


def read_index(text: str) -> dict:
    """--index: what `versions` printed (data from another process: checked, never trusted)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--index: not JSON ({exc})") from None
    ok = isinstance(data, dict) and all(
        isinstance(data.get(p), dict) and isinstance(data[p].get("version"), str) for p in idx.WATCHED
    )
    if not ok:
        raise UsageError(
            f"--index: give what `python -m repro.watch versions` prints (each of {', '.join(idx.WATCHED)})"
        )
    return data


def stack_versions(stack: str, python: str, index: Mapping[str, Mapping]) -> dict[str, str]:
    """The versions the stack runs: the CPU's vllm-cpu as picked (the interpreter must hold it); the GPU's vLLM and
    LMCache as PYTHON holds them (a version asked for that PYTHON does not hold is one line, exit 2)."""
    found = probe_python(python)
    if "problem" in found:
        raise UsageError(f"--python {python}: {found['problem']}")
    held = found.get("packages") or {}
    if stack == CPU:
        want = index[idx.VLLM_CPU]["version"]
        if held.get("vllm") != want:
            raise UsageError(f"--python {python}: holds vllm-cpu {held.get('vllm')}, not {want}")
        return {idx.VLLM_CPU: want}
    out = {}
    for package in STACK_PACKAGES[GPU]:
        have, asked = held.get(package), index[package].get("asked")
        if not have:
            raise UsageError(f"PYTHON={python}: {package} is not installed (the GPU watch runs vLLM with LMCache)")
        if asked and asked != have:
            raise UsageError(
                f"{idx.MAKE_NAMES[package]}={asked}: PYTHON={python} holds {package} {have} (the kit installs nothing "
                "into it)"
            )
        out[package] = have
    return out


def stack_label(versions: Mapping[str, str]) -> str:
    """'vllm-cpu 0.32.0', 'vllm 0.34.0 + lmcache 0.5.6'."""
    return " + ".join(f"{p} {v}" for p, v in versions.items())


def header_line(label: str, index: Mapping[str, Mapping], versions: Mapping[str, str], baseline: Baseline | None,
                stack: str) -> str:  # fmt: skip
    newest = ", ".join(f"{p} {index[p]['newest']}" for p in versions if index[p].get("newest") != versions[p])
    note = f" (the index's newest: {newest})" if newest else ""
    if baseline is None:
        return f"{label}{note}: first result for this stack (nothing committed under {WATCH_DIR}/{stack}/)"
    return (f"{label}{note}: against {baseline.path} ({stack_label(baseline.versions)}, {baseline.started_utc}, "
            f"read from {baseline.source})")  # fmt: skip


def run_lines(label: str, runs: tuple[RunOutcome, ...]) -> list[str]:
    """One line a run: how it ended, its wall time and its report."""
    lines = []
    for r in runs:
        ended = "stopped at the timeout" if r.exit_code is None else f"exit {r.exit_code}"
        lines.append(f"{label} · {r.name}: {ended} in {r.wall_s:g} s" + (f" ({r.report})" if r.report else "")
                     + (f" — {r.error}" if r.error else ""))  # fmt: skip
    return lines


def plan_runs(stack: str, model: str, vlm: str, folder: Path) -> tuple[WatchRun, ...]:
    return plan_cpu_runs(model, vlm, folder) if stack == CPU else plan_gpu_runs(model, folder)


def result_stem(started: str, stack: str, versions: Mapping[str, str]) -> str:
    """'2026-12-05T035337Z-vllm-cpu-0.32.0', '…-gpu-vllm-0.34.0-lmcache-0.5.6': the result's dated name."""
    named = "-".join(f"{p}-{v}" if stack == GPU else v for p, v in versions.items())
    return f"{started[:10]}T{started[11:19].replace(':', '')}Z-{stack}-{named}"


def execute_runs(plan: tuple[WatchRun, ...], label: str, python: str, timeout_s: float,
                 execute: Callable[..., RunOutcome]) -> tuple[RunOutcome, ...]:  # fmt: skip
    """The runs one after another (each one's end said on stderr as it comes)."""
    outcomes = []
    for n, r in enumerate(plan, 1):
        say(f"{label}: run {n} of {len(plan)} ({r.name}: {r.what}) ...")
        outcomes.append(execute(r, python, timeout_s))
        say(run_lines(label, (outcomes[-1],))[0])
    return tuple(outcomes)


def run_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="python -m repro.watch run", description=run.__doc__)
    parser.add_argument("--stack", required=True, choices=STACKS)
    parser.add_argument("--python", required=True, help="the engine interpreter (the verifier's --python)")
    parser.add_argument("--index", required=True, help="what `python -m repro.watch versions` printed")
    parser.add_argument("--model", required=True, help="the tiny model's folder (GPU: its float16 seed)")
    parser.add_argument("--vlm", default="", help="the tiny vision-language model's folder (the CPU's image probes)")
    parser.add_argument("--issue-python", default=sys.executable, help="the interpreter that runs repro issue-md")
    parser.add_argument("--out", default=WATCH_DIR, help=f"where the stacks' folders are (default {WATCH_DIR})")
    parser.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S, help="seconds one verifier run may take")
    return parser


def run(argv: list[str], execute: Callable[..., RunOutcome] = execute_run, issue: Callable[..., str] = write_issue,
        cuda: Callable[[], bool] = has_cuda) -> int:  # fmt: skip
    """`python -m repro.watch run --stack vllm-cpu|gpu --python PY --index JSON --model DIR [--vlm DIR]`: the
    stack's runs in PY, each arm against the stack's last committed result; a new dated result under
    reports/watch/<stack>/ and one line per arm. Exit 0: every arm unchanged; 1: something changed; 3: a run
    errored; 2: bad usage (before anything runs or is written)."""
    args = run_parser().parse_args(argv)
    index = read_index(args.index)
    if args.stack == CPU and not args.vlm:
        raise UsageError("--vlm: the CPU stack's image probes need the tiny vision-language model (make-vlm)")
    has_gpu = cuda()
    if args.stack == GPU and not has_gpu:
        raise UsageError("PYTHON= runs the GPU watch: this machine has no CUDA GPU (nvidia-smi lists none)")
    versions_run = stack_versions(args.stack, args.python, index)
    baseline = find_baseline(args.stack)
    label, started = stack_label(versions_run), utc_now()
    out_dir = Path(args.out) if os.path.isabs(args.out) else KIT_ROOT / args.out
    folder = claim_folder(out_dir / args.stack, result_stem(started, args.stack, versions_run))
    plan = plan_runs(args.stack, args.model, args.vlm, folder)
    say(f"{label}: {len(plan)} runs into {relative(folder)}/")
    runs = execute_runs(plan, label, args.python, args.timeout, execute)
    changes = compare_runs(runs, baseline.runs if baseline else None)
    issues = {
        r.name: issue(r.report, folder, r.name, args.issue_python)
        for r in runs
        if r.report and any(c.status == NEW_FINDING and c.new and c.new.run == r.name for c in changes)
    }
    not_run = not_run_lines(args.stack, has_gpu)
    lines = [header_line(label, index, versions_run, baseline, args.stack)]
    lines += [format_line(label, c) for c in changes]
    lines += run_lines(label, runs)
    lines += [f"{label} · {name}: new finding: issue Markdown {path}" for name, path in issues.items()]
    lines += [f"{p} {index[p]['version']}: {why}" for p, why in not_run.items()]
    code = watch_exit_code(changes, runs)
    doc = watch_document(
        stack=args.stack, versions=versions_run, index=index, baseline=baseline.to_json() if baseline else None,
        runs=[r.to_json() for r in runs], changes=[c.to_json() for c in changes],
        not_run=[{"package": p, "version": index[p]["version"], "why": why} for p, why in not_run.items()],
        issues=issues, lines=lines, exit_code=code,
        provenance=study_provenance(["python", "-m", "repro.watch", "run", *argv], dict(os.environ), started,
                                    {"python": args.python, **versions_run}),
    )  # fmt: skip
    result = folder.with_name(folder.name + ".json")
    write_new_json(result, doc)
    print("\n".join(lines), flush=True)
    say(f"wrote {relative(result)} and {relative(folder)}/ (exit {code})")
    return code


WATCH_SUBCOMMANDS = ("versions", "run")


def main(argv: list[str]) -> int:
    """`python -m repro watch versions|run ARGS` (make watch runs both): one line and exit 2 for anything else."""
    if not argv or argv[0] not in WATCH_SUBCOMMANDS:
        raise UsageError(f"usage: python -m repro watch {'|'.join(WATCH_SUBCOMMANDS)} ARGS (make watch runs both)")
    return {"versions": versions, "run": run}[argv[0]](argv[1:])
