"""A child's disk use, watched (repro.run.diskwatch, repro.run.runner): a child that writes past the cap is killed
with its group and named disk-runaway with the figures; no child starts, and a running one is stopped, where
the free space is under the floor (disk-low). After an H200 run's preemption children grew their work
directory at ~450 MB/s until the 64 GiB disk was full and the run lost everything. The engine child here is
tests/fake_engine.py (failure handling only)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from test_runner import _alive, run_fake

from repro.contract.failure import DISK_LOW, DISK_RUNAWAY, FAILURE_KINDS
from repro.contract.job import ArmSpec, EngineConfig, ProbeJob, build_job
from repro.paths import SCHEMAS_DIR
from repro.run import diskwatch, runner
from repro.run.diskwatch import GB, DiskLimits, DiskWatch, cut_log, floor_for, measure

MB = 10**6
CAP = 20 * MB  # the fake floods at 20 MB a second: past the cap in about a second


def _run(tmp_path: Path, mode: str) -> runner.ArmOutcome:
    """The fake child as a baseline arm with a KV audit directory, under a 20 MB cap, polled twice a second."""
    engine = EngineConfig("fake", None, "float32", 0, 0.1, 256, 16, "cpu")
    probes = [ProbeJob("p", {"token_ids": list(range(1, 40))}, 2)]
    kv_dir = str(tmp_path / "kv" / "baseline")
    job = build_job(ArmSpec("baseline", "baseline"), engine, probes, max_tokens=4, logprobs=2, kv_audit_dir=kv_dir)
    return run_fake(tmp_path, mode, job=job, disk=DiskLimits(cap_bytes=CAP, poll_s=0.5))


def _assert_group_gone(tmp_path: Path) -> None:
    for name in ("baseline.child.pid", "baseline.grandchild.pid"):
        pid = int((tmp_path / "pids" / name).read_text())
        assert not _alive(pid), f"{name} {pid} is still running"
    assert runner.group_members(int((tmp_path / "pids" / "baseline.child.pid").read_text())) == []


def _flooded(tmp_path: Path) -> int:
    """The bytes the fake says it wrote before it was killed (its own count, not the kit's)."""
    return int((tmp_path / "pids" / "baseline.flooded").read_text()) * MB


def test_a_child_flooding_its_kv_audit_directory_is_killed_and_named(tmp_path):
    out = _run(tmp_path, "flood-kv")
    assert out.result is None and out.failure is not None and out.failure.kind == DISK_RUNAWAY
    detail = out.failure.detail
    assert _flooded(tmp_path) < 10 * CAP, detail  # killed well before it wrote ten times the cap
    written = int(re.search(r"grew by .*?\((\d+) bytes\)", detail).group(1))
    assert CAP < written < 10 * CAP
    assert "over the cap of 20.0 MB" in detail
    assert re.search(r"largest: kv/baseline/\d{6}\.computed\.000\.pt \d", detail), detail  # the largest file
    assert re.search(r"kv/baseline \d.* in \d+ files", detail), detail  # and its directory
    assert "MB/s" in detail and "since it started" in detail  # how fast
    assert "killed (SIGKILL)" in detail and "emptied to give the space back: kv/baseline" in detail
    assert list((tmp_path / "kv" / "baseline").iterdir()) == []
    assert "mode=flood-kv" in out.failure.log_tail
    _assert_group_gone(tmp_path)


def test_a_child_flooding_its_own_log_is_killed_and_the_log_kept_cut(tmp_path):
    out = _run(tmp_path, "flood-log")
    assert out.failure.kind == DISK_RUNAWAY
    assert _flooded(tmp_path) < 10 * CAP
    assert "largest: baseline.log " in out.failure.detail and "its log was cut" in out.failure.detail
    kept = (tmp_path / "baseline.log").read_bytes()
    assert len(kept) < 2 * (1 << 20) + 1000, "a runaway log is kept whole beside the report"
    assert kept.startswith(b"fake-engine: arm=baseline mode=flood-log") and b"were cut here" in kept
    _assert_group_gone(tmp_path)


def test_no_child_starts_where_the_free_space_is_under_the_floor(tmp_path, monkeypatch):
    total = 64 * 2**30
    monkeypatch.setattr(diskwatch.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(total, total - GB, GB))
    out = _run(tmp_path, "ok")
    assert out.failure.kind == DISK_LOW and "not started" in out.failure.detail
    assert f"1.0 GB free ({GB} bytes)" in out.failure.detail and "floor of 2.0 GB" in out.failure.detail
    assert not (tmp_path / "pids" / "baseline.child.pid").exists(), "the child was started"
    assert "was not started" in (tmp_path / "baseline.log").read_text()  # the log the report cites says why


def test_a_running_child_is_stopped_when_the_free_space_falls_under_the_floor(tmp_path, monkeypatch):
    total, calls = 64 * 2**30, []

    def usage(path):
        calls.append(path)
        free = 50 * GB if len(calls) == 1 else GB // 2  # plenty at the start, then something filled the disk
        return shutil._ntuple_diskusage(total, total - free, free)

    monkeypatch.setattr(diskwatch.shutil, "disk_usage", usage)
    out = _run(tmp_path, "hang")
    assert out.failure.kind == DISK_LOW and "was stopped" in out.failure.detail and "500 MB free" in out.failure.detail
    _assert_group_gone(tmp_path)


def test_a_child_under_the_cap_and_above_the_floor_delivers(tmp_path):
    out = _run(tmp_path, "ok")
    assert out.failure is None and out.result is not None


def test_the_floor_is_2_gb_or_5_percent_of_a_small_filesystem():
    assert floor_for(64 * 2**30) == 2 * GB
    assert floor_for(16 * 2**20) == int(16 * 2**20 * 0.05)  # the chaos run's 16 MiB tmpfs still runs children


def test_measure_counts_blocks_below_a_directory_and_names_the_largest(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "big").write_bytes(os.urandom(300_000))
    (tmp_path / "a" / "small").write_bytes(b"x" * 10)
    (tmp_path / "a" / "link").symlink_to("/usr")  # never followed
    use = measure(tmp_path / "a", largest=1)
    assert use.files == 3 and 300_000 <= use.bytes < 400_000
    assert use.largest[0][1] == str(tmp_path / "a" / "b" / "big")


def test_the_watch_measures_growth_since_it_began_and_how_fast(tmp_path):
    (tmp_path / "old").write_bytes(os.urandom(500_000))  # there before the child: not its doing
    now = [0.0]
    watch = DiskWatch([tmp_path], tmp_path, DiskLimits(cap_bytes=1_050_000), clock=lambda: now[0])
    for t in range(1, 13):
        now[0] = float(t)
        (tmp_path / f"f{t}").write_bytes(os.urandom(100_000))
        if watch.poll() is not None:
            break
    assert watch.stop[0] == DISK_RUNAWAY and t == 11, watch.stop
    assert "in the last 10 s" in watch.stop[1] and "in 11 s since it started" in watch.stop[1]


def test_cut_log_keeps_the_head_and_the_tail(tmp_path):
    log = tmp_path / "x.log"
    log.write_bytes(b"H" * 100 + b"M" * 1000 + b"T" * 100)
    assert cut_log(log, head=100, tail=100) == 1000
    text = log.read_bytes()
    assert text.startswith(b"H" * 100) and text.endswith(b"T" * 100) and b"M" not in text
    assert cut_log(log, head=10_000, tail=10_000) == 0  # a short log is kept whole


def test_the_report_schema_lists_every_failure_kind():
    schema = json.loads((SCHEMAS_DIR / "report.schema.json").read_text())
    assert set(FAILURE_KINDS) <= set(schema["$defs"]["failure_kind"]["enum"])


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_cap_that_is_not_positive_is_one_line_and_exit_2(tmp_path, value):
    from kvkit_testutil import run_cli

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    proc = run_cli(
        ["--model", str(tmp_path / "m"), "--fixture", "fixtures/selftest-cpu.json", "--report", str(tmp_path / "r.json"),
         "--engine-module", "tests.fake_engine", "--max-child-disk-gb", value],
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --max-child-disk-gb must be a positive number of GB"
    assert not (tmp_path / "r.json").exists()
