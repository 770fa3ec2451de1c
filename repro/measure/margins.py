"""How decisive the baseline's greedy steps are, and how far numerics move them (model calibration; parent side).

`python -m repro.measure.margins --seeds 1-8` runs one engine child per seed (repro.engine.margins) and
prints, per seed, the smallest gap between the top two raw logits relative to the top logit. A
small relative gap is a step that float16 rounding can flip between a cached and an uncached
prefill.

`python -m repro.measure.margins --compare-kernels` runs the cache-off baseline once per variant, each in
its own process: the default kernels twice, ATen held to AVX2, oneDNN held to AVX2, and float16.
It prints, per probe and index, how far each variant moved the top-1/top-2 gap from the first run
(in nats, and in float16 ULPs of the top logit) and where a greedy token flipped; the basis of the
near-tie line (docs/verdicts.md#the-near-tie-line). Both look at the baseline only, never at a
cached run, and assert nothing. `--model DIR --fixture F` measures another model (SmolLM2: its engine
may need `VLLM_CPU_KVCACHE_SPACE=1` when other work holds the memory); `--keep DIR` keeps each variant's
steps, `--load DIR` compares kept steps again without an engine.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from repro.commands import ArgumentParser
from repro.paths import FIXTURES_DIR
from repro.record.atomic import write_bytes_atomic
from repro.run.runner import child_env, run_child

STEPS_MARK = "kvkit-steps "  # the line repro.engine.margins prints its steps on (the same string there)
# (name, dtype, environment): the first is the reference; each runs in a fresh process
VARIANTS = (
    ("default", "float32", {}),
    ("default-again", "float32", {}),
    ("aten-avx2", "float32", {"ATEN_CPU_CAPABILITY": "avx2"}),
    ("onednn-avx2", "float32", {"ONEDNN_MAX_CPU_ISA": "AVX2"}),
    ("float16", "float16", {}),
)
VARIANT_KEYS = {k for _, _, extra in VARIANTS for k in extra}
MANTISSA_BITS = {"float16": 10, "bfloat16": 7, "float32": 23}


def ulp(x: float, dtype: str = "float16") -> float:
    """The spacing of `dtype` numbers at |x| (normal range): 2^(floor(log2|x|) - mantissa bits)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - MANTISSA_BITS[dtype]) if x else 0.0


@dataclass(frozen=True)
class Step:
    """One greedy step of a variant, beside the reference's same step (the same prefix before it)."""

    probe: str
    index: int
    top_logit: float  # the reference's top-1 raw logit
    gap: float  # the reference's top-1 minus top-2 logit: its logprob gap in nats
    delta: float  # the variant's gap minus the reference's
    flipped: bool  # the variant's greedy token differs here

    @property
    def gap_ulps(self) -> float:
        return self.gap / ulp(self.top_logit)


def top_gap(top: list[list]) -> float:
    return top[0][1] - top[1][1]


def compare_steps(reference: dict, variant: dict) -> list[Step]:
    """Every step both runs took from the same prefix: up to and including a probe's first flipped token."""
    steps = []
    for name, ref in reference["probes"].items():
        other = variant["probes"].get(name)
        if other is None:
            continue
        for i, (top_a, top_b) in enumerate(zip(ref["top"], other["top"])):
            flipped = ref["tokens"][i] != other["tokens"][i]
            steps.append(Step(name, i, top_a[0][1], top_gap(top_a), top_gap(top_b) - top_gap(top_a), flipped))
            if flipped:
                break  # later steps condition on different tokens
    return steps


@dataclass(frozen=True)
class Shift:
    """A variant's steps against the reference, summarized."""

    variant: str
    steps: int
    max_abs: float
    max_at: str
    median_abs: float
    max_abs_ulps: float  # the largest |Δgap| in float16 ULPs of that step's top logit
    flips: tuple[str, ...]  # "probe @i (gap g)" of each flipped token


def summarize(variant: str, steps: list[Step]) -> Shift:
    worst = max(steps, key=lambda s: abs(s.delta))
    return Shift(
        variant=variant,
        steps=len(steps),
        max_abs=abs(worst.delta),
        max_at=f"{worst.probe} @{worst.index}",
        median_abs=statistics.median(abs(s.delta) for s in steps),
        max_abs_ulps=max(abs(s.delta) / ulp(s.top_logit) for s in steps),
        flips=tuple(f"{s.probe} @{s.index} (gap {s.gap:.4f})" for s in steps if s.flipped),
    )


def format_comparison(reference: dict, variants: dict[str, dict]) -> str:
    """Per probe and index the reference's top logit and gap, and each variant's Δgap (* where it flipped)."""
    per = {name: {(s.probe, s.index): s for s in compare_steps(reference, v)} for name, v in variants.items()}
    names = list(variants)
    lines = [
        "probe      idx  top-1 logit  gap (nats)  fp16 ulp  gap/ulp  " + "  ".join(f"{n:>13}" for n in names),
    ]
    for probe, ref in reference["probes"].items():
        for i, top in enumerate(ref["top"]):
            x, g = top[0][1], top_gap(top)
            cells = []
            for n in names:
                s = per[n].get((probe, i))
                cells.append(f"{'—' if s is None else f'{s.delta:+.5f}' + ('*' if s.flipped else ' '):>13}")
            lines.append(
                f"{probe:<10} {i:>3}  {x:>11.4f}  {g:>10.5f}  {ulp(x):>8.5f}  {g / ulp(x):>7.1f}  " + "  ".join(cells)
            )
    lines.append("Δgap: the variant's top-1/top-2 gap minus the reference's, nats; * a greedy token flipped there")
    for n in names:
        s = summarize(n, list(per[n].values()))
        flips = ", ".join(s.flips) or "none"
        moved = (
            f"max |Δgap| {s.max_abs:.5f} nats at {s.max_at} ({s.max_abs_ulps:.2f} fp16 ulp), median {s.median_abs:.5f}"
            if s.max_abs
            else "every gap bit-identical"
        )
        lines.append(f"{n}: {s.steps} steps, {moved}; flips: {flips}")
    return "\n".join(lines)


def parse_steps(log_text: str) -> dict | None:
    """The steps an engine child printed (its last STEPS_MARK line), or None."""
    lines = [line for line in log_text.splitlines() if line.startswith(STEPS_MARK)]
    return json.loads(lines[-1][len(STEPS_MARK) :]) if lines else None


def run_variants(model: str, fixture: str, names: list[str], keep: Path | None) -> dict[str, dict]:
    chosen = [v for v in VARIANTS if v[0] in names]
    results = {}
    with tempfile.TemporaryDirectory(prefix="kvkit-margins-") as tmp:
        for name, dtype, extra in chosen:  # one at a time: a variant never shares the cores with another
            log = Path(tmp) / f"{name}.log"
            # a setting of the caller's shell that a variant sets would blur the default runs: dropped
            base = {k: v for k, v in os.environ.items() if k not in VARIANT_KEYS}
            env = child_env(base, hashseed="0", extra=extra)
            run_child(
                [sys.executable, "-m", "repro.engine.margins", "steps", model, fixture, dtype],
                log_path=log,
                env=env,
                timeout_s=900,
            )
            steps = parse_steps(log.read_text(errors="replace"))
            if steps is None:
                print(f"{name}: no result; the engine log's tail:\n{log.read_text(errors='replace')[-3000:]}")
                continue
            steps.update(variant=name, environment=extra)
            print(f"{name}: {steps['dtype']}, ATen {steps['cpu_capability']}, {extra or 'default environment'}")
            results[name] = steps
            if keep is not None:
                write_bytes_atomic(keep / f"{name}.json", (json.dumps(steps, indent=2, sort_keys=True) + "\n").encode())
    return results


def compare_kernels(args) -> int:
    names = [n for n, _, _ in VARIANTS] if args.variants is None else args.variants.split(",")
    unknown = set(names) - {n for n, _, _ in VARIANTS}
    if unknown:
        print(f"unknown variant(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    if args.load:
        missing = [n for n in names if not (Path(args.load) / f"{n}.json").is_file()]
        if missing:
            print(f"{args.load}: no steps kept for {', '.join(missing)}", file=sys.stderr)
            return 2
        results = {n: json.loads((Path(args.load) / f"{n}.json").read_text()) for n in names}
    else:
        keep = Path(args.keep) if args.keep else None
        if keep:
            keep.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="kvkit-margins-model-") as tmp:
            model = args.model
            if model is None:  # the self-test's tiny model
                from repro.models.tiny import MODEL_SEED, make_tiny_model

                model = str(Path(tmp) / "tiny")
                make_tiny_model(Path(model), seed=MODEL_SEED)
            results = run_variants(model, args.fixture, names, keep)
    if len(results) < 2:
        print("fewer than two variants gave a result: nothing to compare", file=sys.stderr)
        return 3
    reference, *others = results
    print(f"reference: {reference}")
    print(format_comparison(results[reference], {n: results[n] for n in others}))
    return 0


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="python -m repro.measure.margins")
    p.add_argument("--seeds", default="1-8", help="a range like 1-8")
    p.add_argument("--fixture", default=str(FIXTURES_DIR / "selftest-cpu.json"))
    p.add_argument(
        "--compare-kernels", action="store_true", help="run the baseline once per variant; print how far gaps moved"
    )
    p.add_argument("--model", default=None, help="with --compare-kernels: a model folder (default: the tiny model)")
    p.add_argument(
        "--variants", default=None, help=f"comma-separated, the first the reference; of {[v[0] for v in VARIANTS]}"
    )
    p.add_argument("--keep", default=None, help="with --compare-kernels: keep each variant's steps as DIR/NAME.json")
    p.add_argument("--load", default=None, help="with --compare-kernels: compare steps kept earlier in DIR, no engine")
    args = p.parse_args(argv)
    if args.compare_kernels:
        return compare_kernels(args)
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
