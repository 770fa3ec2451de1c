"""How numbers, index runs, blocks, seconds and logprob gaps are written as short text: pure
functions over plain values, shared by the read model (repro.readmodel) and the KV audit."""

from __future__ import annotations

import json
import re

from repro.judge.compare import NEAR_TIE_NATS
from repro.judge.verdict import UNCLASSED, classify_divergence

_HEX = re.compile(r"^[0-9a-f]{7,40}$")
GAP_DIGITS = 3  # decimals of a gap in nats; more only where 3 would show a number of the other class
NOT_RECORDED = "not recorded"


def is_commit_hash(text: str) -> bool:
    return bool(_HEX.match(text))


def number(value: object) -> str:
    """An error measure in three significant digits ('3.1e-07', '0.25'); '—' when not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "—"
    return f"{value:.3g}"


def spans(indices: list[int] | tuple[int, ...]) -> list[tuple[int, int]]:
    """Sorted distinct indices as inclusive runs: [0, 1, 2, 5] -> [(0, 2), (5, 5)]."""
    runs: list[tuple[int, int]] = []
    for i in sorted(set(indices)):
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def span_text(indices: list[int] | tuple[int, ...]) -> str:
    """'0–15, 20': runs of indices, en dash between the ends."""
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in spans(indices))


def blocks_text(blocks: list[int] | tuple[int, ...], block_size: int | None) -> str:
    """'blocks 0–15 (tokens 0–255)'; 'none' for no block; the tokens left out when the block size is unknown."""
    if not blocks:
        return "none"
    text = f"block{'s' if len(set(blocks)) > 1 else ''} {span_text(blocks)}"
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        return text
    tokens = ", ".join(f"{a * block_size}–{(b + 1) * block_size - 1}" for a, b in spans(blocks))
    return f"{text} (tokens {tokens})"


def shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def show(value: object) -> str:
    """One scalar or structure as deterministic text; strings as they are."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def flatten(data: object, prefix: str = "") -> list[tuple[str, str]]:
    """Nested dicts as sorted dotted keys; lists and scalars printed whole."""
    if isinstance(data, dict) and data:
        out: list[tuple[str, str]] = []
        for key in sorted(data):
            out.extend(flatten(data[key], f"{prefix}.{key}" if prefix else str(key)))
        return out
    return [(prefix, show(data))]


def seconds(value: object, unit: bool = True) -> str:
    """'40.1 s', '61 s' ('40.1' without the unit); '?' when not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "? s" if unit else "?"
    return f"{round(value, 1):g}" + (" s" if unit else "")


def gap_text(gap: object, cls: str | None = None) -> str:
    """'gap 0.045 nats'; 'no top-2 gap recorded'. The number printed beside a class never reads as the
    other class: 0.0996 is shown as 0.0996, not 0.100, and a near-tie whose gap the report rounded
    onto the threshold as 'gap <0.1 nats'. cls: the divergence's class (default: the gap's own)."""
    cls = cls or classify_divergence(gap)
    if cls == UNCLASSED or classify_divergence(gap) == UNCLASSED:
        return "no top-2 gap recorded"
    for digits in range(GAP_DIGITS, 7):  # the report keeps 6 decimals
        text = f"{gap:.{digits}f}"
        if classify_divergence(float(text)) == cls:
            return f"gap {text} nats"
    return f"gap <{NEAR_TIE_NATS:g} nats"


def class_text(cls: str, gap: object, count: int = 1) -> str:
    """'near-tie, gap 0.045 nats'; 'decisive ×3, gap 0.682 nats' (3 reuses diverged there)."""
    return f"{cls}{f' ×{count}' if count > 1 else ''}, {gap_text(gap, cls)}"


# An absolute path of at least two parts, not inside a URL or another path: '/tmp/kvkit-x/model'.
_ABS_PATH = re.compile(r"(?<![\w./~:-])/(?:[\w.+~@-]+/)+[\w.+~@-]*")


def _path_name(match: re.Match) -> str:
    parts = [p for p in match.group().split("/") if p]
    keep = 3 if len(parts) >= 3 and parts[-2] == "bin" else 1  # an interpreter: its environment's name
    return "…/" + "/".join(parts[-keep:])


def machine_path_name(text: str) -> str:
    """Every absolute path of the machine that made a report, in a text, shown by its name: '/tmp/kvkit-
    x/model' as '…/model', '/opt/envs/lmcache-0.5.4/bin/python' as '…/lmcache-0.5.4/bin/python'. The full
    value stays in the report's raw JSON."""
    return _ABS_PATH.sub(_path_name, text)
