"""The invariants, by construction: lifecycle.py's rules as tables of cases, then a model-based test.

The model (class Sim) runs the roles' own book-keeping code, without sockets. The trainer is
lifecycle.Collector (what trainer.Trainer does between its sockets: feed, receive, fill / batch /
trained, snapshot / restore, server_restarted), called in Trainer's order; the parameter server is
the real param_server.WorkQueue (a new one on each restart) with ParamServer.on_commit's rule that a
new lineage's first push drops the old queue; simulated workers hold a weight version and lineage,
pull sometimes and decide with the real lifecycle.worker_action. Each random sequence mixes leases,
sampling that waits for weights, a slow worker that sits on its rollouts while the trainer steps and
then submits them at once, verifier (infra) failures, duplicate submissions, forged leases, rollouts
of another lineage or of the wrong shape or version under a genuine lease, expired leases, lost and
twice-read replies, worker kills and hellos, param-server restarts (serving the weights last
persisted, maybe older), trainer SIGTERM or SIGKILL + resume, and the version changing in the
middle of a row: a worker in an in-flight mode (keep or recompute) that is still sampling swaps in
the server's newer weights of its lineage between two decode steps, so its rows' later tokens are
sampled by the newer version (rows differ; the rollout's version is its oldest token's); in one
variant the bound itself moves between batches (MAX_STALENESS=auto). After every event:
  - nothing is trained on that is staler than k, of another lineage, from a group with an
    infra_error status, not sampled by a worker, or trained before; and per token: every token
    trained on at version s was sampled by a version in [s - k, s] of the trainer's lineage that a
    param server had, the one the worker sampled it with (versions_GT, or the rollout's version for
    an old-style rollout without it);
  - the trainer never receives a token sampled by a version of its lineage it has not made;
  - every prompt the cursor handed out has exactly one fate or is in flight, the ledger's trained
    prompts are the ones trained on, the fate counts (metrics) are the ledger's, the version is the
    number of batches trained, feeding keeps (k + 1) x B prompts in flight, and dynamic sampling
    is told how many rollouts the batch was offered;
  - the trainer sees a rollout twice only when it reads a reply twice;
  - the server accepts a rollout only under a lease it issued for that item, of its newest lineage,
    of the item's shape and min_version (every token's), once per item; a restarted worker's hello
    leaves its predecessor no lease; every rollout the model sends parses (wire.Rollout.from_dict:
    its version is its oldest sampled token's);
  - a worker samples only with weights of the item's lineage and >= its min_version, and abandons
    only items whose lineage is not the server's newest.
After each sequence, faults stop: the run must make 3 more steps and every worker must decide on
what it holds (progress), and the in-flight runs must have trained on rollouts whose rows span
several versions (k > 0). Not modelled here: the Trainer's sockets and timing (collect_batch's
timeouts, push_trained's retries: tests/test_faults.py), evaluation items, the verifier-broken stop.

Run: python -m pytest -q tests/test_lifecycle.py      (about 35 s on a 2-core CPU)
"""
import collections
import json
import os
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
    with pytest.raises(ValueError):                 # a version without a lineage is no rollout
        lc.check_batch([5, 5], ["a"], 5, "a", 0)


@pytest.mark.parametrize("k, B, outstanding, want", [
    (0, 4, 0, 4), (0, 4, 3, 1), (0, 4, 4, 0), (0, 4, 9, 0), (1, 4, 0, 8), (2, 4, 5, 7)])
def test_items_to_feed(k, B, outstanding, want):
    assert lc.items_to_feed(k, B, outstanding) == want


@pytest.mark.parametrize("limit, kl, waited, want", [
    (2, 3e-3, 0.5, 1),      # too far off-policy: tighten, even while the trainer starves
    (0, 3e-3, 0.5, 0),      # ... never below 0
    (1, None, 0.5, 2),      # starving, nothing stale measured: loosen
    (1, 4e-4, 0.5, 2),      # starving, KL at most half the target: loosen
    (1, 7e-4, 0.5, 1),      # starving, KL between half the target and the target: hold
    (4, 1e-4, 0.9, 4),      # at the ceiling: hold
    (9, 1e-4, 0.9, 4),      # a limit above the ceiling is brought back to it
    (2, 1e-4, 0.05, 2),     # healthy but the trainer hardly waited: nothing to gain, hold
    (2, None, 0.0, 2),
])
def test_auto_staleness_table(limit, kl, waited, want):
    """MAX_STALENESS=auto with target 1e-3 and ceiling 4: tighten on a degraded KL, loosen only when
    the trainer starves and the data is healthy, never past [0, ceiling]."""
    assert lc.auto_staleness(limit, kl, waited, target=1e-3, ceiling=4) == want


def test_auto_staleness_in_a_closed_loop():
    """Against toy worlds where the off-policy KL grows with the bound: the bound climbs while the
    trainer starves and the data is healthy, and stops where the trainer no longer waits (world 1), or
    where the KL passes half the target (world 2); when the KL degrades (world 3: the policy starts
    moving fast) it comes down; it never leaves [0, ceiling]."""
    def run(kl_per_version, starving_below, steps=20, start=0):
        auto, seen = lc.AutoStaleness(target=1e-3, ceiling=4, limit=start), []
        for _ in range(steps):
            kl = None if auto.limit == 0 else kl_per_version * auto.limit
            seen.append(auto.update(kl, 0.4 if auto.limit < starving_below else 0.0))
        return seen
    assert run(2e-4, starving_below=3)[-5:] == [3] * 5
    assert run(4e-4, starving_below=9)[-5:] == [2] * 5
    assert run(6e-4, starving_below=9, start=4)[-5:] == [1] * 5  # 4 -> 3 -> 2 -> 1 (6e-4 <= 1e-3: hold)
    assert max(run(1e-5, starving_below=9)) == 4
    with pytest.raises(ValueError):
        lc.auto_staleness(0, None, 0.5, target=0.0, ceiling=4)
    with pytest.raises(ValueError):
        lc.AutoStaleness(target=1e-3, ceiling=-1)


def test_auto_staleness_does_not_oscillate_when_the_kl_at_1_is_over_target():
    """The KL measured at bound 1 is twice the target and the trainer always starves. At bound 0
    nothing is stale (kl None), so only the memory of bound 1's KL keeps the bound from going straight
    back up. Hand-worked with AUTO_RETRY_STEPS = 4, doubled per failed retry:
      step 1  0 -> 1  (nothing remembered: starving, nothing measured)
      step 2  1 -> 0  (KL over target: bound 1 remembered as failed, retry after 4 starved steps)
      steps 3-5 hold at 0, step 6 retries 1, step 7 fails again (retry after 8):
      steps 8-14 hold, step 15 retries, step 16 fails (retry after 16), steps 17-20 hold."""
    assert lc.AUTO_RETRY_STEPS == 4
    auto, seen = lc.AutoStaleness(target=1e-3, ceiling=4), []
    for _ in range(20):
        kl = None if auto.limit == 0 else 2e-3 * auto.limit
        seen.append(auto.update(kl, waited=0.5))
    want = [1, 0] + [0] * 3 + [1, 0] + [0] * 7 + [1, 0] + [0] * 4
    assert seen == want
    drops = sum(a > b for a, b in zip([0] + seen, seen))
    assert drops == 3  # the stateless rule drops every other step: 10 times in 20
    assert auto.failed_level == 1 and auto.failed_kl == 2e-3


def test_auto_staleness_forgets_a_failure_once_the_level_measures_healthy():
    """The policy calms down: the retry of bound 1 measures a KL within the target, so the backoff is
    cleared and the bound climbs on as before (every starved step with a healthy KL: +1)."""
    auto = lc.AutoStaleness(target=1e-3, ceiling=3, limit=1)
    assert auto.update(2e-3, 0.5) == 0           # failed at 1: retry after 4 starved steps
    assert [auto.update(None, 0.5) for _ in range(4)] == [0, 0, 0, 1]
    assert auto.update(2e-3, 0.5) == 0           # the retry fails: the next waits 8
    assert [auto.update(None, 0.5) for _ in range(8)] == [0] * 7 + [1]
    assert auto.update(1e-4, 0.5) == 2           # healthy at 1: forgotten, and loosened at once
    assert auto.failed_level is None and auto.backoff == lc.AUTO_RETRY_STEPS
    assert auto.update(3e-4, 0.5) == 3
    assert auto.update(None, 0.0) == 3           # not starving: hold


def test_auto_staleness_drops_through_levels_each_wait_the_base_retry():
    """The KL is over the target at bounds 2 and 1 (one fast-moving stretch of the policy): 2 -> 1 -> 0.
    These are failures of two levels, not a failed retry: bound 1 is retried after AUTO_RETRY_STEPS (4)
    starved steps at 0, and, healthy there, the bound climbs to 2 at once (its old failure at 2 was
    replaced by the one at 1, then cleared)."""
    auto = lc.AutoStaleness(target=1e-3, ceiling=4, limit=2)
    assert auto.update(5e-3, 0.5) == 1 and (auto.failed_level, auto.retry_in) == (2, 4)
    assert auto.update(3e-3, 0.5) == 0 and (auto.failed_level, auto.retry_in) == (1, 4)
    assert [auto.update(None, 0.5) for _ in range(4)] == [0, 0, 0, 1]
    assert auto.update(2e-4, 0.5) == 2 and auto.failed_level is None


def test_auto_staleness_counts_only_starved_healthy_steps_towards_a_retry():
    """Steps where the trainer did not wait do not bring the retry closer."""
    auto = lc.AutoStaleness(target=1e-3, ceiling=2, limit=1)
    auto.update(5e-3, 0.5)
    assert [auto.update(None, w) for w in (0.0, 0.5, 0.0, 0.5, 0.5, 0.0)] == [0] * 6
    assert auto.retry_in == 1
    assert auto.update(None, 0.5) == 1


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


# A version per token (in-flight weight updates). Rows are [prompt, completion..., padding]; the
# prompt and the padding are not sampled (mask 0) and carry whatever version (here 0 or junk).

@pytest.mark.parametrize("versions, mask, want", [
    ([[0, 3, 3, 3]], [[0, 1, 1, 1]], 3),                        # one version throughout (--inflight off)
    ([[0, 4, 4, 5]], [[0, 1, 1, 1]], 4),                        # started at 4, finished at 5: the oldest
    ([[0, 5, 6, 7]], [[0, 1, 1, 1]], 5),                        # two swaps in one row
    ([[0, 5, 5, 5], [0, 4, 5, 0]], [[0, 1, 1, 1], [0, 1, 1, 0]], 4),  # rows differ: the group's oldest
    ([[0, 6, 6, 6], [0, 6, 7, 0]], [[0, 1, 1, 1], [0, 1, 1, 0]], 6),  # a row that began after the swap
    ([[9, 5, 5, 2]], [[0, 1, 1, 0]], 5),                        # unsampled positions do not count,
    ([[-1, 5, 5, -7]], [[0., 1., 1., 0.]], 5),                  # ... whatever they hold
    ([[0, 4, 5, 5]], [[0, 0, 1, 1]], 5),                        # a token the verifier did not see
])
def test_rollout_version_is_the_oldest_sampled_token(versions, mask, want):
    got = lc.rollout_version(np.asarray(versions, np.int32), np.asarray(mask, np.float32))
    assert got == want and type(got) is int


@pytest.mark.parametrize("mask", [[[0, 0, 0, 0]], [[0, 0], [0, 0]], np.zeros((3, 0))])
def test_rollout_version_needs_a_sampled_token(mask):
    mask = np.asarray(mask, np.float32)
    with pytest.raises(ValueError, match="without sampled tokens"):
        lc.rollout_version(np.full(mask.shape, 3, np.int32), mask)


@pytest.mark.parametrize("versions, version, want", [
    ([[4, 4, 5, 5]], 5, [[1, 1, 0, 0]]),
    ([[4, 4, 5, 5]], 4, [[0, 0, -1, -1]]),                     # a token newer than the update: negative
    ([[0, 4, 5], [0, 5, 5]], 7, [[7, 3, 2], [7, 2, 2]]),
    ([[2**31 - 1]], -2**31, [[-2**32 + 1]]),                   # int32 in, no overflow
])
def test_token_staleness(versions, version, want):
    got = lc.token_staleness(np.asarray(versions, np.int32), version)
    assert got.dtype == np.int64 and got.tolist() == want


F, T_ = False, True
ROW = [[0, 4, 4, 5, 5]]          # the case: a row started at v = 4 and finished at v + 1 = 5
ROW_MASK = [[0, 1, 1, 1, 1]]
TWO = [[0, 5, 5, 5, 0], [0, 4, 5, 5, 5]]   # row 0 all at 5; row 1 from 4 to 5; row 0's padding at 0
TWO_MASK = [[0, 1, 1, 1, 0], [0, 1, 1, 1, 1]]
EXACT = [  # versions, mask, version, mode, want
    (ROW, ROW_MASK, 5, lc.KEEP, [[F, F, F, F, F]]),        # its cache holds v 4's keys and values
    (ROW, ROW_MASK, 5, lc.RECOMPUTE, [[F, F, F, T_, T_]]), # recomputed at the swap: v 5's tokens exact
    (ROW, ROW_MASK, 5, lc.OFF, [[F, F, F, T_, T_]]),
    (ROW, ROW_MASK, 4, lc.KEEP, [[F, T_, T_, F, F]]),      # before the swap, every mode is exact
    (ROW, ROW_MASK, 4, lc.RECOMPUTE, [[F, T_, T_, F, F]]),
    (ROW, ROW_MASK, 6, lc.RECOMPUTE, [[F] * 5]),           # nothing was sampled by v 6
    (TWO, TWO_MASK, 5, lc.KEEP, [[F, T_, T_, T_, F], [F] * 5]),
    (TWO, TWO_MASK, 5, lc.RECOMPUTE, [[F, T_, T_, T_, F], [F, F, T_, T_, T_]]),
    (TWO, TWO_MASK, 4, lc.KEEP, [[F] * 5, [F, T_, F, F, F]]),
    ([[5, 5, 5, 4]], [[1, 1, 1, 0]], 5, lc.KEEP, [[T_, T_, T_, F]]),  # an unsampled older slot: not the row's start
    ([[5, 5, 5]], [[1, 1, 1]], 5, lc.KEEP, [[T_, T_, T_]]),
    ([[0, 5, 5]], [[0, 0, 0]], 5, lc.KEEP, [[F, F, F]]),   # no sampled token: none exact
    ([[0, 5, 5]], [[0, 0, 0]], 5, lc.RECOMPUTE, [[F, F, F]]),
]
@pytest.mark.parametrize("versions, mask, version, mode, want, dtype",
                         [(*case, dtype) for dtype in (np.int32, np.int64) for case in EXACT])
def test_exact_tokens(versions, mask, version, mode, want, dtype):
    got = lc.exact_tokens(np.asarray(versions, dtype), np.asarray(mask, np.float32), version, mode)
    assert got.dtype == np.bool_ and got.tolist() == want


@pytest.mark.parametrize("mode", ["", "on", "KEEP", None])
def test_exact_tokens_refuses_an_unknown_mode(mode):
    with pytest.raises(ValueError, match="unknown in-flight mode"):
        lc.exact_tokens(np.asarray(ROW, np.int32), np.asarray(ROW_MASK, np.float32), 5, mode)


@pytest.mark.parametrize("v", [0, 4])
@pytest.mark.parametrize("k, want", [(0, lc.STALE), (1, lc.OK), (2, lc.OK)])
def test_a_row_started_at_v_and_finished_at_v_plus_1(v, k, want):
    """The issue's case: its first tokens were sampled by v, its last by v + 1. Its version is v, so at
    the trainer's version v + 1 it is one version stale: refused with k = 0 (a token of v would be
    trained at v + 1), admitted with k = 1. At v + 1 no token is exact in KEEP mode (the row's cache
    holds v's keys and values), v + 1's tokens are in RECOMPUTE mode; at v, v's tokens in both."""
    versions = np.asarray([[0, v, v, v + 1, v + 1, 0]], np.int32)
    mask = np.asarray([[0, 1, 1, 1, 1, 0]], np.float32)
    assert lc.rollout_version(versions, mask) == v
    assert lc.token_staleness(versions, v + 1)[mask > 0].tolist() == [1, 1, 0, 0]
    late = [[F, F, F, T_, T_, F]]
    assert lc.exact_tokens(versions, mask, v + 1, lc.KEEP).tolist() == [[F] * 6]
    assert lc.exact_tokens(versions, mask, v + 1, lc.RECOMPUTE).tolist() == late
    # at v, v's tokens are exact in both modes (int32: the wire's dtype)
    assert lc.exact_tokens(versions, mask, v, lc.KEEP).tolist() == [[F, T_, T_, F, F, F]]
    assert lc.exact_tokens(versions, mask, v, lc.RECOMPUTE).tolist() == [[F, T_, T_, F, F, F]]
    version = lc.rollout_version(versions, mask)
    assert lc.usable(version, "a", v + 1, "a", k) == want
    assert lc.usable(version, "a", v, "a", k) == lc.OK          # at v itself: on-policy
    assert lc.usable(version, "a", v + 2, "a", k) == (lc.OK if k >= 2 else lc.STALE)
    # and as a rollout through the books: the trainer at v + 1 keeps it only with k >= 1
    b, fates = books(k=k, B=1)
    b.add(item(0, v))
    r = rollout("train/0|p0", v, "a", G=1, T=6, rewards=[1.0], versions=versions, mask=mask, inflight=lc.KEEP)
    assert r.version == v and r.token_versions().tolist() == versions.tolist()
    assert b.receive(r, version=v + 1) == (lc.OK if want == lc.OK else lc.DROPPED_STALE)
    assert fates == ([] if want == lc.OK else [("train/0|p0", lc.DROPPED_STALE)])
    if want == lc.OK:
        assert b.fill(v + 1, lambda r, seen: True) and [r.item_id for r in b.trained()] == ["train/0|p0"]


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
    w.extend([(0, 0)] * 3)                            # no programs at all: nothing to judge
    assert not lc.verifier_broken(w, 0.0)
    assert lc.verifier_broken(collections.deque([(1, 1)], maxlen=1), 0.5)  # one program, failed


def rollout(item_id, version, lineage, G=2, T=4, statuses=None, rewards=None, worker="w", versions=None,
            mask=None, inflight=None):
    """A well-formed rollout; `versions` (and `inflight`) only when given: an old-style map without them."""
    extra = {"versions_GT": versions} if versions is not None else {}
    extra |= {"inflight": inflight} if inflight is not None else {}
    return wire.Rollout.from_dict(dict(
        item_id=item_id, version=version, lineage=lineage, worker=worker, prompt_len=1,
        tokens_GT=np.ones((G, T), np.int32), logp_behav_GT=np.zeros((G, T), np.float32),
        mask_GT=np.ones((G, T), np.float32) if mask is None else mask,
        rewards_G=np.asarray(rewards if rewards is not None else [0.0, 1.0][:G], np.float32),
        finished_G=np.ones(G, bool), statuses=statuses or ["passed"] * G, **extra))


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


def test_the_collector_feeds_and_routes_a_reply():
    """Feed tops up to (k + 1) x B (a prompt too long gets its fate at once); a reply's ids are acked
    next time, a malformed map is dropped, an evaluation rollout answers its pending item once,
    training rollouts go to the books; a restarted server gets back what we hold no rollout for."""
    b, fates = books(k=0, B=2)
    c = lc.Collector(b, lambda i, v: (item(i, v), i != 1))
    assert [i.item_id for i in c.feed()] == ["train/0|p0"] and fates == [("train/1|p1", lc.SKIPPED_TOO_LONG)]
    assert [i.item_id for i in c.feed()] == ["train/2|p2"] and c.cursor == 3 and c.feed() == []
    c.eval_pending["eval/0|x"] = item(9, 0)
    ev, other_ev = ({**rollout(i, 0, "a").to_dict(), "eval": True} for i in ("eval/0|x", "eval/1|y"))
    train, again = (rollout("train/0|p0", 0, "a", worker=w).to_dict() for w in ("w", "w2"))
    parse = lambda d: wire.Rollout.from_dict(d) if isinstance(d, dict) else None
    fresh = c.receive([train, ev, "junk", other_ev, ev, again], parse)
    assert [(r.item_id, r.worker) for r in fresh] == [("train/0|p0", "w")]
    assert c.ack == ["train/0|p0", "eval/0|x", "eval/1|y", "eval/0|x", "train/0|p0"]
    assert b.counts[lc.ARRIVED_DUPLICATE] == 1
    assert [r.item_id for r in c.evals] == ["eval/0|x"] and not c.eval_pending
    assert [i.item_id for i in c.server_restarted()] == ["train/2|p2"] and c.ack  # the acks stay


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


def test_the_queue_counts_what_happened_and_refuses_malformed_requests():
    """What GetStats reports (WorkQueue.stats) after each kind of event. A renewal keeps a lease
    alive; a restarted worker's first renewal releases its predecessor's leases, as its hello would;
    a lapsed lease's late result still counts. Malformed leases, renewals and acks are refused. The
    ids of delivered rollouts are remembered, the oldest forgotten first: a late submission is then
    a duplicate, not unknown, and an id is enqueued again only with requeue."""
    q = param_server.WorkQueue(param_server.Config(state_dir="/nonexistent-unused", remember_done=2))
    q.enqueue([item(i, 0).to_dict() for i in range(4)], requeue=False)
    assert q.enqueue([item(3, 0).to_dict(), item(4, 0).to_dict()], requeue=False) == {"added": 1, "queued": 5}
    for lease_s in (0.5, 3600):
        q.check_lease_s(lease_s)
    for lease_s in (0, 3600.5):
        with pytest.raises(ValueError, match=r"lease_s must be in \(0, 3600\]"):
            q.check_lease_s(lease_s)
    a, b = q.lease("w0", 2, 10, incarnation="i1")
    c, d = q.lease("w1", 2, 10, incarnation="j1")
    assert q.renew("w0", [[a["item_id"], a["lease"]], [b["item_id"], b["lease"]]], 1000, "i1") == \
        {"renewed": 2, "lost": []}
    for it in q.items.values():
        it.deadline -= 500  # 500 s pass: the renewed leases (1000 s) hold, the others (10 s) lapse
    q.expire()
    assert [i for i, it in q.items.items() if it.state == "leased"] == [a["item_id"], b["item_id"]]
    assert submit(q, c, c["lease"]) == "accepted"                          # lapsed, but nobody took it
    for bad in ([[1, 2]], [["x"]], ["ab"]):
        with pytest.raises(ValueError, match="pairs of strings"):
            q.renew("w0", bad, 10, "i1")
    assert q.renew("w0", [], 10, "i2") == {"renewed": 0, "lost": []}  # w0 restarted: a and b go back
    fresh = {i["item_id"]: i for i in q.lease("w1", 3, 10, "j1")}
    A, B, D = (fresh[x["item_id"]] for x in (a, b, d))
    assert [submit(q, it, it["lease"]) for it in (A, B)] == ["accepted"] * 2
    assert submit(q, A, a["lease"]) == "duplicate"                          # w0's late result
    assert q.submit(wire.SubmitRollout("w1", D["item_id"], D["lease"], rollout(D["item_id"], 0, "z").to_dict()),
                    "a") == "old_lineage"
    assert submit(q, item(9, 0).to_dict(), "") == "unknown"
    assert [r["item_id"] for r in q.take(2)] == [c["item_id"], A["item_id"]]  # this reply is lost
    assert q.stats() == {"enqueued": 5, "leased": 1, "reissued": 3, "renewed": 2, "lease_expired": 2,
                         "released_on_hello": 2, "submitted": 3, "duplicate": 1, "old_lineage": 1, "unknown": 1,
                         "resent": 0, "refused_workers": [], "queued": 1, "finished": 1, "unacked": 2}
    assert [r["item_id"] for r in q.take(8)] == [c["item_id"], A["item_id"], B["item_id"]]
    with pytest.raises(ValueError, match="ack must list item ids"):
        q.take(8, ack=[3])
    assert q.take(8, ack=[c["item_id"], A["item_id"], B["item_id"]]) == []  # delivered; c forgotten
    assert [submit(q, it, it["lease"]) for it in (c, A)] == ["unknown", "duplicate"]
    assert q.enqueue([item(i, 0).to_dict() for i in (0, 2)], requeue=False)["added"] == 1  # c, not A
    assert q.enqueue([item(0, 0).to_dict()], requeue=True)["added"] == 1
    q.reset()                                                               # D, item 4, c, A
    q.enqueue([item(5, 0).to_dict()], requeue=False)
    q.reset()
    assert q.stats() == {"enqueued": 8, "leased": 0, "reissued": 3, "renewed": 2, "lease_expired": 2,
                         "released_on_hello": 2, "submitted": 3, "duplicate": 2, "old_lineage": 1, "unknown": 2,
                         "resent": 2, "delivered": 3, "reset_items": 5, "refused_workers": [], "queued": 0, "finished": 0, "unacked": 0}


def test_the_queue_refuses_what_no_item_asked_for():
    """A full queue takes nothing; a lease needs max_items >= 1 and lasts lease_s; a restarted worker's
    first lease releases its predecessor's leases; a rollout must name its message's item and be
    what the item asked for (its lineage, a version >= its min_version, G x T), else it is refused
    and counted; a dead lineage's rollout is answered old_lineage, and counted."""
    q = param_server.WorkQueue(param_server.Config(state_dir="/nonexistent-unused", max_items=2))
    q.enqueue([item(i, 1).to_dict() for i in range(2)], requeue=False)
    with pytest.raises(ValueError, match=r"queue full \(2 of 2 items held\)"):
        q.enqueue([item(2, 1).to_dict()], requeue=False)
    with pytest.raises(ValueError, match="max_items must be >= 1"):
        q.lease("w0", 0, 10, "i1")
    a, b = q.lease("w0", 2, 10, "i1")
    q.expire()
    assert q.stats()["leased"] == 2                                    # 10 s have not passed
    assert [i["item_id"] for i in q.lease("w0", 2, 10, "i2")] == [a["item_id"], b["item_id"]]  # i1 died
    a, b = q.lease("w0", 2, 10, "i3")
    assert q.stats()["released_on_hello"] == 4
    with pytest.raises(ValueError, match="rollout.item_id differs from the message's item_id"):
        q.submit(wire.SubmitRollout("w0", b["item_id"], a["lease"], rollout(a["item_id"], 1, "a").to_dict()), "a")
    older = rollout(a["item_id"], 0, "a").to_dict()                    # sampled before min_version 1
    wider = rollout(a["item_id"], 1, "a", G=3, rewards=[0.0, 1.0, 0.0]).to_dict()
    other = rollout(a["item_id"], 1, "b").to_dict()                    # the server's lineage, not the item's
    for r, lineage in ((older, "a"), (wider, "a"), (other, "b")):
        with pytest.raises(ValueError, match="rollout refused"):
            q.submit(wire.SubmitRollout("w0", a["item_id"], a["lease"], r), lineage)
    assert [submit(q, a, a["lease"], version=1) for _ in range(2)] == ["accepted", "duplicate"]
    stale = rollout(b["item_id"], 1, "a").to_dict()
    assert [q.submit(wire.SubmitRollout("w0", b["item_id"], b["lease"], stale), "z") for _ in range(2)] == \
        ["old_lineage"] * 2
    assert {k: q.stats()[k] for k in ("refused", "old_lineage", "submitted")} == \
        {"refused": 3, "old_lineage": 2, "submitted": 1}


@pytest.mark.parametrize("v", [0, 4])
def test_the_queue_checks_min_version_against_the_oldest_token(v):
    """A rollout whose rows started at v and finished at v + 1 is refused for an item that asked for
    v + 1 (its first tokens are older than that) and accepted for one that asked for v; the refused
    item stays leased, and a rollout sampled by v + 1 throughout is accepted for it."""
    q = queue()
    q.enqueue([item(0, v + 1).to_dict(), item(1, v).to_dict()], requeue=False)
    a, b = q.lease("w", 2, 10)
    versions = np.asarray([[0, v, v, v + 1], [0, v, v + 1, v + 1]], np.int32)
    mask = np.asarray([[0, 1, 1, 1], [0, 1, 1, 1]], np.float32)

    def send(it, versions, version):
        r = rollout(it["item_id"], version, "a", versions=versions, mask=mask, inflight=lc.RECOMPUTE)
        return q.submit(wire.SubmitRollout("w", it["item_id"], it["lease"], r.to_dict()), "a")
    with pytest.raises(ValueError, match=f"version {v} is older than the item's min_version {v + 1}"):
        send(a, versions, v)
    assert send(b, versions, v) == "accepted"
    assert send(a, np.full((2, 4), v + 1, np.int32), v + 1) == "accepted"
    assert [r["versions_GT"].tolist() for r in q.take(8)] == [versions.tolist(), [[v + 1] * 4] * 2]


# ----------------------------------------------------------------------------- the whole lifecycle

INFRA = "infra_error"  # the verifier's status for its own failure, as it travels (verifier.py sends it)
# The fates as ledger.jsonl spells them
FATE_WORDS = {"trained", "dropped_stale", "filtered_zero_var", "skipped_too_long", "verifier_failed"}


class Worker:
    """A simulated inference worker: the weights it holds, the items it leased (waiting for weights
    until lifecycle.worker_action says sample or abandon), the rollouts it sampled and has not
    submitted yet, and what it submitted (a duplicate sends one again). A slow worker sits on its
    rollouts while the trainer makes a few steps, then submits them all at once. A worker in an
    in-flight mode (`inflight`, keep or recompute: inference_worker --inflight) is still sampling
    the rows of the rollouts it has not submitted: it may swap newer weights in between two of their
    decode steps (Sim.swap_mid_row); one in mode off sends old-style rollouts (no versions_GT)."""

    def __init__(self, name: str, slow: bool, incarnation: str, inflight: str = lc.OFF):
        self.name, self.slow, self.inc, self.announced = name, slow, incarnation, False
        self.inflight = inflight
        self.version, self.lineage = -1, ""
        self.group, self.done, self.sent = [], [], []
        self.submit_at = 0  # its rollouts are ready to submit at this trainer version


class Sim:
    """One random run. The trainer is lifecycle.Collector, the code trainer.Trainer runs between its
    sockets (feed, receive, fill / batch / trained, snapshot / restore, server_restarted), called in
    Trainer's order: check_param_server pushes, then enqueues again; a step trains, pushes, sometimes
    checkpoints, then checks the param server. The param server is the real param_server.WorkQueue
    (a new one when the server restarts) with its newest weights and the rule of
    ParamServer.on_commit (a new lineage's first version drops the old queue). The workers are
    simulated and decide with the real lifecycle.worker_action. The invariants are checked against
    the model's own record: the version it trained at, the leases the server issued, who sent what.
    Each event returns whether it did anything."""

    def __init__(self, rng: random.Random, k: int, B: int, auto: bool = False):
        """k: the staleness bound; with auto, its ceiling: a trainer starts at 0 and after each step
        the bound moves anywhere in [0, k], as trainer --staleness-target moves it (between batches)."""
        self.rng, self.k, self.B, self.auto = rng, k, B, auto
        self.instance, self.weights, self.persisted = 0, (-1, ""), (-1, "")
        self.published = set()   # every (version, lineage) a param server ever had
        self.made = {}           # serial (a rollout's prompt token) -> what was sampled: Sim.sampled
        self.swaps = self.mixed_received = self.mixed_trained = 0
        self.restart_param_server()
        modes = [rng.choice((lc.KEEP, lc.RECOMPUTE)), rng.choice(lc.INFLIGHT_MODES), lc.OFF, lc.KEEP]
        self.workers = {f"w{i}": Worker(f"w{i}", slow=i == 0, incarnation="0", inflight=modes[i]) for i in range(4)}
        for w in self.workers.values():
            self.hello(w)
        self.n_lineage, self.version = 0, 0
        self.ledger: list = []   # (item_id, fate): ledger.jsonl
        self.trained: list = []  # the item ids the model trained on, in order (cut back by a resume)
        self.start_trainer(None)
        self.save_checkpoint()   # a resume before the first checkpoint starts from nothing

    # -- the param server
    def restart_param_server(self):
        """A new param server process: an empty queue, the weights last persisted (maybe older)."""
        self.q = param_server.WorkQueue(param_server.Config(state_dir="/nonexistent-unused"))
        self.instance += 1
        self.weights = self.persisted
        self.issued = collections.defaultdict(set)  # item_id -> the leases this queue issued for it
        self.accepted = set()                       # the items it accepted a rollout for
        return True

    def commit(self, version: int, lineage: str):
        """A weight push arrives (ParamServer.on_commit): a new lineage drops the old one's queue."""
        if lineage != self.weights[1]:
            self.q.reset()
            self.issued, self.accepted = collections.defaultdict(set), set()
        self.weights = (version, lineage)
        self.published.add(self.weights)
        if self.rng.random() < 0.7:  # on disk before the next restart, or not yet (a thread writes it)
            self.persisted = self.weights

    def expire(self):
        leased = [i for i in self.q.items.values() if i.state == "leased"]
        if leased:
            self.rng.choice(leased).deadline = 0.0  # a heartbeat that came too late
            self.q.expire()
        return bool(leased)

    # -- the trainer
    def start_trainer(self, checkpoint):
        """A trainer process: a new lineage; a resume restores the checkpoint and cuts the ledger back."""
        self.n_lineage += 1
        self.lineage = f"L{self.n_lineage}"
        books = lc.Books(0 if self.auto else self.k, self.B, self.lineage, lambda i, f: self.ledger.append((i, f)))
        self.collector = lc.Collector(books, self.new_item)
        self.ps_instance, self.last_reply, self.offered = None, [], 0
        if checkpoint is not None:
            del self.ledger[checkpoint["ledger"]:]
            del self.trained[checkpoint["trained"]:]
            self.version = checkpoint["version"]
            self.collector.restore(json.loads(checkpoint["meta"]), wire.WorkItem.from_dict)
        return True

    def new_item(self, index: int, version: int):
        assert version == self.version, "an item must ask for the trainer's version"
        return item(index, version, self.lineage), self.rng.random() > 0.05  # 1 in 20 too long

    def save_checkpoint(self):
        self.checkpoint = dict(meta=json.dumps(self.collector.snapshot()), version=self.version,
                               ledger=len(self.ledger), trained=len(self.trained))

    def check_param_server(self):
        """Trainer.check_param_server: a server we have not talked to, or one whose newest weights
        are not our version, gets a push; a new one also gets every item we hold no rollout for."""
        restarted = self.instance != self.ps_instance
        if restarted or self.weights != (self.collector.version, self.lineage):
            self.commit(self.collector.version, self.lineage)
        if restarted:
            self.q.enqueue([i.to_dict() for i in self.collector.server_restarted()], requeue=True)
            self.ps_instance = self.instance
        return True

    def connect(self):
        if self.ps_instance is None:  # Trainer.run begins with check_param_server
            self.check_param_server()

    def feed(self):
        self.connect()
        fates, before = len(self.ledger), len(self.collector.books.in_flight)
        items = self.collector.feed()
        skipped = len(self.ledger) - fates  # too long for the budget: a fate at once
        # topped up to (bound + 1) x B; above it only after the bound came down (nothing is taken back)
        bound = self.collector.books.max_staleness
        assert len(self.collector.books.in_flight) + skipped == max((bound + 1) * self.B, before), \
            "not topped up to (k + 1) x B"
        self.q.enqueue([i.to_dict() for i in items], requeue=False)
        return bool(items)

    def get(self, lost=False, replay=False):
        self.connect()
        if self.ps_instance != self.instance and self.rng.random() < 0.5:
            # The long poll died with the server: a TimeoutError, on which Trainer.run checks it.
            # (A request sent after the restart is answered by the new server, unnoticed.)
            return self.check_param_server()
        if replay:  # the same reply read twice: duplicates only the books can recognise
            if not self.last_reply:
                return False
            reply, self.last_reply = self.last_reply, []
        else:
            reply = self.q.take(self.rng.randint(1, 8), ack=self.collector.ack)
            self.last_reply = [] if lost else reply
        if not lost:  # a lost reply never reaches the trainer: it acks nothing new next time
            counts = self.collector.books.counts
            duplicates = counts[lc.ARRIVED_DUPLICATE]
            for r in self.collector.receive(reply, wire.Rollout.from_dict):
                if r.lineage == self.lineage:  # no token from a version the trainer has not made
                    sampled = r.token_versions()[r.mask_GT > 0]
                    assert sampled.max() <= self.collector.version, \
                        f"received a token of v{sampled.max()} at v{self.collector.version} of {self.lineage}"
                    self.mixed_received += len(set(sampled.tolist())) > 1
            # Nothing used twice, at the door: the server sends each rollout once (until acked), so
            # the trainer sees a duplicate exactly when it reads a reply again.
            assert counts[lc.ARRIVED_DUPLICATE] - duplicates == (len(reply) if replay else 0), \
                "a rollout arrived twice" if not replay else "a rollout read twice was not a duplicate"
        return bool(reply)

    def keep(self, rollout, seen):
        """Dynamic sampling (grpo.keep_group's say): groups with a reward spread, and any once more
        than 4 x B were offered to this batch; `seen` must count the offers since the last batch."""
        self.offered += 1
        assert seen == self.offered, f"the books say {seen} rollouts were offered to this batch, not {self.offered}"
        return np.ptp(rollout.rewards_G) > 0 or seen > 4 * self.B

    def step(self):
        self.connect()
        if not self.collector.fill(self.keep):
            return False
        batch = self.collector.batch()
        assert len({r.item_id for r in batch}) == len(batch) == self.B
        bound = self.collector.books.max_staleness  # the bound this batch was admitted under
        assert bound <= self.k
        for r in batch:  # what may be trained on, against the model's own version and record
            assert r.lineage == self.lineage and 0 <= self.version - r.version <= bound, \
                f"trained a rollout of {r.lineage} v{r.version} at {self.lineage} v{self.version}, k={bound}"
            assert INFRA not in r.statuses, f"trained {r.item_id}, a group the verifier failed on"
            assert r.worker in self.workers, f"trained a rollout sent by {r.worker}"
            assert r.item_id not in self.trained, f"trained {r.item_id} twice"
            # THE BOUND per token: every token of the rollout, as the worker sampled it
            made, sampled = self.made.get(int(r.tokens_GT[0, 0])), r.mask_GT > 0
            assert made is not None and made.worker == r.worker and np.array_equal(made.mask, r.mask_GT), \
                f"trained {r.item_id}, a rollout {r.worker} did not sample"
            versions = r.token_versions()
            assert np.array_equal(versions[sampled], made.versions[sampled]), \
                f"{r.item_id}'s token versions {versions.tolist()} are not those it was sampled with " \
                f"{made.versions.tolist()}"
            age = self.version - versions[sampled]
            assert age.min() >= 0 and age.max() <= bound, \
                f"trained a token of v{versions[sampled].min()}..v{versions[sampled].max()} at v{self.version}, k={bound}"
            assert all((v, r.lineage) in self.published for v in set(versions[sampled].tolist())), \
                f"trained a token of {r.lineage} sampled with weights no param server had"
            self.mixed_trained += len(set(versions[sampled].tolist())) > 1
        self.collector.trained()
        if self.auto:  # Trainer.run: the bound for the next batch, set between batches
            self.collector.books.max_staleness = self.rng.randint(0, self.k)
        self.version, self.offered = self.version + 1, 0
        self.trained += [r.item_id for r in batch]
        self.commit(self.collector.version, self.lineage)  # Trainer.push_trained
        if self.rng.random() < 0.3:
            self.save_checkpoint()
        return self.check_param_server()  # the next step begins with it

    def collect(self):  # one round of Trainer.collect_batch's loop: fill (and train), feed, receive
        return any([self.step(), self.feed(), self.get()])

    def sigterm(self):
        self.save_checkpoint()  # checkpointed now, the half-collected batch included
        return self.start_trainer(self.checkpoint)

    def sigkill(self):
        return self.start_trainer(self.checkpoint)

    # -- the workers
    def pick(self, pred):
        ws = [w for w in self.workers.values() if pred(w)]
        return self.rng.choice(ws) if ws else None

    def hello(self, w):
        self.q.hello(w.name, w.inc)
        w.announced = True

    def pull(self, w):
        if self.weights[0] >= 0:
            w.version, w.lineage = self.weights

    def lease(self, w=None, n=None):
        """Worker.run_batch: lease a batch (after a hello, if just started), sample it as soon as
        the weights allow, submit it (a fast worker, mostly at once; a slow one later)."""
        w = w or self.pick(lambda w: not w.group and not w.done)
        if w is None or not self.q.queue:
            return False
        if not w.announced:
            self.hello(w)
        if self.rng.random() < 0.5:  # pull_every: new weights between batches, or not
            self.pull(w)
        w.group = [SimpleNamespace(**d) for d in self.q.lease(w.name, n or self.rng.randint(1, 3), 10, w.inc)]
        for it in w.group:
            self.issued[it.item_id].add(it.lease)
        self.work(w)
        w.submit_at = self.version + self.rng.randint(1, self.k + 2) if w.slow else self.version
        if not w.slow and self.rng.random() < 0.6:
            self.submit(w)
        return True

    def work(self, w=None, must_decide=False):
        """Worker.wait_for_weights, one pull at a time, then sampling."""
        w = w or self.pick(lambda w: w.group)
        if w is None or not w.group:
            return False
        need, lineage = max(i.min_version for i in w.group), w.group[0].lineage
        action = lc.worker_action(need, lineage, w.version, w.lineage, False)
        if action == lc.WAIT:
            self.pull(w)
            action = lc.worker_action(need, lineage, w.version, w.lineage, (w.version, w.lineage) == self.weights)
        if action == lc.SAMPLE:  # the worker's half of the bound: the item's lineage, >= its min_version
            assert w.lineage == lineage and all(w.version >= i.min_version for i in w.group), \
                f"sampled items of {lineage} v>={need} with {w.lineage} v{w.version}"
            w.done += [(it, self.sampled(it.item_id, w.version, w.lineage, w.name, w.inflight)) for it in w.group]
        elif action == lc.ABANDON:  # only items whose trainer is gone: the server's newest is not theirs
            assert (w.version, w.lineage) == self.weights and w.lineage != lineage, \
                f"abandoned items of {lineage} holding {w.lineage} v{w.version}, server at {self.weights}"
        else:
            assert not must_decide, f"{w.name} waits for v{need} of {lineage}, the server has {self.weights}"
            return True
        w.group = []
        return True

    def sampled(self, item_id, version, lineage, worker, inflight=lc.OFF):
        """A group of G = 2 rows of T = 4 slots: the prompt token (which names this sampling: the
        serial of its record in `made`), 1 to 3 completion tokens (mask 1) and padding. In an
        in-flight mode each row has sampled a random number of its tokens so far (`cursor`: the
        slot of its next one) and the rollout carries versions_GT (-1 where nothing was sampled, as
        inference_worker writes it);
        swap_mid_row gives the tokens not sampled yet a newer version."""
        statuses = ["passed", "failed"]
        if self.rng.random() < 0.08:  # the verifier failed on one program, or on both
            statuses = [INFRA, self.rng.choice([INFRA, "passed"])]
        rewards = self.rng.choice([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
        ends = [1 + self.rng.randint(1, 3) for _ in range(2)]  # each row's slots end here
        mask = np.zeros((2, 4), np.float32)
        for g, end in enumerate(ends):
            mask[g, 1:end] = 1
        tokens = np.ones((2, 4), np.int32)
        tokens[:, 0] = serial = len(self.made)
        versions = np.where(mask > 0, version, -1).astype(np.int32)
        self.made[serial] = SimpleNamespace(worker=worker, mask=mask, versions=versions, ends=ends,
                                            cursor=[self.rng.randint(1, end) for end in ends])
        r = dict(item_id=item_id, version=version, lineage=lineage, worker=worker, prompt_len=1,
                 tokens_GT=tokens, logp_behav_GT=np.zeros((2, 4), np.float32),
                 mask_GT=mask, rewards_G=np.array(rewards, np.float32),
                 finished_G=np.ones(2, bool), statuses=statuses)
        if inflight != lc.OFF:
            r.update(versions_GT=versions, inflight=inflight)
        return r

    def swap_mid_row(self):
        """The version changes in the middle of a row (inference_worker --inflight keep|recompute): a
        worker in an in-flight mode that is still sampling (it holds rollouts it has not submitted)
        swaps in the param server's newest weights between two decode steps, if they are newer than
        its own and of its lineage (the only ones it can get: it pulls them now; a version the server
        never had, or another trainer's, it cannot). Every row's tokens not sampled yet will be
        sampled by them, and each row gets a few tokens further (maybe to its end). The rollout's
        version is its oldest token's (lifecycle.rollout_version, as the worker computes it)."""
        w = self.pick(lambda w: w.inflight != lc.OFF and w.done and w.lineage == self.weights[1]
                      and w.version < self.weights[0])
        if w is None:
            return False
        w.version = self.weights[0]
        for _, r in w.done:
            made = self.made[int(r["tokens_GT"][0, 0])]
            made.versions = made.versions.copy()  # never mutate an array a rollout may share
            for g, end in enumerate(made.ends):
                made.versions[g, made.cursor[g]:end] = w.version
                made.cursor[g] = self.rng.randint(made.cursor[g], end)
            r.update(versions_GT=made.versions, version=lc.rollout_version(made.versions, made.mask))
        self.swaps += 1
        return True

    def send(self, worker, it_id, lease, r):
        """A submission, and the server's invariants on what it accepts: a lease it issued for that
        item, a rollout of its newest lineage and of the item's lineage, shape and min_version, one
        per item."""
        asked = self.q.items[it_id].data if it_id in self.q.items else None
        try:
            status = self.q.submit(wire.SubmitRollout(worker, it_id, lease, r), self.weights[1])
        except wire.WireError as e:  # every rollout the model sends is well-formed, its version the oldest
            raise AssertionError(f"{worker}'s rollout of {it_id} does not parse: {e}") from None
        except ValueError:
            return "refused"
        if status == "accepted":
            assert lease in self.issued[it_id], f"accepted {it_id} under a lease never issued for it"
            assert r["lineage"] == self.weights[1], f"accepted {it_id} of lineage {r['lineage']}"
            assert it_id not in self.accepted, f"accepted a second rollout of {it_id}"
            versions = r["versions_GT"] if r.get("versions_GT", np.zeros(0)).size else np.full((2, 4), r["version"])
            assert (r["lineage"] == asked["lineage"] and r["version"] >= asked["min_version"]
                    and versions[r["mask_GT"] > 0].min() >= asked["min_version"]
                    and r.get("eval", False) == asked["eval"]
                    and r["tokens_GT"].shape == (asked["group_size"], asked["seq_len"])), \
                f"accepted a rollout of {it_id} that is not what the item asked for"
            self.accepted.add(it_id)
        return status

    def submit(self, w=None):
        w = w or self.pick(lambda w: w.done and self.version >= w.submit_at)
        if w is None:
            return False
        n = len(w.done) if w.slow or self.rng.random() < 0.5 else 1  # the slow one: all at once
        for it, r in w.done[:n]:
            self.send(w.name, it.item_id, it.lease, r)
            w.sent.append((it, r))
        del w.done[:n]
        return True

    def duplicate(self):
        w = self.pick(lambda w: w.sent)
        if w is None:
            return False
        it, r = self.rng.choice(w.sent)
        self.send(w.name, it.item_id, it.lease, r)
        return True

    def forge(self):
        """A submission under a lease the server never issued, of its newest lineage and version."""
        if not self.q.items or self.weights[0] < 0:
            return False
        it_id = self.rng.choice(list(self.q.items))
        self.send("forger", it_id, os.urandom(6).hex(), self.sampled(it_id, *self.weights, "forger"))
        return True

    def zombie(self):
        """A rollout of a dead (or never seen) lineage under a genuine lease."""
        leased = [(i, it) for i, it in self.q.items.items() if it.state == "leased"]
        if not leased:
            return False
        it_id, it = self.rng.choice(leased)
        lineage = self.rng.choice([f"L{self.n_lineage - 1}", "Lzombie"])
        self.send("zombie", it_id, it.lease, self.sampled(it_id, it.data["min_version"], lineage, "zombie"))
        return True

    def misfit(self):
        """A rollout under a genuine lease that is not what its item asked for: sampled with weights
        older than its min_version (maybe only one token of one row: its version is the oldest), of
        another group size or length, or marked as an evaluation."""
        leased = [(i, it) for i, it in self.q.items.items() if it.state == "leased"]
        if not leased or self.weights[0] < 0:
            return False
        it_id, it = self.rng.choice(leased)
        r = self.sampled(it_id, *self.weights, "misfit")
        G, T = self.rng.choice([(2, 4), (3, 4), (2, 5)])
        r.update(tokens_GT=np.ones((G, T), np.int32), logp_behav_GT=np.zeros((G, T), np.float32),
                 mask_GT=np.ones((G, T), np.float32), rewards_G=np.zeros(G, np.float32),
                 finished_G=np.ones(G, bool), statuses=["passed"] * G)
        if (G, T) == (2, 4):  # the right shape: older weights (maybe its first token's only), or the wrong kind
            minv = it.data["min_version"]
            mixed = np.full((G, T), minv, np.int32)
            mixed[1, 1] = minv - 1
            r.update(self.rng.choice([{"version": minv - 1}, {"eval": True},
                                      {"version": minv - 1, "versions_GT": mixed, "inflight": lc.KEEP}]))
        self.send("misfit", it_id, it.lease, r)
        return True

    def kill_worker(self):
        """A worker dies with what it held; its successor says hello at its first lease."""
        w = self.rng.choice(list(self.workers.values()))
        self.workers[w.name] = Worker(w.name, w.slow, incarnation=os.urandom(4).hex(), inflight=w.inflight)
        return True

    # -- the invariants, after every event
    def check(self):
        fated = collections.Counter(i for i, _ in self.ledger)
        assert max(fated.values(), default=1) == 1, "a prompt with two fates"
        assert {f for _, f in self.ledger} <= FATE_WORDS
        in_flight = self.collector.books.in_flight
        assert not fated.keys() & in_flight.keys(), "a prompt both fated and in flight"
        assert sorted(index_of(i) for i in [*fated, *in_flight]) == list(range(self.collector.cursor)), \
            "a prompt with neither a fate nor a place in flight"
        assert len(in_flight) <= (self.k + 1) * self.B, "more than (k + 1) x B prompts in flight"
        assert collections.Counter(i for i, f in self.ledger if f == "trained") == collections.Counter(self.trained), \
            "the ledger's trained prompts are not the ones trained on"
        counts = self.collector.books.counts
        ledger_fates = collections.Counter(f for _, f in self.ledger)
        assert collections.Counter({f: counts[f] for f in FATE_WORDS}) == ledger_fates, \
            "the fate counts (metrics rollouts/*) are not the ledger's"
        assert self.collector.version == self.version, "the trainer's version is not the batches it trained"
        for it in self.q.items.values():  # a restarted worker's hello released its predecessor's leases
            w = self.workers.get(it.worker)
            assert not (it.state == "leased" and w and w.announced and it.incarnation != w.inc), \
                f"{it.worker} said hello, its predecessor still holds a lease"

    def drain(self, steps: int):
        """No faults now, and time passes: the run must make `steps` more steps (nothing is stuck
        for good), and every worker decides on the items it holds once it has pulled."""
        target = self.version + steps
        for _ in range(100):
            if self.version >= target:
                return
            self.check_param_server()
            self.feed()
            for w in self.workers.values():
                self.work(w, must_decide=True)
                self.submit(w)
            for it in self.q.items.values():
                it.deadline = 0.0  # the leases nobody renews lapse
            self.q.expire()
            while self.lease(self.pick(lambda w: not w.group and not w.done), n=3):
                self.submit(self.pick(lambda w: w.done))
            self.get()
            self.get()
            self.step()
            self.check()
        raise AssertionError(f"stuck at version {self.version}: {len(self.collector.books.in_flight)} in flight, "
                             f"server {self.q.stats()}")


def index_of(item_id: str) -> int:
    return int(item_id.split("|")[0].split("/")[1])  # train/<cursor index>|<problem id>


EVENTS = {  # event: weight
    "collect": 5, "get": 1, "lost_reply": 0.4, "replayed_reply": 0.2, "step": 2, "check_param_server": 0.3,
    "sigterm": 0.06, "sigkill": 0.06, "restart_param_server": 0.1, "expire": 0.15,
    "lease": 6, "work": 1, "submit": 4, "duplicate": 0.5, "forge": 0.3, "zombie": 0.3, "misfit": 0.3,
    "kill_worker": 0.2, "swap_mid_row": 2}


def run_sequence(seed: int, k: int, B: int, n_events: int, auto: bool = False) -> Sim:
    """n_events events that did something, each followed by the invariants' check; then the drain."""
    rng = random.Random(seed)
    sim = Sim(rng, k, B, auto)
    act = {"get": sim.get, "lost_reply": lambda: sim.get(lost=True), "replayed_reply": lambda: sim.get(replay=True)}
    names, weights = zip(*EVENTS.items())
    done = 0
    while done < n_events:
        event = rng.choices(names, weights)[0]
        if (act.get(event) or getattr(sim, event))():
            sim.check()
            done += 1
    sim.drain(steps=3)
    return sim


@pytest.mark.parametrize("k", [0, 1, 2])
def test_random_lifecycles_keep_every_invariant(k):
    """200 sequences of 150 events each, B = 1, 2, 3 in turn (`-s` prints how often each fate occurred)."""
    steps, fates, inflight = 0, collections.Counter(), collections.Counter()
    for seed in range(200):
        sim = run_sequence(seed * 7 + k, k, B=1 + seed % 3, n_events=150)
        steps += sim.version
        fates.update(f for _, f in sim.ledger)
        inflight.update(swaps=sim.swaps, mixed_received=sim.mixed_received, mixed_trained=sim.mixed_trained)
    print(f"k={k}: {steps} steps, fates {dict(fates)}, in-flight {dict(inflight)}")
    # The sequences trained, and every fate occurred (with k = 0 the trainer keeps only the batch's
    # B prompts in flight, all asking for its version, so nothing can age past the bound).
    assert steps > 1000 and fates[lc.TRAINED] > 1000, (steps, fates)
    assert all(fates[f] >= 50 for f in lc.FATES if f != lc.DROPPED_STALE or k > 0), fates
    # Versions changed in the middle of rows, and (k > 0) rollouts whose rows span two or more
    # versions were trained on; with k = 0 none can be: its oldest token is at least one version old.
    assert inflight["swaps"] > 100, inflight
    if k == 0:
        assert inflight["mixed_trained"] == 0, inflight
    else:
        assert inflight["mixed_received"] > 100 and inflight["mixed_trained"] > 20 * k, inflight


def test_random_lifecycles_with_a_bound_that_moves():
    """MAX_STALENESS=auto: the bound starts at 0 after every trainer start and moves anywhere in
    [0, 2] between batches; 100 sequences keep every invariant, each batch within the bound it was
    admitted under, and rollouts that a lowered bound makes too stale are dropped with their fate."""
    fates, mixed = collections.Counter(), 0
    for seed in range(100):
        sim = run_sequence(seed * 11 + 5, 2, B=1 + seed % 3, n_events=150, auto=True)
        fates.update(f for _, f in sim.ledger)
        mixed += sim.mixed_trained
    assert fates[lc.TRAINED] > 500 and fates[lc.DROPPED_STALE] > 20 and mixed > 0, (fates, mixed)


def test_staleness_metrics_by_hand():
    """Per token: row 0 sampled by two versions (ages 0 and 1), row 1 by one (age 2), masked tokens out."""
    staleness_RT = np.array([[0, 1, 5], [2, 2, 7]])
    mask_RT = np.array([[1, 1, 0], [1, 1, 0]], np.float32)
    m = lc.staleness_metrics(staleness_RT, mask_RT, max_staleness=2)
    assert m == {"staleness/max": 2, "staleness/mean": 1.25, "staleness/mixed_row_frac": 0.5,
                 "staleness/frac_0": 0.25, "staleness/frac_1": 0.25, "staleness/frac_2": 0.5}
    assert lc.staleness_metrics(staleness_RT, np.zeros_like(mask_RT), 2) == {}
