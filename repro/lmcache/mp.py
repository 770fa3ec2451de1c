"""LMCache's multi-process (MP) server for an LMCacheMPConnector arm: started, checked and stopped by the kit.

The kit starts the server itself, as its own process group on a lifeline (repro.run.lifeline), on free
ports, with its output in its own log beside the arm logs; it waits until the server answers its
health check, hands the arm the connector settings that point at it, and stops the whole group
when the arm is over, however it ends (normal exit, exception, Ctrl-C; kill -9 of the kit through
the lifeline). Its two failures are named: LMCACHE_SERVER_START (did not start, or not ready in
time) and LMCACHE_SERVER_DIED (exited while the arm ran), each with the tail of the server's log.
No vllm, torch or lmcache import here: the parent only starts a command and speaks TCP and HTTP.

What this is built on, read from the released wheels (vLLM 0.26.0 and LMCache 0.5.4 from the GPU
bundle's site-packages, LMCache 0.5.5rc5, 0.5.5 and 0.5.6 wheels; paths relative to the package):

- How vLLM finds the connector. `KVConnectorFactory` registers "LMCacheMPConnector" to
  `vllm/distributed/kv_transfer/kv_connector/v1/lmcache_mp_connector.py` (`factory.py:170-174`).
  That module's `LMCacheMPConnector` is LMCache's own class,
  `lmcache.integration.vllm.lmcache_mp_connector.LMCacheMPConnector`, when it imports, and vLLM's
  built-in `LMCacheMPConnectorUpstream` (`:464`) only on ImportError or with
  `LMCACHE_USE_UPSTREAM_MP` set (`:1200-1226`). The file is byte-identical in vLLM 0.26.0 and 0.28.0.
- Where it finds the server: `kv_connector_extra_config` keys `lmcache.mp.host` (default
  "tcp://localhost") and `lmcache.mp.port` (default 5555), joined as f"{host}:{port}" (vLLM's
  built-in class `:485-502`; LMCache 0.5.6 `integration/vllm/lmcache_mp_connector.py:626-650`,
  which prefers `lmcache.mp.server_urls` when set and adds "tcp://" to a bare host, `:518`; 0.5.4
  `:285-289`, 0.5.5 and 0.5.5rc5 `:514-518`). Also read: `lmcache.mp.mq_timeout` (300 s),
  `lmcache.mp.heartbeat_interval` (10 s), and in 0.5.6 `lmcache.mp.hash_algorithm` ("blake3"),
  which must match the server's --hash-algorithm (0.5.6
  `integration/vllm/vllm_multi_process_adapter.py:123-151`).
- What the connector does with it: the adapter asks the server for its chunk size when it is
  built, waiting up to mq_timeout, and raises ConnectionError("Cannot reach the LMCache MP server
  ...") when nothing answers (0.5.6 `vllm_multi_process_adapter.py:760-768, 305-332`); the chunk
  size must be a multiple of vLLM's block size (`:779-784`). A server that stops answering later
  is not an error: "LMCache server is unhealthy — entering degraded mode" (`:614`; 0.5.4 `:473`)
  and lookups are dropped (recompute, zero hits). Hence LMCACHE_SERVER_DIED: the kit must see the
  death itself rather than read a silent recompute.
- The launch command (the same flags in 0.5.4, 0.5.5rc5, 0.5.5 and 0.5.6):
  `python -m lmcache.v1.multiprocess.http_server --host H --port P --http-host H --http-port Q
  --chunk-size 256 --l1-size-gb G --eviction-policy LRU`. `--host/--port` bind the ZMQ request
  server the connector dials (defaults localhost:5555; 0.5.6 `v1/multiprocess/config.py:369-379`,
  chunk size `:381`, hash algorithm `:422`); `--http-host/--http-port` the HTTP API (defaults
  127.0.0.1:8080, `:721-733`); `--l1-size-gb` (the CPU memory pool) and `--eviction-policy` are
  required (argparse `required=True` in 0.5.4 `v1/distributed/config.py:377,467`, 0.5.5 and
  0.5.5rc5 `:428,519`; a ValueError in 0.5.6 `:1071-1074`). The http_server variant starts no
  Prometheus port (it passes `start_prometheus_http_server=False`, `http_server.py:89`), where
  `python -m lmcache.v1.multiprocess.server` would bind 9090. `lmcache server ...` (console script
  `lmcache`, 0.5.6 `cli/commands/server.py`) is the same server. 0.5.6's own auto-start
  (`integration/vllm/mp_server_launcher.py`, extra_config `lmcache.mp.autostart`, `:26`) runs
  this module with `--host/--port/--http-host` only (`:312-324`), so its HTTP port is always 8080,
  and starts it with a bare Popen from inside the engine's worker, with no log of its own and no
  stop tied to the adapter ("Server survival after vLLM exit is not guaranteed", `:415`): that is
  why the kit starts the server itself and leaves auto-start off.
- Readiness. uvicorn binds the HTTP port only after the FastAPI lifespan ran `run_cache_server`
  (`http_server.py:69-157`; uvicorn 0.54.0 `server.py:115-116` awaits lifespan startup before it
  creates the listening server), and `GET /healthcheck` answers 200 {"status": "healthy"} once
  the engine is set, 503 before (`v1/multiprocess/http_apis/info_api.py:41-60`, the same file in
  0.5.4 and 0.5.6). The kit's probe: that answer, and a TCP connection to the ZMQ port, and then
  that the sockets listening on both ports belong to the process group the kit started (the kit
  picks free ports and releases them, so another cell's server on this host may bind one first and
  answer healthy: repro.lmcache.mp_ports, from /proc/net/tcp and the group's open sockets). (0.5.6's
  auto-start probes with a ZMQ PING instead, `mp_server_launcher.py:481-511`, which needs
  lmcache's own client in the parent.) The log lines "LMCache HTTP server initialized" (0.5.6
  `http_server.py:155`, 0.5.4 `:163`) and "LMCache cache server is running..." (0.5.6
  `server.py:511`) say the same but their wording moves between versions, so they are not probed.
  On SIGTERM uvicorn runs the lifespan's shutdown (`http_server.py:159-177`: request server and
  engine closed).
- The server is a GPU process: it initializes the accelerator (0.5.6 `server.py:508`) and by
  default moves KV itself through CUDA IPC handles the workers register
  (`--supported-transfer-mode lmcache_driven`, `config.py:438-446`), so it must see the arm's GPU
  (the arm's CUDA_VISIBLE_DEVICES). Its loads are asynchronous: `get_num_new_matched_tokens`
  returns `(need_to_load, need_to_load > 0)` (0.5.6 `lmcache_mp_connector.py:1351`) and
  `wait_for_layer_load` does nothing (`:940-951`).
- Versions. LMCache 0.5.4 (resolved with vllm==0.26.0 into the bundle), 0.5.5rc5, 0.5.5 and 0.5.6
  all ship both the server module and the external connector, and the connector's vLLM imports
  all exist in vLLM 0.26.0 (`distributed/kv_events.py` BlockStored/BlockRemoved/KVEventAggregator/
  KVConnectorKVEvents, `v1/core/kv_cache_utils.py:79` maybe_convert_block_hash, `base.py:85`
  SupportsHMA; KVConnectorTransferResults is absent from 0.26.0 and LMCache falls back, 0.5.6
  `lmcache_mp_connector.py:24-32`). Compatible by code reading; not run here (no GPU).
- Its copy path. The server imports LMCache, and so decides for itself whether its compiled ops
  load (repro.lmcache.ops): the kit asks the server's interpreter, in the server's env, whether
  `lmcache.cuda_ops` imports (while the server starts), and reads the server's log afterwards for
  LMCache's fallback warning; `MPServer.copy_path` says which it ran, or "not recorded" and why.
  Read in 0.5.4's source: without the compiled ops the server's store has no
  `execute_object_group_transfer` (`v1/multiprocess/modules/lmcache_driven_transfer.py:60-62`) and
  takes the per-object loop (`:502-620`): the torch fallback's gather into the staging buffer runs
  on the context's torch stream (`:1057-1060`; `v1/platform/cuda/cache_context.py:414`, a torch
  stream, which torch creates non-blocking), then with the lazy L1 allocator (`--l1-use-lazy`, on by
  default, `v1/distributed/config.py:382-387`) the device-to-host copy is
  `torch_ops.lmcache_memcpy_async` (`v1/gpu_connector/gpu_ops.py:85-93`), a ctypes `cudaMemcpy` on the
  legacy default stream (`v1/platform/torch_ops.py:2198-2210`), which a non-blocking stream is not
  ordered with: nothing orders the copy after the gather. `--no-l1-use-lazy` takes the
  `copy_(non_blocking=True)` branch on the same stream instead (`gpu_ops.py:94-97`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from repro.contract.failure import LMCACHE_SERVER_DIED, LMCACHE_SERVER_START, Failure
from repro.judge import logscan
from repro.lmcache import ops as lmcache_ops
from repro.lmcache.mp_ports import HEALTH_PATH, foreign_listeners, probe_ready, read_text, who_answered
from repro.run.runner import (
    deferred_signals,
    kill_group,
    redact_log,
    redacted_tail,
    start_child,
    starting,
    stop_starting,
)

FAILURE_KINDS = (LMCACHE_SERVER_START, LMCACHE_SERVER_DIED)
CONNECTOR = "LMCacheMPConnector"
SERVER_MODULE = "lmcache.v1.multiprocess.http_server"
READY_TIMEOUT_S = 180.0  # imports torch and LMCache, then sets up its memory pool and CUDA
STOP_GRACE_S = 10.0  # SIGTERM to SIGKILL: uvicorn's shutdown closes the engine and frees its pool
_POLL_S = 0.2
_PROBE_GRACE_S = 2.0


def server_log_path(workdir: Path, arm_name: str) -> Path:
    """The server's log, named after the arm it serves and kept beside that arm's log."""
    return workdir / f"{arm_name}.lmcache-server.log"


@dataclass(frozen=True)
class ServerSettings:
    """What the server is started with (the connector reads its chunk size from the server)."""

    chunk_size: int = 256  # fixtures/lmcache-local-cpu.yaml's chunk_size
    l1_size_gb: float = 4.0  # its max_local_cpu_size: the same CPU pool as the in-process arm
    eviction_policy: str = "LRU"
    # LMCache's default lazy L1 allocator rounds its size up to whole 64 MiB pinned chunks (LMCache 0.5.4:
    # LazyMemoryAllocator.PIN_CHUNK_SIZE), so an L1 of a few MB is really 64 MiB; False passes
    # --no-l1-use-lazy, an L1 of exactly l1_size_gb
    l1_use_lazy: bool = True
    host: str = "127.0.0.1"
    module: str = SERVER_MODULE
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.chunk_size <= 0 or self.l1_size_gb <= 0:
            raise ValueError(f"chunk_size and l1_size_gb must be positive: {self}")

    def command(self, python: str, port: int, http_port: int) -> list[str]:
        return [
            python,
            "-m",
            self.module,
            "--host",
            self.host,
            "--port",
            str(port),
            "--http-host",
            self.host,
            "--http-port",
            str(http_port),
            "--chunk-size",
            str(self.chunk_size),
            "--l1-size-gb",
            f"{self.l1_size_gb:g}",
            "--eviction-policy",
            self.eviction_policy,
            *(() if self.l1_use_lazy else ("--no-l1-use-lazy",)),
            *self.extra_args,
        ]


class ServerError(Exception):
    """The server did not start (LMCACHE_SERVER_START) or died under the arm (LMCACHE_SERVER_DIED).
    `copy_path`: the server's (MPServer.copy_path), once mp_server has stopped it; None if it never ran."""

    def __init__(self, kind: str, detail: str, log_tail: str = "") -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail, self.log_tail = kind, detail, log_tail
        self.copy_path: dict | None = None

    def failure(self) -> Failure:
        return Failure(self.kind, self.detail, self.log_tail)


def free_ports(host: str, n: int) -> list[int]:
    """n distinct ports free on host now (held together while picked, so they differ). Another
    process may take one before the server binds it: then the server exits and the start fails
    with its log saying so."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(n)]
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]


def exit_text(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


@dataclass(eq=False)  # identity: live servers are kept in a set
class MPServer:
    """A running server: where it listens, whether it lives, its log."""

    proc: subprocess.Popen
    settings: ServerSettings
    command: list[str]
    port: int  # the connector's (ZMQ)
    http_port: int  # the health check's
    log_path: Path
    env: dict[str, str]
    ready_s: float | None = None
    stopping: bool = False  # set once the kit stops it: an exit after that is no death
    ops_probe: dict | None = None  # repro.lmcache.ops.probe(..., ops=True) in the server's env
    copy_path: dict | None = None  # server_copy_path(), set when mp_server has stopped the server

    @property
    def pid(self) -> int:
        return self.proc.pid  # the group's leader (lifeline execs the server in place) and its pgid

    def extra_config(self) -> dict:
        """The kv_connector_extra_config entries that point LMCacheMPConnector at this server."""
        return {"lmcache.mp.host": f"tcp://{self.settings.host}", "lmcache.mp.port": self.port}

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check(self) -> None:
        """Raise LMCACHE_SERVER_DIED if the server has exited (call it after the arm, and whenever)."""
        if not self.alive():
            raise ServerError(
                LMCACHE_SERVER_DIED,
                f"the LMCache MP server exited while the arm ran ({self.how_it_ended()})",
                self.log_tail(),
            )

    def how_it_ended(self) -> str:
        return "stopped by the kit" if self.stopping else exit_text(self.proc.returncode)

    def log_tail(self) -> str:
        return redacted_tail(self.log_path, self.env)

    def record(self) -> dict:
        """What a report may keep about the server."""
        return {
            "command": self.command[1:],  # the interpreter's path is provenance's business
            "port": self.port,
            "http_port": self.http_port,
            "ready_s": self.ready_s,
            "log": self.log_path.name,
            "returncode": self.proc.returncode,
            "copy_path": self.copy_path,
        }


# Servers started and not yet reaped, from any thread: an interrupt reaches the main thread only,
# which then stops every one (stop_all_servers), as repro.run.runner.stop_all_children does for arms.
_LIVE: set[MPServer] = set()
_LIVE_LOCK = threading.Lock()


def stop_all_servers(grace_s: float = STOP_GRACE_S) -> None:
    """No server (nor any child) starts any more (repro.run.runner.stop_starting: a server registers under
    that stop's lock), and every live server's group is stopped; a thread still waiting for one to be
    ready then fails at once."""
    stop_starting()
    with _LIVE_LOCK:
        live = list(_LIVE)
    for server in live:
        server.stopping = True
        kill_group(server.proc, grace_s=grace_s)


@contextlib.contextmanager
def mp_server(
    python: str,
    log_path: Path,
    env: dict[str, str],
    *,
    ready_timeout_s: float = READY_TIMEOUT_S,
    settings: ServerSettings | None = None,
    stop_grace_s: float = STOP_GRACE_S,
    on_death: Callable[[MPServer], None] | None = None,
    probe_ops: bool = True,
) -> Iterator[MPServer]:
    """Start the server, wait until it is ready, yield it; on leaving, stop and reap its whole group.

    `python` must have lmcache; `env` is the arm's (runner.child_env plus its GPU slot). A server
    that exits or is not ready within ready_timeout_s raises ServerError(LMCACHE_SERVER_START).
    `on_death(server)` runs once, from a watcher thread, if the server exits while the block runs
    (to stop the arm early); server.check() after the arm raises LMCACHE_SERVER_DIED either way.
    After the block, `server.copy_path` (and a ServerError's `copy_path`) says which copy path the
    server ran (server_copy_path); `probe_ops` False leaves out the import probe behind it."""
    settings = settings or ServerSettings()
    ports = free_ports(settings.host, 2)
    command = settings.command(python, *ports)
    t0 = time.monotonic()
    try:
        with starting():  # the run is not stopping; a stop meanwhile waits, then sees this server
            proc, lifeline = start_child(command, log_path=log_path, env=env)
            server = MPServer(proc, settings, command, ports[0], ports[1], log_path, env)
            with _LIVE_LOCK:
                _LIVE.add(server)
    except OSError as exc:
        raise ServerError(LMCACHE_SERVER_START, f"the LMCache MP server could not be started: {exc}") from exc
    probe = _OpsProbe(python, env) if probe_ops else None  # runs while the server starts: no wall time
    watcher = None
    failed: ServerError | None = None
    ended_well = False
    try:
        wait_ready(server, t0 + ready_timeout_s, ready_timeout_s)
        server.ready_s = round(time.monotonic() - t0, 3)
        if on_death is not None:
            watcher = threading.Thread(target=_watch, args=(server, on_death), name="kvkit-lmcache-mp", daemon=True)
            watcher.start()
        yield server
        ended_well = True
    except ServerError as exc:
        failed = exc
        raise
    finally:
        server.stopping = True
        with deferred_signals():  # a second Ctrl-C must not leave the group half stopped
            kill_group(proc, grace_s=stop_grace_s if proc.poll() is None else 0)  # leftovers: at once
            with _LIVE_LOCK:
                _LIVE.discard(server)
            os.close(lifeline)  # only now: its watcher was reaped with the group
            if watcher is not None:
                watcher.join()
        redact_log(log_path, env)  # the group is gone: the file can be rewritten
        # a failed or interrupted start is reported at once: the probe gets a moment, not its timeout
        wait_s = lmcache_ops.PROBE_TIMEOUT_S if ended_well else _PROBE_GRACE_S
        server.ops_probe = probe.result(wait_s) if probe is not None else None
        server.copy_path = server_copy_path(server.ops_probe, read_text(log_path))
        if failed is not None:
            failed.copy_path = server.copy_path


class _OpsProbe:
    """repro.lmcache.ops.probe(python, env, ops=True) on a thread of its own (the same interpreter and
    env as the server: what it answers is what the server's own `import lmcache` met)."""

    def __init__(self, python: str, env: dict[str, str]) -> None:
        self._out: dict = {"problem": "the probe did not finish"}
        self._thread = threading.Thread(target=self._run, args=(python, env), name="kvkit-lmcache-ops", daemon=True)
        self._thread.start()

    def _run(self, python: str, env: dict[str, str]) -> None:
        self._out = lmcache_ops.probe(python, env, ops=True, versions=False)

    def result(self, timeout_s: float) -> dict:
        self._thread.join(timeout_s)
        return self._out


def server_copy_path(probe: dict | None, log_text: str) -> dict:
    """Which copy path the server ran: {"path": "compiled" | "fallback" | "not recorded", "source",
    "detail"}. LMCache's fallback warning in the server's log decides "fallback"; the import probe
    in its env says "compiled" (and from where) or gives the import error; neither: "not recorded"."""
    ops = (probe or {}).get("ops") or {}
    warning = lmcache_ops.FALLBACK_WARNING
    warned = next((x[x.index(warning) :] for x in map(logscan.clean_line, log_text.splitlines()) if warning in x), None)
    error = None if ops.get("imports") else ops.get("error")
    if warned:
        because = f"{lmcache_ops.OPS_MODULE}: {error}" if ops.get("lmcache_imports") and error else None
        return {"path": "fallback", "source": None, "detail": because or f"LMCache logged: {warned[:300]}"}
    if ops.get("imports"):
        source, where = ops_source(ops.get("file"))
        return {"path": "compiled", "source": source, "detail": where}
    if ops.get("lmcache_imports"):
        return {"path": "fallback", "source": None, "detail": f"{lmcache_ops.OPS_MODULE}: {error}"}
    if probe is None:
        why = "the import probe was off and the server's log has no fallback warning"
    else:
        why = f"the server's interpreter cannot import lmcache ({error or probe.get('problem')})"
    return {"path": "not recorded", "source": None, "detail": why}


def ops_source(ops_file: str | None) -> tuple[str | None, str]:
    """("kit build", its dir) when the ops file is in a kit build's tree (repro.lmcache.ops), else ("wheel", the file)."""
    if not ops_file:
        return None, "no file"
    build_dir = Path(ops_file).resolve().parent.parent.parent
    if (build_dir / lmcache_ops.MANIFEST_NAME).is_file():
        return "kit build", str(build_dir)
    return "wheel", ops_file


def wait_ready(server: MPServer, deadline: float, timeout_s: float) -> None:
    """Poll until the server is ready: its ports answer (probe_ready) and the sockets listening there
    are its own group's (foreign_listeners); raise LMCACHE_SERVER_START if it exits or the deadline
    passes, saying who answered in its place if anyone did."""
    foreign: set[int] | None = None  # what answered in its place, once something did
    while True:
        if not server.alive():
            who = who_answered(foreign, server)
            raise ServerError(
                LMCACHE_SERVER_START,
                f"the LMCache MP server exited before it was ready ({server.how_it_ended()}){who}",
                server.log_tail(),
            )
        if probe_ready(server.settings.host, server.port, server.http_port):
            foreign = foreign_listeners(server)
            if foreign is None:
                return
        if time.monotonic() >= deadline:
            where = f"http://{server.settings.host}:{server.http_port}{HEALTH_PATH} and port {server.port}"
            who = who_answered(foreign, server)
            raise ServerError(
                LMCACHE_SERVER_START,
                f"the LMCache MP server was not ready within {timeout_s:g} s ({where}){who}",
                server.log_tail(),
            )
        time.sleep(_POLL_S)


def _watch(server: MPServer, on_death: Callable[[MPServer], None]) -> None:
    while not server.stopping:
        if server.proc.poll() is not None:
            if not server.stopping:
                on_death(server)
            return
        time.sleep(_POLL_S)
