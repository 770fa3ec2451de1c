"""The arm scheduler: when and where each arm of a run starts, never how.

Arms run up to n_jobs at a time, each in a free slot (its GPU share or core) taken when it launches;
the arms after the first wait at the preflight gate; a native-matched arm is fed its probes once the
arm it copies is done; one stop flag ends it all. How an arm runs (its engine child, or its MP server
and child) is `run_one`, the verifier's (repro.run.launch): a test gives its own, and needs no engine.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path

from repro.contract.job import PREFLIGHT_GATE_ENV, PROBES_FILE_KEY, Job, progress_path
from repro.lmcache import mp as lmcache_mp
from repro.plan.arms import ArmSlot, PlannedArm
from repro.record import atomic
from repro.record.atomic import dumps_json
from repro.run.progress import Progress
from repro.run.runner import ArmOutcome, deferred_signals, stop_all_children

GATE_FILE = "preflight.gate"  # in the work directory: "go" or "stop", once the first child's preflight said
_POLL_S = 0.3  # the main thread: the first child's progress file, the arms' threads, a feeder's failure
_DEPENDENCY_POLL_S = 0.2  # a feeder: its arm's dependency done, or the stop flag

# run_one(arm, job, env, slot): run the arm (its child, or its MP server and child) and return how it went.
RunOne = Callable[[PlannedArm, Job, dict, ArmSlot], ArmOutcome]
# job_for(i, dependency=None): arm i's job; for a native-matched arm, with the outcome of the arm it copies.
JobFor = Callable[..., Job]


class SlotPool:
    """The slots arms run in (repro.plan.arms.arm_slots). An arm takes a free one when it launches and gives
    it back when it ends: a pool of threads starts arms in whatever order they free up, so a slot fixed
    by arm index would put two arms at once on one GPU share or one core. `taken`: the slot each arm
    (by name) ran in, for its device and for a re-run on the same one."""

    def __init__(self, slots: list[ArmSlot]) -> None:
        self.slots = list(slots)
        self.taken: dict[str, ArmSlot] = {}
        self._free = list(range(len(self.slots)))
        self._held: dict[str, int] = {}
        self._cond = threading.Condition()

    def take(self, name: str, stop: threading.Event) -> ArmSlot | None:
        """The lowest free slot for arm `name`, waiting for one; None once `stop` is set."""
        with self._cond:
            while not self._free:
                if stop.is_set():
                    return None
                self._cond.wait(0.2)
            if stop.is_set():
                return None
            k = min(self._free)
            self._free.remove(k)
            self._held[name] = k
            self.taken[name] = self.slots[k]
            return self.slots[k]

    def give_back(self, name: str) -> None:
        with self._cond:
            k = self._held.pop(name, None)
            if k is not None:
                self._free.append(k)
                self._cond.notify()


def check_arms(planned: list[PlannedArm]) -> dict[str, int]:
    """Each arm's index by name; a ValueError (a kit bug: repro.plan.fixtures rejects such fixtures) for two
    arms of one name (they would share a log, a result file and a KV directory) or an arm copying the
    reuse lengths of itself or of no arm of the run (it would wait for ever)."""
    names = [arm.name for arm in planned]
    index = {name: i for i, name in enumerate(names)}
    if len(index) < len(names):
        raise ValueError(f"kit bug: two arms of one name among {names}")
    for i, arm in enumerate(planned):
        if arm.match_arm is not None and index.get(arm.match_arm, i) == i:
            raise ValueError(
                f"kit bug: {arm.name} copies the reuse lengths of {arm.match_arm}, not another arm of the run"
            )
    return index


def run_arms(
    planned: list[PlannedArm],
    job_for: JobFor,
    slots: SlotPool | list[ArmSlot],
    n_jobs: int,
    work: Path,
    env: dict,
    run_one: RunOne,
    progress: Progress,
) -> list[ArmOutcome | None]:
    """Run the arms, up to n_jobs at a time, and return their outcomes in plan order (None: an arm that
    never started because the run was stopping).

    The first arm's child makes the preflight. Arms that start before it says how the preflight
    went (its progress file) import vLLM meanwhile and wait, before building an engine, for the
    gate file the parent writes then ("go" or "stop"; repro.engine.child.wait_for_preflight), so a
    bad connector still stops the run with exit 2 before any engine is built, and arms not started
    yet never start. An interrupt (it reaches the main thread only) kills every running child's
    process group and propagates. An arm that copies another's reuse lengths (native-matched)
    builds its engine meanwhile and waits, before generating, for the probes file the parent writes
    from that arm's reuse lengths when it is done (repro.record.child_io.wait_for_probes).

    Each arm takes a free slot (its GPU share or core, and the engine settings that go with it) when
    it launches and gives it back when it ends (SlotPool; `slots.taken` then says where each ran):
    the pool starts arms as threads free up, in no fixed order."""
    pool = slots if isinstance(slots, SlotPool) else SlotPool(slots)
    return _Schedule(planned, job_for, pool, work, env, run_one, progress).run(n_jobs)


class _Schedule:
    """One run_arms call: its gate, its stop flag, the arms' outcomes as they come."""

    def __init__(self, planned, job_for, pool: SlotPool, work: Path, env: dict, run_one: RunOne, progress) -> None:
        self.index = check_arms(planned)
        self.planned, self.job_for, self.pool = planned, job_for, pool
        self.work, self.env, self.run_one, self.progress = work, env, run_one, progress
        self.released, self.stop = threading.Event(), threading.Event()
        self.gate = work / GATE_FILE
        self._gate_lock = threading.Lock()
        self.finished = [threading.Event() for _ in planned]
        self.outcomes: list[ArmOutcome | None] = [None] * len(planned)
        self.fed: list[BaseException] = []  # what a thread feeding a native-matched arm met: the main thread raises it
        self.first_job = job_for(0)
        if self.first_job.preflight is None:
            self.release(True)
        # the path the runner gives the first child's result; its progress file sits beside it
        self.first_progress = Path(progress_path(str(work / f"{planned[0].name}.result.json")))

    def release(self, ok: bool) -> None:
        """Decide the preflight once: the gate file first, then the event (a child started after the
        event was set never waits)."""
        with self._gate_lock:
            if self.released.is_set():
                return
            if not ok:
                self.stop.set()
            # atomic: a waiting child must never read a half-written word (through the module, so
            # that a test standing in for the report's own write_bytes_atomic does not see this one)
            atomic.write_bytes_atomic(self.gate, b"go\n" if ok else b"stop\n")
            self.released.set()

    def run(self, n_jobs: int) -> list[ArmOutcome | None]:
        with ThreadPoolExecutor(max_workers=max(1, n_jobs), thread_name_prefix="kvkit-arm") as executor:
            futures = [executor.submit(self.one, i) for i in range(len(self.planned))]
            try:
                while not all(f.done() for f in futures):
                    if self.fed:  # its child waits for probes that will not come: stop them all now
                        raise self.fed[0]
                    if not self.released.is_set():
                        state = _read_json(self.first_progress)
                        if state.get("preflight_ok") is not None:
                            self.release(state["preflight_ok"] is True)
                    wait(futures, timeout=_POLL_S, return_when=FIRST_EXCEPTION)
                if self.fed:
                    raise self.fed[0]
                return [f.result() for f in futures]
            except BaseException:
                self.stop.set()
                self.released.set()
                with deferred_signals():
                    # from here no child or MP server starts (repro.run.runner.starting), so the threads end
                    # as soon as their own children are killed: none can start one after this sweep
                    stop_all_children()
                    lmcache_mp.stop_all_servers()
                    for f in futures:
                        f.cancel()
                    wait(futures)
                raise

    def one(self, i: int) -> ArmOutcome | None:
        try:
            return self.outcome_of(i)
        except BaseException:
            self.stop.set()  # a kit bug in one arm's thread: the others do not start, the main thread re-raises
            raise
        finally:
            self.finished[i].set()
            if i == 0:  # never leave the others waiting for a preflight that will not come
                self.release(not self.stop.is_set())

    def outcome_of(self, i: int) -> ArmOutcome | None:
        arm = self.planned[i]
        dep = self.index[arm.match_arm] if arm.match_arm is not None else None
        slot = self.pool.take(arm.name, self.stop)
        if slot is None:  # the run is stopping
            return None
        try:
            return self.launch_in(i, arm, dep, slot)
        finally:
            self.pool.give_back(arm.name)

    def launch_in(self, i: int, arm: PlannedArm, dep: int | None, slot: ArmSlot) -> ArmOutcome:
        if i == 0:
            job = self.first_job
        elif dep is not None:
            probes_file = self.work / f"{arm.name}.probes.json"
            job = replace(self.job_for(i, None), probes=(), probes_file=str(probes_file))
            threading.Thread(
                target=self.feed_probes, args=(i, dep, probes_file), name=f"kvkit-probes-{arm.name}", daemon=True
            ).start()
        else:
            job = self.job_for(i, None)
        job = slot.apply(job)
        self.progress.start(arm.name, Path(progress_path(str(self.work / f"{arm.name}.result.json"))))
        arm_env = {**self.env, **arm.env, **slot.env}
        if i > 0 and not self.released.is_set():
            arm_env[PREFLIGHT_GATE_ENV] = str(self.gate)
        outcome = self.run_one(arm, job, arm_env, slot)
        if i == 0:
            self.release(not (outcome.result is not None and outcome.result.preflight_problems))
        self.progress.child_done(arm.name, "finished: judging" if outcome.failure is None else "failed")
        self.outcomes[i] = outcome
        return outcome

    def feed_probes(self, i: int, dep: int, probes_file: Path) -> None:
        """native-matched: once its connector arm is done, its reuse lengths become this arm's probes.
        A failure here (a full disk) is the run's: left to this thread, it was a traceback on stderr
        and a child waiting for ever for its probes."""
        try:
            while not self.finished[dep].wait(_DEPENDENCY_POLL_S):
                if self.stop.is_set():
                    break
            if self.stop.is_set() or self.outcomes[dep] is None:
                payload: dict = {"stop": "the run is stopping"}
            else:
                payload = {PROBES_FILE_KEY: [p.to_json() for p in self.job_for(i, self.outcomes[dep]).probes]}
            atomic.write_bytes_atomic(probes_file, dumps_json(payload).encode("utf-8"))
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which stops the run
            self.stop.set()
            self.fed.append(exc)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
