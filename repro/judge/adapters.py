"""Key identity across LoRA adapters and images, judged: which probes are one prompt under other weights (siblings), whether
their baselines tell the adapters apart, and the reason a reuse that answers as another adapter is given.

A reuse across adapters must either miss or give its own adapter's baseline. One that hit and differs is a FAIL
(repro.judge.verdict, repro.judge.scenario_verdict); where its tokens are another adapter's answer to the same
prompt (repro.judge.replays, its sources named by `siblings`) its reasons say "answers as adapter A". Where two
adapters' baselines of a prompt are equal, nothing a reuse answers can tell whose KV it read: the probe is at most
INCONCLUSIVE, and says why. Pure functions over a result's probes (repro.contract.result.ProbeResult: name,
prompt_token_ids, adapter) and the baseline's answers; the verdicts are decided where verdicts are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from repro.judge.scenario_verdict import ScenarioRequestVerdict, decide_scenario_indistinct
from repro.judge.verdict import ProbeVerdict, decide_indistinct_adapters

BASE_MODEL = "the base model"


def whose(adapter: Mapping | None, image: Mapping | None = None) -> str:
    """'adapter A' for a probe under adapter A; 'the base model' for one under none; with an image,
    'image seed 1' (and its processor settings, where the probe gives some) before it."""
    model = f"adapter {adapter['label']}" if adapter else BASE_MODEL
    if not image:
        return model
    settings = ", ".join(f"{k}={v}" for k, v in sorted((image.get("processor") or {}).items()))
    seen = f"image seed {image['seed']}" + (f" ({settings})" if settings else "")
    return seen if not adapter else f"{seen} under {model}"


def label(probe) -> str | None:
    """The label of the adapter a probe ran under (None: the base model)."""
    return (probe.adapter or {}).get("label")


def weights(probe) -> tuple:
    """What a probe's answer is computed with besides its tokens: its adapter's folder (None: the base model's
    weights alone) and the image it was sent with (None: none)."""
    image = getattr(probe, "image", None)
    return (probe.adapter or {}).get("path"), tuple(sorted(repr(kv) for kv in image.items())) if image else None


def identity(probe) -> tuple:
    """What keys a probe's KV besides its tokens, by the fixture's words: its adapter's label, its image and its
    tenant salt (cache_salt, repro.judge.salts)."""
    image = getattr(probe, "image", None)
    return (
        label(probe),
        tuple(sorted(repr(kv) for kv in image.items())) if image else None,
        getattr(probe, "cache_salt", None),
    )


def siblings(probes: Iterable) -> dict[str, dict[str, str]]:
    """probe -> {sibling: whose answer the sibling's is}: the probes with the same prompt token IDs under other
    weights (another adapter's folder, or the base model). Only where some probe of that prompt runs under an
    adapter: a run without adapters has none."""
    groups: dict[tuple[int, ...], list] = {}
    for p in probes:
        groups.setdefault(tuple(p.prompt_token_ids), []).append(p)
    out: dict[str, dict[str, str]] = {}
    for group in groups.values():
        if not any(p.adapter or getattr(p, "image", None) for p in group):
            continue
        for p in group:
            others = {q.name: whose(q.adapter, getattr(q, "image", None)) for q in group if weights(q) != weights(p)}
            if others:
                out[p.name] = others
    return out


def alike(probe: str, answers: Mapping[str, Sequence[int]], same: Mapping[str, str]) -> list[str]:
    """Whose answers to this probe's prompt (its siblings') equal its own baseline, sorted."""
    own = answers.get(probe)
    return sorted({who for name, who in same.items() if own is not None and answers.get(name) == own})


def alike_reason(whom: list[str]) -> str:
    what = "image" if any(w.startswith("image") for w in whom) else "adapter"
    return (
        f"{' and '.join(whom)} {'answers' if len(whom) == 1 else 'answer'} this prompt with the same tokens as its own "
        f"baseline: the probe cannot tell the {what}s apart, so no reuse here proves the cache keys on the {what}"
    )


def replay_reasons(replays: Iterable[Mapping], prefix: str = "") -> list[str]:
    """'answers as adapter A (its baseline's tokens @0-3, not its own)' for each replay of a sibling's answer."""
    out = []
    for r in replays:
        if r.get("answers_as"):
            end = r["from"] + r["tokens"] - 1
            out.append(f"{prefix}answers as {r['answers_as']} ({r['probe']}'s baseline tokens @{r['from']}-{end})")
    return out


def judge_probe(
    pv: ProbeVerdict, probe: str, answers: Mapping[str, Sequence[int]], same: Mapping[str, str], requests: list[dict]
) -> ProbeVerdict:
    """A reuse arm's probe with siblings: each reuse that answers as another adapter says so (requests: the entry's,
    with their replays), and a probe whose adapters answer alike is at most INCONCLUSIVE."""
    if not same:
        return pv
    notes = [n for i, r in enumerate(requests[1:], 1) for n in replay_reasons(r.get("replays") or [], f"reuse {i}: ")]
    pv = replace(pv, reasons=(*pv.reasons, *notes))
    whom = alike(probe, answers, same)
    return decide_indistinct_adapters(pv, alike_reason(whom)) if whom else pv


def judge_scenario_request(
    v: ScenarioRequestVerdict,
    probe: str,
    answers: Mapping[str, Sequence[int]],
    same: Mapping[str, str] | None,
    replays: list[dict] | None,
) -> ScenarioRequestVerdict:
    """A scenario request whose probe has siblings: whether it answers as another adapter, and at most
    INCONCLUSIVE where its adapters answer alike."""
    if not same:
        return v
    v = replace(v, reasons=(*v.reasons, *replay_reasons(replays or [])))
    whom = alike(probe, answers, same)
    return decide_scenario_indistinct(v, alike_reason(whom)) if whom else v
