"""GitHub-flavoured Markdown pieces every Markdown view shares: a table with escaped cells, a token list
that shrinks to fit, and a divergence's logprob margins in words."""

from __future__ import annotations

from repro.judge.verdict import NEAR_TIE
from repro.readmodel import margin_class

MAX_CELL = 200


def escape_cell(text: str) -> str:
    """A table cell on one line, with pipes escaped so they cannot open a new column."""
    text = " ".join(str(text).split()).replace("\\", "\\\\").replace("|", "\\|")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def markdown_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(escape_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def format_tokens(ids: list[int] | None, limit: int | None) -> str:
    if ids is None:
        return "(not recorded)"
    if limit is not None and len(ids) > limit:
        return f"`{' '.join(map(str, ids[:limit]))}` … ({len(ids) - limit} more, truncated to fit; full list in the report JSON)"
    return f"`{' '.join(map(str, ids))}`"


def margin_text(m: dict | None) -> str:
    if not m:
        return "margin: not recorded"
    fmt = lambda x: "n/a" if x is None else f"{x:.3f}"
    base = (
        f"baseline margin {fmt(m.get('baseline_margin'))}"
        if m.get("baseline_margin") is not None
        else f"baseline gap ≥ {fmt(m.get('baseline_gap_lower_bound'))} (reuse token outside its top-k)"
    )
    cls = margin_class(m)
    tie = f" · **{cls}**" if cls == NEAR_TIE else f" · {cls}"
    return (
        f"baseline token {m.get('baseline_token')} vs reuse token {m.get('reuse_token')}; {base} nats, "
        f"reuse margin {fmt(m.get('reuse_margin'))} nats, baseline top-1/top-2 gap {fmt(m.get('baseline_top_gap'))}{tie}"
    )
