"""The engine child's own contract handling, without an engine: what it writes when the run raises
or when its result cannot be serialized (imports the child module, never vLLM)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from repro.contract.job import ArmSpec, EngineConfig, ProbeJob, build_job
from repro.contract.result import EXIT_OK, EXIT_RAISED, ArmResult
from repro.engine import child

ENGINE = EngineConfig("m", None, "float32", 0, 0.1, 256, 16, "cpu")


def _job(tmp_path):
    job = build_job(
        ArmSpec("baseline", "baseline"), ENGINE, [ProbeJob("p", {"token_ids": [1, 2]}, 1)], max_tokens=2, logprobs=2
    )
    return job.__class__(**{**job.__dict__, "output": str(tmp_path / "out.json")})


def test_a_result_that_cannot_be_serialized_is_raised_not_nonzero_exit(tmp_path, monkeypatch):
    """Bug d (child side): a NaN in the result used to escape as a traceback and exit 1."""
    monkeypatch.setattr(child, "run_job", lambda job, keep: ArmResult(arm="baseline", engine_start_s=math.nan))
    job = _job(tmp_path)
    assert child.run_and_write(job, []) == EXIT_RAISED
    written = ArmResult.from_json(json.loads((tmp_path / "out.json").read_text()))
    assert written.error is not None and written.error.type == "ValueError"
    assert "JSON" in written.error.message or "nan" in written.error.message.lower()


def test_a_run_that_raises_writes_its_error_and_exits_raised(tmp_path, monkeypatch):
    def boom(job, keep):
        raise RuntimeError("engine exploded")

    monkeypatch.setattr(child, "run_job", boom)
    assert child.run_and_write(_job(tmp_path), []) == EXIT_RAISED
    written = ArmResult.from_json(json.loads((tmp_path / "out.json").read_text()))
    assert (written.error.type, written.error.message) == ("RuntimeError", "engine exploded")


def test_a_good_result_is_written_and_exits_ok(tmp_path, monkeypatch):
    monkeypatch.setattr(child, "run_job", lambda job, keep: ArmResult(arm="baseline", engine_start_s=1.0))
    assert child.run_and_write(_job(tmp_path), []) == EXIT_OK
    assert ArmResult.from_json(json.loads((tmp_path / "out.json").read_text())).engine_start_s == 1.0


def test_an_arm_started_during_the_preflight_waits_at_the_gate_for_go_or_stop(tmp_path, monkeypatch):
    import threading
    import time

    import pytest

    from repro.contract.job import PREFLIGHT_GATE_ENV, progress_path

    job = _job(tmp_path)
    monkeypatch.delenv(PREFLIGHT_GATE_ENV, raising=False)
    assert child.wait_for_preflight(job) == 0.0  # no gate: an arm started after the preflight
    gate = tmp_path / "preflight.gate"
    monkeypatch.setenv(PREFLIGHT_GATE_ENV, str(gate))
    threading.Timer(0.5, lambda: gate.write_text("go\n")).start()
    t0 = time.monotonic()
    waited = child.wait_for_preflight(job)
    assert 0.4 <= waited <= time.monotonic() - t0
    assert json.loads(Path(progress_path(job.output)).read_text())["stage"] == "waiting for the preflight"
    gate.write_text("stop\n")
    with pytest.raises(child.PreflightStopped, match="preflight failed"):
        child.wait_for_preflight(job)
