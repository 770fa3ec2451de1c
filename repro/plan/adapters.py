"""LoRA adapters for key-identity probes: a fixture's `adapters` table and `lora` settings read and checked, each
adapter resolved for the run's model, and the request a probe's child sends under it.

A fixture names its adapters by label, each made by the kit from a seed for the run's model (repro.models.lora
writes it under .cache/adapters before any child starts: the same seed, the same bytes, on any machine) or found at
a path (relative to the fixture's folder); a probe runs under one with `"adapter": LABEL`. Each adapter is sent as
vLLM's LoRARequest(lora_name, lora_int_id, path), lora_name the label and lora_int_id its place in the table (from 1)
unless the fixture says otherwise, and load_inplace as vLLM's in-place reload (the same name and id, new weights).

Bad input is one line (exit 2) before any engine starts: a path that does not exist or holds no PEFT adapter, an
adapter whose weights do not fit the run's model (its lora_A / lora_B shapes against the model's config.json; names
are not compared, since a hub id and a local folder of one model differ), an adapter of a rank over max_lora_rank,
and two adapters under one lora_int_id with other weights where the second is no in-place reload.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import dataclass, replace
from pathlib import Path

from repro.errors import UsageError
from repro.paths import KIT_ROOT

DEFAULT_RANK = 8  # a seeded adapter's rank (repro.models.lora)
# Seeded adapters, remade each run; git-ignored, as the models beside them.
ADAPTERS_DIR = KIT_ROOT / ".cache" / "adapters"
# vLLM's LoRAConfig.max_lora_rank values (vllm/config/lora.py, MaxLoRARanks, vLLM 0.28)
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
ADAPTER_KEYS = ("seed", "rank", "path", "lora_name", "lora_int_id", "load_inplace")
LORA_KEYS = ("max_lora_rank", "max_loras")
_MAX_LABEL = 64
_ABSENT = object()  # a key the fixture does not give
# A PEFT LoRA weight's name: ...layers.<i>.<self_attn|mlp>.<module>.lora_<A|B>.weight
_WEIGHT = re.compile(r"\blayers\.(\d+)\.\w+\.(\w+)\.lora_([AB])\.weight$")


@dataclass(frozen=True)
class AdapterSpec:
    """One adapter as the fixture declares it: made from a seed (with a rank) or found at a path."""

    label: str
    lora_name: str
    lora_int_id: int
    seed: int | None = None
    rank: int | None = None
    path: str | None = None
    load_inplace: bool = False

    @property
    def source(self) -> dict:
        return {"seed": self.seed, "rank": self.rank} if self.seed is not None else {"path": self.path}


@dataclass(frozen=True)
class AdapterTable:
    """A fixture's adapters, in its order, and its `lora` settings (None: the kit's default)."""

    adapters: tuple[AdapterSpec, ...]
    max_lora_rank: int | None = None
    max_loras: int | None = None


@dataclass(frozen=True)
class PlannedAdapter:
    """An adapter resolved for the run: where its files are, its rank, and the model folder a seeded one is made
    from (None: found at a path)."""

    spec: AdapterSpec
    path: str
    rank: int
    make_from: str | None = None

    def request(self) -> dict:
        """What a probe's child sends (its prompt spec's "adapter"; repro.engine.adapters)."""
        s = self.spec
        return {"label": s.label, "lora_name": s.lora_name, "lora_int_id": s.lora_int_id, "path": self.path,
                "load_inplace": s.load_inplace}  # fmt: skip


@dataclass(frozen=True)
class AdapterPlan:
    """The run's adapters and the engine's LoRA settings (every arm's, the baseline's included)."""

    adapters: tuple[PlannedAdapter, ...]
    max_lora_rank: int
    max_loras: int

    def engine(self) -> dict:
        """The job's EngineConfig.lora (repro.engine.adapters turns it into vLLM's enable_lora settings)."""
        return {"max_lora_rank": self.max_lora_rank, "max_loras": self.max_loras}


def _fail(path, msg: str) -> UsageError:
    return UsageError(f"fixture {path}: {msg}")


def _int(obj: dict, key: str, where: str, path, least: int) -> int | None:
    value = obj.get(key)  # absent: None; present, it must be an integer (an explicit null is no integer)
    if key in obj and (not isinstance(value, int) or isinstance(value, bool) or value < least):
        raise _fail(path, f"{where}.{key}: must be an integer of at least {least}")
    return value


def _label_problem(label: object) -> str | None:
    if not isinstance(label, str) or not label or len(label) > _MAX_LABEL or not label.isprintable():
        return f"{label!r} must be 1-{_MAX_LABEL} printable characters"
    return None


def _parse_spec(label: str, obj: object, index: int, path) -> AdapterSpec:
    where = f"adapters.{label}"
    if not isinstance(obj, dict):
        raise _fail(path, f"{where}: must be an object")
    unknown = sorted(str(k) for k in obj if k not in ADAPTER_KEYS)
    if unknown:
        raise _fail(path, f"{where}: unknown field {unknown[0]!r} (known: {', '.join(ADAPTER_KEYS)})")
    if ("seed" in obj) == ("path" in obj):
        raise _fail(path, f"{where}: give exactly one of seed (the kit makes it) or path")
    seed, rank = _int(obj, "seed", where, path, 0), _int(obj, "rank", where, path, 1)
    if "path" in obj and (not isinstance(obj["path"], str) or not obj["path"]):
        raise _fail(path, f"{where}.path: must be a non-empty string")
    if rank is not None and seed is None:
        raise _fail(path, f"{where}.rank: only a seeded adapter takes a rank (a path's adapter has its own)")
    name = obj.get("lora_name", label)
    if not isinstance(name, str) or not name:
        raise _fail(path, f"{where}.lora_name: must be a non-empty string")
    inplace = obj.get("load_inplace", False)
    if not isinstance(inplace, bool):
        raise _fail(path, f"{where}.load_inplace: must be true or false")
    lora_id = _int(obj, "lora_int_id", where, path, 1)
    return AdapterSpec(label, name, lora_id or index + 1, seed, rank if seed is None else rank or DEFAULT_RANK,
                       obj.get("path"), inplace)  # fmt: skip


def parse_adapters(data: dict, probes: tuple, path) -> tuple[tuple, AdapterTable | None]:
    """The fixture's `adapters` and `lora` (None when it has neither), and its probes with the adapter each names
    (a probe's `adapter`, a label of the table); every problem is one line (exit 2)."""
    raw, lora = data.get("adapters"), data.get("lora")
    # a key given as null is given (the schema takes no null there): only an absent key is absent
    named = [p.get("adapter", _ABSENT) if isinstance(p, dict) else _ABSENT for p in data.get("probes") or []]
    if "adapters" not in data and "lora" not in data and all(n is _ABSENT for n in named):
        return probes, None
    if data.get("schema_version") == 1:  # a kit older than adapters reads version 1 and would ignore them
        raise _fail(path, "adapters, lora and a probe's adapter need schema_version 2")
    if not isinstance(raw, dict) or not raw:
        raise _fail(path, "adapters: must be an object of label -> adapter (a probe names one, or lora is set)")
    for label in raw:
        if (problem := _label_problem(label)) is not None:
            raise _fail(path, f"adapters: label {problem}")
    specs = tuple(_parse_spec(label, obj, i, path) for i, (label, obj) in enumerate(raw.items()))
    lora = {} if "lora" not in data else lora
    if not isinstance(lora, dict):
        raise _fail(path, "lora: must be an object")
    unknown = sorted(str(k) for k in lora if k not in LORA_KEYS)
    if unknown:
        raise _fail(path, f"lora: unknown field {unknown[0]!r} (known: {', '.join(LORA_KEYS)})")
    rank, loras = _int(lora, "max_lora_rank", "lora", path, 1), _int(lora, "max_loras", "lora", path, 1)
    if rank is not None and rank not in VLLM_MAX_LORA_RANKS:
        raise _fail(
            path, f"lora.max_lora_rank: {rank} is not one vLLM takes ({', '.join(map(str, VLLM_MAX_LORA_RANKS))})"
        )
    _check_ids(specs, path)
    out = list(probes)
    for i, label in enumerate(named):
        if label is _ABSENT:
            continue
        if not isinstance(label, str):
            raise _fail(path, f"probes[{i}].adapter: must be an adapter's label (a string)")
        if label not in raw:
            raise _fail(path, f"probes[{i}].adapter: no adapter {label!r} in the fixture's adapters")
        out[i] = replace(out[i], adapter=label)
    return tuple(out), AdapterTable(specs, rank, loras)


def _check_ids(specs: tuple[AdapterSpec, ...], path) -> None:
    """vLLM keeps the weights first loaded under a lora_int_id: a later adapter under that id with other weights
    is an in-place reload (load_inplace) or a fixture mistake."""
    first: dict[int, AdapterSpec] = {}
    for s in specs:
        seen = first.setdefault(s.lora_int_id, s)
        if seen is not s and seen.source != s.source and not s.load_inplace:
            raise _fail(
                path,
                f"adapters.{s.label}: lora_int_id {s.lora_int_id} is adapter {seen.label}'s, whose weights differ "
                "(vLLM keeps the first loaded under an id; an in-place reload says load_inplace: true)",
            )


def projection_dims(config: dict) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection a LoRA adapter may target, from a model's config.json; KeyError,
    TypeError or ValueError when the config lacks what they need."""
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    dims = {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv_heads * head_dim),
            "v_proj": (hidden, kv_heads * head_dim), "o_proj": (heads * head_dim, hidden)}  # fmt: skip
    if config.get("intermediate_size"):
        mid = int(config["intermediate_size"])
        dims.update(gate_proj=(hidden, mid), up_proj=(hidden, mid), down_proj=(mid, hidden))
    return dims


def resolve(
    table: AdapterTable | None, probes: list, model: str, model_is_local: bool, fixture_path, cache: Path = ADAPTERS_DIR
) -> tuple[list, AdapterPlan | None]:
    """The run's adapters (each checked against the model) and its probes, each carrying the request of the
    adapter it names (Probe.lora); seeded adapters go under cache/<model folder>-<its config.json's digest>/."""
    if table is None:
        return probes, None
    config, config_bytes = _model_config(model, model_is_local)
    planned = tuple(_plan_one(s, model, config, config_bytes, fixture_path, cache) for s in table.adapters)
    top = max(a.rank for a in planned)
    max_rank = table.max_lora_rank or min(r for r in VLLM_MAX_LORA_RANKS if r >= top)
    for a in planned:
        if a.rank > max_rank:
            raise _fail(fixture_path, f"adapter {a.spec.label} has rank {a.rank}, over lora.max_lora_rank {max_rank}")
    by_label = {a.spec.label: a for a in planned}
    probes = [replace(p, lora=by_label[p.adapter].request()) if p.adapter is not None else p for p in probes]
    return probes, AdapterPlan(planned, max_rank, table.max_loras or len(planned))


def _model_config(model: str, local: bool) -> tuple[dict | None, bytes | None]:
    if not local:
        return None, None
    try:
        raw = (Path(model) / "config.json").read_bytes()
        return json.loads(raw.decode("utf-8")), raw
    except (OSError, ValueError):
        return None, None


def _plan_one(spec: AdapterSpec, model: str, config, config_bytes, fixture_path, cache: Path) -> PlannedAdapter:
    if spec.seed is not None:
        if config is None:
            raise UsageError(
                f"adapter {spec.label}: a seeded adapter is made from the model's config.json, and --model {model} "
                "is no local folder with one (give the adapter's path instead)"
            )
        folder = f"{Path(model).name}-{hashlib.sha256(config_bytes).hexdigest()[:12]}"
        dest = Path(cache).resolve() / folder / f"seed{spec.seed}-rank{spec.rank}"
        return PlannedAdapter(spec, str(dest), spec.rank, str(Path(model).resolve()))
    where = Path(spec.path)
    where = (where if where.is_absolute() else Path(fixture_path).resolve().parent / where).resolve()
    if not where.exists():
        raise UsageError(f"adapter {spec.label}: {where} does not exist")
    try:
        adapter_config = json.loads((where / "adapter_config.json").read_text(encoding="utf-8"))
        rank = max([int(adapter_config["r"]), *map(int, (adapter_config.get("rank_pattern") or {}).values())])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(
            f"adapter {spec.label}: {where} holds no readable PEFT LoRA adapter_config.json ({exc})"
        ) from None
    if config is not None and (problem := shape_problem(where, adapter_config, config)) is not None:
        raise UsageError(f"adapter {spec.label} was made for another model than --model {model}: {problem}")
    return PlannedAdapter(spec, str(where), rank)


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Each tensor's shape from a safetensors file's header (no tensor is read)."""
    with open(path, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size).decode("utf-8"))
    return {k: list(v["shape"]) for k, v in header.items() if k != "__metadata__"}


def shape_problem(folder: Path, adapter_config: dict, config: dict) -> str | None:
    """Why an adapter's weights do not fit a model (its config.json), or None: every lora_A is [rank, in] and
    every lora_B [out, rank] of the projection it targets, in a layer the model has. Unknown modules, a config
    without the sizes, or weights in another format than safetensors are not checked."""
    try:
        dims, layers = projection_dims(config), int(config["num_hidden_layers"])
    except (KeyError, TypeError, ValueError):
        return None
    weights = folder / "adapter_model.safetensors"
    if not weights.is_file():
        return None
    try:
        shapes = safetensors_shapes(weights)
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        return f"{weights} is no readable safetensors file ({exc})"
    base = adapter_config.get("base_model_name_or_path")
    named = f" (it names base model {base!r})" if base else ""
    for name, shape in sorted(shapes.items()):
        m = _WEIGHT.search(name)
        if m is None or m.group(2) not in dims or len(shape) != 2:
            continue
        layer, module, which = int(m.group(1)), m.group(2), m.group(3)
        if layer >= layers:
            return f"it adapts layer {layer}, and the model has {layers}{named}"
        d_in, d_out = dims[module]
        side, want, got = ("inputs", d_in, shape[1]) if which == "A" else ("outputs", d_out, shape[0])
        if got != want:
            return (
                f"layer {layer} {module}'s lora_{which} is {shape}, where the model's {module} has {want} {side}{named}"
            )
    return None


def describe(plan: AdapterPlan, probes) -> dict:
    """The report's `adapters`: label -> how it was sent, where it came from, its weights' digest and its probes."""
    out = {}
    for a in plan.adapters:
        s, weights = a.spec, Path(a.path) / "adapter_model.safetensors"
        digest = hashlib.sha256(weights.read_bytes()).hexdigest() if weights.is_file() else None
        out[s.label] = {"lora_name": s.lora_name, "lora_int_id": s.lora_int_id, "load_inplace": s.load_inplace,
                        "rank": a.rank, "source": s.source, "sha256": digest,
                        "probes": [p.name for p in probes if p.adapter == s.label]}  # fmt: skip
    return out
