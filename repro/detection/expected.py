"""Whether a catalogue row of the detection study (repro.detection.catalogue) showed what it expected: its token
verdicts at the largest window, its KV verdicts and its blame, probe by probe (pure, no I/O). A row that did not
hold says where, in one line per probe and check."""

from __future__ import annotations

from repro.detection.plan import WINDOWS


def _one_of(values: list[str] | tuple[str, ...]) -> str:
    return " or ".join(values)


def probe_misses(p: dict, exp: dict, window: str) -> list[str]:
    """What one probe showed that its row's expectation does not accept."""
    out = []
    got = p["verdicts"].get(window)
    finding = exp.get("finding")
    if got not in exp["verdict"]:
        out.append(f"{p['name']}: {got} at {window} tokens, expected {_one_of(exp['verdict'])}")
    elif finding and p.get("finding") != finding:
        out.append(f"{p['name']}: {got} at {window} tokens with finding {p.get('finding')}, expected {finding}")
    kv = p.get("kv") or {}
    if exp["kv"] is not None and kv.get("verdict") not in exp["kv"]:
        out.append(f"{p['name']}: KV {kv.get('verdict', 'not audited')}, expected {_one_of(exp['kv'])}")
    if exp["blame"] is not None and kv.get("outcome") != exp["blame"]:
        out.append(f"{p['name']}: blame {kv.get('outcome', 'not audited')}, expected {exp['blame']}")
    return out


def check_row(entry: dict) -> dict:
    """{"held", "misses"} of one catalogue row: held when every probe shows what the expectation accepts."""
    exp, window = entry["expectation"], str(max(WINDOWS))
    if entry["error"] is not None:
        return {"held": False, "misses": [f"the arm failed: {entry['error']['kind']}: {entry['error']['detail']}"]}
    if not entry["probes"]:
        return {"held": False, "misses": ["no probe was judged"]}
    misses = [m for p in entry["probes"] for m in probe_misses(p, exp, window)]
    return {"held": not misses, "misses": misses}


def summarize_expectations(rows: list[dict]) -> dict:
    """The catalogue rows' totals: how many held, and each row's check."""
    checks = {f"{f['fault']}/{f['position']}": check_row(f) for f in rows}
    held = sum(c["held"] for c in checks.values())
    return {"rows": len(checks), "held": held, "by_row": checks, "ok": bool(checks) and held == len(checks)}
