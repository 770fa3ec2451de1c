"""vLLM's MultiConnector as an arm: its member connectors, checked, planned and made fresh one by one.

MultiConnector (vllm/distributed/kv_transfer/kv_connector/v1/multi_connector.py, vLLM 0.26 and 0.28) takes
kv_connector_extra_config {"connectors": [{"kv_connector", "kv_role", "kv_connector_extra_config",
"kv_connector_module_path"?}, ...]}: it saves to every member and, for each request, loads from the first member
in that order that reports hits. The kit keeps that form (what a user deploys is what the fixture says), gives a
member with no kv_role the arm's kv_both, and a member store it knows a fresh directory per run, as for an arm
(repro.plan.arms). Which member served each reuse is the KV audit's record (repro.engine.kvaudit_hooks); the
member verdicts are repro.judge.members.
"""

from __future__ import annotations

from repro.contract.job import MULTI_CONNECTOR, ConnectorSpec
from repro.plan import offloading

MULTI = MULTI_CONNECTOR
MEMBERS_KEY = "connectors"
MEMBER_KEYS = ("kv_connector", "kv_role", "kv_connector_extra_config", "kv_connector_module_path", "engine_id")
DEFAULT_ROLE = "kv_both"
# A member store the kit must name when the fixture does not: left to vLLM, ExampleConnector writes to its default
# /tmp/kv_cache and the planted connector needs one; @tmpdir gives each run its own (repro.plan.arms).
_STORE_DEFAULTS = {"ExampleConnector": "shared_storage_path"}
_PLANTED_MODULE = "repro.engine.connectors.planted_fault"


def is_multi(conn: ConnectorSpec | None) -> bool:
    return conn is not None and conn.name == MULTI


def members_problem(extra: object) -> str | None:
    """Why a MultiConnector's kv_connector_extra_config cannot run in the kit (one line), or None."""
    if not isinstance(extra, dict) or MEMBERS_KEY not in extra:
        return f"MultiConnector needs extra_config {{{MEMBERS_KEY!r}: [member, ...]}}"
    members = extra[MEMBERS_KEY]
    if not isinstance(members, list) or not members:
        return f"MultiConnector's {MEMBERS_KEY} must be a non-empty list of member connectors"
    for i, m in enumerate(members):
        where = f"{MEMBERS_KEY}[{i}]"
        if not isinstance(m, dict):
            return f"MultiConnector's {where} must be an object (kv_connector, kv_role, kv_connector_extra_config)"
        unknown = sorted(set(m) - set(MEMBER_KEYS))
        if unknown:
            return f"MultiConnector's {where}: unknown key {unknown[0]!r} (known: {', '.join(MEMBER_KEYS)})"
        name = m.get("kv_connector")
        if not isinstance(name, str) or not name:
            return f"MultiConnector's {where}.kv_connector must name a connector"
        if not isinstance(m.get("kv_connector_extra_config", {}), dict):
            return f"MultiConnector's {where}.kv_connector_extra_config must be an object"
        module = m.get("kv_connector_module_path")
        if module is not None and not isinstance(module, str):
            return f"MultiConnector's {where}.kv_connector_module_path must be a string"
        if name == MULTI:
            return f"MultiConnector's {where} is itself a MultiConnector: the kit runs one level of members"
        if "lmcache" in name.lower():
            return (
                f"MultiConnector's {where} is {name}: the kit makes LMCache's store fresh, derives its YAML, starts "
                "its MP server and reads its degraded mode per arm, not per member; run it as an arm of its own"
            )
    return None


def member_specs(conn: ConnectorSpec) -> list[ConnectorSpec]:
    """Each member as a connector of its own (name, module path, extra config), in MultiConnector's order."""
    return [
        ConnectorSpec(
            m["kv_connector"], m.get("kv_connector_module_path"), dict(m.get("kv_connector_extra_config", {}))
        )
        for m in conn.extra_config.get(MEMBERS_KEY, [])
    ]


def planned_members(extra: dict, tmpdir_token: str) -> dict:
    """The arm's extra config with each member given the arm's role where it names none and a store setting the
    kit fills (ExampleConnector's shared_storage_path, the planted connector's store_dir) set to @tmpdir where
    the fixture leaves it out."""
    out = []
    for m in extra[MEMBERS_KEY]:
        m = dict(m)
        m.setdefault("kv_role", DEFAULT_ROLE)
        own = dict(m.get("kv_connector_extra_config", {}))
        key = "store_dir" if m.get("kv_connector_module_path") == _PLANTED_MODULE else _STORE_DEFAULTS.get(
            m["kv_connector"])  # fmt: skip
        if key is not None:
            own.setdefault(key, tmpdir_token)
        m["kv_connector_extra_config"] = own
        out.append(m)
    return {**extra, MEMBERS_KEY: out}


def with_member_configs(conn: ConnectorSpec, configs: list[dict]) -> list[dict]:
    """The members with each kv_connector_extra_config replaced (as one run gets them)."""
    return [{**m, "kv_connector_extra_config": c} for m, c in zip(conn.extra_config[MEMBERS_KEY], configs)]


def beneath_gpu_cache(conn: ConnectorSpec) -> bool:
    """A MultiConnector sits beneath the GPU prefix cache when a member does (vLLM ships it with the cache on)."""
    return any(offloading.beneath_gpu_cache(m.name) for m in member_specs(conn))


def member_labels(conn: ConnectorSpec) -> list[str]:
    """How the report names each member: its index and connector class."""
    return [f"member {i} {m.name}" for i, m in enumerate(member_specs(conn))]
