"""The verification run: arms planned from flags and fixture, children run, report written."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from repro import __version__, logscan
from repro.atomic import write_json_atomic
from repro.cli import DEFAULT_ENGINE_MODULE, Options, fail_usage, parse_args
from repro.errors import EXIT_RUNTIME, EXIT_USAGE, UsageError
from repro.evaluate import judge_arm
from repro.fixtures import Fixture, check_probes_fit, load_fixture
from repro.lmcache_signals import lmcache_findings
from repro.provenance import collect_provenance, hardware_label, utc_now
from repro.report import REPORT_KIND, REPORT_SCHEMA_VERSION, check_acceptance, exit_code, format_summary, generations
from repro.runner import INTERRUPTED, Interrupted, child_env, deferred_signals, run_arm
from repro.suite import build_probes, requests_for
from repro.verdict import ERROR

TMPDIR_TOKEN = "@tmpdir"
HASHSEED = "0"


def plan_arms(opts: Options, fixture: Fixture) -> list[dict]:
    """baseline first, then the connector arm(s), then native; each a job 'arm' record."""
    a = opts.args
    arms = [{"name": "baseline", "mode": "baseline", "connector": None, "skip_probes": {}}]
    if a.kv_connector:
        extra = dict(opts.extra_config)
        if a.kv_connector == "ExampleConnector":
            extra.setdefault("shared_storage_path", TMPDIR_TOKEN)
        if (
            a.kv_connector == "PlantedFaultConnector"
            and a.kv_connector_module_path == "repro.engine.connectors.planted_fault"
        ):
            extra.setdefault("store_dir", TMPDIR_TOKEN)
        arms.append(
            {
                "name": a.kv_connector,
                "mode": "connector",
                "skip_probes": {},
                "connector": {"name": a.kv_connector, "module_path": a.kv_connector_module_path, "extra_config": extra},
            }
        )
    else:
        for spec in fixture.arms:
            arms.append(
                {
                    "name": spec.name,
                    "mode": "connector",
                    "skip_probes": dict(spec.skip_probes),
                    "connector": {
                        "name": spec.connector,
                        "module_path": spec.module_path,
                        "extra_config": dict(spec.extra_config),
                    },
                }
            )
    if a.compare_native:
        arms.append({"name": "native", "mode": "native", "connector": None, "skip_probes": {}})
    if len(arms) == 1:
        raise UsageError(
            "nothing to compare: give --kv-connector or --compare-native (or a fixture that declares arms)"
        )
    return arms


def _materialize(arm: dict, scratch: list[str]) -> dict:
    """Replace @tmpdir in connector settings with a fresh directory for this arm alone."""
    conn = arm.get("connector")
    if not conn:
        return arm
    extra = {}
    for k, v in conn["extra_config"].items():
        if v == TMPDIR_TOKEN:
            v = tempfile.mkdtemp(prefix=f"kvkit-{arm['name']}-")
            scratch.append(v)
        extra[k] = v
    return dict(arm, connector=dict(conn, extra_config=extra))


def _job(opts: Options, arm: dict, probes: list) -> dict:
    a = opts.args
    model = str(Path(a.model).resolve()) if opts.model_is_local else a.model
    return {
        "arm": {k: arm[k] for k in ("name", "mode", "connector")},
        "engine": {
            "model": model,
            "revision": a.model_revision,
            "dtype": a.dtype,
            "seed": a.seed,
            "gpu_memory_utilization": a.gpu_memory_utilization,
            "max_model_len": a.max_model_len,
            "block_size": a.block_size,
            "device": a.device,
        },
        "max_tokens": a.max_tokens,
        "logprobs": a.logprobs,
        "probes": [
            {
                "name": p.name,
                "prompt": p.prompt_spec(),
                "requests": 1 if arm["mode"] == "baseline" else requests_for(p, a.reuses),
            }
            for p in probes
            if p.name not in arm["skip_probes"]
        ],
    }


def _vocab_size(opts: Options) -> int | None:
    if not opts.model_is_local:
        return None
    try:
        return int(json.loads((Path(opts.args.model) / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _arm_entry(arm: dict, outcome, baseline_result: dict | None, block_size: int, logs_rel: str) -> dict:
    entry = {
        "name": arm["name"],
        "mode": arm["mode"],
        "connector": arm["connector"],
        "error": None,
        "log": f"{logs_rel}/{arm['name']}.log",
        "warnings": logscan.count_warnings(outcome.log_text),
        "effective_config": None,
        "versions": None,
        "probes": [],
        "findings": [],
        "timing": {"wall_s": outcome.wall_s},
    }
    res = outcome.result
    if res is not None:
        entry["effective_config"] = res.get("effective_config")
        entry["versions"] = res.get("versions")
        entry["timing"].update({k: res.get(k) for k in ("engine_start_s", "import_s", "generation_s")})
    if outcome.failure is not None:
        entry.update(
            error=outcome.failure, verdict=ERROR, reasons=[f"{outcome.failure['kind']}: {outcome.failure['detail']}"]
        )
        return entry
    probes, verdict, reasons = judge_arm(res, baseline_result, arm["mode"], block_size, arm["skip_probes"])
    entry.update(probes=probes, verdict=verdict, reasons=reasons)
    if arm["connector"] and "lmcache" in arm["connector"]["name"].lower():
        lmcache_findings(entry, outcome.log_text)
    return entry


def run(opts: Options, argv: list[str]) -> int:
    a = opts.args
    fixture = load_fixture(a.fixture)
    probes = build_probes(fixture.probes, a.suite)
    check_probes_fit(
        probes,
        vocab_size=_vocab_size(opts),
        max_model_len=a.max_model_len,
        max_tokens=a.max_tokens,
        where=f"fixture {a.fixture}",
    )
    arms = plan_arms(opts, fixture)
    report_path = Path(a.report)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    started = utc_now()
    extra_env = {"LMCACHE_LOG_LEVEL": os.environ.get("LMCACHE_LOG_LEVEL", "INFO")}  # its hit lines are INFO
    if a.lmcache_config:
        extra_env["LMCACHE_CONFIG_FILE"] = str(Path(a.lmcache_config).resolve())
    env = child_env(dict(os.environ), hashseed=HASHSEED, extra=extra_env)
    work = Path(tempfile.mkdtemp(prefix=f".{report_path.stem}.work-", dir=report_path.parent))
    logs_dir_name = f"{report_path.stem}.logs"
    scratch: list[str] = []
    entries: list[dict] = []
    t0 = time.monotonic()
    try:
        baseline_result = None
        for i, arm in enumerate(arms):
            arm = _materialize(arm, scratch)
            print(f"[kvkit] arm {arm['name']} ({arm['mode']}) ...", file=sys.stderr, flush=True)
            job = dict(_job(opts, arm, probes), fixture_sha256=fixture.sha256)
            if i == 0:
                job.update(_preflight_spec(opts, arms))
            outcome = run_arm(
                job,
                workdir=work,
                log_path=work / f"{arm['name']}.log",
                env=env,
                timeout_s=a.timeout,
                python=a.python,
                module=a.engine_module,
            )
            problems = (outcome.result or {}).get("preflight_problems")
            if problems:
                raise UsageError("; ".join(str(p) for p in problems))
            if arm["mode"] == "baseline" and outcome.failure is None:
                baseline_result = outcome.result
            entries.append(_arm_entry(arm, outcome, baseline_result, a.block_size, logs_dir_name))
            print(
                f"[kvkit] arm {arm['name']}: {entries[-1]['verdict']} ({outcome.wall_s:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
        report = _assemble(opts, fixture, entries, argv, env, started, time.monotonic() - t0)
        with deferred_signals():  # logs and report are swapped in together, or not at all
            _publish_logs(work, report_path.parent / logs_dir_name, [e["name"] for e in entries])
            write_json_atomic(report_path, report)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for d in scratch:
            shutil.rmtree(d, ignore_errors=True)
    print(format_summary(report))
    print(f"report: {report_path}", file=sys.stderr)
    return exit_code(report)


def _preflight_spec(opts: Options, arms: list[dict]) -> dict:
    """Connector and device checks for the first child to make once vLLM is imported, before it
    builds an engine: a problem is a usage error (exit 2), and no extra vLLM import is paid."""
    if opts.args.engine_module != DEFAULT_ENGINE_MODULE:
        return {}
    conns = [
        {"arm": arm["name"], "name": arm["connector"]["name"], "module_path": arm["connector"]["module_path"]}
        for arm in arms
        if arm["connector"]
    ]
    return {"preflight": {"connectors": conns, "device": opts.args.device}}


def _publish_logs(work: Path, dest: Path, names: list[str]) -> None:
    """Swap in the new arm logs only once the run completed, so an interrupted run leaves the
    previous report's logs as they were."""
    staged = work / "logs"
    staged.mkdir()
    for n in names:
        src = work / f"{n}.log"
        if src.exists():
            os.replace(src, staged / f"{n}.log")
    old = dest.with_name(dest.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        os.replace(dest, old)
    os.replace(staged, dest)
    shutil.rmtree(old, ignore_errors=True)


def _assemble(
    opts: Options, fixture: Fixture, entries: list[dict], argv: list[str], env: dict, started: str, wall_s: float
) -> dict:
    a = opts.args
    prov = collect_provenance(
        argv=argv,
        env=env,
        started=started,
        fixture_path=a.fixture,
        fixture_sha256=fixture.sha256,
        model=a.model,
        lmcache_config=a.lmcache_config,
    )
    prov["ended_utc"] = utc_now()
    prov["pythonhashseed"] = HASHSEED
    base = next((e for e in entries if e["mode"] == "baseline"), None)
    if base and base.get("versions"):
        prov["engine_versions"] = base["versions"]
    errors = [{"arm": e["name"], **{k: e["error"][k] for k in ("kind", "detail")}} for e in entries if e["error"]]
    warnings = [{"arm": e["name"], "message": m, "count": c} for e in entries for m, c in e["warnings"].items()]
    starts = [e["timing"].get("engine_start_s") for e in entries if e["timing"].get("engine_start_s") is not None]
    report = {
        "kind": REPORT_KIND,
        "schema_version": REPORT_SCHEMA_VERSION,
        "tool_version": __version__,
        "claim_eligible": False,
        "complete": True,
        "fixture": {"name": fixture.name, "tokenizer": fixture.tokenizer, "sha256": fixture.sha256},
        "config": {
            "model": a.model,
            "model_revision": a.model_revision,
            "dtype": a.dtype,
            "block_size": a.block_size,
            "max_tokens": a.max_tokens,
            "max_model_len": a.max_model_len,
            "seed": a.seed,
            "gpu_memory_utilization": a.gpu_memory_utilization,
            "device": a.device,
            "suite": a.suite,
            "compare_native": a.compare_native,
            "reuses": a.reuses,
            "logprobs": a.logprobs,
            "kv_connector": a.kv_connector,
            "kv_connector_module_path": a.kv_connector_module_path,
            "lmcache_config": a.lmcache_config,
            "decoding": "greedy, ignore_eos, enforce_eager",
        },
        "arms": entries,
        "generations": generations(entries),
        "acceptance": check_acceptance(entries, fixture.expected, a.suite),
        "warnings": warnings,
        "errors": errors,
        "hardware_label": hardware_label(prov["hardware"]),
        "provenance": prov,
        # Diagnostics only, for `make bench`: never a performance claim (claim_eligible is false).
        "diagnostics": {"wall_s": round(wall_s, 3), "engine_start_s_sum": round(sum(starts), 3)},
    }
    return report


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)

    def _on_term(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _on_term)
    try:
        opts = parse_args(argv)
        return run(opts, argv)
    except UsageError as exc:
        return fail_usage(exc)
    except (KeyboardInterrupt, Interrupted) as exc:
        print(
            f"error: {INTERRUPTED} ({exc or 'SIGINT'}): children killed; no report written, the previous one is untouched",
            file=sys.stderr,
        )
        return 130
    except OSError as exc:
        print(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return EXIT_RUNTIME if not isinstance(exc, PermissionError) else EXIT_USAGE
    except Exception:  # noqa: BLE001 - a kit bug: say so, keep the traceback, and never exit 0 or 1
        traceback.print_exc()
        print("error: internal error in the kit (traceback above); no report written", file=sys.stderr)
        return EXIT_RUNTIME
