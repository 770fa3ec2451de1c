"""tests/gpu/trim_log.py: a runaway engine log cut to head and tail, the cut counted and the whole log's
sum kept; a short log left whole; bad input one line and exit 2."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("trim_log", ROOT / "tests" / "gpu" / "trim_log.py")
trim_log = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trim_log)


def _log(tmp_path: Path) -> tuple[Path, list[str]]:
    lines = [f"start line {i}" for i in range(5)]
    for i in range(300):  # a spinning scheduler: the same two lines with new times and request ids
        lines.append(f"[2026-12-01 19:50:{i % 60:02d},{i:03d}] LMCache INFO: Reqid: cmpl-{i}-0, hit tokens: 1280")
        lines.append(f"INFO 12-01 19:51:{i % 60:02d} [x.py:1] Pin count is negative: -1")
    lines += [f"end line {i}" for i in range(3)] + ["z" * 500]
    path = tmp_path / "arm.log"
    path.write_text("\n".join(lines) + "\n")
    return path, lines


def test_a_runaway_log_keeps_head_tail_and_a_count_of_the_cut(tmp_path):
    path, lines = _log(tmp_path)
    whole = path.read_bytes()
    assert trim_log.trim(path, head=5, tail=4, top=1, day="2026-12-01") is True
    out = path.read_text().splitlines()
    assert out[:5] == lines[:5] and out[-4:] == lines[-4:]
    header = out[5]
    assert f"{len(lines) - 9} lines cut" in header and f"{len(whole)} bytes, {len(lines)} lines" in header
    assert hashlib.sha256(whole).hexdigest() in header and "(2 distinct)" in header
    # masked, the 300 iterations are two distinct lines; top=1 lists one and counts the rest
    assert out[6] == "[     300 x] [2026-12-01 T] LMCache INFO: Reqid: X, hit tokens: 1280"
    assert out[7] == "[... 1 more distinct lines, 300 in all]"
    assert out[8] == "[end of the cut; the log's last 4 lines follow]"
    assert len(out) == 5 + 4 + 4


def test_a_short_log_is_left_whole_and_bad_input_is_one_line(tmp_path, capsys):
    path, lines = _log(tmp_path)
    before = path.read_bytes()
    assert trim_log.trim(path, head=len(lines), tail=1) is False
    assert path.read_bytes() == before
    assert trim_log.main([str(tmp_path / "missing.log")]) == 2
    assert trim_log.main([str(path), "--head", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("trim_log: ") for line in err)
    assert path.read_bytes() == before
