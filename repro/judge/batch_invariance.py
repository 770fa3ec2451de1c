"""--batch-invariant: whether vLLM's batch-invariant kernels ran in every worker of an arm, and the
arm's verdict when they were asked for and not confirmed. Pure functions over what the workers recorded.
"""

from __future__ import annotations

from dataclasses import dataclass

from repro.judge.verdict import ERROR, ArmVerdict

# --batch-invariant: vLLM's batch-invariant kernels, asked for and confirmed by every worker.
BATCH_INVARIANT_INACTIVE = "batch-invariant-inactive"
# vLLM 0.26-0.28 install batch-invariant matmuls on CUDA (SM8x through Triton overrides, SM90 and
# later through cuBLAS settings) and XPU; its documentation names compute capability 8.0 as the floor.
BATCH_INVARIANT_MIN_CAPABILITY = (8, 0)
BATCH_INVARIANT_PLATFORMS = ("cuda", "xpu")


@dataclass(frozen=True)
class BatchInvariance:
    """Whether vLLM's batch-invariant kernels were active in every worker of an arm (None: no worker
    said, never assumed either way), and why not."""

    active: bool | None
    reasons: tuple[str, ...] = ()


def parse_capability(text: object) -> tuple[int, int] | None:
    """'8.9' -> (8, 9); anything else None."""
    if not isinstance(text, str):
        return None
    major, _, minor = text.partition(".")
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None


def batch_invariant_device_problem(platform: str, capability: tuple[int, int] | None) -> str | None:
    """Why vLLM's batch-invariant kernels cannot run on this device (one phrase), or None when they can."""
    if platform not in BATCH_INVARIANT_PLATFORMS:
        return f"vLLM has batch-invariant kernels for CUDA and XPU only, and this runs on {platform}"
    if platform == "cuda" and capability is None:
        return "the GPU's compute capability could not be read"
    if platform == "cuda" and capability < BATCH_INVARIANT_MIN_CAPABILITY:
        floor = ".".join(map(str, BATCH_INVARIANT_MIN_CAPABILITY))
        return f"compute capability {capability[0]}.{capability[1]} is below {floor}, vLLM's floor for them"
    return None


def _worker_problems(worker: dict) -> tuple[list[str], list[str]]:
    """(why the kernels were not active, what was not recorded) for one worker's facts."""
    inactive, unknown = [], []
    bi = worker.get("batch_invariant") if isinstance(worker.get("batch_invariant"), dict) else {}
    if bi.get("mode") is False:
        env = "set" if bi.get("env") else "not set"
        inactive.append(f"vLLM's batch-invariant mode is off (VLLM_BATCH_INVARIANT {env} in the worker)")
    elif bi.get("mode") is not True:
        unknown.append("vLLM's batch-invariant mode was not recorded")
    platform, capability = worker.get("platform"), parse_capability(worker.get("compute_capability"))
    if not isinstance(platform, str):
        unknown.append("the platform was not recorded")
    elif platform == "cuda" and capability is None:
        unknown.append("the GPU's compute capability was not recorded")
    elif device := batch_invariant_device_problem(platform, capability):
        inactive.append(device)
    backends = worker.get("attention_backends")
    if not isinstance(backends, list) or not backends:
        unknown.append("the attention backend was not recorded")
    else:
        for b in backends:
            if isinstance(b, dict) and b.get("supports_batch_invariance") is False:
                inactive.append(f"attention backend {b.get('name')} does not support batch invariance")
            elif not isinstance(b, dict) or b.get("supports_batch_invariance") is not True:
                unknown.append(f"whether attention backend {(b or {}).get('name')} supports batch invariance")
    return inactive, unknown


def batch_invariance_state(workers: list[dict] | None) -> BatchInvariance:
    """From the facts an arm's workers recorded (repro.engine.worker_facts): active when every
    worker has vLLM's batch-invariant mode on (it installed its kernel overrides), runs on a device
    vLLM has those kernels for, and only attention backends that vLLM says support batch invariance.
    A worker that says otherwise makes it inactive; a fact nobody recorded makes it unknown (None)."""
    if not workers:
        return BatchInvariance(None, ("no worker recorded its facts (they come with the KV audit's records)",))
    inactive, unknown = [], []
    for w in workers:
        if not isinstance(w, dict):
            unknown.append("a worker's facts are not an object")
            continue
        off, missing = _worker_problems(w)
        who = f"worker pid {w.get('pid', '?')}"
        inactive += [f"{who}: {p}" for p in off]
        unknown += [f"{who}: {p}" for p in missing]
    if inactive:
        return BatchInvariance(False, tuple(inactive + unknown))
    if unknown:
        return BatchInvariance(None, tuple(unknown))
    return BatchInvariance(True, ())


def decide_batch_invariance(current: ArmVerdict, requested: bool, state: BatchInvariance) -> ArmVerdict:
    """--batch-invariant asked for vLLM's batch-invariant kernels: an arm whose workers do not confirm
    them active ran something else than asked, so its verdict is ERROR, never PASS or FAIL. An arm
    that is already an ERROR keeps its own error."""
    if not requested or state.active is True or current.verdict == ERROR:
        return current
    said = "not active" if state.active is False else "not confirmed active"
    detail = f"batch-invariant kernels requested (--batch-invariant) but {said}: " + "; ".join(state.reasons)
    return ArmVerdict(
        ERROR, (f"{BATCH_INVARIANT_INACTIVE}: {detail}", *current.reasons), BATCH_INVARIANT_INACTIVE, detail
    )
