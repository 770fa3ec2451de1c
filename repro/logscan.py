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
