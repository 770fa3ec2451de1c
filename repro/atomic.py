"""The one writer for every file the kit produces: temp file beside the target, fsync, replace."""

from __future__ import annotations

import json
import os
import re
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


# An array of numbers, booleans and nulls only (no strings, objects or arrays inside), as json.dumps
# indents it: one item per line.
_SCALAR_ARRAY = re.compile(
    r"\[(?:\s*(?:-?\d[\d.eE+-]*|true|false|null)\s*,)*\s*(?:-?\d[\d.eE+-]*|true|false|null)\s*\]"
)


def dumps_json(obj: object) -> str:
    """Deterministic serialization; unknown types fail loudly (no default=str). Indented, except that
    an array of plain numbers, booleans and nulls stays on one line: token IDs and the KV audit's
    block x layer grids would otherwise take one line per item (a report of five audited arms went
    over 1 MiB)."""
    text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)
    return _SCALAR_ARRAY.sub(lambda m: re.sub(r"\s+", "", m.group(0)).replace(",", ", "), text) + "\n"


def write_json_atomic(path: Path | str, obj: object) -> None:
    write_bytes_atomic(path, dumps_json(obj).encode("utf-8"))
