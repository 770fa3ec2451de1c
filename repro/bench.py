"""`make bench`: time the CPU acceptance once and print figures (a benchmark, not a test).

The kit's cost model is one engine per arm whatever the number of probes, so the wall time of a
whole run should be close to the sum of the engine start times measured inside the children
(target ratio: 1.25 or less). These figures describe the kit, never the engines under test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from repro.cli import SELFTEST_CPU_FIXTURE, selftest_cpu_argv
from repro.commands import ArgumentParser

TARGET_RATIO = 1.25


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="python -m repro bench")
    p.add_argument("--model", required=True)
    p.add_argument("--fixture", default=SELFTEST_CPU_FIXTURE)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvkit-bench-") as tmp:
        report = Path(tmp) / "bench.json"
        cmd = [sys.executable, "-m", "repro.verify_kv_reuse", *selftest_cpu_argv(args.model, str(report), args.fixture)]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False)
        wall = time.monotonic() - t0
        if not report.exists():
            print(f"bench: the run wrote no report (exit {proc.returncode})", file=sys.stderr)
            return 3
        data = json.loads(report.read_text())
    arms = data["arms"]
    starts = [a["timing"].get("engine_start_s") or 0.0 for a in arms]
    total = sum(starts)
    print(f"arms: {len(arms)}  probes/arm: {max(len(a['probes']) for a in arms)}  generations: {data['generations']}")
    for a, s in zip(arms, starts):
        t = a["timing"]
        print(
            f"  {a['name']:<18} engine start {s:6.1f} s   generation {t.get('generation_s') or 0:5.1f} s   child wall {t['wall_s']:6.1f} s"
        )
    ratio = wall / total if total else float("inf")
    print(f"wall time: {wall:.1f} s")
    print(f"sum of engine starts (inside children): {total:.1f} s")
    print(
        f"ratio wall / engine starts: {ratio:.3f}  (target <= {TARGET_RATIO}: {'met' if ratio <= TARGET_RATIO else 'NOT met'})"
    )
    print("figures describe the kit's own overhead; claim_eligible=false, no performance claim")
    return 0 if proc.returncode == 0 else proc.returncode
