"""The conversion check, parent side: a converted folder against independent readings of its GGUF.

`python -m repro check-model DIR` runs three engine children (repro.engine.model_check), one process each:
the `gguf` package's dequantize against the kit's reader (every tensor, float32, bit for bit), transformers'
own GGUF loading against the folder's weights (every weight, in the folder's dtype, bit for bit), and greedy
tokens from vLLM on the folder against transformers on the GGUF, on the check prompts. It prints the
figures and one line; exit 0 when everything matched, 1 when something differed.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from repro.errors import EXIT_MISMATCH, EXIT_OK, EXIT_RUNTIME, UsageError
from repro.models.convert import SOURCE_FILE, installed_gguf
from repro.models.registry import packaged_model
from repro.paths import FIXTURES_DIR, KIT_ROOT

STEPS = ("tensors", "transformers", "vllm")
STEP_TIMEOUT_S = 900


def run_step(step: str, folder: Path, gguf: Path, fixture: str | None, work: Path) -> dict:
    """One engine child; its JSON result, or {"error": "<one line>"} with its log's last line."""
    from repro.run.runner import child_env, run_child

    out, log = work / f"{step}.json", work / f"{step}.log"
    argv = [sys.executable, "-m", "repro.engine.model_check", step, str(folder), str(gguf), str(out)]
    env = child_env(dict(os.environ), hashseed="0", extra={"PYTHONPATH": str(KIT_ROOT)})
    code, timed_out, _, wall = run_child(argv + ([fixture] if fixture else []), log_path=log, env=env,
                                         timeout_s=STEP_TIMEOUT_S)  # fmt: skip
    if code == 0 and out.is_file():
        return {**json.loads(out.read_text(encoding="utf-8")), "wall_s": round(wall, 1)}
    tail = (log.read_text(errors="replace").strip().splitlines() or ["no output"])[-1][:300]
    return {"error": f"{step}: {'timed out' if timed_out else f'exit {code}'} ({tail})"}


def compare_runs(vllm: dict, hf: dict) -> dict:
    """Per prompt: same prompt IDs, identical greedy tokens, first differing index, top-1 logprob gap."""
    out = {}
    for name, v in vllm.items():
        h = hf.get(name)
        if h is None:
            out[name] = {"match": False, "why": "transformers did not run it"}
            continue
        diff = next((i for i, (a, b) in enumerate(zip(v["tokens"], h["tokens"])) if a != b), None)
        same = v["prompt_ids"] == h["prompt_ids"] and v["tokens"] == h["tokens"]
        common = v["logprobs"][: diff if diff is not None else len(v["logprobs"])]
        gaps = [abs(a - b) for a, b in zip(common, h["logprobs"])]
        out[name] = {
            "match": same,
            "prompt_tokens": len(v["prompt_ids"]),
            "first_diff": diff,
            "max_logprob_gap": max(gaps) if gaps else None,
            "text": v.get("text", ""),
        }
    return out


def summarize(results: dict) -> dict:
    """The check's figures, and whether every step that ran matched (the greedy comparison needs both
    transformers and vLLM)."""
    figures: dict[str, object] = {}
    errors = [r["error"] for r in results.values() if "error" in r]
    t = results.get("tensors", {})
    if "tensors" in t:
        figures["gguf_dequantize"] = (
            f"{sum(r['identical'] for r in t['tensors'])}/{len(t['tensors'])} tensors identical"
        )
    h = results.get("transformers", {})
    if "weights" in h:
        same = sum(r["identical"] for r in h["weights"])
        figures["transformers_weights"] = f"{same}/{len(h['weights'])} weights identical"
        figures["transformers_unmatched"] = h["unmatched"]
    v = results.get("vllm", {})
    if "runs" in v and "runs" in h:
        figures["greedy"] = compare_runs(v["runs"], h["runs"])
    oks = {
        "tensors": bool(t.get("tensors")) and all(r["identical"] for r in t["tensors"]),
        "transformers": bool(h.get("weights")) and all(r["identical"] for r in h["weights"]) and not h["unmatched"],
        "vllm": bool(figures.get("greedy")) and all(g["match"] for g in figures["greedy"].values()),
    }
    matched = not errors and all(oks[step] for step in results)
    versions = {k: r.get(k) for k, r in (("gguf_package", t), ("transformers", h), ("vllm", v)) if r.get(k)}
    walls = {k: r.get("wall_s") for k, r in results.items() if "wall_s" in r}
    return {"matched": matched, "errors": errors, "figures": figures, "versions": versions, "wall_s": walls}


def resolve(folder: Path, gguf: str | None) -> Path:
    """The GGUF a folder was converted from: --gguf, else the installed package its kvkit-model.json names."""
    if gguf:
        return Path(gguf)
    try:
        source = json.loads((folder / SOURCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UsageError(f"{folder}: no readable {SOURCE_FILE} (not a converted model; give --gguf)") from None
    return installed_gguf(packaged_model(str(source.get("name"))))[0]


def main(argv: list[str]) -> int:
    """`python -m repro check-model DIR`: check a converted folder against independent readings of its GGUF."""
    from repro.commands import ArgumentParser
    from repro.record.atomic import dumps_json

    p = ArgumentParser(prog="python -m repro check-model", description=main.__doc__)
    p.add_argument("folder", help="a folder convert-model wrote")
    p.add_argument("--gguf", default=None, help="the GGUF it came from (default: the installed package's)")
    p.add_argument("--fixture", default=str(FIXTURES_DIR / "smollm2-cpu.json"), help="its chat probes join the check")
    p.add_argument("--steps", default=",".join(STEPS), help=f"which checks ({','.join(STEPS)})")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures to FILE")
    args = p.parse_args(argv)
    folder = Path(args.folder)
    if not (folder / "config.json").is_file():
        raise UsageError(f"{folder}: no config.json (convert it first: python -m repro convert-model NAME)")
    steps = [s for s in args.steps.split(",") if s]
    if not steps or set(steps) - set(STEPS):
        raise UsageError(f"--steps: choose from {','.join(STEPS)}")
    if "vllm" in steps and "transformers" not in steps:
        raise UsageError("--steps: vllm's tokens are compared with transformers' (add transformers)")
    gguf = resolve(folder, args.gguf)
    with tempfile.TemporaryDirectory(prefix="kvkit-model-check-") as tmp:
        results = {s: run_step(s, folder.resolve(), gguf, args.fixture, Path(tmp)) for s in steps}
    summary = summarize(results)
    text = dumps_json(summary)
    if args.json:
        from repro.record.atomic import write_bytes_atomic

        write_bytes_atomic(args.json, text.encode("utf-8"))
    print(text, end="")
    for error in summary["errors"]:
        print(f"error: {error}", file=sys.stderr)
    if summary["errors"]:
        return EXIT_RUNTIME
    return EXIT_OK if summary["matched"] else EXIT_MISMATCH
