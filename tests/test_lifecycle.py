"""The invariants, by construction: lifecycle.py's rules as tables of cases, then a model-based test
that throws thousands of random event sequences (leases, duplicate and late submissions, expired
leases, lost replies, worker kills, parameter-server restarts, trainer SIGTERM and SIGKILL + resume)
at the real parameter-server WorkQueue and the trainer's own Books, checking after every event that
no rollout is trained staler than k, every prompt has exactly one fate or is in flight, and nothing is
trained twice; and that the run still makes progress afterwards (nothing is stuck for good).

Run: python -m pytest -q tests/test_lifecycle.py      (well under a minute)
"""
import collections
import random
from types import SimpleNamespace

import numpy as np
import pytest

import lifecycle as lc
import param_server
import wire

# ----------------------------------------------------------------------------- the rules, as tables


@pytest.mark.parametrize("rv, rlin, v, k, want", [
    (5, "a", 5, 0, lc.OK),            # on-policy
    (4, "a", 5, 0, lc.STALE),         # one version old, k = 0
    (4, "a", 5, 1, lc.OK),
    (3, "a", 5, 1, lc.STALE),         # the bound is inclusive of k, exclusive beyond
    (3, "a", 5, 2, lc.OK),
    (6, "a", 5, 3, lc.FUTURE),        # a version we have not made
    (5, "b", 5, 3, lc.OTHER_LINEAGE), # a dead trainer's version 5 is not ours
])
def test_usable(rv, rlin, v, k, want):
    assert lc.usable(rv, rlin, v, "a", k) == want


def test_check_batch_asserts_the_bound_at_the_update():
    lc.check_batch([5, 4], ["a", "a"], 5, "a", 1)
    with pytest.raises(AssertionError, match="staleness bound broken"):
        lc.check_batch([5, 3], ["a", "a"], 5, "a", 1)
    with pytest.raises(AssertionError):
        lc.check_batch([5], ["b"], 5, "a", 3)


@pytest.mark.parametrize("k, B, outstanding, want", [
    (0, 4, 0, 4), (0, 4, 3, 1), (0, 4, 4, 0), (0, 4, 9, 0), (1, 4, 0, 8), (2, 4, 5, 7)])
def test_items_to_feed(k, B, outstanding, want):
    assert lc.items_to_feed(k, B, outstanding) == want


@pytest.mark.parametrize("minv, ilin, v, lin, newest, want", [
    (3, "a", 3, "a", False, lc.SAMPLE),
    (3, "a", 5, "a", False, lc.SAMPLE),    # newer weights are fine: staleness only grows with age
    (3, "a", 2, "a", True, lc.WAIT),       # the server does not have min_version yet
    (3, "a", -1, "", False, lc.WAIT),      # no weights at all yet
    (3, "a", 7, "b", False, lc.WAIT),      # ours may be old: pull before deciding
    (3, "a", 7, "b", True, lc.ABANDON),    # the server's newest is another trainer's: item is dead
    (3, "a", 0, "b", True, lc.ABANDON),    # ... even at a lower version (a resume restarts numbering)
])
def test_worker_action(minv, ilin, v, lin, newest, want):
    assert lc.worker_action(minv, ilin, v, lin, newest) == want


def test_verifier_broken_needs_a_full_window_above_the_fraction():
    w = collections.deque(maxlen=3)
    w.extend([(8, 8), (8, 8)])
    assert not lc.verifier_broken(w, 0.5)           # not full yet
    w.append((8, 8))
    assert lc.verifier_broken(w, 0.5)
    w.extend([(0, 8), (0, 8)])                        # recovered
    assert not lc.verifier_broken(w, 0.5)
    w.extend([(0, 8)] * 3)                            # a policy writing only broken code: status
    assert not lc.verifier_broken(w, 0.0)             # runtime_error, never infra_error


def rollout(item_id, version, lineage, G=2, T=4, statuses=None, rewards=None):
    return wire.Rollout.from_dict(dict(
        item_id=item_id, version=version, lineage=lineage, worker="w", prompt_len=1,
        tokens_GT=np.ones((G, T), np.int32), logp_behav_GT=np.zeros((G, T), np.float32),
        mask_GT=np.ones((G, T), np.float32),
        rewards_G=np.asarray(rewards if rewards is not None else [0.0, 1.0][:G], np.float32),
        finished_G=np.ones(G, bool), statuses=statuses or ["passed"] * G))


def item(i, version, lineage="a"):
    return wire.WorkItem(item_id=f"train/{i}|p{i}", prompt="p", group_size=2, seq_len=4, max_new_tokens=2,
                         min_version=version, lineage=lineage)


def books(k=0, B=2):
    fates = []
    return lc.Books(k, B, "a", lambda i, f: fates.append((i, f))), fates


def test_a_rollout_that_ages_while_waiting_is_dropped_when_it_would_enter_the_batch():
    """Finding 1: k=1, B=2; a worker submits two rollouts of version 0 back to back; one fills the
    batch of step 1, the other waits and would be trained at step 2 with staleness 2."""
    b, fates = books(k=1, B=2)
    for i in range(4):
        b.add(item(i, 0))
    assert b.receive(rollout("train/0|p0", 0, "a"), version=1) == lc.OK  # staleness 1: fine now
    assert b.receive(rollout("train/1|p1", 0, "a"), version=1) == lc.OK
    assert b.receive(rollout("train/2|p2", 0, "a"), version=1) == lc.OK
    assert b.fill(1, lambda r, seen: True)
    assert [r.item_id for r in b.trained()] == ["train/0|p0", "train/1|p1"]
    assert not b.fill(2, lambda r, seen: True)                           # at version 2 it is staleness 2
    assert fates[-1] == ("train/2|p2", lc.DROPPED_STALE) and not b.batch
    assert b.counts[lc.DROPPED_STALE] == 1


def test_a_half_collected_batch_is_in_the_snapshot():
    """Finding 2: rollouts chosen for a batch that SIGTERM cuts short are still in flight."""
    b, fates = books(k=0, B=3)
    for i in range(3):
        b.add(item(i, 0))
    b.receive(rollout("train/0|p0", 0, "a"), 0)
    b.receive(rollout("train/1|p1", 0, "a"), 0)
    assert not b.fill(0, lambda r, seen: True) and len(b.batch) == 2
    snap = b.snapshot()
    assert sorted(snap) == ["train/0|p0", "train/1|p1", "train/2|p2"] and not fates
    b2, _ = books(k=0, B=3)
    b2.lineage = "z"
    again = b2.restore(snap, wire.WorkItem.from_dict, version=7)
    assert {i.min_version for i in again} == {7} and {i.lineage for i in again} == {"z"}


@pytest.mark.parametrize("statuses, fate", [
    (["passed", lc.INFRA_ERROR], lc.VERIFIER_FAILED),
    (["runtime_error", "syntax_error"], lc.OK),          # the program's fault: a real 0
])
def test_infra_failures_are_never_trained_on(statuses, fate):
    b, fates = books()
    b.add(item(0, 0))
    assert b.receive(rollout("train/0|p0", 0, "a", statuses=statuses), 0) == fate


def test_duplicates_and_unknown_rollouts_are_counted_not_used():
    b, _ = books(k=0, B=2)
    b.add(item(0, 0))
    assert b.receive(rollout("train/0|p0", 0, "a"), 0) == lc.OK
    assert b.receive(rollout("train/0|p0", 0, "a"), 0) == lc.ARRIVED_DUPLICATE   # in hand already
    b.fill(0, lambda r, s: True)
    assert b.receive(rollout("train/0|p0", 0, "a"), 0) == lc.ARRIVED_DUPLICATE   # in the batch
    assert b.receive(rollout("train/9|p9", 0, "a"), 0) == lc.ARRIVED_DUPLICATE   # never ours / done
    assert b.awaiting() == []


# ----------------------------------------------------------------------------- the server's rules


def queue():
    return param_server.WorkQueue(param_server.Config(state_dir="/nonexistent-unused"))


def submit(q, it, lease, version=0, lineage="a", worker="w"):
    r = rollout(it["item_id"], version, lineage).to_dict()
    return q.submit(wire.SubmitRollout(worker, it["item_id"], lease, r), lineage)


def test_a_lost_reply_is_sent_again_until_acknowledged():
    """Finding 3: a GetRollouts reply that never reaches the trainer is not lost."""
    q = queue()
    q.enqueue([item(0, 0).to_dict()], requeue=False)
    (it,) = q.lease("w", 1, 10)
    assert submit(q, it, it["lease"]) == "accepted"
    assert [r["item_id"] for r in q.take(8)] == ["train/0|p0"]           # this reply is lost
    assert [r["item_id"] for r in q.take(8)] == ["train/0|p0"]           # so it comes again
    assert q.take(8, ack=["train/0|p0"]) == [] and q.stats()["unacked"] == 0
    assert submit(q, it, it["lease"]) == "duplicate"                      # and is used once


def test_leases_checked_renewed_and_released_on_hello():
    q = queue()
    q.enqueue([item(i, 0).to_dict() for i in range(3)], requeue=False)
    a, b = q.lease("w0", 2, 10, incarnation="i1")
    with pytest.raises(ValueError, match="never issued"):
        submit(q, a, "forged-lease")
    assert q.renew("w0", [[a["item_id"], a["lease"]], [b["item_id"], "bogus"]], 10) == \
        {"renewed": 1, "lost": [b["item_id"]]}
    assert q.hello("w0", "i1") == 0                                         # same process
    assert q.hello("w0", "i2") == 2                                         # restarted: released now
    assert [i["item_id"] for i in q.lease("w1", 3, 10)] == [a["item_id"], b["item_id"], "train/2|p2"]
    assert submit(q, a, a["lease"]) == "accepted"  # the first lease's late result still counts


# ----------------------------------------------------------------------------- the whole lifecycle


class Sim:
    """The trainer's books and the server's queue, driven by random events. Workers are simulated:
    a leased item is 'sampled' at lease time with any version from its min_version to the trainer's
    current one (a worker that pulls rarely holds older weights) and submitted later, so rollouts
    age like they do in the system."""

    def __init__(self, rng: random.Random, k: int, B: int):
        self.rng, self.k, self.B = rng, k, B
        self.q = queue()
        self.version, self.cursor, self.n_lineage = 0, 0, 0
        self.ledger: list = []             # (item_id, fate): the ledger file
        self.trained_staleness: list = []
        self.books = self.new_books()
        self.ack: list = []
        self.workers = {f"w{i}": SimpleNamespace(inc="0", held=[], done=[]) for i in range(3)}
        self.checkpoint = self.snapshot()

    def new_books(self):
        self.n_lineage += 1
        self.lineage = f"L{self.n_lineage}"
        self.q.reset()  # what a new lineage's first push does at the server
        return lc.Books(self.k, self.B, self.lineage, lambda i, f: self.ledger.append((i, f)))

    def snapshot(self):
        return dict(in_flight=self.books.snapshot(), cursor=self.cursor, version=self.version,
                    ledger=len(self.ledger))

    # -- events
    def feed(self):
        items = []
        for _ in range(self.books.to_feed()):
            it = item(self.cursor, self.version, self.lineage)
            self.cursor += 1
            if self.rng.random() < 0.05:  # a prompt too long for the budget
                self.books.counts[lc.SKIPPED_TOO_LONG] += 1
                self.ledger.append((it.item_id, lc.SKIPPED_TOO_LONG))
                continue
            self.books.add(it)
            items.append(it.to_dict())
        self.q.enqueue(items, requeue=False)

    def lease(self):
        w = self.workers[self.rng.choice(list(self.workers))]
        for it in self.q.lease(self.name_of(w),
                               self.rng.randint(1, 2), 10, incarnation=w.inc):
            it = wire.WorkItem.from_dict(it)
            # A worker may hold any weights from min_version to the newest (pull_every > 1 pulls rarely)
            version = self.rng.randint(it.min_version, self.version) if it.lineage == self.lineage else -1
            if lc.worker_action(it.min_version, it.lineage, version, self.lineage, True) == lc.SAMPLE:
                w.held.append((it, version))

    def name_of(self, w):
        return next(n for n, x in self.workers.items() if x is w)

    def submit(self, duplicate=False):
        # w0 is a slow worker: it submits a tenth as often, so its rollouts age past the bound
        w = self.workers[self.rng.choices(list(self.workers), [0.1, 1, 1])[0]]
        pool = w.done if duplicate else w.held
        if not pool:
            return
        it, version = pool.pop(self.rng.randrange(len(pool)))
        r = rollout(it.item_id, version, it.lineage, rewards=[self.rng.choice([0.0, 1.0]) for _ in range(2)],
                    statuses=[lc.INFRA_ERROR if self.rng.random() < 0.03 else "passed", "failed"])
        try:
            self.q.submit(wire.SubmitRollout(self.name_of(w), it.item_id, it.lease, r.to_dict()), self.lineage)
        except ValueError:  # a lease this server never issued (it restarted): refused, nothing changes
            pass
        w.done.append((it, version))

    def expire(self):
        leased = [i for i in self.q.items.values() if i.state == "leased"]
        if leased:
            self.rng.choice(leased).deadline = 0.0
            self.q.expire()

    def get(self, lost=False):
        reply = self.q.take(self.rng.randint(1, 8), ack=self.ack)
        if lost:
            return  # the reply never reaches the trainer: nothing acked next time
        self.ack = [r["item_id"] for r in reply]
        for r in reply:
            self.books.receive(wire.Rollout.from_dict(r), self.version)

    def step(self):
        keep = lambda r, seen: np.ptp(r.rewards_G) > 0 or seen > 4 * self.B  # dynamic sampling
        if self.books.fill(self.version, keep):
            batch = list(self.books.batch.values())
            lc.check_batch([r.version for r in batch], [r.lineage for r in batch], self.version,
                           self.lineage, self.k)
            self.trained_staleness += [self.version - r.version for r in batch]
            self.books.trained()
            self.version += 1
            if self.rng.random() < 0.3:
                self.checkpoint = self.snapshot()

    def kill_worker(self):
        name = self.rng.choice(list(self.workers))
        self.workers[name] = SimpleNamespace(inc=str(self.rng.random()), held=[], done=[])
        self.q.hello(name, self.workers[name].inc)

    def restart_param_server(self):
        self.q = queue()
        self.ack = []
        self.q.enqueue([i.to_dict() for i in self.books.awaiting()], requeue=True)

    def trainer_restart(self, sigterm: bool):
        if sigterm:  # finish nothing, checkpoint now, exit; the supervisor resumes us
            self.checkpoint = self.snapshot()
        ck = self.checkpoint
        del self.ledger[ck["ledger"]:]
        self.version, self.cursor, self.ack = ck["version"], ck["cursor"], []
        self.books = self.new_books()
        again = self.books.restore(ck["in_flight"], wire.WorkItem.from_dict, self.version)
        self.q.enqueue([i.to_dict() for i in again], requeue=True)
        for w in self.workers.values():  # their held items belong to a dead lineage now
            w.held, w.done = [], []

    # -- the invariants
    def check(self):
        fated = collections.Counter(i for i, _ in self.ledger)
        assert not [i for i, n in fated.items() if n > 1], "a prompt with two fates"
        trained = [i for i, f in self.ledger if f == lc.TRAINED]
        assert len(trained) == len(set(trained))
        ids = set(fated) | set(self.books.in_flight)
        assert not set(fated) & set(self.books.in_flight), "a prompt both fated and in flight"
        assert sorted(int(i.split("|")[0].split("/")[1]) for i in ids) == list(range(self.cursor)), \
            "a prompt with neither a fate nor a place in flight"
        assert all(0 <= s <= self.k for s in self.trained_staleness)

    def drain(self, steps: int):
        """No faults now: the run must make `steps` more steps (nothing is stuck for good)."""
        target = self.version + steps
        for _ in range(400):
            if self.version >= target:
                return
            self.feed()
            for it in self.q.items.values():
                if it.state == "leased":
                    it.deadline = 0.0  # time passes: unrenewed leases of simulated workers lapse
            self.q.expire()
            for w in self.workers.values():
                w.held.clear()
            while self.q.queue:
                self.lease()
            for w in self.workers.values():
                while w.held:
                    self.submit()
            self.get()
            self.get()
            self.step()
            self.check()
        raise AssertionError(f"stuck at version {self.version}: {len(self.books.in_flight)} in flight, "
                             f"server {self.q.stats()}")


EVENTS = {"feed": 3, "lease": 4, "submit": 4, "duplicate": 1, "expire": 1, "get": 3, "lost_reply": 1,
          "step": 3, "kill_worker": 0.5, "restart_param_server": 0.3, "sigterm": 0.3, "sigkill": 0.3}


def run_sequence(seed: int, k: int, B: int, n_events: int) -> Sim:
    rng = random.Random(seed)
    sim = Sim(rng, k, B)
    names, weights = zip(*EVENTS.items())
    for _ in range(n_events):
        event = rng.choices(names, weights)[0]
        {"feed": sim.feed, "lease": sim.lease, "submit": sim.submit,
         "duplicate": lambda: sim.submit(duplicate=True), "expire": sim.expire, "get": sim.get,
         "lost_reply": lambda: sim.get(lost=True), "step": sim.step, "kill_worker": sim.kill_worker,
         "restart_param_server": sim.restart_param_server,
         "sigterm": lambda: sim.trainer_restart(True), "sigkill": lambda: sim.trainer_restart(False)}[event]()
        sim.check()
    sim.drain(steps=3)
    return sim


@pytest.mark.parametrize("k", [0, 1, 2])
def test_random_lifecycles_keep_every_invariant(k):
    steps, fates = 0, collections.Counter()
    for seed in range(600):
        sim = run_sequence(seed * 7 + k, k, B=1 + seed % 3, n_events=60)
        steps += sim.version
        fates.update(f for _, f in sim.ledger)
    # The sequences trained, and every fate occurred (with k = 0 the trainer keeps only the batch's
    # B prompts in flight, so nothing can age past the bound: a late rollout is a duplicate instead).
    assert steps > 1500 and fates[lc.TRAINED] > 1500
    assert all(fates[f] > 0 for f in lc.FATES if f != lc.DROPPED_STALE or k > 0), fates
