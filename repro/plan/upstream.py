"""A fixture's upstream bounds: an expectation entry that names the known upstream bug its finding rests on, read
strictly (every problem one line, exit 2). What a bound means and how it is judged is repro.judge.upstream.

In any of the four expectation tables (expected, expected_kv, expected_scenarios, expected_scenarios_kv) an entry may
be, in place of a verdict or a set, an object of exactly these two keys:
    {"verdict": "FAIL", "upstream": {"issue": "vllm-project/vllm#30931", "package": "vllm", "versions": "<0.31"}}
verdict: the expectation as a plain entry states it (one verdict or a set), a finding only (a bound on a PASS is
refused); upstream: the issue as owner/repo#number, the engine package whose version decides (vllm, lmcache, torch,
transformers: what the engine child records), and the versions the bug holds for.
"""

from __future__ import annotations

from dataclasses import dataclass

from repro.judge.expectations import expectation_problem
from repro.judge.upstream import UpstreamBound, bound_problem, issue_problem, package_problem, parse_range

ENTRY_KEYS = ("verdict", "upstream")
BOUND_KEYS = ("issue", "package", "versions")
TABLES = ("expected", "expected_kv", "expected_scenarios", "expected_scenarios_kv")
ENTRY_NOTE = "a bound expectation is {verdict, upstream}; or give a verdict or a set"


@dataclass(frozen=True)
class BoundExpectation:
    """One bound entry: which table, arm and probe (or scenario), the expectation it binds, and the bound."""

    table: str  # one of TABLES
    arm: str
    item: str  # the probe (expected, expected_kv) or the scenario (expected_scenarios, expected_scenarios_kv)
    verdict: str | list  # the expectation, as the fixture wrote it
    bound: UpstreamBound

    @property
    def check(self) -> str:
        """'tokens' or 'kv', as the acceptance's checked items name it."""
        return "kv" if self.table.endswith("_kv") else "tokens"

    @property
    def on_scenario(self) -> bool:
        return self.table.startswith("expected_scenarios")


def parse_entry(want: object, verdicts: tuple[str, ...]) -> tuple[object, UpstreamBound | None]:
    """An expectation table's entry: (the expectation, its bound or None). A plain verdict or set comes back as it
    is (None: no bound); ValueError (TypeError) with a one-line reason, relative to the entry, for a bad one."""
    if not isinstance(want, dict):
        problem = expectation_problem(want, verdicts)
        if problem:
            raise ValueError(problem)
        return want, None
    unknown = sorted(str(k) for k in want if k not in ENTRY_KEYS)
    missing = [k for k in ENTRY_KEYS if k not in want]
    if unknown or missing:
        said = f"unknown field {unknown[0]!r}" if unknown else f"missing field {missing[0]!r}"
        raise ValueError(f"{said} ({ENTRY_NOTE})")
    verdict = want["verdict"]
    problem = expectation_problem(verdict, verdicts) or bound_problem(verdict)
    if problem:
        raise ValueError(f"verdict: {problem}")
    return verdict, _parse_bound(want["upstream"])


def _parse_bound(obj: object) -> UpstreamBound:
    if not isinstance(obj, dict):
        raise TypeError(f"upstream: must be an object of {', '.join(BOUND_KEYS)}")
    unknown = sorted(str(k) for k in obj if k not in BOUND_KEYS)
    if unknown:
        raise ValueError(f"upstream: unknown field {unknown[0]!r} (known: {', '.join(BOUND_KEYS)})")
    missing = [k for k in BOUND_KEYS if k not in obj]
    if missing:
        raise ValueError(f"upstream: missing field {missing[0]!r}")
    for key, problem in (("issue", issue_problem(obj["issue"])), ("package", package_problem(obj["package"]))):
        if problem:
            raise ValueError(f"upstream.{key}: {problem}")
    try:
        versions = parse_range(obj["versions"])
    except ValueError as exc:
        raise ValueError(f"upstream.versions: {exc}") from None
    return UpstreamBound(obj["issue"], obj["package"], versions)


def parse_table(table_of: object, key: str, verdicts: tuple[str, ...], name) -> tuple[dict, list[BoundExpectation]]:
    """An expectation table, arm -> {probe: expectation}: one verdict of verdicts, or a set of them (a non-empty list
    of distinct verdicts, never a finding beside its absence; repro.judge.expectations.expectation_problem), or either
    bound to an upstream bug (parse_entry). The table keeps each expectation as written (a bound entry's verdict): the
    report's checked items repeat it; the bounds come back beside it. ValueError or TypeError 'key.arm.probe: why' (name() quotes
    a fixture's name for the message)."""
    if not isinstance(table_of, dict):
        raise TypeError(f"{key}: must be an object of arm -> {{probe: verdict}}")
    out: dict = {}
    bounds: list[BoundExpectation] = []
    for arm, table in table_of.items():
        if not isinstance(table, dict):
            raise TypeError(f"{key}.{name(arm)}: must be an object of probe -> verdict")
        out[arm] = {}
        for probe, want in table.items():
            try:
                verdict, bound = parse_entry(want, verdicts)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{key}.{name(arm)}.{name(probe)}: {exc}") from None
            out[arm][probe] = verdict
            if bound is not None:
                bounds.append(BoundExpectation(key, arm, probe, verdict, bound))
    return out, bounds
