"""Reading arm logs: warnings counted by normalized message, and LMCache's own signals."""

from __future__ import annotations

import re
from collections import Counter

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PROC_PREFIX = re.compile(r"^(\((?:EngineCore|Worker|APIServer|EngineCore_DP\d+)[^)]*\)\s*)+")
_VLLM_LINE = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[(?P<where>[^\]]+)\]\s*(?P<msg>.*)$"
)
_LMC_LINE = re.compile(
    r"^\[[^\]]+\]\s+LMCache\s+(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):\s*(?P<msg>.*?)(?:\s+\((?P<where>[^()]*:\d+:[^()]*)\))?$"
)
_PY_WARNING = re.compile(r"^(?P<where>\S+\.py):\d+: (?P<cat>\w*Warning): (?P<msg>.*)$")
_VOLATILE = [
    (re.compile(r"0x[0-9a-fA-F]+"), "0x…"),
    (re.compile(r"\b[0-9a-f]{16,}\b"), "<hash>"),
    (re.compile(r"\d+(?:\.\d+)?"), "N"),
]
MAX_MESSAGE = 240


def clean_line(line: str) -> str:
    return _PROC_PREFIX.sub("", _ANSI.sub("", line.rstrip("\r\n")))


def normalize(message: str) -> str:
    """The message with numbers, addresses and hashes blanked, so repeats count together."""
    for pattern, repl in _VOLATILE:
        message = pattern.sub(repl, message)
    return message.strip()[:MAX_MESSAGE]


def parse_level(line: str) -> tuple[str, str] | None:
    """(level, message) for a vLLM, LMCache or Python-warnings log line, else None."""
    line = clean_line(line)
    m = _VLLM_LINE.match(line) or _LMC_LINE.match(line)
    if m:
        return m.group("level"), m.group("msg")
    m = _PY_WARNING.match(line)
    if m:
        return "WARNING", f"{m.group('cat')}: {m.group('msg')}"
    return None


def count_warnings(text: str) -> dict[str, int]:
    """WARNING and ERROR lines by normalized message ("LEVEL message")."""
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        parsed = parse_level(line)
        if parsed and parsed[0] in ("WARNING", "ERROR", "CRITICAL"):
            counts[f"{parsed[0]} {normalize(parsed[1])}"] += 1
    return dict(sorted(counts.items()))


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(clean_line(x) for x in text.splitlines()[-lines:])


# What differs between two iterations of the same engine loop: the time stamp (vLLM's `INFO 12-01 19:50:23`,
# LMCache's `[2026-12-01 19:50:37,523]`) and the request id. Nothing else is masked: lines that differ in a hit
# count or a MemoryObj address stay apart.
_LOOP_MASKS = (
    (re.compile(r"(\d{4}-\d{2}-\d{2})[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"), r"\1 T"),
    (re.compile(r"\b(\d{2}-\d{2}) \d{2}:\d{2}:\d{2}\b"), r"\1 T"),
    (re.compile(r"(Reqid:\s*|req_id=|request_id=|request id )[\w.:-]+"), r"\1X"),
)
STALL_WINDOW = 2000  # the log's last lines that a timed-out arm's diagnosis reads
QUOTE = 160
TOP = 10  # how many of the most frequent lines the diagnosis sums


def mask_times_and_ids(line: str) -> str:
    """The line with its time stamps and request ids masked (_LOOP_MASKS): one loop iteration's lines alike."""
    for pattern, repl in _LOOP_MASKS:
        line = pattern.sub(repl, line)
    return line


def _loop_key(line: str) -> str:
    return mask_times_and_ids(clean_line(line)).strip()


def stall_text(text: str, window: int = STALL_WINDOW) -> str:
    """What a timed-out arm's log says about how it ended, as facts (no threshold decides anything): its size
    and line count, then how many distinct lines its last `window` lines hold once time stamps and request
    ids are masked, how many of them the TOP most frequent make up, and the most frequent with its count. An
    engine that stopped making progress while it kept scheduling logs the same few lines for minutes; one
    that hung silently ends on whatever it logged last. '' for an empty log. On the H200 (LMCacheMPConnector,
    preemption, async scheduling on):

    'its log: 5.1 MB, 22,373 lines; its last 2,000 lines are 10 distinct lines (times and request ids
    masked); the 10 most frequent make up 2,000 of them, the first 1,991 times: "[2026-12-02 T] LMCache
    WARNING: <preempted> by preempted requests: {...} (lmcache_mp_connector.py:142:...)"'"""
    keys = [k for k in map(_loop_key, text.splitlines()) if k]
    if not keys:
        return ""
    size = len(text.encode("utf-8", errors="replace"))
    shown = f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size:,} bytes"
    last = keys[-window:]
    counts = Counter(last)
    common = counts.most_common(TOP)
    top, n = common[0]
    quote = top if len(top) <= QUOTE else top[: QUOTE - 1] + "…"
    covered = sum(c for _, c in common)
    return (
        f"its log: {shown}, {len(keys):,} lines; its last {len(last):,} lines are {len(counts):,} distinct lines "
        f"(times and request ids masked); the {len(common)} most frequent make up {covered:,} of them, the first "
        f'{n:,} times: "{quote}"'
    )
