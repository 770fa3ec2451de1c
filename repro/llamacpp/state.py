"""A llama.cpp sequence's KV state (llama_state_seq_get_data) read as the kit reads vLLM's blocks: per cell its
position and, per layer, its K row and V row as bytes. The layout is llama.cpp's llama_kv_cache::state_write
(src/llama-kv-cache.cpp at the vendored commit), after llama_context::state_seq_get_data's header (u32 magic
0xaf143cd8, i32 seq_id): u32 n_stream; per stream u32 cell_count and, where it is not 0,
each cell's meta (i32 pos, u32 n_seq_id, the seq IDs as i32; models with M-RoPE or per-layer n-gram embeddings add a
cell extension, which this reader refuses), then u32 v_trans, u32 n_layer, per layer K (i32 type, u64 row size,
cell_count rows), then per layer V: the same when not transposed, else (i32 type, u32 element size, u32 n_embd_v_gqa,
n_embd_v_gqa runs of cell_count elements). Cells come in cache order, not position order: positions come from the
meta. numpy only (the llama.cpp environment has no torch)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MAGIC = 0xAF143CD8  # llama-context.cpp io_magic


class StateFormatError(ValueError):
    """A blob this reader cannot read as written (said, never guessed)."""


@dataclass(frozen=True)
class LayerRows:
    k_type: int
    k_offset: int  # where its first cell's K row starts in the blob
    k_row: int  # bytes per cell
    v_type: int
    v_offset: int
    v_row: int  # bytes per cell (transposed: n_embd_v_gqa elements of v_elem bytes, strided)
    v_elem: int  # transposed only: bytes per element; 0 when V rows are contiguous


@dataclass(frozen=True)
class SeqState:
    blob: bytes
    positions: tuple[int, ...]  # per cell, in the blob's order
    v_trans: bool
    layers: tuple[LayerRows, ...]

    @property
    def cells(self) -> int:
        return len(self.positions)

    def cell_of(self) -> dict[int, int]:
        """position -> cell index (a sequence holds each position once)."""
        return {p: c for c, p in enumerate(self.positions)}

    def planes(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer `layer`'s K and V as [cells, row bytes] (uint8 views of the blob; V de-transposed)."""
        lay, raw = self.layers[layer], np.frombuffer(self.blob, dtype=np.uint8)
        k = raw[lay.k_offset : lay.k_offset + self.cells * lay.k_row].reshape(self.cells, lay.k_row)
        if not self.v_trans:
            v = raw[lay.v_offset : lay.v_offset + self.cells * lay.v_row].reshape(self.cells, lay.v_row)
        else:
            n = lay.v_row // lay.v_elem
            v = raw[lay.v_offset : lay.v_offset + self.cells * lay.v_row].reshape(n, self.cells, lay.v_elem)
            v = v.transpose(1, 0, 2).reshape(self.cells, lay.v_row)
        return k, v

    def rows(self, positions: list[int]) -> np.ndarray:
        """[layers, 2 (K, V), len(positions), row bytes] as uint8: the bytes each position holds."""
        where = self.cell_of()
        missing = [p for p in positions if p not in where]
        if missing:
            raise StateFormatError(f"the sequence holds no cell at positions {missing[:8]}")
        if any(lay.k_row != lay.v_row or lay.k_row != self.layers[0].k_row for lay in self.layers):
            raise StateFormatError("layers with different K/V row sizes are not read")
        cells = np.array([where[p] for p in positions], dtype=np.int64)
        out = np.empty((len(self.layers), 2, len(positions), self.layers[0].k_row), dtype=np.uint8)
        for li in range(len(self.layers)):
            k, v = self.planes(li)
            out[li, 0], out[li, 1] = k[cells], v[cells]
        return out


class _Reader:
    def __init__(self, blob: bytes):
        self.blob, self.at = blob, 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.at + size > len(self.blob):
            raise StateFormatError(f"the blob ends at byte {len(self.blob)}, inside a field at {self.at}")
        (value,) = struct.unpack_from(fmt, self.blob, self.at)
        self.at += size
        return value

    def skip(self, n: int) -> int:
        start = self.at
        if start + n > len(self.blob):
            raise StateFormatError(f"the blob ends at byte {len(self.blob)}, inside {n} bytes of rows at {start}")
        self.at += n
        return start


def parse(blob: bytes, n_seq_max: int = 1) -> SeqState:
    """One sequence's state, as llama_state_seq_get_data wrote it: a single-stream cache, or one stream per sequence
    (llama-server's slots without a unified KV) where only the sequence's own stream holds cells."""
    r = _Reader(blob)
    magic = r.take("<I")
    if magic != MAGIC:
        raise StateFormatError(f"magic {magic:#x}, not llama.cpp's sequence state ({MAGIC:#x})")
    r.take("<i")  # the sequence it was taken from
    n_stream = r.take("<I")
    found = None
    for stream in range(n_stream):
        cells = r.take("<I")
        if cells == 0:
            continue
        if found is not None:
            raise StateFormatError(f"streams {found[0]} and {stream} both hold cells of the sequence")
        found = (stream, _stream(r, cells, n_seq_max))
    if r.at != len(blob):
        raise StateFormatError(f"{len(blob) - r.at} bytes after the last layer's V rows: not this layout")
    if found is None:
        return SeqState(blob, (), False, ())
    positions, v_trans, layers = found[1]
    return SeqState(blob, positions, v_trans, layers)


def _stream(r: _Reader, cells: int, n_seq_max: int) -> tuple[tuple[int, ...], bool, tuple[LayerRows, ...]]:
    """One stream's cells: their positions (meta), then each layer's K and V rows."""
    positions = []
    for _ in range(cells):
        positions.append(r.take("<i"))
        n_seq = r.take("<I")
        if n_seq > max(n_seq_max, 1) or n_seq == 0:
            raise StateFormatError(f"a cell names {n_seq} sequences (a cell extension, or another layout)")
        for _ in range(n_seq):
            r.take("<i")
    v_trans, n_layer = bool(r.take("<I")), r.take("<I")
    keys = []
    for _ in range(n_layer):
        k_type, k_row = r.take("<i"), r.take("<Q")
        keys.append((k_type, r.skip(cells * k_row), k_row))
    layers = []
    for k_type, k_offset, k_row in keys:
        v_type = r.take("<i")
        if not v_trans:
            v_row = r.take("<Q")
            layers.append(LayerRows(k_type, k_offset, k_row, v_type, r.skip(cells * v_row), v_row, 0))
        else:
            v_elem, n_embd = r.take("<I"), r.take("<I")
            layers.append(
                LayerRows(k_type, k_offset, k_row, v_type, r.skip(cells * v_elem * n_embd), v_elem * n_embd, v_elem)
            )
    return tuple(positions), v_trans, tuple(layers)


def zero_positions(state: SeqState, positions: list[int]) -> bytes:
    """The blob with the K and V rows of these positions zeroed in every layer (the planted fault)."""
    out = np.frombuffer(state.blob, dtype=np.uint8).copy()
    where = state.cell_of()
    cells = np.array([where[p] for p in positions], dtype=np.int64)
    for lay in state.layers:
        out[lay.k_offset : lay.k_offset + state.cells * lay.k_row].reshape(state.cells, lay.k_row)[cells] = 0
        if not state.v_trans:
            out[lay.v_offset : lay.v_offset + state.cells * lay.v_row].reshape(state.cells, lay.v_row)[cells] = 0
        else:
            n = lay.v_row // lay.v_elem
            out[lay.v_offset : lay.v_offset + state.cells * lay.v_row].reshape(n, state.cells, lay.v_elem)[:, cells] = 0
    return out.tobytes()
