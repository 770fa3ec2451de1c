"""The real-engine runs of the end-to-end tests, each made once per test session and shared (an engine start costs
tens of seconds on two cores), and the lane that makes the one-core runs ahead while the tests go on.

A run is a session fixture (shared_run): its value is computed once, by the first test that asks for it, or
earlier by the lane. Whatever order the tests run in, each gets the same finished run: none depends on another
test having run first. Several files read one report, each asserting its own things on it:

- selftest_run: the CPU self-test as `make repro PROFILE=cpu KERNELS=generic` runs it on two cores (two arms at
  a time), under ATen's portable kernels: tests/test_e2e_cpu.py (its report contract, verdicts, KV blame) and
  tests/test_e2e_kernels.py (the expectations hold under the variant, and the report names it). The self-test on
  the machine's own kernels runs in tests/test_kit.py (from the unpacked kit, whose acceptance must match), and
  every other end-to-end test runs those kernels.
- selftest_sequential_run: the same, one arm after another (--jobs 1, --quiet), every arm child spawned
  (KVKIT_WARM_IMPORT=0): tests/test_e2e_cpu.py compares it with selftest_run (arms at once against one after
  another), tests/test_warm_launcher.py says which was forked, and tests/test_e2e_frontend.py reads its baseline and
  native arms as the sync front end's.
- served_selftest_run: the self-test again with `--frontend server` (every arm a `vllm serve` process the kit
  starts, over HTTP, in vLLM's own engine layout: the engine core and its worker in processes of their own, where
  every offline CPU run takes the one-process default), two arms at a time as selftest_run (--jobs changes how many
  arm children run at once and pins each one's OpenMP thread to a core of its own, not what an arm does:
  repro.plan.arms.arm_slots): tests/test_e2e_served.py compares it with selftest_run request by request, which holds
  the front end and the engine layout together to the same bits.
- planted_scenarios_run: fixtures/scenarios-cpu-planted.json (two gated planted faults, native) with the in-flight
  and eviction scenarios: tests/test_scenarios_planted_e2e.py, and tests/test_e2e_planted_scenario_gates.py reads
  its plain probes (the gates stay shut one request at a time).

The lane: a run made one arm at a time keeps one core of two busy, so the runs marked lane=True are made ahead,
one after another in a background thread, in the order the selected tests first ask for them, from the first
end-to-end test on (a test that asks for one first makes it itself; while it waits for one the lane is making, it
makes the lane's next). A test whose verdicts depend on the machine's load asks for machine_alone: it runs before
the lane starts (conftest orders it first), and holds the lane while it runs. The tests that keep about one core
busy (marker one_core) come next, beside the lane's runs. At the session's end the lane finishes the run it is
making and starts no other."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kvkit_testutil import run_cli

from repro.plan.options import selftest_cpu_argv
from repro.record.provenance import KERNEL_VARIANTS

SELFTEST_KERNELS = "generic"  # the variant CI's `make repro PROFILE=cpu KERNELS=generic` runs
PLANTED_SCENARIOS_FIXTURE = "fixtures/scenarios-cpu-planted.json"


@dataclass(frozen=True)
class Run:
    """A finished verifier run: its process (exit code, stdout, stderr), its report's path, and the report read
    back (None where none was written: the tests that read it then fail on what the run printed)."""

    proc: subprocess.CompletedProcess
    report: Path
    data: dict | None


def verify(argv: list[str], report: Path, timeout: float = 1500, env: dict | None = None) -> Run:
    proc = run_cli(argv, timeout=timeout, env=env)
    return Run(proc, report, json.loads(report.read_text(encoding="utf-8")) if report.is_file() else None)


class Shared:
    """One run, made once: by the first test that asks for it, or ahead by the lane. Its error, if any, is
    raised to every test that reads it."""

    def __init__(self, name: str, make: Callable[[str, Path], Any], lane: bool) -> None:
        self.name, self.make, self.lane = name, make, lane
        self._lock = threading.Lock()
        self._claimed = False
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def claim(self) -> bool:
        with self._lock:
            claimed, self._claimed = self._claimed, True
        return not claimed

    def make_now(self, model: str, factory: pytest.TempPathFactory) -> None:
        try:
            self._value = self.make(model, factory.mktemp(self.name))
        except BaseException as exc:  # noqa: BLE001 - every reader fails on it, as on a fixture's own error
            self._error = exc
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def value(self) -> Any:
        """The run's value once made (here or by the lane), or its error raised."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


SHARED: dict[str, Shared] = {}


def shared_run(name: str, make: Callable[[str, Path], Any], lane: bool = False):
    """A session fixture called name whose value is make(the tiny model's path, a fresh temporary folder), made
    once; lane=True: a run that keeps one core busy (one arm at a time), which the lane may make ahead."""
    known = SHARED.get(name)
    if known is not None and (known.make.__module__, known.make.__qualname__) != (make.__module__, make.__qualname__):
        raise ValueError(f"two shared runs named {name}")
    SHARED[name] = Shared(name, make, lane)

    @pytest.fixture(scope="session", name=name)
    def _fixture(e2e_lane: Lane, request: pytest.FixtureRequest):
        e2e_lane.start(request.session.items, first=name)  # a lane starting now makes the others beside this one
        return e2e_lane.read(SHARED[name])

    return _fixture


class Lane:
    """The background thread that makes the lane's runs ahead, one at a time (see the module's docstring)."""

    def __init__(self, model: str, factory: pytest.TempPathFactory) -> None:
        self.model, self.factory = model, factory
        self._cond = threading.Condition()
        self._queue: list[Shared] = []
        self._thread: threading.Thread | None = None
        self._held = self._busy = self._stopped = False

    def start(self, items: list[pytest.Item], first: str = "") -> None:
        """Queue the lane's runs that these tests read, in the order they first ask for them, but the one the
        caller makes first."""
        with self._cond:
            if self._thread is not None or self._stopped:
                return
            asked: dict[str, int] = {}
            for index, item in enumerate(items):
                for name in item.fixturenames:
                    if name in SHARED and SHARED[name].lane:
                        asked.setdefault(name, index)
            self._queue = [SHARED[name] for name in sorted(asked, key=asked.get) if name != first]
            self._thread = threading.Thread(target=self._work, name="e2e-lane", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: not self._held or self._stopped)
                if self._stopped or not self._queue:
                    return
                run = self._queue.pop(0)
                if not run.claim():  # a test made it first
                    continue
                self._busy = True
            try:
                run.make_now(self.model, self.factory)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def read(self, run: Shared) -> Any:
        """The run's value: made here if nobody has started it; else waited for, making the lane's next meanwhile
        (on the other core)."""
        if run.claim():
            run.make_now(self.model, self.factory)
        while not run.done():
            other = self.take()
            if other is None:
                break
            other.make_now(self.model, self.factory)
        return run.value()

    def take(self) -> Shared | None:
        """The lane's next run, claimed for the caller to make (None: nothing left, or the lane is held)."""
        with self._cond:
            while self._queue and not self._held:
                run = self._queue.pop(0)
                if run.claim():
                    return run
        return None

    def hold(self) -> None:
        """Let the run being made finish, and start no other until release."""
        with self._cond:
            self._held = True
            self._cond.wait_for(lambda: not self._busy)

    def release(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()

    def stop(self, wait: bool = True) -> None:
        """Start no other run; wait: until the one being made is done."""
        with self._cond:
            self._stopped = True
            self._queue.clear()
            self._cond.notify_all()
        if wait and self._thread is not None:
            self._thread.join()


LANES: list[Lane] = []


def stop_lanes() -> None:
    """Ctrl-C (conftest's pytest_keyboard_interrupt): the lane starts no other run; the session's end waits for the
    one it is making (a verifier got the terminal's signal too; conftest stops an engine started in this process)."""
    for lane in LANES:
        lane.stop(wait=False)


@pytest.fixture(scope="session")
def e2e_lane(tiny_model, tmp_path_factory):
    tmp_path_factory.getbasetemp()  # made here: two threads making it at once would race
    lane = Lane(tiny_model, tmp_path_factory)
    LANES.append(lane)
    yield lane
    lane.stop()


@pytest.fixture(autouse=True)
def e2e_runs_ahead(request):
    """From the first end-to-end test that can share the machine on, the lane makes its runs ahead."""
    if request.node.get_closest_marker("e2e") and "machine_alone" not in request.fixturenames:
        request.getfixturevalue("e2e_lane").start(request.session.items)


@pytest.fixture
def machine_alone(e2e_lane):
    """For a test whose verdicts depend on the machine's load: no run of the lane goes on while it runs."""
    e2e_lane.hold()
    yield
    e2e_lane.release()


def _selftest(model: str, tmp: Path) -> Run:
    report = tmp / f"selftest-{SELFTEST_KERNELS}.json"
    argv = [*selftest_cpu_argv(model, str(report)), "--jobs", "2"]
    return verify(argv, report, env=KERNEL_VARIANTS[SELFTEST_KERNELS])


def _selftest_sequential(model: str, tmp: Path) -> Run:
    report = tmp / f"sequential-{SELFTEST_KERNELS}.json"
    argv = [*selftest_cpu_argv(model, str(report)), "--jobs", "1", "--quiet"]
    # spawned, whatever the suite sets: the reference the forked self-test is held to (test_warm_launcher)
    return verify(argv, report, env={**KERNEL_VARIANTS[SELFTEST_KERNELS], "KVKIT_WARM_IMPORT": "0"})


def _served_selftest(model: str, tmp: Path) -> Run:
    report = tmp / f"served-{SELFTEST_KERNELS}.json"
    argv = [*selftest_cpu_argv(model, str(report)), "--jobs", "2", "--quiet", "--frontend", "server"]
    return verify(argv, report, env=KERNEL_VARIANTS[SELFTEST_KERNELS])


def _planted_scenarios(model: str, tmp: Path) -> Run:
    """The CPU self-test's command line (the CPU engine flags, the acceptance suite, native) on the planted
    fixture, its two scenarios that the claim is about, two arms at a time."""
    report = tmp / "planted.json"
    scenarios = ["--scenarios", "in-flight,eviction", "--jobs", "2", "--quiet"]
    return verify([*selftest_cpu_argv(model, str(report), PLANTED_SCENARIOS_FIXTURE), *scenarios], report, 3000)


selftest_run = shared_run("selftest_run", _selftest)
selftest_sequential_run = shared_run("selftest_sequential_run", _selftest_sequential, lane=True)
planted_scenarios_run = shared_run("planted_scenarios_run", _planted_scenarios)
served_selftest_run = shared_run("served_selftest_run", _served_selftest)  # two cores: not the lane's
