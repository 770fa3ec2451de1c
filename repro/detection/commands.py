"""`python -m repro detection` and `detection-site`: flags, the run or the load, the page and the exit code."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from repro.commands import ArgumentParser
from repro.detection import plan
from repro.detection.matrix import summarize
from repro.detection.page import load_matrix, write_page
from repro.detection.run import run_detection
from repro.errors import EXIT_MISMATCH, EXIT_OK, EXIT_RUNTIME, UsageError
from repro.plan.report_path import refuse_replacing


def _fault_kinds(text: str) -> tuple[str, ...]:
    faults = tuple(f for f in text.split(",") if f)
    unknown = [f for f in faults if f not in plan.study_faults()]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown fault kind(s) {', '.join(unknown)}; choose from {', '.join(plan.study_faults())}"
        )
    return faults


def _seeds(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(",") if s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"model seeds must be integers, comma separated: {text!r}") from None


def _parser(command: str) -> ArgumentParser:
    p = ArgumentParser(prog=f"python -m repro {command}")
    p.add_argument(
        "--model",
        default=None,
        help="a packaged trained model (smollm2; `make model MODEL=smollm2` converts it): the study of that model, "
        "its report and page beside the tiny model's (default: the tiny models)",
    )
    report, site = plan.default_paths(None)
    p.add_argument(
        "--report",
        default=None,
        help=f"the matrix report (default {report}; with --model NAME {plan.default_paths('NAME')[0]})",
    )
    p.add_argument(
        "--site", default=None, help=f"the page (default {site}; with --model NAME {plan.default_paths('NAME')[1]})"
    )
    return p


def _parse(p: ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The flags, with --report and --site defaulting to --model's pair."""
    a = p.parse_args(argv)
    report, site = plan.default_paths(a.model)
    a.report, a.site = a.report or report, a.site or site
    return a


def _publish(report: dict, report_path: str, site_path: str) -> int:
    """Write the page, print the summary (recomputed from the entries) and return the exit code."""
    write_page(report, Path(site_path))
    s = summarize(report["faults"], report["controls"], bool(report["prefix_check"].get("ok")))
    per_window = ",".join(f"{w}:{n}" for w, n in s["false_positives_by_window"].items())
    print(
        f"detection: every fault detected={s['every_fault_detected']} "
        f"(on every probe of some cell: {s['every_fault_reliably_detected']}) "
        f"false_positives={s['false_positives']} (per window {per_window}) "
        f"control reuses exercised={s['control_reuses_exercised']} prefix_check={s['prefix_check_ok']} "
        f"errors={len(s['arm_errors'])}"
    )
    kv = s["kv_audit"]
    if kv["present"]:
        print(
            f"kv audit: blamed exactly {kv['blamed_exactly']}/{kv['fault_probes']} "
            f"(tokens unchanged, blamed exactly: {kv['tokens_unchanged_blamed_exactly']}/{kv['tokens_unchanged']}) "
            f"false_blames={kv['false_blames']} control probes not audited={kv['control_unavailable']}"
        )
        for m in kv["mismatches"]:
            print(f"  not blamed exactly: {m}")
    else:
        print("kv audit: absent (a matrix made before the audit)")
    replays = s["replays"]
    if replays["present"]:
        print(
            f"replays: {replays['replaying_another']}/{replays['divergent_reuses']} divergent reuses replay another "
            f"prompt's answer ({replays['naming_the_served_prompt']} naming the prompt whose KV the audit found; "
            f"{replays['replaying_own_earlier']} only an earlier request of their own), "
            f"in the controls: {replays['control_replaying']}"
        )
    else:
        print("replays: not counted (a matrix made before replays were counted)")
    for cell in s["not_fully_detected_cells"]:
        print(f"  not fully detected: {cell}")
    if "expectations" in s:  # the catalogue's rows (repro.detection.catalogue)
        e = s["expectations"]
        print(f"failures reported as success: expectations held in {e['held']}/{e['rows']} rows")
        for row, check in e["by_row"].items():
            for miss in check["misses"]:
                print(f"  {row} did not hold: {miss}")
    print(f"report: {report_path}\npage: {site_path}", file=sys.stderr)
    if s["ok"]:
        return EXIT_OK
    return EXIT_RUNTIME if s["arm_errors"] else EXIT_MISMATCH


def detection(argv: list[str]) -> int:
    """Run every fault arm and control on the CPU engine, write the matrix report and its page."""
    p = _parser("detection")
    p.add_argument(
        "--models-dir",
        default=".cache/models",
        help="where the tiny models are generated and a packaged model was converted",
    )
    p.add_argument(
        "--seeds",
        type=_seeds,
        default=None,
        help=f"control model seeds of the tiny models, comma separated (default {plan.CONTROL_MODEL_SEEDS}; "
        "not with --model)",
    )
    p.add_argument(
        "--faults",
        type=_fault_kinds,
        default=plan.study_faults(),
        help="fault kinds, comma separated (default: every one, the catalogue's rows of failures reported as success "
        "included; late_load brings the asynchronous path's control beside the other controls)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per arm")
    p.add_argument(
        "--scenarios",
        action="store_true",
        help="instead: which planted faults each workload scenario catches that plain probes miss (rows x scenario "
        "columns, the tiny model; writes reports/detection/detection-scenarios.json and its page)",
    )
    p.add_argument(
        "--force", action="store_true", help="replace a study report already at --report (default: refuse, exit 2)"
    )
    if "--scenarios" in argv:
        return detection_scenarios(p, argv)
    a = _parse(p, argv)
    if a.model is not None and a.seeds is not None:
        raise UsageError("--seeds picks tiny models; --model runs one packaged model (give one of them)")
    refuse_replacing(Path(a.report), a.force)  # before any model is made or engine started
    report = run_detection(
        Path(a.report),
        Path(a.models_dir),
        plan.CONTROL_MODEL_SEEDS if a.seeds is None else a.seeds,
        a.faults,
        a.timeout,
        ["detection", *argv],
        a.model,
    )
    return _publish(report, a.report, a.site)


def detection_site(argv: list[str]) -> int:
    """Render the page from an existing matrix report (with --scenarios: the scenario study's report)."""
    p = _parser("detection-site")
    p.add_argument("--scenarios", action="store_true", help="the scenario study's report and page instead")
    if "--scenarios" in argv:
        from repro.detection.scenario_page import load_report

        a = p.parse_args(argv)
        report_path, site_path = _scenario_paths(a)
        return _publish_scenarios(load_report(Path(report_path)), report_path, site_path)
    a = _parse(p, argv)
    return _publish(load_matrix(Path(a.report)), a.report, a.site)


def _scenario_paths(a: argparse.Namespace) -> tuple[str, str]:
    from repro.detection.scenarios import scenario_paths

    report, site = scenario_paths()
    return a.report or report, a.site or site


def detection_scenarios(p: ArgumentParser, argv: list[str]) -> int:
    """`python -m repro detection --scenarios`: the scenario columns' study (repro.detection.scenarios)."""
    from repro.detection.scenarios import run_scenario_study

    a = p.parse_args(argv)
    if a.model is not None or a.seeds is not None or "--faults" in argv:
        raise UsageError("--scenarios runs its own rows on the tiny model (no --model, --seeds or --faults)")
    report_path, site_path = _scenario_paths(a)
    refuse_replacing(Path(report_path), a.force)
    report = run_scenario_study(Path(report_path), Path(a.models_dir), a.timeout, ["detection", *argv])
    return _publish_scenarios(report, report_path, site_path)


def _publish_scenarios(report: dict, report_path: str, site_path: str) -> int:
    """Write the scenario study's page, print what it found and return the exit code: 3 when an arm could not
    be judged, 1 for a false positive or false blame in a no-fault control, else 0 (a hypothesis that did not
    hold is a finding of the study, printed, not a failure of the run)."""
    from repro.detection.scenario_page import write_page as write_scenario_page
    from repro.detection.scenarios import summary

    write_scenario_page(report, Path(site_path))
    s = summary(report)
    print(
        f"detection scenarios: hypothesis held in {s['held']}/{s['cells']} cells; "
        f"false_positives={s['false_positives']} false_blames={s['false_blames']} errors={len(s['errors'])}"
    )
    for line in s["did_not_hold"]:
        print(f"  did not hold: {line}")
    for line in s["undecided"]:
        print(f"  undecided: {line}")
    for line in s["errors"]:
        print(f"  error: {line}")
    print(f"report: {report_path}\npage: {site_path}", file=sys.stderr)
    if s["errors"]:
        return EXIT_RUNTIME
    return EXIT_MISMATCH if s["false_positives"] or s["false_blames"] else EXIT_OK
