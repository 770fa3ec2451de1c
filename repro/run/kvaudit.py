"""The KV audit's pass over a run's entries: the comparison child (repro.engine.kvcompare) run on the arms'
recorded KV against the baseline's, its figures classed into the entries (repro.judge.kvaudit); --keep-kv
keeps the tensors, else they go with the work directory."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from repro.contract.result import ArmResult
from repro.judge import kvaudit
from repro.plan.settings import ChildSettings, KVAuditSettings
from repro.run import warm
from repro.run.progress import Progress
from repro.run.runner import run_child
from repro.run.workspace import Workspace

COMPARE_MODULE = "repro.engine.kvcompare"


def run_compare(job: dict, work: Path, env: dict, python: str, timeout_s: float) -> tuple[dict | None, str | None]:
    """Run the comparison child; (raw figures, None) or (None, why it failed)."""
    job_path, out_path, log_path = work / "kv-compare.job.json", work / "kv-compare.out.json", work / "kv-compare.log"
    job_path.write_text(json.dumps(job), encoding="utf-8")
    argv = [python, "-m", COMPARE_MODULE, str(job_path), str(out_path)]
    # forked (the warm-import launcher's) where the run's CPU engine children were, from their launcher: the same
    # interpreter and environment, torch imported once (tests/test_warm_launcher.py: the same figures as spawned)
    warm_ok = warm.enabled() and warm.serves(argv, env)
    rc, timed_out, oom, _wall = run_child(argv, log_path=log_path, env=env, timeout_s=timeout_s, warm_ok=warm_ok)
    tail = log_path.read_text(encoding="utf-8", errors="replace")[-600:] if log_path.exists() else ""
    if timed_out:
        return None, f"the KV comparison timed out after {timeout_s:.0f} s"
    if oom:
        return None, "the KV comparison was killed for memory"
    if rc != 0 or not out_path.exists():
        last = tail.strip().splitlines()[-1] if tail.strip() else "no output"
        return None, f"the KV comparison exited {rc}: {last[:300]}"
    try:
        return json.loads(out_path.read_text(encoding="utf-8")), None
    except ValueError as exc:
        return None, f"the KV comparison's output is not JSON: {exc}"


def audit_entries(
    entries: list[dict],
    results: dict[str, ArmResult],
    baseline: ArmResult | None,
    ws: Workspace,
    audit: KVAuditSettings,
    children: ChildSettings,
    block_size: int,
    progress: Progress,
) -> None:
    """The KV audit of these entries (or, with it off, the report saying so where it would speak); results:
    the runs' results by name (those of other runs are left out)."""
    if not audit.enabled:
        kvaudit.annotate(entries, results, None, None, block_size)
        return
    for e in entries:
        if e["name"] in results:
            progress.stage(e["name"], "comparing KV")
    names = {e["name"] for e in entries}
    audited = {n: r for n, r in results.items() if n in names}
    _audit_kv(entries, audited, baseline, ws.work, ws.env, audit.keep_dir, children, block_size)


def _audit_kv(
    entries: list[dict],
    results: dict[str, ArmResult],
    baseline: ArmResult | None,
    work: Path,
    env: dict,
    keep_dir: str | None,
    children: ChildSettings,
    block_size: int,
) -> None:
    """Compare every audited reuse's KV with the baseline's and annotate the entries (the token
    verdicts stay as they are); --keep-kv moves the tensors there, else they go with the work dir."""
    audited = {n: r for n, r in results.items() if r.kv_audit is not None and n != getattr(baseline, "arm", None)}
    raw, problem = None, None
    t0 = time.monotonic()
    if baseline is None or baseline.kv_audit is None:
        problem = "the baseline recorded no reference KV"
    elif audited:
        job = kvaudit.compare_job(baseline, audited)
        python = children.compare_python or children.python
        raw, problem = run_compare(job, work, env, python, timeout_s=children.timeout_s)
    kvaudit.annotate(entries, results, raw, problem, block_size)
    for e in entries:
        if e.get("kv_audit") is not None:
            e["timing"]["kv_compare_s"] = round(time.monotonic() - t0, 3)
    if keep_dir and (work / "kv").exists():
        dest = Path(keep_dir)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(work / "kv", dest, dirs_exist_ok=True)
        print(f"[kvkit] KV audit tensors kept in {dest}", file=sys.stderr, flush=True)
