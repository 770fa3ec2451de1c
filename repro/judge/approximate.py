"""Reuse paths their engine documents as approximate: what the kit names "approximate by design", never corruption.

An approximate reuse is judged by the one judge like any other (its answers against the cache-off baseline's, its KV
by the audit) and counted by the one exit rule: a difference is a FAIL and a KV finding, which a fixture that runs it
as a positive control states and so excuses, and which is never excused otherwise. What this module adds is the name:
the headline and pages say what the engine documents, so that a reader does not take a documented approximation for
a broken cache, nor a broken cache for it (a path is named approximate only when its setting turns the approximation
on; the same connector with it off is a plain arm).

Standard library only: llama.cpp's child (repro.llamacpp.served) takes the connector's name from here.
"""

from __future__ import annotations

from dataclasses import dataclass

CACHE_REUSE = "LlamaServerCacheReuse"  # llama-server's --cache-reuse (repro.llamacpp.served)


@dataclass(frozen=True)
class Approximation:
    setting: str  # the connector's extra_config key that turns it on when above 0
    flag: str  # the engine's own name for that setting
    what: str  # what it does, in the engine's words where it has them
    short: str  # the same in a few words, for a headline
    source: str  # where the engine documents it


APPROXIMATIONS = {
    CACHE_REUSE: Approximation(
        setting="min_chunk",
        flag="--cache-reuse",
        what="cached KV chunks shifted to new positions (KV shifting): their KV was computed after other tokens",
        short="cached KV shifted to new positions",
        source="llama.cpp tools/server/README.md, --cache-reuse: 'min chunk size to attempt reusing from the cache "
        "via KV shifting'",
    ),
}


def approximation_of(connector: object, extra_config: object) -> Approximation | None:
    """The documented approximation an arm's reuse path runs (its connector's setting above 0), or None."""
    found = APPROXIMATIONS.get(str(connector)) if connector is not None else None
    if found is None or not isinstance(extra_config, dict):
        return None
    value = extra_config.get(found.setting)
    return found if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def setting_text(connector: object, extra_config: object) -> str:
    """'--cache-reuse 16': the engine's flag as the arm set it, or '' for an arm that runs no approximation."""
    found = approximation_of(connector, extra_config)
    return "" if found is None else f"{found.flag} {extra_config[found.setting]}"


def approximation_text(connector: object, extra_config: object) -> str:
    """'approximate by design: --cache-reuse 16, cached KV shifted to new positions', or '' for an arm that runs
    none."""
    setting = setting_text(connector, extra_config)
    return f"approximate by design: {setting}, {APPROXIMATIONS[str(connector)].short}" if setting else ""
