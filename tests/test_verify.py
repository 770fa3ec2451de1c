"""The verification run's own promises about what is on disk after an interrupt or a failed write,
in-process with the stand-in engine (tests/fake_engine.py proves failure handling only)."""

from __future__ import annotations

import json
import math
import os
import signal
import threading

import pytest
from test_cli_failures import OLD_LOG, OLD_REPORT, _args, _env, assert_untouched, setup  # noqa: F401 - setup is a fixture

from repro import verify
from repro.errors import EXIT_OK, EXIT_RUNTIME


@pytest.fixture
def fake_env(setup, monkeypatch):  # noqa: F811 - the imported fixture
    for name, value in _env(setup).items():
        monkeypatch.setenv(name, value)
    return setup


@pytest.mark.parametrize("other_thread", [False, True])
def test_an_interrupt_right_after_the_report_is_published_says_so_and_keeps_its_exit_code(
    fake_env, monkeypatch, capsys, other_thread
):
    """Bug c: Ctrl-C delivered as the publish block ends used to print 'no report written, the
    previous one is untouched' and exit 130, both false. With another thread alive the kernel may
    hand the signal to that thread: the hold must work all the same."""
    if other_thread:
        stop = threading.Event()
        threading.Thread(target=stop.wait, daemon=True).start()
    real_write = verify.write_bytes_atomic

    def write_then_ctrl_c(path, data):
        real_write(path, data)
        os.kill(os.getpid(), signal.SIGINT)  # held by deferred_signals until the publish block ends

    monkeypatch.setattr(verify, "write_bytes_atomic", write_then_ctrl_c)
    code = verify.main(_args(fake_env, "--kv-connector", "ExampleConnector"))
    err = capsys.readouterr().err
    report = json.loads(fake_env["report"].read_text())
    assert report["complete"] is True and [a["verdict"] for a in report["arms"]] == ["PASS", "PASS"]
    assert code == EXIT_OK  # the report's own exit code: the run had completed
    assert "after the run completed" in err and "no report written" not in err and "untouched" not in err
    assert sorted(p.name for p in fake_env["logs"].iterdir()) == ["ExampleConnector.log", "baseline.log"]
    if other_thread:
        stop.set()


def test_an_interrupt_before_publishing_leaves_the_old_report_and_exits_130(fake_env, monkeypatch, capsys):
    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(verify, "publish_logs", ctrl_c)
    assert verify.main(_args(fake_env, "--kv-connector", "ExampleConnector")) == 130
    assert "no report written, the previous one is untouched" in capsys.readouterr().err
    assert_untouched(fake_env)


def test_a_report_that_cannot_be_serialized_changes_nothing_on_disk(fake_env, monkeypatch, capsys):
    """Bug d: the new arm logs used to be swapped in before the report was serialized, so a NaN
    left new logs beside the old report."""
    real_assemble = verify.assemble

    def with_nan(*args, **kwargs):
        report = real_assemble(*args, **kwargs)
        report["arms"][1]["timing"]["wall_s"] = math.nan
        return report

    monkeypatch.setattr(verify, "assemble", with_nan)
    assert verify.main(_args(fake_env, "--kv-connector", "ExampleConnector")) == EXIT_RUNTIME
    assert "no report written" in capsys.readouterr().err
    assert fake_env["report"].read_bytes() == OLD_REPORT
    assert (fake_env["logs"] / "baseline.log").read_bytes() == OLD_LOG
    assert_untouched(fake_env)


def test_a_report_that_breaks_its_schema_is_never_written(fake_env, monkeypatch, capsys):
    real_assemble = verify.assemble

    def off_schema(*args, **kwargs):
        report = real_assemble(*args, **kwargs)
        report["arms"][1]["verdict"] = "MAYBE"
        return report

    monkeypatch.setattr(verify, "assemble", off_schema)
    assert verify.main(_args(fake_env, "--kv-connector", "ExampleConnector")) == EXIT_RUNTIME
    assert "does not match schemas/report.schema.json at arms/1/verdict" in capsys.readouterr().err
    assert_untouched(fake_env)
