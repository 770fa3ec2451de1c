"""repro.run.scheduler: slots taken at launch, the preflight gate, native-matched fed its probes, one stop flag.

Every test gives the scheduler its own run_one (no engine child, no process at all): what is tested is
when and where arms start, what they are handed, and how the run stops.
"""

from __future__ import annotations

import errno
import json
import threading
import time
from pathlib import Path

import pytest

from repro.contract.job import PREFLIGHT_GATE_ENV, ArmSpec, EngineConfig, Preflight, ProbeJob, build_job, progress_path
from repro.contract.result import ArmResult
from repro.plan.arms import ArmSlot, PlannedArm
from repro.record import atomic
from repro.record.atomic import write_json_atomic
from repro.run import scheduler
from repro.run.progress import Progress
from repro.run.runner import ArmOutcome
from repro.run.scheduler import SlotPool, check_arms, run_arms

ENGINE = EngineConfig("model", None, "auto", 0, 0.5, 256, 16, "cpu")
PROBES = (ProbeJob("p", {"token_ids": [1, 2]}, 2),)


def _arm(name: str, mode: str = "native", match: str | None = None) -> PlannedArm:
    return PlannedArm(ArmSpec(name, mode), match_arm=match)


def _job(arm: PlannedArm, preflight: Preflight | None = None, probes=PROBES):
    return build_job(arm.spec, ENGINE, probes, max_tokens=2, logprobs=2, preflight=preflight)


def _cores(n: int) -> list[ArmSlot]:
    return [ArmSlot({"VLLM_CPU_OMP_THREADS_BIND": str(c)}, 0.5) for c in range(n)]


def _schedule(planned, run_one, work: Path, n_jobs: int, slots=None, job_for=None):
    work.mkdir(exist_ok=True)
    job_for = job_for or (lambda i, dependency=None: _job(planned[i]))
    with Progress([a.name for a in planned], "quiet") as progress:
        return run_arms(planned, job_for, slots or _cores(n_jobs), n_jobs, work, {"BASE": "1"}, run_one, progress)


def _done(arm: PlannedArm, log: Path, result: ArmResult | None = None) -> ArmOutcome:
    return ArmOutcome(arm.name, result or ArmResult(arm=arm.name), None, log, "", 0.0)


def test_a_slot_pool_gives_each_arm_a_free_slot_and_takes_it_back():
    slots = _cores(2)
    pool = SlotPool(slots)
    stop = threading.Event()
    assert pool.take("a", stop) is slots[0] and pool.take("b", stop) is slots[1]
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(pool.take("c", stop)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # none free: it waits
    pool.give_back("a")
    waiter.join(5)
    assert got == [slots[0]] and pool.taken == {"a": slots[0], "b": slots[1], "c": slots[0]}
    late: list = []
    stopper = threading.Thread(target=lambda: late.append(pool.take("d", stop)))
    stopper.start()
    stop.set()  # a run that stops never leaves an arm waiting for a slot
    stopper.join(5)
    assert not stopper.is_alive() and late == [None] and "d" not in pool.taken


def test_arms_run_n_at_a_time_each_in_a_free_slot_with_its_settings(tmp_path):
    """Two slots, four arms of different lengths: never more than two at once, never two in one slot,
    each arm's env the run's, its own and its slot's, its job carrying its slot's engine settings."""
    planned = [_arm("baseline", "baseline"), _arm("A"), _arm("B"), _arm("C")]
    slots = [ArmSlot({"VLLM_CPU_OMP_THREADS_BIND": "0"}, 0.25), ArmSlot({"VLLM_CPU_OMP_THREADS_BIND": "1"}, 0.5)]
    took = {"baseline": 0.6, "A": 0.1, "B": 0.3, "C": 0.1}
    seen: dict = {}
    lock = threading.Lock()
    t0 = time.monotonic()

    def run_one(arm, job, env, slot):
        start = time.monotonic() - t0
        time.sleep(took[arm.name])
        with lock:
            seen[arm.name] = (start, time.monotonic() - t0, slot, env, job.engine.gpu_memory_utilization)
        return _done(arm, tmp_path / f"{arm.name}.log")

    pool = SlotPool(slots)
    outcomes = _schedule(planned, run_one, tmp_path / "work", 2, slots=pool)
    assert [o.name for o in outcomes] == ["baseline", "A", "B", "C"]  # plan order, whatever the finishing order
    assert pool.taken == {name: v[2] for name, v in seen.items()}
    for _, _, slot, env, share in seen.values():
        assert env["BASE"] == "1" and env["VLLM_CPU_OMP_THREADS_BIND"] == slot.env["VLLM_CPU_OMP_THREADS_BIND"]
        assert share == slot.gpu_memory_utilization
    for x, (s1, *_) in seen.items():  # at each arm's start: who runs then
        running = [y for y, (s2, e2, *_) in seen.items() if s2 <= s1 < e2]
        assert len(running) <= 2 and len({id(seen[y][2]) for y in running}) == len(running), (x, running, seen)


@pytest.mark.parametrize("preflight_ok", [True, False])
def test_arms_started_during_the_preflight_wait_at_the_gate_and_a_stop_starts_no_more(tmp_path, preflight_ok):
    """The first arm makes the preflight; an arm that starts before its word carries the gate file in its
    env and reads "go" or "stop" there; after a "stop", arms not started yet never start."""
    planned = [_arm("baseline", "baseline"), _arm("A"), _arm("B")]
    work = tmp_path / "work"
    decided = threading.Event()
    seen: dict = {}

    def run_one(arm, job, env, slot):
        if arm.name == "baseline":  # the preflight takes a while, then the first child's progress file says
            time.sleep(0.5)
            write_json_atomic(progress_path(str(work / "baseline.result.json")), {"preflight_ok": preflight_ok})
            decided.wait(10)
            problems = () if preflight_ok else ("unknown connector 'X'",)
            return _done(arm, work / "baseline.log", ArmResult(arm=arm.name, preflight_problems=problems))
        gate = env.get(PREFLIGHT_GATE_ENV)
        seen.setdefault("gates", {})[arm.name] = gate
        if arm.name == "A":
            deadline = time.monotonic() + 10
            while gate and not Path(gate).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            seen["word"] = Path(gate).read_text().strip() if gate else None
            decided.set()
        return _done(arm, work / f"{arm.name}.log")

    def job_for(i, dependency=None):
        return _job(planned[i], Preflight((), "cpu") if i == 0 else None)

    outcomes = _schedule(planned, run_one, work, 2, job_for=job_for)
    assert seen["gates"]["A"] == str(work / scheduler.GATE_FILE)
    assert seen["word"] == ("go" if preflight_ok else "stop")
    if preflight_ok:
        assert [o.name for o in outcomes] == ["baseline", "A", "B"]
    else:
        assert "B" not in seen["gates"] and outcomes[2] is None


def test_native_matched_builds_meanwhile_and_is_fed_the_probes_of_the_arm_it_copies(tmp_path):
    """It starts at once with a probes file and no probes; once the arm it copies is done, job_for gets
    that arm's outcome and the file gets the probes it makes."""
    planned = [_arm("baseline", "baseline"), _arm("conn"), _arm("matched", match="conn")]
    work = tmp_path / "work"
    conn_done = threading.Event()
    fed_from: list = []
    seen: dict = {}

    def job_for(i, dependency=None):
        if i == 2 and dependency is not None:
            fed_from.append(dependency.name)
            return _job(planned[i], probes=(ProbeJob("p", {"token_ids": [1, 2]}, 2, (16,)),))
        return _job(planned[i])

    def run_one(arm, job, env, slot):
        if arm.name == "conn":
            time.sleep(0.5)
            conn_done.set()
        if arm.name == "matched":
            seen["started_before_conn_ended"] = not conn_done.is_set()
            seen["job"] = (job.probes, job.probes_file)
            deadline = time.monotonic() + 10
            while not Path(job.probes_file).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            seen["file"] = json.loads(Path(job.probes_file).read_text())
        return _done(arm, work / f"{arm.name}.log")

    _schedule(planned, run_one, work, 3, job_for=job_for)
    assert seen["started_before_conn_ended"] and seen["job"] == ((), str(work / "matched.probes.json"))
    assert fed_from == ["conn"]
    assert seen["file"] == {"probes": [{"name": "p", "prompt": {"token_ids": [1, 2]}, "requests": 2,
                                        "match_tokens": [16]}]}  # fmt: skip


def test_a_kit_error_in_one_arms_thread_stops_the_run_and_tells_a_waiting_native_matched_arm(tmp_path):
    """The arm it copies raised: no further arm starts, the waiting one is told to stop, the error is raised."""
    planned = [_arm("baseline", "baseline"), _arm("conn"), _arm("matched", match="conn"), _arm("late")]
    work = tmp_path / "work"
    started: list = []
    told: dict = {}

    def run_one(arm, job, env, slot):
        started.append(arm.name)
        if arm.name == "baseline":
            time.sleep(1.0)
        if arm.name == "conn":
            time.sleep(0.3)
            raise RuntimeError("kit bug in conn's thread")
        if arm.name == "matched":
            deadline = time.monotonic() + 10
            while not Path(job.probes_file).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            told.update(json.loads(Path(job.probes_file).read_text()))
        return _done(arm, work / f"{arm.name}.log")

    with pytest.raises(RuntimeError, match="kit bug in conn"):
        _schedule(planned, run_one, work, 3)
    assert "late" not in started and told == {"stop": "the run is stopping"}


def test_a_probes_file_that_cannot_be_written_stops_the_run_with_that_error(tmp_path, monkeypatch):
    """A full disk as native-matched is fed: the feeding thread's error is raised by the caller's thread
    (not a traceback of its own), and the arm waiting for those probes is stopped, not left waiting."""
    planned = [_arm("baseline", "baseline"), _arm("conn"), _arm("matched", match="conn")]
    work = tmp_path / "work"
    real = atomic.write_bytes_atomic
    stopped = threading.Event()

    def write(path, data):
        if str(path).endswith(".probes.json"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    def run_one(arm, job, env, slot):
        if arm.name == "matched":  # a child waiting for its probes: only the stop sweep ends it
            stopped.wait(30)
        return _done(arm, work / f"{arm.name}.log")

    monkeypatch.setattr(atomic, "write_bytes_atomic", write)
    monkeypatch.setattr(scheduler, "stop_all_children", stopped.set)
    t0 = time.monotonic()
    with pytest.raises(OSError, match="No space left on device") as raised:
        _schedule(planned, run_one, work, 3)
    assert raised.value.filename == str(work / "matched.probes.json")
    assert stopped.is_set() and time.monotonic() - t0 < 10


def test_arms_of_one_name_or_an_arm_copying_itself_are_a_kit_bug_at_once():
    """Issue 21 (1): native-matched copying an arm of its own name waited on itself for ever; two arms of
    one name shared a log, a result file and a KV directory."""
    base = _arm("baseline", "baseline")
    assert check_arms([base, _arm("A"), _arm("m", match="A")]) == {"baseline": 0, "A": 1, "m": 2}
    for planned in (
        [base, _arm("native-matched", match="native-matched")],
        [base, _arm("m", match="nobody")],
        [base, _arm("A"), _arm("A")],
    ):
        with pytest.raises(ValueError, match="kit bug"):
            check_arms(planned)
