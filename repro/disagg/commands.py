"""`python -m repro pd`: the P→D cases through a real NixlConnector pair on this host's GPU, into a report.

Bad input is one line and exit 2, before any server starts: the cases file, the model folder, --device cpu (NIXL
needs a CUDA GPU), an engine interpreter without vLLM, without NIXL's bindings or without a CUDA device, and an
earlier run's report, servers' logs or KV audit records where this run would write (unless --force). The exit
code is the kit's one exit rule (repro.record.exit_rule) over the report's requests (repro.disagg.report.exit_view):
0: every probe request PASSed (it matched its baseline with external tokens loaded) and every negative control held;
1: a KV finding of a probe request (with --kv-audit: it loaded another prompt's blocks, or its own misplaced), any
other verdict, or a control that did not hold; 3: any ERROR, a request the pair refused or a server that did not
start or stopped answering (the report says which, with its log's tail, verdict ERROR).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from repro.commands import ArgumentParser
from repro.disagg import report as pd_report
from repro.disagg.audit import clear_records
from repro.disagg.cases import load_cases
from repro.disagg.pair import Run, run_cases
from repro.disagg.servers import NixlPair, PairError, ServeSettings
from repro.errors import UsageError
from repro.judge.verdict import decide_child_failure
from repro.plan.report_path import holds_something, refuse_replacing
from repro.record.exit_rule import exit_reason
from repro.record.provenance import utc_now


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m repro pd", description=__doc__.splitlines()[0])
    p.add_argument("--cases", required=True, help="a kvkit-pd-cases file (fixtures/pd/)")
    p.add_argument("--model", required=True, help="the model folder both engines and the reference load")
    p.add_argument("--report", required=True, help="where the JSON report goes (written atomically)")
    p.add_argument("--python", default=sys.executable, help="the engine interpreter (vLLM, torch and NIXL)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.2, help="each engine's share of the one GPU")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--start-timeout", type=float, default=600.0, help="seconds for each server to become ready")
    p.add_argument("--logs", help="the servers' logs (default: REPORT.logs/)")
    p.add_argument("--kv-audit", metavar="DIR", help="audit the consumer's received KV against the reference's "
                   "(repro.disagg.audit; records in DIR, KV tensors included: not yet run on a GPU)")  # fmt: skip
    p.add_argument("--force", action="store_true", help="replace an earlier run's report, servers' logs and KV audit "
                   "records there (removed before any server starts; default: refuse, exit 2)")  # fmt: skip
    return p


# The pair's servers (repro.disagg.servers.NixlPair names them so), each appending to <logs>/<name>.log
SERVERS = ("reference", "producer", "consumer")


def logs_folder(args) -> Path:
    return Path(args.logs or f"{args.report}.logs")


def check_outputs(args) -> None:
    """Nothing an earlier run wrote is replaced unless --force (one line, exit 2): its report, its logs (a server
    appends to its log) and the KV audit's records (the audit would read them beside this run's); a writeup beside
    the report never (repro.plan.report_path)."""
    if Path(args.report).is_dir():
        raise UsageError(f"--report {args.report}: is a directory")
    refuse_replacing(Path(args.report), args.force, logs=logs_folder(args))
    if args.kv_audit is None:
        return
    folder = Path(args.kv_audit)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--kv-audit {folder}: not a folder")
    if holds_something(folder) and not args.force:
        raise UsageError(
            f"--kv-audit {folder}: an earlier run's records are there (the audit would read them as this run's): "
            "give another folder, or --force to replace them"
        )


def clear_earlier_run(args) -> None:
    """--force, once every check has passed and before any server starts: the earlier report, its servers' logs
    and the audited servers' records go, so that none stands beside this run's or is read as its own (the servers
    write as they run: there is no swap at the end as the verifier's)."""
    Path(args.report).unlink(missing_ok=True)
    for name in SERVERS:
        (logs_folder(args) / f"{name}.log").unlink(missing_ok=True)
    if args.kv_audit is not None:
        clear_records(Path(args.kv_audit))


def check_args(args) -> None:
    if args.device == "cpu":
        raise UsageError("--device cpu: NIXL needs a CUDA GPU (NixlConnector moves KV between GPU engines)")
    if args.trials < 1:
        raise UsageError(f"--trials must be at least 1, not {args.trials}")
    if not 0 < args.gpu_memory_utilization <= 0.5:
        raise UsageError("--gpu-memory-utilization: each of the two engines on one GPU takes at most 0.5")
    if not Path(args.model).is_dir():
        raise UsageError(f"--model {args.model}: not a folder")
    if not Path(args.report).parent.is_dir():
        raise UsageError(f"--report {args.report}: its folder does not exist")
    check_outputs(args)


def pd(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    check_args(args)
    cases = load_cases(args.cases)
    if max(len(t) for t in cases.prompts.values()) + cases.max_tokens > args.max_model_len:
        raise UsageError(
            f"cases file {args.cases}: a prompt and its answer exceed --max-model-len {args.max_model_len}"
        )
    engine = pd_report.probe_engine(args.python)
    if (problem := pd_report.environment_problem(engine)) is not None:
        raise UsageError(problem)
    if args.force:
        clear_earlier_run(args)
    started = utc_now()
    logs = logs_folder(args)
    logs.mkdir(parents=True, exist_ok=True)
    settings = ServeSettings(args.python, args.model, cases.block_size, args.max_model_len,
                             args.gpu_memory_utilization, args.dtype, start_timeout_s=args.start_timeout,
                             kv_audit_dir=args.kv_audit)  # fmt: skip
    pair = NixlPair(settings, logs, dict(os.environ))
    run, failure = Run(), None
    try:
        run_cases(pair, cases, args.trials, lambda line: print(line, file=sys.stderr, flush=True), into=run)
    except (PairError, OSError, ValueError) as exc:
        failure = f"{type(exc).__name__}: {exc}"
    finally:
        pair.close()
    recorded = {"trials": args.trials, "block_size": cases.block_size, "max_tokens": cases.max_tokens,
                "max_model_len": args.max_model_len, "gpu_memory_utilization": args.gpu_memory_utilization,
                "dtype": args.dtype, "model": args.model}  # fmt: skip
    if args.kv_audit:
        recorded["kv_audit"] = True
    prov = pd_report.provenance(argv, dict(os.environ), started, engine)
    report = pd_report.build_report(run, cases, recorded, pair.facts(), prov)
    if failure is not None:
        err = decide_child_failure("pair", failure)
        report |= {"verdict": err.verdict, "reasons": [*err.reasons, *report["reasons"]]}
    pd_report.write_report(args.report, report)
    for line in pd_report.summary_lines(report):
        print(line)
    code, why = exit_reason(pd_report.exit_view(report))  # the kit's one exit rule, over the P→D records
    print(f"exit {code}: {why}")
    return code
