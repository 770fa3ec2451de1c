"""Connector state between runs: every run of an arm (its own, each trial, the re-run alone, each scenario run)
starts with an empty store. A store the user names (a fixed shared_storage_path, LMCache's local_disk) gets a
fresh subfolder per run; one the kit cannot make fresh (a remote LMCache server) is recorded as persisting, and a
confirmation made with it says it is not independent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import have_vllm, run_cli
from e2e_runs import shared_run

from repro.plan.options import CPU_ENGINE_FLAGS, SELFTEST_CPU_FIXTURE

# ---- end to end: vLLM's in-tree ExampleConnector with a fixed store path ------------------------------------


def _arm(report: dict, name: str) -> dict:
    return next(a for a in report["arms"] if a["name"] == name)


def _two_invocations(model: str, tmp: Path) -> tuple[Path, list]:
    """ExampleConnector with the user's own shared_storage_path, --trials 2, twice: each invocation's process, its
    report's path, and what the user's folder held right after it."""
    store = tmp / "user-store"
    argv = ["--model", model, *CPU_ENGINE_FLAGS, "--max-tokens", "4", "--reuses", "1", "--no-kv-audit",
            "--kv-connector", "ExampleConnector",
            "--kv-connector-extra-config", json.dumps({"shared_storage_path": str(store)}),
            "--fixture", SELFTEST_CPU_FIXTURE, "--trials", "2", "--jobs", "1", "--quiet"]  # fmt: skip
    runs = []
    for k in (1, 2):
        report = tmp / f"run{k}.json"
        proc = run_cli([*argv, "--report", str(report)])
        runs.append((proc, report, list(store.iterdir())))
    return store, runs


# one arm at a time: made ahead by the tests' lane (tests/e2e_runs.py)
fixed_store_runs = shared_run("fixed_store_runs", _two_invocations, lane=True)


@pytest.mark.e2e
@pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")
def test_a_fixed_shared_storage_path_is_fresh_for_every_trial_and_every_invocation(fixed_store_runs):
    """ExampleConnector with the user's own shared_storage_path, --trials 2, twice. Before each run got its
    own subfolder, trial 2's cold request hit what the first run had stored (INCONCLUSIVE: the cold request
    was not a verified miss), and so did the second invocation's first run. One probe, one reuse, 4 tokens,
    one arm at a time: 3 engines per invocation."""
    store, runs = fixed_store_runs
    for k, (proc, report, left) in enumerate(runs, 1):
        assert report.exists(), proc.stderr[-3000:]
        arm = _arm(json.loads(report.read_text()), "ExampleConnector")
        own = arm["probes"][0]
        assert arm["verdict"] == "PASS", (k, arm["verdict"], arm["reasons"], own["reasons"])
        assert own["requests"][0]["cached_tokens"] == 0, (k, own["requests"])
        trial2 = arm["trials"]["runs"][1]
        assert trial2["verdict"] == "PASS" and trial2["probes"][0]["cached_tokens"][0] == 0, (k, arm["trials"]["runs"])
        assert proc.returncode == 0, proc.stderr[-3000:]
        # the report says where this run's store went: a subfolder of the user's path, its own
        used = arm["connector"]["extra_config"]["shared_storage_path"]
        assert Path(used).parent == store and Path(used).name.startswith("kvkit-ExampleConnector"), used
        assert arm["store"]["fresh"] is True, arm["store"]
        assert arm["store"]["rewritten"] == [f"shared_storage_path {store} -> {used}"], arm["store"]
        # the kit's subfolders go with the run: nothing it stored is left for the next invocation
        assert not [p for p in left if p.name.startswith("kvkit-")], left


# ---- unit: what each run's connector state becomes (repro.plan.arms.fresh_state) --------------------------------


def _arm_with(name: str, extra: dict, module: str | None = None, lmcache_config: str | None = None):
    from repro.contract.job import ArmSpec, ConnectorSpec
    from repro.plan.arms import PlannedArm

    conn = ConnectorSpec(name, module, extra)
    return PlannedArm(ArmSpec(name, "connector", conn), lmcache_config=lmcache_config)


def _fresh(arm, tmp_path, environ=None, **kw):
    from repro.plan.arms import fresh_state

    scratch: list[str] = []
    (tmp_path / "scratch").mkdir(exist_ok=True)  # the run's scratch directory (repro.run.workdir makes it)
    run, record = fresh_state(arm, scratch, tmp_path / "scratch", environ=environ or {}, **kw)
    return run, record, scratch


def test_a_user_shared_storage_path_gets_a_fresh_subfolder_per_run(tmp_path):
    from repro.plan.arms import materialize

    user = tmp_path / "kv"
    arm = _arm_with("ExampleConnector", {"shared_storage_path": str(user)})
    first, _, scratch = _fresh(arm, tmp_path)
    used = first.spec.connector.extra_config["shared_storage_path"]
    assert Path(used).parent == user and Path(used).name.startswith("kvkit-ExampleConnector-") and Path(used).is_dir()
    assert scratch == [used]  # removed with the run, as the kit's own @tmpdir directories are
    assert first.store == {"fresh": True, "rewritten": [f"shared_storage_path {user} -> {used}"]}
    again = materialize(arm, []).spec.connector.extra_config["shared_storage_path"]
    assert again != used and Path(again).parent == user  # the next run (a trial, the run alone) its own
    assert arm.spec.connector.extra_config == {"shared_storage_path": str(user)}  # the plan itself unchanged


def test_the_kits_own_tmpdir_is_recorded_and_the_planted_claim_is_left_shared(tmp_path):
    from repro.plan.arms import PLANTED_FAULT_MODULE, TMPDIR_TOKEN

    claim = tmp_path / "claim"
    arm = _arm_with(
        "PlantedFaultConnector",
        {"store_dir": TMPDIR_TOKEN, "once_in": str(claim), "fault": "none"},
        PLANTED_FAULT_MODULE,
    )
    run, _, scratch = _fresh(arm, tmp_path)
    extra = run.spec.connector.extra_config
    assert extra["store_dir"] == scratch[0] and extra["once_in"] == str(claim)  # the claim is shared on purpose
    assert run.store == {"fresh": True, "rewritten": [f"store_dir {TMPDIR_TOKEN} -> {scratch[0]}"]}
    user = _arm_with("PlantedFaultConnector", {"store_dir": str(tmp_path / "s")}, PLANTED_FAULT_MODULE)
    assert Path(_fresh(user, tmp_path)[0].spec.connector.extra_config["store_dir"]).parent == tmp_path / "s"


def test_lmcache_local_disk_in_its_yaml_is_namespaced_in_a_derived_yaml(tmp_path):
    import yaml

    from repro.plan.arms import LMCACHE_CONFIG_ENV

    disk = tmp_path / "disk"
    base = tmp_path / "lmcache.yaml"
    base.write_text(f'chunk_size: 256\nlocal_disk: "file://{disk}/"\nmax_local_disk_size: 5\n')
    arm = _arm_with("LMCacheConnectorV1", {}, lmcache_config=str(base))
    run, record, scratch = _fresh(arm, tmp_path)
    written = yaml.safe_load(Path(run.env[LMCACHE_CONFIG_ENV]).read_text())
    new = written["local_disk"]
    assert new.startswith(f"file://{disk}/kvkit-LMCacheConnectorV1-") and new.endswith("/"), new
    assert Path(new[len("file://") :]).is_dir() and new[len("file://") : -1] in scratch
    assert written["max_local_disk_size"] == 5 and written["chunk_size"] == 256  # the rest as given
    assert run.store == {"fresh": True, "rewritten": [f"local_disk (LMCache YAML) file://{disk}/ -> {new}"]}
    assert record["base"] == str(base) and record["overrides"] == {}
    assert yaml.safe_load(base.read_text())["local_disk"] == f"file://{disk}/"  # the user's file untouched


def test_lmcache_local_disk_from_its_environment_or_extra_config_is_namespaced_too(tmp_path):
    arm = _arm_with("LMCacheConnectorV1", {"lmcache.local_disk": str(tmp_path / "a"), "lmcache.chunk_size": 256})
    run, record, _ = _fresh(arm, tmp_path, environ={"LMCACHE_LOCAL_DISK": str(tmp_path / "b")})
    extra = run.spec.connector.extra_config
    assert Path(extra["lmcache.local_disk"]).parent == tmp_path / "a" and extra["lmcache.chunk_size"] == 256
    assert Path(run.env["LMCACHE_LOCAL_DISK"]).parent == tmp_path / "b"  # over the environment it inherits
    assert run.store["fresh"] is True and len(run.store["rewritten"]) == 2
    assert record is None  # no YAML to derive: the run's children read the one they were given


def test_a_remote_lmcache_server_is_not_rewritten_and_marked_as_persisting(tmp_path):
    base = tmp_path / "lmcache.yaml"
    base.write_text('chunk_size: 256\nremote_url: "lm://localhost:65432"\nremote_serde: naive\n')
    arm = _arm_with("LMCacheConnectorV1", {}, lmcache_config=str(base))
    run, record, scratch = _fresh(arm, tmp_path)
    assert record is None and scratch == [] and run.env == {}  # nothing to rewrite: the YAML is used as given
    assert run.store["fresh"] is False and run.store["rewritten"] == []
    assert "remote_url (LMCache YAML) lm://localhost:65432" in run.store["why"], run.store
    env_run = _fresh(_arm_with("LMCacheConnectorV1", {}), tmp_path, environ={"LMCACHE_REMOTE_URL": "redis://h:6379"})[0]
    assert env_run.store["fresh"] is False and "LMCACHE_REMOTE_URL redis://h:6379" in env_run.store["why"]
    extra_run = _fresh(_arm_with("LMCacheConnectorV1", {"lmcache.remote_url": "lm://h:1"}), tmp_path)[0]
    assert (
        extra_run.store["fresh"] is False and extra_run.spec.connector.extra_config["lmcache.remote_url"] == "lm://h:1"
    )


def test_a_connector_the_kit_does_not_know_with_a_path_is_marked_as_persisting(tmp_path):
    arm = _arm_with("MyConnector", {"cache_dir": str(tmp_path / "c"), "mode": "fast"}, "my_module")
    run = _fresh(arm, tmp_path)[0]
    assert run.spec.connector.extra_config["cache_dir"] == str(tmp_path / "c")  # not rewritten: unknown to the kit
    assert run.store["fresh"] is False and run.store["why"].startswith(f"cache_dir {tmp_path / 'c'}: ")
    quiet = _fresh(_arm_with("MyConnector", {"mode": "fast", "blocks": 4}, "my_module"), tmp_path)[0]
    assert quiet.store["fresh"] is True and "no setting names a store" in quiet.store["why"]


def test_an_mp_arm_is_fresh_through_its_own_server_and_a_native_arm_has_no_store(tmp_path):
    from repro.contract.job import ArmSpec
    from repro.plan.arms import PlannedArm, materialize

    mp = _fresh(_arm_with("LMCacheMPConnector", {"lmcache.mp.port": 5555}), tmp_path)[0]
    assert mp.store["fresh"] is True and "MP server" in mp.store["why"]
    native = PlannedArm(ArmSpec("native", "native"))
    assert materialize(native, []) is native and native.store is None


def test_a_scenario_run_derives_its_yaml_with_its_keys_and_a_fresh_local_disk(tmp_path):
    from dataclasses import replace

    import yaml

    from repro.plan.arms import LMCACHE_CONFIG_ENV
    from repro.plan.fixtures import Scenario
    from repro.run.scenarios import prepare, section, trial_run

    base = tmp_path / "lmcache.yaml"
    base.write_text(f"chunk_size: 256\nlocal_disk: {tmp_path / 'disk'}\n")
    scenario = Scenario("s", "", {}, {"max_local_cpu_size": 0.003}, None, ())
    arm = _arm_with("LMCacheConnectorV1~scenario.s", {})
    trial = trial_run(arm, 2)
    work = tmp_path / "work"
    work.mkdir()
    runs = [prepare(a, scenario, work, [], tmp_path, str(base)) for a in (arm, trial)]
    disks = []
    for run, record in runs:
        written = yaml.safe_load(Path(run.env[LMCACHE_CONFIG_ENV]).read_text())
        assert Path(run.env[LMCACHE_CONFIG_ENV]).parent == work and written["max_local_cpu_size"] == 0.003
        assert record["overrides"] == {"max_local_cpu_size": 0.003} and run.store["fresh"] is True
        disks.append(written["local_disk"])
    assert disks[0] != disks[1] and all(Path(d).parent == tmp_path / "disk" for d in disks)  # trial 2 its own
    assert "~trial2" in Path(disks[1]).name
    baseline = _arm_with("baseline", {})  # stands in for the control's arm; only its mode is read
    baseline = replace(baseline, spec=replace(baseline.spec, mode="baseline", connector=None))
    sec = section(scenario, [(baseline, baseline, None, None), (arm, runs[0][0], None, runs[0][1])], {}, None, "l")
    (entry,) = sec["arms"]
    assert entry["store"] == runs[0][0].store and _schema_errors("scenario_arm", entry) == []
    with pytest.raises(ValueError, match="share its store"):
        trial_run(runs[0][0], 3)  # a prepared run would hand its trial its own store


# ---- unit: a confirmation made with a store that persisted is not independent --------------------------------


class _Clock:
    def sharing(self, name: str) -> dict:
        shared = "~" not in name
        others = [{"process": "arm native", "overlap_s": 3.0}] if shared else []
        return {"resource": "CPU cores", "others": others, "shared": shared}


def _entry(verdict: str, first_diff) -> dict:
    reqs = [{"first_diff": None, "cached_tokens": 0}, {"first_diff": first_diff, "cached_tokens": 1488}]
    return {"verdict": verdict, "probes": [{"name": "fixture", "verdict": verdict, "requests": reqs}],
            "timing": {"wall_s": 1.0}}  # fmt: skip


@pytest.mark.parametrize("fresh", [True, False])
def test_a_confirmation_says_whether_its_run_alone_was_independent(tmp_path, fresh):
    from dataclasses import replace

    from repro.judge import trials
    from repro.run.arm_runs import Run
    from repro.run.confirm import STORE_PERSISTED, confirmation_of

    store = {"fresh": True, "rewritten": ["shared_storage_path /kv -> /kv/kvkit-x~alone-1"]}
    if not fresh:
        store = {"fresh": False, "rewritten": [], "why": "remote_url lm://h:1 (LMCache YAML): shared"}
    arm = _arm_with("ExampleConnector~alone", {})
    alone = Run(0, "alone", None, replace(arm, store=store), entry=_entry("PASS", None))
    named = [("ExampleConnector", trials.run_summary(_entry("FAIL", 4), 1, True))]
    conf = confirmation_of(named, [alone], _Clock().sharing, confirm=True)
    assert conf["status"] == "ran" and conf["independent"] is fresh and conf["store"] == store
    assert (STORE_PERSISTED in conf["reason"]) is (not fresh), conf["reason"]
    if not fresh:
        assert "remote_url lm://h:1" in conf["reason"]
    assert _schema_errors("confirmation", conf) == []


def _schema_errors(definition: str, value: dict) -> list[str]:
    import jsonschema

    from repro.paths import SCHEMAS_DIR

    schema = json.loads((SCHEMAS_DIR / "report.schema.json").read_text(encoding="utf-8"))
    wrapped = {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": f"#/$defs/{definition}"}
    return [e.message for e in jsonschema.Draft202012Validator(wrapped).iter_errors(value)]


def test_the_schema_takes_a_store_and_refuses_a_malformed_one():
    good = {"fresh": False, "rewritten": [], "why": "remote_url lm://h:1 (LMCache YAML): shared"}
    assert _schema_errors("store", good) == []
    assert _schema_errors("store", {"fresh": "yes", "rewritten": []}) != []
    assert _schema_errors("store", {"fresh": True}) != []  # rewritten is always listed, [] when nothing


def test_the_views_say_not_independent():
    from repro.readmodel.conditions import ArmConditions

    conf = {"status": "ran", "why": "w", "run": {"verdict": "PASS", "probes": []}, "class": "contention-dependent",
            "reason": "alone: PASS 1/1; the store persisted: not independent (x)", "independent": False}  # fmt: skip
    c = ArmConditions({"confirmation": conf})
    assert c.confirmation_text == "re-run alone: PASS → contention-dependent, not independent"
    assert c.confirmation_independent is False and "not independent" in c.confirmation_reason
    assert ArmConditions({"confirmation": {**conf, "independent": True}}).confirmation_text.endswith("dependent")
