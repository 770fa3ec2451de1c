"""What goes wrong between parent and child: the failure kinds, each distinct in the report; the
ContractError a job or result that does not follow the contract raises (the strict field readers
below raise it, one line, never a KeyError); and the Failure an arm carries when the parent has no
usable result from its child.
"""

from __future__ import annotations

from dataclasses import dataclass

# Failure kinds, each distinct in the report.
TIMEOUT = "timeout"
CRASH = "crash"
OOM = "out-of-memory"
NONZERO_EXIT = "nonzero-exit"
MISSING_OUTPUT = "missing-output"
UNPARSABLE_OUTPUT = "unparsable-output"
RESULT_VERSION = "result-version-mismatch"
RAISED = "raised"
# The parent stopped the child, or never started it, to keep the disk from filling (repro.run.diskwatch):
# its own files grew past the per-child cap, or the free space where it writes fell under the floor.
DISK_RUNAWAY = "disk-runaway"
DISK_LOW = "disk-low"
# LMCache's MP server (repro.lmcache.mp), started by the kit for an LMCacheMPConnector arm
LMCACHE_SERVER_START = "lmcache-server-start"
LMCACHE_SERVER_DIED = "lmcache-server-died"
FAILURE_KINDS = (
    TIMEOUT,
    CRASH,
    OOM,
    NONZERO_EXIT,
    MISSING_OUTPUT,
    UNPARSABLE_OUTPUT,
    RESULT_VERSION,
    RAISED,
    DISK_RUNAWAY,
    DISK_LOW,
    LMCACHE_SERVER_START,
    LMCACHE_SERVER_DIED,
)


class ContractError(ValueError):
    """A job or result that does not follow the contract (one line; `kind` is the failure kind)."""

    def __init__(self, message: str, kind: str = UNPARSABLE_OUTPUT):
        super().__init__(message)
        self.kind = kind


def read_field(obj: object, key: str, types: type | tuple[type, ...], where: str, optional: bool = False):
    """obj[key] as one of types (a bool is no int); None where absent or null and optional, else a ContractError."""
    if not isinstance(obj, dict):
        raise ContractError(f"{where}: not an object")
    if key not in obj or obj[key] is None:
        if optional:
            return None
        raise ContractError(f"{where}.{key}: missing")
    value = obj[key]
    bad_bool = isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,))
    if not isinstance(value, types) or bad_bool:
        raise ContractError(f"{where}.{key}: wrong type {type(value).__name__}")
    return value


def read_ints(values: object, where: str) -> tuple[int, ...]:
    """A list of integers (no bools) as a tuple, else a ContractError."""
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ContractError(f"{where}: must be a list of integers")
    return tuple(values)


@dataclass(frozen=True)
class Failure:
    """Why the parent has no usable result from a child: a FAILURE_KINDS kind, a detail and the log tail."""

    kind: str
    detail: str
    log_tail: str = ""

    def to_json(self) -> dict:
        return {"kind": self.kind, "detail": self.detail, "log_tail": self.log_tail}
