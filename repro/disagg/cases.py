"""The P→D cases file: prompts as seeded token IDs and the cases sent through a producer/consumer pair.

Cases file (kind "kvkit-pd-cases"), schema_version 1: first version. Top level: kind, schema_version, name,
description, block_size, max_tokens, vocab [low, high) (token IDs are drawn from it, so no tokenizer is needed and
the requests are token-ID prompts), prompts and cases.

  prompts: {"name", "seed", "length"} and optionally "prefix": {"of": PROMPT, "length": N}: the first N tokens are
           that prompt's (a partial prefix hit on the consumer's own cache).
  cases:   {"name", "kind", "prompt"} and, by kind:
           plain     the producer prefills (do_remote_decode, max_tokens 1), the consumer decodes with its
                     kv_transfer_params. A probe: judged by repro.judge.pd_verdict.
           partial   "warm": a prompt the consumer runs first on its own (no transfer) so that its prefix cache
                     holds this prompt's first blocks; then as plain: the consumer's hit plus the remote rest.
           consumed  a negative control: as plain, then "between" through the pair (the producer reuses the
                     freed blocks), then the first reference handed to the consumer again.
           stale     a negative control: "previous" through the pair, then this prompt handed to the consumer
                     with the previous request's (consumed) reference: the producer freed those blocks and they
                     hold the previous prompt's KV until reused (vLLM #52234: "the previous prompt's answer").
           out-of-range  a negative control (vLLM #52234's first row): as plain, then the same reference handed to
                     the consumer again with every remote_block_id moved past any pool (OUT_OF_RANGE_BASE + id).
           A control has "expect": the verdicts that show the fault was caught or seen (["FAIL", "ERROR"]), and
           may have "expect_answers_as": the request whose answer a FAIL must be named as, and "predict": the one
           verdict the case predicts, written before any run (reported as predicted or not; it never changes
           whether the control held).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from repro.errors import UsageError
from repro.judge.verdict import VERDICTS
from repro.plan.fixture_keys import unknown_key

KIND = "kvkit-pd-cases"
SCHEMA_VERSION = 1
CASE_KINDS = ("plain", "partial", "consumed", "stale", "out-of-range")
CONTROL_KINDS = ("consumed", "stale", "out-of-range")
OUT_OF_RANGE_BASE = 2**30  # past any producer's block pool on one GPU, and its NIXL descriptor IDs inside int32
_TOP = ("kind", "schema_version", "name", "description", "block_size", "max_tokens", "vocab", "prompts", "cases")
_PROMPT_KEYS = ("name", "seed", "length", "prefix")
_CASE_KEYS = ("name", "kind", "prompt", "warm", "between", "previous", "expect", "expect_answers_as", "predict")
_NEEDS = {"partial": "warm", "consumed": "between", "stale": "previous"}


@dataclass(frozen=True)
class Case:
    name: str
    kind: str
    prompt: str
    other: str | None = None  # warm (partial), between (consumed) or previous (stale)
    expect: tuple[str, ...] = ()
    expect_answers_as: str | None = None
    predict: str | None = None

    @property
    def control(self) -> bool:
        return self.kind in CONTROL_KINDS


@dataclass(frozen=True)
class Cases:
    name: str
    description: str
    block_size: int
    max_tokens: int
    prompts: dict[str, tuple[int, ...]]
    cases: tuple[Case, ...]
    sha256: str
    path: str = ""


def seeded_tokens(seed: int, length: int, vocab: tuple[int, int]) -> tuple[int, ...]:
    """`length` token IDs drawn from [low, high) by a generator seeded with `seed` (the same on every machine)."""
    rng = random.Random(seed)
    return tuple(rng.randrange(vocab[0], vocab[1]) for _ in range(length))


def _int(obj: dict, key: str, where: str, low: int = 1) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UsageError(f"{where}.{key}: must be an integer >= {low}, not {value!r}")
    return value


def _unknown(obj: object, keys: tuple[str, ...], where: str) -> dict:
    if not isinstance(obj, dict):
        raise UsageError(f"{where}: must be an object")
    extra = sorted(set(obj) - set(keys))
    if extra:
        raise UsageError(f"{where}: {unknown_key(extra[0], keys, 'key')}")
    return obj


def _name(obj: dict, where: str, seen: set[str]) -> str:
    name = obj.get("name")
    if not isinstance(name, str) or not name or name in seen:
        raise UsageError(f"{where}.name: must be a new non-empty string, not {name!r}")
    seen.add(name)
    return name


def parse_prompts(items: object, vocab: tuple[int, int]) -> dict[str, tuple[int, ...]]:
    if not isinstance(items, list) or not items:
        raise UsageError("prompts: must be a non-empty list")
    specs, seen = [], set()
    for i, raw in enumerate(items):
        where = f"prompts[{i}]"
        obj = _unknown(raw, _PROMPT_KEYS, where)
        specs.append((_name(obj, where, seen), _int(obj, "seed", where, 0), _int(obj, "length", where), obj, where))
    out: dict[str, tuple[int, ...]] = {n: seeded_tokens(s, length, vocab) for n, s, length, _, _ in specs}
    for name, _, length, obj, where in specs:
        if "prefix" not in obj:
            continue
        prefix = _unknown(obj["prefix"], ("of", "length"), f"{where}.prefix")
        of, n = prefix.get("of"), _int(prefix, "length", f"{where}.prefix")
        if of not in out or of == name or "prefix" in next(o for m, _, _, o, _ in specs if m == of):
            raise UsageError(f"{where}.prefix.of: must name another prompt without a prefix, not {of!r}")
        if n >= length or n > len(out[of]):
            raise UsageError(f"{where}.prefix.length: {n} must be shorter than both prompts")
        out[name] = out[of][:n] + out[name][n:]
    return out


def parse_case(raw: object, where: str, prompts: dict, seen: set[str]) -> Case:
    obj = _unknown(raw, _CASE_KEYS, where)
    name = _name(obj, where, seen)
    kind = obj.get("kind")
    if kind not in CASE_KINDS:
        raise UsageError(f"{where}.kind: must be one of {', '.join(CASE_KINDS)}, not {kind!r}")
    prompt = obj.get("prompt")
    if prompt not in prompts:
        raise UsageError(f"{where}.prompt: {prompt!r} is not a prompt of the file")
    other_key = _NEEDS.get(kind)
    for key in ("warm", "between", "previous"):
        if key in obj and key != other_key:
            raise UsageError(f"{where}.{key}: a {kind} case takes no {key}")
    other = obj.get(other_key) if other_key else None
    if other_key and (other not in prompts or other == prompt):
        raise UsageError(f"{where}.{other_key}: must name another prompt of the file, not {other!r}")
    expect = obj.get("expect", [])
    if kind in CONTROL_KINDS:
        if not isinstance(expect, list) or not expect or any(v not in VERDICTS for v in expect):
            raise UsageError(f"{where}.expect: a control needs a non-empty list of verdicts ({', '.join(VERDICTS)})")
    elif any(k in obj for k in ("expect", "expect_answers_as", "predict")):
        raise UsageError(f"{where}: only a control ({', '.join(CONTROL_KINDS)}) takes expect")
    predict = obj.get("predict")
    if predict is not None and predict not in expect:
        raise UsageError(f"{where}.predict: must be one of the case's expect verdicts, not {predict!r}")
    answers_as = obj.get("expect_answers_as")
    if answers_as is not None and answers_as not in prompts:
        raise UsageError(f"{where}.expect_answers_as: {answers_as!r} is not a prompt of the file")
    return Case(name, kind, prompt, other, tuple(expect), answers_as, predict)


def parse_cases(data: object, path: str = "", digest: str = "") -> Cases:
    """A cases file's JSON, checked; every problem is one line (UsageError)."""
    if not isinstance(data, dict):
        raise UsageError("cases file: must be an object")
    if data.get("kind") != KIND:
        raise UsageError(f"kind: must be {KIND!r}, not {data.get('kind')!r}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION
        raise UsageError(
            f"schema_version {version!r}: " + ("upgrade the kit" if newer else f"expected {SCHEMA_VERSION}")
        )
    obj = _unknown(data, _TOP, "cases file")  # after kind and version: a newer file's keys say "upgrade the kit"
    vocab = obj.get("vocab")
    ok = isinstance(vocab, list) and len(vocab) == 2 and all(type(v) is int for v in vocab)
    if not ok or not 0 <= vocab[0] < vocab[1]:
        raise UsageError(f"vocab: must be [low, high) token IDs with 0 <= low < high, not {vocab!r}")
    prompts = parse_prompts(obj.get("prompts"), (vocab[0], vocab[1]))
    raw_cases = obj.get("cases")
    if not isinstance(raw_cases, list) or not raw_cases:
        raise UsageError("cases: must be a non-empty list")
    seen: set[str] = set()
    cases = tuple(parse_case(c, f"cases[{i}]", prompts, seen) for i, c in enumerate(raw_cases))
    if not any(not c.control for c in cases):
        raise UsageError("cases: needs at least one probe (plain or partial), not only controls")
    return Cases(
        str(obj.get("name", "")),
        str(obj.get("description", "")),
        _int(obj, "block_size", "cases file"),
        _int(obj, "max_tokens", "cases file"),
        prompts,
        cases,
        digest,
        path,
    )


def load_cases(path: str | Path) -> Cases:
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cases file {path}: cannot read ({exc.strerror or exc})") from None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"cases file {path}: not JSON ({exc})") from None
    try:
        return parse_cases(data, str(path), hashlib.sha256(raw).hexdigest())
    except UsageError as exc:
        raise UsageError(f"cases file {path}: {exc}") from None
