"""The machinery of the shared end-to-end runs (tests/e2e_runs.py), without an engine: a run is made once, ahead
by the lane or by its first reader, every reader gets it (or its error), and a held lane starts nothing."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from e2e_runs import SHARED, Lane, Shared


def _lane_with(monkeypatch, tmp_path_factory, *runs: Shared) -> Lane:
    for run in runs:
        monkeypatch.setitem(SHARED, run.name, run)
    return Lane("model", tmp_path_factory)


def _items(*names: str) -> list:
    return [SimpleNamespace(fixturenames=[name]) for name in names]


def test_each_run_is_made_once_by_the_lane_or_its_first_reader_and_every_reader_gets_it(monkeypatch, tmp_path_factory):
    made: list[str] = []

    def make(model, tmp):
        made.append(tmp.name)
        return object()

    first, second, third = (Shared(name, make, lane=True) for name in ("run_b", "run_a", "run_c"))
    lane = _lane_with(monkeypatch, tmp_path_factory, first, second, third)
    lane.start(_items("run_c", "run_b", "other", "run_a", "run_b"), first="run_c")  # run_c: the caller's
    values = {run.name: lane.read(run) for run in (third, second, first)}
    assert {run.name: lane.read(run) for run in (first, second, third)} == values  # made once each
    lane.stop()
    assert sorted(name.rstrip("0123456789") for name in made) == ["run_a", "run_b", "run_c"]


def test_an_error_reaches_every_reader(tmp_path_factory):
    def make(model, tmp):
        raise ValueError("the run failed")

    run = Shared("broken", make, lane=False)
    assert run.claim()
    run.make_now("model", tmp_path_factory)
    for _ in range(2):
        with pytest.raises(ValueError, match="the run failed"):
            run.value()


def test_a_held_lane_starts_nothing_and_gives_nothing_to_take(monkeypatch, tmp_path_factory):
    started = threading.Event()
    run = Shared("held", lambda model, tmp: started.set(), lane=True)
    lane = _lane_with(monkeypatch, tmp_path_factory, run)
    lane.hold()
    lane.start(_items("held"))
    assert not started.wait(0.5) and lane.take() is None
    lane.release()
    assert started.wait(30)
    lane.stop()
    assert run.done() and run.value() is None
