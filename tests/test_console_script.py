"""The `kvkit` console script: `pip install .` into a fresh virtual environment gives `kvkit`, the same commands as
`python -m repro`, and its installed copy renders pages and issue text from any folder (the wheel carries templates/,
schemas/ and fixtures/, where repro.paths reads them). Engine-free; 10 to 20 s (two cores, busy)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from kvkit_testutil import ROOT

from repro import __version__, commands, paths
from repro.commands import COMMANDS
from repro.errors import EXIT_OK, EXIT_USAGE
from repro.kit import archive

# What the build reads, laid out as in a checkout and an unpacked kit (README.md is the package's long description).
BUILD_SOURCES = ("pyproject.toml", "setup.py", "README.md", "repro", "templates", "schemas", "fixtures")
REPORT = ROOT / "tests" / "data" / "render-selftest.json"  # a committed report; the kit carries tests/ too
# The installed distribution's console script and dependencies, as its metadata says (tomllib is Python 3.11+).
METADATA = (
    "import json; from importlib import metadata as m; import repro.paths as p; "
    "print(json.dumps({'scripts': {e.name: e.value for e in m.entry_points(group='console_scripts', name='kvkit')}, "
    "'requires': m.requires('kvkit'), 'templates': str(p.TEMPLATES_DIR)}))"
)


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r.strip(), maxsplit=1)[0].lower() for r in requirements}


def test_the_kit_carries_what_builds_it():
    assert all(archive.is_kit_path(p) for p in ("pyproject.toml", "setup.py", "repro/paths.py", "fixtures/x.json"))


def test_a_checkout_reads_its_files_beside_repro():
    assert not paths.INSTALLED_FILES.exists()  # only a wheel has it (setup.py)
    assert paths.KIT_FILES_ROOT == paths.KIT_ROOT == ROOT
    assert paths.TEMPLATES_DIR == ROOT / "templates" and (paths.SCHEMAS_DIR / "report.schema.json").is_file()


def test_usage_names_the_program_it_was_called_as(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/kvkit", "site"])
    assert commands.ArgumentParser(prog="python -m repro site").prog == "kvkit site"
    assert commands.ArgumentParser(prog="python -m repro.watch run").prog == "python -m repro.watch run"
    assert commands.main(["--version"]) == EXIT_OK
    assert capsys.readouterr().out == f"kvkit {__version__}\n"
    monkeypatch.setattr(sys, "argv", ["/k/repro/__main__.py"])
    assert commands.ArgumentParser(prog="python -m repro site").prog == "python -m repro site"
    assert commands.usage().startswith("usage: python -m repro COMMAND")


def _run(argv: list, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _copy_sources(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in BUILD_SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)


def test_pip_install_gives_kvkit_that_works_outside_the_repository(tmp_path):
    """A copy of the sources (pip's in-tree build leaves build/ beside them), installed with the machine's package
    index into a venv that sees no other site-packages; every kvkit below runs with its working folder elsewhere."""
    src, venv, work = tmp_path / "src", tmp_path / "venv", tmp_path / "work"
    src.mkdir()
    work.mkdir()
    _copy_sources(src)
    made = _run([sys.executable, "-m", "venv", venv], cwd=work)
    assert made.returncode == 0, made.stderr
    pip = _run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", src], cwd=work, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    kvkit = venv / "bin" / "kvkit"

    helped = _run([kvkit, "--help"], cwd=work)
    assert helped.returncode == EXIT_OK, helped.stderr
    assert helped.stdout.startswith("usage: kvkit COMMAND [ARGS]")
    listed = [line.split()[0] for line in helped.stdout.splitlines() if re.match(r"  \S", line)]
    assert listed == [c.name for c in COMMANDS]  # verify, endpoint, site, issue-md, ...: one line each, in order
    bare = _run([kvkit], cwd=work)
    assert bare.returncode == EXIT_USAGE and bare.stdout == helped.stdout
    unknown = _run([kvkit, "frobnicate"], cwd=work)
    assert (unknown.returncode, unknown.stderr) == (
        EXIT_USAGE,
        "error: unknown command 'frobnicate' (kvkit --help lists them)\n",
    )
    assert _run([kvkit, "verify", "--help"], cwd=work).returncode == EXIT_OK

    meta = _run([venv / "bin" / "python", "-c", METADATA], cwd=work)
    assert meta.returncode == EXIT_OK, meta.stderr
    installed = json.loads(meta.stdout)
    assert installed["scripts"] == {commands.CONSOLE_SCRIPT: "repro.__main__:console_main"}
    publish = (ROOT / "requirements" / "publish.txt").read_text(encoding="utf-8").splitlines()
    assert _names(installed["requires"]) == _names([r for r in publish if r[:1].isalpha()])  # pins and ranges agree
    templates = Path(installed["templates"])
    assert templates.parent.name == "_kit_files", installed  # the installed copy, not this checkout
    assert venv.resolve() in templates.parents and ROOT not in templates.parents
    for name in ("templates", "schemas", "fixtures"):
        shipped = {p.relative_to(ROOT / name) for p in (ROOT / name).rglob("*") if p.is_file()}
        assert {p.relative_to(templates.parent / name) for p in (templates.parent / name).rglob("*")} >= shipped

    (work / "in").mkdir()
    shutil.copy2(REPORT, work / "in" / REPORT.name)
    site = _run([kvkit, "site", "--reports", "in", "--out", "out"], cwd=work)
    assert site.returncode == EXIT_OK, site.stderr
    page = work / "out" / f"{REPORT.stem}.html"
    assert (work / "out" / "index.html").is_file() and page.is_file()
    assert page.name in (work / "out" / "index.html").read_text(encoding="utf-8")
    issue = _run([kvkit, "issue-md", Path("in") / REPORT.name, "--out", "issue.md"], cwd=work)
    assert issue.returncode == EXIT_OK, issue.stderr
    assert (work / "issue.md").read_text(encoding="utf-8").strip()
