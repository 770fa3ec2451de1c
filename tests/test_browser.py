"""The rendered site in a real headless Chromium: visible banner and table, right cells, no network request.

Driven over the DevTools protocol on a pipe (--remote-debugging-pipe: fd 3 in, fd 4 out), so every
request the page makes is seen as a Network event, whatever its scheme or host. Screenshots go to
tests/artifacts/.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from conftest import ARTIFACTS, ROOT
from kvkit_testutil import committed_or_skip

from repro.publish.site import render_site

DATA = ROOT / "tests" / "data"
STEM = "render-selftest"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--mute-audio",
    "--hide-scrollbars",
    # Belt and braces: nothing could leave the machine anyway; the Network events still show attempts.
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--remote-debugging-pipe",
]

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (CI installs Debian's package)")

PROBE_JS = """(() => {
  const visible = el => { if (!el) return false; const r = el.getBoundingClientRect(), s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none' && r.top < innerHeight * 4; };
  const banner = document.getElementById('claim-banner'), table = document.getElementById('cmp');
  const headline = document.getElementById('headline');
  return {
    headlineText: headline ? headline.innerText : null,
    headlineTop: headline ? headline.getBoundingClientRect().top : null,
    bannerVisible: visible(banner), bannerText: banner ? banner.innerText : null,
    bannerTop: banner ? banner.getBoundingClientRect().top : null,
    tableVisible: visible(table),
    rows: table ? [...table.querySelectorAll('tr')].map(tr => [...tr.children].map(c => c.innerText.trim())) : [],
    scripts: document.querySelectorAll('script').length, imgs: document.querySelectorAll('img').length,
    bodyText: document.body.innerText, bodyAll: document.body.textContent,
    scrollWidth: document.documentElement.scrollWidth, clientWidth: document.documentElement.clientWidth,
  };
})()"""


class Browser:
    """A minimal DevTools-protocol client over Chromium's pipe: one page, its Network and Page events."""

    def __init__(self, user_data_dir: str):
        self._log = open(Path(user_data_dir) / "chromium.log", "wb")  # noqa: SIM115 - closed in close()
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def wire_fds() -> None:  # the child expects the protocol on fds 3 (reads) and 4 (writes)
            r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 10)
            w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 10)
            os.dup2(r, 3)  # via fds >= 10, so that wiring one cannot clobber the other; dup2 clears CLOEXEC
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={user_data_dir}", "about:blank"],
            close_fds=False,
            preexec_fn=wire_fds,  # noqa: PLW1509 - close_fds would run after wire_fds
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []
        self.session = ""

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            ready, _, _ = select.select([self._from_child], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                self._log.flush()
                tail = (Path(self._log.name).read_bytes()[-2000:]).decode(errors="replace")
                raise TimeoutError(f"chromium did not answer in time; its stderr ends:\n{tail}")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                self._log.flush()
                tail = (Path(self._log.name).read_bytes()[-2000:]).decode(errors="replace")
                raise RuntimeError(f"chromium closed the DevTools pipe; its stderr ends:\n{tail}")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, timeout: float = 30, session: bool = True) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        for i, ev in enumerate(self.events):
            if ev.get("method") == method:
                return self.events.pop(i)
        while True:
            ev = self._read_message(deadline)
            if ev.get("method") == method:
                return ev
            self.events.append(ev)

    def open_page(self) -> None:
        # The first answer waits for Chromium's start: on a fresh 2-core machine beside the other xdist worker that
        # took more than 30 s once in CI.
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False, timeout=180)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True}, session=False)[
            "sessionId"
        ]
        self.call("Network.enable")
        self.call("Page.enable")

    def load(self, url: str, width: int, height: int = 900, mobile: bool = False) -> list[str]:
        """Navigate at a viewport size; returns every URL the page requested."""
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
        )
        self.events.clear()
        self.call("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired")
        time.sleep(0.3)  # late subresources (fonts, lazy images) would show up here
        self.call("Runtime.evaluate", {"expression": "1"})  # drains queued events into self.events
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def evaluate(self, expression: str):
        res = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in res:
            raise RuntimeError(res["exceptionDetails"])
        return res["result"]["value"]

    def screenshot(self, path: Path, full_page: bool = True) -> None:
        params: dict = {"format": "png"}
        if full_page:
            size = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params.update(
                captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": size[0], "height": min(size[1], 6000), "scale": 1},
            )
        data = self.call("Page.captureScreenshot", params, timeout=60)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.call("Browser.close", session=False, timeout=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)
        self._log.close()


@pytest.fixture(scope="module")
def browser():
    with tempfile.TemporaryDirectory(prefix="kvkit-chromium-") as profile:
        b = Browser(profile)
        try:
            b.open_page()
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    reports = tmp_path_factory.mktemp("reports")
    for name in (f"{STEM}.json", f"{STEM}.md"):
        shutil.copy(DATA / name, reports / name)
    shutil.copytree(DATA / f"{STEM}.logs", reports / f"{STEM}.logs")
    out = tmp_path_factory.mktemp("site")
    render_site(reports, out)
    return out


def test_report_page_in_chromium_at_1280(browser, site):
    url = (site / f"{STEM}.html").as_uri()
    requested = browser.load(url, 1280)
    assert requested == [url]  # the page itself, nothing else: no font, script, style or image
    got = browser.evaluate(PROBE_JS)
    browser.screenshot(ARTIFACTS / "site-report-1280.png")
    # the headline first, then the banner, both in the first screen
    assert got["headlineText"].startswith("Planted-fault self-test (vLLM 0.28.0, CPU Intel(R) Xeon(R) Processor, tiny)")
    assert got["headlineTop"] < got["bannerTop"] < 400 and got["bannerVisible"]
    assert (
        "claim_eligible=false" in got["bannerText"]
        and "no speed, cost, throughput or latency claim" in got["bannerText"]
    )
    assert got["tableVisible"]
    rows = [r[:5] for r in got["rows"]]
    assert ["PlantedFault (PlantedFaultConnector): FAIL (decisive: 6)"] in rows
    i = rows.index(["PlantedFault (PlantedFaultConnector): FAIL (decisive: 6)"])
    assert rows[i + 1] == ["fixture", "1502", "0→1488×3", "FAIL", "@9 (decisive ×3, gap 0.682 nats)"]
    assert ["fixture", "1502", "0→1488×3", "PASS", ""] in rows
    assert got["scripts"] == 0 and got["imgs"] == 0
    assert got["scrollWidth"] <= got["clientWidth"]  # no sideways scrolling at 1280 px


def test_report_page_in_chromium_at_phone_width(browser, site):
    url = (site / f"{STEM}.html").as_uri()
    assert browser.load(url, 390, 844, mobile=True) == [url]
    got = browser.evaluate(PROBE_JS)
    browser.screenshot(ARTIFACTS / "site-report-390.png")
    assert got["bannerVisible"] and got["tableVisible"]
    assert got["scrollWidth"] <= got["clientWidth"] + 1  # wide tables scroll inside their own box, not the page


def test_index_page_in_chromium(browser, site):
    url = (site / "index.html").as_uri()
    assert browser.load(url, 1280) == [url]
    text = browser.evaluate("document.body.innerText")
    browser.screenshot(ARTIFACTS / "site-index-1280.png", full_page=False)
    assert (
        "CPU Intel(R) Xeon(R) Processor" in text and "0.28.0" in text and "PlantedFault (PlantedFaultConnector)" in text
    )


INDEX_JS = """(() => {
  const cell = document.querySelector('#reports td.verdicts'), r = cell.getBoundingClientRect();
  const badge = cell.querySelector('.verdict').getBoundingClientRect();
  return { left: r.left, right: r.right, badgeTop: badge.top, badgeRight: badge.right, innerWidth: innerWidth,
    innerHeight: innerHeight, headline: document.querySelector('#reports td.finding a').innerText,
    scrollWidth: document.documentElement.scrollWidth, clientWidth: document.documentElement.clientWidth };
})()"""


def test_index_at_phone_width_shows_the_verdicts(browser, site):
    """At 390 px each report is a card: its headline, then its verdicts, on screen with no sideways scrolling."""
    url = (site / "index.html").as_uri()
    assert browser.load(url, 390, 844, mobile=True) == [url]
    got = browser.evaluate(INDEX_JS)
    browser.screenshot(ARTIFACTS / "site-index-390.png", full_page=False)
    assert got["headline"].startswith("Planted-fault self-test (vLLM 0.28.0")
    assert 0 <= got["left"] and got["right"] <= got["innerWidth"] and got["badgeRight"] <= got["innerWidth"]
    assert got["badgeTop"] < got["innerHeight"]  # the first verdict on the first screen
    assert got["scrollWidth"] <= got["clientWidth"] + 1


PICTURE_JS = """(() => {
  const table = document.getElementById('picture'), box = table.parentElement;
  const cell = state => table.querySelector(`td[data-state="${state}"]`);
  const bg = el => el ? getComputedStyle(el).backgroundColor : null;
  const findings = document.getElementById('findings-list');
  return {
    top: table.getBoundingClientRect().top, rows: table.querySelectorAll('tbody tr').length,
    width: table.getBoundingClientRect().width, box: box.clientWidth, boxScroll: box.scrollWidth,
    finding: bg(cell('finding')), pass: bg(cell('pass')), caught: bg(cell('caught')),
    findingsTop: findings ? findings.getBoundingClientRect().top : null,
    labels: [...table.querySelectorAll('.cl')].map(el => [el.innerText, el.getClientRects().length]),
    innerHeight: innerHeight, scrollWidth: document.documentElement.scrollWidth,
    clientWidth: document.documentElement.clientWidth,
  };
})()"""


@pytest.fixture(scope="module")
def picture_site(tmp_path_factory) -> Path:
    """The root index of two committed reports: the H200 KV audit's finding and the CPU self-test."""
    sources = [
        ROOT / "reports" / "h200-kvaudit-lmcache-0.5.4.json",
        ROOT / "reports" / "versions" / "cpu-vllm-0.32.0-selftest.json",
    ]
    committed_or_skip(*sources)
    src = tmp_path_factory.mktemp("picture-reports")
    for path in sources:
        (src / path.name).write_bytes(path.read_bytes())
    out = tmp_path_factory.mktemp("picture-site")
    render_site(src, out, versions=True)
    return out


@pytest.mark.parametrize("width, mobile", [(1280, False), (390, True)])
def test_index_opens_with_its_picture_in_chromium(browser, picture_site, width, mobile):
    """The picture is on the first screen, a finding's colour is not a pass's, and the page never scrolls sideways
    (at 390 px the picture scrolls in its own box); at 1280 px it fits, with the findings under it."""
    url = (picture_site / "index.html").as_uri()
    assert browser.load(url, width, 844 if mobile else 900, mobile=mobile) == [url]
    got = browser.evaluate(PICTURE_JS)
    browser.screenshot(ARTIFACTS / f"site-index-picture-{width}.png", full_page=False)
    assert got["rows"] == 2 and got["top"] < got["innerHeight"] / 2
    assert len({got["finding"], got["pass"], got["caught"]}) == 3
    assert got["scrollWidth"] <= got["clientWidth"] + 1
    if not mobile:
        assert got["width"] <= got["box"] + 1 and got["findingsTop"] < got["innerHeight"]
        assert all(lines == 1 for _, lines in got["labels"]), got["labels"]  # no label broken over lines


def test_hostile_model_text_stays_text_in_chromium(browser, tmp_path):
    report = json.loads((DATA / f"{STEM}.json").read_text(encoding="utf-8"))
    payload = '<script>alert(1)</script>"><img src=x onerror=alert(1)>'
    for arm in report["arms"]:
        for probe in arm["probes"]:
            for req in probe["requests"]:
                req["text"] = payload
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "x.json").write_text(json.dumps(report), encoding="utf-8")
    render_site(tmp_path / "reports", tmp_path / "site")
    url = (tmp_path / "site" / "x.html").as_uri()
    assert browser.load(url, 1280) == [url]  # an <img src=x> that got through would be requested
    got = browser.evaluate(PROBE_JS)
    assert got["scripts"] == 0 and got["imgs"] == 0
    assert payload in got["bodyAll"]  # as text, in the folded requests table


def test_the_network_check_sees_requests(browser, tmp_path):
    """The harness itself: a page that does load something from elsewhere is caught."""
    page = tmp_path / "leaky.html"
    page.write_text(
        '<!DOCTYPE html><link rel="stylesheet" href="https://fonts.example.invalid/a.css">'
        '<img src="http://cdn.example.invalid/x.png"><p>leaky</p>',
        encoding="utf-8",
    )
    requested = browser.load(page.as_uri(), 1280)
    assert "https://fonts.example.invalid/a.css" in requested and "http://cdn.example.invalid/x.png" in requested


def test_report_page_print_media(browser, site):
    url = (site / f"{STEM}.html").as_uri()
    browser.call("Emulation.setEmulatedMedia", {"media": "print"})
    try:
        assert browser.load(url, 800) == [url]
        got = browser.evaluate(PROBE_JS)
        crumbs = browser.evaluate("getComputedStyle(document.querySelector('.crumbs')).display")
        browser.screenshot(ARTIFACTS / "site-report-print.png", full_page=False)
        pdf = base64.b64decode(browser.call("Page.printToPDF", {}, timeout=60)["data"])
    finally:
        browser.call("Emulation.setEmulatedMedia", {"media": ""})
    assert got["bannerVisible"] and got["tableVisible"] and crumbs == "none"
    assert pdf.startswith(b"%PDF")
    (ARTIFACTS / "site-report.pdf").write_bytes(pdf)


KV_JS = """(() => {
  const fig = document.getElementById('d2-1-kv1'), svg = fig && fig.querySelector('svg');
  const box = svg ? svg.getBoundingClientRect() : null;
  const cmp = document.getElementById('cmp');
  return {
    caption: fig ? fig.querySelector('.kv-caption').innerText : null,
    svgWidth: box ? box.width : 0, svgHeight: box ? box.height : 0,
    figWidth: fig ? fig.getBoundingClientRect().width : 0,
    svgOwnWidth: svg ? Number(svg.getAttribute('width')) : 0,
    boxWidth: svg ? svg.parentElement.clientWidth : 0, boxScroll: svg ? svg.parentElement.scrollWidth : 0,
    boxOverflow: svg ? getComputedStyle(svg.parentElement).overflowX : null,
    outlined: svg ? svg.querySelectorAll('rect.kv-c').length : 0,
    stroke: svg ? getComputedStyle(svg.querySelector('rect.kv-c')).stroke : null,
    bands: svg ? [...svg.querySelectorAll('rect.planted')].map(r => r.querySelector('title').textContent) : [],
    nonFinite: svg ? [...svg.querySelectorAll('rect.kv-c title')].map(t => t.textContent)
      .filter(t => t.includes('not finite')) : [],
    header: [...cmp.querySelectorAll('thead th')].map(th => th.innerText.trim()),
    kvCells: [...cmp.querySelectorAll('td.kv')].map(td => td.innerText.trim()),
    figures: document.querySelectorAll('figure.kvmap').length,
    lead: (() => { const l = document.querySelector('#lead-map svg'); return l ? l.getBoundingClientRect().top : null; })(),
    innerHeight: innerHeight,
    scripts: document.querySelectorAll('script').length, imgs: document.querySelectorAll('img').length,
    scrollWidth: document.documentElement.scrollWidth, clientWidth: document.documentElement.clientWidth,
  };
})()"""


def render_reports(tmp_path_factory, prefix: str, reports: dict[str, dict]) -> Path:
    """A site of these reports ({stem: report}), rendered into a fresh directory."""
    src = tmp_path_factory.mktemp(f"{prefix}-reports")
    for stem, report in reports.items():
        (src / f"{stem}.json").write_text(json.dumps(report), encoding="utf-8")
    out = tmp_path_factory.mktemp(f"{prefix}-site")
    render_site(src, out)
    return out


@pytest.fixture(scope="module")
def kv_site(tmp_path_factory) -> Path:
    return render_reports(tmp_path_factory, "kv", {"kv": json.loads((DATA / "report-v2-example.json").read_text())})


@pytest.mark.parametrize("width, mobile", [(1280, False), (390, True)])
def test_kv_heatmap_in_chromium(browser, kv_site, width, mobile):
    url = (kv_site / "kv.html").as_uri()
    assert browser.load(url, width, 844, mobile=mobile) == [url]  # inline SVG: nothing else is fetched
    got = browser.evaluate(KV_JS)
    browser.call("Runtime.evaluate", {"expression": "document.getElementById('d2-1-kv1').scrollIntoView()"})
    browser.screenshot(ARTIFACTS / f"site-kv-heatmap-{width}.png", full_page=False)
    assert got["caption"] == (
        "planted: blocks 0–15 (tokens 0–255); blamed: blocks 0–15, 20 (tokens 0–255, 320–335); floor rel 2.4e-07"
    )
    assert got["outlined"] == 129 and got["stroke"] == "rgb(17, 17, 17)"
    assert got["bands"] == ["planted fault: blocks 0–15 (tokens 0–255)"] * 2
    assert got["nonFinite"] == ["V · layer 3 · block 20 (tokens 320–335): corrupt · rel not finite · max abs —"]
    assert got["header"][-1] == "KV" and "CORRUPT: blocks 0–15 (tokens 0–255), K+V, layers 0–3" in got["kvCells"]
    # 16 heatmaps in the probes' details, and the first finding's again under the headline, seen without scrolling
    assert got["figures"] == 17 and got["scripts"] == 0 and got["imgs"] == 0
    assert got["lead"] is not None and got["lead"] < got["innerHeight"]
    assert got["svgHeight"] > 0 and got["boxOverflow"] == "auto"
    if got["svgOwnWidth"] <= got["boxWidth"] or not mobile:
        assert 0 < got["svgWidth"] <= got["figWidth"]  # the heatmap scales into its box
    else:  # on a phone it keeps its own size (cells of at least 5 px) and scrolls sideways in its box
        assert abs(got["svgWidth"] - got["svgOwnWidth"]) <= 1 and got["boxScroll"] > got["boxWidth"]
    assert got["scrollWidth"] <= got["clientWidth"] + 1  # no sideways scrolling of the page, at a phone's width either


NEAR_TIE_JS = """(() => {
  const seen = el => { const r = el.getBoundingClientRect(), s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'; };
  const cmp = document.getElementById('cmp') || document.getElementById('reports');
  const badge = cmp.querySelector('.v-near-ties'), fail = cmp.querySelector('.v-FAIL');
  const classed = [...cmp.querySelectorAll('.dc')];
  return {
    badge: badge ? badge.innerText : null, badgeSeen: badge ? seen(badge) : false,
    badgeBg: badge ? getComputedStyle(badge).backgroundColor : null,
    failBg: fail ? getComputedStyle(fail).backgroundColor : null,
    classed: classed.map(el => [el.className, el.innerText, getComputedStyle(el).backgroundColor, seen(el)]),
    rows: [...cmp.querySelectorAll('tr')].map(tr => [...tr.children].map(c => c.innerText.trim())),
    scrollWidth: document.documentElement.scrollWidth, clientWidth: document.documentElement.clientWidth,
  };
})()"""


@pytest.fixture(scope="module")
def near_tie_site(tmp_path_factory) -> Path:
    """The self-test report twice, its PlantedFault arm's divergences made near-ties only, and mixed."""
    from test_near_tie import MIXED, NEAR_TIES_ONLY, selftest, with_divergences

    reports = {
        "mixed": with_divergences(selftest(), "PlantedFault", MIXED),
        "near-ties": with_divergences(selftest(), "PlantedFault", NEAR_TIES_ONLY),
    }
    return render_reports(tmp_path_factory, "nt", reports)


@pytest.mark.parametrize("width, mobile", [(1280, False), (390, True)])
def test_near_tie_class_in_chromium(browser, near_tie_site, width, mobile):
    url = (near_tie_site / "near-ties.html").as_uri()
    assert browser.load(url, width, 844, mobile=mobile) == [url]
    got = browser.evaluate(NEAR_TIE_JS)
    browser.screenshot(ARTIFACTS / f"site-near-tie-{width}.png", full_page=False)
    assert got["badge"] == "near-ties only: 6" and got["badgeSeen"]
    assert got["badgeBg"] != got["failBg"]  # a badge of its own, not another FAIL
    assert ["PlantedFault (PlantedFaultConnector): FAIL near-ties only: 6"] in got["rows"]
    assert ["fixture", "1502", "0→1488×3", "FAIL", "@13 (near-tie ×3, gap 0.000 nats)"] in [r[:5] for r in got["rows"]]
    ties = [c for c in got["classed"] if c[0] == "dc dc-near-tie"]
    assert len(ties) == 4 and all(seen for *_, seen in ties)
    assert got["scrollWidth"] <= got["clientWidth"] + 1  # the wider cells scroll inside the table's box


def test_mixed_and_index_classes_in_chromium(browser, near_tie_site):
    url = (near_tie_site / "mixed.html").as_uri()
    assert browser.load(url, 1280) == [url]
    got = browser.evaluate(NEAR_TIE_JS)
    assert got["badge"] is None  # one decisive divergence: no near-ties-only badge
    assert ["PlantedFault (PlantedFaultConnector): FAIL (decisive: 5, near-tie: 1)"] in got["rows"]
    fixture = [c for c in got["classed"] if c[1].startswith(("@4 ", "@15 "))]
    assert [c[:2] for c in fixture] == [
        ["dc dc-decisive", "@4 (decisive ×2, gap 2.100 nats)"],
        ["dc dc-near-tie", "@15 (near-tie, gap 0.031 nats)"],
    ]
    assert fixture[0][2] != fixture[1][2]  # the near-tie stands out from the decisive one beside it
    index = (near_tie_site / "index.html").as_uri()
    assert browser.load(index, 1280) == [index]
    got = browser.evaluate(NEAR_TIE_JS)
    browser.screenshot(ARTIFACTS / "site-near-tie-index-1280.png", full_page=False)
    assert got["badge"] == "near-ties only: 6" and got["badgeSeen"] and got["badgeBg"] != got["failBg"]
    cells = [r[1] for r in got["rows"][1:]]  # the verdicts column, after the finding
    assert "FAIL (decisive: 5, near-tie: 1)" in cells[0] and "FAIL near-ties only: 6" in cells[1]


# --- one site: the index links every report page, matrix and the detection study (issue 22 item 4) ---

FIT_JS = """(() => ({
  tables: [...document.querySelectorAll('table')].map(t => {
    const box = t.closest('.scroll') || t.parentElement;
    return {id: t.id || t.className, width: Math.round(t.getBoundingClientRect().width), box: box.clientWidth};
  }),
  links: [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href')),
  squares: document.querySelectorAll('svg.picture rect').length,
  text: document.body.innerText,
  scrollWidth: document.documentElement.scrollWidth, clientWidth: document.documentElement.clientWidth,
}))()"""
MATRIX = ROOT / "reports" / "matrix" / "h200-controls"
DETECTION = ROOT / "reports" / "detection" / "detection-matrix.json"
MACHINE_PATH = re.compile(r"(^|[\s(=:'\"])/(tmp|root|home|work|opt|usr|var)/")


@pytest.fixture(scope="module")
def one_site(tmp_path_factory) -> Path:
    """The selftest report at the top, a committed matrix with its cells and the committed detection study."""
    committed_or_skip(MATRIX.with_suffix(".json"), DETECTION)
    src = tmp_path_factory.mktemp("one-reports")
    shutil.copy(DATA / f"{STEM}.json", src / f"{STEM}.json")
    (src / "matrix").mkdir()
    for suffix in (".json", ".md"):
        shutil.copy(MATRIX.with_suffix(suffix), src / "matrix" / MATRIX.with_suffix(suffix).name)
    shutil.copytree(MATRIX, src / "matrix" / MATRIX.name, ignore=shutil.ignore_patterns("site", "*.logs"))
    (src / "detection").mkdir()
    shutil.copy(DETECTION, src / "detection" / DETECTION.name)
    out = tmp_path_factory.mktemp("one-site")
    render_site(src, out)
    return out


def _fits(got: dict) -> None:
    """Every column shows at 1280 px: no table is wider than its box, and the page does not scroll sideways."""
    assert [t for t in got["tables"] if t["width"] > t["box"] + 1] == []
    assert got["scrollWidth"] <= got["clientWidth"]
    assert not MACHINE_PATH.search(got["text"]), MACHINE_PATH.search(got["text"])


def test_index_links_every_page_at_1280(browser, one_site):
    url = (one_site / "index.html").as_uri()
    assert browser.load(url, 1280) == [url]
    got = browser.evaluate(FIT_JS)
    browser.screenshot(ARTIFACTS / "site-one-index-1280.png")
    _fits(got)
    assert f"{STEM}.html" in got["links"]
    assert "matrix/h200-controls.html" in got["links"] and "detection/detection-matrix.html" in got["links"]
    assert all((one_site / href).is_file() for href in got["links"]), got["links"]
    assert "Matrices" in got["text"] and "Detection study" in got["text"]
    assert "4 cells, 4 done, 0 ERROR" in got["text"] and "every fault kind detected" in got["text"]


def test_matrix_page_picture_and_table_at_1280(browser, one_site):
    url = (one_site / "matrix" / "h200-controls.html").as_uri()
    assert browser.load(url, 1280) == [url]
    got = browser.evaluate(FIT_JS)
    browser.screenshot(ARTIFACTS / "site-one-matrix-1280.png")
    _fits(got)
    assert got["squares"] == 4 * 4 * 4  # cells x reuse arms x probes, one square each
    titles = browser.evaluate("[...document.querySelectorAll('svg.picture rect title')].map(t => t.textContent)")
    assert "seed6 · LMCacheConnectorV1 · chat-511: FAIL, KV CORRUPT, decisive" in titles
    assert browser.evaluate("document.getElementById('picture').getBoundingClientRect().top") < browser.evaluate(
        "document.getElementById('matrix').getBoundingClientRect().top"
    )  # the picture above the detailed table
    assert all((one_site / "matrix" / href).is_file() for href in got["links"] if href.endswith(".html"))


def test_detection_page_at_1280(browser, one_site):
    url = (one_site / "detection" / "detection-matrix.html").as_uri()
    assert browser.load(url, 1280) == [url]
    got = browser.evaluate(FIT_JS)
    browser.screenshot(ARTIFACTS / "site-one-detection-1280.png")
    _fits(got)
    assert "Detection matrix" in got["text"]
