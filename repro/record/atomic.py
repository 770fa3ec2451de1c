"""The one writer for every file the kit produces: temp file beside the target, fsync, replace."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_bytes_atomic(path: Path | str, data: bytes) -> None:
    """Write data so that a reader sees either the old file or the whole new one, never a part.

    The temp file lives in the destination directory: a rename across filesystems is a copy.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would make published reports unreadable
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _scalar(value: object) -> bool:
    return value is None or isinstance(value, (bool, int, float))


def _pretty(value: object, indent: str) -> str:
    if isinstance(value, dict):
        if not value:
            return "{}"
        inner = indent + "  "
        items = (f"{inner}{_plain(k)}: {_pretty(v, inner)}" for k, v in sorted(value.items()))
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list):
        if not value:
            return "[]"
        if all(_scalar(v) for v in value):
            return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(", ", ": "))
        inner = indent + "  "
        return "[\n" + ",\n".join(inner + _pretty(v, inner) for v in value) + "\n" + indent + "]"
    return _plain(value)


def _plain(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def dumps_json(obj: object) -> str:
    """Deterministic serialization; unknown types fail loudly (no default=str).

    json.dumps(indent=2, sort_keys=True) layout, except that an array holding only numbers,
    booleans and nulls stays on one line: token IDs, logprobs and the KV audit's block x layer grids
    took one line per item, and a report of five audited arms went over 1 MiB. The value is first
    normalized through json (tuples become lists, keys strings, unknown types and NaN raise), so the
    text parses back to exactly what json.dumps would have written."""
    normal = json.loads(json.dumps(obj, sort_keys=True, ensure_ascii=False, allow_nan=False))
    return _pretty(normal, "") + "\n"


def write_json_atomic(path: Path | str, obj: object) -> None:
    write_bytes_atomic(path, dumps_json(obj).encode("utf-8"))
