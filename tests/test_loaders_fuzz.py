"""Fuzzing the fixture and report loaders: whatever the bytes, the only way out is UsageError."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvkit_testutil import ROOT

from repro.errors import UsageError
from repro.plan.fixtures import load_fixture, parse_fixture
from repro.record.report import load_report

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
SHIPPED = [json.loads(p.read_text()) for p in sorted((ROOT / "fixtures").glob("*.json"))]
REPORT = json.loads((ROOT / "tests" / "data" / "report-v1-example.json").read_text())


def _shrunk(obj):
    """The same shape with long lists cut to two items: mutations then land on structure."""
    if isinstance(obj, dict):
        return {k: _shrunk(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_shrunk(v) for v in obj[:2]]
    return obj


SMALL_REPORT = _shrunk(REPORT)
# Keys the loaders look at, so that mutations land where the code branches.
FIXTURE_KEYS = [
    "kind",
    "schema_version",
    "name",
    "tokenizer",
    "probes",
    "arms",
    "expected",
    "prompt",
    "token_ids",
    "chat",
    "messages",
    "role",
    "content",
    "length",
    "filler",
    "reuses",
    "connector",
    "module_path",
    "extra_config",
    "skip_probes",
]


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def _mutate(doc, data):
    """Replace, delete or retype one node somewhere in a valid document."""
    doc = copy.deepcopy(doc)
    paths = [p for p in _paths(doc) if p]
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = data.draw(st.sampled_from(["replace", "delete", "add"]))
            if action == "replace":
                parent[path[-1]] = data.draw(JSON)
            elif action == "delete":
                del parent[path[-1]]
            elif isinstance(parent, dict):
                parent[data.draw(st.sampled_from(FIXTURE_KEYS))] = data.draw(JSON)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed this path
    return doc


def _only_usage_error(fn, *args):
    try:
        fn(*args)
    except UsageError as exc:
        assert "\n" not in str(exc) and str(exc)


@SETTINGS
@given(JSON)
def test_fixture_parser_on_any_json(data):
    _only_usage_error(parse_fixture, data, "f.json", "0" * 64)


@SETTINGS
@given(st.data())
def test_fixture_parser_on_mutated_shipped_fixtures(data):
    doc = _mutate(data.draw(st.sampled_from(SHIPPED)), data)
    _only_usage_error(parse_fixture, doc, "f.json", "0" * 64)


@SETTINGS
@given(st.binary(max_size=200) | st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_fixture_and_report_files_of_any_bytes(tmp_path, raw):
    path = tmp_path / "x.json"
    path.write_bytes(raw)
    _only_usage_error(load_fixture, path)
    _only_usage_error(load_report, path)


@SETTINGS
@given(st.data())
def test_report_loader_on_mutated_real_report(tmp_path, data):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_mutate(SMALL_REPORT, data)))
    _only_usage_error(load_report, path)


def test_shipped_fixtures_and_example_report_load():
    for p in sorted((ROOT / "fixtures").glob("*.json")):
        load_fixture(p)
    load_report(ROOT / "tests" / "data" / "report-v1-example.json")


def test_missing_file_is_a_usage_error(tmp_path):
    _only_usage_error(load_fixture, tmp_path / "none.json")
    _only_usage_error(load_report, tmp_path / "none.json")
    _only_usage_error(load_report, Path(tmp_path))  # a directory
