"""The keys each object of a fixture may hold, level by level, and the one-line refusal of any other.

A fixture is read strictly: a key the kit does not know, at any level, is refused in one line (exit 2) that names the
file, the key's place in the file and the known keys nearest it, before anything else of the file is read. A
misspelt key is never ignored: "expcted" for "expected" would be a fixture that states no verdict, and the run would
end an hour later blaming the stack. schemas/fixture.schema.json says the same (additionalProperties: false on every
object the kit reads; tests/test_fixture_strict.py holds the two equal). Objects whose keys are names (the arms and
probes of an expectation table, the labels of adapters) are walked into; objects the kit passes on as they are (a
connector's extra_config, a scenario's LMCache keys, the informational `reference`) are not.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from repro.plan import adapters, images, load, multi, prompt_logprobs, salts, upstream


@dataclass(frozen=True)
class Obj:
    """An object of these keys; children: the shape of a key's value, where the kit reads into it; when: (key, value,
    children) for children that hold only when the object's key has that value (a MultiConnector arm's members);
    what: a key's name in the refusal; note: what the refusal says in place of the known keys."""

    keys: tuple[str, ...]
    children: dict = field(default_factory=dict)
    when: tuple = ()
    what: str = "field"
    note: str | None = None


@dataclass(frozen=True)
class ListOf:
    item: object


@dataclass(frozen=True)
class MapOf:
    """An object whose keys are names (arms, probes, adapter labels), each value of this shape."""

    value: object


# A scenario's engine settings (repro.run.scenarios says what each does) and their types.
SCENARIO_ENGINE_KEYS = {
    "kv_cache_tokens": int,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "preemption": bool,
    "async_scheduling": bool,
    # chunked prefill's cap on one request's tokens a step (vLLM's long_prefill_token_threshold): a prefill over
    # several steps, so that a load scenario's cancellation can land in it
    "long_prefill_token_threshold": int,
    # llama-server's --kv-unified (one KV buffer shared by every slot, its default where the slot count is auto):
    # llama.cpp's only, an arm on vLLM refuses it
    "kv_unified": bool,
}
# LMCache's MP server settings a scenario may set (repro.lmcache.mp.ServerSettings' fields).
SCENARIO_MP_SERVER_KEYS = {"l1_size_gb": (int, float), "chunk_size": int, "eviction_policy": str, "l1_use_lazy": bool}
SCENARIO_KEYS = ("name", "description", "engine", "lmcache", "mp_server", "steps", "load")
STEP_KEYS = ("submit", "together", "expect", "wait_s")
TOP_KEYS = (
    "kind", "schema_version", "tool_version", "name", "description", "tokenizer", "probes", "arms", "expected",
    "expected_kv", "scenarios", "expected_scenarios", "expected_scenarios_kv", "reference", "adapters", "lora",
)  # fmt: skip
# name: whose tokenizer the token IDs are; the rest informational (the model it came from, and how it was made)
TOKENIZER_KEYS = ("name", "revision", "model_sha256", "source")
# note and messages informational: what a token-ID prompt is and the chat messages its IDs were made from
PROBE_KEYS = ("name", "prompt", "reuses", "adapter", prompt_logprobs.KEY, salts.KEY, "note", "messages")
PROMPT_KEYS = ("token_ids", "chat", images.KEY)
CHAT_KEYS = ("messages", "length", "filler")
MESSAGE_KEYS = ("role", "content")
ARM_KEYS = (
    "name", "connector", "module_path", "extra_config", "skip_probes", "skip_scenarios", "lmcache_ops",
    "kv_offloading_size", "kv_offloading_backend", "gpu_prefix_cache", "gpu_cache_reset",
)  # fmt: skip
# vLLM's MultiConnector reads "connectors" alone of its kv_connector_extra_config (multi_connector.py, vLLM 0.28)
MULTI_EXTRA_KEYS = (multi.MEMBERS_KEY,)

# An expectation: a verdict, a set of them, or a bound entry (an object: repro.plan.upstream).
_ENTRY = Obj(upstream.ENTRY_KEYS, {"upstream": Obj(upstream.BOUND_KEYS)}, note=upstream.ENTRY_NOTE)
_TABLE = MapOf(MapOf(_ENTRY))
_PROMPT = Obj(
    PROMPT_KEYS,
    {
        "chat": Obj(CHAT_KEYS, {"messages": ListOf(Obj(MESSAGE_KEYS))}),
        images.KEY: Obj(images.IMAGE_KEYS, {"processor": Obj(images.PROCESSOR_KEYS, what="setting")}),
    },
)
_MULTI_EXTRA = Obj(MULTI_EXTRA_KEYS, {multi.MEMBERS_KEY: ListOf(Obj(multi.MEMBER_KEYS))})
_SCENARIO = Obj(
    SCENARIO_KEYS,
    {
        "engine": Obj(tuple(SCENARIO_ENGINE_KEYS)),
        "mp_server": Obj(tuple(SCENARIO_MP_SERVER_KEYS)),
        "load": Obj(tuple(load.LOAD_KEYS)),
        "steps": ListOf(Obj(STEP_KEYS)),
    },
)
FIXTURE_SHAPE = Obj(
    TOP_KEYS,
    {
        "tokenizer": Obj(TOKENIZER_KEYS),
        "probes": ListOf(Obj(PROBE_KEYS, {"prompt": _PROMPT})),
        "arms": ListOf(Obj(ARM_KEYS, when=(("connector", multi.MULTI, {"extra_config": _MULTI_EXTRA}),))),
        "expected": _TABLE,
        "expected_kv": _TABLE,
        "scenarios": ListOf(_SCENARIO),
        "expected_scenarios": _TABLE,
        "expected_scenarios_kv": _TABLE,
        "adapters": MapOf(Obj(adapters.ADAPTER_KEYS)),
        "lora": Obj(adapters.LORA_KEYS),
    },
)


def shown(name: object) -> str:
    """A name as a one-line message shows it: as written, or quoted when it is not printable."""
    return name if isinstance(name, str) and name.isprintable() else repr(name)


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """ "did you mean 'x'? " (a space after) for the known names closest to a name (difflib's), '' when none is."""
    close = difflib.get_close_matches(name, sorted(known), n=2, cutoff=0.6) if isinstance(name, str) else []
    return f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""


def nearest(name: object, known: Iterable[str]) -> str:
    """ " (did you mean 'x'?)" to follow a refused name, or '' when no known name is close to it."""
    close = did_you_mean(name, known)
    return f" ({close.rstrip()})" if close else ""


def unknown_key(key: object, known: Iterable[str], what: str = "field", note: str | None = None) -> str:
    """The one-line refusal of an unknown key: "unknown field 'expcted' (did you mean 'expected'? known: ...)"."""
    known = tuple(known)
    return f"unknown {what} {key!r} ({did_you_mean(key, known)}{note or 'known: ' + ', '.join(known)})"


def _objects(value: object, shape: object, where: str) -> Iterator[tuple[str, dict, Obj]]:
    """(where, object, its Obj) for every object of a shape the value holds, depth first in document order; a value
    of another type than its shape's is passed over (the loader refuses it with its own line)."""
    if isinstance(shape, ListOf) and isinstance(value, list):
        for i, item in enumerate(value):
            yield from _objects(item, shape.item, f"{where}[{i}]")
    elif isinstance(shape, MapOf) and isinstance(value, dict):
        for name, item in value.items():
            yield from _objects(item, shape.value, f"{where}.{shown(name)}" if where else shown(name))
    elif isinstance(shape, Obj) and isinstance(value, dict):
        yield where, value, shape
        children = dict(shape.children)
        for key, equals, more in shape.when:
            children |= more if value.get(key) == equals else {}
        for key, child in children.items():
            if key in value:
                yield from _objects(value[key], child, f"{where}.{key}" if where else key)


def unknown_key_problem(data: object, shape: Obj = FIXTURE_SHAPE) -> str | None:
    """The first key, in document order, that its object may not hold: 'where: unknown field ...' (one line), or
    None when every object holds known keys only."""
    for where, obj, spec in _objects(data, shape, ""):
        for key in obj:
            if key not in spec.keys:
                return f"{where or 'top level'}: {unknown_key(key, spec.keys, spec.what, spec.note)}"
    return None
