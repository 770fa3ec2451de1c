"""The names a fixture's expectations give, checked against what a run can plan, before any engine starts.

An expectation names an arm and a probe (expected, expected_kv) or a scenario (expected_scenarios,
expected_scenarios_kv); an arm's skip_probes names probes. A name that no run of the fixture could ever have is a
typo, and is refused in one line (exit 2) with the nearest names: left alone, "fixtur" for "fixture" would be a
probe that no expectation states, and the run would end by blaming the stack for a finding the fixture meant.

The rule, read once the run's arms are planned (repro.plan.run_plan):
  an arm name must be one of the fixture's arms, the kit's own native and native-matched (--compare-native), an arm
  of this run (--kv-connector NAME's arm is named NAME; --kv-offloading-size's after vLLM's connector; repro
  endpoint's), or a connector vLLM registers or the kit plants (KNOWN_CONNECTORS: the arm --kv-connector makes of
  it in another run of the same fixture, as fixtures/efim-018-l4.json states LMCacheConnectorV1's verdicts and
  declares no arm);
  a probe name must be one of the fixture's probes or of a probe suite (--suite acceptance adds the chunk-boundary
  probes), whichever suite this run asked for: the tables are read under the acceptance suite only, and a fixture
  states them for that run;
  a skip_probes name may also be a probe a scenario submits or generates;
  a scenario name must be one of the fixture's scenarios (repro.plan.fixtures checks it as the file is read).
An expectation for an arm this run does not include but another run may (a fixture arm while --kv-connector
replaces them, native without --compare-native) is no typo: it stays, and the acceptance check says it was not run.
"""

from __future__ import annotations

from collections.abc import Iterable

from repro.errors import UsageError
from repro.plan.arms import NATIVE_MATCHED
from repro.plan.fixture_keys import did_you_mean, shown
from repro.plan.fixtures import Fixture
from repro.plan.suite import build_probes

KIT_ARMS = ("native", NATIVE_MATCHED)
# The connectors vLLM's KVConnectorFactory registers by name (vllm/distributed/kv_transfer/kv_connector/factory.py,
# vLLM 0.26 to 0.32; tests/test_fixture_strict.py checks the installed vLLMs' lists are here), the earlier name of
# ExampleConnector, and the kit's planted connectors (repro.engine.connectors, with --kv-connector-module-path).
KNOWN_CONNECTORS = (
    "ExampleConnector", "ExampleHiddenStatesConnector", "SharedStorageConnector", "LMCacheConnectorV1",
    "LMCacheConnectorV1Dynamic", "LMCacheMPConnector", "NixlConnector", "NixlPullConnector", "NixlPushConnector",
    "MultiConnector", "HiSparseConnector", "MoRIIOConnector", "OffloadingConnector", "DecodeBenchConnector",
    "MooncakeConnector", "MooncakeStoreConnector", "FlexKVConnectorV1", "SimpleCPUOffloadConnector",
    "HF3FSKVConnector", "P2pNcclConnector", "PlantedFaultConnector", "PlantedKeyConnector",
)  # fmt: skip
_PROBE_TABLES = ("expected", "expected_kv")
_SCENARIO_TABLES = ("expected_scenarios", "expected_scenarios_kv")


def _listed(names: Iterable[str]) -> str:
    return ", ".join(names) or "none"


def check_expectation_names(fixture: Fixture, run_arms: Iterable[str]) -> None:
    """Refuse (UsageError, one line) an arm or probe name in the fixture's expectations, or a probe name in an arm's
    skip_probes, that no run of the fixture could have (the module's rule); run_arms: this run's planned arms."""
    run_arms = tuple(run_arms)
    declared = tuple(a.name for a in fixture.arms)
    extra = [a for a in run_arms if a not in (*declared, *KIT_ARMS, "baseline")]  # --kv-connector's, endpoint's
    own = f"; this run's {', '.join(extra)}" if extra else ""
    arms = {*declared, *KIT_ARMS, *run_arms, *KNOWN_CONNECTORS}
    fixture_probes = tuple(p.name for p in fixture.probes)
    suite_probes = tuple(p.name for p in build_probes(fixture.probes, "acceptance"))[len(fixture_probes) :]
    probes = (*fixture_probes, *suite_probes)
    for key in _PROBE_TABLES + _SCENARIO_TABLES:
        for arm, table in getattr(fixture, key).items():
            if arm not in arms:
                _refuse(
                    fixture, f"{key}.{shown(arm)}: no arm named {arm!r} ({did_you_mean(arm, arms)}arms: the fixture's "
                    f"{_listed(declared)}; the kit's {', '.join(KIT_ARMS)}{own}; or a connector vLLM registers, as "
                    "--kv-connector names its arm)",
                )  # fmt: skip
            for probe in table if key in _PROBE_TABLES else ():
                if probe not in probes:
                    _refuse(fixture, f"{key}.{shown(arm)}.{shown(probe)}: {_no_probe(probe, probes, suite_probes)}")
    submitted = {n for sc in fixture.scenarios for n in (*sc.probe_names, *(p.name for p in sc.generated))}
    for i, arm in enumerate(fixture.arms):
        for probe in arm.skip_probes:
            if probe not in probes and probe not in submitted:
                _refuse(fixture, f"arms[{i}].skip_probes: {_no_probe(probe, probes, suite_probes, submitted)}")


def _no_probe(name: str, probes: tuple[str, ...], suite_probes: tuple[str, ...], submitted=()) -> str:
    """The refusal of a probe name; submitted: the scenarios' probes, offered as the nearest but not listed (a load
    scenario generates hundreds)."""
    fixture = [p for p in probes if p not in suite_probes]
    also = "; or one a scenario submits" if submitted else ""
    return (
        f"no probe named {name!r} ({did_you_mean(name, {*probes, *submitted})}probes: the fixture's "
        f"{_listed(fixture)}; the acceptance suite's {_listed(suite_probes)}{also})"
    )


def _refuse(fixture: Fixture, message: str) -> None:
    raise UsageError(f"fixture {fixture.path}: {message}")
