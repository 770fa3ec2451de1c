"""Tenant salts: a fixture probe's `cache_salt` (vLLM's per-tenant partition of the prefix cache) read and checked,
one line and exit 2 on bad input.

Every request of a probe that names a salt is sent with it: offline in vLLM's prompt (TokensPrompt's cache_salt),
served and to `repro endpoint`'s servers in the request body (`"cache_salt"`). vLLM hashes the salt into the key of a
prompt's first block (kv_cache_utils.generate_block_hash_extra_keys, vLLM 0.28), so the same tokens under two salts
never share native prefix-cache blocks; a store that keys on the tokens alone serves one tenant's KV to another. Two
probes with the same prompt under other salts are the question repro.judge.salts asks: a request may reuse what its
own salt stored, never what only another salt did. Whether the installed vLLM takes a salt is probed
(repro.engine.capabilities.cache_salt_support), never read off its version.
"""

from __future__ import annotations

from dataclasses import replace

from repro.errors import UsageError

KEY = "cache_salt"
# vLLM's OpenAI server takes any non-empty string (min_length 1); the kit keeps a salt short and printable so that
# it can be named in a verdict's reason and a file's line.
MAX_SALT_CHARS = 128
SINCE_VERSION = 5  # the fixture schema_version that may name one


def salt_problem(value: object) -> str | None:
    """Why a probe's cache_salt is no salt the kit sends (None: it is one)."""
    if not isinstance(value, str) or not value or len(value) > MAX_SALT_CHARS:
        return f"must be a non-empty string of at most {MAX_SALT_CHARS} characters, got {value!r}"
    if not value.isprintable() or value != value.strip():
        return f"must be printable, with no leading or trailing space, got {value!r}"
    return None


def parse_salts(data: dict, probes: tuple, path) -> tuple:
    """The fixture's probes with each one's cache_salt (None where it names none); data is the fixture's object
    (parse_probe has checked its probes are objects, in the same order). A file that names one says schema_version 5:
    a kit older than salts would send those probes unsalted and judge a cross-tenant hit as a plain reuse."""
    out = []
    for i, (raw, probe) in enumerate(zip(data["probes"], probes)):
        if KEY not in raw:
            out.append(probe)
            continue
        if data.get("schema_version", 0) < SINCE_VERSION:
            raise UsageError(f"fixture {path}: probes[{i}].{KEY}: a probe's {KEY} needs schema_version {SINCE_VERSION}")
        problem = salt_problem(raw[KEY])
        if problem is not None:
            raise UsageError(f"fixture {path}: probes[{i}].{KEY}: {problem}")
        out.append(replace(probe, cache_salt=raw[KEY]))
    return tuple(out)
