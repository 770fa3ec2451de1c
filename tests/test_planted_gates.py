"""The planted connector's gates without an engine: the schedstat reader, the contention threshold,
and the once_in claim (exactly one winner, from threads and from processes)."""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest
from conftest import have_vllm

pytestmark = pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")


@pytest.fixture(scope="module")
def pf():
    from repro.engine.connectors import planted_fault

    return planted_fault


@pytest.fixture(scope="module")
def gates():
    from repro.engine.connectors import planted_gates

    return planted_gates


def _bare(pf, role_name: str = "SCHEDULER", **extra):
    """A connector with only its fault and gate settings: what _plan_load reads, no engine."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    conn = pf.PlantedFaultConnector.__new__(pf.PlantedFaultConnector)
    conn.fault, conn.first_block, conn.num_blocks = extra.pop("fault", "zero_blocks"), 0, 16
    conn._init_gates(extra, getattr(KVConnectorRole, role_name))
    return conn


def _load_op(pf, n: int = 4):
    return pf._Op("r", "load", [f"k{i}" for i in range(n)], list(range(n)))


# ---- schedstat reader
def test_parse_schedstat_line(gates):
    assert gates.parse_schedstat("123456789 2345678 17\n") == (123456789, 2345678)


@pytest.mark.parametrize("line", ["", "12\n", "12 x 3", "-1 2 3"])
def test_parse_schedstat_rejects_what_it_cannot_read(gates, line):
    with pytest.raises(gates.SchedstatUnavailable, match="unexpected schedstat line"):
        gates.parse_schedstat(line)


def test_missing_schedstat_says_so(gates, tmp_path):
    with pytest.raises(gates.SchedstatUnavailable, match="not readable"):
        gates.read_runqueue_wait_ns(str(tmp_path / "no-such-schedstat"))


def test_contended_gate_refuses_to_start_without_schedstat(pf, gates, tmp_path, monkeypatch):
    """Without the file the connector says so at start: it must not run as a fault that never fires."""
    monkeypatch.setattr(gates, "SCHEDSTAT_PATH", str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="cannot measure run-queue wait.*not readable"):
        _bare(pf, when="contended")


def test_contended_gate_losing_schedstat_later_loads_faithfully(pf, gates, tmp_path, monkeypatch):
    conn = _bare(pf, when="contended")
    monkeypatch.setattr(gates, "SCHEDSTAT_PATH", str(tmp_path / "gone"))
    op = _load_op(pf)
    conn._plan_load(op)
    assert op.faulted == [] and op.gate["apply"] is False and "not readable" in op.gate["contended"]["unavailable"]


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="no schedstat on this system")
def test_timed_copy_spends_its_cpu_time(gates):
    copy = gates.timed_copy(5_000_000)
    assert copy["cpu_ns"] >= 5_000_000 and copy["wait_ns"] >= 0 and copy["wall_ns"] >= copy["cpu_ns"] * 0.9


# ---- threshold
@pytest.mark.parametrize(
    ("cpu", "wait", "missed"),
    [
        (40_000_000, 10_000_000, True),  # exactly a quarter: missed
        (40_000_000, 9_999_999, False),
        (40_000_000, 40_000_000, True),  # a core shared with one busy thread: ratio ~1
        (40_000_000, 200_000, False),  # alone: a daemon's wake-up
        (0, 5, False),  # no CPU time measured: no verdict of contention
    ],
)
def test_missed_window_threshold(gates, cpu, wait, missed):
    assert gates.missed_window(cpu, wait, gates.CONTENDED_RATIO) is missed


@pytest.mark.parametrize(("wait", "faults"), [(30_000_000, True), (1_000_000, False)])
def test_contended_gate_decides_each_load(pf, gates, monkeypatch, wait, faults):
    monkeypatch.setattr(
        gates, "timed_copy", lambda cpu_ns, path=None: {"cpu_ns": 40_000_000, "wait_ns": wait, "wall_ns": 0}
    )
    conn = _bare(pf, when="contended")
    op = _load_op(pf)
    conn._plan_load(op)
    assert (op.faulted == [0, 1, 2, 3]) is faults
    figures = op.gate["contended"]
    assert op.gate["apply"] is faults and figures["missed"] is faults
    assert figures["wait_ratio"] == wait / 40_000_000 and figures["threshold"] == gates.CONTENDED_RATIO


def test_contended_settings_come_from_the_config(pf, gates, monkeypatch):
    seen = []
    monkeypatch.setattr(
        gates, "timed_copy", lambda cpu_ns, path=None: seen.append(cpu_ns) or {"cpu_ns": 10, "wait_ns": 6, "wall_ns": 0}
    )
    conn = _bare(pf, when="contended", contended_cpu_ms=5, contended_ratio=0.7)
    op = _load_op(pf)
    conn._plan_load(op)
    assert seen == [5_000_000] and op.faulted == [] and op.gate["contended"]["threshold"] == 0.7


def test_no_gate_leaves_the_fault_as_it_was(pf):
    conn = _bare(pf)
    op = _load_op(pf)
    conn._plan_load(op)
    assert op.gate is None and op.faulted == [0, 1, 2, 3]


def test_unknown_when_is_refused(pf):
    with pytest.raises(ValueError, match="when='sometimes'"):
        _bare(pf, when="sometimes")


# ---- once_in claim
def test_two_claims_one_winner(gates, tmp_path):
    assert [gates.claim_once(str(tmp_path)), gates.claim_once(str(tmp_path))] == [True, False]
    assert (tmp_path / gates.CLAIM_NAME).exists()


def test_concurrent_claims_from_threads(gates, tmp_path):
    n, wins = 16, []
    barrier = threading.Barrier(n)

    def claim():
        barrier.wait()
        wins.append(gates.claim_once(str(tmp_path / "d")))

    threads = [threading.Thread(target=claim) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False] * (n - 1) + [True]


def _claim_in_child(directory, barrier, results):
    from repro.engine.connectors.planted_gates import claim_once

    barrier.wait()
    results.put(claim_once(directory))


def test_concurrent_claims_from_processes(pf, tmp_path):
    ctx = multiprocessing.get_context("fork")  # the module is imported already: no second vLLM import
    n = 6
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_claim_in_child, args=(str(tmp_path), barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    wins = sorted(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert wins == [False] * (n - 1) + [True]


def test_only_the_claiming_engine_faults(pf, tmp_path):
    first, second = _bare(pf, once_in=str(tmp_path)), _bare(pf, once_in=str(tmp_path))
    ops = [_load_op(pf), _load_op(pf)]
    first._plan_load(ops[0])
    second._plan_load(ops[1])
    assert ops[0].faulted == [0, 1, 2, 3] and ops[0].gate["once_in"] == {"dir": str(tmp_path), "claimed": True}
    assert ops[1].faulted == [] and ops[1].gate == {"apply": False, "once_in": {"dir": str(tmp_path), "claimed": False}}


def test_the_worker_side_does_not_claim(pf, gates, tmp_path):
    _bare(pf, "WORKER", once_in=str(tmp_path))
    assert not (tmp_path / gates.CLAIM_NAME).exists()


def test_once_in_must_be_absolute(pf):
    with pytest.raises(ValueError, match="must be an absolute directory"):
        _bare(pf, once_in="relative/claims")


def test_gates_combine(pf, gates, tmp_path, monkeypatch):
    """With both gates a load faults only in the claiming engine and only when its copy missed its window."""
    monkeypatch.setattr(gates, "timed_copy", lambda cpu_ns, path=None: {"cpu_ns": 40, "wait_ns": 40, "wall_ns": 80})
    winner, loser = (
        _bare(pf, once_in=str(tmp_path), when="contended"),
        _bare(pf, once_in=str(tmp_path), when="contended"),
    )
    ops = [_load_op(pf), _load_op(pf)]
    winner._plan_load(ops[0])
    loser._plan_load(ops[1])
    assert ops[0].faulted and not ops[1].faulted and ops[1].gate["contended"]["missed"] is True


# ---- in_flight_min and land_elsewhere (issue 36, item 3)


def test_in_flight_min_sets_how_many_requests_open_the_gate(pf, gates):
    conn = _bare(pf, when="in_flight", in_flight_min=16)
    assert conn.in_flight_min == 16
    shut = gates.in_flight_figures({f"r{i}" for i in range(15)}, set(), conn.in_flight_min)
    opened = gates.in_flight_figures({f"r{i}" for i in range(10)}, {f"u{i}" for i in range(6)}, conn.in_flight_min)
    assert (shut["open"], shut["min"]) == (False, 16) and (opened["in_flight"], opened["open"]) == (16, True)
    assert _bare(pf, when="in_flight").in_flight_min == 2  # the gate as before


@pytest.mark.parametrize(
    "extra, message",
    [({"when": "in_flight", "in_flight_min": 1}, "at least 2"), ({"when": "in_flight", "in_flight_min": "16"}, "integer"),
     ({"when": "always", "in_flight_min": 16}, "applies only to when=in_flight")],
)  # fmt: skip
def test_a_bad_in_flight_min_is_refused(pf, extra, message):
    with pytest.raises(ValueError, match=message):
        _bare(pf, **extra)


def test_land_elsewhere_writes_the_steps_last_load_into_its_first_loads_block(pf):
    conn = _bare(pf, fault="land_elsewhere")
    conn._landed = {}
    first, middle, last = (pf._Op(r, "load", ["a", "b"], [10 * i, 10 * i + 1]) for i, r in enumerate("xyz", 1))
    store = pf._Op("s", "store", ["c"], [99])
    conn._land_elsewhere([first, store, middle, last])
    assert last.lands_in == 10 and first.lands_in is None and middle.lands_in is None
    assert conn._landed == {"z": {"landed_in": "x"}, "x": {"overwritten_by": "z", "overwritten_block": 0}}
    # the loader's own blocks load faithfully: the fault touches no block of the load itself
    assert pf.faulted_indices("land_elsewhere", 0, 16, 8) == []


def test_land_elsewhere_needs_two_loads_the_gates_let_through(pf):
    conn = _bare(pf, fault="land_elsewhere")
    conn._landed = {}
    one = pf._Op("x", "load", ["a"], [1])
    conn._land_elsewhere([one])
    held = pf._Op("y", "load", ["b"], [2], gate={"apply": False})
    conn._land_elsewhere([one, held])
    assert one.lands_in is None and held.lands_in is None and conn._landed == {}
