"""repro.models: the GGUF reader and the conversion into a folder vLLM loads, on a small Llama GGUF written
with the `gguf` package (tests/gguf_fixtures.py), and the bad inputs: one line, exit 2, nothing half-written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kvkit_testutil import ROOT

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

from gguf_fixtures import HEADS, KV_HEADS, write_llama_gguf

from repro.models.convert import convert, unpermute
from repro.models.gguf import GGUFError, read_gguf
from repro.models.registry import SMOLLM2, SOURCE_FILE, packaged_model


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    return path, write_llama_gguf(path)


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The folder's weights as float32, read by hand (no torch): the header's dtypes say how."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        chunk = np.frombuffer(data[lo:hi], dtype="<u2")
        if info["dtype"] == "F16":
            values = chunk.view("<f2").astype(np.float32)
        else:  # BF16: the high half of a float32
            values = (chunk.astype(np.uint32) << 16).view(np.float32)
        out[name] = values.reshape(info["shape"])
    return out


def run_convert(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "repro", "convert-model", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False,
    )  # fmt: skip


def test_the_reader_dequantizes_every_tensor_as_the_gguf_package_does(small_gguf):
    path, _ = small_gguf
    ours = read_gguf(path)
    theirs = gguf.GGUFReader(str(path))
    assert {t.name for t in ours.tensors} == {t.name for t in theirs.tensors}
    types = set()
    for t in theirs.tensors:
        mine = ours.read(ours.tensor(t.name))
        ref = np.asarray(gguf.dequantize(t.data, t.tensor_type), dtype=np.float32)
        assert mine.shape == ref.shape and np.array_equal(mine.view(np.uint32), ref.view(np.uint32)), t.name
        types.add(t.tensor_type.name)
    assert types == {"F32", "F16", "Q4_0", "Q4_1", "Q8_0"}


def test_unpermute_inverts_llama_cpp_permutation():
    from gguf_fixtures import llama_permute

    w = np.arange(6 * 64 * 3, dtype=np.float32).reshape(6 * 64, 3)
    for heads in (1, 3, 6):
        assert np.array_equal(unpermute(llama_permute(w, heads), heads), w)
    assert not np.array_equal(llama_permute(w, 3), w)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_folder_holds_the_original_weights_in_hf_layout(small_gguf, tmp_path, dtype):
    """Q and K come back in Hugging Face row order: each equals the original weight's own quantization
    round trip, rounded to the folder's dtype (round to nearest even, as torch casts)."""
    import torch

    path, expected = small_gguf
    done = convert(SMOLLM2, path, None, tmp_path / "m", dtype)
    assert done["converted"]
    got = read_safetensors(tmp_path / "m" / "model.safetensors")
    assert set(got) == set(expected)  # tied embedding: no lm_head
    tdtype = getattr(torch, dtype)
    for name, want in expected.items():
        rounded = torch.from_numpy(want).to(tdtype).float().numpy()
        assert np.array_equal(got[name], rounded), name
    stored = read_gguf(path)  # the file's own (permuted) row order is not what the folder holds
    permuted = stored.read(stored.tensor("blk.0.attn_q.weight"))
    assert not np.array_equal(got["model.layers.0.self_attn.q_proj.weight"], permuted.astype(np.float16))
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is True
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (HEADS, KV_HEADS, 32)
    assert cfg["rms_norm_eps"] == 1e-05 and cfg["torch_dtype"] == dtype


def test_the_tokenizer_splits_digits_and_keeps_the_chat_template(small_gguf, tmp_path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    path, _ = small_gguf
    convert(SMOLLM2, path, None, tmp_path / "m", "float16")
    tok = Tokenizer.from_file(str(tmp_path / "m" / "tokenizer.json"))
    enc = tok.encode("the 12<|im_end|>")
    assert enc.tokens == ["t", "he", "Ġ", "1", "2", "<|im_end|>"]  # llama.cpp's smollm: every digit alone
    hf = AutoTokenizer.from_pretrained(str(tmp_path / "m"))
    text = hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert (hf.bos_token, hf.eos_token) == ("<|im_start|>", "<|im_end|>")


def test_source_record_and_provenance(small_gguf, tmp_path):
    import jsonschema

    from repro.record.provenance import model_record

    path, _ = small_gguf
    convert(SMOLLM2, path, None, tmp_path / "m", "float16")
    record = model_record(str(tmp_path / "m"))
    source = record["source"]
    assert source["package"] is None and source["dequantized_from"] == "Q4_1" and source["dtype"] == "float16"
    assert source["gguf"]["tensor_types"] == {"F16": 1, "F32": 5, "Q4_0": 1, "Q4_1": 12, "Q8_0": 1}
    schema = json.loads((ROOT / "schemas" / "report.schema.json").read_text())
    jsonschema.validate(record, schema["properties"]["provenance"]["properties"]["model"])
    (tmp_path / "m" / SOURCE_FILE).write_text("{")
    assert model_record(str(tmp_path / "m"))["source"].startswith("unavailable: ")
    assert "source" not in model_record(str(ROOT / "fixtures"))  # not a converted model


def test_a_second_conversion_is_a_no_op_and_a_changed_folder_is_redone(small_gguf, tmp_path):
    path, _ = small_gguf
    first = convert(SMOLLM2, path, None, tmp_path / "m", "float16")
    again = convert(SMOLLM2, path, None, tmp_path / "m", "float16")
    assert not again["converted"] and again["sha256"] == first["sha256"]
    (tmp_path / "m" / "config.json").write_text("{}")
    redone = convert(SMOLLM2, path, None, tmp_path / "m", "float16")
    assert redone["converted"] and redone["sha256"] == first["sha256"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temp or old folder left


def test_the_packaged_file_must_have_its_pinned_digest(small_gguf, tmp_path):
    path, _ = small_gguf
    package = {"name": SMOLLM2.package, "version": "0.1.2", "wheel_sha256": "0" * 64}
    with pytest.raises(GGUFError, match="is not the packaged file's"):
        convert(SMOLLM2, path, package, tmp_path / "m", "float16")
    assert not (tmp_path / "m").exists()


def test_the_pin_is_read_from_the_requirement_file():
    version, wheel = SMOLLM2.pin()
    line = next(x for x in (ROOT / SMOLLM2.requirement).read_text().splitlines() if x.startswith(SMOLLM2.package))
    assert line == f"{SMOLLM2.package}=={version} --hash=sha256:{wheel}"
    assert packaged_model("smollm2") is SMOLLM2


def _one_line_exit_2(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert all(w in proc.stderr for w in words), proc.stderr


@pytest.mark.parametrize(
    "damage",
    ["not a GGUF", "truncated in the tensor data", "truncated in the header", "a huge count", "empty"],
)
def test_a_corrupt_or_truncated_gguf_is_one_line_and_leaves_the_old_folder(small_gguf, tmp_path, damage):
    path, _ = small_gguf
    raw = path.read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(
        {
            "not a GGUF": b"PK\x03\x04" + raw[4:],
            "truncated in the tensor data": raw[: len(raw) - 100],
            "truncated in the header": raw[:2000],
            "a huge count": raw[:8] + (2**62).to_bytes(8, "little") + raw[16:],
            "empty": b"",
        }[damage]
    )
    out = tmp_path / "models" / "m"
    convert(SMOLLM2, path, None, out, "float16")  # an older conversion, which must survive
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    proc = run_convert("smollm2", "--gguf", str(bad), "--out", str(out))
    _one_line_exit_2(proc, str(bad))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["m"]


def test_an_unknown_model_name_is_one_line():
    _one_line_exit_2(run_convert("qwen9"), "unknown model 'qwen9'", "smollm2")


@pytest.mark.parametrize("where", ["read-only file system", "parent is a file", "target is a file"])
def test_an_unwritable_target_is_one_line(small_gguf, tmp_path, where):
    path, _ = small_gguf
    (tmp_path / "file").write_text("x")
    target = {
        "read-only file system": Path("/proc/kvkit/m"),
        "parent is a file": tmp_path / "file" / "m",
        "target is a file": tmp_path / "file",
    }[where]
    proc = run_convert("smollm2", "--gguf", str(path), "--out", str(target))
    _one_line_exit_2(proc, "--out")
    assert (tmp_path / "file").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_missing_package_says_how_to_install_it(monkeypatch):
    from importlib import metadata

    from repro.errors import UsageError
    from repro.models import convert as conv

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(conv.metadata, "distribution", missing)
    with pytest.raises(UsageError, match="make model MODEL=smollm2"):
        conv.installed_gguf(SMOLLM2)


def test_an_interrupted_conversion_leaves_no_temporary_folder(small_gguf, tmp_path, monkeypatch):
    from repro.models import convert as conv

    path, _ = small_gguf

    def boom(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(conv, "tokenizer_files", lambda *a: {})
    monkeypatch.setattr(conv, "write_safetensors", boom)
    with pytest.raises(KeyboardInterrupt):
        conv.convert(SMOLLM2, path, None, tmp_path / "m", "float16")
    assert list(tmp_path.iterdir()) == []
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_read_gguf_refuses_a_directory(tmp_path):
    with pytest.raises(GGUFError, match="is a directory"):
        read_gguf(tmp_path)
