"""The matrix on Ray: the only module that imports Ray. Each cell is one task with its resource
needs; a crash or a lost node is that cell's ERROR; an interrupt cancels every task (each stops its
verifier, which kills its engines) and shuts Ray down."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import replace

from repro.errors import UsageError
from repro.matrix.cell import STOP_GRACE_S, CellJob, CellOutcome, run_cell
from repro.matrix.spec import Cell
from repro.matrix.status import CRASH, NODE_LOST, TaskFailure
from repro.paths import KIT_ROOT

NODE_LOST_ERRORS = ("NodeDiedError", "ObjectLostError", "OwnerDiedError", "ObjectFetchTimedOutError")
CRASH_ERRORS = ("WorkerCrashedError", "LocalRayletDiedError", "RaySystemError")


def import_ray():
    try:
        import ray
    except ImportError:
        raise UsageError(
            "the matrix needs Ray, which this Python lacks: `make matrix` sets up .venvs/matrix "
            "(requirements/matrix.txt), or pip install -r requirements/matrix.txt"
        ) from None
    return ray


def classify_task_error(exc: BaseException) -> TaskFailure:
    """A task that gave no outcome, by Ray's exception type: its node lost, its worker crashed, it raised."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    if names & set(NODE_LOST_ERRORS):
        return TaskFailure(NODE_LOST, f"{type(exc).__name__}: the cell's node or its worker was lost ({first})")
    if names & set(CRASH_ERRORS):
        return TaskFailure(CRASH, f"{type(exc).__name__}: the cell's worker process died ({first})")
    return TaskFailure(CRASH, f"{type(exc).__name__}: {first}")


def resources(cell: Cell, cluster_gpus: float) -> dict:
    """num_gpus=1 for a CUDA cell (device cuda, or auto on a cluster with GPUs); num_cpus otherwise."""
    if cell.device == "cuda" or (cell.device == "auto" and cluster_gpus > 0):
        return {"num_gpus": 1, "num_cpus": 1}
    return {"num_cpus": cell.cpus}


def run_on_ray(
    jobs: list[tuple[Cell, CellJob]],
    on_result: Callable[[Cell, CellOutcome | TaskFailure], None],
    one_at_a_time: bool = False,
) -> dict:
    """Run the cells' tasks; on_result is called as each ends. Returns what the cluster was."""
    ray = import_ray()
    address = os.environ.get("RAY_ADDRESS") or None  # Ray reads it too; a local cluster when unset
    ray.init(
        address=address,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        runtime_env={"env_vars": {"PYTHONPATH": str(KIT_ROOT)}},
    )
    try:
        totals = ray.cluster_resources()
        info = {
            "address": "local (started for this run)" if address is None else "RAY_ADDRESS",
            "ray_version": ray.__version__,
            "cpus": totals.get("CPU", 0),
            "gpus": totals.get("GPU", 0),
            "nodes": len([n for n in ray.nodes() if n.get("Alive")]),
        }
        task = ray.remote(max_retries=0)(run_cell)
        pending: dict = {}
        queue = list(jobs)
        try:
            while queue or pending:
                while queue and not (one_at_a_time and pending):
                    cell, job = queue.pop(0)
                    opts = resources(cell, info["gpus"])
                    job = replace(job, cpus=None if "num_gpus" in opts else opts["num_cpus"])  # cores to claim
                    pending[task.options(name=f"kvkit-cell-{cell.name}", **opts).remote(job)] = cell
                    print(f"[kvkit] matrix: cell {cell.name} submitted ({opts})", file=sys.stderr, flush=True)
                done, _ = ray.wait(list(pending), num_returns=1)
                cell = pending.pop(done[0])
                try:
                    result: CellOutcome | TaskFailure = ray.get(done[0])
                except ray.exceptions.RayError as exc:
                    result = classify_task_error(exc)
                on_result(cell, result)
        except BaseException:
            # Ctrl-C, SIGTERM or a driver error: every running task stops its verifier (which kills
            # its engines and writes nothing); wait for them before Ray goes down.
            for ref in pending:
                ray.cancel(ref, force=False)
            if pending:
                ray.wait(list(pending), num_returns=len(pending), timeout=STOP_GRACE_S + 15)
            raise
        return info
    finally:
        ray.shutdown()
