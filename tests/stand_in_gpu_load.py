"""A stand-in for the GPU-load neighbour (repro.engine.gpu_load), for the lifecycle tests of repro.run.gpu_load
only: it loads nothing and needs no torch, but writes the same status file.

Run as `python -m tests.stand_in_gpu_load` with the child's flags (--devices, --status,
--seconds-per-report; --n accepted). The environment variable KVKIT_STAND_IN_LOAD (JSON) tells it how
to behave:
  {"delay_s": S,            say "starting" for S seconds before "running"
   "never_ready": true,     say "starting" for ever
   "exit_before_ready": N,  exit with status N instead of running
   "crash_after_s": S,      once running, exit with status 1 after S seconds
   "ignore_term": true,     ignore SIGTERM (only SIGKILL stops it)
   "grandchild": true,      start a sleeping grandchild in its process group first
   "pid_dir": DIR}          write its pid to DIR/load.pid (and the grandchild's to DIR/grandchild.pid)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from repro.engine.gpu_load import parse_args, status_document, utc_now, write_status

TFLOPS = 1.5
N = 256


def write_pid(pid_dir: str | None, name: str, pid: int) -> None:
    if pid_dir:
        path = Path(pid_dir) / f"{name}.pid"
        path.with_suffix(".tmp").write_text(str(pid))
        path.with_suffix(".tmp").replace(path)  # whole or absent: the tests poll for it


def main() -> int:
    args = parse_args(sys.argv[1:])
    spec = json.loads(os.environ.get("KVKIT_STAND_IN_LOAD", "{}"))
    asked: list[int] = []
    signal.signal(signal.SIGTERM, signal.SIG_IGN if spec.get("ignore_term") else lambda s, f: asked.append(s))
    if spec.get("grandchild"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        write_pid(spec.get("pid_dir"), "grandchild", child.pid)
    write_pid(spec.get("pid_dir"), "load", os.getpid())
    print(f"stand-in gpu-load: pid {os.getpid()}, devices {args.devices}, visible "
          f"{os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)  # fmt: skip
    started, t0 = utc_now(), time.monotonic()
    iterations = 0

    def devices() -> list[dict]:
        return [
            {"device": d, "name": "Stand-in GPU", "n": N, "dtype": "float16", "streams": 1,
             "iterations": iterations, "tflops": TFLOPS if iterations else 0.0, "reserved_bytes": 3 * N * N * 2}
            for d in args.devices
        ]  # fmt: skip

    ready_at = None if spec.get("never_ready") else t0 + spec.get("delay_s", 0)
    while not asked:
        now = time.monotonic()
        if "exit_before_ready" in spec and now - t0 >= spec.get("delay_s", 0):
            print("stand-in gpu-load: giving up before it ran", flush=True)
            return spec["exit_before_ready"]
        running = ready_at is not None and now >= ready_at
        if running:
            iterations += 10
            if "crash_after_s" in spec and now - ready_at >= spec["crash_after_s"]:
                print("stand-in gpu-load: crashing", flush=True)
                os._exit(1)
        write_status(args.status, status_document("running" if running else "starting", started, devices()))
        time.sleep(min(args.seconds_per_report, 0.1))
    write_status(args.status, status_document("stopped", started, devices()))
    print("stand-in gpu-load: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
