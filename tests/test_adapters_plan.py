"""Key-identity probes, planned without an engine (repro/plan/adapters.py): a fixture's adapters read and resolved
for the run's model, the request each probe's child sends, the engine's LoRA settings, and bad input (one line,
exit 2, before any engine: a path that does not exist, an adapter of another model, a rank over max_lora_rank),
and the LoRARequest the child makes of each (the baseline's own ids)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from kvkit_testutil import ROOT, run_cli

from repro.contract.failure import ContractError
from repro.contract.job import ArmSpec, EngineConfig, Job, ProbeJob, build_job
from repro.contract.result import ProbeResult
from repro.engine.adapters import BASELINE_NAME, AdapterRequests, lora_kwargs
from repro.errors import UsageError
from repro.models import lora, tiny
from repro.plan import adapters
from repro.plan.fixtures import load_fixture

# The key-identity shapes: two adapters, A's name under another id, A reloaded in place (both of seed 3's weights).
TABLE = {
    "A": {"seed": 1, "lora_int_id": 1},
    "B": {"seed": 2, "lora_int_id": 2},
    "A-id3": {"seed": 3, "lora_name": "A", "lora_int_id": 3},
    "A-reloaded": {"seed": 3, "lora_name": "A", "lora_int_id": 1, "load_inplace": True},
}


def _model(tmp: Path, **changes) -> Path:
    """A model folder as far as planning reads one: its config.json (the tiny model's, with changes)."""
    folder = tmp / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**tiny.CONFIG, **changes}), encoding="utf-8")
    return folder


def _fixture(tmp: Path, adapters_table: dict, probe_adapter: str | None = "A", **top) -> Path:
    probe = {"name": "p", "prompt": {"token_ids": list(range(3, 40))}}
    if probe_adapter is not None:
        probe["adapter"] = probe_adapter
    data = {"kind": "kvkit-fixture", "schema_version": 2, "name": "t", "tokenizer": {"name": "t"},
            "adapters": adapters_table, "probes": [probe], **top}  # fmt: skip
    path = tmp / "fixture.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _adapter_dir(tmp: Path, name: str, config: dict, rank: int = 8) -> Path:
    """A PEFT adapter folder made by the kit's writer for `config`."""
    folder = tmp / name
    folder.mkdir()
    for file, data in lora.adapter_files(config, "some-model", seed=5, rank=rank).items():
        (folder / file).write_bytes(data)
    return folder


def _shapes_fixture(tmp: Path) -> Path:
    """TABLE, each adapter's probe of one prompt (short-A, short-B, ...)."""
    path = _fixture(tmp, TABLE)
    data = json.loads(path.read_text())
    data["probes"] = [{"name": f"short-{a}", "adapter": a, "prompt": {"token_ids": list(range(3, 303))}} for a in TABLE]
    path.write_text(json.dumps(data))
    return path


def _resolve(fixture: Path, model: Path, tmp: Path):
    f = load_fixture(fixture)
    return adapters.resolve(f.adapters, list(f.probes), str(model), True, fixture, tmp / "cache")


def test_a_table_names_each_adapter_as_written(tmp_path):
    f = load_fixture(_shapes_fixture(tmp_path))
    specs = {s.label: s for s in f.adapters.adapters}
    assert {p.adapter for p in f.probes} == set(specs) == {"A", "B", "A-id3", "A-reloaded"}
    assert (specs["A"].lora_name, specs["A"].lora_int_id, specs["A"].load_inplace) == ("A", 1, False)
    assert (specs["A-id3"].lora_name, specs["A-id3"].lora_int_id) == ("A", 3)
    assert (specs["A-reloaded"].lora_int_id, specs["A-reloaded"].load_inplace) == (1, True)
    assert specs["A-id3"].source == specs["A-reloaded"].source == {"seed": 3, "rank": 8}


def test_seeded_adapters_resolve_under_the_cache_per_model_config(tmp_path):
    model = _model(tmp_path)
    probes, plan = _resolve(_shapes_fixture(tmp_path), model, tmp_path)
    by_label = {a.spec.label: a for a in plan.adapters}
    digest = hashlib.sha256((model / "config.json").read_bytes()).hexdigest()[:12]
    assert Path(by_label["A"].path) == (tmp_path / "cache" / f"model-{digest}" / "seed1-rank8").resolve()
    assert by_label["A-id3"].path == by_label["A-reloaded"].path  # the same seed, the same weights
    assert by_label["A"].make_from == str(model.resolve())
    assert plan.engine() == {"max_lora_rank": 8, "max_loras": 4}
    spec = next(p for p in probes if p.name == "short-B").prompt_spec()
    assert spec["adapter"] == {"label": "B", "lora_name": "B", "lora_int_id": 2, "path": by_label["B"].path,
                               "load_inplace": False}  # fmt: skip
    assert "token_ids" in spec


def test_a_fixture_without_adapters_plans_as_before(tmp_path):
    f = load_fixture(ROOT / "fixtures" / "selftest-cpu.json")
    probes, plan = adapters.resolve(f.adapters, list(f.probes), str(_model(tmp_path)), True, "x", tmp_path)
    assert plan is None and f.adapters is None and probes == list(f.probes)
    assert "adapter" not in probes[0].prompt_spec()


def test_make_planned_writes_the_seeded_adapters_the_plan_names(tmp_path):
    probes, plan = _resolve(_shapes_fixture(tmp_path), _model(tmp_path), tmp_path)
    lora.make_planned(plan)
    described = adapters.describe(plan, probes)
    assert described["A-id3"]["sha256"] == described["A-reloaded"]["sha256"] != described["A"]["sha256"]
    assert described["B"]["probes"] == ["short-B"] and described["B"]["source"] == {"seed": 2, "rank": 8}
    again = Path(plan.adapters[0].path) / "adapter_model.safetensors"
    assert again.read_bytes() == lora.adapter_files(tiny.CONFIG, "model", seed=1)["adapter_model.safetensors"]


def test_a_path_adapter_is_found_beside_the_fixture_and_keeps_its_rank(tmp_path):
    _adapter_dir(tmp_path, "mine", tiny.CONFIG, rank=16)
    fixture = _fixture(tmp_path, {"A": {"path": "mine"}})
    _, plan = _resolve(fixture, _model(tmp_path), tmp_path)
    assert plan.adapters[0].path == str((tmp_path / "mine").resolve()) and plan.adapters[0].rank == 16
    assert plan.max_lora_rank == 16 and plan.adapters[0].make_from is None


@pytest.mark.parametrize(
    ("table", "top", "message"),
    [
        ({"A": {"seed": 1, "path": "x"}}, {}, "adapters.A: give exactly one of seed"),
        ({"A": {}}, {}, "adapters.A: give exactly one of seed"),
        ({"A": {"seed": -1}}, {}, "adapters.A.seed: must be an integer of at least 0"),
        ({"A": {"seed": 1, "lora_int_id": 0}}, {}, "adapters.A.lora_int_id: must be an integer of at least 1"),
        # an explicit null: the schema says integer, so the loader does (found by tests/test_schemas.py's fuzzing)
        ({"A": {"seed": 1, "lora_int_id": None}}, {}, "adapters.A.lora_int_id: must be an integer of at least 1"),
        ({"A": {"seed": None}}, {}, "adapters.A.seed: must be an integer of at least 0"),
        ({"A": {"seed": 1, "rank": None}}, {}, "adapters.A.rank: must be an integer of at least 1"),
        ({"A": {"seed": 1}}, {"lora": None}, "lora: must be an object"),
        ({"A": {"seed": 1, "colour": 1}}, {}, "adapters.A: unknown field 'colour'"),
        ({"A": {"path": "x", "rank": 8}}, {}, "adapters.A.rank: only a seeded adapter takes a rank"),
        ({"A": {"seed": 1, "load_inplace": "yes"}}, {}, "adapters.A.load_inplace: must be true or false"),
        ({"B": {"seed": 1}}, {}, "probes[0].adapter: no adapter 'A' in the fixture's adapters"),
        ({"A": {"seed": 1}}, {"lora": {"max_lora_rank": 12}}, "lora.max_lora_rank: 12 is not one vLLM takes"),
        ({"A": {"seed": 1}}, {"lora": {"max_loras": 1, "x": 2}}, "lora: unknown field 'x'"),
        (
            {"A": {"seed": 1}, "C": {"seed": 2, "lora_int_id": 1}},
            {},
            "adapters.C: lora_int_id 1 is adapter A's, whose weights differ",
        ),
        ([], {}, "adapters: must be an object of label -> adapter"),
    ],
)
def test_a_bad_adapters_table_is_one_line(tmp_path, table, top, message):
    with pytest.raises(UsageError, match="fixture .*: ") as err:
        load_fixture(_fixture(tmp_path, table, **top))
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("label", [["A"], {"A": 1}, 7, None])
def test_a_probe_adapter_that_is_no_label_is_one_line(tmp_path, label):
    # found by tests/test_loaders_fuzz.py on a shipped fixture: a list here raised TypeError (unhashable)
    path = _fixture(tmp_path, {"A": {"seed": 1}})
    data = json.loads(path.read_text(encoding="utf-8"))
    data["probes"][0]["adapter"] = label  # null included: given, so no base-model probe
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(UsageError, match="fixture .*: ") as err:
        load_fixture(path)
    assert "probes[0].adapter: must be an adapter's label (a string)" in str(err.value)


def test_an_in_place_reload_may_take_an_earlier_adapters_id(tmp_path):
    table = {"A": {"seed": 1}, "A2": {"seed": 2, "lora_name": "A", "lora_int_id": 1, "load_inplace": True}}
    assert load_fixture(_fixture(tmp_path, table)).adapters.adapters[1].lora_int_id == 1


# ---- the engine child's requests (repro/engine/adapters.py)

A = {"label": "A", "lora_name": "A", "lora_int_id": 1, "path": "/cache/seed1", "load_inplace": False}
A_RELOADED = {"label": "A-reloaded", "lora_name": "A", "lora_int_id": 1, "path": "/cache/seed3", "load_inplace": True}


def _job(mode: str) -> object:
    engine = EngineConfig("m", None, "float32", 0, 0.1, 2048, 16, "cpu", lora={"max_lora_rank": 8, "max_loras": 4})
    probes = [ProbeJob(n, {"token_ids": [1, 2, 3], "adapter": a}, 2) for n, a in (("a", A), ("r", A_RELOADED))]
    arm = ArmSpec(mode, mode)
    return build_job(arm, engine, probes + [ProbeJob("base", {"token_ids": [1, 2]}, 2)], max_tokens=4, logprobs=1)


def test_a_reuse_arm_sends_each_adapter_as_the_fixture_declares_it():
    job = _job("native")
    loras = AdapterRequests(job)
    assert loras.sent(job.probes[1].prompt) == A_RELOADED and loras.sent(job.probes[2].prompt) is None
    assert loras.generate_kwargs([job.probes[2].prompt]) == {}  # a base-model call is as it always was
    assert lora_kwargs(job.engine) == {"enable_lora": True, "max_lora_rank": 8, "max_loras": 4}


def test_the_baseline_gives_each_adapters_weights_an_id_of_their_own():
    """A and A-reloaded share lora_int_id 1: the baseline's one engine would answer one with the other's weights."""
    job = _job("baseline")
    loras = AdapterRequests(job)
    a, r = (loras.sent(p.prompt) for p in job.probes[:2])
    assert (a["lora_int_id"], r["lora_int_id"]) == (1, 2) and not r["load_inplace"]
    assert a["lora_name"] == BASELINE_NAME.format(1) and a["path"] == A["path"] and a["label"] == "A"
    assert lora_kwargs(EngineConfig("m", None, "float32", 0, 0.1, 2048, 16, "cpu")) == {}


def test_the_job_and_the_result_carry_the_adapters_through_their_json():
    job = _job("native")
    assert Job.from_json(json.loads(json.dumps(job.to_json()))) == job
    bad = job.to_json()
    del bad["probes"][0]["prompt"]["adapter"]["path"]
    with pytest.raises(ContractError, match=r"job.probes\[0\].prompt.adapter.path: missing"):
        Job.from_json(bad)
    result = ProbeResult("a", (1, 2, 3), None, (), adapter=A)
    assert ProbeResult.from_json(result.to_json(), "p") == result
    assert "adapter" not in ProbeResult("b", (1, 2), None, ()).to_json()  # a base-model probe's result as before


# ---- bad input on the command line: one line, exit 2, before any engine starts


def _verify(tmp: Path, fixture: Path, model: Path) -> object:
    report = tmp / "out" / "report.json"
    args = ["--model", str(model), "--device", "cpu", "--fixture", str(fixture), "--report", str(report),
            "--compare-native", "--engine-module", "tests.fake_engine"]  # fmt: skip
    proc = run_cli(args, timeout=60)
    assert not report.exists()
    return proc


def _one_line_exit_2(proc, *expected: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert all(e in proc.stderr for e in expected) and "Traceback" not in proc.stderr, proc.stderr


def test_an_adapter_path_that_does_not_exist_is_one_line(tmp_path):
    proc = _verify(tmp_path, _fixture(tmp_path, {"A": {"path": "nowhere"}}), _model(tmp_path))
    _one_line_exit_2(proc, "adapter A: ", "nowhere does not exist")


def test_a_folder_without_an_adapter_config_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = _verify(tmp_path, _fixture(tmp_path, {"A": {"path": "empty"}}), _model(tmp_path))
    _one_line_exit_2(proc, "adapter A: ", "holds no readable PEFT LoRA adapter_config.json")


def test_an_adapter_of_another_model_is_one_line(tmp_path):
    other = {**tiny.CONFIG, "hidden_size": tiny.CONFIG["hidden_size"] * 2}
    _adapter_dir(tmp_path, "other", other)
    proc = _verify(tmp_path, _fixture(tmp_path, {"A": {"path": "other"}}), _model(tmp_path))
    hidden = tiny.CONFIG["hidden_size"]
    _one_line_exit_2(proc, "adapter A was made for another model than --model", f"has {hidden} inputs",
                     "it names base model 'some-model'")  # fmt: skip


def test_an_adapter_of_a_deeper_model_is_one_line(tmp_path):
    _adapter_dir(tmp_path, "deeper", {**tiny.CONFIG, "num_hidden_layers": tiny.CONFIG["num_hidden_layers"] + 2})
    proc = _verify(tmp_path, _fixture(tmp_path, {"A": {"path": "deeper"}}), _model(tmp_path))
    _one_line_exit_2(proc, "made for another model", f"and the model has {tiny.CONFIG['num_hidden_layers']}")


def test_a_rank_over_max_lora_rank_is_one_line(tmp_path):
    _adapter_dir(tmp_path, "wide", tiny.CONFIG, rank=16)
    fixture = _fixture(tmp_path, {"A": {"path": "wide"}}, lora={"max_lora_rank": 8})
    _one_line_exit_2(_verify(tmp_path, fixture, _model(tmp_path)), "adapter A has rank 16, over lora.max_lora_rank 8")


def test_a_seeded_rank_over_max_lora_rank_is_one_line(tmp_path):
    fixture = _fixture(tmp_path, {"A": {"seed": 1, "rank": 16}}, lora={"max_lora_rank": 8})
    _one_line_exit_2(_verify(tmp_path, fixture, _model(tmp_path)), "adapter A has rank 16, over lora.max_lora_rank 8")


def test_a_seeded_adapter_needs_a_local_model(tmp_path):
    proc = _verify(tmp_path, _fixture(tmp_path, {"A": {"seed": 1}}), Path("someone/some-model"))
    _one_line_exit_2(proc, "adapter A: a seeded adapter is made from the model's config.json")


def test_adapters_in_a_version_1_fixture_are_refused(tmp_path):
    """A kit older than adapters reads version 1 and would run the probes under the base model: such a file says 2."""
    fixture = _fixture(tmp_path, {"A": {"seed": 1}})
    fixture.write_text(fixture.read_text().replace('"schema_version": 2', '"schema_version": 1'))
    with pytest.raises(UsageError, match="adapters, lora and a probe's adapter need schema_version 2"):
        load_fixture(fixture)
