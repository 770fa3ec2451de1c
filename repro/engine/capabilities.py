"""What the installed vLLM offers, asked of vLLM itself, never read off its version string: the block sizes its
attention backend takes, where its served front end's argument parser lives, the module that holds its
batch-invariant mode, whether it takes a tenant salt (cache_salt), the speculative decoding methods its
speculative_config names, and whether its engine imports at all.

The parent asks once before any arm starts (`python -m repro.engine.capabilities --device cpu`, through
repro.plan.interpreter.probe_engine: a --python environment whose engine does not import is then one line, exit 2,
not an ERROR per arm); an engine child asks the same functions in process. Each answer the installed vLLM cannot
give is "unavailable: <why>".
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import typing
from types import ModuleType

# Where `vllm serve`'s argument parser (make_arg_parser) lives: vLLM 0.26-0.31, then vLLM 0.32's launchers package.
SERVED_PARSER_MODULES = ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.launchers.cli_args")
# Where batch-invariant mode (_batch_invariant_MODE, init_batch_invariance) lives: vLLM 0.26-0.31, then 0.32's
# determinism package.
BATCH_INVARIANT_MODULES = (
    "vllm.model_executor.layers.batch_invariant",
    "vllm.model_executor.determinism.batch_invariant",
)
# The CPU platform's attention backend (vLLM 0.26-0.32 alike); a GPU's is picked when its engine starts, by model and
# device, so a GPU run's block size is the one asked for (every CUDA backend takes multiples of 16).
CPU_ATTENTION_BACKEND = "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackend"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def first_module(names: tuple[str, ...], attribute: str) -> ModuleType:
    """The first of names that imports and has attribute; ImportError naming every place tried otherwise."""
    tried = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            tried.append(f"{name} ({_first_line(exc)})")
            continue
        if hasattr(module, attribute):
            return module
        tried.append(f"{name} (no {attribute})")
    raise ImportError(f"no module of this vLLM has {attribute}: tried {'; '.join(tried)}")


def served_arg_parser():
    """vLLM's own `make_arg_parser` for `vllm serve` (wherever this vLLM keeps it)."""
    return first_module(SERVED_PARSER_MODULES, "make_arg_parser").make_arg_parser


def batch_invariant_module() -> ModuleType:
    """The module whose _batch_invariant_MODE says batch-invariant kernels are installed in this process."""
    return first_module(BATCH_INVARIANT_MODULES, "_batch_invariant_MODE")


def describe_block_sizes(sizes: list) -> dict:
    """A backend's get_supported_kernel_block_sizes() as data: exact sizes and "multiple of" bases (vLLM's
    MultipleOf carries its base as .base)."""
    exact, multiples = [], []
    for s in sizes:
        if isinstance(s, int):
            exact.append(s)
        elif isinstance(getattr(s, "base", None), int):
            multiples.append(s.base)
        else:
            raise TypeError(f"a block size entry neither int nor MultipleOf: {s!r}")
    return {"exact": sorted(set(exact)), "multiple_of": sorted(set(multiples))}


def accepted_block_sizes(device: str) -> dict:
    """{"backend": name, "exact": [...], "multiple_of": [...]} for the CPU backend; {"unavailable": why} otherwise."""
    if device != "cpu":
        return {"unavailable": "a GPU's attention backend is picked when its engine starts (model and device)"}
    module, _, name = CPU_ATTENTION_BACKEND.partition(":")
    try:
        backend = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        return {"unavailable": f"{CPU_ATTENTION_BACKEND} does not import ({_first_line(exc)})"}
    ask = getattr(backend, "get_supported_kernel_block_sizes", None)
    if ask is None:
        return {"unavailable": f"{name} has no get_supported_kernel_block_sizes"}
    try:
        return {"backend": name, **describe_block_sizes(list(ask()))}
    except Exception as exc:  # noqa: BLE001 - an answer this kit cannot read is reported, not guessed
        return {"unavailable": f"{name}.get_supported_kernel_block_sizes(): {_first_line(exc)}"}


def cpu_block_size() -> int:
    """The block size --block-size auto picks on this vLLM's CPU backend (repro.plan.block_size), for the kit's
    in-process CPU engines (margins, the model check); the kit's default where the backend cannot say."""
    from repro.plan.block_size import PREFERRED_BLOCK_SIZE, choose_block_size

    accepted = accepted_block_sizes("cpu")
    return (choose_block_size(accepted) if "unavailable" not in accepted else None) or PREFERRED_BLOCK_SIZE


# Where the OpenAI server's completion request model lives: vLLM 0.28 keeps it in a package of its own; earlier ones
# in one protocol module.
COMPLETION_PROTOCOL_MODULES = ("vllm.entrypoints.openai.completion.protocol", "vllm.entrypoints.openai.protocol")
SALT_PROBE = "kvkit-salt-probe"


class _StandInRequest:
    """What vLLM's block hashing reads of a request, for a salted prompt of one block under no LoRA, image or
    embeddings; any other attribute a later vLLM reads is None (an answer, not a guess: its hash then says)."""

    def __init__(self, salt: str):
        self.cache_salt, self.lora_request, self.prompt_embeds, self.mm_features = salt, None, None, []
        self._prompt_embeds_per_block_hashes: dict = {}

    def __getattr__(self, name: str):
        return None


def _holds(keys: object, value: str) -> bool:
    """Whether a block's extra keys hold value, at any depth of their tuples and lists."""
    if isinstance(keys, (tuple, list)):
        return any(_holds(k, value) for k in keys)
    return keys == value


def cache_salt_support(frontend: str = "offline") -> str:
    """'available' where this vLLM takes a tenant salt and partitions its prefix cache by it (repro.plan.salts), else
    'unavailable: <why>'. Asked of vLLM itself: its prompt type names cache_salt, its block hashing puts the salt in
    the first block's key (generate_block_hash_extra_keys on a stand-in request), and for a served arm
    (frontend "server") its completion request takes the field. Never raises."""
    try:
        from vllm import TokensPrompt
        from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys
    except Exception as exc:  # noqa: BLE001 - what a vLLM lacks is a fact of the report
        return f"unavailable: {_first_line(exc)}"
    if "cache_salt" not in getattr(TokensPrompt, "__annotations__", {}):
        return "unavailable: vLLM's TokensPrompt has no cache_salt"
    try:
        keys, _ = generate_block_hash_extra_keys(_StandInRequest(SALT_PROBE), 0, 16, 0)
    except Exception as exc:  # noqa: BLE001
        return f"unavailable: generate_block_hash_extra_keys on a salted request: {_first_line(exc)}"
    if not _holds(keys, SALT_PROBE):  # the salt itself (vLLM 0.28) or in a tagged pair ("cache_salt", salt) (0.32)
        return f"unavailable: vLLM's block hashing leaves the salt out of the first block's key ({keys!r})"
    if frontend == "server":
        try:
            model = first_module(COMPLETION_PROTOCOL_MODULES, "CompletionRequest").CompletionRequest
        except ImportError as exc:
            return f"unavailable: {_first_line(exc)}"
        if "cache_salt" not in getattr(model, "model_fields", {}):
            return "unavailable: the OpenAI server's CompletionRequest has no cache_salt"
    return "available"


def _literal_values(annotation) -> list[str]:
    """Every string a (nested, optionally None-joined) Literal annotation allows."""
    if isinstance(annotation, str):
        return [annotation]
    return [v for arg in typing.get_args(annotation) if arg is not type(None) for v in _literal_values(arg)]


def speculative_support() -> dict:
    """{"methods": [...]}: the speculative decoding methods this vLLM's engine takes (SpeculativeConfig.method's
    Literal); {"unavailable": why} where its EngineArgs has no speculative_config or the methods cannot be read."""
    try:
        from vllm.config import SpeculativeConfig
        from vllm.engine.arg_utils import EngineArgs
    except Exception as exc:  # noqa: BLE001 - what a vLLM lacks is a fact of the report
        return {"unavailable": _first_line(exc)}
    if "speculative_config" not in {f.name for f in dataclasses.fields(EngineArgs)}:
        return {"unavailable": "vLLM's EngineArgs has no speculative_config"}
    try:
        method = typing.get_type_hints(SpeculativeConfig)["method"]
    except Exception as exc:  # noqa: BLE001
        return {"unavailable": f"SpeculativeConfig.method cannot be read ({_first_line(exc)})"}
    methods = sorted(set(_literal_values(method)))
    return {"methods": methods} if methods else {"unavailable": f"SpeculativeConfig.method is {method!r}"}


def _answer(what, *args) -> str:
    try:
        found = what(*args)
    except Exception as exc:  # noqa: BLE001 - what a vLLM lacks is a fact of the report
        return f"unavailable: {_first_line(exc)}"
    return getattr(found, "__module__", None) or getattr(found, "__name__", "") or "available"


def engine_capabilities(device: str) -> dict:
    """Everything above for this interpreter's vLLM. The engine's own import (`from vllm import LLM,
    SamplingParams`: vllm.config, transformers, and what they pull) comes first: where it fails nothing else is
    asked, and "engine_imports" says why."""
    try:
        from vllm import LLM, SamplingParams  # noqa: F401 - the import every engine child makes first
        from vllm.platforms import current_platform
    except BaseException as exc:  # noqa: BLE001 - e.g. PyPI's torchvision beside the CPU torch (RuntimeError)
        return {"engine_imports": False, "why": _first_line(exc)}
    import vllm

    return {
        "engine_imports": True,
        "vllm": getattr(vllm, "__version__", None),
        "platform": str(current_platform.device_type),
        "block_sizes": accepted_block_sizes(device),
        "served_arg_parser": _answer(served_arg_parser),
        "batch_invariant_module": _answer(batch_invariant_module),
        "cache_salt": {"offline": cache_salt_support(), "served": cache_salt_support("server")},
        "speculative_config": speculative_support(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repro.engine.capabilities")
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    args = parser.parse_args(argv)
    caps = engine_capabilities(args.device)
    sys.stdout.flush()
    print(json.dumps(caps, sort_keys=True))  # the last line: the parent reads it (repro.plan.interpreter.ask_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
