"""Work directories (repro.run.workdir): each records the kit that owns it (pid and start time), and a
later run removes those whose kit is no longer running, with the connector stores they list."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from repro.run import workdir


def _stale(parent: Path, name: str, owner: dict, tmp: Path) -> tuple[Path, Path]:
    """A work directory as a kit leaves it when killed: its owner record, KV tensors, a connector store."""
    work = parent / f".{name}.work-abc123"
    (work / "kv" / "arm").mkdir(parents=True)
    (work / "kv" / "arm" / "0.reused.0.pt").write_bytes(b"x" * 1000)
    store = tmp / f"kvkit-{name}-store"
    (store / "ExampleConnector-1").mkdir(parents=True)
    record = {**workdir.owner_record(store), **owner}
    (work / workdir.OWNER_FILE).write_text(json.dumps(record))
    return work, store


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_work_directory_records_its_owner_and_its_store(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # $TMPDIR, as tempfile read it
    (tmp_path / "tmp").mkdir()
    (tmp_path / "out").mkdir()
    work, scratch = workdir.make_work_dir(tmp_path / "out" / "report.json")
    assert work.parent == tmp_path / "out" and work.name.startswith(".report.work-")
    assert scratch.parent == tmp_path / "tmp" and scratch.is_dir()
    record = json.loads((work / workdir.OWNER_FILE).read_text())
    assert record["kind"] == workdir.OWNER_KIND and record["schema_version"] == workdir.OWNER_SCHEMA_VERSION
    assert record["pid"] == os.getpid() and record["start_ticks"] == workdir.start_ticks(os.getpid())
    assert record["scratch"] == str(scratch) and record["host"] == socket.gethostname()
    assert workdir.owner_gone(record) is False
    workdir.remove_work_dir(work, scratch)
    assert not work.exists() and not scratch.exists()


def test_only_the_work_directories_of_kits_no_longer_running_are_removed(tmp_path):
    parent = tmp_path / "out"
    parent.mkdir()
    dead_work, dead_store = _stale(parent, "dead", {"pid": _dead_pid()}, tmp_path)
    # the pid is alive (this process) but it is not the kit that recorded it: another start time
    reused_work, reused_store = _stale(
        parent, "reused", {"start_ticks": workdir.start_ticks(os.getpid()) - 1}, tmp_path
    )
    live_work, live_store = _stale(parent, "live", {}, tmp_path)  # this process: running
    elsewhere, elsewhere_store = _stale(parent, "elsewhere", {"pid": _dead_pid(), "host": "another-host"}, tmp_path)
    bare = parent / ".bare.work-xyz"  # no owner record (being made, or an older kit's): cannot tell
    bare.mkdir()
    unrelated = parent / ".hidden"
    unrelated.mkdir()
    removed = workdir.sweep_stale(parent)
    assert sorted(r.work for r in removed) == sorted([dead_work, reused_work])
    for path in (dead_work, dead_store, reused_work, reused_store):
        assert not path.exists(), path
    for path in (live_work, live_store, elsewhere, elsewhere_store, bare, unrelated):
        assert path.exists(), path
    line = workdir.sweep_line(removed)
    assert "\n" not in line and dead_work.name in line and reused_work.name in line and "no longer running" in line
    assert workdir.sweep_line([]) is None


@pytest.mark.parametrize(
    "garbage",
    ["{", "[]", json.dumps({"kind": "something-else"}), json.dumps({"kind": "kvkit-work-owner", "schema_version": 99})],
)
def test_an_owner_record_it_cannot_read_is_left_alone(tmp_path, garbage):
    work = tmp_path / ".r.work-1"
    work.mkdir()
    (work / workdir.OWNER_FILE).write_text(garbage)
    assert workdir.sweep_stale(tmp_path) == [] and work.exists()


def test_a_work_directory_whose_owner_record_cannot_be_written_is_not_left_behind(tmp_path, monkeypatch):
    """A full disk between the folder and its owner record (found by the chaos run): without the record
    no later run could sweep the folders, so the kit removes both before the error goes on."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", None)

    def full(path, obj):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(workdir, "write_json_atomic", full)
    with pytest.raises(OSError, match="No space left"):
        workdir.make_work_dir(tmp_path / "report.json")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert list((tmp_path / "tmp").iterdir()) == []
