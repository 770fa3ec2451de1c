"""The KV block size a run uses: the one asked for, or (--block-size auto) the one the kit chooses from what the
installed vLLM's attention backend takes (repro.engine.capabilities asks it). Pure: no vLLM, no files."""

from __future__ import annotations

AUTO = "auto"
# The block size the kit's figures and the reference case were made at (vLLM's GPU default); auto keeps it wherever
# the backend takes it, so a stack that takes 16 runs exactly as before.
PREFERRED_BLOCK_SIZE = 16


def accepted_text(accepted: dict) -> str:
    """'multiples of 32', '16 or 32', 'multiples of 16, or 48': what a backend takes, in words."""
    parts = [f"multiples of {b}" for b in accepted.get("multiple_of") or []]
    exact = [str(s) for s in accepted.get("exact") or []]
    if exact:
        parts.append(" or ".join(exact))
    return ", or ".join(parts) or "no block size"


def takes(accepted: dict, size: int) -> bool:
    """Whether a backend that takes `accepted` takes this block size."""
    return size in (accepted.get("exact") or []) or any(size % b == 0 for b in accepted.get("multiple_of") or [])


def choose_block_size(accepted: dict, prefer: int = PREFERRED_BLOCK_SIZE) -> int | None:
    """The smallest block size of at least `prefer` that the backend takes (prefer itself where it is taken);
    None where it takes none (an empty answer)."""
    candidates = [s for s in accepted.get("exact") or [] if s >= prefer]
    candidates += [-(-prefer // b) * b for b in accepted.get("multiple_of") or [] if b > 0]
    return min(candidates) if candidates else None


def block_size_problem(accepted: dict, size: int, who: str) -> str | None:
    """Why --block-size `size` cannot run on this backend (one line naming who answered), or None."""
    if takes(accepted, size):
        return None
    pick = choose_block_size(accepted)
    hint = f"; use --block-size {pick} (or auto)" if pick else ""
    return f"--block-size {size}: {who} takes {accepted_text(accepted)} only{hint}"
