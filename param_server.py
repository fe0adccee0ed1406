"""The parameter server: the hub every role knows the address of (RLAX section "parameter server").

    python param_server.py --bind tcp://127.0.0.1:5555 --state-dir runs/demo/param_server

It holds three things and nothing else:
  1. Weight versions. The trainer pushes a complete set per policy version (PushWeights); the server
     checks every tensor's CRC32, then swaps the version in atomically (a worker asking at any moment
     sees the old version or the new one, never a mix), keeps the last `keep_versions`, and persists
     the newest to disk (safetensors, written to a temporary file and renamed) so a restarted server
     serves it. Workers ask for the newest (GetWeights) and may wait for a minimum version.
  2. The work queue. The trainer enqueues work items (one prompt + its tests + group size G);
     workers lease them for a short `lease_s` and renew the leases with heartbeats while they
     sample, so a slow live worker keeps its items and a dead one loses them within `lease_s`; a
     restarted worker's hello releases its predecessor's leases at once. A released or expired
     item goes back to the front of the queue, so no item is lost (invariant 3). A submission must
     carry a lease the server issued for that item.
  3. Finished rollouts, buffered until the trainer takes them and acknowledges them: a reply that
     is lost on the way is sent again with the next one. The first completed group for an item
     wins; a second one (a slow original worker after a re-issue) is a duplicate: counted and
     dropped, so a completion is used at most once.
The rules themselves (what a rollout is worth, what happens to an item when something stops) are
in lifecycle.py; this file is their bookkeeping and the socket.

Messages in (see wire.py): ping, push_weights, get_weights, enqueue_work, hello, lease_work,
renew_leases, submit_rollout, get_rollouts, get_stats. Out: pong, ok, weights, weights_unchanged,
work, rollouts, error.

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
            if not isinstance(array, np.ndarray) or wire.crc32(array) != checksum:
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
            if any(wire.crc32(tensors[n]) != checksums[n] for n in names):
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
        s.on(wire.Hello, lambda m, p: wire.Ok({"released": self.work.hello(m.worker, m.incarnation)}))
        s.on(wire.LeaseWork, self.on_lease)
        s.on(wire.RenewLeases, lambda m, p: wire.Ok(self.work.renew(m.worker, m.leases, m.lease_s, m.incarnation)))
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
    try:
        ParamServer(config).serve(stop)
    except KeyboardInterrupt:
        pass
