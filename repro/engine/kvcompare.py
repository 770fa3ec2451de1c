"""The KV audit's comparison: every reused block x layer x K/V plane against the baseline's KV.

`python -m repro.engine.kvcompare JOB.json OUT.json`, started by the parent after the arms ran.
It reads the tensors repro.engine.kvaudit wrote (the baseline's reference blocks and each audited
arm's reused or computed blocks), one layer of one request at a time, and writes raw figures per
cell: bit-identical or not, max |difference| and ||difference|| / ||reference|| (in float32). For a
cell that is not identical it names what the loaded bytes equal when they equal something known:
another block of the same prompt, a block of another probe's prompt (same layer), the other plane,
or zeros; and when they equal nothing exactly, the reference block-plane nearest them by relative
error where it is nearer than the cell's own position (the parent keeps it when it is within the
arm's floor: the same KV drifted as a prefill drifts). It decides nothing: classes and verdicts are the parent's (repro.judge.kvaudit, repro.judge.verdict).

JOB: {"reference": {"dir": D, "probes": {probe: seq}},
      "arms": [{"name": A, "dir": D, "sources": [probe, ...] (what its cells may be named after; absent: any),
                "requests": [{"probe": P, "index": i, "seq": s, "kind": "reused"|"computed",
                                                    "layers": n}]}]}
OUT: {"arms": {A: {P: {str(index): {"kind", "num_blocks", "layers", "planes": {"K": {"identical", "max_abs", "rel"},
      "V": ...}, "matches": [{"layer", "plane", "block", "source", "probe", "src_block", "src_plane", "rel"}],
      "error"}}}}}
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys

import torch

from repro.record.atomic import dumps_json, write_bytes_atomic

PLANES = ("K", "V")


def _load(directory: str, seq: int, kind: str, layer: int) -> torch.Tensor | None:
    """One layer's blocks: a .pt from vLLM's audit, or a .npy from llama.cpp's (repro.llamacpp.audit)."""
    path = os.path.join(directory, f"{seq:06d}.{kind}.{layer:03d}.pt")
    if os.path.exists(path):
        return torch.load(path, map_location="cpu", weights_only=True)
    if os.path.exists(path[:-3] + ".npy"):
        import numpy as np

        return torch.from_numpy(np.load(path[:-3] + ".npy", allow_pickle=False))
    return None


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """[..., E] as raw bytes [..., E*itemsize] for bit-exact comparison (NaN == NaN, -0 != +0)."""
    return t.contiguous().view(torch.uint8)


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(_bytes(t).numpy().tobytes()).hexdigest()


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


class ReferenceIndex:
    """What a non-identical cell's bytes equal: every reference block-plane of every probe, per layer, by the
    sha256 of its bytes (equal) and as rows of one matrix (nearest, by relative error)."""

    def __init__(self, ref_dir: str, ref_probes: dict[str, int]):
        self.ref_dir, self.ref_probes = ref_dir, ref_probes
        self._by_layer: dict[int, dict[str, list[tuple[str, int, str]]]] = {}
        self._rows: dict[int, tuple[torch.Tensor, torch.Tensor, list[tuple[str, int, str]]] | None] = {}

    def layer(self, li: int) -> dict[str, list[tuple[str, int, str]]]:
        if li not in self._by_layer:
            index: dict[str, list[tuple[str, int, str]]] = {}
            for probe, seq in sorted(self.ref_probes.items()):
                ref = _load(self.ref_dir, seq, "computed", li)
                if ref is None:
                    continue
                for b in range(ref.shape[0]):
                    for p, plane in enumerate(PLANES):
                        index.setdefault(_digest(ref[b, p]), []).append((probe, b, plane))
            self._by_layer[li] = index
        return self._by_layer[li]

    def rows(self, li: int):
        """(rows [M, D] float32, their norms [M], who each row is) for layer li, or None without references."""
        if li not in self._rows:
            mats, labels = [], []
            for probe, seq in sorted(self.ref_probes.items()):
                ref = _load(self.ref_dir, seq, "computed", li)
                if ref is None:
                    continue
                for p, plane in enumerate(PLANES):
                    mats.append(ref[:, p].reshape(ref.shape[0], -1).float())
                    labels += [(probe, b, plane) for b in range(ref.shape[0])]
            rows = torch.cat(mats) if mats else None
            self._rows[li] = None if rows is None else (rows, rows.norm(dim=1), labels)
        return self._rows[li]

    def source(
        self, li: int, probe: str, block: int, plane: str, loaded: torch.Tensor, sources: set[str] | None = None
    ) -> dict | None:
        """The block-plane whose bytes the loaded ones equal exactly (this probe's own first), or zeros; None when
        none does, or only the cell's own position does. sources: the probes it may be (those the arm's engine was
        sent); None: any."""
        if not bool(_bytes(loaded).any()):
            return _match("zeros", None, None, None, 0.0)
        hits = [h for h in self.layer(li).get(_digest(loaded), []) if sources is None or h[0] in sources]
        hits = [h for h in hits if h[0] == probe] or hits
        hits = [h for h in hits if h != (probe, block, plane)]
        return _labelled(hits[0], probe, block, plane, 0.0) if hits else None

    def nearest(
        self, li: int, probe: str, cells: list[tuple[int, str, torch.Tensor, float | None]], sources=None
    ) -> list:
        """For each cell (block, plane, loaded bytes, its own rel) of one layer: the block-plane of any probe nearest
        the loaded bytes by relative error (of `sources` where given), when it is not the cell's own position and is
        nearer than that (None otherwise); the parent decides whether it is near enough (the floor)."""
        found = self.rows(li)
        if found is None or not cells:
            return [None] * len(cells)
        rows, norms, labels = found
        xs = torch.stack([c[2].reshape(-1).float() for c in cells])  # [k, D]
        # a short list by the expanded distance (one product for the layer), then each candidate's error computed
        # directly, with no cancellation
        approx = ((norms**2)[None, :] - 2 * (xs @ rows.T) + (xs * xs).sum(1)[:, None]).clamp_min(0)
        approx = approx.sqrt() / norms.clamp_min(1e-30)[None, :]
        if sources is not None:  # a prompt the arm's engine was never sent left no KV in it
            barred = torch.tensor([label[0] not in sources and label[0] != probe for label in labels])
            approx[:, barred] = math.inf
        short = approx.topk(min(4, len(labels)), dim=1, largest=False).indices.tolist()
        out = []
        for (block, plane, _, own_rel), x, candidates in zip(cells, xs, short):
            best = None
            for i in candidates:
                if sources is not None and labels[i][0] not in sources and labels[i][0] != probe:
                    continue
                r = float((rows[i] - x).norm() / norms[i]) if float(norms[i]) > 0 else math.inf
                key = (r, labels[i][0] != probe, abs(labels[i][1] - block))
                if best is None or key < best[0]:
                    best = (key, labels[i])
            near = best is not None and math.isfinite(best[0][0]) and best[1] != (probe, block, plane)
            if near and (own_rel is None or best[0][0] < own_rel):
                out.append(_labelled(best[1], probe, block, plane, best[0][0]))
            else:
                out.append(None)
        return out


def _match(source: str, src_probe: str | None, src_block: int | None, src_plane: str | None, rel: float) -> dict:
    return {"source": source, "probe": src_probe, "src_block": src_block, "src_plane": src_plane, "rel": rel}


def _labelled(hit: tuple[str, int, str], probe: str, block: int, plane: str, rel: float) -> dict:
    """A match in the words every comparison writes ('block 92', 'probe chat-511 block 30', 'its V plane',
    'block 5 (V plane)') beside its structured fields."""
    p, b, pl = hit
    if p == probe and b == block:
        return _match(f"its {pl} plane", p, b, pl, rel)  # K and V exchanged
    where = f"block {b}" if p == probe else f"probe {p} block {b}"
    return _match(where if pl == plane else f"{where} ({pl} plane)", p, b, pl, rel)


def compare_request(
    ref_dir: str, ref_seq: int, arm_dir: str, req: dict, index: ReferenceIndex, sources: set[str] | None = None
) -> dict:
    planes = {p: {"identical": [], "max_abs": [], "rel": []} for p in PLANES}
    matches, num_blocks = [], None
    for li in range(int(req["layers"])):
        got = _load(arm_dir, int(req["seq"]), req["kind"], li)
        ref = _load(ref_dir, ref_seq, "computed", li)
        if got is None:
            raise FileNotFoundError(f"no {req['kind']} KV recorded for layer {li}")
        if ref is None:
            raise FileNotFoundError(f"no reference KV recorded for layer {li}")
        n = got.shape[0]
        if n > ref.shape[0]:
            raise ValueError(f"{n} blocks audited but the reference has only {ref.shape[0]}")
        if got.shape[1:] != ref.shape[1:] or got.dtype != ref.dtype:
            raise ValueError(f"block shape/dtype {tuple(got.shape[1:])} {got.dtype} != reference's {ref.dtype}")
        num_blocks = n
        ref = ref[:n]
        same = (_bytes(got) == _bytes(ref)).all(-1)  # [n, 2]
        diff = got.float() - ref.float()
        max_abs = diff.abs().amax(-1)
        dn, rn = diff.norm(dim=-1), ref.float().norm(dim=-1)
        layer_matches: dict[tuple[int, str], dict] = {}
        unknown: list[tuple[int, str, torch.Tensor, float | None]] = []  # no exact match: the nearest, batched
        for p, plane in enumerate(PLANES):
            planes[plane]["identical"].append([bool(v) for v in same[:, p]])
            planes[plane]["max_abs"].append([_num(float(v)) for v in max_abs[:, p]])
            rel = []
            for b in range(n):
                r, d = float(rn[b, p]), float(dn[b, p])
                rel.append(_num(d / r) if r > 0 else (0.0 if d == 0 else None))
                if not bool(same[b, p]):
                    src = index.source(li, req["probe"], b, plane, got[b, p], sources)
                    if src is not None:
                        layer_matches[(b, plane)] = src
                    else:
                        unknown.append((b, plane, got[b, p], rel[-1]))
            planes[plane]["rel"].append(rel)
        for (b, plane, _, _), src in zip(unknown, index.nearest(li, req["probe"], unknown, sources)):
            if src is not None:
                layer_matches[(b, plane)] = src
        matches += [{"layer": li, "plane": pl, "block": b, **src} for (b, pl), src in sorted(layer_matches.items())]
    return {
        "kind": req["kind"],
        "num_blocks": num_blocks or 0,
        "layers": int(req["layers"]),
        "planes": planes,
        "matches": matches,
        "error": None,
    }


def run(job: dict) -> dict:
    ref = job["reference"]
    index = ReferenceIndex(ref["dir"], {p: int(s) for p, s in ref["probes"].items()})
    out: dict = {"arms": {}}
    for arm in job["arms"]:
        per_probe: dict = out["arms"].setdefault(arm["name"], {})
        sources = set(arm["sources"]) if arm.get("sources") is not None else None
        for req in arm["requests"]:
            slot = per_probe.setdefault(req["probe"], {})
            ref_seq = ref["probes"].get(req["probe"])
            try:
                if ref_seq is None:
                    raise LookupError("the baseline recorded no reference KV for this probe")
                slot[str(req["index"])] = compare_request(ref["dir"], int(ref_seq), arm["dir"], req, index, sources)
            except Exception as exc:  # noqa: BLE001 - one request's gap never hides the others
                slot[str(req["index"])] = {"kind": req["kind"], "error": f"{type(exc).__name__}: {exc}"[:500]}
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m repro.engine.kvcompare JOB.json OUT.json", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as fh:
        job = json.load(fh)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    result = run(job)
    write_bytes_atomic(argv[1], dumps_json(result).encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
