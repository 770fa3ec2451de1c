"""A GGUF file read with numpy alone: header, metadata, tensor table, and dequantization of the types
a packaged model uses (F32, F16, Q4_0, Q4_1, Q8_0).

Written from the format (ggml's gguf.h and ggml-quants.c) rather than with the `gguf` package, so that
the package's own reading stays an independent check of this one (tests/test_models_check.py). Every
count and offset read from the file is checked against the file's size before it is used: a corrupt or
truncated file is a GGUFError (one line, exit 2), never a huge allocation or a numpy traceback.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from repro.errors import UsageError

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# Metadata value types (gguf.h enum gguf_type): struct format, or None for the variable-size ones.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# ggml tensor types this reader dequantizes: id -> (name, elements per block, bytes per block).
TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 8: ("Q8_0", 32, 34)}
MAX_DIMS = 4


class GGUFError(UsageError):
    """The file is not a GGUF this reader can use (corrupt, truncated, an unsupported type): one line."""


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # numpy order (slowest first): GGUF's ne reversed, so a weight reads (out, in)
    type_id: int
    offset: int  # absolute, in the file

    @property
    def type_name(self) -> str:
        return TYPES[self.type_id][0]

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def n_bytes(self) -> int:
        _, per_block, block_bytes = TYPES[self.type_id]
        return self.n_elements // per_block * block_bytes


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    version: int
    metadata: dict
    tensors: tuple[Tensor, ...]
    size: int

    def field(self, key: str, kind: type | tuple[type, ...] = object):
        """A metadata value that must be there, of the kind asked for."""
        if key not in self.metadata:
            raise GGUFError(f"{self.path}: metadata {key} missing")
        value = self.metadata[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise GGUFError(f"{self.path}: metadata {key} has an unexpected type ({type(value).__name__})")
        return value

    def tensor(self, name: str) -> Tensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise GGUFError(f"{self.path}: tensor {name} missing")

    def read(self, tensor: Tensor):
        """The tensor as float32, in numpy order."""
        import numpy as np

        with open(self.path, "rb") as fh:
            fh.seek(tensor.offset)
            raw = fh.read(tensor.n_bytes)
        if len(raw) != tensor.n_bytes:
            raise GGUFError(f"{self.path}: truncated inside tensor {tensor.name}")
        return dequantize(np.frombuffer(raw, dtype=np.uint8), tensor.type_id).reshape(tensor.shape)


class _Cursor:
    """Reads little-endian values from the header bytes; running past the end is a GGUFError."""

    def __init__(self, data: bytes, path: Path, size: int):
        self.data, self.pos, self.path, self.size = data, 0, path, size

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise GGUFError(
                f"{self.path}: truncated or corrupt header (needs byte {self.pos + n}, has {len(self.data)})"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def count(self, what: str, each: int = 1) -> int:
        """A u64 count, refused when that many items of at least `each` bytes cannot fit in the file."""
        n = self.unpack("<Q")
        if n * each > self.size:
            raise GGUFError(f"{self.path}: corrupt header ({what} {n} cannot fit in {self.size} bytes)")
        return n

    def string(self) -> str:
        raw = self.take(self.count("string length"))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path}: corrupt header (a string is not UTF-8)") from None

    def value(self, vtype: int, depth: int = 0):
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY and depth == 0:
            item_type = self.unpack("<I")
            n = self.count("array length")
            if item_type in _SCALARS:  # fixed size: read at once
                fmt = _SCALARS[item_type]
                width = struct.calcsize(fmt)
                return list(struct.unpack(f"<{n}{fmt[1:]}", self.take(n * width))) if n else []
            return [self.value(item_type, depth + 1) for _ in range(n)]
        raise GGUFError(f"{self.path}: corrupt header (unknown metadata value type {vtype})")


def _header_bytes(path: Path, size: int) -> bytes:
    # Tokenizer vocabularies make headers of a few MB; read up to 64 MB, never more than the file.
    with open(path, "rb") as fh:
        return fh.read(min(size, 64 << 20))


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse a GGUF file's header and tensor table, checking that every tensor lies inside the file."""
    path = Path(path)
    try:
        size = path.stat().st_size
        data = _header_bytes(path, size)
    except IsADirectoryError:
        raise GGUFError(f"{path}: is a directory, not a GGUF file") from None
    except FileNotFoundError:
        raise GGUFError(f"{path}: no such file") from None
    cur = _Cursor(data, path, size)
    if size < 24 or cur.take(4) != MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (no GGUF magic)")
    version = cur.unpack("<I")
    if version not in SUPPORTED_VERSIONS:
        raise GGUFError(f"{path}: GGUF version {version} (this reader knows {SUPPORTED_VERSIONS})")
    n_tensors = cur.count("tensor count", 24)
    n_kv = cur.count("metadata count", 12)
    metadata = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.unpack("<I"))
    infos = [_tensor_info(cur) for _ in range(n_tensors)]
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment % 8:
        raise GGUFError(f"{path}: corrupt header (general.alignment {alignment!r})")
    base = cur.pos + (-cur.pos % alignment)
    tensors = tuple(_place(path, size, base, *info) for info in infos)
    return GGUFFile(path=path, version=version, metadata=metadata, tensors=tensors, size=size)


def _tensor_info(cur: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    name = cur.string()
    n_dims = cur.unpack("<I")
    if not 1 <= n_dims <= MAX_DIMS:
        raise GGUFError(f"{cur.path}: corrupt tensor table ({name}: {n_dims} dimensions)")
    ne = [cur.unpack("<Q") for _ in range(n_dims)]
    return name, tuple(reversed(ne)), cur.unpack("<I"), cur.unpack("<Q")


def _place(path: Path, size: int, base: int, name: str, shape: tuple[int, ...], type_id: int, rel: int) -> Tensor:
    if type_id not in TYPES:
        raise GGUFError(f"{path}: tensor {name} has ggml type {type_id}, which this reader does not dequantize")
    tensor = Tensor(name=name, shape=shape, type_id=type_id, offset=base + rel)
    per_block = TYPES[type_id][1]
    if any(d <= 0 for d in shape) or shape[-1] % per_block:
        raise GGUFError(f"{path}: corrupt tensor table ({name}: shape {list(shape)} for {tensor.type_name})")
    if tensor.offset + tensor.n_bytes > size:
        raise GGUFError(
            f"{path}: truncated (tensor {name} ends at byte {tensor.offset + tensor.n_bytes}, the file has {size})"
        )
    return tensor


def dequantize(raw, type_id: int):
    """Blocks of one ggml type as a flat float32 array (ggml-quants.c's dequantize_row_* in numpy)."""
    import numpy as np

    name, _, block_bytes = TYPES[type_id]
    if name == "F32":
        return raw.view("<f4").astype(np.float32)
    if name == "F16":
        return raw.view("<f2").astype(np.float32)
    blocks = raw.reshape(-1, block_bytes)
    d = blocks[:, 0:2].copy().view("<f2").astype(np.float32)  # (n, 1)
    if name == "Q8_0":
        q = blocks[:, 2:].view(np.int8).astype(np.float32)
        return (d * q).reshape(-1)
    if name == "Q4_1":
        m = blocks[:, 2:4].copy().view("<f2").astype(np.float32)
        qs = blocks[:, 4:]
    else:  # Q4_0: 4-bit values centred on 8, no offset
        m = None
        qs = blocks[:, 2:]
    # Each byte holds element j in its low nibble and element j + 16 in its high one.
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
    out = d * q + m if m is not None else d * (q - 8.0)
    return out.astype(np.float32).reshape(-1)
