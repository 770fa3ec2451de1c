"""A stand-in for LMCache's MP server, for the lifecycle tests of repro.lmcache.mp only; it caches nothing.

Run as `python -m tests.stand_in_mp_server` with the flags the kit gives the real server
(`--host --port --http-host --http-port`; the others are accepted and ignored). Once ready it
accepts TCP connections on --port (where the connector would speak ZMQ) and answers
`GET /healthcheck` on --http-port as LMCache's HTTP API does (200 {"status": "healthy"}; 503
before). The environment variable KVKIT_STAND_IN (JSON) tells it how to behave:
  {"delay_s": S,           ready only after S seconds (it listens, and answers 503, meanwhile)
   "never_ready": true,    listen and answer 503 for ever
   "exit_before_ready": N, exit with status N instead of becoming ready
   "crash_after_s": S,     once ready, exit with status 1 after S seconds
   "ignore_term": true,    ignore SIGTERM (only SIGKILL stops it)
   "grandchild": true,     start a sleeping grandchild in its process group first
   "pid_dir": DIR}         write its pid to DIR/server.pid (and the grandchild's to DIR/grandchild.pid)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

READY = threading.Event()


class Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.path == "/healthcheck" and READY.is_set()
        body = json.dumps({"status": "healthy"} if ok else {"status": "unhealthy"}).encode()
        self.send_response(200 if ok else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        print(f"stand-in http: {format % args}", flush=True)


def accept_forever(sock: socket.socket) -> None:
    while True:
        conn, _ = sock.accept()
        conn.close()


def write_pid(pid_dir: str | None, name: str, pid: int) -> None:
    if pid_dir:
        path = Path(pid_dir) / f"{name}.pid"
        path.with_suffix(".tmp").write_text(str(pid))
        path.with_suffix(".tmp").replace(path)  # whole or absent: the tests poll for it


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--http-host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, required=True)
    args, ignored = parser.parse_known_args()
    spec = json.loads(os.environ.get("KVKIT_STAND_IN", "{}"))
    if spec.get("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # before the pid files say it is up
    if spec.get("grandchild"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        write_pid(spec.get("pid_dir"), "grandchild", child.pid)
    write_pid(spec.get("pid_dir"), "server", os.getpid())
    print(f"stand-in MP server: pid {os.getpid()}, ignored flags {ignored}", flush=True)

    zmq_side = socket.create_server((args.host, args.port))
    threading.Thread(target=accept_forever, args=(zmq_side,), daemon=True).start()
    http_side = ThreadingHTTPServer((args.http_host, args.http_port), Health)
    threading.Thread(target=http_side.serve_forever, daemon=True).start()

    time.sleep(spec.get("delay_s", 0))
    if "exit_before_ready" in spec:
        print("stand-in MP server: giving up before it was ready", flush=True)
        sys.exit(spec["exit_before_ready"])
    if not spec.get("never_ready"):
        READY.set()
        print("stand-in MP server: ready", flush=True)
    if "crash_after_s" in spec:
        time.sleep(spec["crash_after_s"])
        print("stand-in MP server: crashing", flush=True)
        os._exit(1)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
