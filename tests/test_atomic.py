"""The one writer: a reader sees the old file or the whole new one, even when the writer is
killed with SIGKILL at any point."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from kvkit_testutil import ROOT

from repro.record.atomic import dumps_json, write_json_atomic

# The child alternates two large, distinct documents into one path as fast as it can.
WRITER = """
import sys
from repro.record.atomic import write_json_atomic
path = sys.argv[1]
docs = [{"kind": "doc", "which": w, "payload": [w * 7] * 200000} for w in (1, 2)]
write_json_atomic(path, docs[0])
print("ready", flush=True)  # from here on every kill lands in the middle of some write
i = 1
while True:
    write_json_atomic(path, docs[i % 2])
    i += 1
"""


def test_kill_9_at_random_points_never_leaves_a_partial_file(tmp_path):
    target = tmp_path / "report.json"
    write_json_atomic(target, {"kind": "doc", "which": 0, "payload": []})
    valid = {0, 1, 2}
    rng = random.Random(6)
    seen = set()
    for _ in range(15):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(target)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        raw = target.read_bytes()
        data = json.loads(raw)  # never truncated
        assert data["which"] in valid
        assert raw.decode() == dumps_json(data)  # complete, byte for byte
        seen.add(data["which"])
    assert seen == {1, 2}, "the kills never caught both documents: the test proved little"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "report.json"]
    assert all(n.startswith(".report.json.") and n.endswith(".tmp") for n in leftovers), leftovers


def test_writes_are_deterministic_and_refuse_unknown_types(tmp_path):
    target = tmp_path / "a.json"
    write_json_atomic(target, {"b": 1, "a": [1, "é"]})
    assert target.read_text(encoding="utf-8") == '{\n  "a": [\n    1,\n    "é"\n  ],\n  "b": 1\n}\n'
    write_json_atomic(target, {"b": 1, "a": [1, 2]})
    assert target.read_text(encoding="utf-8") == '{\n  "a": [1, 2],\n  "b": 1\n}\n'
    try:
        write_json_atomic(target, {"x": object()})
    except TypeError:
        pass
    else:
        raise AssertionError("an unknown type was serialized")
    assert json.loads(target.read_text())["b"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_arrays_of_plain_numbers_stay_on_one_line_and_the_text_parses_back_exactly():
    import random

    from repro.record.atomic import dumps_json

    sample = {"ids": [3, -1, 2**40], "grid": [[0.5, None], [True, 1e-7]], "s": "[1,  2]", "e": [], "d": {}}
    assert dumps_json(sample) == (
        '{\n  "d": {},\n  "e": [],\n  "grid": [\n    [0.5, null],\n    [true, 1e-07]\n  ],\n'
        '  "ids": [3, -1, 1099511627776],\n  "s": "[1,  2]"\n}\n'
    )
    rng = random.Random(7)
    leaves = [None, True, False, 0, -3, 1.5e-7, 2**53, -0.0, "a", "[1,\\n 2]", "x\ny", "é", 1e300]

    def value(depth=0):
        r = rng.random()
        if depth > 3 or r < 0.3:
            return rng.choice(leaves)
        if r < 0.6:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        return {f"{rng.choice('abé1')}{i}": value(depth + 1) for i in range(rng.randint(0, 4))}

    for _ in range(2000):
        obj = value()
        text = dumps_json(obj)
        assert json.loads(text) == json.loads(json.dumps(obj))
        assert json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) == json.dumps(
            obj, indent=2, sort_keys=True, ensure_ascii=False
        )
    with pytest.raises(ValueError):
        dumps_json({"x": float("nan")})
