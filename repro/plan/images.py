"""Image probes for key identity: a probe's prompt may name an image the kit draws from a seed, which the engine
child sends beside the prompt's token IDs (vLLM's multi_modal_data), read and checked, one line and exit 2 on bad
input.

A prompt's `image` is {"seed": N, "size": [W, H]} and optionally {"processor": {KEY: VALUE}}: the pixels are
numpy's default_rng(N).integers(0, 256, (H, W, 3), uint8), the same bytes on every machine; `processor` is the
request's mm_processor_kwargs (another decode setting for the same bytes, vLLM #49975's shape). The prompt's token
IDs hold the model's image placeholder once (vLLM expands it into the image's tokens).

The child names each image by a digest of its pixels (image_uuid), sent as vLLM's multi_modal_uuids: vLLM's own
image hash covers the model's path (ModelConfig.model, vllm/multimodal/processing/inputs.py, vLLM 0.28), so the
identifier, and two images' 16-bit collision under LMCache 0.5.4's reduction (int16), would differ from one checkout
to another; with the digest they hold on every machine. A request with processor settings is hashed by vLLM again,
settings and model path included (the fix of vLLM #49975).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

from repro.errors import UsageError

KEY = "image"
IMAGE_KEYS = ("seed", "size", "processor")
# mm_processor_kwargs a probe may give: Idefics3's image processor settings that keep the image's token count
PROCESSOR_KEYS = ("do_normalize", "image_mean", "image_std", "resample")
MAX_SIDE = 512
UUID_DOMAIN = b"kvkit-image\0"


def _fail(path, msg: str) -> UsageError:
    return UsageError(f"fixture {path}: {msg}")


def _processor(value: object, where: str, path) -> dict:
    if not isinstance(value, dict) or not value:
        raise _fail(path, f"{where}.processor: must be a non-empty object of mm_processor_kwargs")
    unknown = sorted(str(k) for k in value if k not in PROCESSOR_KEYS)
    if unknown:
        raise _fail(path, f"{where}.processor: unknown setting {unknown[0]!r} (known: {', '.join(PROCESSOR_KEYS)})")
    for k, v in value.items():
        ok = {"do_normalize": lambda x: isinstance(x, bool), "resample": lambda x: x in (0, 1, 2, 3, 4, 5)}.get(
            k, lambda x: isinstance(x, list) and len(x) == 3 and all(isinstance(t, (int, float)) for t in x)
        )
        if isinstance(v, bool) != (k == "do_normalize") or not ok(v):
            raise _fail(path, f"{where}.processor.{k}: {v!r} is no value the image processor takes")
    return dict(sorted(value.items()))


def parse_image(obj: object, where: str, path) -> dict:
    """A prompt's image, checked: {"seed": N, "size": [W, H]} (and "processor" where given)."""
    if not isinstance(obj, dict):
        raise _fail(path, f"{where}: must be an object")
    unknown = sorted(str(k) for k in obj if k not in IMAGE_KEYS)
    if unknown:
        raise _fail(path, f"{where}: unknown field {unknown[0]!r} (known: {', '.join(IMAGE_KEYS)})")
    seed, size = obj.get("seed"), obj.get("size")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise _fail(path, f"{where}.seed: must be an integer of at least 0")
    if not (isinstance(size, list) and len(size) == 2 and all(type(s) is int and 1 <= s <= MAX_SIDE for s in size)):
        raise _fail(path, f"{where}.size: must be [width, height], each an integer from 1 to {MAX_SIDE}")
    out = {"seed": seed, "size": list(size)}
    return out | ({"processor": _processor(obj["processor"], where, path)} if "processor" in obj else {})


def parse_images(data: dict, probes: tuple, path) -> tuple:
    """The fixture's probes with the image each prompt names (None where it names none). A file with images says
    schema_version 4: a kit older than them would send the prompt without its image."""
    out = []
    for i, (raw, probe) in enumerate(zip(data["probes"], probes)):
        prompt = raw["prompt"]
        if KEY not in prompt:
            out.append(probe)
            continue
        where = f"probes[{i}].prompt.{KEY}"
        if data.get("schema_version", 0) < 4:
            raise _fail(path, f"{where}: a prompt's image needs schema_version 4")
        if probe.token_ids is None:
            raise _fail(path, f"{where}: an image goes with a token_ids prompt (holding the image placeholder once)")
        out.append(replace(probe, image=parse_image(prompt[KEY], where, path)))
    return tuple(out)


def image_token_id(model: str) -> int | None:
    """The placeholder token of a local model that takes images (its config.json's image_token_id), else None."""
    try:
        config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(config, dict) and isinstance(config.get("vision_config"), dict)
    token = config.get("image_token_id") if ok else None
    return token if isinstance(token, int) and not isinstance(token, bool) else None


def check_images(probes, model: str, model_is_local: bool) -> None:
    """Every image probe fits the run's model: a local model with a vision config, whose placeholder the prompt
    holds exactly once; one line (exit 2) otherwise."""
    imaged = [p for p in probes if getattr(p, "image", None) is not None]
    if not imaged:
        return
    token = image_token_id(model) if model_is_local else None
    if token is None:
        raise UsageError(
            f"probe {imaged[0].name} names an image and --model {model} takes none (image probes need a local "
            "vision-language model folder whose config.json has a vision_config and an image_token_id: "
            "python -m repro make-vlm DIR)"
        )
    for p in imaged:
        if p.token_ids.count(token) != 1:
            raise UsageError(
                f"probe {p.name}: its token_ids hold the image placeholder {token} {p.token_ids.count(token)} "
                "times (once: vLLM expands it into the image's tokens)"
            )


def check_native_matched(probes, native_matched: bool) -> None:
    """The native-matched control primes a prefix of a probe's token IDs alone; with an image it would prime
    without it: one line (exit 2) that says to leave the control out."""
    imaged = [p.name for p in probes if getattr(p, "image", None) is not None]
    if imaged and native_matched:
        raise UsageError(
            f"probe {imaged[0]} names an image, and the native-matched control primes token prefixes without their "
            "image: pass --no-native-matched (native, --compare-native, is the image probes' control)"
        )


def pixels(image: dict):
    """The image's pixels: an (H, W, 3) uint8 array, the same on every machine for a seed and size."""
    import numpy as np

    width, height = image["size"]
    return np.random.default_rng(image["seed"]).integers(0, 256, (height, width, 3), dtype=np.uint8)


def image_uuid(image: dict) -> str:
    """The image's name as the child sends it (vLLM's multi_modal_uuids): SHA-256 of its size and pixels, hex."""
    width, height = image["size"]
    return hashlib.sha256(UUID_DOMAIN + f"{width}x{height}\0".encode() + pixels(image).tobytes()).hexdigest()


def int16(identifier: str) -> int:
    """LMCache 0.5.4's reduction of a multimodal hash (lmcache/integration/vllm/utils.py hex_hash_to_int16): a hex
    identifier's low 16 bits, which it writes over the image's placeholder tokens as its key's token IDs; another
    string (vLLM's per-request names) the first 16 bits of its SHA-256, as LMCache's defensive version of it does."""
    text = str(identifier).strip()
    digits = text[2:] if text.lower().startswith("0x") else text
    if digits and all(c in "0123456789abcdefABCDEF" for c in digits):
        return int(digits, 16) & 0xFFFF
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:2], "big")


def find_collision(size: tuple[int, int], seeds: range) -> tuple[int, int] | None:
    """The first two seeds (in order of the second) whose images' identifiers share their low 16 bits."""
    seen: dict[int, int] = {}
    for seed in seeds:
        low = int16(image_uuid({"seed": seed, "size": list(size)}))
        if low in seen:
            return seen[low], seed
        seen[low] = seed
    return None


def describe(probes) -> dict:
    """The report's `images`: probe -> its image, the identifier the child sent and its 16-bit reduction."""
    out = {}
    for p in probes:
        if getattr(p, "image", None) is not None:
            uid = image_uuid(p.image)
            out[p.name] = {**p.image, "uuid": uid, "int16": int16(uid)}
    return out
