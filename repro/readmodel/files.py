"""Where the reports of a folder are: every committed format, `NAME.json` and `NAME.json.xz` (a report over the 1 MiB
a committed file keeps to goes xz-compressed; repro.record.report.load_report reads both), found the same way by
every view that lists a folder (the site, its catalog)."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

from repro.record.report import report_bytes

JSON, XZ = ".json", ".json.xz"
REPORT_SUFFIXES = (JSON, XZ)


def stem_of(path: Path) -> str:
    """'NAME' for NAME.json and NAME.json.xz alike."""
    name = Path(path).name
    return name[: -len(XZ)] if name.endswith(XZ) else name[: -len(JSON)] if name.endswith(JSON) else Path(name).stem


def json_files(folder: Path) -> list[Path]:
    """The folder's JSON files in either format, sorted by stem, hidden ones left out; where NAME.json and
    NAME.json.xz are both there (`xz -dk` restores the one beside the other) the plain one stands for both."""
    folder = Path(folder)
    found = {p.name: p for s in REPORT_SUFFIXES for p in folder.glob(f"*{s}") if p.is_file()}
    kept = [p for n, p in found.items() if not n.startswith(".") and not (n.endswith(XZ) and n[: -len(".xz")] in found)]
    return sorted(kept, key=lambda p: (stem_of(p), p.name))


def read_json(path: Path) -> object:
    """A JSON file in either format, parsed; None when it cannot be read or is not JSON (the strict loader then says
    what is wrong)."""
    try:
        return json.loads(report_bytes(path))
    except (OSError, ValueError, lzma.LZMAError):
        return None


def kind_of(path: Path) -> str | None:
    """The file's `kind`; None when it is not a JSON object."""
    data = read_json(path)
    return data.get("kind") if isinstance(data, dict) else None
