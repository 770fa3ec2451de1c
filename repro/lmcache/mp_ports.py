"""Whether the LMCache MP server the kit started is the one answering on its ports: its health check and
the connector's port (probe_ready), and the listening sockets held by its own process group, not by another
process that bound a port the kit picked and released (foreign_listeners: another cell's server). `server`
is a started repro.lmcache.mp.MPServer (its pid, port and http_port)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import urllib.request
from pathlib import Path

from repro.run.lifeline import group_members

HEALTH_PATH = "/healthcheck"
_PROBE_TIMEOUT_S = 1.0
# No proxy for a loopback health check, whatever http_proxy says.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def probe_ready(host: str, port: int, http_port: int, timeout_s: float = _PROBE_TIMEOUT_S) -> bool:
    """The HTTP health check says healthy and the connector's port accepts a connection."""
    try:
        with _OPENER.open(f"http://{host}:{http_port}{HEALTH_PATH}", timeout=timeout_s) as response:
            healthy = response.status == 200 and json.loads(response.read(4096)).get("status") == "healthy"
        if healthy:
            with socket.create_connection((host, port), timeout=timeout_s):
                return True
    except (OSError, ValueError, AttributeError, http.client.HTTPException):
        pass  # not up yet (refused, 503, half-started, not JSON)
    return False


def read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _listening_inodes(port: int) -> set[int] | None:
    """The inodes of the TCP sockets listening on this port (this network namespace), or None where
    /proc cannot say."""
    inodes, readable = set(), False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for row in rows:
            f = row.split()  # sl local_address rem_address st ... inode
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(int(f[9]))
    return inodes if readable else None


def _socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets a process holds open (empty where it is gone or not ours to read)."""
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


def foreign_listeners(server) -> set[int] | None:
    """None when the server's own process group holds the sockets listening on both its ports (or
    /proc cannot tell, as off Linux); else the inodes of the listening sockets it does not hold
    (empty: nothing listens there any more)."""
    ours: set[int] = set()
    for pid in group_members(server.pid):
        ours |= _socket_inodes(pid)
    foreign: set[int] | None = None
    for port in (server.http_port, server.port):
        inodes = _listening_inodes(port)
        if inodes is not None and not inodes & ours:
            foreign = (foreign or set()) | inodes
    return foreign


def who_answered(foreign: set[int] | None, server) -> str:
    """What answered on the server's ports in its place, for the start failure's detail."""
    if foreign is None:
        return ""
    holders = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit() and _socket_inodes(int(entry)) & foreign:
            holders.append(f"pid {entry} ({read_text(Path(f'/proc/{entry}/comm')).strip() or '?'})")
    by = ", ".join(holders) or "a process the kit cannot see"
    return f"; its ports answered from {by}, not the server the kit started (pid {server.pid})"
