"""Today's weight transport: chunks over ZeroMQ, through the param server, relayed worker to worker.

One implementation of weights.Transport (weights.py tells a version's whole life; versions.py its
format). The trainer pushes a version chunk by chunk (`push_weights`); the param server's
`WeightStore` makes it visible complete and checked (its `publish`) and tells each worker where to
fetch it (`RelayTree`); a worker's `WeightFetcher` fetches it in a thread of its own, serves it on to
other workers (`ChunkServer`, relay) and hands it, complete and checked, to its main thread (its
`newest`). wire.py carries the messages: PushChunk, PushCommit, GetWeights, WeightManifest,
WeightsUnchanged, GetChunk, Chunk.
"""
from __future__ import annotations

import collections
import concurrent.futures
import mmap
import os
import threading
import time
import traceback
from typing import Callable

import zmq

import deltas
import versions
import weights
import wire
from versions import CHUNK_BYTES, Manifest, Version, VersionBuffer, VersionKey, check_lora, chunk_array, cut_chunks

PUSH_WINDOW = 4  # chunks a push keeps in flight (wire.Client.pipeline): the sender never idles on a receipt


# ----------------------------------------------------------------------------- pushed (trainer)

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

class WeightStore(weights.Transport):
    """Versioned weight sets. A set is only visible once complete and verified (invariant 4): chunks of
    a push collect in `pending`, and only a commit whose manifest matches them and every tensor's CRC
    adds the version (`publish`). One push is pending at a time: a new push (or a wrong chunk)
    discards it. `keep`: how many versions to hold; `state_dir`: where the newest is persisted;
    `log(text)`: our log lines; `mirrors`: other transports every persisted version is also
    published to, from the persister thread (weights_fs.DirTransport: --weights-dir).

    ADAPTER VERSIONS. The newest full version of the current lineage is the BASE, pinned: held (and
    served) whatever `keep` says, because every adapter version of the lineage applies to it. An
    adapter version is refused unless the base it names is the pinned one; a new full version
    becomes the base, and a new lineage drops the old one's. On disk the base is weights.safetensors
    and the newest adapter version, if newer, adapter.safetensors (PERSIST_FILES): a restarted
    server serves both."""

    PERSIST_FILES = {"full": "weights.safetensors", "adapter": "adapter.safetensors"}

    def __init__(self, state_dir: str, keep: int, log: Callable[[str], None], mirrors: tuple = (),
                 deltas_on: bool = True, delta_wait_s: float = -1.0):
        self.dir, self.keep, self.log, self.mirrors = state_dir, keep, log, list(mirrors)
        self.delta_wait_s = delta_wait_s  # < 0: as long as the push took (delta_pending)
        self.versions: collections.OrderedDict[int, Version] = collections.OrderedDict()
        self.base: Version | None = None  # the pinned full version of the current lineage
        self.pending: dict | None = None  # {"id", "chunks", "crcs", "t", "delta"}
        self.discarded = 0
        # DELTAS (deltas.py): each chunk of a push is encoded against the same chunk of the newest full
        # version as it arrives, on this pool (numpy and zlib release the GIL), so that the delta is
        # ready about when the commit is. None: every version travels whole (--no-deltas).
        self.pool_size = min(16, os.cpu_count() or 1)
        self.pool = concurrent.futures.ThreadPoolExecutor(self.pool_size, "delta") if deltas_on else None
        self.bytes = collections.Counter()  # pushed, served_full, served_delta: the metrics' bytes
        os.makedirs(state_dir, exist_ok=True)
        self._load_persisted()
        # The persister thread writes the newest committed version; versions committed while it
        # writes coalesce into the newest of them (an adapter version's base is written first if the
        # file does not hold it). `persisted`: the VersionKey of the newest version on disk.
        self.persisted = VersionKey(self.newest, self.lineage)
        self._base_on_disk = self.base.manifest.key if self.base is not None else None
        # A restored version goes to the mirrors too (and is rewritten here, unchanged).
        self._to_persist: Version | None = self.versions[self.newest] if self.versions and self.mirrors else None
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
            encode = self.pool is not None and self.base is not None and not self.base.is_adapter
            p = self.pending = {"id": msg.push_id, "chunks": [], "crcs": [], "t0": time.monotonic(),
                                "delta": deltas.Encoder(self.base, self.pool, self.pool_size) if encode else None}
        p["t"] = time.monotonic()
        if p["chunks"] and msg.index == len(p["chunks"]) - 1 and msg.crc == p["crcs"][-1]:
            return len(p["chunks"])  # a retry of the chunk we received last: already held
        if msg.index != len(p["chunks"]):
            self._discard(f"chunk {msg.index} arrived, expected {len(p['chunks'])}")
            raise ValueError(f"push {msg.push_id}: chunk {msg.index} out of order: push discarded")
        if versions.crc32_bytes(memoryview(data)) != msg.crc:
            self._discard(f"CRC mismatch on chunk {msg.index}")
            raise ValueError(f"push {msg.push_id}: CRC mismatch on chunk {msg.index}: push discarded, "
                             f"still serving v{self.newest}")
        p["chunks"].append(data)  # the received frame's own memory (a 16 MiB chunk is its own message): no copy
        p["crcs"].append(msg.crc)
        self.bytes["pushed"] += data.size
        if p["delta"] is not None:
            p["delta"].add(msg.index, data)
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
        # A delta is worth waiting for as long as the push took (delta_pending), or as told
        now = time.monotonic()
        budget = now - p["t0"] if self.delta_wait_s < 0 else self.delta_wait_s
        delta = p["delta"].finish(manifest, budget) if p["delta"] else None
        if delta is not None:
            delta.deadline = now + budget
        self.publish(Version(manifest, p["chunks"], delta=delta))

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

    def publish(self, v: Version) -> None:
        """Serve `v` from now on (complete and checked: commit) and persist it."""
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
        if v.is_adapter:
            v.base = self.base  # check_base made sure it is the one it names
        else:
            self.base = v  # pinned: every later adapter version of the lineage applies to it
        while len(self.versions) > self.keep:
            self.versions.popitem(last=False)
        with self._disk:
            self._to_persist = v
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
                v, self._to_persist, self._writing = self._to_persist, None, True
            done, base = self.persisted, v.base
            try:
                full, adapter = (os.path.join(self.dir, self.PERSIST_FILES[k]) for k in ("full", "adapter"))
                if v.is_adapter and self._base_on_disk != base.manifest.key:
                    versions.write_file(full, base.manifest, base.chunks)
                    self._base_on_disk = base.manifest.key
                versions.write_file(adapter if v.is_adapter else full, v.manifest, v.chunks)
                if not v.is_adapter:
                    self._base_on_disk = v.manifest.key
                    if os.path.exists(adapter):
                        os.remove(adapter)  # an older base's adapter; the loader would ignore it anyway
                done = v.manifest.key
            except OSError as e:  # a full disk must not stop the serving: the file stays the old one
                self.log(f"could not persist weights v{v.manifest.version}: {e!r}")
            for mirror in self.mirrors:
                try:
                    mirror.publish(v)
                except (OSError, ValueError) as e:  # nor must a shared disk: its readers keep what they have
                    self.log(f"could not publish weights v{v.manifest.version} to {mirror}: {e!r}")
            with self._disk:
                self.persisted, self._writing = done, False
                self._disk.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait until the newest committed version is on disk (or timeout_s); True if nothing is left."""
        with self._disk:
            return self._disk.wait_for(lambda: self._to_persist is None and not self._writing, timeout_s)

    def delta(self, version: int, lineage: str, have: VersionKey) -> "deltas.DeltaManifest | None":
        """The delta that rebuilds (version, lineage) from `have`, if one is made and ready."""
        v = self.held(version, lineage)
        d = v.delta if v is not None else None
        if d is None or not d.done or d.manifest is None or have != VersionKey(d.manifest.base, lineage):
            return None
        return d.manifest

    def delta_pending(self, version: int, lineage: str, have: VersionKey) -> bool:
        """A delta from `have` to (version, lineage) is still being encoded and worth waiting for: for
        at most as long as its push took (or delta_wait_s). The version whole costs a worker about what it cost the
        trainer to push it, so a delta that takes longer to encode than that cannot pay off: then the
        wire is faster than the encoder (a fast network, or many positions changed), and the worker
        gets the version whole."""
        v = self.held(version, lineage)
        d = v.delta if v is not None else None
        return d is not None and not d.done and have == d.base_key and time.monotonic() < d.deadline

    def chunk(self, msg: wire.GetChunk) -> wire.Chunk:
        v = self.held(msg.version, msg.lineage)
        if v is None:
            raise ValueError(f"weights v{msg.version} of lineage {msg.lineage!r} are not held here "
                             f"(newest: v{self.newest})")
        if not 0 <= msg.index < len(v.chunks):
            raise ValueError(f"chunk index {msg.index} outside [0, {len(v.chunks)})")
        if msg.delta:
            d = v.delta
            if d is None or not d.done or d.manifest is None or d.chunks[msg.index] is None:
                raise ValueError(f"no delta chunk {msg.index} of v{msg.version} here")
            self.bytes["served_delta"] += d.chunks[msg.index].size
            return wire.Chunk(msg.version, msg.index, d.chunks[msg.index], d.manifest.chunks[msg.index][2])
        self.bytes["served_full"] += v.chunks[msg.index].size
        return wire.Chunk(msg.version, msg.index, v.chunks[msg.index], v.manifest.chunks[msg.index][1])

    def _load_persisted(self) -> None:
        """The base and, if it applies to that base, the newest adapter version, as persisted; a
        corrupt or missing file is ignored (the server waits for a push)."""
        full = self._read_persisted(os.path.join(self.dir, self.PERSIST_FILES["full"]))
        if full is None or full.is_adapter:
            return
        self.versions[full.manifest.version] = self.base = full
        path = os.path.join(self.dir, self.PERSIST_FILES["adapter"])
        adapter = self._read_persisted(path)
        if adapter is not None and adapter.manifest.base_key == full.manifest.key:
            self.versions[adapter.manifest.version] = adapter
            adapter.base = full
        elif adapter is not None:
            self.log(f"ignoring {path}: its base v{adapter.manifest.base} is not the persisted full version")

    def _read_persisted(self, path: str) -> Version | None:
        if not os.path.exists(path):
            return None
        try:
            buf = versions.read_file(path)
        except (ValueError, OSError) as e:  # a corrupt file must not stop the server: it waits for a push
            self.log(f"ignoring corrupt persisted weights {e}")
            return None
        self.log(f"restored weights version {buf.manifest.version} from {path}")
        return Version(buf.manifest, buf.chunks())


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

class WeightFetcher(weights.Transport):
    """Fetches weight versions in a thread of its own (its own sockets), so a version arrives while
    the worker's main thread samples; the main thread swaps it in between batches
    (inference_worker.Worker.pull).

    Loop: long-poll the param server for a manifest newer than the one we hold (get_weights), fetch
    its chunks in order (several requests in flight), check each chunk's CRC as it arrives and every
    tensor's once all are in, then offer the version to the main thread (`newest`). A version is
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
    def newest(self, min_version: int, lineage: str, wait_s: float) -> VersionBuffer | None:
        """A complete version not yet offered, of at least min_version or of a lineage other than
        `lineage`, waiting up to wait_s for one; None if there is none."""
        def newer():
            r = self.ready
            return r is not None and not r.installed and (r.key.version >= min_version or r.key.lineage != lineage)
        with self.cond:
            return self.ready if self.cond.wait_for(newer, timeout=wait_s) else None

    def done(self, buf: VersionBuffer) -> None:
        """The main thread has installed `buf` (or refused it): never offer it again. A relay keeps its
        bytes to serve them; so does any worker while it is the newest full version, the one the next
        delta is rebuilt from (deltas.py). Otherwise nobody needs them (the worker has it on its device)."""
        with self.cond:
            buf.installed = True
            if self.server is None and (buf is not self.ready or buf.is_adapter):
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
        return versions.new_memory(nbytes)

    # --- the fetching thread
    def run(self) -> None:
        while True:
            have = self.ready.key if self.ready is not None else VersionKey(-1, "")
            try:
                reply = self.ps.call(wire.GetWeights(have.version, have.version + 1, self.POLL_S, have.lineage, self.name,
                                                     self.incarnation, self.server.addr if self.server else "",
                                                     self.server.bytes_served if self.server else 0),
                                     timeout_s=self.POLL_S + self.timeout_s, what="weight manifest")
                if isinstance(reply, wire.WeightManifest):
                    # The param server is always the last resort, whatever the reply says.
                    sources = [s for s in reply.sources if isinstance(s, str) and s] + [""]
                    manifest = Manifest.from_dict(reply.manifest)
                    base = self.base_for(manifest, reply.base, sources) if manifest.is_adapter else None
                    delta = deltas.DeltaManifest.from_dict(reply.delta, manifest) if reply.delta else None
                    if delta is not None and self.fetch(manifest, sources, delta=delta) is not None:
                        continue
                    if not manifest.is_adapter or base is not None:
                        self.fetch(manifest, sources, base)  # whole: no delta, or it failed
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
        if base_manifest.key != manifest.base_key or base_manifest.is_adapter:
            raise wire.WireError(f"adapter v{manifest.version} came with {base_manifest.key}, not its base "
                                 f"{manifest.base_key} in full")
        return self.fetch(base_manifest, sources, offer=False)

    def fetch(self, manifest: Manifest, sources: list, base: VersionBuffer | None = None,
              offer: bool = True, delta: "deltas.DeltaManifest | None" = None) -> VersionBuffer | None:
        """Fetch one version; once complete and checked, a full one becomes our base and, if `offer`,
        it is offered to the main thread (an adapter version with its `base`). Returns it, or None
        if it failed (logged). `delta`: rebuild it from the version the delta names, which we hold,
        fetching only the delta's bytes; every rebuilt chunk is checked against the version's own
        CRC, and any failure returns None (the caller then fetches the version whole)."""
        t0 = time.monotonic()
        old = self.held(delta.base, manifest.lineage) if delta is not None else None
        if delta is not None and (old is None or not old.complete or old.manifest.nbytes != manifest.nbytes
                                  or [t[:3] for t in old.manifest.tensors] != [t[:3] for t in manifest.tensors]):
            return None  # the base is gone (a new version replaced it), or is not laid out alike: whole, then
        with self.cond:
            if delta is None and self.ready is not None and self.ready.installed:
                self.retire(self.ready)  # served long enough: the new version replaces it
        buf = VersionBuffer(manifest, self.memory_for(manifest.nbytes))
        buf.base = base
        with self.cond:
            self.receiving = buf
        try:
            if delta is None:
                wanted = list(range(len(manifest.chunks)))
            else:
                buf.delta, buf.delta_data = delta, [None] * len(manifest.chunks)
                wanted = [i for i, c in enumerate(delta.chunks) if c[0] != "same"]
                for i in (i for i, c in enumerate(delta.chunks) if c[0] == "same"):
                    self.rebuild(buf, old, i, None)
            self.pull(buf, wanted, sources, lambda i, data: self.rebuild(buf, old, i, data) if delta is not None
                      else buf.put(i, data, manifest.chunks[i][1]))
            manifest.check_tensors((buf.chunk(i) for i in range(len(manifest.chunks))),
                                   [crc for _, crc in manifest.chunks])  # each checked where it lies
            buf.complete = True
        except (ValueError, TimeoutError, wire.RemoteError) as e:
            self.log(f"weights v{manifest.version}{' (delta)' if delta else ''} refused: {e}")
            return None
        finally:
            with self.cond:
                self.receiving = None
                if not buf.complete:
                    self.retire(buf)
        self.adopt(buf, offer)
        what = (f"adapter v{manifest.version} (on base v{manifest.base})" if manifest.is_adapter
                else f"v{manifest.version}" + ("" if offer else " (a base)"))
        how = f", as a delta from v{delta.base}: {buf.fetched_bytes / 2**20:.2f} MiB" if delta is not None else ""
        self.log(f"fetched weights {what} ({manifest.nbytes / 2**20:.1f} MiB, "
                 f"{len(manifest.chunks)} chunks{how}) in {time.monotonic() - t0:.2f}s")
        return buf

    def pull(self, buf: VersionBuffer, wanted: list, sources: list, land: Callable) -> None:
        """Fetch chunks `wanted` (indices, in order) of buf's version, the delta's bytes if buf.delta,
        from the nearest trusted source, FETCH_WINDOW in flight; `land(i, data)` writes and checks each
        (raises ValueError if it is corrupt). A relay that fails a chunk: the rest are asked one step
        up (a relay that timed out is shunned for SHUN_S; one that lacks a delta is not: it fetched the
        version whole). Raises if the param server itself cannot give them."""
        manifest, at, skip = buf.manifest, 0, set()
        while at < len(wanted):
            now = time.monotonic()
            source = next(s for s in sources if not s or (self.shunned.get(s, 0) < now and s not in skip))
            try:
                for reply in self.ask(source, manifest, wanted[at:], buf.delta is not None):
                    i = wanted[at]
                    if not isinstance(reply, wire.Chunk):
                        raise ValueError(f"{source or 'the param server'} answered {reply.TYPE}, not a chunk")
                    data = chunk_array(reply.data)
                    size = buf.delta.chunks[i][1] if buf.delta is not None else manifest.chunks[i][0]
                    if reply.index != i or data.size != size:
                        raise ValueError(f"chunk {i} from {source or 'the param server'} is not the one asked for")
                    land(i, data)
                    buf.fetched_bytes += data.size
                    at += 1
                    if self.fetch_delay_s:
                        time.sleep(self.fetch_delay_s)
            except (TimeoutError, wire.RemoteError, ValueError) as e:  # wire.WireError is a ValueError
                if not source:  # the param server no longer has it (superseded) or is down
                    raise ValueError(f"giving up at chunk {wanted[at]}: {e}") from None
                self.log(f"weights v{manifest.version}: relay {source} failed on chunk {wanted[at]} ({e}); "
                         f"asking one step up")
                if isinstance(e, TimeoutError) or buf.delta is None:
                    self.shunned[source] = now + self.SHUN_S
                skip.add(source)

    @staticmethod
    def rebuild(buf: VersionBuffer, old: VersionBuffer, i: int, data) -> None:
        """Chunk i of `buf` rebuilt from the same chunk of `old` and the delta's bytes `data` (None for an
        unchanged chunk), checked against the delta's CRC of those bytes and then the version's own
        CRC of the chunk; ValueError if either does not match."""
        codec, _, crc, width = buf.delta.chunks[i]
        if data is not None and versions.crc32_bytes(memoryview(data)) != crc:
            raise ValueError(f"delta chunk {i} is corrupt")
        at, n = buf.offsets[i], buf.manifest.chunks[i][0]
        deltas.decode(codec, data, old.stream[at:at + n], buf.chunk(i), width)  # the same bytes of the version before
        if versions.crc32_bytes(memoryview(buf.chunk(i))) != buf.manifest.chunks[i][1]:
            raise ValueError(f"chunk {i} rebuilt from the delta from v{buf.delta.base} is not the version's")
        buf.delta_data[i] = data
        buf.have[i] = True

    def adopt(self, buf: VersionBuffer, offer: bool) -> None:
        """A complete, checked version: a full one becomes our base (the old base's memory goes once
        installed and not on offer); if `offer`, it replaces the version on offer to the main thread."""
        with self.cond:
            if not buf.is_adapter:
                old_base, self.base = self.base, buf
                if old_base is not None and old_base is not self.ready and old_base.installed:
                    self.retire(old_base)
            if offer:
                old = self.ready
                self.ready = buf
                if old is not None and old.installed:
                    self.retire(old)
                self.cond.notify_all()

    def ask(self, source: str, manifest: Manifest, indices: list, delta: bool = False):
        """The replies to GetChunk for chunks `indices` of `manifest` (the delta's bytes for them if
        `delta`) from `source` ("" = the param server), in order, FETCH_WINDOW requests in flight
        (wire.Client.pipeline). A relay may hold a request up to relay_timeout_s for a chunk it is still
        receiving."""
        wait_s = self.relay_timeout_s if source else 0.0
        msgs = (wire.GetChunk(manifest.version, manifest.lineage, i, wait_s, delta) for i in indices)
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
        self.fetcher, self.waiting, self.bytes_served = fetcher, [], 0
        self.server = wire.Server(fetcher.name + "-relay", bind)
        self.addr = self.server.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.server.on(wire.GetChunk, self.on_get_chunk)
        threading.Thread(target=self.server.serve, kwargs={"tick": self.tick, "poll_ms": 5},
                         name="relay", daemon=True).start()

    def answer(self, msg):
        """The Chunk, None to wait, or raise (an Error reply). A delta's bytes are served if we received
        the version as that delta; a version we received whole has none (the child asks one step up)."""
        buf = self.fetcher.held(msg.version, msg.lineage)
        stream = buf.stream if buf is not None else None  # the fetcher may drop it at any moment
        if stream is not None:
            if not 0 <= msg.index < len(buf.have):
                raise ValueError(f"chunk index {msg.index} outside [0, {len(buf.have)})")
            if msg.delta:
                data = buf.delta_data[msg.index] if buf.delta_data is not None else None
                if buf.delta is None or buf.delta.chunks[msg.index][0] == "same":
                    raise ValueError(f"no delta of v{msg.version} here (this relay fetched it whole)")
                if data is None:
                    return None
                self.bytes_served += data.size
                return wire.Chunk(msg.version, msg.index, data, buf.delta.chunks[msg.index][2])
            if buf.have[msg.index]:
                start, (nbytes, crc) = buf.offsets[msg.index], buf.manifest.chunks[msg.index]
                self.bytes_served += nbytes
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
