"""The weight version format: what a version is, wherever it travels (weights.py tells its life).

THE LAYOUT (`Manifest`). A version's bytes are its tensors' bytes laid end to end in manifest order
(the layout of a safetensors data section, so a version is written to disk as one file:
`write_file`, `read_file`). Chunk i is the byte range [offset_i, offset_i + nbytes_i) of that
stream: a slice of one big tensor, or several small tensors whole. The manifest names the version,
its lineage, each tensor [name, dtype, shape, crc32] and each chunk [nbytes, crc32]; it travels as a
map, checked by `Manifest.from_dict` wherever one is received.

FULL OR ADAPTER. A full version holds every tensor of the policy. An adapter version (LoRA) holds
the adapter's tensors alone (lora.adapter_tensors) and names `base`, the full version of its
lineage it applies to, and `lora`, the config to merge with. `Manifest.is_adapter` says which, once;
a version object (`Version` at a store, `VersionBuffer` at a worker) asks its manifest, and an
adapter version's object holds its base (`.base`), so whoever installs it has both.

CHECKSUMMED ONCE. Each process reads a version's bytes about once: a chunk's CRC is computed as it is
cut (`cut_chunks`) and checked where it lands; a tensor's CRC then follows from its chunks' CRCs
without reading the bytes again (CRC-32 is linear: `crc32_combine`, `crc32_part`,
`Manifest.check_tensors`).
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import mmap
import os
import struct
import typing
import zlib
from dataclasses import dataclass

import numpy as np

import wire

MAX_CHUNK_BYTES = 256 << 20
CHUNK_BYTES = int(float(os.environ.get("RLAX_WEIGHT_CHUNK_MB", "16")) * (1 << 20))
"""Default chunk size of a weight push (RLAX_WEIGHT_CHUNK_MB, default 16 MiB): what a sender or a
receiver holds beyond the version it stores is about one chunk (plus one tensor for the trainer)."""


# ----------------------------------------------------------------------------- checksums

def _fastest_crc32():
    """zlib's CRC-32 function, from the fastest implementation installed: ISA-L's (the `isal` package)
    or zlib-ng's fold with PCLMULQDQ and run at 8-8.5 GB/s where Python's zlib (1.2.13) runs at
    2.5-2.7 GB/s (measured 2026-12-05 on the 2-core AMD EPYC VM, 16 MiB buffers), which matters
    because every process on the weight path reads each byte once for its CRC. The same function
    (polynomial, seed, result), checked here on a known value; all release the GIL."""
    for module in ("isal.isal_zlib", "zlib_ng.zlib_ng"):
        try:
            fn = __import__(module, fromlist=["crc32"]).crc32
            if fn(b"123456789") == 0xCBF43926 and fn(b"6789", fn(b"12345")) == 0xCBF43926:
                return fn
        except (ImportError, AttributeError):
            pass
    return zlib.crc32


crc32_bytes = _fastest_crc32()
"""crc32_bytes(buffer, value=0): zlib.crc32, at the speed of the fastest implementation installed."""


def crc32(array: np.ndarray) -> int:
    """The CRC32 of an array's bytes: what a chunk or a tensor of the manifest carries."""
    return crc32_bytes(memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8)))


# CRC-32 is linear over GF(2), so crc(A + B) follows from crc(A), crc(B) and len(B) alone: appending
# n zero bytes to A's register is a 32x32 bit matrix Z(n), and crc(A + B) = Z(len B) crc(A) ^ crc(B).
# Z is invertible (the polynomial's constant term is 1), so a part's CRC also follows from the whole's
# and the other parts'. The weight path uses this so that each process reads a version's bytes about
# once: the chunk CRCs, checked as chunks arrive, give the tensors' CRCs (Manifest.check_tensors).
# A matrix is a list of 32 ints, column j being the matrix applied to bit j; _ZEROS[k] = Z(2**k),
# _UNZEROS[k] its inverse.
def _gf2_apply(matrix: list, vector: int) -> int:
    out, j = 0, 0
    while vector:
        if vector & 1:
            out ^= matrix[j]
        vector, j = vector >> 1, j + 1
    return out


def _byte_powers(one_bit: list) -> list:
    """[M(2**k bytes) for k in 0..63] from the one-bit matrix M, by squaring (2, 4, 8 bits, ...)."""
    ops = [one_bit]
    for _ in range(3 + 63):
        ops.append([_gf2_apply(ops[-1], col) for col in ops[-1]])
    return ops[3:]


_POLY = 0xEDB88320  # CRC-32's polynomial, bit-reflected as zlib uses it
_ZEROS = _byte_powers([(r >> 1) ^ (_POLY if r & 1 else 0) for r in (1 << j for j in range(32))])
# One zero bit undone: the new register's top bit says whether the polynomial was xored in.
_UNZEROS = _byte_powers([(((r ^ (_POLY if r >> 31 else 0)) << 1) | (r >> 31)) & 0xFFFFFFFF
                         for r in (1 << j for j in range(32))])


def _shift(crc: int, nbytes: int, ops: list) -> int:
    k = 0
    while nbytes and crc:
        if nbytes & 1:
            crc = _gf2_apply(ops[k], crc)
        nbytes, k = nbytes >> 1, k + 1
    return crc


def crc32_combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """CRC-32 of A + B from crc32(A), crc32(B) and len(B) in bytes, without reading the bytes
    (what zlib's C crc32_combine does; Python's zlib does not expose it). At most ~0.1 ms."""
    return _shift(crc_a, len_b, _ZEROS) ^ crc_b


def crc32_part(crc_whole: int, crc_before: int, crc_after: int, len_part: int, len_after: int) -> int:
    """CRC-32 of the middle part B of A + B + C from the CRCs of the whole, of A and of C and the
    lengths of B and C, without reading B (crc32_combine solved for B)."""
    return _shift(crc_whole ^ crc_after ^ _shift(crc_before, len_part + len_after, _ZEROS), len_after, _UNZEROS)


# ----------------------------------------------------------------------------- the manifest

class VersionKey(typing.NamedTuple):
    """Which weight version: its number and the trainer lineage that made it. Two lineages may both
    have a version 3; only the pair names one set of weights."""
    version: int
    lineage: str


def chunk_array(data) -> np.ndarray:
    """A chunk's payload as received: a 1-D uint8 array, else wire.WireError."""
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 1 or not 0 < data.size <= MAX_CHUNK_BYTES:
        raise wire.WireError(f"chunk data must be 1..{MAX_CHUNK_BYTES} bytes (a 1-D uint8 array)")
    return data


def check_lora(lora) -> dict:
    """A LoRA config as a manifest carries it (lora.LoraConfig.to_dict: {rank, alpha, targets}),
    checked for its form here, where the param server must not import the model; the worker's
    lora.LoraConfig.from_dict then checks the target names. Else wire.WireError."""
    if not (isinstance(lora, dict) and set(lora) == {"rank", "alpha", "targets"}
            and type(lora["rank"]) is int and lora["rank"] >= 1
            and type(lora["alpha"]) in (int, float) and math.isfinite(lora["alpha"]) and lora["alpha"] > 0
            and isinstance(lora["targets"], list) and lora["targets"]
            and all(isinstance(t, str) and t for t in lora["targets"])
            and len(set(lora["targets"])) == len(lora["targets"])):
        raise wire.WireError(f"manifest: bad lora config {str(lora)[:200]} (want {{rank: int >= 1, "
                             f"alpha: number > 0, targets: [distinct names]}})")
    return lora


@dataclass
class Manifest:
    """A weight version's table of contents (THE LAYOUT in the module docstring). On the wire a
    map {version, lineage, tensors: [[name, dtype, shape, crc32], ...], chunks: [[nbytes, crc32], ...]}.

    An ADAPTER VERSION (LoRA) also names `base`, the number of the full version of its lineage it
    applies to (older than itself), and `lora`, the config to merge with (lora.LoraConfig.to_dict);
    its tensors are the adapter's alone (lora.adapter_tensors). A full version has neither: base and
    lora are None, and absent from the map."""
    KIND: typing.ClassVar[str] = "manifest"
    version: int
    lineage: str
    tensors: list
    chunks: list
    base: int | None = None
    lora: dict | None = None

    @classmethod
    def from_dict(cls, data) -> "Manifest":
        if not isinstance(data, dict):
            raise wire.WireError(f"manifest must be a map, got {type(data).__name__}")
        rest = {k: v for k, v in data.items() if k not in ("base", "lora")}
        m = cls(**wire.check_fields(cls, rest), base=data.get("base"), lora=data.get("lora"))
        if m.version < 0 or not m.tensors or not m.chunks:
            raise wire.WireError("manifest: version must be >= 0, tensors and chunks non-empty")
        if (m.base is None) != (m.lora is None):
            raise wire.WireError("manifest: an adapter version names both its base and its lora config, "
                                 "a full version neither")
        if m.is_adapter:
            if type(m.base) is not int or not 0 <= m.base < m.version:
                raise wire.WireError(f"manifest: base must be the number of an older full version "
                                     f"(0 <= base < version {m.version}), got {str(m.base)[:50]}")
            check_lora(m.lora)
        names, total = set(), 0
        for t in m.tensors:
            if not (isinstance(t, list) and len(t) == 4 and isinstance(t[0], str) and t[1] in wire.DTYPES
                    and isinstance(t[2], list) and len(t[2]) <= wire.MAX_NDIM
                    and all(type(d) is int and d >= 0 for d in t[2]) and type(t[3]) is int and 0 <= t[3] < 2**32):
                raise wire.WireError(f"manifest: bad tensor entry {str(t)[:200]} (want [name, dtype, shape, crc32])")
            if t[0] in names:
                raise wire.WireError(f"manifest: tensor {t[0]!r} appears twice")
            names.add(t[0])
            total += math.prod(t[2]) * wire.DTYPES[t[1]].itemsize
        for c in m.chunks:
            if not (isinstance(c, list) and len(c) == 2 and all(type(x) is int for x in c)
                    and 0 < c[0] <= MAX_CHUNK_BYTES and 0 <= c[1] < 2**32):
                raise wire.WireError(f"manifest: bad chunk entry {str(c)[:200]} (want [nbytes, crc32])")
        if sum(c[0] for c in m.chunks) != total:
            raise wire.WireError(f"manifest: chunks hold {sum(c[0] for c in m.chunks)} bytes, tensors {total}")
        return m

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return d if self.is_adapter else {k: v for k, v in d.items() if k not in ("base", "lora")}

    @property
    def is_adapter(self) -> bool:
        """An adapter version (LoRA: applies to the full version `base`) rather than a full one. The
        one place that says which: every other decision asks this (or a version object's, which
        asks its manifest)."""
        return self.base is not None

    @property
    def key(self) -> VersionKey:
        return VersionKey(self.version, self.lineage)

    @property
    def base_key(self) -> VersionKey | None:
        """The full version an adapter version applies to; None for a full version."""
        return VersionKey(self.base, self.lineage) if self.is_adapter else None

    @property
    def nbytes(self) -> int:
        return sum(c[0] for c in self.chunks)

    def offsets(self) -> list:
        """Start of each chunk in the version's byte stream."""
        return list(itertools.accumulate([0] + [c[0] for c in self.chunks[:-1]]))

    def tensor_views(self, stream: np.ndarray) -> dict:
        """{name: array} viewing a contiguous uint8 `stream` of the whole version (no copy)."""
        out, at = {}, 0
        for name, dtype, shape, _ in self.tensors:
            n = math.prod(shape) * wire.DTYPES[dtype].itemsize
            out[name] = stream[at:at + n].view(wire.DTYPES[dtype]).reshape(shape)
            at += n
        return out

    def check_tensors(self, pieces, crcs=None) -> None:
        """Check every tensor's CRC32 over the byte stream given as consecutive uint8 `pieces`
        (the chunks), without joining them. Raises ValueError naming the first bad tensor.
        `crcs`, if given, are the pieces' CRCs, already checked against their bytes by the caller:
        then the largest segment of each piece (its part in one tensor) is not read but solved for
        (crc32_part), so a piece inside one tensor costs nothing and one that holds a tensor boundary
        costs its smaller segments."""
        crcs = list(crcs) if crcs is not None else None
        sizes = [math.prod(shape) * wire.DTYPES[dtype].itemsize for _, dtype, shape, _ in self.tensors]
        tensor_crcs, t, left = [0] * len(sizes), -1, 0
        for i, piece in enumerate(pieces):
            segments, at = [], 0  # (tensor index, start in the piece, length)
            while at < len(piece):
                while left == 0:
                    t += 1
                    if t == len(sizes):
                        raise ValueError(f"weights v{self.version}: more bytes than the tensors hold")
                    left = sizes[t]
                take = min(left, len(piece) - at)
                segments.append((t, at, take))
                at, left = at + take, left - take
            skip = max(range(len(segments)), key=lambda s: segments[s][2]) if crcs is not None else -1
            seg_crcs = [0 if s == skip else crc32_bytes(memoryview(piece[start:start + n]))
                        for s, (_, start, n) in enumerate(segments)]
            if skip >= 0:
                before = after = len_after = 0
                for s, (_, _, n) in enumerate(segments):
                    if s < skip:
                        before = crc32_combine(before, seg_crcs[s], n)
                    elif s > skip:
                        after, len_after = crc32_combine(after, seg_crcs[s], n), len_after + n
                seg_crcs[skip] = crc32_part(crcs[i], before, after, segments[skip][2], len_after)
            for (t_of, _, n), crc in zip(segments, seg_crcs):
                tensor_crcs[t_of] = crc32_combine(tensor_crcs[t_of], crc, n)
        for (name, _, _, want), crc in zip(self.tensors, tensor_crcs):
            if crc != want:
                raise ValueError(f"weights v{self.version}: checksum mismatch for tensor {name!r}")

# ----------------------------------------------------------------------------- cut into chunks

def cut_chunks(named_arrays, chunk_bytes: int = CHUNK_BYTES):
    """Cut (name, array) pairs, in order, into chunks of at most chunk_bytes. Yields (uint8 chunk
    array, its CRC32); when the input is exhausted, the returned `tensors` list (StopIteration
    value, use `yield from`) holds the manifest's tensor entries. Holds the current tensor and the
    chunk being assembled.

    A tensor of at least chunk_bytes / 16 starts a chunk of its own and is cut into chunk_bytes
    pieces (the last shorter), each a view of it: no copy, and no chunk holds a tensor boundary, so
    the receivers get its tensor CRC from the chunk CRCs without reading it again (check_tensors).
    Smaller tensors (norms, biases, small projections) are packed together into chunks assembled in
    buffers of their own. Every byte is checksummed once: each piece's CRC counts toward both its
    chunk's and its tensor's (crc32_combine)."""
    if not 0 < chunk_bytes <= MAX_CHUNK_BYTES:
        raise ValueError(f"chunk_bytes must be in (0, {MAX_CHUNK_BYTES}]")
    tensors, buf, filled, buf_crc = [], None, 0, 0
    for name, array in named_arrays:
        array = np.ascontiguousarray(array)
        if array.dtype.name not in wire.DTYPES:
            raise wire.WireError(f"tensor {name}: dtype {array.dtype} cannot travel on the wire")
        flat = array.reshape(-1).view(np.uint8)
        tensor_crc, own_chunks = 0, len(flat) >= max(1, chunk_bytes // 16)
        if own_chunks and filled:
            yield buf[:filled], buf_crc
            buf, filled, buf_crc = None, 0, 0
        at = 0
        while at < len(flat):
            take = min(chunk_bytes - filled, len(flat) - at)
            piece = flat[at:at + take]
            crc = crc32_bytes(memoryview(piece))
            tensor_crc = crc32_combine(tensor_crc, crc, take)
            at += take
            if own_chunks:
                yield piece, crc  # a view: the sender must not write the array meanwhile
                continue
            if buf is None:
                buf = np.empty(chunk_bytes, np.uint8)
            buf[filled:filled + take] = piece
            filled, buf_crc = filled + take, crc32_combine(buf_crc, crc, take)
            if filled == chunk_bytes:
                yield buf, buf_crc  # a buffer of its own, never written again
                buf, filled, buf_crc = None, 0, 0
        tensors.append([name, array.dtype.name, list(array.shape), tensor_crc])
    if filled:
        yield buf[:filled], buf_crc
    return tensors



# ----------------------------------------------------------------------------- version objects

@dataclass
class Version:
    """One complete, verified weight version as a store holds it: its manifest and its chunks (uint8
    arrays, in order). An adapter version's `base` is the full version it applies to, where known;
    `delta` (deltas.Encoder), where one is made, rebuilds it from the full version before it."""
    manifest: Manifest
    chunks: list
    base: "Version | None" = None
    delta: typing.Any = None

    @property
    def is_adapter(self) -> bool:
        return self.manifest.is_adapter


class VersionBuffer:
    """One weight version on the host, being received or complete: its manifest and one contiguous
    buffer of its bytes, into which chunk i is written at its offset as it arrives (so the finished
    tensors are views of it, no copy)."""

    def __init__(self, manifest: Manifest, memory: mmap.mmap):
        self.manifest, self.key, self.memory = manifest, VersionKey(manifest.version, manifest.lineage), memory
        self.stream = np.frombuffer(memory, np.uint8)[:manifest.nbytes]
        self.offsets = manifest.offsets()
        self.have = [False] * len(manifest.chunks)
        self.complete = self.installed = False
        self.base: VersionBuffer | None = None  # an adapter version's: the full version it applies to
        # Received as a delta (deltas.py): its manifest, and the delta's bytes as they came (a relay serves them)
        self.delta = None
        self.delta_data: list | None = None
        self.fetched_bytes = 0  # what travelled to us for it (chunks, or the delta's)

    @property
    def is_adapter(self) -> bool:
        return self.manifest.is_adapter

    def tensors(self) -> dict:
        """{name: array}: this version's tensors (an adapter version's: the adapter's), views of its bytes."""
        return self.manifest.tensor_views(self.stream)

    def chunks(self) -> list:
        """Its chunks in order, views of its bytes (what a store serves)."""
        return [self.chunk(i) for i in range(len(self.manifest.chunks))]

    def chunk(self, i: int) -> np.ndarray:
        return self.stream[self.offsets[i]:self.offsets[i] + self.manifest.chunks[i][0]]

    def put(self, i: int, data: np.ndarray, crc: int) -> None:
        """Write chunk i and check its CRC where it now lies (so a misplaced or torn copy is caught too);
        ValueError if it does not match."""
        slot = self.chunk(i)
        slot[:] = data
        if crc32_bytes(memoryview(slot)) != crc:
            raise ValueError(f"chunk {i} is corrupt")
        self.have[i] = True  # after the bytes: a reader that sees True sees them


def cut_all(named_arrays, chunk_bytes: int = CHUNK_BYTES) -> tuple[list, list]:
    """cut_chunks run to the end in memory: ([(chunk copy, CRC32), ...], the manifest's tensor entries).
    Each chunk is a copy (cut_chunks may hand out views of its input), for versions made in one process."""
    pieces, chunks = cut_chunks(named_arrays, chunk_bytes), []
    while True:
        try:
            data, crc = next(pieces)
        except StopIteration as end:
            return chunks, end.value
        chunks.append((np.array(data), crc))


def from_arrays(version: int, lineage: str, named, base: int | None = None, lora: dict | None = None,
                chunk_bytes: int = CHUNK_BYTES) -> VersionBuffer:
    """A complete VersionBuffer made in this process from (name, array) pairs, as a transport would
    deliver it (cut, checksummed, each chunk checked where it lands); `base`, `lora`: an adapter
    version's (set its `.base` to the base's VersionBuffer before installing it)."""
    chunks, tensors = cut_all(named, chunk_bytes)
    manifest = Manifest(version, lineage, tensors, [[int(c.size), crc] for c, crc in chunks], base, lora)
    buf = VersionBuffer(manifest, new_memory(manifest.nbytes))
    for i, (data, crc) in enumerate(chunks):
        buf.put(i, data, crc)
    buf.complete = True
    return buf


# ----------------------------------------------------------------------------- as a file

# safetensors' names of the wire's dtypes: a version on disk is a valid safetensors file.
_ST_DTYPES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
              "uint32": "U32", "float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64"}


def new_memory(nbytes: int) -> mmap.mmap:
    """Host memory for a version's bytes. Private anonymous memory, not np.empty: numpy asks for
    transparent huge pages on big arrays, and where THP defrag is "madvise" a first touch may stall
    compacting memory (seen: 256 MiB first written in 0.56-0.86 s that way, 0.13-0.17 s this way)."""
    return mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def write_file(path: str, manifest: Manifest, chunks: list, fsync: bool = False) -> None:
    """Write a version as a safetensors file straight from its chunks (their bytes are the data
    section), to a temporary name renamed over `path`: a reader (or a crash) sees the old file or
    the new one, never half of one. The metadata holds the version, its lineage, every tensor's CRC
    and, for an adapter version, its base and lora config. `fsync`: the bytes and the rename reach
    the disk before this returns (a reader on another machine may be looking)."""
    m, header, at = manifest, {}, 0
    for name, dtype, shape, _ in m.tensors:
        n = math.prod(shape) * np.dtype(wire.DTYPES[dtype]).itemsize
        header[name] = {"dtype": _ST_DTYPES[dtype], "shape": shape, "data_offsets": [at, at + n]}
        at += n
    header["__metadata__"] = {"version": str(m.version), "lineage": m.lineage,
                              "checksums": json.dumps({t[0]: t[3] for t in m.tensors})}
    if m.is_adapter:
        header["__metadata__"].update(base=str(m.base), lora=json.dumps(m.lora))
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for c in chunks:
            f.write(memoryview(c))
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if fsync:
        fd = os.open(folder or ".", os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself
        finally:
            os.close(fd)


class FileHeader(typing.NamedTuple):
    """What a version file's header says: its metadata, its tensor entries, its data bytes."""
    meta: dict
    tensors: list
    nbytes: int

    @property
    def base(self) -> int | None:
        """The base an adapter version's file names; None for a full version."""
        return int(self.meta["base"]) if "base" in self.meta else None


def _read_header(f) -> FileHeader:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    meta = header.pop("__metadata__")
    names = sorted(header, key=lambda n: header[n]["data_offsets"][0])
    dtypes = {st: name for name, st in _ST_DTYPES.items()}
    checksums = json.loads(meta["checksums"])
    tensors = [[n, dtypes[header[n]["dtype"]], header[n]["shape"], checksums[n]] for n in names]
    return FileHeader(meta, tensors, header[names[-1]]["data_offsets"][1] if names else 0)


_BAD_FILE = (ValueError, KeyError, TypeError, IndexError, struct.error)  # json's errors are ValueErrors


def read_header(path: str) -> FileHeader:
    """A version file's header alone; ValueError naming `path` if it cannot be one."""
    try:
        with open(path, "rb") as f:
            return _read_header(f)
    except _BAD_FILE as e:
        raise ValueError(f"{path}: not a weight version's header: {type(e).__name__}: {e}") from None


def read_file(path: str, memory: typing.Callable[[int], mmap.mmap] = new_memory) -> VersionBuffer:
    """A version written by write_file, read into host memory from `memory(nbytes)`, every byte
    CRC-checked (in chunks of CHUNK_BYTES) against the tensors' checksums. Raises ValueError naming
    `path` for a file that is torn, truncated or corrupt (OSError if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            head = _read_header(f)
            nbytes = head.nbytes
            mem = memory(nbytes)
            stream = np.frombuffer(mem, np.uint8)[:nbytes]
            if f.readinto(memoryview(stream)) != nbytes or f.read(1):
                raise ValueError(f"holds other than the {nbytes} data bytes its header names")
        sizes = [min(CHUNK_BYTES, nbytes - at) for at in range(0, nbytes, CHUNK_BYTES)]
        crcs = [crc32_bytes(memoryview(stream[at:at + n])) for at, n in zip(range(0, nbytes, CHUNK_BYTES), sizes)]
        adapter = {"base": head.base, "lora": json.loads(head.meta["lora"])} if head.base is not None else {}
        manifest = Manifest.from_dict({"version": int(head.meta["version"]), "lineage": head.meta.get("lineage", ""),
                                       "tensors": head.tensors, "chunks": [list(c) for c in zip(sizes, crcs)],
                                       **adapter})
        buf = VersionBuffer(manifest, mem)
        manifest.check_tensors(buf.chunks(), crcs)
    except _BAD_FILE as e:
        raise ValueError(f"{path}: not a complete weight version: {type(e).__name__}: {e}") from None
    buf.have, buf.complete = [True] * len(sizes), True
    return buf
