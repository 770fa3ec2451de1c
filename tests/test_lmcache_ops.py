"""LMCache's compiled ops (repro.lmcache.ops) against fake interpreters: a fake torch and a fake lmcache
package made in tmp_path, whose cuda_ops imports or raises as the real wheel's does under another torch.
The fallback blocker, resolve() in each mode, build() from a fake sdist whose setup.py writes the ops,
and the command line; no real LMCache, torch build or GPU."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from kvkit_testutil import ROOT

from repro.engine import facts
from repro.errors import UsageError
from repro.lmcache import ops as lmcache_ops
from repro.lmcache.ops import BLOCKED_ERROR, FALLBACK_DIR, MANIFEST_NAME, BuildError, apply, build, resolve
from repro.plan.options import build_parser

UNDEFINED = "undefined symbol: _ZN3c1017RegisterOperatorsD1Ev"
TORCH = "2.11.0+cu130"


def fake_site(root: Path, ops: str | None = "imports", lmcache: str | None = "0.5.4", caps=((9, 0),)) -> Path:
    """A folder to put first on PYTHONPATH: a fake torch (version, CUDA, GPU caps) and, unless lmcache is
    None, a fake lmcache whose `import lmcache` tries its ops and logs LMCache's fallback warning as
    0.5.4 does; ops "imports", "raises" (an undefined symbol) or None (not shipped)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "torch").mkdir(exist_ok=True)
    (root / "torch" / "__init__.py").write_text(
        f"__version__ = {TORCH!r}\nCAPS = {list(caps)!r}\n"
        "class version:\n    cuda = '13.0'\n"
        "class cuda:\n"
        "    is_available = staticmethod(lambda: bool(CAPS))\n"
        "    device_count = staticmethod(lambda: len(CAPS))\n"
        "    get_device_capability = staticmethod(lambda i: tuple(CAPS[i]))\n"
    )
    if lmcache is None:
        return root
    pkg = root / "lmcache"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text(
        "import sys\ntry:\n    import lmcache.cuda_ops\nexcept ImportError:\n"
        "    print('LMCache WARNING: lmcache.cuda_ops compiled extension not found; CudaDeviceOps stays on the "
        "torch baseline for all ops.', file=sys.stderr)\n"
    )
    if ops == "imports":
        (pkg / "cuda_ops.py").write_text("KIND = 'wheel'\n")
    elif ops == "raises":
        (pkg / "cuda_ops.py").write_text(f"raise ImportError({UNDEFINED!r})\n")
    dist = root / f"lmcache-{lmcache}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: lmcache\nVersion: {lmcache}\n")
    return root


def site_env(*dirs: Path, **extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(str(d) for d in dirs), **extra}


def _run(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False
    )


# ---- the fallback blocker ------------------------------------------------------------------------


def test_the_blocker_makes_lmcache_fall_back_in_a_fresh_interpreter(tmp_path):
    site = fake_site(tmp_path / "site", ops="imports")
    assert _run("import lmcache.cuda_ops", site_env(site)).returncode == 0  # the wheel's ops import
    blocked = _run(
        "import lmcache\ntry:\n    import lmcache.cuda_ops\nexcept ImportError as e:\n    print(e)\n",
        apply(resolve_plan_fallback(), site_env(site)),
    )
    assert blocked.returncode == 0, blocked.stderr
    assert blocked.stdout.strip() == BLOCKED_ERROR
    assert "compiled extension not found" in blocked.stderr  # LMCache's own import took its fallback


def resolve_plan_fallback():
    return lmcache_ops.OpsPlan({"PYTHONPATH": str(FALLBACK_DIR)}, {})


def test_the_blocker_chains_an_existing_sitecustomize(tmp_path):
    site = fake_site(tmp_path / "site", ops="imports")
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import builtins\nbuiltins.KVKIT_OWN_SITECUSTOMIZE = True\n")
    code = (
        "import builtins, importlib\n"
        "print(getattr(builtins, 'KVKIT_OWN_SITECUSTOMIZE', False))\n"
        "try:\n    importlib.import_module('lmcache.cuda_ops')\nexcept ImportError as e:\n    print(e)\n"
    )
    out = _run(code, site_env(FALLBACK_DIR, site, own))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["True", BLOCKED_ERROR]
    alone = _run(code, site_env(site, own))  # without the blocker: the environment's own, and the ops import
    assert alone.stdout.strip() == "True"


# ---- resolve -------------------------------------------------------------------------------------


def test_auto_takes_the_wheels_ops_when_they_import(tmp_path):
    env = site_env(fake_site(tmp_path / "site", ops="imports"))
    plan = resolve("auto", sys.executable, env, tmp_path / "cache")
    assert plan.env == {} and apply(plan, env) == env
    prov = plan.provenance
    assert (prov["mode"], prov["path"], prov["source"]) == ("auto", "compiled", "wheel")
    assert (prov["lmcache"], prov["torch"], prov["arch"], prov["wheel_import_error"]) == ("0.5.4", TORCH, "9.0", None)
    assert resolve("compiled", sys.executable, env, tmp_path / "cache").provenance["source"] == "wheel"


def test_auto_without_ops_or_build_records_the_fallback_and_compiled_refuses(tmp_path):
    env = site_env(fake_site(tmp_path / "site", ops="raises"))
    plan = resolve("auto", sys.executable, env, tmp_path / "cache")
    assert plan.env == {}
    prov = plan.provenance
    assert prov["path"] == "fallback" and prov["source"] is None and prov["build_dir"] is None
    assert prov["wheel_import_error"] == f"ImportError: {UNDEFINED}"
    assert UNDEFINED in prov["detail"] and "no kit build 0.5.4-torch2.11.0+cu130-sm9.0" in prov["detail"]
    with pytest.raises(UsageError, match="--lmcache-ops compiled: the wheel's lmcache.cuda_ops does not import"):
        resolve("compiled", sys.executable, env, tmp_path / "cache")


def test_fallback_blocks_the_ops_even_where_the_wheels_import(tmp_path):
    env = site_env(fake_site(tmp_path / "site", ops="imports"))
    plan = resolve("fallback", sys.executable, env, tmp_path / "cache")
    assert plan.env == {"PYTHONPATH": str(FALLBACK_DIR)}
    assert plan.provenance["path"] == "fallback" and BLOCKED_ERROR in plan.provenance["detail"]
    applied = apply(plan, env)
    assert applied["PYTHONPATH"].split(os.pathsep)[0] == str(FALLBACK_DIR)
    assert applied["PYTHONPATH"].endswith(env["PYTHONPATH"])
    probed = lmcache_ops.probe(sys.executable, applied, ops=True)["ops"]
    assert probed == {"lmcache_imports": True, "imports": False, "error": f"ImportError: {BLOCKED_ERROR}"}


def test_no_lmcache_is_not_recorded_in_auto_and_an_error_when_compiled(tmp_path):
    env = site_env(fake_site(tmp_path / "site", lmcache=None))
    plan = resolve("auto", sys.executable, env, tmp_path / "cache")
    assert plan.provenance["path"] == "not recorded" and "No module named 'lmcache'" in plan.provenance["detail"]
    with pytest.raises(UsageError, match="cannot import lmcache"):
        resolve("compiled", sys.executable, env, tmp_path / "cache")
    with pytest.raises(UsageError, match="choose one of"):
        resolve("sometimes", sys.executable, env)


# ---- build ---------------------------------------------------------------------------------------

SETUP_PY = """import os, sys
assert sys.argv[1:] == ["build_ext", "--inplace"], sys.argv
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "runs"), "a") as fh:
    fh.write("1")
if os.environ.get("KVKIT_FAKE_BUILD_FAILS"):
    print("csrc/cuda/mem_kernels.cu: error: nvcc died")
    sys.exit(1)
with open("lmcache/cuda_ops.py", "w") as fh:
    fh.write("KIND = 'kit build'\\nARCH = %r\\n" % os.environ["TORCH_CUDA_ARCH_LIST"])
"""


def fake_sdist(tmp_path: Path, version: str = "0.5.4") -> Path:
    path = tmp_path / f"lmcache-{version}.tar.gz"
    files = {
        "PKG-INFO": f"Metadata-Version: 2.4\nName: lmcache\nVersion: {version}\n",
        "setup.py": SETUP_PY,
        "lmcache/__init__.py": "",
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"lmcache-{version}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def nvcc_env(tmp_path: Path, site: Path, **extra: str) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    nvcc = bin_dir / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    return site_env(site, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **extra)


def test_build_unpacks_builds_checks_and_writes_the_manifest_then_resolve_finds_it(tmp_path):
    site = fake_site(tmp_path / "site", ops="raises")
    cache = tmp_path / "work" / "cache"
    env = nvcc_env(tmp_path, site)
    build_dir, manifest, reused = build(sys.executable, fake_sdist(tmp_path), cache, env=env, max_jobs=1)
    assert not reused and build_dir == cache / "0.5.4-torch2.11.0+cu130-sm9.0"
    assert sorted(p.name for p in cache.iterdir()) == [build_dir.name]  # no temp dir left
    assert json.loads((build_dir / MANIFEST_NAME).read_text()) == manifest
    assert manifest["kind"] == "kvkit-lmcache-ops-build" and manifest["schema_version"] == 1
    assert (manifest["lmcache"], manifest["torch"], manifest["arch"], manifest["nvcc"]) == (
        "0.5.4",
        TORCH,
        "9.0",
        "13.0.88",
    )
    assert manifest["sdist"]["name"] == "lmcache-0.5.4.tar.gz" and len(manifest["sdist"]["sha256"]) == 64
    assert manifest["ops_file"] == "lmcache-0.5.4/lmcache/cuda_ops.py" and manifest["built_at"].endswith("Z")
    assert "ARCH = '9.0'" in (build_dir / manifest["ops_file"]).read_text()
    # the same key again: reused, not rebuilt
    again = build(sys.executable, fake_sdist(tmp_path), cache, env=env)
    assert again[2] is True and again[0] == build_dir and (tmp_path / "work" / "runs").read_text() == "1"
    # auto now takes the kit build, on every LMCache process's PYTHONPATH
    plan = resolve("auto", sys.executable, site_env(site), cache)
    prov = plan.provenance
    assert (prov["path"], prov["source"], prov["build_dir"]) == ("compiled", "kit build", str(build_dir))
    assert prov["manifest"] == manifest and UNDEFINED in prov["wheel_import_error"]
    assert plan.env == {"PYTHONPATH": str(build_dir / "lmcache-0.5.4")}
    assert resolve("compiled", sys.executable, site_env(site), cache).provenance["source"] == "kit build"
    # an --arch of its own is another key
    other, manifest80, _ = build(sys.executable, fake_sdist(tmp_path), cache, arch="8.0", env=env)
    assert other.name.endswith("-sm8.0") and manifest80["arch"] == "8.0"


def test_the_child_tells_a_kit_build_from_the_wheel(tmp_path, monkeypatch):
    """repro.engine.facts.lmcache_build on the kit build's tree: compiled, kit build, its dir."""
    site = fake_site(tmp_path / "site", ops="raises")
    build_dir, _, _ = build(sys.executable, fake_sdist(tmp_path), tmp_path / "cache", env=nvcc_env(tmp_path, site))
    code = "import json\nfrom repro.engine.facts import lmcache_build\nprint(json.dumps(lmcache_build()))"
    kit = json.loads(_run(code, site_env(build_dir / "lmcache-0.5.4", ROOT, site)).stdout)
    assert (kit["copy_path"], kit["ops_source"], kit["ops_build_dir"]) == ("compiled", "kit build", str(build_dir))
    wheel = json.loads(_run(code, site_env(ROOT, fake_site(tmp_path / "wheel", ops="imports"))).stdout)
    assert (wheel["copy_path"], wheel["ops_source"], wheel["cuda_ops"]) == ("compiled", "wheel", "loaded")
    failed = json.loads(_run(code, site_env(ROOT, site)).stdout)
    assert (failed["copy_path"], failed["ops_source"]) == ("fallback", None)
    assert failed["ops_import_error"] == f"ImportError: {UNDEFINED}"
    blocked = json.loads(_run(code, site_env(FALLBACK_DIR, ROOT, fake_site(tmp_path / "wheel"))).stdout)
    assert blocked["copy_path"] == "fallback" and blocked["ops_import_error"] == f"ImportError: {BLOCKED_ERROR}"
    assert lmcache_ops.MANIFEST_NAME in Path(facts.__file__).read_text()  # the child reads the same name


@pytest.mark.parametrize(
    "case, match",
    [
        ("version", "is LMCache 0.5.5; .* has LMCache 0.5.4"),
        ("nvcc", "no nvcc"),
        ("gpu", "no GPU visible to tell the arch; give --arch"),
        ("sdist", "not an LMCache source distribution"),
    ],
)
def test_build_usage_errors_leave_nothing(tmp_path, monkeypatch, case, match):
    site = fake_site(tmp_path / "site", ops="raises", caps=() if case == "gpu" else ((9, 0),))
    env = nvcc_env(tmp_path, site)
    sdist = fake_sdist(tmp_path, "0.5.5" if case == "version" else "0.5.4")
    if case == "nvcc":
        monkeypatch.setattr(lmcache_ops, "CUDA_HOMES", ())
        env = {**site_env(site), "PATH": "/usr/bin:/bin", "CUDA_HOME": str(tmp_path / "none")}
    if case == "sdist":
        sdist = tmp_path / "other.tar.gz"
        with tarfile.open(sdist, "w:gz") as tar:
            tar.add(fake_site(tmp_path / "x"), arcname="x")
    cache = tmp_path / "cache"
    with pytest.raises(UsageError, match=match):
        build(sys.executable, sdist, cache, env=env)
    assert not cache.exists() or list(cache.iterdir()) == []


def test_a_failed_build_keeps_only_its_log(tmp_path):
    env = nvcc_env(tmp_path, fake_site(tmp_path / "site", ops="raises"), KVKIT_FAKE_BUILD_FAILS="1")
    cache = tmp_path / "cache"
    with pytest.raises(BuildError, match="failed \\(exit 1; log .*\\): csrc/cuda/mem_kernels.cu: error: nvcc died"):
        build(sys.executable, fake_sdist(tmp_path), cache, env=env)
    assert [p.name for p in cache.iterdir()] == ["0.5.4-torch2.11.0+cu130-sm9.0.failed.log"]


# ---- the command line ----------------------------------------------------------------------------


def _repro(env: dict, *args: str) -> subprocess.CompletedProcess:
    env = {**env, "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "repro", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_command_builds_shows_and_fails_in_one_line(tmp_path):
    site = fake_site(tmp_path / "site", ops="raises")
    env, cache = nvcc_env(tmp_path, site), str(tmp_path / "cache")
    args = ("lmcache-ops", "build", "--python", sys.executable, "--cache", cache)
    done = _repro(env, *args, "--sdist", str(fake_sdist(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert "0.5.4-torch2.11.0+cu130-sm9.0 (built in" in done.stdout
    shown = _repro(env, "lmcache-ops", "show", "--python", sys.executable, "--cache", cache)
    assert json.loads(shown.stdout)["source"] == "kit build"
    (tmp_path / "v").mkdir()
    for argv, code, text in (
        ((*args, "--sdist", str(fake_sdist(tmp_path / "v", "0.5.5"))), 2, "is LMCache 0.5.5"),
        ((*args, "--sdist", str(fake_sdist(tmp_path)), "--arch", "sm90"), 2, "--arch sm90"),
        (("lmcache-ops", "rebuild"), 2, "invalid choice"),
    ):
        proc = _repro(env, *argv)
        assert proc.returncode == code and len(proc.stderr.strip().splitlines()) == 1 and text in proc.stderr
    (tmp_path / "v" / "again").mkdir()
    failed = _repro(
        {**env, "KVKIT_FAKE_BUILD_FAILS": "1"},
        *args[:-1],
        str(tmp_path / "v" / "again"),
        "--sdist",
        str(fake_sdist(tmp_path)),
    )
    assert failed.returncode == 3 and failed.stderr.strip().splitlines() == [failed.stderr.strip()]
    assert "nvcc died" in failed.stderr


def test_the_verifiers_lmcache_ops_flag_takes_three_values_and_refuses_others():
    parser = build_parser()
    base = ["--model", "m", "--fixture", "f.json"]
    assert parser.parse_args(base).lmcache_ops == "auto"
    assert parser.parse_args([*base, "--lmcache-ops", "fallback"]).lmcache_ops == "fallback"
    with pytest.raises(UsageError, match="--lmcache-ops: invalid choice: 'sometimes'"):
        parser.parse_args([*base, "--lmcache-ops", "sometimes"])
    proc = subprocess.run(
        [sys.executable, "-m", "repro.verify_kv_reuse", *base, "--lmcache-ops", "sometimes"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--lmcache-ops" in proc.stderr
