"""The P→D report's page on the site (`python -m repro site` finds a `kvkit-pd-report` one folder down,
repro.publish.catalog): the arm's verdict, the stack it ran on, every request with what the consumer loaded, the
negative controls, and the writeup beside the report. No machine path is shown: the model is its folder's name."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from markupsafe import Markup

from repro.disagg.report import KIND
from repro.errors import UsageError
from repro.publish.environment import GENERATOR, make_environment
from repro.publish.writeup import render_writeup

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
        why = "; ".join(r.get("reasons") or [])
        if r.get("control") is not None:
            held = "held" if r["control"].get("held") else "did not hold"
            why = f"control {held}: {r['control'].get('reason', '')}" + (f" ({why})" if why else "")
        rows.append(RequestRow(r.get("trial", 0), r.get("case", ""), r.get("prompt", ""), _n(r.get("reference")),
                               r.get("verdict", ""), _n(t.get("external_tokens")), _n(t.get("local_tokens")),
                               f"{_n(t.get('transfers'))} / {_n(t.get('failed_transfers'))} failed", why))  # fmt: skip
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


def render_page(report: dict, writeup: str | None = None) -> str:
    html = Markup(render_writeup(writeup)) if writeup else None
    return make_environment().get_template(TEMPLATE).render(m=page_model(report), writeup=html, generator=GENERATOR)
