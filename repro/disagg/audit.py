"""The KV audit of a served P→D pair (`python -m repro pd --kv-audit`): how the servers are configured, and the
block digests read back from what the audit wrote.

Built on the verifier's audit (repro.engine.kvaudit, docs/kv-audit.md), unchanged:
  reference  `vllm serve` with the passive recorder (KVAuditObserver, kv_role kv_producer as the verifier's: it
             loads and stores nothing) in place of no connector: it writes every request's computed full blocks
             (`<seq>.computed.<layer>.pt`, with `<seq>.json`).
  consumer   `vllm serve` with the auditing subclass of NixlConnector (the audit's WRAPPED class, its target named
             by KVKIT_KV_AUDIT_TARGET=NixlConnector, kv_role kv_consumer): NIXL loads asynchronously, so the audit
             reads a request's blocks at the first forward step after the worker reported its receive done,
             exactly what attention then reads (`<seq>.reused.<layer>.pt`: the reused full blocks, its own
             prefix-cache hit first, then the received ones). The worker asks NixlConnector.get_transfer_results
             from vLLM 0.30 (which never calls get_finished; get_finished before), and the audit reads whichever the
             installed vLLM has; a receive NIXL reports failed (failed_recving) is never read: its record says so
             in `unavailable` (repro.engine.kvaudit_hooks).
  producer   unchanged (no audit).
Each server writes to a folder of its own under the audit folder. The pair sends one request at a time
(--max-num-seqs 1), so a request's record is the one of its prompt (its prompt_sha256) written after the request was
sent (record_files taken before it, new_record after): never the newest in the folder, which may be an earlier run's
or, for a request that wrote none, the previous request's. `repro pd` refuses an audit folder that holds anything
(an earlier run's records) unless --force, and then removes the audited servers' folders first (clear_records).

A block's digest is the SHA-256 of its bytes in every layer, K then V (the files' [blocks, 2, elements] rows, read
from the saved tensor's storage without torch), so two digests are equal only where the KV is bit for bit; repro.judge.pd_kvaudit names the received blocks by them.
Not run on a GPU yet: NIXL needs one (tests/gpu/h200_conditions.sh pd-audit is the step).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

from repro.paths import KIT_ROOT

# repro.engine.kvaudit's names (that module imports vLLM; the kit's process need not have it): a test holds them equal
AUDIT_MODULE = "repro.engine.kvaudit"
WRAPPED = "KVAuditWrapped"
OBSERVER = "KVAuditObserver"
OBSERVER_ROLE = "kv_producer"  # not kv_both: repro.engine.kvaudit says why
AUDIT_TARGET_ENV = "KVKIT_KV_AUDIT_TARGET"
AUDIT_DIR_ENV = "KVKIT_KV_AUDIT_DIR"
TARGET = "NixlConnector"
AUDITED = ("reference", "consumer")  # the servers that write records, each into <audit folder>/<name>


def audited_transfer_config(role: str | None) -> dict:
    """The kv_transfer_config of an audited server: the recorder for the reference (role None), NixlConnector
    wrapped for the consumer."""
    if role is None:
        return {"kv_connector": OBSERVER, "kv_connector_module_path": AUDIT_MODULE, "kv_role": OBSERVER_ROLE}
    if role != "kv_consumer":
        raise ValueError(f"only the reference and the consumer are audited, not {role}")
    return {"kv_connector": WRAPPED, "kv_connector_module_path": AUDIT_MODULE, "kv_role": role}


def audit_env(env: dict[str, str], folder: Path, role: str | None) -> dict[str, str]:
    """The server's environment with the audit's settings: its records folder, the wrapped target (the consumer),
    the HND KV layout, and the kit on PYTHONPATH (the engine's processes import repro.engine.kvaudit by module path)."""
    path = ":".join(p for p in (str(KIT_ROOT), env.get("PYTHONPATH", "")) if p)
    # the reference takes the consumer's KV layout (NIXL's HND), so that both write blocks alike
    out = dict(env) | {AUDIT_DIR_ENV: str(folder), "PYTHONPATH": path, "VLLM_KV_CACHE_LAYOUT": "HND"}
    return out | ({AUDIT_TARGET_ENV: TARGET} if role == "kv_consumer" else {})


def prompt_sha256(token_ids) -> str:
    """What names a request in the audit's records (repro.engine.kv_blocks.prompt_sha256, which imports torch)."""
    return hashlib.sha256(json.dumps([int(t) for t in token_ids]).encode()).hexdigest()


def clear_records(folder: Path) -> None:
    """`repro pd --force`: the records an earlier run left in the audit folder removed before any server starts
    (every audited server's folder, all that the audit reads), so that none is read as this run's; anything else
    in the folder is left as it is."""
    for name in AUDITED:
        path = folder / name
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)


def record_files(folder: Path) -> dict[str, tuple[int, int]]:
    """Every `<seq>.json` in `folder` now, by name: (inode, mtime in ns); {} for a folder not there. Taken just
    before a request is sent, it is the lower bound that makes the request's record its own (new_record)."""
    out = {}
    for path in folder.glob("[0-9]*.json"):
        try:
            st = path.stat()
        except OSError:
            continue
        out[path.name] = (st.st_ino, st.st_mtime_ns)
    return out


def new_record(folder: Path, prompt_sha256: str, before: dict[str, tuple[int, int]]) -> dict | None:
    """The record of that prompt that a request wrote after `before` (record_files taken just before it was sent):
    a file not there then, or replaced since (each server's seq starts again at 0, so a re-run into the same folder
    writes an earlier run's names anew: that run's other records stay as they were and are never read). The first
    by seq where there are several (the same request scheduled anew: its first is its own first load, as
    repro.engine.audit_records keeps it); None: the request wrote none, and then no other request's record stands
    in for it."""
    found = []
    for name, stamp in sorted(record_files(folder).items()):
        if before.get(name) == stamp:
            continue
        try:
            rec = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if rec.get("prompt_sha256") == prompt_sha256:
            found.append(rec)
    return min(found, key=lambda r: int(r.get("seq", -1))) if found else None


def _storage_bytes(path: Path) -> bytes | None:
    """The one storage of a tensor torch.save wrote (a zip whose `<name>/data/0` holds its bytes in order: the audit
    saves a contiguous CPU copy, repro.engine.kv_blocks.split_planes), read without torch (the kit's process may
    not have it); None when the file is not one such."""
    try:
        with zipfile.ZipFile(path) as zf:
            data = [n for n in zf.namelist() if n.split("/")[-2:-1] == ["data"]]
            return zf.read(data[0]) if len(data) == 1 else None
    except (OSError, zipfile.BadZipFile, KeyError):
        return None


def block_digests(folder: Path, record: dict, kind: str) -> tuple[str | None, ...] | None:
    """Each full block's digest over every layer (K then V: a block's [2, elements] bytes) from
    `<seq>.<kind>.<layer>.pt`; None where the record says the audit could not read the request, or a layer's file
    is missing, torn or not the record's number of blocks."""
    if record.get("unavailable"):
        return None
    count = int(record.get(f"{kind}_blocks") or 0)
    if count == 0:
        return ()
    hashes = [hashlib.sha256() for _ in range(count)]
    for li in range(len(record.get("layers") or [])):
        raw = _storage_bytes(folder / f"{int(record['seq']):06d}.{kind}.{li:03d}.pt")
        if raw is None or len(raw) % count:
            return None
        size = len(raw) // count
        for b in range(count):
            hashes[b].update(raw[b * size : (b + 1) * size])
    return tuple(h.hexdigest()[:32] for h in hashes)
