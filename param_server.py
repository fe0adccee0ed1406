"""The parameter server: the hub every role knows the address of (RLAX section "parameter server").

    python param_server.py --bind tcp://127.0.0.1:5555 --state-dir runs/demo/param_server

It holds three things and nothing else:
  1. Weight versions, streamed in chunks (wire.py, "weights, streamed in chunks"). The trainer sends
     a version chunk by chunk (push_chunk, each CRC-checked on arrival), then its manifest
     (push_commit); the server checks the manifest against the chunks and every tensor's CRC32, then
     swaps the version in atomically (a worker asking at any moment sees the old version or the new
     one, never a mix). A corrupt chunk, a bad manifest, a new push or silence for push_timeout_s
     discards the pending push with a clear error; the previous version keeps being served. It keeps
     the last `keep_versions` and persists the newest to disk (a safetensors file written from the
     chunks to a temporary file and renamed, by a thread of its own after the commit is answered,
     so no push or fetch waits for the disk) so a restarted server serves it; a version committed
     but not yet on disk when the server dies is pushed again by the trainer, which re-pushes
     whenever the server's newest version is not its own (trainer.check_param_server). Workers ask for the
     newest manifest (get_weights, a long poll with a minimum version) and fetch its chunks
     (get_chunk), from here or, in relay mode, from each other (RelayTree below; the workers' side is
     inference_worker.WeightFetcher): the server then sends each version about once, not once per
     worker.
  2. The work queue. The trainer enqueues work items (one prompt + its tests + group size G);
     workers lease them for a short `lease_s` and renew the leases with heartbeats while they
     sample, so a slow live worker keeps its items and a dead one loses them within `lease_s`; a
     restarted worker's hello releases its predecessor's leases at once. A released or expired
     item goes back to the front of the queue, so no item is lost (invariant 3). A submission must
     carry a lease the server issued for that item, and be what the item asked for (its lineage, a
     version >= its min_version, G x T = group_size x seq_len, its eval flag): any other is refused
     with an Error and the item stays out for sampling, so the trainer only ever sees rollouts it
     can batch.
  3. Finished rollouts, buffered until the trainer takes them and acknowledges them: a reply that
     is lost on the way is sent again with the next one. The first completed group for an item
     wins; a second one (a slow original worker after a re-issue) is a duplicate: counted and
     dropped, so a completion is used at most once.
The rules themselves (what a rollout is worth, what happens to an item when something stops) are
in lifecycle.py; this file is their bookkeeping and the socket.

Messages in (see wire.py): ping, push_chunk, push_commit, get_weights, get_chunk, enqueue_work, hello,
lease_work, renew_leases, submit_rollout, get_rollouts, get_stats. Out: pong, ok, weight_manifest,
weights_unchanged, chunk, work, rollouts, error.

What is deliberately NOT persisted: the work queue and the rollout buffer. The trainer owns the data
cursor and knows which items are in flight; when it sees the server's `instance` change (a restart),
it enqueues them again. One owner for that state means no two copies can disagree.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import math
import signal
import struct
import threading
import time
import zlib
from dataclasses import dataclass

import numpy as np

import cli
import wire


@dataclass
class Config:
    """Parameter server settings."""
    bind: str = "tcp://127.0.0.1:5555"
    """ZeroMQ address to serve on; anything but loopback needs CURVE keys (RLAX_CURVE_KEY)"""
    state_dir: str = "runs/default/param_server"
    """where the newest weight version is persisted, to survive a restart"""
    keep_versions: int = 3
    """how many recent weight versions to keep in memory"""
    max_items: int = 100_000
    """most work items held at once (queued + leased + finished); more is refused"""
    remember_done: int = 200_000
    """how many delivered item ids to remember, to recognise duplicates that arrive late"""
    relay_fanout: int = 2
    """relay broadcast: each relaying worker passes weights on to this many others (1: a chain)"""
    relay_ttl_s: float = 30.0
    """a relaying worker that has not asked for weights for this long leaves the relay tree"""
    push_timeout_s: float = 120.0
    """a weight push that sends no chunk for this long is discarded (its trainer died mid-push)"""

    def __post_init__(self):
        if self.keep_versions < 1 or self.max_items < 1 or self.remember_done < 1 or self.relay_fanout < 1:
            raise ValueError("keep_versions, max_items, remember_done and relay_fanout must be >= 1")


# ----------------------------------------------------------------------------- weights

# safetensors' names of the wire's dtypes: a persisted version is a valid safetensors file.
_ST_DTYPES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
              "uint32": "U32", "float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64"}


@dataclass
class Version:
    """One complete, verified weight version: its manifest and its chunks (uint8 arrays, in order)."""
    manifest: wire.Manifest
    chunks: list


class WeightStore:
    """Versioned weight sets. A set is only visible once complete and verified (invariant 4): chunks of
    a push collect in `pending`, and only a commit whose manifest matches them and every tensor's CRC
    adds the version. One push is pending at a time: a new push (or a wrong chunk) discards it."""

    def __init__(self, state_dir: str, keep: int):
        self.dir, self.keep = state_dir, keep
        self.versions: collections.OrderedDict[int, Version] = collections.OrderedDict()
        self.pending: dict | None = None  # {"id", "chunks", "crcs", "t"}
        self.discarded = 0
        os.makedirs(state_dir, exist_ok=True)
        self._load_persisted()
        # The persister thread writes the newest committed version; versions committed while it
        # writes coalesce into the newest of them. `persisted` = (version, lineage) on disk.
        self.persisted = (self.newest, self.lineage)
        self._to_persist: Version | None = None
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
        print(f"[param_server] weight push {self.pending['id']} discarded: {why}; "
              f"still serving v{self.newest}", flush=True)
        self.pending, self.discarded = None, self.discarded + 1

    def receive_chunk(self, msg: wire.PushChunk) -> int:
        """Add one chunk to the pending push; returns how many it holds."""
        data = wire.chunk_array(msg.data)
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
            manifest = wire.Manifest.from_dict(msg.manifest)
            received = [[int(c.size), crc] for c, crc in zip(p["chunks"], p["crcs"])]
            if manifest.chunks != received:
                raise ValueError(f"manifest lists {len(manifest.chunks)} chunks that differ from the "
                                 f"{len(received)} received")
            manifest.check_tensors(p["chunks"], p["crcs"])  # each chunk's CRC was checked on arrival
        except ValueError as e:  # WireError is one too
            self._discard(str(e))
            raise ValueError(f"push {msg.push_id} refused: {e}") from None
        self.pending = None
        self.put(Version(manifest, p["chunks"]))

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
        for old in [old for old in self.versions if old >= version]:
            del self.versions[old]
        self.versions[version] = v
        while len(self.versions) > self.keep:
            self.versions.popitem(last=False)
        with self._disk:
            self._to_persist = v
            self._disk.notify_all()

    def _persister(self) -> None:
        while True:
            with self._disk:
                self._disk.wait_for(lambda: self._to_persist is not None)
                v, self._to_persist, self._writing = self._to_persist, None, True
            try:
                self._persist(v)
                done = (v.manifest.version, v.manifest.lineage)
            except OSError as e:  # a full disk must not stop the serving: the file stays the old one
                print(f"[param_server] could not persist weights v{v.manifest.version}: {e!r}", flush=True)
                done = self.persisted
            with self._disk:
                self.persisted, self._writing = done, False
                self._disk.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait until the newest committed version is on disk (or timeout_s); True if nothing is left."""
        with self._disk:
            return self._disk.wait_for(lambda: self._to_persist is None and not self._writing, timeout_s)

    def chunk(self, msg: wire.GetChunk) -> wire.Chunk:
        v = self.versions.get(msg.version)
        if v is None or v.manifest.lineage != msg.lineage:
            raise ValueError(f"weights v{msg.version} of lineage {msg.lineage!r} are not held here "
                             f"(newest: v{self.newest})")
        if not 0 <= msg.index < len(v.chunks):
            raise ValueError(f"chunk index {msg.index} outside [0, {len(v.chunks)})")
        return wire.Chunk(msg.version, msg.index, v.chunks[msg.index], v.manifest.chunks[msg.index][1])

    def _persist(self, v: Version) -> None:
        """Write the version as a safetensors file straight from its chunks (their bytes are the data
        section), to a temporary file renamed over the old one: a crash leaves the old file or the new."""
        m, header, at = v.manifest, {}, 0
        for name, dtype, shape, _ in m.tensors:
            n = math.prod(shape) * np.dtype(wire._DTYPES[dtype]).itemsize
            header[name] = {"dtype": _ST_DTYPES[dtype], "shape": shape, "data_offsets": [at, at + n]}
            at += n
        header["__metadata__"] = {"version": str(m.version), "lineage": m.lineage,
                                  "checksums": json.dumps({t[0]: t[3] for t in m.tensors})}
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        path = os.path.join(self.dir, "weights.safetensors")
        with open(path + ".tmp", "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            for c in v.chunks:
                f.write(memoryview(c))
        os.replace(path + ".tmp", path)

    def _load_persisted(self) -> None:
        path = os.path.join(self.dir, "weights.safetensors")
        if not os.path.exists(path):
            return
        try:
            with open(path, "rb") as f:
                header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
                meta = header.pop("__metadata__")
                names = sorted(header, key=lambda n: header[n]["data_offsets"][0])
                dtypes = {st: name for name, st in _ST_DTYPES.items()}
                checksums = json.loads(meta["checksums"])
                tensors = [[n, dtypes[header[n]["dtype"]], header[n]["shape"], checksums[n]] for n in names]
                chunks = []
                while piece := f.read(wire.CHUNK_BYTES):
                    chunks.append(np.frombuffer(piece, np.uint8))
            crcs = [zlib.crc32(memoryview(c)) for c in chunks]
            manifest = wire.Manifest.from_dict({"version": int(meta["version"]), "lineage": meta.get("lineage", ""),
                                                "tensors": tensors, "chunks": [[int(c.size), crc] for c, crc in zip(chunks, crcs)]})
            manifest.check_tensors(chunks, crcs)
        except Exception as e:  # a corrupt file must not stop the server: it waits for a push
            print(f"[param_server] ignoring corrupt persisted weights {path}: {e!r}", flush=True)
            return
        self.versions[manifest.version] = Version(manifest, chunks)
        print(f"[param_server] restored weights version {manifest.version} from {path}", flush=True)


class RelayTree:
    """Who fetches weights from whom. Relaying workers join in the order they first ask for weights;
    worker 0 fetches from this server, worker i > 0 from worker (i - 1) // fanout: a tree of the given
    fan-out (1: a chain) whose root alone fetches from here, so this server sends each version about
    once whatever the fleet size. A worker is told its whole ancestry, nearest first, then this server
    (""): a child whose parent does not answer moves up one step. A worker that has not asked for
    weights within ttl_s is dropped and the ones after it move up; a restarted worker (same name) keeps
    its place with its new address."""

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


# ----------------------------------------------------------------------------- work and rollouts

@dataclass
class Item:
    data: dict
    state: str = "queued"     # queued -> leased -> done (rollout buffered) -> sent (awaiting ack) -> forgotten
    lease: str = ""           # the current lease token ("" when queued)
    leases: set = dataclasses.field(default_factory=set)  # every token issued for it: a late but
    worker: str = ""          # genuine submission under an earlier lease still counts
    incarnation: str = ""
    deadline: float = 0.0


class WorkQueue:
    """The queue of work items, their leases and the finished rollouts (see lifecycle.py's table)."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.items: dict[str, Item] = {}
        self.queue: collections.deque[str] = collections.deque()
        self.finished: collections.OrderedDict[str, dict] = collections.OrderedDict()  # item_id -> rollout
        self.sent: collections.OrderedDict[str, dict] = collections.OrderedDict()      # replied, not acked
        self.delivered: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.incarnations: dict[str, str] = {}  # worker name -> its newest incarnation
        self.counts = collections.Counter()

    def enqueue(self, items: list, requeue: bool) -> dict:
        items = [wire.WorkItem.from_dict(data) for data in items]  # all or nothing: check every one first
        if len(self.items) + len(items) > self.cfg.max_items:
            raise ValueError(f"queue full ({len(self.items)} of {self.cfg.max_items} items held)")
        added = 0
        for item in items:
            if item.item_id in self.items:
                continue  # idempotent: already queued, leased or finished
            if item.item_id in self.delivered and not requeue:
                continue
            self.delivered.pop(item.item_id, None)
            self.items[item.item_id] = Item(item.to_dict())
            self.queue.append(item.item_id)
            added += 1
        self.counts["enqueued"] += added
        return {"added": added, "queued": len(self.queue)}

    def hello(self, worker: str, incarnation: str) -> int:
        """A worker (re)started: the leases its earlier incarnation held go back to the queue now,
        not when they would expire. Returns how many."""
        if not incarnation or self.incarnations.get(worker) == incarnation:
            return 0
        self.incarnations[worker] = incarnation
        dead = [i for i, it in self.items.items()
                if it.state == "leased" and it.worker == worker and it.incarnation != incarnation]
        for item_id in reversed(dead):
            self._requeue(item_id)
        self.counts["released_on_hello"] += len(dead)
        return len(dead)

    @staticmethod
    def check_lease_s(lease_s: float) -> None:
        if not 0 < lease_s <= 3600:
            raise ValueError("lease_s must be in (0, 3600]")

    def lease(self, worker: str, max_items: int, lease_s: float, incarnation: str = "") -> list:
        if max_items < 1:
            raise ValueError("max_items must be >= 1")
        self.check_lease_s(lease_s)
        self.hello(worker, incarnation)
        out = []
        while self.queue and len(out) < max_items:
            item = self.items[self.queue.popleft()]
            item.state, item.lease = "leased", os.urandom(6).hex()
            item.leases.add(item.lease)
            item.worker, item.incarnation, item.deadline = worker, incarnation, time.monotonic() + lease_s
            self.counts["leased"] += 1
            self.counts["reissued"] += len(item.leases) > 1
            out.append({**item.data, "lease": item.lease})
        return out

    def renew(self, worker: str, leases: list, lease_s: float, incarnation: str = "") -> dict:
        """Heartbeat: extend the leases this worker still holds; name the ones it lost (expired and
        re-leased to someone else, or already finished)."""
        self.check_lease_s(lease_s)
        self.hello(worker, incarnation)
        renewed, lost = 0, []
        for pair in leases:
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
                raise ValueError("leases must be [item_id, lease] pairs of strings")
            item = self.items.get(pair[0])
            if item is not None and item.state == "leased" and item.lease == pair[1]:
                item.deadline = time.monotonic() + lease_s
                renewed += 1
            else:
                lost.append(pair[0])
        self.counts["renewed"] += renewed
        return {"renewed": renewed, "lost": lost}

    def _requeue(self, item_id: str) -> None:
        item = self.items[item_id]
        item.state, item.lease = "queued", ""
        self.queue.appendleft(item_id)  # oldest work first: it has waited longest

    def reset(self) -> None:
        self.counts["reset_items"] += len(self.items)
        self.items.clear()
        self.queue.clear()
        self.finished.clear()
        self.sent.clear()
        self.delivered.clear()  # the new trainer may enqueue the same item ids again

    def expire(self) -> None:
        now = time.monotonic()
        for item_id, item in self.items.items():
            if item.state == "leased" and item.deadline < now:
                self._requeue(item_id)
                self.counts["lease_expired"] += 1

    def check_against_item(self, rollout: wire.Rollout, data: dict) -> None:
        """A rollout must be what its item asked for, or the trainer could not batch it (or would
        break the staleness bound): ValueError (an Error reply, counted) naming the first mismatch.
        Nothing changes: the item stays leased or queued, to be sampled again."""
        G, T = rollout.tokens_GT.shape
        checks = [
            (rollout.lineage == data["lineage"] or not data["lineage"],  # none named: the server's (submit)
             f"lineage {rollout.lineage!r}, the item's is {data['lineage']!r}"),
            (rollout.version >= data["min_version"],
             f"version {rollout.version} is older than the item's min_version {data['min_version']}"),
            (G == data["group_size"], f"{G} completions, the item's group_size is {data['group_size']}"),
            (T == data["seq_len"], f"{T} tokens per row, the item's seq_len is {data['seq_len']}"),
            (rollout.eval == data["eval"], f"eval={rollout.eval}, the item's is eval={data['eval']}"),
        ]
        why = next((text for ok, text in checks if not ok), "")
        if why:
            self.counts["refused"] += 1
            raise ValueError(f"item {rollout.item_id}: rollout refused: {why}")

    def submit(self, msg: wire.SubmitRollout, lineage: str) -> str:
        rollout = wire.Rollout.from_dict(msg.rollout)
        if rollout.item_id != msg.item_id:
            raise ValueError("rollout.item_id differs from the message's item_id")
        if rollout.lineage != lineage:
            self.counts["old_lineage"] += 1  # sampled with a dead trainer's weights
            return "old_lineage"
        item = self.items.get(msg.item_id)
        if item is not None and msg.lease not in item.leases:
            raise ValueError(f"item {msg.item_id}: lease {msg.lease[:16]!r} was never issued for it")
        if item is not None:
            self.check_against_item(rollout, item.data)
        if item is None or item.state not in ("queued", "leased"):
            # Finished already (a slow worker after a re-issue) or never enqueued here.
            status = "duplicate" if item or msg.item_id in self.delivered else "unknown"
            self.counts[status] += 1
            return status
        if item.state == "queued":  # expired but nobody re-leased it yet: the result is still good
            self.queue.remove(msg.item_id)
        item.state = "done"
        self.finished[msg.item_id] = {k: (v.copy() if isinstance(v, np.ndarray) else v)
                                      for k, v in rollout.to_dict().items()}
        self.counts["submitted"] += 1
        return "accepted"

    def take(self, max_items: int, ack: list = ()) -> list:
        """Rollouts for the trainer. First the acknowledged ones are forgotten; anything sent
        before and not acknowledged was lost on the way (the trainer sends one request at a time
        and acks every reply it reads), so it is sent again, then new ones up to max_items."""
        for item_id in ack:
            if not isinstance(item_id, str):
                raise ValueError("ack must list item ids")
            if self.sent.pop(item_id, None) is not None:
                del self.items[item_id]
                self.delivered[item_id] = None
                self.counts["delivered"] += 1
        while len(self.delivered) > self.cfg.remember_done:
            self.delivered.popitem(last=False)
        out = list(self.sent.values())
        self.counts["resent"] += len(out)
        while self.finished and len(out) < max_items:
            item_id, rollout = self.finished.popitem(last=False)
            self.items[item_id].state = "sent"
            self.sent[item_id] = rollout
            out.append(rollout)
        return out

    def stats(self) -> dict:
        states = collections.Counter(i.state for i in self.items.values())
        return {**self.counts, "queued": states["queued"], "leased": states["leased"],
                "finished": len(self.finished), "unacked": len(self.sent)}


# ----------------------------------------------------------------------------- the server

class ParamServer:
    """Wires the weight store and the work queue to the socket, with long polls for waiters."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.weights = WeightStore(cfg.state_dir, cfg.keep_versions)
        self.relays = RelayTree(cfg.relay_fanout, cfg.relay_ttl_s)
        self.work = WorkQueue(cfg)
        self.server = wire.Server("param_server", cfg.bind)
        self.weight_waiters: list = []   # (peer, msg, deadline)
        self.lease_waiters: list = []
        self.rollout_waiters: list = []
        s = self.server
        s.handlers[wire.Ping] = lambda m, p: wire.Pong("param_server", s.instance,
                                                       {"version": self.weights.newest,
                                                        "lineage": self.weights.lineage})
        s.on(wire.PushChunk, lambda m, p: wire.Ok({"chunks": self.weights.receive_chunk(m)}))
        s.on(wire.PushCommit, self.on_commit)
        s.on(wire.GetWeights, self.on_get_weights)
        s.on(wire.GetChunk, lambda m, p: self.check_wait(m.wait_s) or self.weights.chunk(m))
        s.on(wire.EnqueueWork, lambda m, p: wire.Ok(self.work.enqueue(m.items, m.requeue)))
        s.on(wire.Hello, lambda m, p: wire.Ok({"released": self.work.hello(m.worker, m.incarnation)}))
        s.on(wire.LeaseWork, self.on_lease)
        s.on(wire.RenewLeases, lambda m, p: wire.Ok(self.work.renew(m.worker, m.leases, m.lease_s, m.incarnation)))
        s.on(wire.SubmitRollout, lambda m, p: wire.Ok({"status": self.work.submit(m, self.weights.lineage)}))
        s.on(wire.GetRollouts, self.on_get_rollouts)
        s.on(wire.GetStats, lambda m, p: wire.Ok({**self.work.stats(), "version": self.weights.newest,
                                                  "instance": s.instance,
                                                  "bad_messages": s.bad_messages,
                                                  "bytes_sent": s.bytes_sent,
                                                  "pushes_discarded": self.weights.discarded,
                                                  "persisted_version": self.weights.persisted[0],
                                                  "relays": {n: m[0] for n, m in self.relays.members.items()}}))

    # Each handler answers now if it can; otherwise it parks the request until `tick` can answer
    # it or its wait runs out.
    def on_commit(self, msg, peer):
        old_lineage = self.weights.lineage
        self.weights.commit(msg)
        if self.weights.lineage != old_lineage:
            # A trainer restarted: the old one's queue, leases and finished rollouts belong to a
            # policy history that no longer exists. The new trainer re-enqueues what it needs;
            # late submissions for the old items are answered "unknown" and dropped.
            print(f"[param_server] new trainer lineage {self.weights.lineage}: dropping the old one's "
                  f"{len(self.work.items)} items", flush=True)
            self.work.reset()
        return wire.Ok({"version": self.weights.newest})

    def _weights_ready(self, msg) -> bool:
        """A waiter is answered once min_version exists, or once a new trainer lineage does."""
        return self.weights.newest >= 0 and (
            self.weights.newest >= msg.min_version or
            (msg.have_version >= 0 or bool(msg.have_lineage)) and self.weights.lineage != msg.have_lineage)

    def _weights_reply(self, msg):
        newest, lineage = self.weights.newest, self.weights.lineage
        if newest < 0 or (newest, lineage) == (msg.have_version, msg.have_lineage) or not self._weights_ready(msg):
            return wire.WeightsUnchanged(newest, lineage)
        sources = self.relays.sources(msg.worker) if msg.relay else [""]
        return wire.WeightManifest(self.weights.versions[newest].manifest.to_dict(), sources)

    @staticmethod
    def check_wait(wait_s: float) -> None:
        if not 0 <= wait_s <= 600:
            raise ValueError(f"wait_s must be in [0, 600] seconds, got {wait_s}")

    def on_get_weights(self, msg, peer):
        self.check_wait(msg.wait_s)
        if msg.relay:
            self.relays.join(msg.worker, msg.relay)
        if self._weights_ready(msg) or msg.wait_s <= 0:
            return self._weights_reply(msg)
        self.weight_waiters.append((peer, msg, time.monotonic() + msg.wait_s))

    def on_lease(self, msg, peer):
        self.check_wait(msg.wait_s)
        items = self.work.lease(msg.worker, msg.max_items, msg.lease_s, msg.incarnation)
        if items or msg.wait_s <= 0:
            return wire.Work(items)
        self.lease_waiters.append((peer, msg, time.monotonic() + msg.wait_s))

    def on_get_rollouts(self, msg, peer):
        self.check_wait(msg.wait_s)
        if msg.max_items < 1:
            raise ValueError("max_items must be >= 1")
        rollouts = self.work.take(msg.max_items, msg.ack)
        if rollouts or msg.wait_s <= 0:
            return wire.Rollouts(rollouts, self.work.stats())
        self.rollout_waiters.append((peer, msg, time.monotonic() + msg.wait_s))

    def tick(self) -> None:
        self.work.expire()
        self.weights.expire(self.cfg.push_timeout_s)
        now = time.monotonic()

        def serve(waiters, ready, answer):
            keep = []
            for peer, msg, deadline in waiters:
                if ready(msg) or deadline < now:
                    self.server.reply(peer, answer(msg))
                else:
                    keep.append((peer, msg, deadline))
            return keep
        self.weight_waiters = serve(self.weight_waiters, self._weights_ready, self._weights_reply)
        self.lease_waiters = serve(self.lease_waiters, lambda m: bool(self.work.queue),
                                   lambda m: wire.Work(self.work.lease(m.worker, m.max_items, m.lease_s, m.incarnation)))
        self.rollout_waiters = serve(self.rollout_waiters, lambda m: bool(self.work.finished),
                                     lambda m: wire.Rollouts(self.work.take(m.max_items), self.work.stats()))

    def serve(self, stop: threading.Event | None = None) -> None:
        print(f"[param_server] serving on {self.cfg.bind} (instance {self.server.instance}, "
              f"weights version {self.weights.newest})", flush=True)
        self.server.serve(stop, self.tick, poll_ms=20)


if __name__ == "__main__":
    config = cli.parse(Config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server = ParamServer(config)
    try:
        server.serve(stop)
    except KeyboardInterrupt:
        pass
    server.weights.flush(timeout_s=60)  # a version being written finishes; the file is never torn anyway
