"""Repeated trials and the confirmation alone: a judged run reduced to its findings, rates per probe (per
request for a scenario run), and the class of a finding (pure: judged report entries in, small dicts out).

A finding is what a reuse arm's run says is wrong: a probe whose token verdict is FAIL (with the
first diffs of its requests), or a probe whose KV verdict is a KV finding (CORRUPT, FOREIGN, MISPLACED). Two
runs "find the same" when they fail the same probes at the same first diffs and blame KV on the same probes with
the same class. A rate counts the trials of each KV finding apart (KV_RATE_FIELDS). A (scenario, arm)'s
runs are compared request by request instead: a request is its step, its probe and which of that probe's
requests in the step it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from repro.judge.verdict import (
    CORRUPT,
    ERROR,
    EXACT,
    FAIL,
    FOREIGN,
    INCONCLUSIVE,
    KV_FINDINGS,
    MISPLACED,
    NUMERIC,
    PASS,
)

EVERY_TRIAL = "every trial"
INTERMITTENT = "intermittent"
NONE = "none"
CONSISTENT, CLEAN = "consistent", "clean"

DETERMINISTIC = "deterministic"
CONTENTION_DEPENDENT = "contention-dependent"
REPRODUCED_VARYING = "reproduced, varying"
NOT_REPRODUCED = "not reproduced"
UNCONFIRMED = "unconfirmed"
# A run whose arm verdict is one of these decided nothing about the finding.
UNDECIDED = (ERROR, INCONCLUSIVE)
# A confirmation's reason when the run alone could read what the shared run stored (repro.plan.arms's `store`).
STORE_PERSISTED = "the store persisted: not independent"
# A rate's count of the trials whose KV verdict was each KV finding, worst first. kv_corrupt is as old as trials;
# kv_foreign and kv_misplaced came with those classes (a report written before them has neither: read as 0).
# A probe (a request) has one KV verdict per trial, so their sum is the trials with any KV finding.
KV_RATE_FIELDS = {CORRUPT: "kv_corrupt", FOREIGN: "kv_foreign", MISPLACED: "kv_misplaced"}


def kv_counts(kvs: Iterable[object]) -> dict[str, int]:
    """A rate's KV counts from its trials' KV verdicts (None: that trial has none): every field, 0 when none."""
    kvs = list(kvs)
    return {key: sum(1 for kv in kvs if kv == verdict) for verdict, key in KV_RATE_FIELDS.items()}


def kv_rate_counts(rate: Mapping) -> list[tuple[str, int]]:
    """(KV finding, trials) of every KV finding a rate counts in some trial, worst first (an absent field: 0)."""
    out = []
    for verdict, key in KV_RATE_FIELDS.items():
        n = rate.get(key)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            out.append((verdict, n))
    return out


def kv_found(rate: Mapping) -> int:
    """The trials whose KV verdict was a finding of any class."""
    return sum(n for _, n in kv_rate_counts(rate))


def run_summary(entry: dict, trial: int, shared: bool | None) -> dict:
    """One run of an arm (a judged report entry) as the report's trials and confirmation keep it."""
    probes = []
    for p in entry.get("probes") or []:
        if p.get("skipped"):
            continue
        reqs = p.get("requests") or []
        kv = p.get("kv")
        probes.append(
            {
                "name": p["name"],
                "verdict": p.get("verdict"),
                "first_diffs": [r.get("first_diff") for r in reqs],
                "cached_tokens": [r.get("cached_tokens") for r in reqs],
                "kv": kv.get("verdict") if isinstance(kv, dict) else None,
            }
        )
    return {
        "trial": trial,
        "verdict": entry.get("verdict"),
        "error": _error(entry),
        "wall_s": (entry.get("timing") or {}).get("wall_s"),
        "shared": shared,
        "probes": probes,
    }


def _error(entry: dict) -> dict | None:
    error = entry.get("error")
    return None if not error else {"kind": error.get("kind"), "detail": error.get("detail")}


def findings(run: dict) -> frozenset:
    """The run's findings: ("tokens", probe, first diffs) and ("kv", probe, KV finding) items."""
    out = set()
    for p in run["probes"]:
        if p["verdict"] == FAIL:
            out.add(("tokens", p["name"], tuple(p["first_diffs"])))
        if p["kv"] in KV_FINDINGS:
            out.add(("kv", p["name"], p["kv"]))
    return frozenset(out)


def has_finding(run: dict) -> bool:
    return bool(findings(run))


def decided(run: dict) -> bool:
    """The run says something of a finding: any verdict but ERROR and INCONCLUSIVE, or an INCONCLUSIVE run that
    found something all the same (a KV finding is the KV audit's decision where the tokens decided nothing, as a
    token-keyed connector across LoRA adapters shows). An ERROR decided nothing: it did not finish."""
    return run["verdict"] not in UNDECIDED or (run["verdict"] != ERROR and has_finding(run))


def _probe_found(run: dict, name: str) -> tuple[bool, str | None]:
    """Whether the run FAILed the probe, and its KV finding (None: none)."""
    p = next((p for p in run["probes"] if p["name"] == name), None)
    if p is None:
        return False, None
    return p["verdict"] == FAIL, (p["kv"] if p["kv"] in KV_FINDINGS else None)


def finished(run: dict) -> bool:
    """A run that ended (any verdict but ERROR): a trial that crashed or timed out found nothing because it
    did not finish, so it is set apart, never counted as a trial that did not find the finding."""
    return run.get("verdict") != ERROR


def trial_rates(runs: list[dict]) -> dict:
    """The report's `trials` from every run of one arm (trial 1 is the arm's own run). Each rate counts its
    finding over the runs that finished (`finished`; `of` is every run, `errors` those that ended in ERROR)."""
    names = []
    for run in runs:
        names += [p["name"] for p in run["probes"] if p["name"] not in names]
    done = [run for run in runs if finished(run)]
    rates = []
    for name in names:
        hits = [_probe_found(run, name) for run in done]
        failed = sum(1 for tokens, _ in hits if tokens)
        either = sum(1 for tokens, kv in hits if tokens or kv)
        cls = _class(either, len(done))
        rates.append(
            {"probe": name, "failed": failed, **kv_counts(kv for _, kv in hits), "of": len(runs), "class": cls}
            | ({"errors": len(runs) - len(done)} if len(done) < len(runs) else {})
        )
    return {"n": len(runs), "runs": runs, "rates": rates, "class": _overall(rates)}


def _class(found_in: int, of: int) -> str:
    """A finding's class from the number of finished runs that made it, of those that finished."""
    return NONE if found_in == 0 else EVERY_TRIAL if found_in == of else INTERMITTENT


def _overall(rates: list[dict]) -> str:
    classes = {r["class"] for r in rates}
    return INTERMITTENT if INTERMITTENT in classes else CONSISTENT if EVERY_TRIAL in classes else CLEAN


# ---- scenario runs: every (scenario, arm) N times, compared request by request ------------------------


def scenario_run_summary(entry: dict, trial: int, shared: bool | None) -> dict:
    """One run of a (scenario, arm) (a judged scenario arm entry, repro.run.scenarios.judge_run) as its `trials`
    keep it: the arm's verdicts, why, and the engine's preemption count; per request its step, probe,
    verdict and why, first diff, hit counter, generated tokens, KV verdict and the blocks it blames. Enough
    to explain a later trial without trial 1's full record (a preemption scenario's PASS needs its count)."""
    kv = entry.get("kv")
    requests = []
    for r in entry.get("requests") or []:
        rkv = r.get("kv")
        blame = rkv.get("blame") if isinstance(rkv, dict) else None
        requests.append(
            {
                "step": r.get("step"),
                "probe": r.get("probe"),
                "verdict": r.get("verdict"),
                "first_diff": r.get("first_diff"),
                "cached_tokens": r.get("cached_tokens"),
                "kv": rkv.get("verdict") if isinstance(rkv, dict) else None,
                "kv_blocks": blame.get("text") if isinstance(blame, dict) else None,
                "reasons": list(r.get("reasons") or []),
                "token_ids": r.get("token_ids"),
            }
        )
    return {
        "trial": trial,
        "verdict": entry.get("verdict"),
        "kv": kv.get("verdict") if isinstance(kv, dict) else None,
        "error": _error(entry),
        "wall_s": entry.get("wall_s"),
        "shared": shared,
        "reasons": list(entry.get("reasons") or []),
        "preemptions": entry.get("preemptions"),
        "requests": requests,
    }


def _keyed(run: dict) -> dict[tuple, dict]:
    """A scenario run's requests by (step, probe, nth): the nth request of that probe in that step."""
    out: dict[tuple, dict] = {}
    for r in run["requests"]:
        nth = sum(1 for step, probe, _ in out if (step, probe) == (r["step"], r["probe"]))
        out[(r["step"], r["probe"], nth)] = r
    return out


def scenario_trial_rates(runs: list[dict]) -> dict:
    """A (scenario, arm)'s `trials` from every run of it (trial 1 is its own run): per request that is not a
    PASS (or whose KV is a finding) in some trial, its verdict, first diff and KV verdict in each trial (null where
    that trial has no such request: it failed), in how many it FAILed and had each KV finding, and the class of
    that finding."""
    keyed = [_keyed(run) for run in runs]
    done = sum(1 for run in runs if finished(run))
    keys: list[tuple] = []
    for by_key in keyed:
        keys += [k for k, r in by_key.items() if (r["verdict"] != PASS or r["kv"] in KV_FINDINGS) and k not in keys]
    rates = []
    for key in sorted(keys, key=lambda k: k[0] if isinstance(k[0], int) else -1):  # by step, then as they ran
        found = [by_key.get(key) for by_key in keyed]
        failed = sum(1 for r in found if r is not None and r["verdict"] == FAIL)
        either = sum(1 for r in found if r is not None and (r["verdict"] == FAIL or r["kv"] in KV_FINDINGS))
        step, probe, nth = key
        rates.append(
            {
                "step": step,
                "probe": probe,
                "nth": nth,
                "verdicts": [r["verdict"] if r is not None else None for r in found],
                "first_diffs": [r["first_diff"] if r is not None else None for r in found],
                "kv": [r["kv"] if r is not None else None for r in found],
                "failed": failed,
                **kv_counts(r["kv"] for r in found if r is not None),
                "of": len(runs),
                "class": _class(either, done),
            }
            | ({"errors": len(runs) - done} if done < len(runs) else {})
        )
    return {"n": len(runs), "runs": runs, "rates": rates, "class": _overall(rates)}


def rate_text(rates: dict) -> str:
    """'chat-511 FAIL 3/5 (intermittent); fixture FAIL 0/5, KV MISPLACED 2/5' for the summary lines."""
    parts = []
    for r in rates["rates"]:
        what = f"FAIL {r['failed']}/{r['of']}"
        what += "".join(f", KV {verdict} {n}/{r['of']}" for verdict, n in kv_rate_counts(r))
        parts.append(f"{r['probe']} {what}" + (f" ({r['class']})" if r["class"] == INTERMITTENT else ""))
    return "; ".join(parts)


def shared_runs_of(entry: dict) -> list[dict]:
    """The runs of an arm's judged entry that shared their device, as its confirmation was classed against: its
    trials' (trial 1 is its own run), else its own run (shared as its `sharing` says)."""
    runs = (entry.get("trials") or {}).get("runs")
    if runs is None:
        runs = [run_summary(entry, 1, (entry.get("sharing") or {}).get("shared"))]
    return [r for r in runs if r.get("shared")]


def needs_confirmation(runs: list[dict]) -> dict | None:
    """The first run that found something while it shared its device (the one to re-run alone), or None."""
    return next((run for run in runs if run.get("shared") and has_finding(run)), None)


def _run_text(run: dict) -> str:
    """'PASS 4/4', 'FAIL on a, b', 'FAIL on a; KV CORRUPT on a, b', 'INCONCLUSIVE, KV FOREIGN on a, b' (a KV finding
    is named beside the token FAILs, never folded into them), 'INCONCLUSIVE (no finding)', 'ERROR (timeout)'."""
    if run["verdict"] == ERROR:
        return f"{ERROR} ({(run.get('error') or {}).get('kind') or ERROR})"
    found = findings(run)
    failed = sorted({name for kind, name, _ in found if kind == "tokens"})
    parts = [f"{FAIL} on {', '.join(failed)}"] if failed else []
    for cls in KV_FINDINGS:
        names = sorted(name for kind, name, what in found if kind == "kv" and what == cls)
        parts += [f"KV {cls} on {', '.join(names)}"] if names else []
    if not parts:
        total = len(run["probes"])
        return f"{PASS} {total}/{total}" if run["verdict"] == PASS else f"{run['verdict']} (no finding)"
    text = "; ".join(parts)
    return text if run["verdict"] == FAIL else f"{run['verdict']}, {text}"


def _same_text(target: dict, alone: dict) -> str:
    """What a run alone that found exactly what the shared run found found again: 'first diffs and KV blame',
    'first diffs' or 'KV blame', and where its own tokens were INCONCLUSIVE, that the KV audit confirms it."""
    kinds = {kind for kind, *_ in findings(target)}
    what = " and ".join(w for k, w in (("tokens", "first diffs"), ("kv", "KV blame")) if k in kinds)
    by_kv = alone["verdict"] == INCONCLUSIVE and "kv" in kinds
    return f"the same {what} as while sharing" + (
        " (confirmed by the KV audit; its tokens were INCONCLUSIVE)" if by_kv else ""
    )


def classify_confirmation(shared_runs: list[dict], alone: dict) -> tuple[str, str]:
    """(class, reason) of a finding made while sharing, given the same job re-run alone. A finding is a token FAIL
    or a KV finding (findings): a run alone whose tokens were INCONCLUSIVE but whose KV audit found the same KV
    finding on the same probes confirms it.

    deterministic: alone finds exactly what the shared run found; reproduced, varying: alone finds
    something wrong with a probe the shared run found wrong, but not the same first diffs or KV blame
    (the device was not needed, yet the bytes differ run to run: a race, or state left by earlier
    requests); contention-dependent: alone finds nothing, and every shared run found it (one clean
    shared trial would make a clean run alone no evidence of contention); not reproduced: alone finds
    nothing after shared trials that were themselves intermittent, or finds something only on other
    probes; unconfirmed: the run alone decided nothing (an ERROR; an INCONCLUSIVE that found nothing, or found
    something only on other probes; a clean run alone whose KV audit said nothing of a probe the shared run
    blamed KV on)."""
    found = [r for r in shared_runs if has_finding(r)]
    target = found[0] if found else None
    if target is None:
        return UNCONFIRMED, "no shared run found anything to confirm"
    if not decided(alone):
        return UNCONFIRMED, f"alone: {_run_text(alone)}: the finding is neither confirmed nor cleared"
    if findings(alone) == findings(target):
        return DETERMINISTIC, f"alone: {_run_text(alone)}: {_same_text(target, alone)}"
    if not has_finding(alone):
        return _clean_alone(shared_runs, target, alone)
    again = sorted(_probes(alone) & _probes(target))
    if again:
        which = "the same probes" if again == sorted(_probes(target)) else ", ".join(again)
        return REPRODUCED_VARYING, (
            f"alone: {_run_text(alone)}: {which} wrong again without the shared device, "
            "with other first diffs or KV blame than while sharing"
        )
    if alone["verdict"] == INCONCLUSIVE:  # its tokens decided nothing on the shared run's probes
        return UNCONFIRMED, (
            f"alone: {_run_text(alone)}: a finding on other probes only, and nothing decided on "
            f"{', '.join(sorted(_probes(target)))}: the finding is neither confirmed nor cleared"
        )
    return NOT_REPRODUCED, f"alone: {_run_text(alone)}: a finding on other probes than the shared run's"


def _clean_alone(shared_runs: list[dict], target: dict, alone: dict) -> tuple[str, str]:
    """classify_confirmation's class for a run alone that found nothing."""
    wanted = _probes(target)
    unaudited = _kv_unaudited(target, alone)
    if unaudited:  # absent KV telemetry is never a clean KV verdict
        return UNCONFIRMED, (
            f"alone: {_run_text(alone)}, but no KV verdict on {', '.join(unaudited)}, where the shared run found a KV "
            "finding: the finding is neither confirmed nor cleared"
        )
    others = [r for r in shared_runs if not (_probes(r) & wanted)]  # shared runs that did not find it
    shared_clean = [r for r in others if _clean_on(r, wanted)]
    if shared_clean:
        return NOT_REPRODUCED, (
            f"alone: {_run_text(alone)}; {len(shared_clean)} of {len(shared_runs)} shared trials were clean too, "
            "so one clean run alone does not tell contention from chance"
        )
    if others:
        return UNCONFIRMED, (
            f"alone: {_run_text(alone)}; {len(others)} of {len(shared_runs)} shared trials decided nothing on "
            f"{', '.join(sorted(wanted))} ({', '.join(_run_text(r) for r in others)}), so a clean run alone "
            "cannot say the finding needed the shared device"
        )
    return CONTENTION_DEPENDENT, f"alone: {_run_text(alone)}: the finding needed the shared device"


def _kv_unaudited(target: dict, alone: dict) -> list[str]:
    """The probes the shared run blamed KV on that the run alone has no KV verdict for (not audited, UNAVAILABLE)."""
    by = {p["name"]: p for p in alone["probes"]}
    blamed = {name for kind, name, _ in findings(target) if kind == "kv"}
    return sorted(n for n in blamed if (by.get(n) or {}).get("kv") not in (EXACT, NUMERIC))


def _clean_on(run: dict, names: set[str]) -> bool:
    """The run ran every one of these probes to a PASS with no KV finding (whatever it said elsewhere)."""
    by = {p["name"]: p for p in run.get("probes") or []}
    return all(n in by and by[n]["verdict"] == PASS and by[n]["kv"] not in KV_FINDINGS for n in names)


def _probes(run: dict) -> set[str]:
    return {name for _, name, *_ in findings(run)}
