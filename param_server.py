"""The parameter server: the hub every role knows the address of (RLAX section "parameter server").

    python param_server.py --bind tcp://127.0.0.1:5555 --state-dir runs/demo/param_server

It holds three things and nothing else:
  1. Weight versions. The trainer pushes a complete set per policy version (PushWeights); the server
     checks every tensor's CRC32, then swaps the version in atomically (a worker asking at any moment
     sees the old version or the new one, never a mix), keeps the last `keep_versions`, and persists
     the newest to disk (safetensors, written to a temporary file and renamed) so a restarted server
     serves it. Workers ask for the newest (GetWeights) and may wait for a minimum version.
  2. The work queue. The trainer enqueues work items (one prompt + its tests + group size G);
     workers lease them for `lease_s` seconds. A lease that expires (the worker was killed or is
     too slow) puts the item back at the front of the queue, so no item is lost (invariant 3).
  3. Finished rollouts, buffered until the trainer takes them. The first completed group for an
     item wins; a second one (a slow original worker after a re-issue) is a duplicate: counted
     and dropped, so a completion is used at most once.

Messages in (see wire.py): ping, push_weights, get_weights, enqueue_work, lease_work, submit_rollout,
get_rollouts, get_stats. Out: pong, ok, weights, weights_unchanged, work, rollouts, error.

What is deliberately NOT persisted: the work queue and the rollout buffer. The trainer owns the data
cursor and knows which items are in flight; when it sees the server's `instance` change (a restart),
it enqueues them again. One owner for that state means no two copies can disagree.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import signal
import threading
import time
import zlib
from dataclasses import dataclass

import numpy as np
from safetensors.numpy import load_file, save_file

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

    def __post_init__(self):
        if self.keep_versions < 1 or self.max_items < 1 or self.remember_done < 1:
            raise ValueError("keep_versions, max_items and remember_done must be >= 1")


def crc32(array: np.ndarray) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8)))


# ----------------------------------------------------------------------------- weights

class WeightStore:
    """Versioned weight sets. A set is only visible once complete and verified (invariant 4)."""

    def __init__(self, state_dir: str, keep: int):
        self.dir, self.keep = state_dir, keep
        self.versions: collections.OrderedDict[int, wire.Weights] = collections.OrderedDict()
        os.makedirs(state_dir, exist_ok=True)
        self._load_persisted()

    @property
    def newest(self) -> int:
        return next(reversed(self.versions)) if self.versions else -1

    @property
    def lineage(self) -> str:
        return self.versions[self.newest].lineage if self.versions else ""

    def put(self, msg: wire.PushWeights) -> None:
        if msg.version < 0:
            raise ValueError(f"version must be >= 0, got {msg.version}")
        if not (len(msg.names) == len(msg.arrays) == len(msg.checksums)) or not msg.names:
            raise ValueError("names, arrays and checksums must be non-empty and of equal length")
        if len(set(msg.names)) != len(msg.names) or not all(isinstance(n, str) for n in msg.names):
            raise ValueError("tensor names must be unique strings")
        for name, array, checksum in zip(msg.names, msg.arrays, msg.checksums):
            if not isinstance(array, np.ndarray) or crc32(array) != checksum:
                raise ValueError(f"checksum mismatch for tensor {name!r}: weights rejected")
        # A new lineage means a trainer (re)started, possibly from an earlier checkpoint: its
        # weights are the truth now, every version of the old lineage is forgotten, and workers
        # follow (they ask for "newest != what I have", not "newer than what I have").
        if msg.lineage != self.lineage:
            self.versions.clear()
        for v in [v for v in self.versions if v >= msg.version]:
            del self.versions[v]
        arrays = [a.copy() for a in msg.arrays]  # own the memory, not the receive buffer
        self.versions[msg.version] = wire.Weights(msg.version, list(msg.names), arrays, list(msg.checksums),
                                                  msg.lineage)
        while len(self.versions) > self.keep:
            self.versions.popitem(last=False)
        self._persist(self.versions[msg.version])

    def _persist(self, w: wire.Weights) -> None:
        path = os.path.join(self.dir, "weights.safetensors")
        meta = {"version": str(w.version), "lineage": w.lineage,
                "checksums": json.dumps(dict(zip(w.names, w.checksums)))}
        save_file(dict(zip(w.names, w.arrays)), path + ".tmp", metadata=meta)
        os.replace(path + ".tmp", path)  # atomic: a crash leaves the old file or the new one

    def _load_persisted(self) -> None:
        path = os.path.join(self.dir, "weights.safetensors")
        if not os.path.exists(path):
            return
        try:
            from safetensors import safe_open
            with safe_open(path, "np") as f:
                meta = f.metadata()
            tensors, checksums = load_file(path), json.loads(meta["checksums"])
            names = list(checksums)
            if any(crc32(tensors[n]) != checksums[n] for n in names):
                raise ValueError("checksum mismatch")
        except Exception as e:  # a corrupt file must not stop the server: it waits for a push
            print(f"[param_server] ignoring corrupt persisted weights {path}: {e!r}", flush=True)
            return
        version = int(meta["version"])
        self.versions[version] = wire.Weights(version, names, [tensors[n] for n in names],
                                              [checksums[n] for n in names], meta.get("lineage", ""))
        print(f"[param_server] restored weights version {version} from {path}", flush=True)


# ----------------------------------------------------------------------------- work and rollouts

@dataclass
class Item:
    data: dict
    state: str = "queued"     # queued -> leased -> done (rollout buffered) -> delivered (forgotten)
    lease: str = ""
    deadline: float = 0.0
    issued: int = 0           # how many times it was leased


class WorkQueue:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.items: dict[str, Item] = {}
        self.queue: collections.deque[str] = collections.deque()
        self.finished: collections.deque[dict] = collections.deque()
        self.delivered: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.counts = collections.Counter()

    def enqueue(self, items: list, requeue: bool) -> dict:
        for data in items:  # all or nothing: validate every item before changing anything
            wire.check_item(data)
        if len(self.items) + len(items) > self.cfg.max_items:
            raise ValueError(f"queue full ({len(self.items)} of {self.cfg.max_items} items held)")
        added = 0
        for data in items:
            item_id = data["item_id"]
            if item_id in self.items:
                continue  # idempotent: already queued, leased or finished
            if item_id in self.delivered and not requeue:
                continue
            self.delivered.pop(item_id, None)
            self.items[item_id] = Item(dict(data))
            self.queue.append(item_id)
            added += 1
        self.counts["enqueued"] += added
        return {"added": added, "queued": len(self.queue)}

    def lease(self, worker: str, max_items: int, lease_s: float) -> list:
        if max_items < 1 or not 0 < lease_s <= 3600:
            raise ValueError("max_items must be >= 1 and lease_s in (0, 3600]")
        out = []
        while self.queue and len(out) < max_items:
            item = self.items[self.queue.popleft()]
            item.state, item.lease = "leased", os.urandom(6).hex()
            item.deadline, item.issued = time.monotonic() + lease_s, item.issued + 1
            self.counts["leased"] += 1
            self.counts["reissued"] += item.issued > 1
            out.append({**item.data, "lease": item.lease, "worker": worker})
        return out

    def reset(self) -> None:
        self.counts["reset_items"] += len(self.items)
        self.items.clear()
        self.queue.clear()
        self.finished.clear()
        self.delivered.clear()  # the new trainer may enqueue the same item ids again

    def expire(self) -> None:
        now = time.monotonic()
        for item_id, item in self.items.items():
            if item.state == "leased" and item.deadline < now:
                item.state = "queued"
                self.queue.appendleft(item_id)  # oldest work first: it has waited longest
                self.counts["lease_expired"] += 1

    def submit(self, msg: wire.SubmitRollout, lineage: str) -> str:
        rollout = wire.check_rollout(msg.rollout)
        if rollout["item_id"] != msg.item_id:
            raise ValueError("rollout.item_id differs from the message's item_id")
        if rollout.get("lineage", "") != lineage:
            self.counts["old_lineage"] += 1  # sampled with a dead trainer's weights
            return "old_lineage"
        item = self.items.get(msg.item_id)
        if item is None or item.state in ("done", "delivered"):
            # Finished already (a slow worker after a re-issue) or never enqueued here.
            self.counts["duplicate" if item or msg.item_id in self.delivered else "unknown"] += 1
            return "duplicate" if item or msg.item_id in self.delivered else "unknown"
        if item.state == "queued":  # expired but nobody re-leased it yet: the result is still good
            self.queue.remove(msg.item_id)
        item.state = "done"
        self.finished.append({k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in rollout.items()})
        self.counts["submitted"] += 1
        return "accepted"

    def take(self, max_items: int) -> list:
        out = []
        while self.finished and len(out) < max_items:
            rollout = self.finished.popleft()
            del self.items[rollout["item_id"]]
            self.delivered[rollout["item_id"]] = None
            while len(self.delivered) > self.cfg.remember_done:
                self.delivered.popitem(last=False)
            out.append(rollout)
        self.counts["delivered"] += len(out)
        return out

    def stats(self) -> dict:
        states = collections.Counter(i.state for i in self.items.values())
        return {**self.counts, "queued": states["queued"], "leased": states["leased"],
                "finished": len(self.finished)}


# ----------------------------------------------------------------------------- the server

class ParamServer:
    """Wires the weight store and the work queue to the socket, with long polls for waiters."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.weights = WeightStore(cfg.state_dir, cfg.keep_versions)
        self.work = WorkQueue(cfg)
        self.server = wire.Server("param_server", cfg.bind)
        self.weight_waiters: list = []   # (peer, msg, deadline)
        self.lease_waiters: list = []
        self.rollout_waiters: list = []
        s = self.server
        s.handlers[wire.Ping] = lambda m, p: wire.Pong("param_server", s.instance,
                                                       {"version": self.weights.newest,
                                                        "lineage": self.weights.lineage})
        s.on(wire.PushWeights, self.on_push)
        s.on(wire.GetWeights, self.on_get_weights)
        s.on(wire.EnqueueWork, lambda m, p: wire.Ok(self.work.enqueue(m.items, m.requeue)))
        s.on(wire.LeaseWork, self.on_lease)
        s.on(wire.SubmitRollout, lambda m, p: wire.Ok({"status": self.work.submit(m, self.weights.lineage)}))
        s.on(wire.GetRollouts, self.on_get_rollouts)
        s.on(wire.GetStats, lambda m, p: wire.Ok({**self.work.stats(), "version": self.weights.newest,
                                                  "instance": s.instance,
                                                  "bad_messages": s.bad_messages}))

    # Each handler answers now if it can; otherwise it parks the request until `tick` can answer
    # it or its wait runs out.
    def on_push(self, msg, peer):
        new_lineage = msg.lineage != self.weights.lineage
        self.weights.put(msg)
        if new_lineage:
            # A trainer restarted: the old one's queue, leases and finished rollouts belong to a
            # policy history that no longer exists. The new trainer re-enqueues what it needs;
            # late submissions for the old items are answered "unknown" and dropped.
            print(f"[param_server] new trainer lineage {msg.lineage}: dropping the old one's "
                  f"{len(self.work.items)} items", flush=True)
            self.work.reset()
        return wire.Ok({"version": self.weights.newest})

    def _weights_reply(self, msg):
        newest, lineage = self.weights.newest, self.weights.lineage
        if newest < 0 or (newest, lineage) == (msg.have_version, msg.have_lineage) or newest < msg.min_version:
            return wire.WeightsUnchanged(newest, lineage)
        return self.weights.versions[newest]

    @staticmethod
    def check_wait(wait_s: float) -> None:
        if not 0 <= wait_s <= 600:
            raise ValueError(f"wait_s must be in [0, 600] seconds, got {wait_s}")

    def on_get_weights(self, msg, peer):
        self.check_wait(msg.wait_s)
        if self.weights.newest >= msg.min_version or msg.wait_s <= 0:
            return self._weights_reply(msg)
        self.weight_waiters.append((peer, msg, time.monotonic() + msg.wait_s))

    def on_lease(self, msg, peer):
        self.check_wait(msg.wait_s)
        items = self.work.lease(msg.worker, msg.max_items, msg.lease_s)
        if items or msg.wait_s <= 0:
            return wire.Work(items)
        self.lease_waiters.append((peer, msg, time.monotonic() + msg.wait_s))

    def on_get_rollouts(self, msg, peer):
        self.check_wait(msg.wait_s)
        if msg.max_items < 1:
            raise ValueError("max_items must be >= 1")
        rollouts = self.work.take(msg.max_items)
        if rollouts or msg.wait_s <= 0:
            return wire.Rollouts(rollouts, self.work.stats())
        self.rollout_waiters.append((peer, msg, time.monotonic() + msg.wait_s))

    def tick(self) -> None:
        self.work.expire()
        now = time.monotonic()

        def serve(waiters, ready, answer):
            keep = []
            for peer, msg, deadline in waiters:
                if ready(msg) or deadline < now:
                    self.server.reply(peer, answer(msg))
                else:
                    keep.append((peer, msg, deadline))
            return keep
        self.weight_waiters = serve(self.weight_waiters, lambda m: self.weights.newest >= m.min_version,
                                    self._weights_reply)
        self.lease_waiters = serve(self.lease_waiters, lambda m: bool(self.work.queue),
                                   lambda m: wire.Work(self.work.lease(m.worker, m.max_items, m.lease_s)))
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
    try:
        ParamServer(config).serve(stop)
    except KeyboardInterrupt:
        pass
