"""Each reuse arm's runs read together (repro.judge.trials classes them): which findings made while sharing
a device need re-running alone, what the run alone says of them, and what each arm's entry gains at the end:
its device, who shared it, its trials and its confirmation.

`ran` is the run's record of the arms' runs (repro.run.arm_runs.ArmRuns: `slots`, and `of(i, alone)`, the
judged trials or run alone of arm i); `sharing(name)` is the run's clock's (repro.run.clock.Clock.sharing)."""

from __future__ import annotations

from collections.abc import Callable

from repro.judge import trials
from repro.judge.trials import STORE_PERSISTED
from repro.plan.arms import ArmSlot, persisting_store
from repro.plan.devices import visible_gpus
from repro.run.sharing import who_shared

Sharing = Callable[[str], "dict | None"]


def summaries(entries: list[dict], ran, sharing: Sharing) -> dict[int, list[tuple[str, dict]]]:
    """Per reuse arm (by index), its runs as (run name, repro.judge.trials summary): its own run first."""
    out = {}
    for i, e in enumerate(entries):
        if e["mode"] == "baseline":
            continue
        named = [(e["name"], e, 1)] + [(r.arm.name, r.entry, r.trial) for r in ran.of(i)]
        out[i] = [(n, trials.run_summary(en, k, (sharing(n) or {}).get("shared"))) for n, en, k in named]
    return out


def to_confirm(entries: list[dict], ran, sharing: Sharing, confirm: bool) -> list[tuple[int, object]]:
    """The arms to re-run alone: a FAIL or a KV finding found while sharing (--no-confirm: none), each with the
    trial that found it (None: the arm's own run)."""
    if not confirm:
        return []
    todo = []
    for i, named in summaries(entries, ran, sharing).items():
        found = trials.needs_confirmation([run for _, run in named])
        if found is not None:
            todo.append((i, next((r for r in ran.of(i) if r.trial == found["trial"]), None)))
    return todo


def fold_runs(entries: list[dict], ran, sharing: Sharing, n_trials: int, confirm: bool) -> None:
    """Each arm's entry gains its device, who shared it, its trials and its confirmation."""
    named_runs = summaries(entries, ran, sharing)
    first_gpu = (visible_gpus() or ["0"])[0]  # asked once: without CUDA_VISIBLE_DEVICES it runs nvidia-smi
    for i, e in enumerate(entries):
        e["gpu"] = gpu_of(e, ran.slots[i], first_gpu)
        e["sharing"] = sharing(e["name"])
        if i not in named_runs:
            continue
        named = named_runs[i]
        if n_trials > 1:
            e["trials"] = trials.trial_rates([run for _, run in named])
        e["confirmation"] = confirmation_of(named, ran.of(i, alone=True), sharing, confirm)


def _no_run(status: str, why: str) -> dict:
    return {"status": status, "why": why, "run": None, "class": None, "reason": None}


def confirmation_of(named: list[tuple[str, dict]], alone: list, sharing: Sharing, confirm: bool) -> dict:
    """The report's `confirmation` of one reuse arm (repro.judge.trials classes the finding); alone: its run
    alone, judged (repro.run.arm_runs.Run), if it ran."""
    runs = [run for _, run in named]
    found = trials.needs_confirmation(runs)
    if found is None:
        if any(trials.has_finding(r) for r in runs):
            return _no_run("not needed", "the finding came from a run that shared nothing: it needs no confirming")
        return _no_run("not needed", "no finding")
    name = next(n for n, run in named if run is found)
    label = "its run" if found["trial"] == 1 else f"trial {found['trial']}"
    why = f"{label} found it while it {who_shared(sharing(name))}"
    if not confirm:
        return _no_run("skipped", f"--no-confirm: {why}; not re-run alone")
    if not alone:
        return _no_run("skipped", f"{why}; the run alone never ran")
    r = alone[0]
    shared_alone = sharing(r.arm.name)
    run = trials.run_summary(r.entry, None, (shared_alone or {}).get("shared"))
    cls, reason = trials.classify_confirmation([x for x in runs if x.get("shared")], run)
    # Independent only when the run alone started with empty connector state: every run of an arm is made
    # fresh the same way (repro.plan.arms), so a store that persists did for the shared run too, and the run alone
    # could read what it stored.
    persists = persisting_store(r.arm)
    if persists is not None:
        reason = f"{reason}; {STORE_PERSISTED} ({persists})"
    out = {"status": "ran", "why": why, "run": run, "class": cls, "reason": reason, "sharing": shared_alone}
    return out | {"independent": persists is None} | ({"store": r.arm.store} if r.arm.store is not None else {})


def gpu_of(entry: dict, slot: ArmSlot | None, first_gpu: str) -> dict | None:
    """The GPU an arm ran on: CUDA_VISIBLE_DEVICES of its slot (else the first visible) and what its
    child's torch said of it (name, compute capability); None on the CPU."""
    versions = entry.get("versions") or {}
    names, caps = versions.get("gpus") or [], versions.get("gpu_capabilities") or []
    if not names:
        return None
    visible = (slot.env if slot else {}).get("CUDA_VISIBLE_DEVICES") or first_gpu
    return {"visible": visible, "name": names[0], "compute_capability": caps[0] if caps else None}
