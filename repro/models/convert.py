"""A packaged GGUF (Llama architecture) converted into a folder vLLM loads: config.json, the weights
dequantized to float16 or bfloat16 as safetensors, the tokenizer and chat template, and kvkit-model.json,
where the weights came from (which provenance copies into every report that uses the folder).

The folder is written into a temporary directory beside it and renamed into place: a conversion that
fails or is interrupted leaves the old folder (or none), never a part of one.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
import time
from importlib import metadata
from pathlib import Path

from repro.errors import UsageError
from repro.models.gguf import GGUFError, GGUFFile, read_gguf
from repro.models.registry import DEFAULT_DTYPE, DTYPES, SOURCE_FILE, PackagedModel, packaged_model
from repro.models.tokenizer import tokenizer_files
from repro.record.provenance import sha256_file

SOURCE_KIND = "kvkit-model-source"
# Version 1: name, title, package {name, version, wheel_sha256} or null, gguf {file, sha256, tensor_types},
# dequantized_from, dtype, converter.
SOURCE_SCHEMA_VERSION = 1
CONVERTER = "repro.models.convert 1"  # bump when the bytes it writes change
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}  # fmt: skip


def hf_name(name: str, n_layers: int) -> str:
    """The Hugging Face Llama name of a GGUF tensor; an unknown one is a GGUFError."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".", 2)
    in_layer = len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) < n_layers
    if in_layer and parts[2] in _LAYER_NAMES:
        return f"model.layers.{int(parts[1])}.{_LAYER_NAMES[parts[2]]}"
    raise GGUFError(f"tensor {name} is not part of a Llama model")


def unpermute(weight, n_head: int):
    """Undo llama.cpp's Q/K row permutation (convert_hf_to_gguf.py LlamaModel.permute).

    llama.cpp rotates adjacent pairs (GPT-J style rope) and its converter reorders each head's rows from
    Hugging Face's halves [x0..x31 | x32..x63] to pairs (x0, x32, x1, x33, ...); this puts them back, so
    the rotate-half rope of HF and vLLM sees the rows it was trained with.
    """
    rows = weight.shape[0]
    return weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def llama_config(gg: GGUFFile, dtype: str) -> dict:
    """config.json from the GGUF's llama.* metadata."""
    if gg.field("general.architecture", str) != "llama":
        raise GGUFError(f"{gg.path}: architecture {gg.metadata['general.architecture']!r} (only llama converts)")

    def num(key: str) -> int:
        return gg.field(f"llama.{key}", int)

    hidden, heads = num("embedding_length"), num("attention.head_count")
    head_dim = gg.metadata.get("llama.rope.dimension_count", hidden // max(heads, 1))
    if heads <= 0 or hidden % heads or head_dim != hidden // heads:
        raise GGUFError(f"{gg.path}: inconsistent attention shape ({hidden} wide, {heads} heads, head dim {head_dim})")
    tokens = gg.field("tokenizer.ggml.tokens", list)
    import numpy as np

    # The shortest decimal that is the same float32 (1e-05, not 9.999999747378752e-06).
    eps = float(np.format_float_scientific(np.float32(gg.field("llama.attention.layer_norm_rms_epsilon", float))))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": gg.metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": gg.metadata.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": gg.metadata.get("tokenizer.ggml.padding_token_id"),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": num("feed_forward_length"),
        "max_position_embeddings": num("context_length"),
        "mlp_bias": False,
        "num_attention_heads": heads,
        "num_hidden_layers": num("block_count"),
        "num_key_value_heads": gg.metadata.get("llama.attention.head_count_kv", heads),
        "rms_norm_eps": eps,
        "rope_scaling": None,
        "rope_theta": float(gg.metadata.get("llama.rope.freq_base", 10000.0)),
        "tie_word_embeddings": not any(t.name == "output.weight" for t in gg.tensors),
        "torch_dtype": dtype,
        "use_cache": True,
        "vocab_size": gg.metadata.get("llama.vocab_size", len(tokens)),
    }


def _expected_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    h, inter, v, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = (v, h)
    per_layer = {
        "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h), "self_attn.v_proj.weight": (kv, h),
        "self_attn.o_proj.weight": (h, q), "mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h),
        "mlp.down_proj.weight": (h, inter),
    }  # fmt: skip
    for i in range(cfg["num_hidden_layers"]):
        out.update({f"model.layers.{i}.{k}": s for k, s in per_layer.items()})
    return out


def tensor_plan(gg: GGUFFile, cfg: dict) -> list[tuple[str, object]]:
    """(HF name, GGUF tensor) for every weight, sorted by name; missing, extra or misshapen is a GGUFError."""
    expected = _expected_shapes(cfg)
    plan = {hf_name(t.name, cfg["num_hidden_layers"]): t for t in gg.tensors}
    missing = sorted(set(expected) - set(plan))
    if missing or len(plan) != len(gg.tensors):
        raise GGUFError(f"{gg.path}: not a complete Llama model ({len(missing)} tensors missing, e.g. {missing[:1]})")
    for name, t in plan.items():
        if tuple(t.shape) != expected[name]:
            raise GGUFError(f"{gg.path}: tensor {t.name} has shape {list(t.shape)}, config says {list(expected[name])}")
    return sorted(plan.items())


SAFETENSORS_DTYPES = {"float16": "F16", "bfloat16": "BF16"}  # both 2 bytes wide


def to_dtype(weights, dtype: str) -> bytes:
    """float32 weights as little-endian float16 or bfloat16 bytes, rounded to nearest even (as torch casts)."""
    import numpy as np

    if not np.isfinite(weights).all():
        raise GGUFError("a tensor holds NaN or infinity")
    if dtype == "float16":
        return weights.astype("<f2").tobytes()
    bits = np.ascontiguousarray(weights, dtype="<f4").view("<u4").astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes()


def converted_weights(gg: GGUFFile, plan: list[tuple[str, object]], cfg: dict, dtype: str):
    """Each weight's bytes in the plan's order, Q and K rows back in HF order."""
    for name, tensor in plan:
        w = gg.read(tensor)
        if name.endswith("q_proj.weight"):
            w = unpermute(w, cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            w = unpermute(w, cfg["num_key_value_heads"])
        yield to_dtype(w, dtype)


def write_safetensors(path: Path, gg: GGUFFile, cfg: dict, dtype: str) -> None:
    """Stream the weights into one safetensors file (sorted JSON header, then the data in that order)."""
    plan = tensor_plan(gg, cfg)
    header: dict[str, object] = {"__metadata__": {"format": "pt", "source": "dequantized GGUF (repro.models)"}}
    offset = 0
    for name, tensor in plan:
        size = tensor.n_elements * 2
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + size]
        }  # fmt: skip
        offset += size
    hbytes = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    hbytes += b" " * (-len(hbytes) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(hbytes)) + hbytes)
        fh.writelines(converted_weights(gg, plan, cfg, dtype))
        fh.flush()
        os.fsync(fh.fileno())


def installed_gguf(model: PackagedModel) -> tuple[Path, dict]:
    """The packaged GGUF in this Python's environment, found without importing the package (its module
    imports the `llm` CLI, which the kit does not install), and the package's pin. Missing or another
    version: one line, exit 2."""
    version, wheel_sha256 = model.pin()
    make = f"`make model MODEL={model.name}` installs it"
    try:
        dist = metadata.distribution(model.package)
    except metadata.PackageNotFoundError:
        raise UsageError(f"{model.package} is not installed in this Python: {make}") from None
    if dist.version != version:
        raise UsageError(f"{model.package} {dist.version} is installed, the kit pins {version}: {make}")
    path = Path(dist.locate_file(model.gguf_file))
    if not path.is_file():
        raise UsageError(f"{model.package} {version} has no {model.gguf_file}: reinstall it ({make})")
    return path, {"name": model.package, "version": version, "wheel_sha256": wheel_sha256}


def source_record(model: PackagedModel, package: dict | None, gg: GGUFFile, digest: str, dtype: str) -> dict:
    types: dict[str, int] = {}
    for t in gg.tensors:
        types[t.type_name] = types.get(t.type_name, 0) + 1
    return {
        "kind": SOURCE_KIND,
        "schema_version": SOURCE_SCHEMA_VERSION,
        "name": model.name,
        "title": model.title,
        "package": package,
        "gguf": {"file": gg.path.name, "sha256": digest, "tensor_types": dict(sorted(types.items()))},
        "dequantized_from": model.quantization,
        "dtype": dtype,
        "converter": CONVERTER,
        "note": f"{model.title}, {model.summary}; not the reference model (Qwen3-0.6B)",
    }


def _writable_parent(dest: Path) -> Path:
    parent = dest.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=f".{dest.name}.probe-", dir=parent)
        os.rmdir(probe)
    except OSError as exc:
        raise UsageError(f"--out {dest}: cannot write into {parent} ({exc.strerror or exc})") from None
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"--out {dest}: exists and is not a directory")
    return parent


def _swap_in(tmp: Path, dest: Path) -> None:
    """Rename the finished folder into place; an older one is moved aside first and removed after."""
    old = None
    if dest.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
        os.replace(dest, old / dest.name)
    os.replace(tmp, dest)
    fd = os.open(dest.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def is_current(dest: Path, gguf_sha256: str, dtype: str) -> bool:
    """A folder this converter already made from the same GGUF and dtype, unchanged since."""
    from repro.models.tiny import digest_dir

    try:
        source = json.loads((dest / SOURCE_FILE).read_text(encoding="utf-8"))
        marker = (dest / "SHA256").read_text().strip()
        return (
            source.get("gguf", {}).get("sha256") == gguf_sha256
            and source.get("dtype") == dtype
            and source.get("converter") == CONVERTER
            and digest_dir(dest) == marker
        )
    except (OSError, ValueError, AttributeError):
        return False


def convert(model: PackagedModel, gguf_path: Path, package: dict | None, dest: Path, dtype: str) -> dict:
    """Convert the GGUF into dest (replacing an older conversion) and say what was done."""
    from repro.models.tiny import digest_dir, json_file_bytes

    parent = _writable_parent(dest)
    started = time.monotonic()
    digest = sha256_file(gguf_path)
    if digest.startswith("unavailable: "):
        raise UsageError(f"{gguf_path}: cannot read it ({digest.removeprefix('unavailable: ')})")
    if package is not None and digest != model.gguf_sha256:
        raise GGUFError(
            f"{gguf_path}: SHA-256 {digest[:12]}… is not the packaged file's {model.gguf_sha256[:12]}… (corrupt "
            f"or altered; reinstall with `make model MODEL={model.name}`)"
        )
    if is_current(dest, digest, dtype):
        return {"folder": str(dest), "sha256": (dest / "SHA256").read_text().strip(), "converted": False}
    gg = read_gguf(gguf_path)
    cfg = llama_config(gg, dtype)
    files = {
        "config.json": cfg,
        "generation_config.json": {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]},
        **tokenizer_files(gg, cfg["max_position_embeddings"]),
        SOURCE_FILE: source_record(model, package, gg, digest, dtype),
    }
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=parent))
    try:
        write_safetensors(tmp / "model.safetensors", gg, cfg, dtype)
        for name, obj in files.items():
            (tmp / name).write_bytes(json_file_bytes(obj))
        folder_digest = digest_dir(tmp)
        (tmp / "SHA256").write_text(folder_digest + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the model from other users of the cache
        _swap_in(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"folder": str(dest), "sha256": folder_digest, "converted": True,
            "seconds": round(time.monotonic() - started, 1)}  # fmt: skip


def main(argv: list[str]) -> int:
    """`python -m repro convert-model NAME`: convert a packaged model's GGUF into a folder vLLM loads."""
    from repro.commands import ArgumentParser

    parser = ArgumentParser(prog="python -m repro convert-model", description=main.__doc__)
    parser.add_argument("name", help="the packaged model (smollm2)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=DEFAULT_DTYPE, help="weights' dtype (float16)")
    parser.add_argument("--out", default=None, help="the folder to write (default: .cache/models/NAME-f16|bf16)")
    parser.add_argument(
        "--gguf", default=None, help="convert this GGUF file instead of the installed package's (recorded as such)"
    )
    args = parser.parse_args(argv)
    model = packaged_model(args.name)
    dest = Path(args.out) if args.out else model.folder(args.dtype)
    if args.gguf:
        gguf_path, package = Path(args.gguf), None
    else:
        gguf_path, package = installed_gguf(model)
    if not gguf_path.is_file():
        raise UsageError(f"--gguf {gguf_path}: {'not a file' if gguf_path.exists() else 'no such file'}")
    done = convert(model, gguf_path, package, dest, args.dtype)
    how = f"converted in {done['seconds']} s" if done["converted"] else "already converted"
    print(f"{done['folder']} ({how}; SHA-256 {done['sha256']})")
    return 0
