"""The parameter server: the hub every role knows the address of (RLAX section "parameter server").

    python param_server.py --bind tcp://127.0.0.1:5555 --state-dir runs/demo/param_server

It holds three things and nothing else:
  1. Weight versions (weights.py tells a version's whole life). The trainer sends a version chunk by
     chunk (push_chunk), then its manifest (push_commit); the server makes it visible only complete
     and checked, and all at once (a worker asking at any moment sees the old version or the new
     one, never a mix), and discards a corrupt, superseded or abandoned push (silent for
     push_timeout_s) while the previous version keeps being served (weights_zmq.WeightStore). It keeps
     the last `keep_versions` and persists the newest to disk from a thread of its own, so a
     restarted server serves it; a version committed but not yet on disk when the server dies is
     pushed again by the trainer, which re-pushes whenever the server's newest version is not its
     own (trainer.check_param_server). Workers ask for the newest manifest (get_weights, a long poll
     with a minimum version) and fetch its chunks (get_chunk) from here or, in relay mode, from each
     other (weights_zmq.RelayTree): the server then sends each version about once, not once per worker;
     with --weights-dir it also publishes each version into a shared directory (weights_fs.py).
     A LoRA trainer's versions after its base carry the adapter alone; the server pins the base of
     the current lineage (served and persisted whatever keep_versions says) and refuses an adapter
     version onto any other (weights.py, ADAPTER VERSIONS).
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
import os
import signal
import threading
import time
from dataclasses import dataclass

import numpy as np

import attest
import cli
import envs
from verdicts import INFRA_ERROR
import versions
import weights_fs
import weights_zmq
import wire


@dataclass
class Config:
    """Parameter server settings."""
    bind: str = "tcp://127.0.0.1:5555"
    """ZeroMQ address to serve on; anything but loopback needs CURVE keys (RLAX_CURVE_KEY)"""
    state_dir: str = "runs/default/param_server"
    """where the newest weight version is persisted, to survive a restart"""
    keep_versions: int = 3
    """how many recent weight versions to keep in memory (and in --weights-dir)"""
    weights_dir: str = ""
    """also publish every weight version, as it is persisted, into this shared directory
    (weights_fs.DirTransport) for workers started with the same --weights-dir; "" = none"""
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
    deltas: bool = True
    """send a worker that holds the version before the newest only what changed (deltas.py), encoded as
    each push arrives; --no-deltas: every version travels whole"""
    delta_wait_s: float = -1.0
    """how long a worker's request waits for a delta still being encoded before it gets the version
    whole; < 0: as long as the version's push took (the time sending it whole costs, about)"""
    verdict_key: str = ""
    """the run's verdict key file (attest.py), the verifier's: every reward of a submitted rollout must carry
    the verifier's seal, or the rollout is forged and its worker refused from then on; "": rewards unchecked"""

    def __post_init__(self):
        if self.keep_versions < 1 or self.max_items < 1 or self.remember_done < 1 or self.relay_fanout < 1:
            raise ValueError("keep_versions, max_items, remember_done and relay_fanout must be >= 1")


# ----------------------------------------------------------------------------- work and rollouts

@dataclass
class Item:
    data: dict
    state: str = "queued"     # queued -> leased -> done (rollout buffered) -> sent (awaiting ack) -> forgotten
    lease: str = ""           # the current lease token ("" when queued)
    leases: set = dataclasses.field(default_factory=set)  # every token issued for it: a late but
    worker: str = ""          # genuine submission under an earlier lease still counts
    incarnation: str = ""
    who: str = ""             # the leasing worker's identity (WorkQueue.who_is)
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
        self.key = attest.read_key(cfg.verdict_key) if cfg.verdict_key else None
        self.refused: dict[str, str] = {}  # worker identity (who_is) -> why it is refused, for good
        self.submitters: collections.OrderedDict[str, str] = collections.OrderedDict()  # item_id -> who_is

    # -- workers nobody has to trust: a liar is refused by its identity, its items go to others
    @staticmethod
    def who_is(worker: str, client_key: str = "") -> str:
        """A worker's identity: its CURVE public key when it has one (the only name it cannot change),
        else the name it gives (a run without CURVE authenticates no one)."""
        return f"key:{client_key}" if client_key else f"name:{worker}"

    def check_admitted(self, who: str) -> None:
        if who in self.refused:
            raise ValueError(f"worker {who} is refused: {self.refused[who]}")

    def refuse(self, who: str, why: str) -> None:
        """From now on `who` is refused (every message of its: an error), and the items it holds are
        issued to others at once."""
        if who not in self.refused:
            self.refused[who] = why
            self.counts["workers_refused"] += 1
            print(f"[param_server] refusing worker {who} from now on: {why}", flush=True)
        held = [i for i, it in self.items.items() if it.state == "leased" and it.who == who]
        for item_id in reversed(held):
            self._requeue(item_id)
        self.counts["reissued_from_refused"] += len(held)

    def check_seals(self, rollout: wire.Rollout, data: dict, lease: str) -> str:
        """Why the rollout's rewards are not all the verifier's (attest.py), or "". Each row's verdict must
        be sealed for this item, this lease and this row, over the job built from the item we issued and
        the completion the rollout carries. A row the verifier could not judge (infra_error, reward 0)
        may come unsealed (the worker could not reach a verifier): it is never trained on."""
        G = len(rollout.rewards_G)
        if len(rollout.texts) != G or len(rollout.macs) != G:
            return f"{len(rollout.texts)} completions and {len(rollout.macs)} verdict seals for {G} rows"
        jobs = envs.score_jobs([wire.WorkItem.from_dict(data)], rollout.texts)
        for g, (job, reward, status, mac) in enumerate(zip(jobs, rollout.rewards_G, rollout.statuses, rollout.macs)):
            if status == INFRA_ERROR and reward == 0 and not mac:
                continue
            if not attest.check(self.key, attest.context(rollout.item_id, lease, g), job, float(reward), status, mac):
                return f"row {g}: reward {float(reward)} ({status}) is not the verifier's verdict of its completion"
        return ""

    def forged(self, item_id: str, who: str, why: str) -> bool:
        """A rollout of `who` was forged (found here, or by the trainer's audit: ParamServer.on_forged): `who`
        is refused, and the item is issued again at once, whoever holds its lease, or, sent to the trainer
        and not yet acknowledged, before the ack could forget it. Returns whether it was issued again."""
        self.counts["forged"] += 1
        self.refuse(who, f"forged rollout {item_id}: {why}")
        item = self.items.get(item_id)
        again = item is not None and (item.state == "leased" or self.sent.pop(item_id, None) is not None)
        if again:
            self._requeue(item_id)
            self.counts["reissued_from_refused"] += 1
        return again

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

    def lease(self, worker: str, max_items: int, lease_s: float, incarnation: str = "", who: str = "") -> list:
        if max_items < 1:
            raise ValueError("max_items must be >= 1")
        self.check_lease_s(lease_s)
        who = who or self.who_is(worker)
        self.check_admitted(who)
        self.hello(worker, incarnation)
        out = []
        while self.queue and len(out) < max_items:
            item = self.items[self.queue.popleft()]
            item.state, item.lease = "leased", os.urandom(6).hex()
            item.leases.add(item.lease)
            item.worker, item.incarnation, item.deadline = worker, incarnation, time.monotonic() + lease_s
            item.who = who
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

    def submit(self, msg: wire.SubmitRollout, lineage: str, who: str = "") -> str:
        who = who or self.who_is(msg.worker)
        self.check_admitted(who)
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
            if self.key is not None and (why := self.check_seals(rollout, item.data, msg.lease)):
                self.forged(msg.item_id, who, why)
                raise ValueError(f"item {msg.item_id}: forged rollout refused, and its worker: {why}")
        if item is None or item.state not in ("queued", "leased"):
            # Finished already (a slow worker after a re-issue) or never enqueued here.
            status = "duplicate" if item or msg.item_id in self.delivered else "unknown"
            self.counts[status] += 1
            return status
        if item.state == "queued":  # expired but nobody re-leased it yet: the result is still good
            self.queue.remove(msg.item_id)
        item.state = "done"
        self.submitters[msg.item_id] = who
        while len(self.submitters) > self.cfg.remember_done:
            self.submitters.popitem(last=False)
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
        return {**self.counts, "refused_workers": sorted(self.refused), "queued": states["queued"], "leased": states["leased"],
                "finished": len(self.finished), "unacked": len(self.sent)}


# ----------------------------------------------------------------------------- the server

class ParamServer:
    """Wires the weight store and the work queue to the socket, with long polls for waiters."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        say = lambda text: print(f"[param_server] {text}", flush=True)  # noqa: E731
        mirrors = [weights_fs.DirTransport(cfg.weights_dir, cfg.keep_versions, say)] if cfg.weights_dir else []
        self.weights = weights_zmq.WeightStore(cfg.state_dir, cfg.keep_versions, log=say, mirrors=mirrors,
                                              deltas_on=cfg.deltas, delta_wait_s=cfg.delta_wait_s)
        self.relays = weights_zmq.RelayTree(cfg.relay_fanout, cfg.relay_ttl_s)
        self.work = WorkQueue(cfg)
        self.server = wire.Server("param_server", cfg.bind)
        self.weight_waiters: list = []   # (peer, msg, deadline)
        # Where the versions went (stats): each worker's [version it holds, since, last seen] and its
        # chunk server's bytes served; when the newest was committed, and how long until every worker held it
        self.holding: dict = {}
        self.relayed: dict = {}
        self.committed = (versions.VersionKey(-1, ""), 0.0)
        self.synced = {"version": -1, "s": -1.0}
        self.lease_waiters: list = []
        self.rollout_waiters: list = []
        s = self.server
        s.handlers[wire.Ping] = lambda m, p: wire.Pong("param_server", s.instance,
                                                       {"version": self.weights.newest,
                                                        "lineage": self.weights.lineage,
                                                        "base": self.weights.base.manifest.version
                                                        if self.weights.base is not None else -1})
        s.on(wire.PushChunk, lambda m, p: wire.Ok({"chunks": self.weights.receive_chunk(m)}))
        s.on(wire.PushCommit, self.on_commit)
        s.on(wire.GetWeights, self.on_get_weights)
        s.on(wire.GetChunk, lambda m, p: self.check_wait(m.wait_s) or self.weights.chunk(m))
        s.on(wire.EnqueueWork, lambda m, p: wire.Ok(self.work.enqueue(m.items, m.requeue)))
        s.on(wire.Hello, lambda m, p: self.admitted(m) or
             wire.Ok({"released": self.work.hello(m.worker, m.incarnation)}))
        s.on(wire.LeaseWork, self.on_lease)
        s.on(wire.RenewLeases, lambda m, p: self.admitted(m) or
             wire.Ok(self.work.renew(m.worker, m.leases, m.lease_s, m.incarnation)))
        s.on(wire.SubmitRollout, lambda m, p: wire.Ok({"status": self.work.submit(m, self.weights.lineage,
                                                                                  self.who(m))}))
        s.on(wire.ForgedRollout, self.on_forged)
        s.on(wire.GetRollouts, self.on_get_rollouts)
        s.on(wire.GetStats, lambda m, p: wire.Ok({**self.stats(), "version": self.weights.newest,
                                                  "instance": s.instance,
                                                  "bad_messages": s.bad_messages,
                                                  "bytes_sent": s.bytes_sent,
                                                  "pushes_discarded": self.weights.discarded,
                                                  "persisted_version": self.weights.persisted.version,
                                                  "relays": {n: m[0] for n, m in self.relays.members.items()}}))

    def stats(self) -> dict:
        """The work queue's counts (WorkQueue.stats) and, under "weights", where the versions' bytes went:
        pushed to us, served by us whole and as deltas, served by the workers' relays; the newest delta's
        bytes and its positions changed per tensor family; how long the last version every worker holds
        took from its commit until the last of them held it (fetched and checked; each installs it at its
        next batch boundary)."""
        w = self.weights
        newest = w.versions.get(w.newest)
        d = newest.delta if newest is not None else None
        made = d is not None and d.done and d.manifest is not None
        return {**self.work.stats(), "weights": {
            "bytes_pushed": w.bytes["pushed"], "bytes_served_full": w.bytes["served_full"],
            "bytes_served_delta": w.bytes["served_delta"], "bytes_relayed": sum(self.relayed.values()),
            "version_bytes": newest.manifest.nbytes if newest is not None else 0,
            "delta": "made" if made else "encoding" if d is not None and not d.done else "none",
            "delta_bytes": d.manifest.nbytes if made else -1,
            "delta_changed": d.manifest.changed if made else {},
            "sync_version": self.synced["version"], "sync_s": self.synced["s"]}}

    def saw_holding(self, msg) -> None:
        """A worker asked for weights saying what it holds: note when it first held it, and when every
        worker seen lately holds the newest, how long that took from the commit."""
        if not msg.worker:
            return
        now, key = time.monotonic(), versions.VersionKey(msg.have_version, msg.have_lineage)
        entry = self.holding.get(msg.worker)
        if entry is None or entry[0] != key:
            self.holding[msg.worker] = [key, now, now]
        else:
            entry[2] = now
        self.relayed[msg.worker] = msg.relayed_bytes
        newest, t_commit = self.committed
        if newest.version < 0 or self.synced["version"] == newest.version:
            return
        active = [e for e in self.holding.values() if now - e[2] <= self.cfg.relay_ttl_s]
        if active and all(e[0] == newest for e in active):
            self.synced = {"version": newest.version, "s": max(e[1] for e in active) - t_commit}

    def who(self, msg) -> str:
        """The identity of the worker whose message this is (WorkQueue.who_is): its own CURVE key, or its
        name when it holds none, or the one pair every role shares (that key names no one in particular)."""
        key = self.server.client_key
        return self.work.who_is(msg.worker, key if key != self.server.public_key else "")

    def admitted(self, msg) -> None:
        self.work.check_admitted(self.who(msg))

    def on_forged(self, msg, peer):
        """The trainer's audit found a rollout it received forged (trainer.py: audit.py): its submitter is
        refused, and the item, if the trainer has not acknowledged it, is issued again."""
        who = self.work.submitters.get(msg.item_id)
        if who is None:
            raise ValueError(f"no record of who submitted {msg.item_id}")
        return wire.Ok({"refused": who, "reissued": self.work.forged(msg.item_id, who, msg.why[:500])})

    # Each handler answers now if it can; otherwise it parks the request until `tick` can answer
    # it or its wait runs out.
    def on_commit(self, msg, peer):
        old_lineage = self.weights.lineage
        self.weights.commit(msg)
        self.committed = (versions.VersionKey(self.weights.newest, self.weights.lineage), time.monotonic())
        if self.weights.lineage != old_lineage:
            # A trainer restarted: the old one's queue, leases and finished rollouts belong to a
            # policy history that no longer exists. The new trainer re-enqueues what it needs;
            # late submissions for the old items are answered "unknown" and dropped.
            print(f"[param_server] new trainer lineage {self.weights.lineage}: dropping the old one's "
                  f"{len(self.work.items)} items", flush=True)
            self.work.reset()
        return wire.Ok({"version": self.weights.newest})

    def _weights_ready(self, msg) -> bool:
        """A waiter is answered once min_version exists, or once a new trainer lineage does; one that
        holds the version a delta of the newest is being encoded from waits for the delta too (until the
        delta's deadline, WeightStore.delta_pending, or its own long poll ends: then it gets the version
        whole)."""
        have = versions.VersionKey(msg.have_version, msg.have_lineage)
        return self.weights.newest >= 0 and (
            self.weights.newest >= msg.min_version or
            (msg.have_version >= 0 or bool(msg.have_lineage)) and self.weights.lineage != msg.have_lineage
        ) and not self.weights.delta_pending(self.weights.newest, self.weights.lineage, have)

    def _weights_reply(self, msg):
        newest, lineage = self.weights.newest, self.weights.lineage
        have = versions.VersionKey(msg.have_version, msg.have_lineage)
        if newest < 0 or versions.VersionKey(newest, lineage) == have or not self._weights_ready(msg) and (
                not self.weights.delta_pending(newest, lineage, have)):
            return wire.WeightsUnchanged(newest, lineage)
        sources = self.relays.sources(msg.worker) if msg.relay else [""]
        manifest = self.weights.versions[newest].manifest
        base = self.weights.base_manifest(manifest)  # an adapter version: the full one it applies to
        delta = self.weights.delta(newest, lineage, have)  # a worker holding the version before it
        return wire.WeightManifest(manifest.to_dict(), sources, base.to_dict() if base is not None else {},
                                   delta.to_dict() if delta is not None else {})

    @staticmethod
    def check_wait(wait_s: float) -> None:
        if not 0 <= wait_s <= 600:
            raise ValueError(f"wait_s must be in [0, 600] seconds, got {wait_s}")

    def on_get_weights(self, msg, peer):
        self.check_wait(msg.wait_s)
        self.saw_holding(msg)
        if msg.relay:
            self.relays.join(msg.worker, msg.relay)
        if self._weights_ready(msg) or msg.wait_s <= 0:
            return self._weights_reply(msg)
        self.weight_waiters.append((peer, msg, time.monotonic() + msg.wait_s))

    def on_lease(self, msg, peer):
        self.check_wait(msg.wait_s)
        msg.who = self.who(msg)  # a parked request is answered later, from tick, on behalf of this worker
        items = self.work.lease(msg.worker, msg.max_items, msg.lease_s, msg.incarnation, msg.who)
        if items or msg.wait_s <= 0:
            return wire.Work(items)
        self.lease_waiters.append((peer, msg, time.monotonic() + msg.wait_s))

    def on_get_rollouts(self, msg, peer):
        self.check_wait(msg.wait_s)
        if msg.max_items < 1:
            raise ValueError("max_items must be >= 1")
        rollouts = self.work.take(msg.max_items, msg.ack)
        if rollouts or msg.wait_s <= 0:
            return wire.Rollouts(rollouts, self.stats())
        self.rollout_waiters.append((peer, msg, time.monotonic() + msg.wait_s))

    def parked_lease(self, msg):
        """A parked LeaseWork's answer, from tick: its items, or the Error a handler would have replied (the
        worker was refused while it waited), never an exception that would stop the serving loop."""
        try:
            return wire.Work(self.work.lease(msg.worker, msg.max_items, msg.lease_s, msg.incarnation, msg.who))
        except ValueError as e:
            return wire.Error(f"param_server: bad lease_work: {e}")

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
                                   self.parked_lease)
        self.rollout_waiters = serve(self.rollout_waiters, lambda m: bool(self.work.finished),
                                     lambda m: wire.Rollouts(self.work.take(m.max_items), self.stats()))

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
