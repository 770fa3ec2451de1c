"""How decisive the tiny model's greedy steps are, per seed (model calibration; parent side).

`python -m repro.margins --seeds 1-8` runs one engine child per seed (repro.engine.margins) and
prints, per seed, the smallest gap between the top two raw logits relative to the top logit. A
small relative gap is a step that float16 rounding can flip between a cached and an uncached
prefill. Looks at the baseline only.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from repro.commands import ArgumentParser
from repro.paths import FIXTURES_DIR
from repro.runner import child_env, run_child


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="python -m repro.margins")
    p.add_argument("--seeds", default="1-8", help="a range like 1-8")
    p.add_argument("--fixture", default=str(FIXTURES_DIR / "selftest-cpu.json"))
    args = p.parse_args(argv)
    lo, _, hi = args.seeds.partition("-")
    env = child_env(dict(os.environ), hashseed="0", extra={})
    with tempfile.TemporaryDirectory(prefix="kvkit-margins-") as tmp:
        for seed in range(int(lo), int(hi or lo) + 1):  # one process per seed: a fresh engine each
            log = Path(tmp) / f"seed{seed}.log"
            # run_child reaps the engine's own processes, which would otherwise hold a pipe open
            run_child(
                [sys.executable, "-m", "repro.engine.margins", str(seed), args.fixture],
                log_path=log,
                env=env,
                timeout_s=900,
            )
            lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith('{"seed"')]
            print(
                lines[-1] if lines else json.dumps({"seed": seed, "error": "no result; see the engine log"}), flush=True
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
