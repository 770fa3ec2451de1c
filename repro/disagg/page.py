"""The P→D report's page on the site (`python -m repro site` finds a `kvkit-pd-report` one folder down,
repro.publish.catalog): the arm's verdict, the stack it ran on, every request with what the consumer loaded, the
negative controls, and the writeup beside the report. No machine path is shown: the model is its folder's name.

index_row makes the report a row of the site index's table, beside the verifier's reports (repro.publish.site_index):
its stack (vLLM, NIXL, torch, the GPU), its model, the arm's verdict and each negative control by case: its verdicts
over the trials and how many held."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from markupsafe import Markup

from repro.disagg.report import KIND, exit_view, kv_text
from repro.disagg.report import headline as pd_headline
from repro.errors import EXIT_OK, UsageError
from repro.publish.environment import GENERATOR, make_environment
from repro.publish.headline import version_key
from repro.publish.site_index import IndexRow, IndexVerdict
from repro.publish.site_overview import pd_overview
from repro.publish.writeup import render_writeup
from repro.record.exit_rule import exit_reason

TEMPLATE = "pd.html.j2"


@dataclass(frozen=True)
class RequestRow:
    trial: int
    case: str
    prompt: str
    reference: str
    verdict: str
    external: str
    local: str
    transfers: str
    why: str
    control: str = ""  # a negative control's request: "held" (its answer differs, as it must) or "did not hold"


@dataclass(frozen=True)
class PdPage:
    title: str
    verdict: str
    counts: str
    controls: str
    reasons: tuple[str, ...]
    stack: str
    hardware: str
    started: str
    commit: str
    settings: str
    rows: tuple[RequestRow, ...]


def load_report(path: Path) -> dict:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if data.get("kind") != KIND:
        raise UsageError(f"{path}: not a {KIND}")
    return data


def _n(value) -> str:
    return "—" if value is None else str(value)


def page_model(report: dict) -> PdPage:
    prov, s = report.get("provenance") or {}, report.get("settings") or {}
    pkgs = prov.get("packages") or {}
    hw = prov.get("hardware") or {}
    model = PurePosixPath(str(s.get("model", "?"))).name
    rows = []
    for r in report.get("requests", []):
        t = r.get("transfer") or {}
        why = "; ".join(r.get("reasons") or []) + kv_text(r)
        held = ""
        if r.get("control") is not None:
            held = "held" if r["control"].get("held") else "did not hold"
            why = f"control {held}: {r['control'].get('reason', '')}" + (f" ({why})" if why else "")
        rows.append(RequestRow(r.get("trial", 0), r.get("case", ""), r.get("prompt", ""), _n(r.get("reference")),
                               r.get("verdict", ""), _n(t.get("external_tokens")), _n(t.get("local_tokens")),
                               f"{_n(t.get('transfers'))} / {_n(t.get('failed_transfers'))} failed", why,
                               held))  # fmt: skip
    c = report.get("controls") or {}
    return PdPage(
        title=f"P→D (NixlConnector) · {model}",
        verdict=report.get("verdict", ""),
        counts=", ".join(f"{v} {n}" for v, n in (report.get("counts") or {}).items()) or "none",
        controls=f"{c.get('held', 0)} of {c.get('run', 0)} held",
        reasons=tuple(report.get("reasons") or ()),
        stack=" · ".join(f"{k} {v}" for k, v in sorted(pkgs.items()) if v and "unavailable" not in str(v)),
        hardware=", ".join(hw.get("gpus") or []) + (f" (driver {hw['driver']})" if hw.get("driver") else ""),
        started=str(prov.get("started_utc", "")),
        commit=str((prov.get("kit") or {}).get("commit", ""))[:12],
        settings=", ".join(f"{k} {v}" for k, v in sorted(s.items()) if k != "model") + f", model {model}",
        rows=tuple(rows),
    )


ARM = "NixlConnector P→D"


def control_tally(report: dict) -> tuple[tuple[str, str, str], ...]:
    """Each negative control case in its first order: (case, its verdicts over the trials, "held n of m")."""
    by_case: dict[str, list[dict]] = {}
    for r in report.get("requests", []):
        if r.get("control") is not None:
            by_case.setdefault(r.get("case", ""), []).append(r)
    out = []
    for case, rs in by_case.items():
        verdicts = sorted({str(r.get("verdict", "")) for r in rs})
        held = sum(1 for r in rs if r["control"].get("held"))
        out.append((case, "/".join(verdicts), f"held {held} of {len(rs)}"))
    return tuple(out)


def index_row(report: dict, *, stem: str, href: str) -> IndexRow:
    """The report as a row of the site index's table (the verifier's reports' table): one arm, its controls."""
    m, prov = page_model(report), report.get("provenance") or {}
    pkgs = prov.get("packages") or {}
    model = PurePosixPath(str((report.get("settings") or {}).get("model", "?"))).name
    vllm, nixl = str(pkgs.get("vllm", "—")), str(pkgs.get("nixl", "—"))
    code, why = exit_reason(exit_view(report))
    why = why.split(": ")[0]  # the head of the reason ('acceptance not matched'); the page gives the rest
    condition = "" if code == EXIT_OK else f"exit {code}: {why}"
    hardware = ", ".join((prov.get("hardware") or {}).get("gpus") or []) or "—"
    return IndexRow(
        href=href,
        stem=stem,
        hardware=hardware,
        date=m.started[:10],
        commit=m.commit[:7],
        vllm=vllm,
        lmcache="none",
        # the arm's verdict, and beside it what the one exit rule counts against the run (a control not held, a KV
        # finding), so that the cell never reads a bare PASS over a non-zero exit
        verdicts=(IndexVerdict(ARM, m.verdict, condition=condition),),
        acceptance="—",  # no fixture expectations: the negative controls are listed under the verdict
        headline=pd_headline(report),  # the terminal's sentence, through the same exit rule
        stack=(version_key(vllm), version_key(""), m.started),
        controls=control_tally(report),
        stack_note=f"NIXL {nixl} · torch {pkgs.get('torch', '—')} · model {model}",
        overview=pd_overview(vllm=vllm, hardware=hardware, model=model, verdict=m.verdict, condition=condition),
    )


def render_page(report: dict, writeup: str | None = None) -> str:
    html = Markup(render_writeup(writeup)) if writeup else None
    return make_environment().get_template(TEMPLATE).render(m=page_model(report), writeup=html, generator=GENERATOR)
