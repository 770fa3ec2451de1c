"""What the verifier shows while it runs: one line of state per arm.

Three modes, chosen by `for_stream`:
  live    on a terminal: a table redrawn in place (rich, already installed with vLLM): each arm's
          stage (waiting, importing, preflight, building the engine, probe i of n, judging,
          comparing KV), its elapsed time, and its verdict once known
  lines   when stderr is not a terminal (CI logs, pipes): one timestamped line per change
  quiet   `--quiet`: nothing; the summary alone is printed at the end

Stages come from two places: the parent's own steps (started, finished, judged) and the engine
child's progress file (repro.contract.job.progress_path, written by repro.record.child_io.report_stage),
which a background thread polls. Nothing here decides anything, and nothing here can fail a run: a
display error is swallowed after one warning.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

MODES = ("live", "lines", "quiet")
POLL_S = 0.5


@dataclass
class _Arm:
    name: str
    stage: str = "waiting"
    started: float | None = None
    ended: float | None = None
    verdict: str | None = None
    progress_file: Path | None = None
    history: list[str] = field(default_factory=list)

    def elapsed(self, now: float) -> float:
        if self.started is None:
            return 0.0
        return (self.ended or now) - self.started


def choose_mode(quiet: bool, stream=None) -> str:
    stream = stream or sys.stderr
    if quiet:
        return "quiet"
    try:
        return "live" if stream.isatty() else "lines"
    except (AttributeError, ValueError):
        return "lines"


class Progress:
    """Thread-safe state of every arm, drawn in one of MODES; use as a context manager."""

    def __init__(self, arms: list[str], mode: str, stream=None):
        if mode not in MODES:
            raise ValueError(f"unknown progress mode {mode!r}")
        self.mode, self.stream = mode, stream or sys.stderr
        self.arms = {n: _Arm(n) for n in arms}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live = None
        self._broken = False

    # ---- state changes (any thread)
    def add(self, arm: str) -> None:
        """A row for a run planned later (a trial, a confirmation alone)."""
        with self._lock:
            self.arms.setdefault(arm, _Arm(arm))

    def start(self, arm: str, progress_file: Path | None = None) -> None:
        with self._lock:
            a = self.arms.setdefault(arm, _Arm(arm))
            a.started, a.progress_file = time.monotonic(), progress_file
        self._set(arm, "starting")

    def stage(self, arm: str, stage: str) -> None:
        self._set(arm, stage)

    def child_done(self, arm: str, stage: str) -> None:
        """The arm's child has ended (its file is no longer polled); its verdict comes later."""
        with self._lock:
            self.arms[arm].progress_file = None
            self.arms[arm].ended = time.monotonic()
        self._set(arm, stage)

    def finish(self, arm: str, verdict: str | None, stage: str = "done") -> None:
        with self._lock:
            a = self.arms[arm]
            a.ended, a.verdict, a.progress_file = a.ended or time.monotonic(), verdict, None
        self._set(arm, stage)

    def note(self, text: str) -> None:
        """A line about the whole run (the KV comparison, say)."""
        if self.mode == "lines":
            self._line(text)

    def _set(self, arm: str, stage: str) -> None:
        with self._lock:
            a = self.arms[arm]
            if a.stage == stage:
                return
            a.stage = stage
            a.history.append(stage)
            elapsed = a.elapsed(time.monotonic())
            verdict = a.verdict
        if self.mode == "lines":
            tail = f": {verdict}" if verdict and stage == "done" else ""
            self._line(f"arm {arm}: {stage}{tail} ({elapsed:.0f} s)")

    def _line(self, text: str) -> None:
        try:
            print(f"[kvkit {time.strftime('%H:%M:%S')}] {text}", file=self.stream, flush=True)
        except (OSError, ValueError):
            pass

    # ---- polling the children's progress files, redrawing
    def _poll_once(self) -> None:
        with self._lock:
            files = [(a.name, a.progress_file) for a in self.arms.values() if a.progress_file is not None]
        for name, path in files:
            try:
                stage = json.loads(path.read_text(encoding="utf-8")).get("stage")
            except (OSError, ValueError):
                continue
            if isinstance(stage, str):
                with self._lock:
                    still_running = self.arms[name].progress_file is not None
                if still_running:
                    self._set(name, stage)

    def _table(self):
        from rich.table import Table

        now = time.monotonic()
        table = Table(title="kvkit", expand=False)
        for col in ("arm", "stage", "elapsed", "verdict"):
            table.add_column(col)
        with self._lock:
            for a in self.arms.values():
                table.add_row(a.name, a.stage, f"{a.elapsed(now):.0f} s", a.verdict or "")
        return table

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self._poll_once()
                if self._live is not None:
                    self._live.update(self._table())
            except Exception as exc:  # noqa: BLE001 - a display must never break a run
                if not self._broken:
                    self._broken = True
                    print(f"[kvkit] progress display stopped: {exc}", file=sys.stderr)

    def __enter__(self):
        if self.mode == "live":
            try:
                from rich.console import Console
                from rich.live import Live

                self._live = Live(
                    self._table(), console=Console(file=self.stream), refresh_per_second=4, transient=False
                )
                self._live.start()
            except Exception:  # noqa: BLE001 - no terminal after all: fall back to lines
                self._live, self.mode = None, "lines"
        if self.mode != "quiet":
            self._thread = threading.Thread(target=self._run, name="kvkit-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._live is not None:
            try:
                self._live.update(self._table())
                self._live.stop()
            except Exception as err:  # noqa: BLE001 - the run's result does not depend on the display
                print(f"[kvkit] progress display: {err}", file=sys.stderr)
