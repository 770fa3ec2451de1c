"""Cut a runaway engine log to its head and tail, keeping a count of what was cut.

    python tests/gpu/trim_log.py LOG [LOG ...] [--head 400] [--tail 200] [--top 30]

An engine that stops making progress can log one iteration's lines every few milliseconds until its
time limit (tens of MB). An imported report keeps such a log as its first HEAD and last TAIL lines; in
between, one line says how many lines were cut, the whole log's size, line count and SHA-256, and then
the TOP most frequent cut lines, with times and request ids masked and each cut at 240 characters,
each with its count. A log of at most HEAD + TAIL lines is left as it is. The file is replaced
atomically; the original's SHA-256 stays in it, so a kept copy can be matched.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere: the kit's repro
from repro.judge.logscan import mask_times_and_ids  # after the kit's root is on the path

WIDTH = 240


def mask(line: str) -> str:
    return mask_times_and_ids(line)[:WIDTH]


def trim(path: Path, head: int = 400, tail: int = 200, top: int = 30, day: str | None = None) -> bool:
    """Trim PATH in place; False when it is short enough to keep whole."""
    data = path.read_bytes()
    lines = data.decode("utf-8", errors="replace").splitlines()
    if len(lines) <= head + tail:
        return False
    cut = lines[head : len(lines) - tail]
    counts = Counter(mask(line) for line in cut)
    day = day or datetime.now(timezone.utc).strftime("%Y-%m-%d")
    out = lines[:head]
    out.append(
        f"[kvkit import, {day}: {len(cut)} lines cut from the middle of this log; the whole log was {len(data)} "
        f"bytes, {len(lines)} lines, sha256 {hashlib.sha256(data).hexdigest()}. The cut lines, with times and "
        f"request ids masked and each cut at {WIDTH} characters, counted ({len(counts)} distinct):]"
    )
    listed = counts.most_common(top)
    out += [f"[{n:8d} x] {text}" for text, n in listed]
    if len(counts) > len(listed):
        rest = sum(counts.values()) - sum(n for _, n in listed)
        out.append(f"[... {len(counts) - len(listed)} more distinct lines, {rest} in all]")
    out.append(f"[end of the cut; the log's last {tail} lines follow]")
    out += lines[len(lines) - tail :]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(out) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--head", type=int, default=400)
    ap.add_argument("--tail", type=int, default=200)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    if min(args.head, args.tail, args.top) < 1:
        print("trim_log: --head, --tail and --top must be at least 1", file=sys.stderr)
        return 2
    for log in args.logs:
        if not log.is_file():
            print(f"trim_log: {log}: not a file", file=sys.stderr)
            return 2
    for log in args.logs:
        before = log.stat().st_size
        done = trim(log, args.head, args.tail, args.top)
        print(f"{log}: {'cut, ' + str(before) + ' -> ' + str(log.stat().st_size) + ' bytes' if done else 'kept whole'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
