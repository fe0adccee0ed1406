"""A rollout's life: every rule about what a rollout is worth and what a work item needs, in one place.

No sockets, no files, no jax: the trainer, the inference workers and the parameter server ask this
module and do what it says, so the two invariants this project exists to show can be checked here, in
one sitting, and tested with tables of cases that run in milliseconds (tests/test_lifecycle.py).
The trainer's share of the queue (what to enqueue, what a reply brings, the batch, the checkpoint) is
`Collector`, which trainer.Trainer wraps in its sockets and files and the tests drive directly.

THE STALENESS BOUND (`usable`). A policy version is the number of batches the trainer has trained on.
A rollout sampled with version v and entering a batch when the trainer is at version s has staleness
s - v. With `max_staleness = k` the trainer trains only on rollouts with 0 <= s - v <= k, from its own
lineage (the random name of one trainer process's policy history: after a resume, "version 7" of the
dead process is not ours). With in-flight weight updates a row's tokens come from several versions;
a rollout's version is then its OLDEST token's (`rollout_version`), so the bound holds per token.
The check runs at the moment a rollout ENTERS a batch (`Books.take`), not when it arrives: a rollout
that waits ages. `check_batch` asserts it again at the update. k = 0 is strict on-policy GRPO; k > 0
lets workers lag, which is asynchronous, off-policy RL.

NOTHING LOST, NOTHING USED TWICE (`Books`). Every training prompt the data cursor hands out is in
`Books.in_flight` from the moment it is enqueued until it gets exactly one final fate, written once to
the ledger ($RUN_DIR/ledger.jsonl). A rollout in hand (received, or chosen for the batch being
assembled) is still in flight: it leaves only with its fate. So whatever stops when, the checkpoint's
copy of `in_flight` names every prompt without a fate, and a resumed trainer enqueues them again.

What happens to a work item, event by event:

  event                              fate                                        where
  ---------------------------------  ------------------------------------------  -------------------------
  trainer enqueues it                in flight, tagged min_version = version      Collector.feed
  worker leases it                   sampled with weights >= min_version, of      worker_action
                                     the item's lineage; a dead lineage's item
                                     is abandoned (its trainer is gone)
  a new version arrives mid-row      swapped in between decode steps (--inflight  continuous.Slots.swap,
                                     keep|recompute); each token records the      rollout_version
                                     version that sampled it; the rollout's
                                     version is its oldest token's
  worker dies / lease not renewed    back to the front of the queue               param_server.WorkQueue
  restarted worker says hello        its previous incarnation's leases released   param_server.WorkQueue
  two workers submit the same item   the first is kept, the second is counted     param_server.WorkQueue
                                     as a duplicate
  GetRollouts reply lost             re-sent with the next reply, until acked     param_server.WorkQueue
  rollout arrives at the trainer     kept (in flight) or dropped now if it can    Collector.receive,
                                     never become usable; its id acked with the   Books.receive
                                     next request
  verifier failed on it (infra)      fate verifier_failed: never trained on       Books.receive
  rollout enters the batch           staleness checked (THE BOUND) or dropped     Books.take, Books.fill
  dynamic sampling rejects it        fate filtered_zero_var                       Books.fill
  the batch is trained on            fate trained                                 Books.trained
  prompt longer than the budget      fate skipped_too_long                        Collector.feed
  trainer SIGTERM mid-collection     still in flight; checkpointed; re-enqueued   Collector.snapshot,
                                     by the resumed trainer                       Collector.restore
  trainer SIGKILL                    ledger cut back to the checkpoint's line     Collector.restore
                                     count; the checkpoint's in-flight items
                                     re-enqueued
  param server restart               items not yet received re-enqueued           Collector.server_restarted
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from verdicts import INFRA_ERROR, REWARD_ERROR  # the statuses infra_failures counts

# ----------------------------------------------------------------------------- staleness

OK, STALE, FUTURE, OTHER_LINEAGE = "ok", "stale", "future", "other_lineage"


def usable(rollout_version: int, rollout_lineage: str, version: int, lineage: str, max_staleness: int) -> str:
    """THE STALENESS BOUND. May a rollout enter a batch trained at `version`? Returns OK or why not.

    STALE: sampled more than max_staleness versions ago. FUTURE: sampled with a version we have not
    made (impossible within one lineage; a guard). OTHER_LINEAGE: sampled with another trainer
    process's weights (a resumed trainer reuses version numbers)."""
    if rollout_lineage != lineage:
        return OTHER_LINEAGE
    staleness = version - rollout_version
    if staleness < 0:
        return FUTURE
    return OK if staleness <= max_staleness else STALE


def check_batch(versions: list, lineages: list, version: int, lineage: str, max_staleness: int) -> None:
    """Asserted at the update: every rollout of the batch is usable at `version`."""
    for v, lin in zip(versions, lineages, strict=True):
        why = usable(v, lin, version, lineage, max_staleness)
        if why != OK:
            raise AssertionError(f"staleness bound broken: a rollout of version {v} ({why}) reached "
                                 f"the update at version {version} with max_staleness {max_staleness}")


def items_to_feed(max_staleness: int, batch_size: int, outstanding: int) -> int:
    """How many new training items to enqueue: keep (k + 1) x B without a fate. The batch being
    assembled needs B; the next k steps' batches may be sampled ahead, with older weights, because
    their rollouts will be at most k versions old when they are used."""
    return max(0, (max_staleness + 1) * batch_size - outstanding)


AUTO_WAIT_FRAC = 0.1
"""AutoStaleness loosens the bound only when the trainer waited for rollouts longer than this share of
its step: a trainer that never waits gains nothing from staler data."""

AUTO_RETRY_STEPS = 4
"""After the KL measured at bound k + 1 brought the bound down to k, AutoStaleness waits this many
starved, healthy steps at k before it tries k + 1 again; each retry of k + 1 that fails again doubles
the wait."""

AUTO_RETRY_MAX = 64
"""The longest wait between retries of a bound whose KL was over the target, in starved steps."""


@dataclass
class AutoStaleness:
    """THE STALENESS BOUND, set by itself (trainer --staleness-target, launch.sh MAX_STALENESS=auto).
    `update(kl, waited)` gives the bound for the next step from what the last one measured:
      kl      offpolicy/k3_kl: the k3 KL between the policies that sampled the batch's stale rows and the
              trainer's, over their tokens; None when the batch had no stale rows (nothing measured:
              always so at bound 0);
      waited  the share of the step the trainer spent waiting for rollouts.
    Rules, first match:
      kl > target                                   -> limit - 1 (too far off-policy; not below 0); the
                                                       level left, limit, is remembered as failed
      waited > AUTO_WAIT_FRAC and (kl is None or kl <= target / 2)
                                                    -> limit + 1 (the trainer starves and the data is
                                                       healthy; not above ceiling), except into the
                                                       level remembered as failed: that one only after
                                                       `retry_in` such steps (AUTO_RETRY_STEPS, doubled
                                                       each time a retry of that same level fails, up
                                                       to AUTO_RETRY_MAX)
      otherwise                                     -> limit
    Why the memory: at bound 0 nothing is stale, so kl is None there and the data always looks healthy.
    Without it, a KL over the target at bound 1 gives 1, 0, 1, 0, ...: each drop discards the prompts
    fed ahead under the higher bound, and every other batch is trained too far off-policy. With it the
    bound stays down and retries the failed level at growing intervals (the policy's drift can shrink
    later in a run); a KL within the target measured at or above the failed level clears the memory.
    Drops through several levels in a row (2 -> 1 -> 0) are failures of different levels: each waits
    AUTO_RETRY_STEPS; only the same level failing again waits longer.
    Change the bound only between batches (the batch being assembled was admitted under the old)."""
    target: float
    ceiling: int
    limit: int = 0
    failed_level: int | None = None  # the bound whose KL was last over the target (it brought us down)
    failed_kl: float | None = None   # that KL
    retry_in: int = 0                # starved, healthy steps left before failed_level is tried again
    backoff: int = AUTO_RETRY_STEPS  # the wait failed_level was given when it last failed

    def __post_init__(self):
        if not (isinstance(self.ceiling, int) and self.ceiling >= 0 and self.target > 0):
            raise ValueError(f"AutoStaleness needs ceiling >= 0 and target > 0, got {self.ceiling}, {self.target}")
        self.limit = min(max(self.limit, 0), self.ceiling)

    def update(self, kl: float | None, waited: float) -> int:
        limit = self.limit = min(max(self.limit, 0), self.ceiling)
        if kl is not None and kl > self.target:
            if limit > 0:
                # the same level failing again (a retry) waits twice as long; another level, the base wait
                self.backoff = (min(2 * self.backoff, AUTO_RETRY_MAX) if self.failed_level == limit
                                else AUTO_RETRY_STEPS)
                self.failed_level, self.failed_kl, self.retry_in = limit, kl, self.backoff
                self.limit = limit - 1
            return self.limit
        if kl is not None and self.failed_level is not None and limit >= self.failed_level:
            # the failed level measured within the target: it no longer fails
            self.failed_level, self.failed_kl, self.backoff = None, None, AUTO_RETRY_STEPS
        if waited > AUTO_WAIT_FRAC and (kl is None or kl <= self.target / 2) and limit < self.ceiling:
            if self.failed_level == limit + 1:
                self.retry_in -= 1
                if self.retry_in > 0:
                    return self.limit
            self.limit = limit + 1
        return self.limit


def auto_staleness(limit: int, kl: float | None, waited: float, target: float, ceiling: int) -> int:
    """One step of AutoStaleness from `limit`, with nothing remembered from earlier steps."""
    return AutoStaleness(target, ceiling, limit).update(kl, waited)


# ----------------------------------------------------------------------------- a version per token

OFF, KEEP, RECOMPUTE = "off", "keep", "recompute"
INFLIGHT_MODES = (OFF, KEEP, RECOMPUTE)
"""In-flight weight updates (inference_worker --inflight): OFF, a row is sampled with one version from
its first token to its last (weights are swapped between batches); KEEP, a new version is swapped in
between decode steps and the rows in progress go on with the KV cache the older weights computed
(PipelineRL); RECOMPUTE, the same, but each row in progress first has its prompt and tokens so far
run through the new weights (the cache recomputed; AReaL). A rollout records per token the version
that sampled it (wire.Rollout.versions_GT)."""


def rollout_version(versions_GT, mask_GT) -> int:
    """A rollout's version for THE STALENESS BOUND: the OLDEST version that sampled any of its tokens.
    With it, `usable` holds per token: every token trained on at version s was sampled by a version in
    [s - k, s]. (A token-weighted age would let the first tokens of a long row, sampled long ago, in
    under a bound they break; the token-weighted age is logged as staleness/mean instead.)"""
    m = np.asarray(mask_GT) > 0
    if not m.any():
        raise ValueError("a rollout without sampled tokens has no version")
    return int(np.asarray(versions_GT)[m].min())


def token_staleness(versions_GT, version: int):
    """Each token's staleness at the update trained at `version`: version - the version that sampled it."""
    return version - np.asarray(versions_GT, np.int64)


def exact_tokens(versions_GT, mask_GT, version: int, mode: str):
    """The sampled tokens whose log-prob the trainer at `version` computes from the same weights and the
    same inputs as the sampler did, so under model.py's precision policy bit for bit
    (mismatch/bitwise_frac is measured over these): sampled by `version`, and, in KEEP mode, in a row
    sampled by `version` from its first token (a row that started with older weights keeps the cache
    they computed, so its later tokens saw older weights' keys and values). In RECOMPUTE mode the cache
    is the new weights' from the swap on, so every token sampled by `version` counts."""
    if mode not in INFLIGHT_MODES:
        raise ValueError(f"unknown in-flight mode {mode!r}; expected one of {INFLIGHT_MODES}")
    v_GT, m_GT = np.asarray(versions_GT, np.int64), np.asarray(mask_GT) > 0
    exact = m_GT & (v_GT == version)
    if mode == KEEP:
        row_oldest_G = np.where(m_GT, v_GT, np.iinfo(np.int64).max).min(axis=1)
        exact &= (row_oldest_G == version)[:, None]
    return exact


# ----------------------------------------------------------------------------- the worker's side

SAMPLE, WAIT, ABANDON = "sample", "wait", "abandon"


def worker_action(min_version: int, item_lineage: str, version: int, lineage: str, newest: bool) -> str:
    """What a worker does with a leased item, holding weights (version, lineage).

    SAMPLE when the weights are the item's lineage and at least min_version (never older than the
    trainer asked for: that is the worker's half of the staleness bound). ABANDON when the weights are
    the server's newest (`newest`, just pulled) and of another lineage: the item's trainer is gone,
    and the new one enqueues its own items. Otherwise WAIT for newer weights."""
    if lineage == item_lineage and version >= min_version:
        return SAMPLE
    if newest and lineage != item_lineage and version >= 0:
        return ABANDON
    return WAIT


# ----------------------------------------------------------------------------- verdicts

def infra_failures(statuses: list) -> int:
    return sum(s in (INFRA_ERROR, REWARD_ERROR) for s in statuses)


def verifier_broken(window: collections.deque, max_frac: float) -> bool:
    """Stop the run? `window` holds (infra failures, programs) of the most recent training groups
    received; a full window in which more than max_frac of the programs failed for the verifier's
    reasons means the verifier, not the policy, is broken. (A policy that writes nothing but broken
    code gets runtime_error/syntax_error verdicts, never infra_error, so it never stops a run.)"""
    if window.maxlen is None or len(window) < window.maxlen:
        return False
    bad, total = map(sum, zip(*window))
    return total > 0 and bad / total > max_frac


class VerifierBroken(RuntimeError):
    """Most programs fail in the verifier, not in themselves: training would learn from noise."""


def check_verifier(window: collections.deque, max_frac: float) -> None:
    """Raise VerifierBroken, saying where to look, when `verifier_broken(window, max_frac)`."""
    if verifier_broken(window, max_frac):
        bad, total = map(sum, zip(*window))
        raise VerifierBroken(
            f"the verifier failed {bad} of the last {total} programs (status {INFRA_ERROR}: the sandbox or the "
            f"service, not the programs; {REWARD_ERROR}: the reward function raised, gave no finite number or "
            f"timed out), more than --max-verifier-failure-frac {max_frac}; see the verifier's log "
            f"($RUN_DIR/verifier.log under launch.sh) and the workers' logs")


def verifier_failure_text(statuses: list) -> str:
    """A group's verifier failures for the log: how many of its programs got each failure status
    (INFRA_ERROR, REWARD_ERROR), e.g. "3 of 8 programs got verifier status reward_error"; "no verifier
    failure" when there is none."""
    counts = collections.Counter(s for s in statuses if s in (INFRA_ERROR, REWARD_ERROR))
    if not counts:
        return "no verifier failure"
    return ", ".join(f"{n} of {len(statuses)} programs got verifier status {s}" for s, n in sorted(counts.items()))


# ----------------------------------------------------------------------------- the trainer's books

TRAINED, DROPPED_STALE, FILTERED, SKIPPED_TOO_LONG, VERIFIER_FAILED = (
    "trained", "dropped_stale", "filtered_zero_var", "skipped_too_long", "verifier_failed")
FATES = (TRAINED, DROPPED_STALE, FILTERED, SKIPPED_TOO_LONG, VERIFIER_FAILED)
ARRIVED_DUPLICATE, ARRIVED_UNKNOWN = "duplicate", "unknown"


@dataclass
class Books:
    """The trainer's record of the training prompts it handed out (evaluation items are not here).

    `in_flight` maps item_id -> work item for every prompt without a final fate. Of those, `received`
    holds the rollouts in hand, in arrival order, and `batch` the ones chosen for the batch being
    assembled. `fate(item_id, fate)` is called exactly once per prompt (the trainer writes the
    ledger line there)."""
    max_staleness: int
    batch_size: int
    lineage: str
    fate: Callable[[str, str], None]
    in_flight: dict = field(default_factory=dict)
    received: dict = field(default_factory=dict)
    batch: dict = field(default_factory=dict)
    counts: collections.Counter = field(default_factory=collections.Counter)
    seen: int = 0  # rollouts offered to the batch being assembled (dynamic sampling caps it)

    def add(self, item) -> None:
        self.in_flight[item.item_id] = item

    def to_feed(self) -> int:
        return items_to_feed(self.max_staleness, self.batch_size, len(self.in_flight))

    def resolve(self, item_id: str, fate: str) -> None:
        """The prompt's final fate: counted, recorded once, and out of flight."""
        assert fate in FATES, fate
        self.in_flight.pop(item_id, None)
        self.received.pop(item_id, None)
        self.batch.pop(item_id, None)
        self.counts[fate] += 1
        self.fate(item_id, fate)

    def receive(self, rollout, version: int) -> str:
        """A training rollout arrives. Kept until it enters a batch, unless it is a duplicate (its
        prompt has a fate or a rollout in hand already), failed in the verifier, or can never
        become usable (another lineage, or already too stale: rollouts only age)."""
        if rollout.item_id not in self.in_flight or rollout.item_id in self.received | self.batch:
            self.counts[ARRIVED_DUPLICATE] += 1
            return ARRIVED_DUPLICATE
        if infra_failures(rollout.statuses):
            self.resolve(rollout.item_id, VERIFIER_FAILED)
            return VERIFIER_FAILED
        if usable(rollout.version, rollout.lineage, version, self.lineage, self.max_staleness) != OK:
            self.resolve(rollout.item_id, DROPPED_STALE)
            return DROPPED_STALE
        self.received[rollout.item_id] = rollout
        return OK

    def take(self, version: int):
        """The oldest received rollout that is usable NOW, for the batch trained at `version`
        (THE STALENESS BOUND, checked at entry); those that aged past it are dropped. None if none.
        The caller keeps it (`choose`) or gives it a fate; until then it is still in flight."""
        for item_id in list(self.received):
            rollout = self.received.pop(item_id)
            if usable(rollout.version, rollout.lineage, version, self.lineage, self.max_staleness) == OK:
                return rollout
            self.resolve(item_id, DROPPED_STALE)
        return None

    def fill(self, version: int, keep: Callable[[object, int], bool]) -> bool:
        """Move usable rollouts into the batch being assembled until it holds batch_size; `keep`
        (rollout, how many this batch has seen) is the algorithm's say (grpo.keep_group: dynamic
        sampling); a rollout it rejects gets the fate FILTERED. Returns whether the batch is full.
        Chosen rollouts stay in flight until `trained`: a SIGTERM now loses nothing."""
        while len(self.batch) < self.batch_size and (rollout := self.take(version)) is not None:
            self.seen += 1
            if keep(rollout, self.seen):
                self.batch[rollout.item_id] = rollout
            else:
                self.resolve(rollout.item_id, FILTERED)
        return len(self.batch) == self.batch_size

    def trained(self) -> list:
        """The batch was trained on: each of its prompts gets the fate TRAINED. Returns the batch."""
        batch = list(self.batch.values())
        for rollout in batch:
            self.resolve(rollout.item_id, TRAINED)
        self.seen = 0
        return batch

    def awaiting(self) -> list:
        """Items whose rollout we do not hold: what a restarted parameter server must be sent again."""
        held = self.received | self.batch
        return [item for item_id, item in self.in_flight.items() if item_id not in held]

    def snapshot(self) -> dict:
        """For the checkpoint: every prompt without a fate, rollout in hand or not (a SIGTERM in the
        middle of a batch loses nothing: those prompts are sampled again after the resume)."""
        return {item_id: item.to_dict() for item_id, item in self.in_flight.items()}

    def restore(self, snapshot: dict, item_from_dict, version: int) -> list:
        """On resume: the checkpoint's in-flight prompts, to be sampled again with the restored
        weights (min_version = the restored version, our new lineage). Returns them to enqueue."""
        self.in_flight, self.received, self.batch = {}, {}, {}
        for item_id, data in snapshot.items():
            self.add(item_from_dict({**data, "min_version": version, "lineage": self.lineage, "lease": ""}))
        return list(self.in_flight.values())


# ----------------------------------------------------------------------------- the trainer's side of the queue

@dataclass
class Collector:
    """The trainer's side of the work queue, every decision of it and no I/O: which items to enqueue
    (`feed`), what a GetRollouts reply brings (`receive`), the batch (`fill`, `batch`, `trained`), what
    a checkpoint keeps and a resume restores (`snapshot`, `restore`), and what a restarted param
    server must be sent again (`server_restarted`). trainer.Trainer does the sockets and files around
    these calls; tests/test_lifecycle.py makes the same calls against the real param_server.WorkQueue.

    `version` is the policy version (batches trained on), `cursor` the index of the next training
    problem; `new_item(index, version)` makes problem `index`'s work item tagged min_version =
    version, and says whether its prompt fits the length budget."""
    books: Books
    new_item: Callable[[int, int], tuple]
    version: int = 0
    cursor: int = 0
    ack: list = field(default_factory=list)           # ids the last reply brought: acked by the next request
    eval_pending: dict = field(default_factory=dict)  # evaluation items without a rollout yet
    evals: list = field(default_factory=list)         # their rollouts, as they arrive

    def feed(self) -> list:
        """Step 1: new training items until (k + 1) x B prompts are without a fate (items_to_feed),
        each tagged with our version; a prompt too long for the budget gets its fate at once.
        Returns the items to enqueue."""
        items = []
        for _ in range(self.books.to_feed()):
            item, fits = self.new_item(self.cursor, self.version)
            self.cursor += 1
            if not fits:
                self.books.resolve(item.item_id, SKIPPED_TOO_LONG)
                continue
            self.books.add(item)
            items.append(item)
        return items

    def receive(self, reply: list, parse: Callable) -> list:
        """One GetRollouts reply, its rollout maps as they came. Their ids are acknowledged with the
        next request (the server sends them again until then). `parse` makes a rollout of a map, or
        returns None for a malformed one. An evaluation rollout answers its pending item once; a
        training rollout goes to the books at our version. Returns the training rollouts that were
        not duplicates (the caller counts their verifier failures)."""
        self.ack = [r.get("item_id") for r in reply if isinstance(r, dict)]
        fresh = []
        for rollout in filter(None, map(parse, reply)):
            if rollout.eval:
                if self.eval_pending.pop(rollout.item_id, None) is not None:
                    self.evals.append(rollout)
            elif self.books.receive(rollout, self.version) != ARRIVED_DUPLICATE:
                fresh.append(rollout)
        return fresh

    def fill(self, keep: Callable[[object, int], bool]) -> bool:
        """Step 2: Books.fill at our version (THE STALENESS BOUND, checked as each rollout enters)."""
        return self.books.fill(self.version, keep)

    def batch(self) -> list:
        """The full batch, for the update at our version; the bound asserted once more (check_batch)."""
        batch = list(self.books.batch.values())
        check_batch([r.version for r in batch], [r.lineage for r in batch], self.version, self.books.lineage,
                    self.books.max_staleness)
        return batch

    def trained(self) -> list:
        """The update is done: one batch more is the new version, and each prompt of the batch gets
        the fate TRAINED (at that version). Returns the batch."""
        self.version += 1
        return self.books.trained()

    def snapshot(self) -> dict:
        """For the checkpoint: the version, the cursor, the fate counts and every prompt without a
        fate (Books.snapshot)."""
        return {"step": self.version, "cursor": self.cursor, "counts": dict(self.books.counts),
                "in_flight": self.books.snapshot()}

    def restore(self, snapshot: dict, item_from_dict) -> None:
        """On resume, from a checkpoint's snapshot: the version, the cursor, the counts, and the
        prompts in flight as new items of our lineage (Books.restore), which the first
        `server_restarted` hands out."""
        self.version, self.cursor = snapshot["step"], snapshot["cursor"]
        self.books.counts.update(snapshot["counts"])
        self.books.restore(snapshot["in_flight"], item_from_dict, self.version)

    def server_restarted(self) -> list:
        """A param server we have not checked yet (a restarted one lost its queue and buffer): the
        items to enqueue there again, every one whose rollout we do not hold (evaluation items
        included). `ack` stays: it names rollouts we hold or gave a fate, which are not enqueued
        again, so a new server ignores it, unless that server sent them itself (a request that
        reached it before we noticed the restart): then they must be acked, or come twice."""
        return self.books.awaiting() + list(self.eval_pending.values())


# ----------------------------------------------------------------------------- staleness, measured

def staleness_metrics(staleness_RT, mask_RT, max_staleness: int) -> dict:
    """staleness/*: trainer version - sampling version over the tokens trained on (a version per token:
    with in-flight weight updates one row holds several). max is the oldest token's (what the bound
    checks), mean the token-weighted age, frac_k the share of tokens k versions old, k <= max_staleness,
    mixed_row_frac the share of rows sampled by more than one version (in-flight weight updates)."""
    s = np.asarray(staleness_RT)[np.asarray(mask_RT) > 0]
    if s.size == 0:
        return {}
    rows = [np.unique(r[m > 0]) for r, m in zip(np.asarray(staleness_RT), np.asarray(mask_RT))]
    return {"staleness/max": int(s.max()), "staleness/mean": float(s.mean()),
            "staleness/mixed_row_frac": float(np.mean([u.size > 1 for u in rows])),
            **{f"staleness/frac_{k}": float(np.mean(s == k)) for k in range(max_staleness + 1)}}
