"""Upstream bounds: an expected finding that rests on a known upstream bug, named by its issue and by the versions of
one engine package it holds for, and whether it reproduces on the version the engine ran. Pure: no I/O.

A fixture binds an expectation to a bug (repro.plan.upstream reads it):
    "same-name": {"verdict": "FAIL", "upstream": {"issue": "vllm-project/vllm#30931", "package": "vllm",
                                                  "versions": "<0.31"}}
Only a finding may be bound (FAIL, a KV finding, or a set of findings): a bound names the bug the finding shows, and a
PASS shows none. The range is one or two comma-joined clauses, <V, <=V, >V, >=V (V a release: 0.31, 0.30.2), at most
one lower and one upper, never empty. "<0.31" reads "up to 0.30.x, fixed from 0.31".

judge_bound gives one of these states, from the observed verdict and the engine's version of the package:
  reproduces: the version is inside the range and the expectation is met: the finding, as any expectation.
  fixed-upstream: the finding did not show (PASS, or KV EXACT or NUMERIC, where the fixture expects the finding);
    outside the range as the range says, inside it where the range or the fixture is wrong. Never a plain pass.
  bound-wrong: outside the range, the finding still shows ("#30931's range says fixed from 0.31 but it reproduces
    on 0.32.0").
  undecided: the report records no version of the package, or one this kit does not read, or a pre-, post- or dev
    release of a version where the range turns (0.31.0rc1 against <0.31: whether it holds the change cannot be told
    from its number). Absent or unreadable telemetry is never read as inside or outside.
  unjudged: the observed verdict says neither that the finding shows nor that it does not (ERROR, SKIPPED,
    INCONCLUSIVE, UNAVAILABLE, none, or another finding than the one stated): the rest of the exit rule says what
    that verdict means.
fixed-upstream, bound-wrong and undecided are changes to look at: the exit rule makes each exit 1, with its text
(repro.record.exit_rule).

Versions are read as PEP 440 public versions (release, pre-, post- and dev release; no epoch); a local label is
ignored, as pip's specifiers ignore it ("0.32.0+cpu" is a build of 0.32.0). `packaging` is not a dependency of the
publishing side (requirements/publish.txt), so this subset is read here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from repro.judge.expectations import FINDINGS, expectation_met, expectation_text, expectation_values
from repro.judge.verdict import EXACT, NUMERIC, PASS

REPRODUCES, FIXED_UPSTREAM, BOUND_WRONG, UNDECIDED, UNJUDGED = (
    "reproduces",
    "fixed-upstream",
    "bound-wrong",
    "undecided",
    "unjudged",
)
UPSTREAM_STATES = (REPRODUCES, FIXED_UPSTREAM, BOUND_WRONG, UNDECIDED, UNJUDGED)
# The states the exit rule makes exit 1: the expectation no longer says what the run shows, or cannot be decided.
UPSTREAM_CHANGES = (FIXED_UPSTREAM, BOUND_WRONG, UNDECIDED)
# The observed verdicts that say a finding did not show: a token PASS, KV the baseline's (bit-exact or within floor).
NON_FINDINGS = (PASS, EXACT, NUMERIC)
# The packages whose versions the engine child records (repro.engine.facts.collect_versions; a test pins them).
ENGINE_PACKAGES = ("vllm", "lmcache", "torch", "transformers")

ISSUE_PATTERN = r"[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}#[1-9][0-9]{0,9}"
_RELEASE = r"[0-9]{1,9}(?:\.[0-9]{1,9}){0,5}"
CLAUSE_PATTERN = rf"(?:<=|>=|<|>){_RELEASE}"
RANGE_PATTERN = rf"{CLAUSE_PATTERN}(?:,{CLAUSE_PATTERN})?"
_CLAUSE = re.compile(rf"(<=|>=|<|>)({_RELEASE})")
_PUBLIC = re.compile(
    r"v?(?P<release>[0-9]+(?:\.[0-9]+)*)"
    r"(?P<pre>[-_.]?(?:alpha|beta|preview|pre|rc|a|b|c)[-_.]?[0-9]*)?"
    r"(?P<post>-[0-9]+|[-_.]?(?:post|rev|r)[-_.]?[0-9]*)?"
    r"(?P<dev>[-_.]?dev[-_.]?[0-9]*)?"
    r"(?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?",
    re.IGNORECASE,
)

_TAGS = (("dev", "dev release"), ("pre", "pre-release"), ("post", "post-release"))
Release = tuple[int, ...]


def _key(release: Release, width: int = 6) -> Release:
    """A release padded with zeros, so that 0.31 and 0.31.0 compare equal."""
    return release + (0,) * (width - len(release))


def _dotted(release: Release) -> str:
    return ".".join(map(str, release))


@dataclass(frozen=True)
class VersionRange:
    """The versions of a package a bug holds for: a lower and an upper edge, each (release, inclusive) or None."""

    text: str
    lower: tuple[Release, bool] | None
    upper: tuple[Release, bool] | None

    def holds(self, release: Release) -> bool:
        """Whether a release is inside the range."""
        at = _key(release)
        if self.lower is not None:
            edge, inclusive = _key(self.lower[0]), self.lower[1]
            if at < edge or (at == edge and not inclusive):
                return False
        if self.upper is not None:
            edge, inclusive = _key(self.upper[0]), self.upper[1]
            if at > edge or (at == edge and not inclusive):
                return False
        return True

    def at_edge(self, release: Release) -> bool:
        """Whether a release is one of the range's edges (0.31.0 for <0.31)."""
        return any(e is not None and _key(e[0]) == _key(release) for e in (self.lower, self.upper))

    def says(self, release: Release, package: str) -> str:
        """What the range says of a release outside it: 'fixed from vllm 0.31', 'it appeared in vllm 0.20'."""
        if self.upper is not None and not self.holds(release) and _key(release) >= _key(self.upper[0]):
            edge, inclusive = self.upper
            return f"fixed {'after' if inclusive else 'from'} {package} {_dotted(edge)}"
        edge, inclusive = self.lower if self.lower is not None else ((), True)
        return f"it appeared {'in' if inclusive else 'after'} {package} {_dotted(edge)}"


def parse_range(text: object) -> VersionRange:
    """A range as a fixture writes it ('<0.31', '>=0.20,<0.31'); ValueError with a one-line reason otherwise."""
    if not isinstance(text, str) or not re.fullmatch(RANGE_PATTERN, text):
        raise ValueError(
            f"{text!r} is not a version range: one or two comma-joined clauses <V, <=V, >V or >=V, V a release such "
            "as 0.31 (no spaces): '<0.31' is up to 0.30.x"
        )
    lower = upper = None
    for clause in text.split(","):
        op, number = _CLAUSE.fullmatch(clause).groups()
        edge = (tuple(int(n) for n in number.split(".")), "=" in op)
        if op.startswith(">"):
            if lower is not None:
                raise ValueError(f"{text!r} gives two lower edges (one of >V or >=V at most)")
            lower = edge
        else:
            if upper is not None:
                raise ValueError(f"{text!r} gives two upper edges (one of <V or <=V at most)")
            upper = edge
    if lower is not None and upper is not None:
        low, high = _key(lower[0]), _key(upper[0])
        if low > high or (low == high and not (lower[1] and upper[1])):
            raise ValueError(f"{text!r} holds no version")
    return VersionRange(text, lower, upper)


@dataclass(frozen=True)
class EngineVersion:
    """A package's version as the engine recorded it: its text, its release, and what else it is of that release
    ('a pre-release', 'a post-release', 'a dev release'; '' for the release itself, a local build of it included)."""

    text: str
    release: Release
    tag: str


def read_version(text: object) -> EngineVersion | None:
    """The version a report records ('0.32.0', '0.32.0+cpu', '0.33.0rc1'); None for anything else (absent, not a
    string, 'unavailable: not installed', an epoch)."""
    if not isinstance(text, str):
        return None
    m = _PUBLIC.fullmatch(text)
    if m is None:
        return None
    tag = next((f"a {word}" for g, word in _TAGS if m.group(g)), "")
    return EngineVersion(text, tuple(int(n) for n in m.group("release").split(".")), tag)


@dataclass(frozen=True)
class UpstreamBound:
    """The known upstream bug an expected finding rests on: its issue ('vllm-project/vllm#30931'), the engine
    package whose versions it holds for, and those versions."""

    issue: str
    package: str
    versions: VersionRange

    def to_json(self) -> dict:
        return {"issue": self.issue, "package": self.package, "versions": self.versions.text}


def issue_problem(issue: object) -> str | None:
    """Why an issue reference is refused, or None: it must be owner/repo#number."""
    if isinstance(issue, str) and re.fullmatch(ISSUE_PATTERN, issue):
        return None
    return f"{issue!r} is not an issue as owner/repo#number (vllm-project/vllm#30931)"


def package_problem(package: object) -> str | None:
    """Why a package is refused, or None: it must be one whose version the engine records."""
    if isinstance(package, str) and package in ENGINE_PACKAGES:
        return None
    return f"{package!r} is not a package whose version the engine records ({', '.join(ENGINE_PACKAGES)})"


def bound_problem(want: object) -> str | None:
    """Why an expectation may not be bound to an upstream bug, or None: only a finding (FAIL, a KV finding, or a set
    of findings) rests on a bug; a bound on a PASS would say nothing a range could decide."""
    values = expectation_values(want)
    if values and all(v in FINDINGS for v in values):
        return None
    return (
        f"an upstream bound names the bug behind an expected finding, and {want!r} states none (bind FAIL, "
        f"{', '.join(FINDINGS[1:])} or a set of them)"
    )


@dataclass(frozen=True)
class BoundJudgement:
    """A bound's state (UPSTREAM_STATES) and the sentence that says it."""

    state: str
    text: str

    @property
    def is_change(self) -> bool:
        """A change to look at (exit 1): fixed upstream, a wrong bound, or one that cannot be decided."""
        return self.state in UPSTREAM_CHANGES


def judge_bound(
    bound: UpstreamBound, want: object, observed: str | None, version: object, where: str
) -> BoundJudgement:
    """A bound's state for one observed verdict (None: none) on the engine's recorded version of its package (as the
    report records it: a string, or None where it records none); where: what was observed ('native same-name')."""
    issue, pkg, rng = bound.issue, bound.package, bound.versions.text
    seen = f"{where} {observed}"
    if expectation_met(want, observed):
        shows = True
    elif observed in NON_FINDINGS:
        shows = False
        seen += f" where the fixture expects {expectation_text(want)}"
    else:
        what = f"is {observed}" if observed is not None else "has no verdict"
        return BoundJudgement(
            UNJUDGED,
            f"{issue} not judged: {where} {what}, which says neither that the finding shows nor that it does not",
        )
    got = read_version(version)
    undecided = f"{issue}'s range ({pkg} {rng}) cannot be decided: "
    if got is None:
        why = (
            f"the report records no {pkg} version of the engine"
            if version is None or (isinstance(version, str) and version.startswith("unavailable"))
            else f"the engine's {pkg} version {version!r} is not one this kit reads"
        )
        return BoundJudgement(UNDECIDED, f"{undecided}{why} ({seen})")
    if got.tag and bound.versions.at_edge(got.release):
        return BoundJudgement(
            UNDECIDED,
            f"{undecided}{pkg} {got.text} is {got.tag} of {_dotted(got.release)}, where the range turns, and whether it "
            f"holds the change its number cannot tell ({seen})",
        )
    inside = bound.versions.holds(got.release)
    if shows and inside:
        return BoundJudgement(REPRODUCES, f"{issue} reproduces on {pkg} {got.text}, inside its range {rng} ({seen})")
    if shows:
        says = bound.versions.says(got.release, pkg)
        return BoundJudgement(
            BOUND_WRONG, f"{issue}'s range says {says} but it reproduces on {pkg} {got.text} ({seen})"
        )
    if inside:
        return BoundJudgement(
            FIXED_UPSTREAM,
            f"fixed upstream: {issue} does not reproduce on {pkg} {got.text}, inside its stated range {rng} ({seen}): "
            "the range or the fixture is wrong",
        )
    return BoundJudgement(
        FIXED_UPSTREAM,
        f"fixed upstream: {issue} does not reproduce on {pkg} {got.text} ({seen}; its range: {pkg} {rng})",
    )
