"""The production-load scenario's plan: a fixture scenario with a `load` object instead of `steps`.

The kit generates its prompts and its schedule from the object, once, at plan time, so every arm of the run sends the
same requests in the same order: `prefixes` shared prefixes of `prefix_tokens` tokens, each followed by `suffixes`
suffixes of `suffix_tokens` (prefixes x suffixes prompts, token IDs drawn from `token_range` by `seed`), and
`rounds` rounds, each every prompt in flight together in its own shuffled order. In every round `cancel_in_prefill`
prompts are aborted while their prefill is under way and `cancel_at_last_step` one step before their last token,
each then sent again at once (the retry a client makes); which ones is drawn by the seed too.

How it runs (repro.engine.load): vLLM's engine driven step by step. Its references (repro.run.load_scenario): a
baseline child of its own answers every prompt alone with caching off, in the plain arms' engine (the
cache-disabled answer, and the reference KV); the baseline runs the rounds cache-off (the schedule control); native
prefix caching with a pool that holds every prompt runs the rounds too (the reuse control). A request differs only if it differs from its prompt's cache-off answer and from the reuse
control's answer to the same request.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from repro.errors import UsageError

LOAD_KEYS = {
    "prefixes": int,
    "suffixes": int,
    "prefix_tokens": int,
    "suffix_tokens": int,
    "rounds": int,
    "seed": int,
    "token_range": list,
    "cancel_in_prefill": int,
    "cancel_at_last_step": int,
    "control_kv_cache_tokens": int,
}
REQUIRED = ("prefixes", "suffixes", "prefix_tokens", "suffix_tokens", "rounds", "seed")
# token IDs every model the kit runs has (the tiny model's vocabulary is 320), clear of its first special IDs
DEFAULT_TOKEN_RANGE = (3, 317)
MAX_REQUESTS = 4096
IN_PREFILL, AT_LAST_STEP = "prefill", "last-step"
# the reuse control's run and the reference run: `<arm>~scenario.<name>` + these (repro.run.scenarios.run_name)
CONTROL_SUFFIX = "~control"
REFERENCE_SUFFIX = "~reference"


@dataclass(frozen=True)
class LoadSpec:
    prefixes: int
    suffixes: int
    prefix_tokens: int
    suffix_tokens: int
    rounds: int
    seed: int
    token_range: tuple[int, int] = DEFAULT_TOKEN_RANGE
    cancel_in_prefill: int = 0
    cancel_at_last_step: int = 0
    control_kv_cache_tokens: int | None = None

    @property
    def requests_per_round(self) -> int:
        return self.prefixes * self.suffixes

    @property
    def prompt_tokens(self) -> int:
        return self.prefix_tokens + self.suffix_tokens

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in LOAD_KEYS}
        out["token_range"] = list(self.token_range)
        if out["control_kv_cache_tokens"] is None:
            del out["control_kv_cache_tokens"]
        return out


def parse_load(obj: object, where: str) -> LoadSpec:
    """A scenario's `load` object; every problem is one line (the caller adds the fixture's path)."""
    if not isinstance(obj, dict):
        raise UsageError(f"{where}: must be an object")
    unknown = sorted(str(k) for k in obj if k not in LOAD_KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(LOAD_KEYS)})")
    missing = [k for k in REQUIRED if k not in obj]
    if missing:
        raise UsageError(f"{where}: missing {missing[0]}")
    for key, value in obj.items():
        if key == "token_range":
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"{where}.{key}: must be an integer, not {value!r}")
        low = 0 if key in ("seed", "cancel_in_prefill", "cancel_at_last_step") else 1
        if value < low:
            raise UsageError(f"{where}.{key}: must be at least {low}, not {value}")
    spec = LoadSpec(**{k: v for k, v in obj.items() if k != "token_range"})
    if "token_range" in obj:
        tr = obj["token_range"]
        ok = isinstance(tr, list) and len(tr) == 2 and all(isinstance(t, int) and not isinstance(t, bool) for t in tr)
        if not ok or not 0 <= tr[0] < tr[1]:
            raise UsageError(f"{where}.token_range: must be [low, high] token IDs with 0 <= low < high, not {tr!r}")
        spec = LoadSpec(**{**spec.__dict__, "token_range": (tr[0], tr[1])})
    if spec.rounds < 2:
        raise UsageError(f"{where}.rounds: at least 2 (the first round fills the caches, the next ones reuse)")
    if spec.requests_per_round > MAX_REQUESTS:
        raise UsageError(f"{where}: {spec.requests_per_round} prompts a round, over {MAX_REQUESTS}")
    if spec.cancel_in_prefill + spec.cancel_at_last_step > spec.requests_per_round:
        raise UsageError(f"{where}: more cancellations a round than prompts ({spec.requests_per_round})")
    return spec


def probe_name(prefix: int, suffix: int) -> str:
    return f"load-p{prefix:03d}-s{suffix:02d}"


def prompts(spec: LoadSpec) -> list[tuple[str, tuple[int, ...]]]:
    """Every prompt: (name, token IDs), prefix by prefix."""
    rng = random.Random(spec.seed)
    low, high = spec.token_range
    out = []
    for i in range(spec.prefixes):
        prefix = [rng.randrange(low, high) for _ in range(spec.prefix_tokens)]
        for j in range(spec.suffixes):
            out.append(
                (probe_name(i, j), tuple(prefix + [rng.randrange(low, high) for _ in range(spec.suffix_tokens)]))
            )
    return out


def rounds(spec: LoadSpec, names: list[str]) -> list[tuple[tuple[str, ...], dict[str, str]]]:
    """Each round's submission order and its cancellations (name -> IN_PREFILL or AT_LAST_STEP)."""
    out = []
    for r in range(spec.rounds):
        rng = random.Random(f"{spec.seed}:round:{r}")
        order = list(names)
        rng.shuffle(order)
        chosen = rng.sample(order, spec.cancel_in_prefill + spec.cancel_at_last_step)
        cancels = {n: IN_PREFILL for n in chosen[: spec.cancel_in_prefill]}
        cancels |= {n: AT_LAST_STEP for n in chosen[spec.cancel_in_prefill :]}
        out.append((tuple(order), cancels))
    return out


def control_kv_tokens(spec: LoadSpec, max_tokens: int, block_size: int, max_model_len: int) -> int:
    """The reuse control's pool: every prompt with its answer twice over, in whole blocks (it never evicts), at
    least one request of max_model_len; or the fixture's control_kv_cache_tokens."""
    if spec.control_kv_cache_tokens is not None:
        return spec.control_kv_cache_tokens
    per = -(-(spec.prompt_tokens + max_tokens) // block_size) * block_size
    return max(2 * per * spec.requests_per_round, max_model_len)
