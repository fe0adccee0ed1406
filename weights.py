"""A weight version's life, from the trainer's master weights to a worker's accelerator, in one place.

The trainer cuts a version into chunks and pushes them; the param server stores it and tells each
worker where to fetch it; a worker fetches it in a thread of its own, serves it on to other workers
(relay) and hands it, complete and checked, to its main thread to install. The roles call into this
module and keep their own loops; wire.py carries the messages (PushChunk, PushCommit, GetWeights,
WeightManifest, WeightsUnchanged, GetChunk, Chunk).

THE LAYOUT (`Manifest`). A version's bytes are its tensors' bytes laid end to end in manifest order
(the layout of a safetensors data section, so the param server writes its chunks to disk as one file).
Chunk i is the byte range [offset_i, offset_i + nbytes_i) of that stream: a slice of one big tensor,
or several small tensors whole. The manifest names the version, its lineage, each tensor
[name, dtype, shape, crc32] and each chunk [nbytes, crc32]; it travels as a map, checked by
`Manifest.from_dict` wherever one is received.

NOBODY SEES HALF A VERSION (invariant 4). A version becomes visible only complete and checked: the
param server adds it only when the commit's manifest lists exactly the chunks it received and every
tensor's CRC checks (`WeightStore.commit`); until then, and after a corrupt or abandoned push, the
previous version is served. A worker offers its main thread only a version whose every chunk and
every tensor checked (`WeightFetcher.fetch`), and the main thread swaps it in between batches, so
every token of a batch is sampled with one version.

CHECKSUMMED ONCE. Each process reads a version's bytes about once: a chunk's CRC is computed as it is
cut and checked where it lands; a tensor's CRC then follows from its chunks' CRCs without reading the
bytes again (CRC-32 is linear: `crc32_combine`, `crc32_part`, `Manifest.check_tensors`).

What happens to a version, step by step:

  step                                what happens                                  where
  ----------------------------------  --------------------------------------------  ---------------------------
  the trainer gathers it              cast to the model's dtype, one tensor at a    trainer.Trainer.do_push
                                      time, from a sharded trainer too              hf_io.iter_hf_tensors
  cut into chunks                     a tensor of >= chunk_bytes / 16 into views    cut_chunks
                                      of its own, smaller ones packed together;
                                      every byte's CRC computed once
  pushed                              a PushChunk per chunk, PUSH_WINDOW in         push_weights
                                      flight, then PushCommit with the manifest
  a chunk reaches the param server    CRC-checked; a wrong CRC or index discards    WeightStore.receive_chunk
                                      the whole push; so does a new push
  its trainer dies mid-push           no chunk for push_timeout_s: discarded        WeightStore.expire
  committed                           the manifest against the chunks, every        WeightStore.commit
                                      tensor's CRC: visible at once, or refused     Manifest.check_tensors
  a new trainer lineage commits       every version of the old lineage forgotten    WeightStore.put
  stored                              the last keep_versions in memory; the         WeightStore.put
                                      newest written to disk by a thread (a         WeightStore._persist
                                      safetensors file, renamed into place)
  the param server restarts           the file's version served again (a corrupt    WeightStore._load_persisted
                                      file is ignored: it waits for a push)
  a worker asks for the newest        the manifest, and where to fetch it: its      RelayTree.sources
                                      relay ancestors nearest first, then the
                                      param server
  fetched                             chunks in order into one host buffer,         WeightFetcher.fetch
                                      FETCH_WINDOW in flight, each CRC-checked      VersionBuffer.put
                                      where it lands
  a relay does not deliver in time    skipped for SHUN_S; the chunk is asked of     WeightFetcher.fetch
                                      the next source up
  relayed                             the chunks a worker holds, served to its      ChunkServer
                                      children; a missing one held until it lands
  complete and checked                offered to the worker's main thread           WeightFetcher.wait_newer
  installed                           swapped in between batches (refused: the      inference_worker.Worker.pull
                                      worker keeps the one it has)                  inference_worker.Worker.install
  superseded                          its host memory holds a later version         WeightFetcher.retire
                                                                                    WeightFetcher.memory_for

ADAPTER VERSIONS (LoRA). A LoRA trainer pushes its base once per lineage as a full version; every
later version is the adapter alone (lora.adapter_tensors), its manifest naming `base`, the full
version it applies to, and `lora`, the config (Manifest). The same chunks, CRCs and rules carry it;
what differs:

  pushed                              push_weights(..., base=, lora=)               push_weights
  committed                           refused unless its base is the one pinned     WeightStore.check_base
  stored                              the lineage's base pinned whatever keep       WeightStore.put
                                      says; a new lineage replaces it               WeightStore.held
  persisted                           the base and the newest adapter, two files    WeightStore._persister
  a worker asks for the newest        the adapter's manifest and its base's         wire.WeightManifest
  fetched                             the base first if not held (a new or          WeightFetcher.base_for
                                      restarted worker, a relay child), then the
                                      adapter; a relay keeps the base's bytes
  installed                           lora.merge(base on the device, adapter)       inference_worker.Worker.policy_params
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import math
import mmap
import os
import struct
import threading
import time
import traceback
import typing
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import zmq

import wire

MAX_CHUNK_BYTES = 256 << 20
CHUNK_BYTES = int(float(os.environ.get("RLAX_WEIGHT_CHUNK_MB", "16")) * (1 << 20))
"""Default chunk size of a weight push (RLAX_WEIGHT_CHUNK_MB, default 16 MiB): what a sender or a
receiver holds beyond the version it stores is about one chunk (plus one tensor for the trainer)."""

PUSH_WINDOW = 4  # chunks a push keeps in flight (wire.Client.pipeline): the sender never idles on a receipt


# ----------------------------------------------------------------------------- checksums

def crc32(array: np.ndarray) -> int:
    """The CRC32 of an array's bytes: what a chunk or a tensor of the manifest carries."""
    return zlib.crc32(memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8)))


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
        if m.base is not None:
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
        return d if self.base is not None else {k: v for k, v in d.items() if k not in ("base", "lora")}

    @property
    def key(self) -> VersionKey:
        return VersionKey(self.version, self.lineage)

    @property
    def base_key(self) -> VersionKey | None:
        """The full version an adapter version applies to; None for a full version."""
        return None if self.base is None else VersionKey(self.base, self.lineage)

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
            seg_crcs = [0 if s == skip else zlib.crc32(memoryview(piece[start:start + n]))
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


# ----------------------------------------------------------------------------- cut and pushed (trainer)

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
            crc = zlib.crc32(memoryview(piece))
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


def push_weights(client, version: int, lineage: str, named_arrays, chunk_bytes: int = CHUNK_BYTES,
                 push_id: str | None = None, window: int = PUSH_WINDOW, base: int | None = None,
                 lora: dict | None = None) -> dict:
    """Stream a weight version to the param server: each chunk in its own PushChunk, up to `window`
    of them in flight (each acknowledged by a receipt; the server takes them in order), then
    PushCommit with the manifest. Returns the commit's Ok info; raises wire.RemoteError if the server
    refused a chunk (it then discards the whole push). `named_arrays` may be a generator
    (hf_io.iter_hf_tensors): only the current tensor and `window` chunks are held here.
    An adapter version: `named_arrays` are the adapter's tensors (lora.adapter_tensors), `base` the
    number of the full version of this lineage they apply to, `lora` the config (LoraConfig.to_dict);
    the server refuses it unless it holds that base. None, None: a full version."""
    if (base is None) != (lora is None):
        raise ValueError("an adapter version needs both base and lora; a full version neither")
    if lora is not None:
        check_lora(lora)
        if not 0 <= base < version:
            raise ValueError(f"an adapter version's base must be an older full version: base {base}, version {version}")
    push_id = push_id or f"{lineage}/{version}/{os.urandom(4).hex()}"
    chunks, done = [], {}

    def messages():
        pieces = cut_chunks(named_arrays, chunk_bytes)
        while True:
            try:
                data, crc = next(pieces)
            except StopIteration as end:
                done["tensors"] = end.value
                return
            chunks.append([int(data.size), crc])
            yield wire.PushChunk(push_id, len(chunks) - 1, data, crc)
    for _ in client.pipeline(messages(), window, what="receipt of a weight chunk"):
        pass
    manifest = Manifest(version, lineage, done["tensors"], chunks, base, lora)
    return client.call(wire.PushCommit(push_id, manifest.to_dict()), what="weights commit").info


# ----------------------------------------------------------------------------- stored (param server)

# safetensors' names of the wire's dtypes: a persisted version is a valid safetensors file.
_ST_DTYPES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
              "uint32": "U32", "float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64"}


@dataclass
class Version:
    """One complete, verified weight version: its manifest and its chunks (uint8 arrays, in order)."""
    manifest: Manifest
    chunks: list


class WeightStore:
    """Versioned weight sets. A set is only visible once complete and verified (invariant 4): chunks of
    a push collect in `pending`, and only a commit whose manifest matches them and every tensor's CRC
    adds the version. One push is pending at a time: a new push (or a wrong chunk) discards it.
    `keep`: how many versions to hold; `state_dir`: where the newest is persisted; `log(text)`: our
    log lines.

    ADAPTER VERSIONS. The newest full version of the current lineage is the BASE, pinned: held (and
    served) whatever `keep` says, because every adapter version of the lineage applies to it. An
    adapter version is refused unless the base it names is the pinned one; a new full version
    becomes the base, and a new lineage drops the old one's. On disk the base is weights.safetensors
    and the newest adapter version, if newer, adapter.safetensors (PERSIST_FILES): a restarted
    server serves both."""

    PERSIST_FILES = {"full": "weights.safetensors", "adapter": "adapter.safetensors"}

    def __init__(self, state_dir: str, keep: int, log: Callable[[str], None]):
        self.dir, self.keep, self.log = state_dir, keep, log
        self.versions: collections.OrderedDict[int, Version] = collections.OrderedDict()
        self.base: Version | None = None  # the pinned full version of the current lineage
        self.pending: dict | None = None  # {"id", "chunks", "crcs", "t"}
        self.discarded = 0
        os.makedirs(state_dir, exist_ok=True)
        self._load_persisted()
        # The persister thread writes the newest committed version; versions committed while it
        # writes coalesce into the newest of them (an adapter version's base is written first if the
        # file does not hold it). `persisted`: the VersionKey of the newest version on disk.
        self.persisted = VersionKey(self.newest, self.lineage)
        self._base_on_disk = self.base.manifest.key if self.base is not None else None
        self._to_persist: tuple | None = None  # (version, its base or None)
        self._writing = False
        self._disk = threading.Condition()
        threading.Thread(target=self._persister, name="persist", daemon=True).start()

    @property
    def newest(self) -> int:
        return next(reversed(self.versions)) if self.versions else -1

    @property
    def lineage(self) -> str:
        return self.versions[self.newest].manifest.lineage if self.versions else ""

    def _discard(self, why: str) -> None:
        self.log(f"weight push {self.pending['id']} discarded: {why}; still serving v{self.newest}")
        self.pending, self.discarded = None, self.discarded + 1

    def receive_chunk(self, msg: wire.PushChunk) -> int:
        """Add one chunk to the pending push; returns how many it holds."""
        data = chunk_array(msg.data)
        p = self.pending
        if p is None or p["id"] != msg.push_id:
            if msg.index != 0:
                raise ValueError(f"push {msg.push_id}: chunk {msg.index} of a push this server has not "
                                 f"seen begin (did it restart?): push again from chunk 0")
            if p is not None:
                self._discard(f"superseded by push {msg.push_id}")
            p = self.pending = {"id": msg.push_id, "chunks": [], "crcs": []}
        p["t"] = time.monotonic()
        if p["chunks"] and msg.index == len(p["chunks"]) - 1 and msg.crc == p["crcs"][-1]:
            return len(p["chunks"])  # a retry of the chunk we received last: already held
        if msg.index != len(p["chunks"]):
            self._discard(f"chunk {msg.index} arrived, expected {len(p['chunks'])}")
            raise ValueError(f"push {msg.push_id}: chunk {msg.index} out of order: push discarded")
        if zlib.crc32(memoryview(data)) != msg.crc:
            self._discard(f"CRC mismatch on chunk {msg.index}")
            raise ValueError(f"push {msg.push_id}: CRC mismatch on chunk {msg.index}: push discarded, "
                             f"still serving v{self.newest}")
        p["chunks"].append(data)  # the received frame's own memory (a 16 MiB chunk is its own message): no copy
        p["crcs"].append(msg.crc)
        return len(p["chunks"])

    def commit(self, msg: wire.PushCommit) -> None:
        p = self.pending
        if p is None or p["id"] != msg.push_id:
            raise ValueError(f"push {msg.push_id}: no such push pending (discarded, or never begun)")
        try:
            manifest = Manifest.from_dict(msg.manifest)
            received = [[int(c.size), crc] for c, crc in zip(p["chunks"], p["crcs"])]
            if manifest.chunks != received:
                raise ValueError(f"manifest lists {len(manifest.chunks)} chunks that differ from the "
                                 f"{len(received)} received")
            manifest.check_tensors(p["chunks"], p["crcs"])  # each chunk's CRC was checked on arrival
            self.check_base(manifest)
        except ValueError as e:  # wire.WireError is one too
            self._discard(str(e))
            raise ValueError(f"push {msg.push_id} refused: {e}") from None
        self.pending = None
        self.put(Version(manifest, p["chunks"]))

    def check_base(self, manifest: Manifest) -> None:
        """An adapter version is accepted only onto the pinned base it names; ValueError otherwise."""
        want = manifest.base_key
        if want is not None and (self.base is None or self.base.manifest.key != want):
            held = f"v{self.base.manifest.version} of lineage {self.base.manifest.lineage!r}" if self.base else "none"
            raise ValueError(f"adapter version {manifest.version} applies to base v{want.version} of lineage "
                             f"{want.lineage!r}, which is not held here (base held: {held}): push that base "
                             f"in full first")

    def expire(self, timeout_s: float) -> None:
        """A push whose sender went quiet (a trainer killed mid-push) is dropped: it never shows."""
        if self.pending is not None and time.monotonic() - self.pending["t"] > timeout_s:
            self._discard(f"no chunk for {timeout_s:.0f}s (sender gone?)")

    def put(self, v: Version) -> None:
        version, lineage = v.manifest.version, v.manifest.lineage
        # A new lineage means a trainer (re)started, possibly from an earlier checkpoint: its
        # weights are the truth now, every version of the old lineage is forgotten, and workers
        # follow (they ask for "newest != what I have", not "newer than what I have").
        if lineage != self.lineage:
            self.versions.clear()
            self.base = None
        for old in [old for old in self.versions if old >= version]:
            del self.versions[old]
        self.versions[version] = v
        if v.manifest.base is None:
            self.base = v  # pinned: every later adapter version of the lineage applies to it
        while len(self.versions) > self.keep:
            self.versions.popitem(last=False)
        with self._disk:
            self._to_persist = (v, self.base if v.manifest.base is not None else None)
            self._disk.notify_all()

    def held(self, version: int, lineage: str) -> Version | None:
        """The version (version, lineage) if this store serves it: one of the last `keep`, or the base."""
        v = self.versions.get(version)
        if v is None and self.base is not None and self.base.manifest.version == version:
            v = self.base
        return v if v is not None and v.manifest.lineage == lineage else None

    def base_manifest(self, manifest: Manifest) -> Manifest | None:
        """The manifest of the base an adapter version applies to (None for a full version, or if
        that base is no longer held)."""
        held = self.base.manifest if self.base is not None else None
        return held if held is not None and held.key == manifest.base_key else None

    def _persister(self) -> None:
        while True:
            with self._disk:
                self._disk.wait_for(lambda: self._to_persist is not None)
                (v, base), self._to_persist, self._writing = self._to_persist, None, True
            done = self.persisted
            try:
                full, adapter = (os.path.join(self.dir, self.PERSIST_FILES[k]) for k in ("full", "adapter"))
                if base is not None and self._base_on_disk != base.manifest.key:
                    self._persist(base, full)
                    self._base_on_disk = base.manifest.key
                self._persist(v, adapter if base is not None else full)
                if base is None:
                    self._base_on_disk = v.manifest.key
                    if os.path.exists(adapter):
                        os.remove(adapter)  # an older base's adapter; the loader would ignore it anyway
                done = v.manifest.key
            except OSError as e:  # a full disk must not stop the serving: the file stays the old one
                self.log(f"could not persist weights v{v.manifest.version}: {e!r}")
            with self._disk:
                self.persisted, self._writing = done, False
                self._disk.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait until the newest committed version is on disk (or timeout_s); True if nothing is left."""
        with self._disk:
            return self._disk.wait_for(lambda: self._to_persist is None and not self._writing, timeout_s)

    def chunk(self, msg: wire.GetChunk) -> wire.Chunk:
        v = self.held(msg.version, msg.lineage)
        if v is None:
            raise ValueError(f"weights v{msg.version} of lineage {msg.lineage!r} are not held here "
                             f"(newest: v{self.newest})")
        if not 0 <= msg.index < len(v.chunks):
            raise ValueError(f"chunk index {msg.index} outside [0, {len(v.chunks)})")
        return wire.Chunk(msg.version, msg.index, v.chunks[msg.index], v.manifest.chunks[msg.index][1])

    def _persist(self, v: Version, path: str) -> None:
        """Write the version as a safetensors file straight from its chunks (their bytes are the data
        section), to a temporary file renamed over the old one: a crash leaves the old file or the new.
        An adapter version's metadata also holds its base and lora config."""
        m, header, at = v.manifest, {}, 0
        for name, dtype, shape, _ in m.tensors:
            n = math.prod(shape) * np.dtype(wire.DTYPES[dtype]).itemsize
            header[name] = {"dtype": _ST_DTYPES[dtype], "shape": shape, "data_offsets": [at, at + n]}
            at += n
        header["__metadata__"] = {"version": str(m.version), "lineage": m.lineage,
                                  "checksums": json.dumps({t[0]: t[3] for t in m.tensors})}
        if m.base is not None:
            header["__metadata__"].update(base=str(m.base), lora=json.dumps(m.lora))
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(path + ".tmp", "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            for c in v.chunks:
                f.write(memoryview(c))
        os.replace(path + ".tmp", path)

    def _load_persisted(self) -> None:
        """The base and, if it applies to that base, the newest adapter version, as persisted; a
        corrupt or missing file is ignored (the server waits for a push)."""
        full = self._read_persisted(os.path.join(self.dir, self.PERSIST_FILES["full"]))
        if full is None or full.manifest.base is not None:
            return
        self.versions[full.manifest.version] = self.base = full
        path = os.path.join(self.dir, self.PERSIST_FILES["adapter"])
        adapter = self._read_persisted(path)
        if adapter is not None and adapter.manifest.base_key == full.manifest.key:
            self.versions[adapter.manifest.version] = adapter
        elif adapter is not None:
            self.log(f"ignoring {path}: its base v{adapter.manifest.base} is not the persisted full version")

    def _read_persisted(self, path: str) -> Version | None:
        if not os.path.exists(path):
            return None
        try:
            with open(path, "rb") as f:
                header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
                meta = header.pop("__metadata__")
                names = sorted(header, key=lambda n: header[n]["data_offsets"][0])
                dtypes = {st: name for name, st in _ST_DTYPES.items()}
                checksums = json.loads(meta["checksums"])
                tensors = [[n, dtypes[header[n]["dtype"]], header[n]["shape"], checksums[n]] for n in names]
                chunks = []
                while piece := f.read(CHUNK_BYTES):
                    chunks.append(np.frombuffer(piece, np.uint8))
            crcs = [zlib.crc32(memoryview(c)) for c in chunks]
            adapter = {"base": int(meta["base"]), "lora": json.loads(meta["lora"])} if "base" in meta else {}
            manifest = Manifest.from_dict({"version": int(meta["version"]), "lineage": meta.get("lineage", ""),
                                           "tensors": tensors,
                                           "chunks": [[int(c.size), crc] for c, crc in zip(chunks, crcs)],
                                           **adapter})
            manifest.check_tensors(chunks, crcs)
        except Exception as e:  # a corrupt file must not stop the server: it waits for a push
            self.log(f"ignoring corrupt persisted weights {path}: {e!r}")
            return None
        self.log(f"restored weights version {manifest.version} from {path}")
        return Version(manifest, chunks)


# ----------------------------------------------------------------------------- relay tree (param server)

class RelayTree:
    """Who fetches weights from whom. Relaying workers join in the order they first ask for weights;
    worker 0 fetches from the param server, worker i > 0 from worker (i - 1) // fanout: a tree of the
    given fan-out (1: a chain) whose root alone fetches from the param server, so that server sends
    each version about once whatever the fleet size. A worker is told its whole ancestry, nearest
    first, then the param server (""): a child whose parent does not answer moves up one step. A
    worker that has not asked for weights within ttl_s is dropped and the ones after it move up; a
    restarted worker (same name) keeps its place with its new address."""

    def __init__(self, fanout: int, ttl_s: float):
        self.fanout, self.ttl_s = fanout, ttl_s
        self.members: collections.OrderedDict[str, list] = collections.OrderedDict()  # name -> [addr, seen]

    def join(self, worker: str, relay: str) -> None:
        if not worker:
            raise ValueError("a relaying worker must give its name")
        now = time.monotonic()
        for name in [n for n, (_, seen) in self.members.items() if now - seen > self.ttl_s and n != worker]:
            del self.members[name]
        self.members.setdefault(worker, [relay, now])[:] = [relay, now]

    def sources(self, worker: str) -> list:
        names = list(self.members)
        if worker not in self.members:
            return [""]
        i, out = names.index(worker), []
        while i > 0:
            i = (i - 1) // self.fanout
            out.append(self.members[names[i]][0])
        return out + [""]


# ----------------------------------------------------------------------------- fetched and relayed (worker)

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

    def chunk(self, i: int) -> np.ndarray:
        return self.stream[self.offsets[i]:self.offsets[i] + self.manifest.chunks[i][0]]

    def put(self, i: int, data: np.ndarray, crc: int) -> None:
        """Write chunk i and check its CRC where it now lies (so a misplaced or torn copy is caught too);
        ValueError if it does not match."""
        slot = self.chunk(i)
        slot[:] = data
        if zlib.crc32(memoryview(slot)) != crc:
            raise ValueError(f"chunk {i} is corrupt")
        self.have[i] = True  # after the bytes: a reader that sees True sees them


class WeightFetcher:
    """Fetches weight versions in a thread of its own (its own sockets), so a version arrives while
    the worker's main thread samples; the main thread swaps it in between batches
    (inference_worker.Worker.pull).

    Loop: long-poll the param server for a manifest newer than the one we hold (get_weights), fetch
    its chunks in order (several requests in flight), check each chunk's CRC as it arrives and every
    tensor's once all are in, then offer the version to the main thread (`wait_newer`). A version is
    never offered incomplete.

    Relay mode (the default): we tell the param server our chunk server's address, and its answer
    names our `sources`, nearest first: our parent in the relay tree, its parent, ..., the param
    server (""). Each chunk is asked of the nearest source still trusted; a relay that has not got it
    yet holds the request until it has (so chunks flow down the tree pipelined: a child fetches chunk
    i while its parent fetches chunk i + 1). A relay that does not produce the chunk within
    relay_timeout_s (dead, or stuck) is skipped for SHUN_S, and the chunk is asked one step up; the
    param server, last, holds every version it announced (keep_versions), so no version is lost.
    Our ChunkServer serves the version we are receiving and the newest complete one: a relaying
    worker keeps one host copy of the newest version (beside its params on the accelerator) until the
    next one starts arriving. Without relay the host copy is dropped once installed."""

    POLL_S = 5.0     # long poll for a new version
    SHUN_S = 30.0    # a relay that failed us is not asked again for this long
    FETCH_WINDOW = 4  # chunk requests in flight per fetch (the source never idles between chunks)

    def __init__(self, name: str, param_server: str, incarnation: str, *, log: Callable[[str], None],
                 timeout_s: float, relay_bind: str | None, relay_timeout_s: float, fetch_delay_s: float = 0.0):
        """Starts fetching at once. `name`, `incarnation`: the worker's, as it tells the param server;
        `param_server`: its address; `log(text)`: our log lines; `timeout_s`: how long to wait for any
        one reply of the param server; `relay_bind`: where our ChunkServer listens (relay mode; port *:
        any free one), None: no relay; `relay_timeout_s`: how long a relay may take to produce a chunk
        before we ask one step up; `fetch_delay_s`: a testing knob, a sleep after each chunk (a slow
        link)."""
        self.name, self.incarnation, self.log = name, incarnation, log
        self.timeout_s, self.relay_timeout_s, self.fetch_delay_s = timeout_s, relay_timeout_s, fetch_delay_s
        self.cond = threading.Condition()
        self.ready: VersionBuffer | None = None      # newest complete version
        self.receiving: VersionBuffer | None = None  # the one on its way
        self.base: VersionBuffer | None = None       # newest complete full version: adapters apply to it
        self.spare: list[mmap.mmap] = []             # memory of retired versions (memory_for)
        self.ps = wire.Client(name + "-weights", param_server, timeout_s=timeout_s)
        self.peers: dict[str, wire.Client] = {}
        self.shunned: dict[str, float] = {}
        self.server = ChunkServer(self, relay_bind) if relay_bind is not None else None
        threading.Thread(target=self.run, name="weights", daemon=True).start()

    # --- the main thread's side
    def wait_newer(self, min_version: int, lineage: str, wait_s: float) -> VersionBuffer | None:
        """A complete version not yet offered, of at least min_version or of a lineage other than
        `lineage`, waiting up to wait_s for one; None if there is none."""
        def newer():
            r = self.ready
            return r is not None and not r.installed and (r.key.version >= min_version or r.key.lineage != lineage)
        with self.cond:
            return self.ready if self.cond.wait_for(newer, timeout=wait_s) else None

    def done(self, buf: VersionBuffer) -> None:
        """The main thread has installed `buf` (or refused it): never offer it again. Without relay
        nobody needs its bytes any more."""
        with self.cond:
            buf.installed = True
            if self.server is None:
                self.retire(buf)

    # --- host memory for versions
    def retire(self, buf: VersionBuffer) -> None:
        """`buf`'s bytes are no longer served: its memory may hold a later version (call with cond held).
        A relay keeps the base's bytes while it is the base: a child that lacks it fetches it from us."""
        if buf.stream is not None and not (buf is self.base and self.server is not None):
            buf.stream = None
            self.spare = [buf.memory] + self.spare[:1]

    def memory_for(self, nbytes: int) -> mmap.mmap:
        """Host memory for a version of nbytes: a retired version's if one fits and nothing views it
        any more, else fresh. Reusing matters: a fresh page costs a fault on first write, which on
        the 2-core VMs we measure on made writing 256 MiB of fresh memory 5-9x slower than reused
        memory. "Nothing views it": on a CPU device jax.device_put may keep the numpy array it was
        given as the device buffer (no copy), so the installed params can be views of this memory
        until the next version replaces them; mmap refuses to resize while any view of it exists,
        which is the test."""
        with self.cond:
            for memory in self.spare:
                if nbytes <= len(memory) <= 2 * max(nbytes, 1):
                    try:
                        memory.resize(len(memory))
                    except BufferError:
                        continue
                    self.spare.remove(memory)
                    return memory
        # Private anonymous memory, not np.empty: numpy asks for transparent huge pages on big arrays,
        # and where THP defrag is "madvise" a first touch may stall compacting memory (seen: 256 MiB
        # first written in 0.56-0.86 s that way, 0.13-0.17 s this way).
        return mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)

    # --- the fetching thread
    def run(self) -> None:
        while True:
            have = self.ready.key if self.ready is not None else VersionKey(-1, "")
            try:
                reply = self.ps.call(wire.GetWeights(have.version, have.version + 1, self.POLL_S, have.lineage, self.name,
                                                     self.incarnation, self.server.addr if self.server else ""),
                                     timeout_s=self.POLL_S + self.timeout_s, what="weight manifest")
                if isinstance(reply, wire.WeightManifest):
                    # The param server is always the last resort, whatever the reply says.
                    sources = [s for s in reply.sources if isinstance(s, str) and s] + [""]
                    manifest = Manifest.from_dict(reply.manifest)
                    base = self.base_for(manifest, reply.base, sources) if manifest.base is not None else None
                    if manifest.base is None or base is not None:
                        self.fetch(manifest, sources, base)
            except (TimeoutError, wire.RemoteError, wire.WireError) as e:  # the server restarting
                self.log(f"weights: {type(e).__name__}: {e}; retrying")
                time.sleep(0.5)
            except Exception as e:  # a bug of ours: say so loudly, but keep fetching
                self.log(f"weights: unexpected {type(e).__name__}: {e}; retrying")
                traceback.print_exc()
                time.sleep(0.5)

    def base_for(self, manifest: Manifest, base: dict, sources: list) -> VersionBuffer | None:
        """The base of adapter version `manifest`: the one we hold, else fetched now from `base`, its
        manifest as the param server sent it (wire.WeightManifest.base). None if that fetch failed."""
        with self.cond:
            held = self.base
        if held is not None and held.key == manifest.base_key and held.complete:
            return held
        base_manifest = Manifest.from_dict(base)
        if base_manifest.key != manifest.base_key or base_manifest.base is not None:
            raise wire.WireError(f"adapter v{manifest.version} came with {base_manifest.key}, not its base "
                                 f"{manifest.base_key} in full")
        return self.fetch(base_manifest, sources, offer=False)

    def fetch(self, manifest: Manifest, sources: list, base: VersionBuffer | None = None,
              offer: bool = True) -> VersionBuffer | None:
        """Fetch one version; once complete and checked, a full one becomes our base and, if `offer`,
        it is offered to the main thread (an adapter version with its `base`). Returns it, or None
        if it failed (logged)."""
        t0 = time.monotonic()
        with self.cond:
            if self.ready is not None and self.ready.installed:
                self.retire(self.ready)  # served long enough: the new version replaces it
        buf = VersionBuffer(manifest, self.memory_for(manifest.nbytes))
        buf.base = base
        with self.cond:
            self.receiving = buf
        try:
            i = 0
            while i < len(manifest.chunks):  # from the nearest trusted source, FETCH_WINDOW chunks in flight
                now = time.monotonic()
                source = next(s for s in sources if not s or self.shunned.get(s, 0) < now)
                try:
                    for reply in self.ask(source, manifest, i):
                        nbytes, crc = manifest.chunks[i]
                        if not isinstance(reply, wire.Chunk):
                            raise ValueError(f"{source or 'the param server'} answered {reply.TYPE}, not a chunk")
                        data = chunk_array(reply.data)
                        if reply.index != i or data.size != nbytes:
                            raise ValueError(f"chunk {i} from {source or 'the param server'} is not the one asked for")
                        buf.put(i, data, crc)  # raises ValueError if corrupt
                        i += 1
                        if self.fetch_delay_s:
                            time.sleep(self.fetch_delay_s)
                except (TimeoutError, wire.RemoteError, ValueError) as e:  # wire.WireError is a ValueError
                    if not source:  # the param server no longer has it (superseded) or is down
                        self.log(f"weights v{manifest.version}: giving up at chunk {i}: {e}")
                        return None
                    self.log(f"weights v{manifest.version}: relay {source} failed on chunk {i} ({e}); "
                             f"asking one step up")
                    self.shunned[source] = now + self.SHUN_S
            manifest.check_tensors((buf.chunk(i) for i in range(len(manifest.chunks))),
                                   [crc for _, crc in manifest.chunks])  # each checked where it lies
            buf.complete = True
        except ValueError as e:
            self.log(f"weights v{manifest.version} refused: {e}")
            return None
        finally:
            with self.cond:
                self.receiving = None
                if not buf.complete:
                    self.retire(buf)
        self.adopt(buf, offer)
        what = (f"adapter v{manifest.version} (on base v{manifest.base})" if manifest.base is not None
                else f"v{manifest.version}" + ("" if offer else " (a base)"))
        self.log(f"fetched weights {what} ({manifest.nbytes / 2**20:.1f} MiB, "
                 f"{len(manifest.chunks)} chunks) in {time.monotonic() - t0:.2f}s")
        return buf

    def adopt(self, buf: VersionBuffer, offer: bool) -> None:
        """A complete, checked version: a full one becomes our base (the old base's memory goes once
        installed and not on offer); if `offer`, it replaces the version on offer to the main thread."""
        with self.cond:
            if buf.manifest.base is None:
                old_base, self.base = self.base, buf
                if old_base is not None and old_base is not self.ready and old_base.installed:
                    self.retire(old_base)
            if offer:
                old = self.ready
                self.ready = buf
                if old is not None and old.installed:
                    self.retire(old)
                self.cond.notify_all()

    def ask(self, source: str, manifest: Manifest, start: int):
        """The replies to GetChunk for chunks start, start + 1, ... of `manifest` from `source` ("" = the
        param server), in order, FETCH_WINDOW requests in flight (wire.Client.pipeline). A relay may
        hold a request up to relay_timeout_s for a chunk it is still receiving."""
        wait_s = self.relay_timeout_s if source else 0.0
        msgs = (wire.GetChunk(manifest.version, manifest.lineage, i, wait_s)
                for i in range(start, len(manifest.chunks)))
        if not source:
            return self.ps.pipeline(msgs, self.FETCH_WINDOW, what="a weight chunk")
        client = self.peers.get(source)
        if client is None:
            client = self.peers[source] = wire.Client(self.name + "-fetch", source)
        return client.pipeline(msgs, self.FETCH_WINDOW, timeout_s=wait_s + 2.0, what="a weight chunk from a relay")

    def held(self, version: int, lineage: str) -> VersionBuffer | None:
        for buf in (self.receiving, self.ready, self.base):
            if buf is not None and buf.key == VersionKey(version, lineage) and buf.stream is not None:
                return buf
        return None


class ChunkServer:
    """Relay mode: serves the chunks this worker holds (wire.GetChunk) to its children in the relay
    tree, from a thread of its own with a socket of its own. A request for a chunk we have not got yet,
    of the version we are receiving or of one newer than we hold (its manifest may be on its way to
    us), is held until the chunk arrives or its wait_s runs out (then an Error: the child asks one
    step up)."""

    def __init__(self, fetcher: WeightFetcher, bind: str):
        self.fetcher, self.waiting = fetcher, []
        self.server = wire.Server(fetcher.name + "-relay", bind)
        self.addr = self.server.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.server.on(wire.GetChunk, self.on_get_chunk)
        threading.Thread(target=self.server.serve, kwargs={"tick": self.tick, "poll_ms": 5},
                         name="relay", daemon=True).start()

    def answer(self, msg):
        """The Chunk, None to wait, or raise (an Error reply)."""
        buf = self.fetcher.held(msg.version, msg.lineage)
        stream = buf.stream if buf is not None else None  # the fetcher may drop it at any moment
        if stream is not None:
            if not 0 <= msg.index < len(buf.have):
                raise ValueError(f"chunk index {msg.index} outside [0, {len(buf.have)})")
            if buf.have[msg.index]:
                start, (nbytes, crc) = buf.offsets[msg.index], buf.manifest.chunks[msg.index]
                return wire.Chunk(msg.version, msg.index, stream[start:start + nbytes], crc)
            return None
        ready = self.fetcher.ready
        if ready is None or ready.key.lineage != msg.lineage or ready.key.version < msg.version:
            return None  # a version we have not started (yet)
        raise ValueError(f"weights v{msg.version} are no longer held by this relay")

    def on_get_chunk(self, msg, peer):
        if not 0 <= msg.wait_s <= 600:
            raise ValueError(f"wait_s must be in [0, 600], got {msg.wait_s}")
        reply = self.answer(msg)
        if reply is None and msg.wait_s > 0:
            self.waiting.append((peer, msg, time.monotonic() + msg.wait_s))
            return None
        return reply or wire.Error(f"chunk {msg.index} of v{msg.version} is not here yet")

    def tick(self) -> None:
        now, keep = time.monotonic(), []
        for peer, msg, deadline in self.waiting:
            try:
                reply = self.answer(msg)
            except Exception as e:  # never let one request stop the chunk server
                reply = wire.Error(f"{type(e).__name__}: {e}")
            if reply is None and deadline < now:
                reply = wire.Error(f"chunk {msg.index} of v{msg.version} did not arrive within {msg.wait_s}s")
            if reply is None:
                keep.append((peer, msg, deadline))
            else:
                self.server.reply(peer, reply)
        self.waiting = keep

