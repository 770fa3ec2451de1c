"""The verification run, stage by stage: the plan, read once from the command line and the fixture
(repro.plan.run_plan); the arms, then their trials, run (repro.run.arm_runs); every run judged into its entry
(repro.run.entries) and its KV audited (repro.run.kvaudit); each finding made while sharing a device re-run
alone and judged alike (repro.run.confirm picks them, so it follows the verdicts); the scenarios
(repro.run.scenario_runs); the report assembled (repro.record.assemble) and written with its logs, together or
not at all (repro.record.publish); its summary printed. An interrupt, a full disk or a kit bug ends in one
line and a truthful exit code (_verify)."""

from __future__ import annotations

import contextlib
import signal
import sys
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

from repro.commands import ArgumentParser, run_command, say_error
from repro.errors import EXIT_INTERRUPTED, EXIT_RUNTIME, UsageError
from repro.judge.verdict import hit_count
from repro.models.lora import make_planned
from repro.plan.endpoint import ENDPOINT_ARM, RESET_FLAG, check_endpoints
from repro.plan.options import Options, build_parser, parse_args, validate
from repro.plan.report_path import check_report_path
from repro.plan.run_plan import RunPlan, build_plan
from repro.publish.summary import format_summary
from repro.readmodel import Report, as_report
from repro.record.assemble import assemble
from repro.record.exit_rule import exit_code
from repro.record.publish import publish, serialize
from repro.run.arm_runs import run_arms_and_trials, run_confirmations
from repro.run.confirm import fold_runs, to_confirm
from repro.run.entries import judge_arms, judge_runs
from repro.run.kvaudit import audit_entries
from repro.run.neighbour import LoadError
from repro.run.progress import Progress, choose_mode
from repro.run.runner import INTERRUPTED, Interrupted, deferred_signals
from repro.run.scenario_runs import run_scenarios
from repro.run.workspace import workspace


@dataclass
class RunState:
    """What the run has done so far, so that an interrupt or a crash is reported truthfully."""

    report_path: Path | None = None
    published: dict | None = None  # the report, once it and its logs are on disk


def run(opts: Options, argv: list[str], state: RunState, plan_of=build_plan) -> int:
    """plan -> execute -> judge (a confirmation alone follows the verdicts it confirms) -> record -> summary."""
    plan = plan_of(opts, argv)
    make_planned(plan.inputs.adapters)  # the seeded LoRA adapters its probes run under, before any child
    out, engine, repeats = plan.output, plan.engine, plan.repeats
    state.report_path = out.report
    judging = (engine.block_size, out.logs_rel, engine.batch_invariant)  # how every run is judged into its entry
    with workspace(out.report, out.logs_rel, plan.arms, engine, plan.lmcache, plan.children.python) as ws:
        with Progress([arm.name for arm in ws.arms], choose_mode(out.quiet)) as progress:
            ran = run_arms_and_trials(plan, ws, progress)
            entries, results, baseline = judge_arms(ran.planned, ran.outcomes, ran.jobs.matched, *judging)
            results |= judge_runs(ran.runs, ran.planned, baseline, *judging)

            def audit(these: list[dict], their_results: dict) -> None:  # the KV audit pass over these entries
                audit_entries(these, their_results, baseline, ws, plan.kv_audit, plan.children, engine.block_size,
                              progress)  # fmt: skip

            audit(entries + [r.entry for r in ran.runs], results)
            if todo := to_confirm(entries, ran, ws.clock.sharing, repeats.confirm):
                run_confirmations(ran, todo, engine, progress)
                alone = [r for r in ran.runs if r.trial is None]
                alone_results = judge_runs(alone, ran.planned, baseline, *judging)
                audit([r.entry for r in alone], alone_results)
            fold_runs(entries, ran, ws.clock.sharing, repeats.trials, repeats.confirm)
            for e in entries:
                progress.finish(e["name"], e["verdict"])
            scen = run_scenarios(plan, ws, baseline, progress)
        report = assemble(plan, ws, entries, ran, scen)
        data = serialize(report)  # checked before anything on disk changes
        logs = [e["name"] for e in entries] + ran.names() + ([ran.load_name] if ran.load_name else [])
        logs += scen.names if scen is not None else []
        with deferred_signals():  # logs and report are swapped in together, or not at all
            publish(out.report, data, ws.work, out.report.parent / out.logs_rel, ws.log_names(logs))
            state.published = report
    print(format_summary(report), flush=True)  # before the report line on stderr, whole: they share a terminal or a log
    print(f"report: {out.report}", file=sys.stderr)
    return exit_code(report)


def _interrupted(state: RunState, why: str) -> int:
    if state.published is not None:  # the signal arrived after the report and its logs were swapped in
        say_error(
            f"{INTERRUPTED} ({why}) after the run completed: {state.report_path} and its logs are the new, "
            "complete report"
        )
        return exit_code(state.published)
    say_error(f"{INTERRUPTED} ({why}): children killed; no report written, the previous one is untouched")
    return EXIT_INTERRUPTED


def _verify(argv: list[str], read=parse_args, plan_of=build_plan, state: RunState | None = None) -> int:
    state = RunState() if state is None else state
    try:
        return run(read(argv), argv, state, plan_of)
    except (KeyboardInterrupt, Interrupted) as exc:
        return _interrupted(state, str(exc) or "SIGINT")
    except UsageError:
        raise  # repro.commands.run_command: one line, exit 2
    except LoadError as exc:  # the neighbour did not start: no arm result is worth a report
        with contextlib.suppress(OSError, ValueError):
            print(exc.log_tail, file=sys.stderr)
        say_error(f"{exc.flag}: {exc}; no report written")
        return EXIT_RUNTIME
    except PermissionError as exc:  # a path the user gave that cannot be written: bad input, not a crash
        raise UsageError(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from None
    except OSError as exc:  # the machine's, not the kit's: a full disk, an I/O error; one line, exit 3
        where = f": {exc.filename}" if exc.filename else ""
        say_error(f"{exc.strerror or exc}{where}; {_written(state)}")
        return EXIT_RUNTIME
    except Exception:  # noqa: BLE001 - a kit bug: say so, keep the traceback, and never exit 0 or 1
        with contextlib.suppress(OSError, ValueError):
            traceback.print_exc()
        say_error(f"internal error in the kit (traceback above); {_written(state)}")
        return EXIT_RUNTIME


def _written(state: RunState) -> str:
    """What an error after the start left on disk, for its one line."""
    return f"{state.report_path} was written before the error" if state.published else "no report written"


def main(argv: list[str] | None = None) -> int:
    """`python -m repro.verify_kv_reuse ARGS`: bad usage 2, OSError 3, interrupt 130 (repro.commands)."""

    def _on_term(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _on_term)
    return run_command(_verify, list(sys.argv[1:] if argv is None else argv))


def _endpoint(argv: list[str]) -> int:
    """`repro endpoint`: the fixture's probes and the acceptance suite's sent to a server the kit did not start and to
    a baseline server, judged as every run is (repro.plan.endpoint checks both first: one line, exit 2, before any
    child)."""
    own = _endpoint_parser().parse_args(argv)
    check_report_path(Path(own.report), Path(own.fixture), own.force)  # before asking the servers
    servers = check_endpoints(own.url, own.baseline_url, own.model, own.reset_prefix_cache)
    state = RunState()
    code = _verify(endpoint_argv(own), endpoint_options(servers), plan_endpoint, state)
    hint = state.published and cold_hit_hint(as_report(state.published), own.url, own.reset_prefix_cache)
    if hint:  # after the summary: how to clear what an earlier run left in the judged server's prefix cache
        print(hint, file=sys.stderr)
    return code


def _endpoint_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m repro endpoint", description=_endpoint.__doc__)
    p.add_argument("--url", required=True, help="the server judged (its reuse on)")
    p.add_argument("--baseline-url", required=True, help="a server of the same model with reuse off: the reference")
    p.add_argument("--model", required=True, help="the model both serve (its tokenizer builds the chat probes)")
    p.add_argument("--fixture", required=True)
    p.add_argument("--report", required=True)
    p.add_argument("--force", action="store_true", help="replace a report already at --report and its logs")
    suite = p.add_mutually_exclusive_group()
    suite.add_argument("--suite", choices=["acceptance"], default=None,
                       help="the probes sent: the fixture's and the acceptance suite's chunk-boundary chat probes "
                       "(the default); no fixture states an endpoint's verdicts, so every one must be PASS")  # fmt: skip
    suite.add_argument("--no-suite", action="store_true", help="send the fixture's probes only")
    p.add_argument("--reset-prefix-cache", action="store_true",
                   help="reset --url's prefix cache (POST /reset_prefix_cache, which vLLM serves only under "
                   "VLLM_SERVER_DEV_MODE=1) before each probe's cold request, so that what an earlier run left there "
                   "is no hit; never done without this flag")  # fmt: skip
    p.add_argument("--max-tokens", default="16")
    p.add_argument("--logprobs", default="5")
    p.add_argument("--reuses", default=None)
    p.add_argument("--timeout", default="1800", help="per arm, seconds")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--stream", action="store_true", help="every request streamed (server-sent events)")
    return p


def endpoint_argv(own) -> list[str]:
    """The verifier's arguments of a `repro endpoint` run (its own parsed arguments): the suite's probes unless
    --no-suite."""
    return ["--model", own.model, "--fixture", own.fixture, "--report", own.report, "--device", "cpu",
            "--compare-native", "--no-native-matched", "--no-kv-audit", "--max-tokens", own.max_tokens,
            "--logprobs", own.logprobs, "--timeout", own.timeout, "--jobs", "2", "--no-confirm",
            *([] if own.no_suite else ["--suite", "acceptance"]), *(["--reuses", own.reuses] if own.reuses else []),
            *(["--quiet"] if own.quiet else []), *(["--stream"] if own.stream else []),
            *(["--force"] if own.force else [])]  # fmt: skip


def endpoint_options(servers: dict[str, str]):
    """The verifier's reading of its arguments, its arms the two servers (what each arm's child reads of its server,
    by arm name: repro.plan.endpoint.check_endpoints)."""

    def read(args: list[str]) -> Options:
        ns = build_parser().parse_args(args)
        ns.frontend, ns.endpoints = "endpoint", servers
        return validate(ns)

    return read


def plan_endpoint(opts: Options, argv: list[str]) -> RunPlan:
    """The run's plan with the suite's probes, judged as a run without the suite: a fixture's expectations name the
    arms it plans (a connector's, native), never a deployment's, so the acceptance check would find the endpoint
    unlisted and every arm of the fixture unrun; every verdict must be PASS instead (the one exit rule's)."""
    plan = build_plan(opts, argv)
    return replace(plan, inputs=replace(plan.inputs, suite=None))


def cold_hit_hint(report: Report, url: str, reset: bool) -> str | None:
    """One line where a cold request of the judged server (at url) reported cached tokens (an earlier run's prompt
    still in its prefix cache: those probes are INCONCLUSIVE), saying how to clear it; None where none did. reset:
    --reset-prefix-cache was given."""
    hit = [p.name for a in report.arms if a.name == ENDPOINT_ARM for p in a.probes
           if p.requests and (hit_count(p.requests[0].cached_tokens) or 0) > 0]  # fmt: skip
    if not hit:
        return None
    head = f"endpoint: {len(hit)} cold request{'s' if len(hit) > 1 else ''} ({', '.join(hit)}) hit {url}'s prefix cache"
    if reset:  # reset before each, and still a hit: a connector's own store, or a reset that failed
        return (f"{head} although it was reset before each (a KV connector's own store is not reset; each reset's "
                "answer is in the report's effective_config.served.prefix_cache_resets): restart that server")  # fmt: skip
    return (f"{head}, left there by an earlier run: restart that server, or run again with {RESET_FLAG} "
            "(the server started with VLLM_SERVER_DEV_MODE=1)")  # fmt: skip


def endpoint_main(argv: list[str] | None = None) -> int:
    """`python -m repro endpoint ARGS`: bad usage and unusable servers 2, an ERROR 3, interrupt 130."""

    def _on_term(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _on_term)
    return run_command(_endpoint, list(sys.argv[1:] if argv is None else argv))
