"""How report facts are shown as short text, once for every view: the text summary, the site and
the issue Markdown. Pure functions over a report dict (as written, or as loaded)."""

from __future__ import annotations

import re

_HEX = re.compile(r"^[0-9a-f]{7,40}$")
NO_SUITE = "n/a (no acceptance suite)"


def commit_label(provenance: dict) -> str:
    """'1a2b3c4d5e6f', '…+dirty' or '… (dirty: unknown)'; a non-hash (e.g. 'unavailable: …') whole."""
    kit = provenance.get("kit") or {}
    commit = str(kit.get("commit") or "?")  # an empty or null commit says nothing: shown as unknown
    short = commit[:12] if _HEX.match(commit) else commit
    return short + {True: "+dirty", False: "", None: " (dirty: unknown)"}.get(kit.get("dirty"), "")


def is_commit_hash(text: str) -> bool:
    return bool(_HEX.match(text))


def acceptance_label(report: dict, short: bool = False) -> str:
    """'true', 'false', or 'n/a (no acceptance suite)' ('n/a' when short)."""
    matched = report["acceptance"].get("matched")
    if matched is None:
        return "n/a" if short else NO_SUITE
    return str(matched).lower()


def cached_cell(probe: dict) -> str:
    """'0→1280×3': the cold request's cached count, then the reuses' (collapsed when equal)."""
    reqs = probe.get("requests") or []
    if not reqs:
        return "—"

    def fmt(count: int | None) -> str:
        return "?" if count is None else str(count)  # absent is shown, never read as 0

    cold, reuses = fmt(reqs[0].get("cached_tokens")), [fmt(r.get("cached_tokens")) for r in reqs[1:]]
    if not reuses:
        return cold
    if len(set(reuses)) == 1:
        return f"{cold}→{reuses[0]}" + (f"×{len(reuses)}" if len(reuses) > 1 else "")
    return f"{cold}→{','.join(reuses)}"


def diff_cell(probe: dict) -> str:
    """'@4,15': the distinct first differing indices of the reuses, in order of appearance."""
    seen: list[int] = []
    for r in (probe.get("requests") or [])[1:]:
        d = r.get("first_diff")
        if d is not None and d not in seen:
            seen.append(d)
    return "@" + ",".join(str(d) for d in seen) if seen else ""


def arm_title(arm: dict) -> str:
    """'baseline', 'native prefix caching', the connector's name, or 'ARM (CONNECTOR)'."""
    if arm["mode"] == "baseline":
        return "baseline"
    if arm["mode"] == "native":
        return "native prefix caching"
    connector = (arm.get("connector") or {}).get("name")
    return arm["name"] if arm["name"] == connector else f"{arm['name']} ({connector})"


def baseline_arm(report: dict) -> dict | None:
    return next((a for a in report["arms"] if a["mode"] == "baseline"), None)


def baseline_probes(report: dict) -> dict[str, dict]:
    """The baseline's probes by name (empty when there is no baseline)."""
    return {p["name"]: p for p in (baseline_arm(report) or {}).get("probes") or []}


def baseline_token_ids(report: dict, probe_name: str) -> list[int] | None:
    """The baseline's generated token IDs for a probe, or None when it has none."""
    reqs = (baseline_probes(report).get(probe_name) or {}).get("requests") or []
    return reqs[0].get("token_ids") if reqs else None


def day(report: dict) -> str:
    """The report's start date, YYYY-MM-DD."""
    return str(report["provenance"].get("started_utc", "?"))[:10]


def headline(report: dict) -> str:
    """'NVIDIA L4 · 1a2b3c4d5e6f · 2026-11-29': hardware, kit commit, date."""
    return f"{report.get('hardware_label', '?')} · {commit_label(report['provenance'])} · {day(report)}"
