"""JSON Schemas for the fixture and the report, checked against what the kit ships and writes;
old report versions stay loadable or are refused with what to do."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvkit_testutil import ROOT, run_cli
from test_cli_failures import _args, _env, setup  # noqa: F401 - setup is a pytest fixture
from test_loaders_fuzz import SHIPPED, _mutate

from repro.commands import run_command
from repro.errors import UsageError
from repro.plan.fixtures import parse_fixture
from repro.record import compact
from repro.record.report import REPORT_SCHEMA_VERSION, load_report

SCHEMAS = ROOT / "schemas"
DATA = ROOT / "tests" / "data"
# One example of every old report version this kit wrote, kept forever; the current version's is the newest old
# example migrated (version 3: version 2's, by python -m repro compact-report).
OLD_VERSIONS = {1: DATA / "report-v1-example.json", 2: DATA / "report-v2-example.json"}


def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


FIXTURE = _validator("fixture")
REPORT = _validator("report")


@pytest.mark.parametrize("path", sorted((ROOT / "fixtures").glob("*.json")), ids=lambda p: p.name)
def test_shipped_fixtures_match_the_schema(path):
    FIXTURE.validate(json.loads(path.read_text()))


def test_every_report_version_has_an_example_that_loads_and_matches(tmp_path):
    current = tmp_path / f"report-v{REPORT_SCHEMA_VERSION}-example.json"
    assert run_command(compact.main, [str(OLD_VERSIONS[2]), str(current)]) == 0
    examples = {**OLD_VERSIONS, REPORT_SCHEMA_VERSION: current}
    assert set(examples) == set(range(1, REPORT_SCHEMA_VERSION + 1))
    for version, path in examples.items():
        data = load_report(path)
        assert data["schema_version"] == version
        REPORT.validate(data)


def test_a_report_with_errors_matches_the_schema(setup):  # noqa: F811 - the imported fixture
    proc = run_cli(
        _args(setup, "--kv-connector", "ExampleConnector", "--compare-native"),
        env=_env(setup, modes={"native": "sigkill"}),
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    data = json.loads(setup["report"].read_text())
    REPORT.validate(data)
    assert data["errors"][0]["kind"] == "crash"


@pytest.mark.parametrize(
    "version, message", [(REPORT_SCHEMA_VERSION + 1, "upgrade the kit"), (0, "no migration exists")]
)
def test_report_versions_outside_this_kit_are_refused_with_what_to_do(tmp_path, version, message):
    data = json.loads(OLD_VERSIONS[1].read_text())
    data["schema_version"] = version
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=message):
        load_report(path)
    assert not REPORT.is_valid(data)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_what_the_fixture_loader_accepts_the_schema_accepts(data):
    doc = _mutate(data.draw(st.sampled_from(SHIPPED)), data)
    try:
        parse_fixture(doc, "f.json", "0" * 64)
    except UsageError:
        return
    FIXTURE.validate(doc)


def test_a_requests_prompt_logprobs_summary_matches_the_schema():
    """What repro.judge.prompt_logprobs.summary writes, against the report schema's $defs.prompt_logprobs."""
    from repro.judge import prompt_logprobs as plp

    schema = json.loads((ROOT / "schemas" / "report.schema.json").read_text(encoding="utf-8"))
    one = {"$defs": schema["$defs"], "$ref": "#/$defs/prompt_logprobs"}
    base = {"k": 1, "logprobs": [-1.0, -2.0], "top1": [3, 4], "nonfinite": 0}
    stale = {"k": 1, "logprobs": [None, 5.0], "top1": [-7, 4], "nonfinite": 1}
    for summary in (plp.summary(base, None), plp.summary(base, plp.compare(base, base)),
                    plp.summary(stale, plp.compare(stale, base))):  # fmt: skip
        jsonschema.validate(summary, one)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**plp.summary(base, None), "logprobs": [-1.0]}, one)  # never the values themselves
