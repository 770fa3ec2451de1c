"""Loading and validating fixtures: the probes, their tokenizer identity and expected verdicts.

Fixture schema (kind "kvkit-fixture"; JSON Schema in schemas/fixture.schema.json). Every object refuses a key it
does not know (repro.plan.fixture_keys), so a misspelt key, or an addition of a newer kit, is one line, never ignored;
"an older kit ignores it" below is said of kits before that.
  schema_version 1: first version.
    Additions without a bump: expected_kv (arm -> {probe: KV verdict}, checked when the run
    audits KV; a kit older than the KV audit ignores it, as it makes no KV verdict). scenarios
    (named sequences of steps over the probes, each with its engine settings; run only when asked,
    --scenarios), expected_scenarios (arm -> {scenario: verdict}) and expected_scenarios_kv (arm ->
    {scenario: KV verdict}); a kit older than scenarios ignores them, as it runs none. Expectation
    sets: in any of the four tables an expectation may be a non-empty list of distinct verdicts
    (["EXACT", "NUMERIC"]: either holds) where a correct stack may legitimately give either, such as
    KV that a prefill of another length or batch shape computed; a list never mixes a finding (FAIL,
    or a KV finding: CORRUPT, FOREIGN, MISPLACED) with a non-finding. A kit older than sets refuses such
    a fixture with a one-line error (it checked each entry was one verdict), so nothing is read differently.
  schema_version 2: adapters, lora and a probe's adapter (LoRA adapters, repro.plan.adapters). A kit older
    than them refuses the file: ignoring them it would run those probes under the base model. Version 1 loads as is.
  schema_version 3, 4: a probe's prompt_logprobs (repro.plan.prompt_logprobs); a prompt's image (plan.images); alike.
  schema_version 5: a probe's cache_salt (repro.plan.salts): a kit older than it refuses the file, as it would send
    those probes unsalted.
    Addition without a bump (any version): an entry bound to an upstream bug (repro.plan.upstream); an older kit
    refuses it in one line (neither a verdict nor a list), so nothing is read differently.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from repro.errors import UsageError
from repro.judge.verdict import KV_VERDICTS, VERDICTS
from repro.plan import fixture_keys as keys
from repro.plan import load, multi, offloading
from repro.plan.adapters import AdapterTable, parse_adapters
from repro.plan.images import parse_images
from repro.plan.load import LoadSpec, parse_load
from repro.plan.prompt_logprobs import parse_prompt_logprobs
from repro.plan.salts import parse_salts
from repro.plan.upstream import BoundExpectation, parse_table

FIXTURE_KIND = "kvkit-fixture"
FIXTURE_SCHEMA_VERSION = 5
_MAX_REUSES = 64
_MAX_TOKEN_ID = 2**31  # the vocabulary check proper needs the model (check_probes_fit)
# The names the kit gives its own arms and files: a fixture or command-line arm of one of these names
# would share that arm's or file's log, result and KV directory (and native-matched would wait on
# itself for ever). Trials and confirmations are `<arm>~trialK` and `<arm>~alone`: `~` is no name
# character. tests/test_fixtures.py checks this list against the modules that make the names.
RESERVED_ARM_NAMES = ("baseline", "native", "native-matched", "gpu-load", "cpu-load", "kv-compare")
RESERVED_ARM_SUFFIXES = (".lmcache-server",)  # an MP server's log is <arm>.lmcache-server.log


@dataclass(frozen=True)
class Probe:
    """One prompt: submitted either as token IDs, or as chat messages plus an exact length."""

    name: str
    token_ids: tuple[int, ...] | None = None
    chat: dict | None = None  # {"messages": [...], "length": N, "filler": str}
    reuses: int | None = None  # None: the run's default
    adapter: str | None = None  # the label of the LoRA adapter it runs under (repro.plan.adapters), None: the base
    lora: dict | None = None  # that adapter's request, as the run resolved it (repro.plan.adapters.resolve)
    prompt_logprobs: int | None = None  # k of SamplingParams(prompt_logprobs=k) (repro.plan.prompt_logprobs)
    image: dict | None = None  # the image its prompt names (repro.plan.images), None: none
    cache_salt: str | None = None  # the tenant salt every request of it is sent with (repro.plan.salts), None: none

    @property
    def length(self) -> int:
        return len(self.token_ids) if self.token_ids is not None else int(self.chat["length"])

    def prompt_spec(self) -> dict:
        spec = {"token_ids": list(self.token_ids)} if self.token_ids is not None else {"chat": self.chat}
        spec |= {"prompt_logprobs": self.prompt_logprobs} if self.prompt_logprobs is not None else {}
        spec |= {"image": dict(self.image)} if self.image is not None else {}
        spec |= {"cache_salt": self.cache_salt} if self.cache_salt is not None else {}
        return spec | ({"adapter": dict(self.lora)} if self.lora is not None else {})


@dataclass(frozen=True)
class ArmSpec:
    """A connector arm a fixture asks for when the command line names none."""

    name: str
    connector: str
    module_path: str | None = None
    extra_config: dict = field(default_factory=dict)
    skip_probes: dict = field(default_factory=dict)  # probe name -> why this arm cannot run it
    lmcache_ops: str | None = None  # this arm's own --lmcache-ops (one connector twice, once per copy path)
    skip_scenarios: dict = field(default_factory=dict)  # scenario name -> why this arm cannot run it
    # the GPU prefix cache on beneath the connector (None: as repro.plan.offloading knows the connector) and how
    # the kit makes the connector serve; shipped_as: the vLLM setting a kv_offloading_size arm stands for
    gpu_prefix_cache: bool | None = None
    gpu_cache_reset: str | None = None
    shipped_as: str | None = None


# --lmcache-ops values (repro.lmcache.ops.MODES; that module imports heavier things, so spelled here too)
LMCACHE_OPS_MODES = ("auto", "compiled", "fallback")


SCENARIO_EXPECTS = ("miss", "reuse")
_name = keys.shown  # a fixture's name as a one-line message shows it
# The longest wait a step may ask for before it is submitted (seconds).
MAX_STEP_WAIT_S = 300


@dataclass(frozen=True)
class ScenarioStep:
    """One step: these probes' requests, one at a time in order, or all in flight together."""

    submit: tuple[str, ...]
    together: bool = False
    expect: str | None = None  # "miss", "reuse", or None: either is correct
    # seconds the engine sits idle before this step is submitted: time for a store's own background work
    # (LMCache's MP server evicts from its L1 in a loop once a second, not when a write finds it full)
    wait_s: float = 0.0
    cancel: dict = field(default_factory=dict)  # a load round's cancellations: probe -> when (repro.plan.load)


@dataclass(frozen=True)
class Scenario:
    """A named sequence of steps over the probes, run in one fresh engine per arm with its settings."""

    name: str
    description: str
    engine: dict  # fixture_keys.SCENARIO_ENGINE_KEYS
    lmcache: dict | None  # LMCache YAML keys overridden for LMCache arms
    mp_server: dict | None  # fixture_keys.SCENARIO_MP_SERVER_KEYS, for LMCacheMPConnector's server
    steps: tuple[ScenarioStep, ...]
    load: LoadSpec | None = None  # a production-load scenario (repro.plan.load): its steps and probes generated
    generated: tuple[Probe, ...] = ()  # the prompts it made itself

    @property
    def probe_names(self) -> tuple[str, ...]:
        """Every probe it submits, in first-submission order."""
        return tuple(dict.fromkeys(n for step in self.steps for n in step.submit))

    @property
    def widest(self) -> int:
        """Requests of its largest together-step (1 when none)."""
        return max([len(s.submit) for s in self.steps if s.together] or [1])


@dataclass(frozen=True)
class Fixture:
    name: str
    path: str
    sha256: str
    tokenizer: dict
    probes: tuple[Probe, ...]
    arms: tuple[ArmSpec, ...]
    expected: dict  # arm name -> {probe name -> verdict, or a list of verdicts (a set)}
    raw: dict
    expected_kv: dict = field(default_factory=dict)  # arm name -> {probe name -> KV verdict}
    scenarios: tuple[Scenario, ...] = ()
    expected_scenarios: dict = field(default_factory=dict)  # arm name -> {scenario name -> verdict}
    expected_scenarios_kv: dict = field(default_factory=dict)  # arm name -> {scenario name -> KV verdict}
    adapters: AdapterTable | None = None  # the LoRA adapters its probes run under (repro.plan.adapters)
    # the expectations bound to a known upstream bug (repro.plan.upstream), in table order
    upstream: tuple[BoundExpectation, ...] = ()


def name_problem(name: str) -> str | None:
    """Why a probe or arm name is refused (it names files and log lines), or None."""
    if not name or len(name) > 64 or not all(c.isalnum() or c in "-_." for c in name):
        return f"{name!r} must be 1-64 letters, digits, '-', '_' or '.'"
    return None


def arm_name_problem(name: str) -> str | None:
    """Why an arm name is refused: a probe name's characters, not hidden, and none of the kit's own."""
    problem = name_problem(name)
    if problem is None and name.startswith("."):
        problem = f"{name!r} must not start with '.'"
    if problem is None and (name in RESERVED_ARM_NAMES or name.endswith(RESERVED_ARM_SUFFIXES)):
        problem = f"{name!r} is reserved (the kit's own: {', '.join(RESERVED_ARM_NAMES)}, *{RESERVED_ARM_SUFFIXES[0]})"
    return problem


def _fail(path: str | Path, msg: str) -> UsageError:
    return UsageError(f"fixture {path}: {msg}")


def _require(obj: dict, key: str, types, where: str, path) -> object:
    if not isinstance(obj, dict) or key not in obj:
        raise _fail(path, f"{where}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, types) or (isinstance(value, bool) and types is int):
        raise _fail(path, f"{where}.{key}: wrong type {type(value).__name__}")
    return value


def _parse_chat(chat: object, where: str, path) -> dict:
    if not isinstance(chat, dict):
        raise _fail(path, f"{where}.chat: must be an object")
    messages = _require(chat, "messages", list, f"{where}.chat", path)
    if not messages:
        raise _fail(path, f"{where}.chat.messages: empty")
    for i, m in enumerate(messages):
        role = _require(m, "role", str, f"{where}.chat.messages[{i}]", path)
        _require(m, "content", str, f"{where}.chat.messages[{i}]", path)
        if role not in ("system", "user", "assistant"):
            raise _fail(path, f"{where}.chat.messages[{i}].role: unknown role {role!r}")
    length = _require(chat, "length", int, f"{where}.chat", path)
    if length < 2:
        raise _fail(path, f"{where}.chat.length: must be at least 2")
    filler = _require(chat, "filler", str, f"{where}.chat", path)
    if not filler.strip():
        raise _fail(path, f"{where}.chat.filler: empty")
    return {
        "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
        "length": length,
        "filler": filler,
    }


def parse_probe(obj: object, where: str, path) -> Probe:
    if not isinstance(obj, dict):
        raise _fail(path, f"{where}: must be an object")
    name = _require(obj, "name", str, where, path)
    if (problem := name_problem(name)) is not None:
        raise _fail(path, f"{where}.name: {problem}")
    prompt = _require(obj, "prompt", dict, where, path)
    reuses = obj.get("reuses")
    if reuses is not None and (
        not isinstance(reuses, int) or isinstance(reuses, bool) or not 1 <= reuses <= _MAX_REUSES
    ):
        raise _fail(path, f"{where}.reuses: must be an integer from 1 to {_MAX_REUSES}")
    if ("token_ids" in prompt) == ("chat" in prompt):
        raise _fail(path, f"{where}.prompt: give exactly one of token_ids or chat")
    if "token_ids" in prompt:
        ids = prompt["token_ids"]
        if not isinstance(ids, list) or len(ids) < 2:
            raise _fail(path, f"{where}.prompt.token_ids: must be a list of at least 2 token IDs")
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < _MAX_TOKEN_ID for t in ids):
            raise _fail(path, f"{where}.prompt.token_ids: every ID must be an integer from 0 to {_MAX_TOKEN_ID - 1}")
        return Probe(name=name, token_ids=tuple(ids), reuses=reuses)
    return Probe(name=name, chat=_parse_chat(prompt["chat"], f"{where}.prompt", path), reuses=reuses)


def _parse_arm(obj: object, where: str, path) -> ArmSpec:
    if not isinstance(obj, dict):
        raise _fail(path, f"{where}: must be an object")
    name = _require(obj, "name", str, where, path)
    if (problem := arm_name_problem(name)) is not None:
        raise _fail(path, f"{where}.name: {problem}")
    try:
        offload = offloading.fixture_arm(obj, where)
    except UsageError as exc:
        raise _fail(path, str(exc)) from None
    connector = offload.name if offload else _require(obj, "connector", str, where, path)
    module_path = obj.get("module_path")
    if module_path is not None and not isinstance(module_path, str):
        raise _fail(path, f"{where}.module_path: wrong type")
    extra = dict(offload.extra_config) if offload else obj.get("extra_config", {})
    skip = obj.get("skip_probes", {})
    if not isinstance(extra, dict) or not isinstance(skip, dict) or not all(isinstance(v, str) for v in skip.values()):
        raise _fail(path, f"{where}: extra_config and skip_probes must be objects (skip reasons are strings)")
    if connector == multi.MULTI and (problem := multi.members_problem(extra)) is not None:
        raise _fail(path, f"{where}.extra_config: {problem}")
    ops = obj.get("lmcache_ops")
    if ops is not None and ops not in LMCACHE_OPS_MODES:
        raise _fail(path, f"{where}.lmcache_ops: must be one of {', '.join(LMCACHE_OPS_MODES)}")
    skip_sc = obj.get("skip_scenarios", {})
    if not isinstance(skip_sc, dict) or not all(isinstance(v, str) for v in skip_sc.values()):
        raise _fail(path, f"{where}.skip_scenarios: must be an object of scenario -> why (a string)")
    beneath = obj.get("gpu_prefix_cache", offload.gpu_prefix_cache if offload else None)
    if beneath is not None and not isinstance(beneath, bool):
        raise _fail(path, f"{where}.gpu_prefix_cache: must be true or false")
    reset = obj.get("gpu_cache_reset")
    if reset is not None and (problem := offloading.reset_problem(reset)) is not None:
        raise _fail(path, f"{where}.gpu_cache_reset: {problem}")
    return ArmSpec(
        name=name,
        connector=connector,
        module_path=module_path,
        extra_config=extra,
        skip_probes=skip,
        lmcache_ops=ops,
        skip_scenarios=skip_sc,
        gpu_prefix_cache=beneath,
        gpu_cache_reset=reset,
        shipped_as=offload.shipped_as if offload else None,
    )


def parse_fixture(data: object, path: str | Path, digest: str) -> Fixture:
    if not isinstance(data, dict):
        raise _fail(path, "top level must be an object")
    kind = data.get("kind")
    if kind != FIXTURE_KIND:
        raise _fail(path, f"kind is {kind!r}, expected {FIXTURE_KIND!r}")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise _fail(path, "schema_version missing or not an integer")
    if version > FIXTURE_SCHEMA_VERSION:
        raise _fail(
            path,
            f"schema_version {version} is newer than this kit understands ({FIXTURE_SCHEMA_VERSION}): upgrade the kit",
        )
    if version < 1:
        raise _fail(path, f"schema_version {version} is older than any this kit wrote and no migration exists")
    if (problem := keys.unknown_key_problem(data)) is not None:  # every level, before any is read (fixture_keys)
        raise _fail(path, problem)
    name = _require(data, "name", str, "fixture", path)
    tokenizer = _require(data, "tokenizer", dict, "fixture", path)
    _require(tokenizer, "name", str, "fixture.tokenizer", path)
    probes_raw = _require(data, "probes", list, "fixture", path)
    probes = tuple(parse_probe(p, f"probes[{i}]", path) for i, p in enumerate(probes_raw))
    probes = parse_salts(data, parse_prompt_logprobs(data, parse_images(data, probes, path), path), path)
    probes, adapters = parse_adapters(data, probes, path)
    arms_raw = data.get("arms", [])
    if not isinstance(arms_raw, list):
        raise _fail(path, "arms: must be a list")
    arms = tuple(_parse_arm(a, f"arms[{i}]", path) for i, a in enumerate(arms_raw))
    expected, bound = _parse_expected(data, "expected", VERDICTS, path)
    expected_kv, bound_kv = _parse_expected(data, "expected_kv", KV_VERDICTS, path)
    scenarios_raw = data.get("scenarios", [])
    if not isinstance(scenarios_raw, list):
        raise _fail(path, "scenarios: must be a list")
    scenarios = tuple(parse_scenario(sc, f"scenarios[{i}]", path) for i, sc in enumerate(scenarios_raw))
    check_unique([sc.name for sc in scenarios], path, "scenario")
    expected_scenarios, bound_sc = _parse_expected(data, "expected_scenarios", VERDICTS, path)
    expected_scenarios_kv, bound_sc_kv = _parse_expected(data, "expected_scenarios_kv", KV_VERDICTS, path)
    names = {sc.name for sc in scenarios}
    for i, arm in enumerate(arms):
        unknown = sorted(set(arm.skip_scenarios) - names)
        if unknown:
            raise _fail(
                path,
                f"arms[{i}].skip_scenarios: no scenario named {_name(unknown[0])}{keys.nearest(unknown[0], names)}",
            )
    for key, table_of in (("expected_scenarios", expected_scenarios), ("expected_scenarios_kv", expected_scenarios_kv)):
        for arm, table in table_of.items():
            unknown = sorted(set(table) - names)
            if unknown:
                raise _fail(
                    path, f"{key}.{_name(arm)}: no scenario named {_name(unknown[0])}{keys.nearest(unknown[0], names)}"
                )
    fixture = Fixture(
        name=name,
        path=str(path),
        sha256=digest,
        tokenizer=tokenizer,
        probes=probes,
        arms=arms,
        expected=expected,
        raw=data,
        expected_kv=expected_kv,
        scenarios=scenarios,
        expected_scenarios=expected_scenarios,
        expected_scenarios_kv=expected_scenarios_kv,
        adapters=adapters,
        upstream=tuple(bound + bound_kv + bound_sc + bound_sc_kv),
    )
    check_unique([p.name for p in probes], path, "probe")
    check_unique([a.name for a in arms], path, "arm")
    return fixture


def _unknown_keys(obj: dict, allowed, where: str, path) -> None:
    unknown = sorted(str(k) for k in obj if k not in allowed)
    if unknown:
        raise _fail(path, f"{where}: {keys.unknown_key(unknown[0], allowed)}")


def _settings(obj: object, types: dict, where: str, path) -> dict:
    """A scenario's settings object: known keys only, each of its type; numbers positive."""
    if not isinstance(obj, dict):
        raise _fail(path, f"{where}: must be an object")
    _unknown_keys(obj, tuple(types), where, path)
    for key, value in obj.items():
        want = types[key]
        is_bool = isinstance(value, bool)
        if not isinstance(value, want) or (is_bool and want is not bool):
            raise _fail(path, f"{where}.{key}: wrong type {type(value).__name__}")
        if not is_bool and isinstance(value, (int, float)) and not value > 0:
            raise _fail(path, f"{where}.{key}: must be positive")
    return dict(obj)


def _parse_step(obj: object, where: str, path) -> ScenarioStep:
    if not isinstance(obj, dict):
        raise _fail(path, f"{where}: must be an object")
    _unknown_keys(obj, keys.STEP_KEYS, where, path)
    submit = _require(obj, "submit", list, where, path)
    if not submit:
        raise _fail(path, f"{where}.submit: empty (name the probes to submit)")
    for j, name in enumerate(submit):
        if not isinstance(name, str) or (problem := name_problem(name)) is not None:
            raise _fail(path, f"{where}.submit[{j}]: {problem if isinstance(name, str) else 'must be a probe name'}")
    together = obj.get("together", False)
    if not isinstance(together, bool):
        raise _fail(path, f"{where}.together: must be true or false")
    if together and len(set(submit)) < len(submit):
        raise _fail(path, f"{where}.submit: a together step names each probe once (requests are told apart by prompt)")
    expect = obj.get("expect")
    if expect is not None and expect not in SCENARIO_EXPECTS:
        raise _fail(path, f"{where}.expect: {expect!r} is not one of {', '.join(SCENARIO_EXPECTS)} (or absent)")
    wait_s = obj.get("wait_s", 0)
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not 0 <= wait_s <= MAX_STEP_WAIT_S:
        raise _fail(path, f"{where}.wait_s: must be a number of seconds from 0 to {MAX_STEP_WAIT_S}, not {wait_s!r}")
    return ScenarioStep(tuple(submit), together, expect, float(wait_s))


def parse_scenario(obj: object, where: str, path) -> Scenario:
    """One scenario; every problem is a one-line UsageError. Whether its probes exist is the run's
    check (repro.plan.scenarios.select: the acceptance suite adds probes)."""
    if not isinstance(obj, dict):
        raise _fail(path, f"{where}: must be an object")
    _unknown_keys(obj, keys.SCENARIO_KEYS, where, path)
    name = _require(obj, "name", str, where, path)
    if (problem := name_problem(name)) is not None:
        raise _fail(path, f"{where}.name: {problem}")
    where = f"scenario {name}"
    description = obj.get("description", "")
    if not isinstance(description, str):
        raise _fail(path, f"{where}.description: must be a string")
    engine = _settings(obj.get("engine", {}), keys.SCENARIO_ENGINE_KEYS, f"{where}.engine", path)
    lmcache = obj.get("lmcache")
    if lmcache is not None and (
        not isinstance(lmcache, dict) or not all(isinstance(v, (str, int, float, bool)) for v in lmcache.values())
    ):
        raise _fail(path, f"{where}.lmcache: must be an object of LMCache YAML keys with scalar values")
    mp = obj.get("mp_server")
    mp = None if mp is None else _settings(mp, keys.SCENARIO_MP_SERVER_KEYS, f"{where}.mp_server", path)
    if "load" in obj:
        return _load_scenario(obj, name, description, engine, lmcache, mp, where, path)
    steps_raw = _require(obj, "steps", list, where, path)
    if not steps_raw:
        raise _fail(path, f"{where}.steps: empty")
    steps = tuple(_parse_step(st, f"{where}.steps[{i}]", path) for i, st in enumerate(steps_raw))
    scenario = Scenario(name, description, engine, lmcache, mp, steps)
    seqs = engine.get("max_num_seqs")
    if seqs is not None and seqs < scenario.widest:
        raise _fail(
            path, f"{where}.engine.max_num_seqs: {seqs} is fewer than its largest together step ({scenario.widest})"
        )
    return scenario


def _load_scenario(obj: dict, name: str, description: str, engine: dict, lmcache, mp, where: str, path) -> Scenario:
    """A production-load scenario: its prompts and rounds generated from its `load` object (repro.plan.load)."""
    if "steps" in obj:
        raise _fail(path, f"{where}: a load scenario generates its steps; give load or steps, not both")
    try:
        spec = parse_load(obj["load"], f"{where}.load")
    except UsageError as exc:
        raise _fail(path, str(exc)) from None
    made = load.prompts(spec)
    probes = tuple(Probe(n, ids) for n, ids in made)
    steps = tuple(
        ScenarioStep(order, True, None, 0.0, cancel) for order, cancel in load.rounds(spec, [n for n, _ in made])
    )
    scenario = Scenario(name, description, engine, lmcache, mp, steps, spec, probes)
    seqs = engine.get("max_num_seqs")
    if seqs is not None and seqs < 2:
        raise _fail(path, f"{where}.engine.max_num_seqs: a load scenario runs requests in flight (at least 2)")
    return scenario


def _parse_expected(data: dict, key: str, verdicts: tuple[str, ...], path) -> tuple[dict, list[BoundExpectation]]:
    """An expectation table, arm -> {probe: expectation} and the entries bound to an upstream bug beside it
    (repro.plan.upstream.parse_table); every problem one line."""
    try:
        return parse_table(data.get(key, {}), key, verdicts, _name)
    except (ValueError, TypeError) as exc:
        raise _fail(path, str(exc)) from None


def check_unique(names: list[str], path, what: str) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise _fail(path, f"duplicate {what} name {n!r}")
        seen.add(n)


def load_fixture(path: str | Path) -> Fixture:
    """Read and validate a fixture file; every problem is a one-line UsageError."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"fixture {path}: cannot read ({exc.strerror or exc})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _fail(path, f"not valid JSON ({str(exc).splitlines()[0][:200]})") from None
    return parse_fixture(data, path, hashlib.sha256(raw).hexdigest())
