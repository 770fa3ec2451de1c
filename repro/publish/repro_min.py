"""A reproducer without the kit: `repro_min.py`, a fixed script, and its inputs for one reuse arm of a report.

The script (SCRIPT) is the same bytes for every report: no report string is ever in its source. What it runs is data in
a JSON sidecar written beside it (`repro_min.json`, kind `kvkit-repro-min-inputs`): the prompts' token IDs, the engine
settings the arms ran, the arm's connector (and its LMCache YAML), max_tokens. The script validates that file strictly
before anything runs (known keys, types, ranges; one line and exit 2 otherwise), and the kit writes only inputs that
pass the script's own check. It needs vLLM (and LMCache where the arm used it) and the standard library; the kit's
planted connector, the one connector an arm may run that is neither vLLM's nor LMCache's, travels beside it as one
module (`planted_fault_connector.py`: the kit's own planted_gates.py, planted_failures.py and planted_fault.py,
combined from its files, never from a report), which the inputs name and the script puts on its engine processes'
path; it runs caching off and the reuse arm each in a process of its own (it starts itself twice), compares every
generated token ID exactly and prints the hit counts and the first difference. Exit 1 when a reuse that reported a
hit differs from caching off, 2 when
the evidence cannot say (a cold request that differs, or a reuse without a hit), 0 when every reuse matched, 3 when
there is no verdict (a package or the connector's file missing, a run that failed, a crash). It names no path of the
machine that made the report: the model is its first argument; a connector's scratch folder (`@tmpdir` in a fixture) is
a fresh temporary folder.

What it cannot reproduce is refused in one line rather than written to reproduce something else: probes under LoRA
adapters, with an image or a tenant salt (it sends none), native-matched's primed prefix, an LMCache MP server, and an LMCache YAML
that is not the kit's own file as the report recorded it (a relative path inside the kit with the recorded SHA-256;
any other file of the machine would be copied into a script its user attaches upstream), and any other connector
vLLM would import by module path (the kit cannot ship it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath

from repro import __version__
from repro.errors import UsageError
from repro.judge.verdict import FAIL, KV_FINDINGS
from repro.paths import KIT_ROOT
from repro.publish.issue_sections import read_lmcache_yaml
from repro.publish.shipped_connector import PLANTED_MODULES, SHIPPED_MODULE, planted_connector

MAX_LINES = 230  # the fixed script's length: a maintainer reads it before running it (200 until it said "no verdict",
# exit 3, where vLLM, LMCache or the connector shipped beside it is missing, or a run dies and leaves an engine behind;
# 220 until it refused answers of another length than max_tokens and read a -1 hit counter as no count, as the kit does)
INPUTS_KIND, INPUTS_VERSION = "kvkit-repro-min-inputs", 1
# Inputs schema_version history: 1, the first (issue 55: the script became fixed and reads this file); narrowed
# without a new version when the planted connector came to travel beside the script: kv_connector_module_path names
# only a module file beside the script (a plain name), as no dotted path into the kit ever ran without it.
SCRIPT = '''"""Minimal reproducer from kvkit: one reuse arm of a kvkit report against caching off, greedy decoding, every
generated token ID compared exactly. The same script for every report: what it runs (the prompts' token IDs, the
engine settings, the arm's connector and its LMCache YAML, max_tokens) is the JSON file beside it, repro_min.json
(or the second argument), checked before anything runs. Needs vLLM (and LMCache where the arm used it); a connector
that is neither vLLM's nor LMCache's comes beside this script as one file, which the JSON names.
Run: python repro_min.py MODEL_DIR [INPUTS.json]
Exit 0: every reuse matched caching off; 1: a reuse with a hit differs; 2: inconclusive, or the inputs are refused;
3: no verdict: a run failed or could not start (a missing package or file, a crash; a run's log tail is printed)."""
import contextlib, hashlib, importlib, importlib.util, json, math, os, re, select, signal, subprocess, sys, tempfile

KIND, SCHEMA_VERSION = "kvkit-repro-min-inputs", 1
TOP = {"kind", "schema_version", "tool_version", "report", "arm", "stack", "model", "model_sha256", "mode", "engine",
       "connector", "lmcache_yaml", "max_tokens", "prompts"}
ENGINE = {"dtype", "seed", "block_size", "max_model_len", "gpu_memory_utilization", "enforce_eager", "max_num_seqs",
          "max_num_batched_tokens"}
DTYPES = {"auto", "bfloat16", "float16", "float32"}
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")  # a connector class or its module file beside this script, a key
MAX_BYTES, MAX_ID = 64 << 20, 2**31 - 1
HERE = os.path.dirname(os.path.abspath(__file__))


class Refused(Exception):
    pass


def need(ok, why):
    if not ok:
        raise Refused(why)


def fields(d, where, required, optional=frozenset()):
    need(isinstance(d, dict), f"{where}: not an object")
    extra, missing = sorted(set(d) - required - optional), sorted(required - set(d))
    need(not extra, f"{where}: unknown key {extra[:1]}")
    need(not missing, f"{where}: missing key {missing[:1]}")
    return d


def text(d, key, where, limit=200):  # printed on the terminal: one printable line
    v = d[key]
    need(isinstance(v, str) and 0 < len(v) <= limit and v.isprintable(), f"{where}.{key}: not a printable text")


def integer(d, key, where, lo, hi):
    need(type(d[key]) is int and lo <= d[key] <= hi, f"{where}.{key}: not an integer from {lo} to {hi}")


def check(d):
    """The inputs as this script runs them, or Refused naming the first thing wrong."""
    fields(d, "inputs", TOP)
    need(d["kind"] == KIND, f"kind: not {KIND}")
    need(d["schema_version"] == SCHEMA_VERSION, f"schema_version: this script reads {SCHEMA_VERSION}")
    for key in ("tool_version", "report", "arm", "stack", "model", "model_sha256"):
        text(d, key, "inputs")
    need(d["mode"] in ("native", "connector"), "mode: not native or connector")
    e = fields(d["engine"], "engine", ENGINE)
    need(e["dtype"] in DTYPES, f"engine.dtype: not one of {sorted(DTYPES)}")
    integer(e, "seed", "engine", 0, 2**32 - 1)
    integer(e, "block_size", "engine", 1, 4096)
    for key in ("max_model_len", "max_num_batched_tokens"):
        integer(e, key, "engine", 1, 1 << 24)
    integer(e, "max_num_seqs", "engine", 1, 1024)
    gmu = e["gpu_memory_utilization"]
    need(type(gmu) in (int, float) and 0 < gmu <= 1, "engine.gpu_memory_utilization: not in (0, 1]")
    need(e["enforce_eager"] is True, "engine.enforce_eager: not true")
    integer(d, "max_tokens", "inputs", 1, 1 << 16)
    need(isinstance(d["prompts"], list) and 0 < len(d["prompts"]) <= 64, "prompts: not a list of 1 to 64")
    for i, p in enumerate(d["prompts"]):
        fields(p, f"prompts[{i}]", {"name", "verdict", "token_ids", "reuses"})
        text(p, "name", f"prompts[{i}]", 100)
        text(p, "verdict", f"prompts[{i}]", 100)
        integer(p, "reuses", f"prompts[{i}]", 1, 64)
        ids = p["token_ids"]
        need(isinstance(ids, list) and 0 < len(ids) <= e["max_model_len"], f"prompts[{i}].token_ids: bad length")
        need(all(type(t) is int and 0 <= t <= MAX_ID for t in ids), f"prompts[{i}].token_ids: not token IDs")
    need(len({p["name"] for p in d["prompts"]}) == len(d["prompts"]), "prompts: a name twice")
    c = d["connector"]
    need((c is None) == (d["mode"] == "native"), "connector: given for native, or missing for connector")
    if c is not None:
        fields(c, "connector", {"kv_connector", "kv_role", "kv_connector_extra_config"}, {"kv_connector_module_path"})
        need(isinstance(c["kv_connector"], str) and NAME.fullmatch(c["kv_connector"]), "connector.kv_connector")
        need(c["kv_role"] == "kv_both", "connector.kv_role: not kv_both")
        m = c.get("kv_connector_module_path")
        need(m is None or (isinstance(m, str) and NAME.fullmatch(m)), "connector.kv_connector_module_path: not a name")
        extra = c["kv_connector_extra_config"]
        need(isinstance(extra, dict) and len(extra) <= 32, "connector.kv_connector_extra_config: not an object")
        for k, v in extra.items():
            need(NAME.fullmatch(k), f"connector.kv_connector_extra_config: key {k[:40]!r}")
            ok = v is None or type(v) in (bool, int) or (type(v) is float and math.isfinite(v))
            need(ok or (isinstance(v, str) and len(v) <= 200 and v.isprintable()), f"extra config {k}: a value")
    y = d["lmcache_yaml"]
    need(y is None or c is not None, "lmcache_yaml: given for native")
    if y is not None:
        fields(y, "lmcache_yaml", {"path", "sha256", "text"})
        text(y, "path", "lmcache_yaml")
        need(isinstance(y["text"], str) and len(y["text"]) <= 1 << 16, "lmcache_yaml.text: not a text")
        sha = hashlib.sha256(y["text"].encode("utf-8")).hexdigest()
        need(y["sha256"] == sha, "lmcache_yaml.text: its SHA-256 is not lmcache_yaml.sha256")
    return d


def load(path):
    need(os.path.getsize(path) <= MAX_BYTES, f"over {MAX_BYTES} bytes")
    with open(path, encoding="utf-8") as f:
        return check(json.load(f, parse_constant=lambda c: need(False, f"{c} is not a number")))


def child(mode, model, inputs):
    result = os.fdopen(os.dup(1), "w")  # the pipe to run(), for RESULT alone: vLLM's processes write on stdout
    os.dup2(2, 1)  # stdout goes to the log run() prints if this run fails
    c, yaml = inputs["connector"], inputs["lmcache_yaml"]
    if mode == "connector" and yaml:
        path = os.path.join(tempfile.mkdtemp(), "lmcache.yaml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(yaml["text"])
        os.environ["LMCACHE_CONFIG_FILE"] = path
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    if c and c.get("kv_connector_module_path"):  # one that does not import fails here, before any model loads
        getattr(importlib.import_module(c["kv_connector_module_path"]), c["kv_connector"])
    kw = dict(inputs["engine"], model=model, tokenizer=model, enable_prefix_caching=mode == "native")
    if mode == "connector":
        extra = {k: tempfile.mkdtemp() if v == "@tmpdir" else v for k, v in c["kv_connector_extra_config"].items()}
        kw["kv_transfer_config"] = KVTransferConfig(**dict(c, kv_connector_extra_config=extra))
    llm = LLM(**kw)
    sp = SamplingParams(max_tokens=inputs["max_tokens"], temperature=0.0, ignore_eos=True)
    out = {}
    for p in inputs["prompts"]:
        n = 1 if mode == "off" else 1 + p["reuses"]
        runs = [llm.generate([{"prompt_token_ids": p["token_ids"]}], sp, use_tqdm=False)[0] for _ in range(n)]
        out[p["name"]] = [(list(r.outputs[0].token_ids), r.num_cached_tokens) for r in runs]
    print("RESULT " + json.dumps(out), file=result, flush=True)
    os._exit(0)


def run(mode, model, path):  # its own process (and session: vLLM's engine processes go with it once it answered)
    env = dict(os.environ, VLLM_CPU_NUM_OF_RESERVED_CPU=os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "1"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (HERE, env.get("PYTHONPATH"))))  # vLLM's engine processes
    log = tempfile.TemporaryFile("w+", errors="replace")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, model, path]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    line = result_line(proc)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if line is None:
        log.seek(0)
        print(tail := log.read()[-3000:].rstrip(), file=sys.stderr)
        last = ([x for x in tail.splitlines() if x.strip()] or ["no output"])[-1]
        sys.exit(no_verdict(f"the {mode} run failed (exit {proc.returncode}): {last}"))
    return json.loads(line)


def result_line(proc):  # its RESULT, or None once it is gone without one (an engine it left may hold the pipe open)
    data, fd = b"", proc.stdout.fileno()
    while not (found := re.search(rb"^RESULT (.*)\\n", data, re.M)):
        data = data[data.rfind(b"\\n") + 1 :]  # a line not yet whole
        ready = select.select([fd], [], [], 1)[0]
        chunk = os.read(fd, 1 << 20) if ready else b""
        if (ready and not chunk) or (not ready and proc.poll() is not None):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)  # its own exit status, where it ends by itself
            return None
        data += chunk
    return found.group(1)


def no_verdict(why):  # a run that failed or could not start: 3, never 1, which says a reuse differed
    print("repro_min.py: no verdict: " + " ".join(str(why).split())[:300], file=sys.stderr)
    return 3


def main():
    if not 2 <= len(sys.argv) <= 3:
        print("usage: python repro_min.py MODEL_DIR [INPUTS.json]", file=sys.stderr)
        return 2
    model = sys.argv[1]
    path = os.path.abspath(sys.argv[2] if len(sys.argv) == 3 else os.path.splitext(__file__)[0] + ".json")
    try:
        inputs = load(path)
    except (OSError, ValueError, Refused) as exc:
        print(f"repro_min.py: {path}: refused: " + " ".join(str(exc).split())[:300], file=sys.stderr)
        return 2
    c = inputs["connector"]
    m = c and c.get("kv_connector_module_path")
    for package in ["vllm"] + (["lmcache"] if c and "lmcache" in c["kv_connector"].lower() else []):
        if importlib.util.find_spec(package) is None:
            return no_verdict(f"{package} is not installed for {sys.executable}")
    if m and not os.path.isfile(os.path.join(HERE, m + ".py")):
        return no_verdict(f"{m}.py, the connector that comes with this script, is not beside it in {HERE}")
    probes = ", ".join(f"{p['name']} {p['verdict']}" for p in inputs["prompts"])
    print(f"{inputs['report']}: arm {inputs['arm']} ({inputs['stack']}) against caching off; model {inputs['model']} "
          f"(sha256 {inputs['model_sha256'][:16]}); probes {probes}")
    if m:
        print(f"vLLM imports the connector {c['kv_connector']} from {m}.py beside this script")
    off, on = run("off", model, path), run(inputs["mode"], model, path)
    n = inputs["max_tokens"]  # greedy, ignore_eos: an answer of another length is no answer, never compared
    short = [f"{k} {len(t)} of {n}" for k, rs in (*off.items(), *on.items()) for t, _ in rs if len(t) != n]
    if short:
        return no_verdict("answers not max_tokens long: " + ", ".join(short[:4]))
    code = 0
    for name in (p["name"] for p in inputs["prompts"]):
        base = off[name][0][0]
        for i, (tokens, cached) in enumerate(on[name]):
            diff = next((j for j, (a, b) in enumerate(zip(tokens, base)) if a != b), None)
            hit = cached if type(cached) is int and cached >= 0 else None  # -1: vLLM's "not checked yet", no count
            what = "cold" if i == 0 else f"reuse {i}"
            said = "match" if diff is None else f"DIFFER @{diff} (cache off {base[diff]}, here {tokens[diff]})"
            print(f"{name} {what}: {cached} cached tokens, tokens {said}")
            if diff is not None and i > 0 and hit:
                code = 1
            elif code == 0 and (i == 0 and (diff is not None or hit != 0) or i > 0 and not hit):
                code = 2
    print({0: "PASS", 1: "FAIL: a reuse with a hit differs from caching off", 2: "INCONCLUSIVE"}[code])
    return code


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:  # a run: a failure's traceback goes to the log that run() prints
        child(sys.argv[2], sys.argv[3], load(sys.argv[4]))
    try:
        sys.exit(main())
    except Exception as exc:  # a crash of this script is no verdict either: 3, never 1
        sys.exit(no_verdict(f"{type(exc).__name__}: {exc}"))
'''


def script_check():
    """The script's own check of its inputs (check, Refused), so the kit writes only what the script will run."""
    namespace: dict = {"__name__": "repro_min", "__file__": "repro_min.py"}  # as imported, not run
    # SCRIPT is this module's constant, the bytes every user gets: no report text is ever in it; running its own
    # check here keeps the kit's idea of valid inputs and the script's one and the same
    exec(compile(SCRIPT, "repro_min.py", "exec"), namespace)  # noqa: S102 - see above
    return namespace["check"], namespace["Refused"]


def sidecar_path(script: Path | str) -> Path:
    """Where the script looks for its inputs by default: its own name with `.json`."""
    return Path(script).with_suffix(".json")


@dataclass(frozen=True)
class ReproMin:
    """What `repro issue-md` writes for one arm: the fixed script, its inputs, and the connector module it names."""

    inputs: dict
    script: str = SCRIPT
    connector: str | None = None  # the source of the module the inputs' kv_connector_module_path names, if any

    @property
    def inputs_json(self) -> str:
        return json.dumps(self.inputs, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    def files(self, script: Path) -> list[tuple[Path, str]]:
        """(path, text) of each file for a script written at `script`: its inputs, the connector module beside it
        under the name its inputs give (checked a plain name by the script's check), and the script last."""
        out = [(sidecar_path(script), self.inputs_json)]
        if self.connector is not None:
            module = self.inputs["connector"]["kv_connector_module_path"]
            out.append((script.with_name(f"{module}.py"), self.connector))
        return [*out, (script, self.script)]


def _shown(name: object) -> str:
    """A report's name in a one-line message: as it is where printable and short, else its repr, cut."""
    text = str(name)
    return text if len(text) <= 100 and text.isprintable() else repr(text)[:100]


def _is_finding(probe: Mapping) -> bool:
    return probe.get("verdict") == FAIL or (probe.get("kv") or {}).get("verdict") in KV_FINDINGS


def _finding_arm(report: Mapping) -> Mapping:
    """The first reuse arm with a FAIL or a KV finding, else the first reuse arm."""
    reuse = [a for a in report["arms"] if a.get("mode") != "baseline" and a.get("probes")]
    if not reuse:
        raise UsageError("the report has no reuse arm with probes to reproduce")
    return ([a for a in reuse if any(_is_finding(p) for p in a["probes"])] or reuse)[0]


def _pick_arm(report: Mapping, arm_name: str | None) -> Mapping:
    if not arm_name:
        return _finding_arm(report)
    arm = next((a for a in report["arms"] if a.get("name") == arm_name), None)
    if arm is None or arm.get("mode") == "baseline" or not arm.get("probes"):
        raise UsageError(f"--arm {_shown(arm_name)}: no reuse arm of that name with probes in the report")
    return arm


def _refuse_what_it_cannot_send(report: Mapping, arm: Mapping, probes: list) -> None:
    name = _shown(arm["name"])
    if report.get("adapters"):  # its requests carry no LoRARequest: it would reproduce other answers, not the finding
        raise UsageError(f"arm {name}: its probes run under LoRA adapters, which repro_min.py does not send")
    images = report.get("images") or {}
    with_image = [p["name"] for p in probes if not isinstance(images, Mapping) or p["name"] in images]
    if with_image:  # the kit draws the image from a seed; the report carries no pixels to send
        raise UsageError(
            f"arm {name}: probe {_shown(with_image[0])} sends an image: this reproducer cannot send the image "
            "probe's image; run the kit"
        )
    salted = [p["name"] for p in probes if p.get("cache_salt") is not None]
    if salted:  # its prompts carry no cache_salt: the tenants would be one, and a crossing would not show
        raise UsageError(
            f"arm {name}: probe {_shown(salted[0])} is sent with a cache_salt, which repro_min.py does not send"
        )
    if (report.get("config") or {}).get("speculative_config"):  # it would reproduce a plain decode, not the finding
        raise UsageError(f"arm {name}: its engine decoded speculatively, which repro_min.py does not set; run the kit")
    if arm["name"] == "native-matched" or (arm.get("mode") not in ("native", "native-matched") and
                                           arm["connector"]["name"] == "LMCacheMPConnector"):  # fmt: skip
        raise UsageError(f"arm {name}: needs the kit (a primed prefix, or an LMCache MP server it starts)")


def _connector(arm: Mapping) -> dict:
    """The arm's kv_transfer_config for the inputs; a connector vLLM would import by module path must be the kit's
    planted one, which travels beside the script as SHIPPED_MODULE (any other module is the kit's, or the machine's)."""
    spec = arm["connector"]
    module = spec.get("module_path")
    if module and module not in PLANTED_MODULES:
        raise UsageError(
            f"arm {_shown(arm['name'])}: vLLM imports its connector from the module {_shown(module)}, which "
            "repro_min.py cannot ship (only the kit's planted connector travels with it; vLLM's and LMCache's are "
            "named without a module path): run the kit"
        )
    # a setting the kit pointed at a folder of its run's own ("key old -> new" in the arm's store) gets a fresh one
    made = {str(line).split()[0] for line in (arm.get("store") or {}).get("rewritten") or [] if str(line).split()}
    connector = {
        "kv_connector": spec["name"],
        "kv_role": "kv_both",
        "kv_connector_extra_config": {k: "@tmpdir" if k in made else v for k, v in spec["extra_config"].items()},
    }
    return connector | ({"kv_connector_module_path": SHIPPED_MODULE} if module else {})


def _lmcache_yaml(report: Mapping, arm: Mapping, root: Path) -> dict | None:
    """The arm's LMCache YAML, only as find_lmcache_yaml's rule allows (a relative path inside the kit whose SHA-256
    the report recorded); None where the report recorded none (LMCache ran on its defaults)."""
    given = (report.get("provenance") or {}).get("lmcache_config")
    if given is None:
        return None
    text, why = read_lmcache_yaml(given, root)
    if text is None:
        raise UsageError(f"arm {_shown(arm['name'])}: its LMCache YAML is not inlined: {why}")
    return {"path": PurePath(str(given["path"])).as_posix(), "sha256": given["sha256"], "text": text}


def _inputs(report: Mapping, arm: Mapping, report_name: str, root: Path) -> dict:
    probes = [p for p in arm["probes"] if p.get("submitted_token_ids") and p.get("requests")]
    probes = [p for p in probes if _is_finding(p)] or probes
    if not probes:
        raise UsageError(f"arm {_shown(arm['name'])}: no probe with its submitted token IDs to send")
    _refuse_what_it_cannot_send(report, arm, probes)
    mode = "native" if arm.get("mode") in ("native", "native-matched") else "connector"
    cfg, eff = report.get("config") or {}, arm.get("effective_config") or {}
    connector = _connector(arm) if mode == "connector" else None
    lmcache = connector is not None and "lmcache" in str(connector["kv_connector"]).lower()
    prov = report.get("provenance") or {}
    versions, model = prov.get("engine_versions") or {}, prov.get("model") or {}
    lm_version = str(versions.get("lmcache") or "unavailable")  # "unavailable: not installed" where it was not
    stack = f"vLLM {versions.get('vllm')}" + ("" if lm_version.startswith("unavailable") else f", LMCache {lm_version}")
    return {
        "kind": INPUTS_KIND, "schema_version": INPUTS_VERSION, "tool_version": __version__,
        "report": report_name, "arm": arm["name"], "stack": f"{stack}, {(versions.get('gpus') or ['CPU'])[0]}",
        "model": (model.get("source") or {}).get("name") or PurePath(str(model.get("name") or cfg.get("model"))).name,
        "model_sha256": str(model.get("sha256") or "not recorded"),
        "mode": mode,
        "engine": {
            "dtype": cfg.get("dtype"), "seed": cfg.get("seed"), "block_size": cfg.get("block_size"),
            "max_model_len": cfg.get("max_model_len"), "gpu_memory_utilization": cfg.get("gpu_memory_utilization"),
            "enforce_eager": True, "max_num_seqs": eff.get("max_num_seqs") or 1,
            "max_num_batched_tokens": eff.get("max_num_batched_tokens") or max(cfg.get("max_model_len") or 0, 2048),
        },
        "connector": connector,
        "lmcache_yaml": _lmcache_yaml(report, arm, root) if lmcache else None,
        "max_tokens": cfg.get("max_tokens"),
        "prompts": [
            {"name": p["name"], "verdict": str(p["verdict"]), "token_ids": list(p["submitted_token_ids"]),
             "reuses": len(p["requests"]) - 1}
            for p in probes
        ],
    }  # fmt: skip


def make_repro_min(
    report: Mapping, arm_name: str | None = None, report_name: str = "the report", root: Path = KIT_ROOT
) -> ReproMin:
    """The script, its inputs and the connector they name for arm_name (default: the first arm with a finding);
    UsageError, one line, for an arm it cannot reproduce or a report whose values the script would refuse."""
    try:
        inputs = _inputs(report, _pick_arm(report, arm_name), report_name, root)
        inputs = json.loads(json.dumps(inputs, allow_nan=False))  # as the script will read it back
    except (KeyError, TypeError, AttributeError, ValueError) as exc:  # a report not shaped as the kit writes one
        raise UsageError(
            f"repro_min.py: the report is not shaped as the kit writes one ({type(exc).__name__})"
        ) from None
    check, refused = script_check()
    try:
        check(inputs)
    except refused as exc:
        raise UsageError(f"repro_min.py: the report's values are not what the script runs: {exc}") from None
    if inputs["connector"] is None or "kv_connector_module_path" not in inputs["connector"]:
        return ReproMin(inputs)
    return ReproMin(inputs, connector=planted_connector(inputs["connector"]["kv_connector"]))
