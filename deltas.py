"""Delta versions: a weight version sent as its difference from an older version the receiver holds.

With a small learning rate most bf16 weights do not change from one step to the next (an Adam step
of 1e-6 moves a weight of magnitude 0.02 by far less than its bf16 spacing, 0.02 * 2^-8), so a version
is mostly the version before it. A delta carries, chunk by chunk (versions.py's chunks: a slice of one
big tensor, or several small tensors whole), only what changed, in whichever of these encodings is
smallest for that chunk:

  same     the chunk did not change: nothing travels, the receiver copies its base's chunk
  sparse   the positions that changed (uint32 element indices) and their new values, the element
           being the chunk's unsigned integer width (2 bytes for bf16)
  xor      the chunk XOR its base's, compressed with zlib (level 1): changed bits are few and
           unchanged positions are zeros, so it compresses where many positions moved by an ulp
  full     the chunk itself, when neither is smaller

Every encoding is exact: bits are compared as unsigned integers, never as floats (a float compare would
call -0.0 == 0.0 and NaN != NaN). The receiver rebuilds each chunk from its base's and checks it against
the FULL version's chunk CRC (versions.Manifest), so what is installed is checked against the version
itself, not against the delta: a corrupt delta chunk, or one applied to the wrong base, is refused, and
the receiver fetches the full version instead (weights_zmq.WeightFetcher.fetch, `delta=`).

The param server encodes (weights_zmq.WeightStore): each chunk of a push, as it arrives, against the
same bytes of the newest full version it holds, on a thread pool, so the encoding overlaps the push.
A delta exists only between two full versions of one lineage with the same tensors (names, dtypes,
shapes: the same byte layout, however each was cut into chunks); otherwise, or while it is still being
encoded when a worker's long poll ends, the worker gets the full version. Adapter versions (LoRA) are small already and are never deltas.
"""
from __future__ import annotations

import bisect
import concurrent.futures
import math
import threading
import time
import zlib
from dataclasses import dataclass

import numpy as np

import versions
import wire

CODECS = ("same", "sparse", "xor", "full")
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
FAMILIES = (("embed", "embedding"), ("lm_head", "head"), ("norm", "norms"), ("self_attn", "attention"),
            ("attn", "attention"), ("mlp", "mlp"))


def family(name: str) -> str:
    """The tensor family a weight's name belongs to, for the metrics: embedding, attention, mlp, norms,
    head, other."""
    return next((fam for key, fam in FAMILIES if key in name), "other")


# ----------------------------------------------------------------------------- the delta's manifest

@dataclass
class DeltaManifest:
    """How to rebuild version `version` of `lineage` from version `base` of the same lineage, chunk by
    chunk: `chunks[i]` = [codec, nbytes, crc32, width]: the encoding of the full version's chunk i, the
    bytes that travel for it (0 for `same`), their CRC32 (checked before decoding) and the element width
    in bytes that `sparse` indexes. `changed`: {family: [positions changed, positions]} over the
    version's tensors (the metrics' fraction of positions changed per family). On the wire a map."""
    KIND = "delta manifest"
    version: int
    lineage: str
    base: int
    chunks: list
    changed: dict

    @classmethod
    def from_dict(cls, data, manifest) -> "DeltaManifest":
        """Checked against `manifest`, the full version's (versions.Manifest) it rebuilds; else wire.WireError."""
        d = cls(**wire.check_fields(cls, data))
        if (d.version, d.lineage) != (manifest.version, manifest.lineage) or not 0 <= d.base < d.version:
            raise wire.WireError(f"delta manifest for v{d.version} from v{d.base} ({d.lineage!r}) does not "
                                 f"match version {manifest.version} of {manifest.lineage!r}")
        if len(d.chunks) != len(manifest.chunks):
            raise wire.WireError(f"delta manifest has {len(d.chunks)} chunks, the version {len(manifest.chunks)}")
        for entry, (size, _) in zip(d.chunks, manifest.chunks):
            if not (isinstance(entry, list) and len(entry) == 4 and entry[0] in CODECS
                    and all(type(x) is int for x in entry[1:]) and 0 <= entry[2] < 2**32
                    and entry[3] in _UINT and size % entry[3] == 0
                    and (entry[1] == 0) == (entry[0] == "same") and 0 <= entry[1] <= max(size, 16) + 64):
                raise wire.WireError(f"delta manifest: bad chunk entry {str(entry)[:200]} for a chunk of {size} "
                                     f"bytes (want [codec in {CODECS}, nbytes, crc32, width 1|2|4|8])")
        if not (isinstance(d.changed, dict) and all(
                isinstance(k, str) and isinstance(v, list) and len(v) == 2 and all(type(x) is int for x in v)
                for k, v in d.changed.items())):
            raise wire.WireError("delta manifest: changed must map family -> [changed, positions]")
        return d

    def to_dict(self) -> dict:
        return {"version": self.version, "lineage": self.lineage, "base": self.base, "chunks": self.chunks,
                "changed": self.changed}

    @property
    def nbytes(self) -> int:
        """The bytes that travel for this delta (its chunks)."""
        return sum(c[1] for c in self.chunks)

    @property
    def changed_frac(self) -> float:
        return sum(c for c, _ in self.changed.values()) / max(sum(n for _, n in self.changed.values()), 1)


# ----------------------------------------------------------------------------- encode and decode one chunk

def spans(manifest) -> list:
    """[(family, first byte in the version's stream, bytes, itemsize)] of each of its tensors."""
    out, at = [], 0
    for name, dtype, shape, _ in manifest.tensors:
        n = math.prod(shape) * wire.DTYPES[dtype].itemsize
        out.append((family(name), at, n, wire.DTYPES[dtype].itemsize))
        at += n
    return out


def range_layout(tensor_spans: list, at: int, nbytes: int) -> tuple:
    """(width, [(family, first byte in the range, bytes), ...]) of the bytes [at, at + nbytes) of a
    version (a chunk) whose tensors are `tensor_spans` (spans). The width, which `sparse` indexes and the
    metrics count positions in, is the largest of 8, 4, 2, 1 dividing the itemsize of every tensor the
    range holds part of, where each part starts in the range, and its length (a bf16 tensor's chunks: 2)."""
    parts, g = [], nbytes
    j = bisect.bisect_right([s[1] for s in tensor_spans], at) - 1
    while 0 <= j < len(tensor_spans) and tensor_spans[j][1] < at + nbytes:
        fam, start, n, item = tensor_spans[j]
        lo, hi = max(start, at), min(start + n, at + nbytes)
        if hi > lo:
            parts.append((fam, lo - at, hi - lo))
            g = math.gcd(g, item, lo - at)
        j += 1
    return next(w for w in (8, 4, 2, 1) if g % w == 0), parts


def count_changed(where: np.ndarray, width: int, parts: list, into: dict) -> None:
    """Add to `into` ({family: [changed, positions]}) one chunk's changed positions: `where`, the sorted
    indices (in `width` units) of the elements that changed, over its `parts` (range_layout)."""
    for fam, start, nbytes in parts:
        lo, hi = np.searchsorted(where, [start // width, (start + nbytes) // width])
        acc = into.setdefault(fam, [0, 0])
        acc[0] += int(hi - lo)
        acc[1] += nbytes // width


def encode(old: np.ndarray, new: np.ndarray, width: int,
           xor_ok: bool = True) -> tuple[str, np.ndarray | None, np.ndarray]:
    """(codec, the bytes that travel, the sorted indices of the `width`-byte elements that changed) for
    chunk `new` (uint8) against `old`, its base's chunk: the smallest exact encoding (module docstring).
    zlib is tried only when sparse is not already small (1/16 of the chunk), and only if `xor_ok`: it
    runs at ~60 MB/s a core where many positions changed, sparse at ~400 (Encoder decides)."""
    if old.size != new.size:
        return "full", new, np.arange(new.size // width)
    a, b = old.view(_UINT[width]), new.view(_UINT[width])
    where = np.flatnonzero(a != b)
    if where.size == 0:
        return "same", None, where
    sparse_bytes = where.size * (4 + width)
    if sparse_bytes * 16 <= new.size:
        return "sparse", _sparse(where, b), where
    if not xor_ok:
        return ("sparse", _sparse(where, b), where) if sparse_bytes < new.size else ("full", new, where)
    wide = 8 if new.size % 8 == 0 else width
    xor = zlib.compress(np.bitwise_xor(old.view(_UINT[wide]), new.view(_UINT[wide])), 1)
    best = min((sparse_bytes, "sparse"), (len(xor), "xor"), (new.size, "full"))[1]
    if best == "sparse":
        return "sparse", _sparse(where, b), where
    return best, (np.frombuffer(xor, np.uint8) if best == "xor" else new), where


def _sparse(where: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = np.empty(where.size * (4 + values.itemsize), np.uint8)
    out[:where.size * 4] = where.astype(np.uint32).view(np.uint8)
    out[where.size * 4:] = values[where].view(np.uint8)
    return out


def decode(codec: str, data: np.ndarray | None, old: np.ndarray, out: np.ndarray, width: int) -> None:
    """Rebuild a chunk into `out` (uint8, its full size) from its base's chunk `old` and the delta's bytes
    `data`. ValueError if the bytes cannot be this chunk's delta (the caller then checks the rebuilt
    chunk's CRC against the full version's, which catches the rest)."""
    if codec == "same" or codec == "sparse":
        if old.size != out.size:
            raise ValueError(f"the base's chunk holds {old.size} bytes, this chunk {out.size}")
        out[:] = old
    if codec == "sparse":
        n, rest = divmod(data.size, 4 + width)
        if rest:
            raise ValueError(f"a sparse delta of {data.size} bytes is not whole (index, value) pairs")
        where = data[:n * 4].view(np.uint32)
        if n and int(where.max()) >= out.size // width:
            raise ValueError("a sparse delta names a position outside its chunk")
        out.view(_UINT[width])[where] = data[n * 4:].view(_UINT[width])
    elif codec == "xor":
        try:
            raw = zlib.decompress(memoryview(data), bufsize=out.size)
        except zlib.error as e:
            raise ValueError(f"an xor delta does not decompress: {e}") from None
        if len(raw) != out.size or old.size != out.size:
            raise ValueError(f"an xor delta of {len(raw)} bytes for a chunk of {out.size}")
        wide = 8 if out.size % 8 == 0 else 1
        np.bitwise_xor(old.view(_UINT[wide]), np.frombuffer(raw, _UINT[wide]), out=out.view(_UINT[wide]))
    elif codec == "full":
        if data.size != out.size:
            raise ValueError(f"a full chunk of {data.size} bytes for a chunk of {out.size}")
        out[:] = data
    elif codec != "same":
        raise ValueError(f"unknown delta codec {codec!r}")


# ----------------------------------------------------------------------------- encoding a push (param server)

class Encoder:
    """The delta of one push against `base`, the newest full version the param server holds
    (versions.Version), encoded chunk by chunk on `pool` as the push's chunks arrive (`add`). `finish`
    at the commit keeps it only if the two versions share lineage and layout; it is `done` once every
    chunk is encoded, and then `manifest` (DeltaManifest) and `chunks` (the bytes that travel, None for
    `same`) say what to serve. A delta that cannot be (another layout, an encoding error) leaves
    `manifest` None: the version travels whole."""

    MAX_LAG_S = 0.5  # a queue the pool drains within this is never a reason to give up
    XOR_RATE = 60e6  # xor+zlib level 1, bytes/s a core, where many bf16 positions changed (measured here)

    def __init__(self, base, pool: "concurrent.futures.Executor", workers: int = 1):
        self.base, self.pool, self.futures, self.at, self.workers = base, pool, [], 0, workers
        self.t0 = time.monotonic()
        self.xor_rate = self.XOR_RATE  # bytes/s a core compresses (xor+zlib), as measured on this push
        self.base_key = base.manifest.key
        self.base_offsets = base.manifest.offsets()
        self.spans = spans(base.manifest)
        self.manifest: DeltaManifest | None = None
        self.chunks: list | None = None
        self.done = False
        self.broken = False
        self.deadline = float("inf")  # the param server waits for the delta until then (WeightStore.delta_pending)
        self.encoded = (0, 0.0)  # chunks encoded so far and their seconds (set by the pool's threads)
        self.lock = threading.Lock()

    def add(self, i: int, data: np.ndarray) -> None:
        """Chunk i of the push arrived: encode it against the same bytes of the base (its chunks may be
        cut elsewhere: a version read back from disk after a restart is)."""
        if self.broken or i != len(self.futures) or self.at + data.size > self.base.manifest.nbytes:
            self.abandon()
            return
        if self.lag_s() > max(self.MAX_LAG_S, time.monotonic() - self.t0):
            # The pool falls behind the push: the delta would be ready well after the version, which the
            # wire carries faster whole (many positions changed, xor+zlib's ~60 MB/s a core). Stop, and
            # give the cores back to serving.
            self.abandon()
            return
        # xor+zlib only where the pool compresses faster than the push arrives: else sending the chunk
        # whole is quicker than compressing it (a fast wire, or many positions changed)
        elapsed = time.monotonic() - self.t0
        xor_ok = self.at == 0 or elapsed <= 0 or self.xor_rate * self.workers >= self.at / elapsed
        self.futures.append(self.pool.submit(self._encode_one, self._base_bytes(self.at, data.size), data,
                                             range_layout(self.spans, self.at, data.size), xor_ok))
        self.at += data.size

    def lag_s(self) -> float:
        """How long the pool would take to encode what is queued, at the pace of what it has encoded."""
        done_n, done_s = self.encoded
        left = len(self.futures or ()) - done_n
        return left * done_s / done_n / self.workers if done_n and left > 0 else 0.0

    def abandon(self) -> None:
        """No delta for this push: what is queued is cancelled (what runs finishes, and is dropped)."""
        self.broken = True
        for f in self.futures or ():
            f.cancel()

    def _base_bytes(self, at: int, n: int) -> np.ndarray:
        """Bytes [at, at + n) of the base's stream: a view of one chunk, or a copy across several."""
        j = bisect.bisect_right(self.base_offsets, at) - 1
        chunk = self.base.chunks[j][at - self.base_offsets[j]:]
        if chunk.size >= n:
            return chunk[:n]
        parts, got = [chunk], chunk.size
        while got < n:
            j += 1
            parts.append(self.base.chunks[j][:n - got])
            got += parts[-1].size
        return np.concatenate(parts)

    def finish(self, manifest, budget_s: float) -> "Encoder | None":
        """The push committed as `manifest`: self, if a delta from the base can rebuild it and the
        encodings still to do should end within budget_s (from the ones done so far: a delta ready
        later than that would make the workers wait longer than the version whole costs them; then it
        is dropped at once and the pool's cores go back to serving). Its assembly then waits for the
        encodings on a thread of its own; else None."""
        b = self.base.manifest
        if (self.broken or self.lag_s() > budget_s or manifest.is_adapter or manifest.lineage != b.lineage
                or manifest.version <= b.version or len(self.futures) != len(manifest.chunks)
                or [t[:3] for t in manifest.tensors] != [t[:3] for t in b.tensors] or self.at != b.nbytes):
            self.abandon()
            self.base = self.futures = None
            return None
        threading.Thread(target=self._assemble, args=(manifest,), name="delta-assemble", daemon=True).start()
        return self

    def _assemble(self, manifest) -> None:
        entries, chunks, changed = [], [], {}
        try:
            for f in self.futures:
                codec, data, crc, counts, width, _ = f.result()
                for fam, (c, n) in counts.items():
                    acc = changed.setdefault(fam, [0, 0])
                    acc[0], acc[1] = acc[0] + c, acc[1] + n
                entries.append([codec, 0 if data is None else int(data.size), crc, width])
                chunks.append(data)
            self.manifest = DeltaManifest(manifest.version, manifest.lineage, self.base.manifest.version,
                                          entries, changed)
            self.chunks = chunks
        except Exception:  # noqa: BLE001 -- a delta that cannot be made: the version travels whole
            self.manifest = self.chunks = None
        self.base = self.futures = None  # the base's bytes may go now
        self.done = True

    def _encode_one(self, old: np.ndarray, new: np.ndarray, layout, xor_ok: bool) -> tuple:
        """(codec, bytes, their CRC32, {family: [changed, positions]}, width, seconds) of one chunk, on the
        pool; a chunk that went through zlib updates the measured xor_rate."""
        out = _encode_one(old, new, layout, xor_ok)
        if out[0] == "xor" or (xor_ok and out[0] == "full"):
            self.xor_rate = 0.5 * self.xor_rate + 0.5 * new.size / max(out[5], 1e-6)
        with self.lock:
            self.encoded = (self.encoded[0] + 1, self.encoded[1] + out[5])
        return out


def _encode_one(old: np.ndarray, new: np.ndarray, layout, xor_ok: bool = True) -> tuple:
    """(codec, bytes, their CRC32, {family: [changed, positions]}, width, seconds) of one chunk."""
    t0 = time.perf_counter()
    width, parts = layout
    codec, data, where = encode(old, new, width, xor_ok)
    counts: dict = {}
    count_changed(where, width, parts, counts)
    crc = versions.crc32_bytes(memoryview(data)) if data is not None else 0
    return codec, data, crc, counts, width, time.perf_counter() - t0
