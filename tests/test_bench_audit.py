"""`make bench`'s KV audit cost (issue 19: 25 % of an arm's wall time or less), from its runs' reports: a
synchronous and an asynchronous connector arm with and without the audit, and the fixture those runs use."""

from __future__ import annotations

from kvkit_testutil import ROOT


def _audit_run(walls: dict[str, float], gens: dict[str, float], compare_s: float | None) -> tuple[dict, float]:
    """A small audit run's report: the baseline and the two connector arms, one probe with 3 reuses."""
    audited = {"status": "audited"} if compare_s is not None else None
    requests = [{"kv_audit": None}] + [{"kv_audit": audited} for _ in range(3)]
    arms = []
    for name, wall in walls.items():
        timing = {"wall_s": wall, "generation_s": gens[name]}
        if name == "AsyncLoadConnector" and compare_s is not None:
            timing["kv_compare_s"] = compare_s
        mode = "baseline" if name == "baseline" else "connector"
        arms.append(
            {"name": name, "mode": mode, "timing": timing, "probes": [{"name": "fixture", "requests": requests}]}
        )
    return {"arms": arms}, sum(walls.values())


def test_the_audit_cost_of_a_synchronous_and_an_asynchronous_arm(capsys):
    from repro.measure.bench import audit_figures

    names = ("baseline", "ExampleConnector", "AsyncLoadConnector")
    off = [_audit_run(dict.fromkeys(names, 40.0), dict.fromkeys(names, 4.0), None) for _ in range(2)]
    on = [
        _audit_run({"baseline": 41.0, "ExampleConnector": 44.0, "AsyncLoadConnector": 46.0},
                   {"baseline": 4.5, "ExampleConnector": 6.0, "AsyncLoadConnector": 9.0}, 3.0)
        for _ in range(2)
    ]  # fmt: skip
    audit_figures(on, off)
    out = capsys.readouterr().out
    assert "KV audit cost on probe(s) fixture (3 reuses each)" in out
    # async: (46 + 1 - 40) / 40 = +17.5% of its wall; its generation (9 - 4 + 1) / 40 = +15.0%
    assert "AsyncLoadConnector child wall   46.0 s with,   40.0 s without  overhead +17.5%" in out
    assert "+15.0% of its wall  (asynchronous load, 3/3 reuses audited)" in out
    assert "(synchronous load, 3/3 reuses audited)" in out and "(reference KV)" in out
    assert "worst arm overhead +17.5%" in out and "25% of an arm's wall time: met)" in out
    assert "within that noise" not in out  # runs of one mode agree


def test_an_audit_cost_under_the_noise_says_so(capsys):
    from repro.measure.bench import audit_figures

    names = ("baseline", "ExampleConnector", "AsyncLoadConnector")
    off = [_audit_run(dict.fromkeys(names, w), dict.fromkeys(names, 4.0), None) for w in (40.0, 60.0)]
    on = [_audit_run(dict.fromkeys(names, 38.0), dict.fromkeys(names, 4.1), 0.3) for _ in range(2)]
    audit_figures(on, off)
    out = capsys.readouterr().out
    assert "runs of the same mode differ by up to 50% of an arm's wall" in out  # (60 - 40) / 40
    assert "worst arm overhead +0.5%" in out  # the generation figure: (4.1 - 4.0 + 0.1) / 40


def test_the_audit_runs_fixture_has_a_synchronous_and_an_asynchronous_arm(tmp_path):
    from repro.measure.bench import ASYNC_CONNECTORS_DIR, audit_fixture
    from repro.plan.fixtures import load_fixture

    path, has_async = audit_fixture(str(ROOT / "fixtures" / "selftest-cpu.json"), tmp_path)
    assert has_async and (ASYNC_CONNECTORS_DIR / "async_connector.py").is_file()
    fixture = load_fixture(path)
    assert [(a.name, a.module_path) for a in fixture.arms] == [
        ("ExampleConnector", None),
        ("AsyncLoadConnector", "async_connector"),
    ]
    assert fixture.expected == {} and [p.name for p in fixture.probes] == ["fixture"]
