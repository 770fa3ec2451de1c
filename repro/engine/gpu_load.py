"""The GPU-load neighbour (child side): back-to-back matrix products on each given GPU until SIGTERM.

`python -m repro.engine.gpu_load --devices 0,1 --status FILE [--seconds-per-report 1]` runs, on each
listed CUDA device (ordinals as this process sees them: the parent sets CUDA_VISIBLE_DEVICES), one
thread that keeps a few streams full of float16 products of two n x n matrices, and writes a small
JSON status file (STATUS_KIND) about once a second: per device its name, n, dtype, iterations and
measured TFLOP/s. `state` is "starting" until every device finished its first product, "running"
after, and "stopped" (clean SIGTERM) or "failed" (a device raised; exit 1) at the end.

Why: a connector whose copies are not ordered on the right CUDA stream can read KV before it is
written; on an idle GPU the copy usually wins the race anyway, so such a bug shows only under load
(issue 18). This process is the load, run beside the reuse arms by repro.run.gpu_load (the parent side).

It must never starve the arms: its memory is capped (MAX_BYTES per device, n halved until the
matrices fit), and it must stop at once: the threads check a flag between products and synchronize
every SYNC_EVERY rounds, so a SIGTERM ends it within a few products (tens of milliseconds).

torch is imported inside functions, so tests/stand_in_gpu_load.py and the parent's tests can use
the status format without it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass

from repro import __version__
from repro.record.atomic import write_bytes_atomic

# The status file the parent (repro.run.gpu_load) polls; it checks kind and version (keep them equal there).
# Version 1: state, pid, started_utc, last_utc, error (if any),
# devices[{device, name, n, dtype, streams, iterations, tflops, reserved_bytes}].
STATUS_KIND = "kvkit-gpu-load-status"
STATUS_SCHEMA_VERSION = 1
DTYPE = "float16"
DEFAULT_N = 8192  # 1.1 TFLOP a product: a few milliseconds on an H100/H200, long enough to fill every SM
STREAMS = 3  # products in flight per device, so the SMs stay busy across kernel boundaries
SYNC_EVERY = 4  # rounds (STREAMS products each) between synchronizations: bounds the stop latency
MAX_BYTES = 4 * 2**30  # per device, all matrices together: the arms keep the rest
MIN_N = 1024
_POLL_S = 0.05


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def matrices_bytes(n: int, streams: int, itemsize: int = 2) -> int:
    """Two shared inputs and one output per stream."""
    return (2 + streams) * n * n * itemsize


def size_for(total_bytes: int, streams: int = STREAMS, n: int = DEFAULT_N) -> int:
    """n for a device of total_bytes: DEFAULT_N, halved until the matrices take at most MAX_BYTES and
    a twentieth of the device (never below MIN_N)."""
    cap = min(MAX_BYTES, total_bytes // 20)
    while n > MIN_N and matrices_bytes(n, streams) > cap:
        n //= 2
    return n


@dataclass
class DeviceLoad:
    """One device's counters, written by its thread and read by the status writer."""

    device: int
    name: str = ""
    n: int = 0
    streams: int = STREAMS
    iterations: int = 0  # products completed (counted at each synchronization)
    reserved_bytes: int = 0  # what torch's allocator holds on the device for this load
    timed_iterations: int = 0  # those since the clock started (after the first, warm-up product)
    clock_start: float | None = None
    clock_last: float | None = None

    @property
    def tflops(self) -> float:
        if self.clock_start is None or self.clock_last is None or self.clock_last <= self.clock_start:
            return 0.0
        return round(2 * self.n**3 * self.timed_iterations / (self.clock_last - self.clock_start) / 1e12, 2)

    def to_json(self) -> dict:
        return {
            "device": self.device,
            "name": self.name,
            "n": self.n,
            "dtype": DTYPE,
            "streams": self.streams,
            "iterations": self.iterations,
            "tflops": self.tflops,
            "reserved_bytes": self.reserved_bytes,
        }


def status_document(
    state: str,
    started_utc: str,
    devices: list[dict],
    error: str | None = None,
    *,
    kind: str = STATUS_KIND,
    key: str = "devices",
) -> dict:
    """The status file's content (the stand-in in tests/ writes the same; repro.engine.cpu_load too,
    with its own kind and its `workers` for `devices`)."""
    doc = {
        "kind": kind,
        "schema_version": STATUS_SCHEMA_VERSION,
        "tool_version": __version__,
        "state": state,
        "pid": os.getpid(),
        "started_utc": started_utc,
        "last_utc": utc_now(),
        key: devices,
    }
    if error is not None:
        doc["error"] = error
    return doc


def write_status(path: str, doc: dict) -> None:
    write_bytes_atomic(path, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def run_device(load: DeviceLoad, stop: threading.Event, n: int | None) -> None:
    """Keep one device busy until stop is set."""
    import torch

    dev = torch.device("cuda", load.device)
    torch.cuda.set_device(dev)
    props = torch.cuda.get_device_properties(dev)
    load.name = props.name
    load.n = n or size_for(props.total_memory, load.streams)
    gen = torch.Generator(device=dev).manual_seed(load.device)
    # values in [-1, 1) scaled so the products stay finite in float16 (no inf/nan slow paths)
    a = (torch.rand(load.n, load.n, device=dev, dtype=torch.float16, generator=gen) * 2 - 1) / load.n**0.5
    b = (torch.rand(load.n, load.n, device=dev, dtype=torch.float16, generator=gen) * 2 - 1) / load.n**0.5
    streams = [torch.cuda.Stream(device=dev) for _ in range(load.streams)]
    outs = [torch.empty(load.n, load.n, device=dev, dtype=torch.float16) for _ in streams]
    torch.matmul(a, b, out=outs[0])  # warm-up: cuBLAS picks its kernel outside the timed window
    torch.cuda.synchronize(dev)
    load.reserved_bytes = torch.cuda.memory_reserved(dev)
    load.iterations = 1
    load.clock_start = load.clock_last = time.monotonic()
    while not stop.is_set():
        for _ in range(SYNC_EVERY):
            for stream, out in zip(streams, outs):
                with torch.cuda.stream(stream):
                    torch.matmul(a, b, out=out)
        torch.cuda.synchronize(dev)
        done = SYNC_EVERY * len(streams)
        load.iterations += done
        load.timed_iterations += done
        load.clock_last = time.monotonic()


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m repro.engine.gpu_load", description=__doc__.splitlines()[0])
    p.add_argument("--devices", required=True, help="CUDA ordinals, comma-separated (as this process sees them)")
    p.add_argument("--status", required=True, help="the JSON status file, rewritten about once a report interval")
    p.add_argument("--seconds-per-report", type=float, default=1.0)
    p.add_argument("--n", type=int, default=None, help="matrix size (default: sized to each device)")
    args = p.parse_args(argv)
    try:
        args.devices = [int(d) for d in args.devices.split(",") if d.strip()]
    except ValueError:
        p.error(f"--devices {args.devices!r}: CUDA ordinals, comma-separated")
    if not args.devices or args.seconds_per_report <= 0 or (args.n is not None and args.n < 1):
        p.error("--devices must name a device; --seconds-per-report and --n must be positive")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    stop = threading.Event()  # tells the device threads; set by the main thread only
    asked: list[int] = []  # a handler must not take a lock (Event.set does): it only appends
    signal.signal(signal.SIGTERM, lambda signum, frame: asked.append(signum))
    signal.signal(signal.SIGINT, lambda signum, frame: asked.append(signum))
    started = utc_now()
    loads = [DeviceLoad(d) for d in args.devices]
    errors: list[str] = []

    def guarded(load: DeviceLoad) -> None:
        try:
            run_device(load, stop, args.n)
        except Exception as exc:  # noqa: BLE001 - any device failing ends the whole load (exit 1)
            errors.append(f"device {load.device}: {type(exc).__name__}: {exc}"[:600])
            traceback.print_exc()
            stop.set()

    threads = [threading.Thread(target=guarded, args=(ld,), name=f"gpu-load-{ld.device}") for ld in loads]
    for t in threads:
        t.start()
    print(f"kvkit gpu-load: pid {os.getpid()}, devices {args.devices}, status {args.status}", flush=True)
    announced, next_report = False, 0.0
    while not (asked or stop.is_set()):
        if time.monotonic() >= next_report:
            running = all(ld.clock_start is not None for ld in loads)
            if running and not announced:
                print("kvkit gpu-load: running " + ", ".join(f"{ld.name} n={ld.n}" for ld in loads), flush=True)
                announced = True
            doc = status_document("running" if running else "starting", started, [ld.to_json() for ld in loads])
            write_status(args.status, doc)
            next_report = time.monotonic() + args.seconds_per_report
        time.sleep(_POLL_S)  # a signal wakes it; its handler has run when it returns
    stop.set()
    for t in threads:
        t.join()
    state = "failed" if errors else "stopped"
    final = status_document(state, started, [ld.to_json() for ld in loads], "; ".join(errors) or None)
    write_status(args.status, final)
    print(f"kvkit gpu-load: {state} " + ", ".join(f"{ld.iterations} products, {ld.tflops} TFLOP/s" for ld in loads),
          flush=True)  # fmt: skip
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
