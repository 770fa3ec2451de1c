"""Which of a fixture's scenarios a run has (--scenarios), checked against its probes and engine before any
child starts; how each (scenario, arm) runs is repro.run.scenarios."""

from __future__ import annotations

from repro.errors import UsageError
from repro.plan.fixtures import Fixture, Probe, Scenario
from repro.plan.suite import BOUNDARY_LENGTHS

ALL = "all"


def select(fixture: Fixture, asked: str | None, probes: list[Probe], max_model_len: int) -> list[Scenario]:
    """The scenarios --scenarios asks for (none when it is not given), checked against the run's probes
    and engine; every problem is one line (exit 2)."""
    if not asked:
        return []
    if not fixture.scenarios:
        raise UsageError(f"--scenarios {asked}: fixture {fixture.path} declares no scenarios")
    by_name = {sc.name: sc for sc in fixture.scenarios}
    if asked == ALL:
        chosen = list(fixture.scenarios)
    else:
        names = list(dict.fromkeys(n.strip() for n in asked.split(",") if n.strip()))
        unknown = [n for n in names if n not in by_name] or ([] if names else [asked])
        if unknown:
            raise UsageError(
                f"--scenarios: no scenario {unknown[0]!r} in fixture {fixture.path} (it declares "
                f"{', '.join(by_name)}; or give {ALL})"
            )
        chosen = [by_name[n] for n in names]
    have = {p.name for p in probes}
    boundary = {f"chat-{n}" for n in BOUNDARY_LENGTHS}
    for sc in chosen:
        own = {p.name for p in sc.generated}
        missing = [n for n in sc.probe_names if n not in have and n not in own]
        if missing:
            hint = " (the acceptance suite's probe: add --suite acceptance)" if missing[0] in boundary else ""
            raise UsageError(
                f"fixture {fixture.path}: scenario {sc.name} submits {missing[0]!r}, not a probe of this run{hint}"
            )
        tokens = sc.engine.get("kv_cache_tokens")
        if tokens is not None and tokens < max_model_len:
            raise UsageError(
                f"fixture {fixture.path}: scenario {sc.name}: engine.kv_cache_tokens {tokens} is below --max-model-len "
                f"{max_model_len} (vLLM refuses a KV cache that cannot hold one request of that length)"
            )
    return chosen


def check_load(chosen: list[Scenario], arm_modes: list[str], frontend: str, fits) -> None:
    """A load scenario's needs, before any child starts: its reuse control is native prefix caching (a native arm
    in the run), it drives vLLM's engine step by step (the synchronous front end), and its generated prompts fit
    the model and window (fits: run_plan.check_probes_fit with the run's model bound)."""
    for sc in chosen:
        if sc.load is None:
            continue
        if "native" not in arm_modes:
            raise UsageError(
                f"scenario {sc.name}: a load scenario's reuse control is native prefix caching with a pool that holds "
                "every prompt; add --compare-native"
            )
        if frontend not in ("sync", "server"):
            raise UsageError(
                f"scenario {sc.name}: a load scenario drives vLLM's engine step by step, or a `vllm serve` it cancels "
                f"requests of by closing their connections: --frontend sync or server, not {frontend}"
            )
        fits(list(sc.generated), f"scenario {sc.name}")
