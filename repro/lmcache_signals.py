"""LMCache's own signals in an arm log: hit counts, degraded mode, CUDA ops, double unpins."""

from __future__ import annotations


def lmcache_findings(entry: dict, log_text: str) -> None:
    """Annotate a judged LMCache arm entry in place (filled in by the GPU profile work)."""
    entry.setdefault("lmcache", {})
