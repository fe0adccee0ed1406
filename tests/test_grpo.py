"""Tests for grpo.py: hand-computed numbers for every variant, identities, masking, degenerate inputs.

Run: python -m pytest -q tests/test_grpo.py
Each hand-computed case is chosen so that a plausible bug (std over the batch instead of the group,
ddof=1, wrong aggregation axis, mask ignored, clip sides swapped) gives a different number.
"""
import dataclasses
import itertools
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import grpo  # noqa: E402
import grpo_config  # noqa: E402
import objectives  # noqa: E402
from grpo_config import GRPOConfig  # noqa: E402

jax.config.update("jax_platforms", "cpu")


def cfg_(**kw):
    return GRPOConfig(**kw)


def close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol)


def all_finite(tree):
    return all(bool(np.all(np.isfinite(np.asarray(x)))) for x in jax.tree_util.tree_leaves(tree))


# ----------------------------------------------------------------------------------------------------
# Advantages

# Group 0 = [1,0,0,0]; group 1 = [3,1,2,2]. Group means 0.25 and 2 differ from the batch mean 9/8.
REWARDS = np.array([[1.0, 0.0, 0.0, 0.0], [3.0, 1.0, 2.0, 2.0]], np.float32)


def test_grpo_advantage_by_hand():
    # group 0: mean .25, deviations (.75,-.25,-.25,-.25), pop var = (.5625 + 3*.0625)/4 = .1875,
    #   std = .4330127 -> adv = .75/.4330127 = 1.7320508, -.25/.4330127 = -.5773503
    # group 1: mean 2, deviations (1,-1,0,0), pop var = 2/4 = .5, std = .7071068 -> (1.4142136, -1.4142136, 0, 0)
    # (ddof=1 would give 1.5 and 1.2247; the batch std 0.9922 would give 0.756 ... : both differ.)
    adv = grpo.group_advantages(REWARDS, cfg_(group_size=4))
    close(adv, [[1.7320508, -0.5773503, -0.5773503, -0.5773503], [1.4142136, -1.4142136, 0.0, 0.0]])


def test_drgrpo_advantage_by_hand():
    # r - group mean, no std division: (.75,-.25,-.25,-.25) and (1,-1,0,0)
    adv = grpo.group_advantages(REWARDS, cfg_(group_size=4, advantage="drgrpo"))
    close(adv, [[0.75, -0.25, -0.25, -0.25], [1.0, -1.0, 0.0, 0.0]])


def test_rloo_advantage_by_hand():
    # r_i - mean of the other three: group 0: 1-0 = 1, 0-1/3 = -1/3 (x3);
    # group 1: 3-(1+2+2)/3 = 4/3, 1-(3+2+2)/3 = -4/3, 2-(3+1+2)/3 = 0, 0
    adv = grpo.group_advantages(REWARDS, cfg_(group_size=4, advantage="rloo"))
    close(adv, [[1.0, -1 / 3, -1 / 3, -1 / 3], [4 / 3, -4 / 3, 0.0, 0.0]])


def test_reinforce_advantage_by_hand():
    # batch mean = (1+0+0+0+3+1+2+2)/8 = 9/8 = 1.125; adv = r - 1.125
    adv = grpo.group_advantages(REWARDS, cfg_(group_size=4, advantage="reinforce"))
    close(adv, REWARDS - 1.125)


@pytest.mark.parametrize("advantage", [a for a in grpo_config.ADVANTAGES if a not in grpo_config.SIGNED_ADVANTAGES])
def test_all_equal_group_gives_exact_zero_advantage(advantage):
    # 0.1*3/3 != 0.1 in floating point; the advantage must still be exactly 0, not residue/eps.
    # (nsr and w_reinforce have no baseline: an all-wrong group is pushed down, tested on their own)
    r = np.array([[0.1, 0.1, 0.1], [0.1, 0.1, 0.1]], np.float32)
    adv = np.asarray(grpo.group_advantages(r, cfg_(group_size=3, advantage=advantage, pass_k=2)))
    assert np.array_equal(adv, np.zeros_like(adv))
    # a mixed batch: only the all-equal group is zeroed
    r2 = np.array([[0.1, 0.1, 0.1], [0.0, 0.0, 1.0]], np.float32)
    adv2 = np.asarray(grpo.group_advantages(r2, cfg_(group_size=3, advantage=advantage, pass_k=2)))
    assert np.all(np.isfinite(adv2))
    if advantage != "reinforce":
        assert np.array_equal(adv2[0], np.zeros(3)) and np.any(adv2[1] != 0)


def test_advantage_rejects_wrong_group_size():
    with pytest.raises(ValueError, match="G=4"):
        grpo.group_advantages(np.zeros((2, 3)), cfg_(group_size=4))


def test_zero_variance_groups_and_overlong():
    keep = grpo.zero_variance_groups(np.array([[1, 1, 1], [0, 1, 0], [0, 0, 0], [2, 2, 3]]))
    assert np.asarray(keep).tolist() == [False, True, False, True]
    # L_max = 10, L_cache = 4, soft zone starts at 6: L=6 -> 0; L=8 -> (6-8)/4 = -.5;
    # L=10 -> (6-10)/4 = -1; L=12 (beyond L_max) -> -1; L=7 with factor .5 -> .5*(6-7)/4 = -.125
    close(grpo.overlong_penalty(np.array([3, 6, 8, 10, 12]), 10, 4), [0, 0, -0.5, -1.0, -1.0])
    close(grpo.overlong_penalty(np.array([7]), 10, 4, 0.5), [-0.125])
    assert np.asarray(grpo.overlong_mask(np.array([3, 10, 12]), 10)).tolist() == [True, False, False]
    keep = grpo.overlong_mask(np.array([3, 10, 12]), 10, finished_R=np.array([True, True, False]))
    assert np.asarray(keep).tolist() == [True, True, False]
    with pytest.raises(ValueError, match="buffer_len"):
        grpo.overlong_penalty(np.array([3]), 10, 11)
    with pytest.raises(ValueError, match="max_len"):
        grpo.overlong_mask(np.array([3]), 0)


def test_shape_rewards_by_hand():
    # G = 2, max_len = 10, L_cache = 4: completion lengths (3, 8 | 10, 12), finished (yes, yes | yes, no).
    # penalty (0, -.5 | -1, -1): rewards [[1, 0], [1, 1]] -> [[1, -.5], [0, 0]].
    # filter: keep = length < 10 or finished -> (T, T | T, F).
    rewards, lengths = np.array([[1.0, 0.0], [1.0, 1.0]]), np.array([3, 8, 10, 12])
    finished = np.array([True, True, True, False])
    cfg = cfg_(group_size=2, max_len=10, overlong_buffer_len=4, overlong_filter=True)
    r, keep = grpo.shape_rewards(rewards, lengths, finished, cfg)
    close(r, [[1.0, -0.5], [0.0, 0.0]])
    assert np.asarray(keep).tolist() == [True, True, True, False]
    _, keep = grpo.shape_rewards(rewards, lengths, None, cfg)  # no EOS information: length 10 is truncated
    assert np.asarray(keep).tolist() == [True, True, False, False]
    r, keep = grpo.shape_rewards(rewards, lengths, finished, cfg_(group_size=2, max_len=10))  # both off
    close(r, rewards)
    assert np.asarray(keep).all()
    with pytest.raises(ValueError, match="lengths_R"):
        grpo.shape_rewards(rewards, lengths[:3], None, cfg)


def test_turn_lengths_are_the_runs_of_sampled_tokens():
    """Row 0: prompt (3), turn of 4, observation (2), turn of 3, padding: longest turn 4 (sum 7).
    Row 1: one turn of 5 ending at the last position. Row 2: nothing sampled. Row 3: turns 1, 1, 2."""
    m = np.zeros((4, 14), np.float32)
    m[0, 3:7] = 1; m[0, 9:12] = 1
    m[1, 9:14] = 1
    m[3, [0, 2, 4, 5]] = 1
    assert grpo.turn_lengths(m).tolist() == [4, 5, 0, 2]
    one_turn = (np.arange(14)[None, :] >= 6) & (np.arange(14)[None, :] < 6 + np.arange(5)[:, None])
    assert grpo.turn_lengths(one_turn).tolist() == one_turn.sum(1).tolist()  # one turn: its length


def test_overlong_shaping_budgets_each_turn_of_an_episode():
    """max_len 6, L_cache 2 (punished linearly from length 5 to 6). A two-turn row with turns of 4 and 4
    tokens: each within the budget, no punishment and no filtering, although the turns sum to 8 (over
    the budget: the old length, summed, gave -1 and a filtered row). A row with a turn of 6 (and one of
    2) is punished for that turn: (4 - 6) / 2 = -1, and, not finished, filtered."""
    T = 24
    m = np.zeros((2, T), np.float32)
    m[0, 4:8] = 1; m[0, 12:16] = 1            # turns of 4 and 4
    m[1, 4:10] = 1; m[1, 14:16] = 1           # turns of 6 and 2
    cfg = cfg_(group_size=2, max_len=6, overlong_buffer_len=2, overlong_filter=True)
    r, keep = grpo.shape_rewards(np.ones((1, 2)), grpo.turn_lengths(m), np.array([False, False]), cfg)
    close(r, [[1.0, 0.0]])
    assert np.asarray(keep).tolist() == [True, False]


def test_keep_group_dynamic_sampling_with_its_cap():
    on, off = cfg_(dynamic_sampling=True), cfg_()
    solved, mixed = np.array([1.0, 1.0, 1.0]), np.array([0.0, 1.0, 1.0])
    assert grpo.keep_group(mixed, 1, 2, on) and grpo.keep_group(solved, 1, 2, off)
    assert not grpo.keep_group(solved, 1, 2, on)
    assert not grpo.keep_group(np.zeros(3), 8, 2, on)   # seen 8 = 4 x B: still filtering
    assert grpo.keep_group(solved, 9, 2, on)            # past 4 x B groups seen: take what comes
    # the same rule as zero_variance_groups, one group at a time
    groups = np.array([[1, 1, 1], [0, 1, 0], [0, 0, 0], [2, 2, 3]], np.float32)
    assert [grpo.keep_group(g, 1, 4, on) for g in groups] == np.asarray(grpo.zero_variance_groups(groups)).tolist()
    with pytest.raises(ValueError, match="seen"):
        grpo.keep_group(mixed, 0, 2, on)


def test_dynamic_sampling_keeps_the_groups_nsr_and_w_reinforce_learn_from():
    """No baseline: an all-wrong group has A = -1 on every completion (NSR's whole signal), so dynamic
    sampling, on in the default recipe, must keep it. NSR: a group with no wrong completion has A = 0
    everywhere and is dropped. W-REINFORCE (lambda 0.1): an all-right group has A = 0.1, kept; only
    rewards of exactly 1/2 (rho = 0) give A = 0."""
    wrong, right, mixed, half = np.zeros(4), np.ones(4), np.array([0.0, 1, 1, 0]), np.full(4, 0.5)
    nsr = cfg_(group_size=4, advantage="nsr", dynamic_sampling=True)
    wr = cfg_(group_size=4, advantage="w_reinforce", dynamic_sampling=True)
    assert [grpo.keep_group(g, 1, 2, nsr) for g in (wrong, right, mixed, half)] == [True, False, True, False]
    assert [grpo.keep_group(g, 1, 2, wr) for g in (wrong, right, mixed, half)] == [True, True, True, False]
    assert grpo.keep_group(right, 9, 2, nsr)             # the 4 x B cap still applies
    # kept exactly where the advantage the loss will use is not all zero
    groups = np.array([wrong, right, mixed, half, [0.5, 0.5, 1, 1], [0.25, 0.5, 0.5, 0.5]], np.float32)
    for cfg in (nsr, wr):
        carries = np.asarray(grpo.group_advantages(groups, cfg) != 0).any(axis=1).tolist()
        assert [grpo.keep_group(g, 1, 2, cfg) for g in groups] == carries


# ----------------------------------------------------------------------------------------------------
# PPO clipped surrogate, hand-computed

def ppo_case():
    """2 completions, T=3. Row 0: A=+1, ratios (1.5, 1.0, 0.9). Row 1: A=-1, ratios (0.5, 1.1, pad=100)."""
    ratio = np.array([[1.5, 1.0, 0.9], [0.5, 1.1, 100.0]])
    logp_old = np.array([[-1.0, -2.0, -0.5], [-3.0, -1.5, -0.7]])
    logp = logp_old + np.log(ratio)
    mask = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
    adv = np.array([1.0, -1.0])
    return [jnp.asarray(x, jnp.float32) for x in (logp, logp_old, adv, mask)]


# clip range [0.8, 1.28]. Token losses l = max(-A r, -A clip(r)):
#  row 0 (A=+1): r=1.5 -> -1.28 (high clip); r=1.0 -> -1.0; r=0.9 -> -0.9     sum -3.18, 3 tokens
#  row 1 (A=-1): r=0.5 -> max(.5, .8) = .8 (low clip); r=1.1 -> 1.1           sum  1.90, 2 tokens
#  (mask ignored: + max(100, 1.28) = 100; sides swapped: r=1.5 -> -1.2 and r=.5 -> .72)
@pytest.mark.parametrize("agg,max_len,expected", [
    ("token_mean", 0, (-3.18 + 1.9) / 5),                       # -0.256
    ("seq_mean_token_mean", 0, (-3.18 / 3 + 1.9 / 2) / 2),      # (-1.06 + .95)/2 = -0.055
    ("seq_mean_token_sum_norm", 4, (-3.18 + 1.9) / (2 * 4)),    # -0.16
])
def test_ppo_loss_by_hand(agg, max_len, expected):
    logp, logp_old, adv, mask = ppo_case()
    cfg = cfg_(loss_agg=agg, max_len=max_len, is_correction="none")
    loss, aux = grpo.policy_loss(logp, logp_old, adv, mask, cfg)
    close(loss, expected)
    close(aux["pg_loss"], expected)
    close(aux["clip_frac_low"], 1 / 5)   # row 1, token 0
    close(aux["clip_frac_high"], 1 / 5)  # row 0, token 0
    assert float(aux["kl_loss"]) == 0.0 and float(aux["num_tokens"]) == 5.0


def test_ppo_gradient_by_hand():
    # token_mean: dL/dlogp_t = -A r_t / 5 where unclipped, 0 where the clip is active, 0 on padding:
    # row 0: (0, -1.0/5, -0.9/5); row 1: (0, +1.1/5, 0)
    logp, logp_old, adv, mask = ppo_case()
    cfg = cfg_(is_correction="none")
    g = jax.grad(lambda lp: grpo.policy_loss(lp, logp_old, adv, mask, cfg)[0])(logp)
    close(g, [[0.0, -0.2, -0.18], [0.0, 0.22, 0.0]])


def test_dual_clip_by_hand():
    # A=-1, ratios (4, 2), c=3: PPO gives max(r, clip r) = (4, 2); dual clip caps at -c*A = 3 -> (3, 2).
    # token mean: 2.5 with dual clip, 3.0 without. A=+1 rows are untouched: r=4 -> -1.28.
    logp_old = jnp.zeros((2, 2))
    logp = jnp.log(jnp.array([[4.0, 2.0], [4.0, 4.0]]))
    mask = jnp.array([[1, 1], [0, 0]], jnp.float32)
    adv = jnp.array([-1.0, 1.0])
    plain = grpo.policy_loss(logp, logp_old, adv, mask, cfg_(is_correction="none"))[0]
    loss, aux = grpo.policy_loss(logp, logp_old, adv, mask, cfg_(is_correction="none", dual_clip_c=3.0))
    close(plain, 3.0)
    close(loss, 2.5)
    close(aux["dual_clip_frac"], 0.5)
    mask2 = jnp.array([[0, 0], [1, 1]], jnp.float32)
    close(grpo.policy_loss(logp, logp_old, adv, mask2, cfg_(is_correction="none", dual_clip_c=3.0))[0], -1.28)


# ----------------------------------------------------------------------------------------------------
# GSPO

def test_gspo_loss_and_gradient_by_hand():
    # row 0: A=+1, log ratios (.2, -.1, .05): mean .05 -> s = e^.05 = 1.0512711 inside [.8, 1.28] -> l = -1.0512711
    # row 1: A=-1, log ratios (-.5, -.3, pad 5.0): mean over 2 tokens -.4 -> s = e^-.4 = .6703200 < .8
    #        -> l = max(.67032, .8) = .8 (clipped)   (mask ignored: mean 1.4 -> s=4.055 -> l = 4.055)
    # seq_mean_token_mean: (-1.0512711 + .8)/2 = -.12563555
    # token_mean (each token carries its sequence's l): (3*-1.0512711 + 2*.8)/5 = -.31076266
    # gradient (seq mean): row 0 d/dlogp_t = (1/2) * (-A) * s * (1/3) = -1.0512711/6 = -.17521185; row 1: 0
    lr = jnp.array([[0.2, -0.1, 0.05], [-0.5, -0.3, 5.0]])
    logp_old = jnp.array([[-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0]])
    logp = logp_old + lr
    mask = jnp.array([[1, 1, 1], [1, 1, 0]], jnp.float32)
    adv = jnp.array([1.0, -1.0])
    cfg = cfg_(policy_loss="gspo", loss_agg="seq_mean_token_mean", is_correction="none")
    loss, aux = grpo.policy_loss(logp, logp_old, adv, mask, cfg)
    close(loss, -0.12563555)
    close(aux["clip_frac_low"], 2 / 5)  # both tokens of row 1
    cfg_tm = dataclasses.replace(cfg, loss_agg="token_mean")
    close(grpo.policy_loss(logp, logp_old, adv, mask, cfg_tm)[0], -0.31076266)
    g = jax.grad(lambda lp: grpo.policy_loss(lp, logp_old, adv, mask, cfg)[0])(logp)
    close(g, [[-0.17521185] * 3, [0.0, 0.0, 0.0]])


# ----------------------------------------------------------------------------------------------------
# KL

def test_kl_estimators_by_hand():
    # token 0: logp=-1, ref=-1.5: log r = ref - logp = -.5: k1 = .5, k2 = .125, k3 = e^-.5 - 1 + .5 = .10653066
    # token 1: logp=-2, ref=-1:   log r = +1:             k1 = -1, k2 = .5,   k3 = e - 1 - 1 = .71828183
    # (k3 with the direction swapped would give .14872 and .36788)
    logp = jnp.array([[-1.0, -2.0]])
    ref = jnp.array([[-1.5, -1.0]])
    close(grpo.kl_penalty(logp, ref, "k1"), [[0.5, -1.0]])
    close(grpo.kl_penalty(logp, ref, "k2"), [[0.125, 0.5]])
    close(grpo.kl_penalty(logp, ref, "k3"), [[0.10653066, 0.71828183]])
    with pytest.raises(ValueError, match="estimator"):
        grpo.kl_penalty(logp, ref, "k4")


def test_kl_term_in_loss_by_hand():
    # on-policy (ratio 1) with A = 0: the pg term is 0, so loss = beta * token-mean k3.
    # tokens: k3 = .10653066 and .71828183, the third is padding -> mean .41240625; beta=.1 -> .041240625
    logp = jnp.array([[-1.0, -2.0, -jnp.inf]])
    ref = jnp.array([[-1.5, -1.0, jnp.nan]])
    mask = jnp.array([[1, 1, 0]], jnp.float32)
    cfg = cfg_(kl_beta=0.1, is_correction="none")
    loss, aux = grpo.policy_loss(logp, logp, jnp.zeros(1), mask, cfg, logp_ref_RT=ref)
    close(loss, 0.041240625)
    close(aux["kl_loss"], 0.41240625)
    with pytest.raises(ValueError, match="logp_ref_RT"):
        grpo.policy_loss(logp, logp, jnp.zeros(1), mask, cfg)


def test_beta_zero_never_reads_reference():
    logp, logp_old, adv, mask = ppo_case()
    cfg = cfg_()
    loss_none = grpo.policy_loss(logp, logp_old, adv, mask, cfg)[0]
    loss_nan = grpo.policy_loss(logp, logp_old, adv, mask, cfg, logp_ref_RT=jnp.full_like(logp, jnp.nan))[0]
    assert float(loss_none) == float(loss_nan)


# ----------------------------------------------------------------------------------------------------
# Off-policy corrections

def is_case():
    """pi = pi_old (ratio 1), A = +1 for both rows, so each token's pg loss is -1 times its weight w.

    rho = pi_old/pi_behav: row 0 (0.25, 1.0, 1.5, 3.0); row 1 (2.5, 1.5, pad 1000, pad 1000). 6 tokens.
    """
    rho = np.array([[0.25, 1.0, 1.5, 3.0], [2.5, 1.5, 1000.0, 1000.0]])
    logp_old = np.full((2, 4), -2.0)
    behav = logp_old - np.log(rho)
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], np.float32)
    return [jnp.asarray(x, jnp.float32) for x in (logp_old, logp_old, np.ones(2), mask, behav)]


# C = 2. token_mean: loss = -(sum of w over the kept tokens) / (kept tokens): rejected tokens leave the
# denominator too (dividing by all 6 would be the bug this catches).
#  none:       w = 1 everywhere                                        -> -6/6 = -1
#  tis:        min(rho, 2): (.25, 1, 1.5, 2) + (2, 1.5) = 4.75 + 3.5     -> -8.25/6 = -1.375
#  seq_tis:    row 0: prod .25*1*1.5*3 = 1.125 -> 4 * 1.125 = 4.5; row 1: prod 2.5*1.5 = 3.75 -> min 2 -> 2 * 2 = 4
#                                                                       -> -8.5/6 = -1.4166667 (row 1 truncated: 2/6)
#  token_mask: rho in [.5, 2] kept: (1, 1.5) + (1.5) = 4.0 over 3 kept  -> -4/3 (rejected 3/6)
#  seq_mask:   row 0: 1.125 in band -> 4 * 1.125 = 4.5 over its 4 tokens; row 1: 3.75 > 2 -> rejected
#              (a padded 1000 in the product would also reject row 0)  -> -4.5/4 = -1.125 (2/6)
#  icepop:     rho in [.5, 5] kept: (1, 1.5, 3) + (2.5, 1.5) = 9.5 over 5 -> -1.9 (rejected: the .25, 1/6);
#              [.5, 2.8]: the 3 rejected too: (1, 1.5) + (2.5, 1.5) = 6.5 over 4 -> -1.625 (2/6)
IS_CASES = [("none", -1.0, 0.0, 5.0), ("tis", -1.375, 2 / 6, 5.0), ("seq_tis", -8.5 / 6, 2 / 6, 5.0),
            ("token_mask", -4 / 3, 3 / 6, 5.0), ("seq_mask", -1.125, 2 / 6, 5.0), ("icepop", -1.9, 1 / 6, 5.0),
            ("icepop", -1.625, 2 / 6, 2.8)]


@pytest.mark.parametrize("mode,expected,modified,beta", IS_CASES)
def test_is_corrections_by_hand(mode, expected, modified, beta):
    logp, logp_old, adv, mask, behav = is_case()
    cfg = cfg_(is_correction=mode, is_cap=2.0, icepop_low=0.5, icepop_high=beta)
    loss, aux = grpo.policy_loss(logp, logp_old, adv, mask, cfg, logp_behav_RT=behav)
    close(loss, expected)
    close(aux["is_frac_modified"], modified)
    # w is stop-gradient: d loss / d logp_t = -w_t / (kept tokens) (ratio 1, no clip active); w = 0 where rejected
    g = jax.grad(lambda lp: grpo.policy_loss(lp, logp_old, adv, mask, cfg, logp_behav_RT=behav)[0])(logp)
    w = np.asarray(aux["is_weight_RT"]) * np.asarray(mask)
    kept = np.asarray(mask).sum() - np.asarray(grpo.rejected_tokens(logp_old, behav, mask, cfg)).sum()
    close(g, -w / kept)
    # the same when the caller passes the differentiated array itself as pi_old (first step on-policy):
    # neither the ratio's denominator nor the weight rho = pi_old/pi_behav may carry gradient
    g_same = jax.grad(lambda lp: grpo.policy_loss(lp, lp, adv, mask, cfg, logp_behav_RT=behav)[0])(logp)
    close(g_same, -w / kept)


# The sequence rejections, on is_case's rho with A = (1, 3) so that the rows weigh differently:
# no rejection: -(4 * 1 + 2 * 3) / 6 = -10/6.
#  geo_reject [.5, 1.1]: row 0: exp(ln 1.125 / 4) = 1.0299 kept; row 1: exp(ln 3.75 / 2) = 1.9365 > 1.1 rejected
#     -> -4/4 = -1 (a flipped log rho would give row 1 .516, kept: -10/6; no denominator term: -4/6; the
#     product instead of the mean would reject row 0 too, 1.125 > 1.1: 0);
#     with tis on top: row 0's w (.25, 1, 1.5, 2) -> -4.75/4
#  veto .3: row 0 holds rho .25 < .3 -> rejected; row 1 kept -> -(2 * 3)/2 = -3 (flipped: nothing under .3: -10/6)
#     seq_mean_token_mean: row 1 alone, mean -3 -> -3 (over both rows: -1.5);
#     seq_mean_token_sum_norm (max_len 4): row 1's sum -6 / (1 row * 4) = -1.5 (over both rows: -.75)
#  icepop [.5, 5] per token, seq_mean_token_mean: row 0 (1, 1.5, 3) * 1 / 3 = 5.5/3, row 1 (2.5, 1.5) * 3 / 2 = 6
#     -> -(5.5/3 + 6)/2 = -3.9166667
@pytest.mark.parametrize("kw,expected,rows_rejected", [
    (dict(is_correction="none", geo_reject=True, geo_low=0.5, geo_high=1.1), -1.0, 1),
    (dict(is_correction="tis", geo_reject=True, geo_low=0.5, geo_high=1.1), -4.75 / 4, 1),
    (dict(is_correction="none", veto_ratio=0.3), -3.0, 1),
    (dict(is_correction="none", veto_ratio=0.3, loss_agg="seq_mean_token_mean"), -3.0, 1),
    (dict(is_correction="none", veto_ratio=0.3, loss_agg="seq_mean_token_sum_norm", max_len=4), -1.5, 1),
    (dict(is_correction="icepop", loss_agg="seq_mean_token_mean"), -(5.5 / 3 + 6) / 2, 0)])
def test_sequence_rejections_by_hand(kw, expected, rows_rejected):
    logp, logp_old, _, mask, behav = is_case()
    adv = jnp.array([1.0, 3.0])
    cfg = cfg_(**kw)
    assert cfg.rejects
    loss, aux = grpo.policy_loss(logp, logp_old, adv, mask, cfg, logp_behav_RT=behav)
    close(loss, expected)
    if cfg.loss_agg != "token_mean":
        close(aux["den_rejected"], rows_rejected)


def test_no_rejection_unless_configured():
    # the default run (tis) and none never reject, whatever the ratios; so the denominators are the masks'
    logp, logp_old, adv, mask, behav = is_case()
    for mode in ("none", "tis", "seq_tis"):
        cfg = cfg_(is_correction=mode)
        assert not cfg.rejects
        assert not np.asarray(grpo.rejected_tokens(logp_old, behav * 100, mask, cfg)).any()
    assert cfg_(veto_ratio=1e-4).rejects and cfg_(geo_reject=True).rejects and cfg_(is_correction="icepop").rejects


@pytest.mark.parametrize("agg", grpo_config.LOSS_AGGS)
def test_rejecting_microbatches_reproduce_the_whole_batch(agg):
    # update.py's accumulation when tokens are rejected: each microbatch's loss times its own kept
    # denominator, the sum divided once by kept_denominator(totals of the masks, rejected summed):
    # equal to the whole batch's loss over its kept tokens, value and gradient. Rows of 0..4 tokens split
    # (3, 3, 1); token_mask rejects single tokens, the veto whole rows (rows 4 and 6: log rho -3, so the
    # last microbatch keeps nothing: its loss must be 0, not 0/0).
    rng = np.random.default_rng(3)
    lengths = np.array([3, 0, 4, 1, 2, 4, 4])
    mask = np.asarray(np.arange(5)[None, :] < lengths[:, None], np.float32)
    logp = jnp.asarray(-rng.uniform(0.1, 3.0, (7, 5)), jnp.float32)
    log_rho = rng.normal(0, 0.6, (7, 5))
    log_rho[[4, 6]] = -3.0
    behav = logp - jnp.asarray(log_rho, jnp.float32)
    adv = jnp.asarray(rng.normal(size=7), jnp.float32)
    cfg = cfg_(loss_agg=agg, max_len=5, is_correction="token_mask", veto_ratio=0.1)

    def loss(lp, p):
        return grpo.policy_loss(lp[p], jax.lax.stop_gradient(lp[p]), adv[p], mask[p], cfg, logp_behav_RT=behav[p])

    whole, g_whole = jax.jit(jax.value_and_grad(lambda lp: loss(lp, slice(None))[0]))(logp)
    pieces = [slice(0, 3), slice(3, 6), slice(6, 7)]
    auxes = [loss(logp, p)[1] for p in pieces]
    den = grpo.kept_denominator(grpo.loss_totals(mask), sum(float(a["den_rejected"]) for a in auxes), cfg)
    acc = jax.value_and_grad(lambda lp: sum(loss(lp, p)[0] * a["den_kept"] for p, a in zip(pieces, auxes)) / den)
    value, g = jax.jit(acc)(logp)
    assert sum(float(a["den_rejected"]) for a in auxes) > 0  # the case rejects something
    close(value, whole, 1e-6)
    close(g, g_whole, 1e-6)
    # the weights of the masks alone (what a non-rejecting run uses) would not give it
    naive = sum(grpo.microbatch_weight(mask[p], grpo.loss_totals(mask), cfg) * loss(logp, p)[0] for p in pieces)
    assert abs(float(naive) - float(whole)) > 1e-3


def test_update_accumulates_rejecting_microbatches_like_one_batch(monkeypatch):
    """update.py's own accumulation when a correction rejects tokens, on a toy linear softmax policy in
    place of the model (model.token_logprobs patched; f32, so the comparison is tight): one SGD step on
    microbatches of 3 rows equals one on the whole batch of 6 and the gradient of the whole batch's
    policy_loss over its kept tokens (token_mean, and the rows of Dr. GRPO's denominator)."""
    import types

    import optax
    import update
    rng = np.random.default_rng(4)
    R, T, D, V = 6, 5, 3, 6
    emb_VD = jnp.asarray(rng.normal(size=(V, D)), jnp.float32)

    def toy_logprobs(params, mcfg, tokens_RT, temperature):
        logits_RTV = emb_VD[tokens_RT] @ params["W"]
        return jnp.take_along_axis(jax.nn.log_softmax(logits_RTV, -1), tokens_RT[..., None], -1)[..., 0]

    monkeypatch.setattr(update.model, "token_logprobs", toy_logprobs)
    master = {"W": jnp.asarray(rng.normal(size=(D, V)), jnp.float32)}
    tokens = rng.integers(0, V, (R, T)).astype(np.int32)
    mask = np.asarray(np.arange(T)[None, :] < np.array([3, 0, 4, 1, 2, 5])[:, None], np.float32)
    log_rho = rng.normal(0, 0.6, (R, T)).astype(np.float32)
    log_rho[5] = -3.0  # vetoed whole
    behav = np.asarray(toy_logprobs(master, None, tokens, 1.0)) - log_rho
    data = {"tokens_RT": tokens, "adv_R": rng.normal(size=R).astype(np.float32), "mask_RT": mask,
            "logp_behav_RT": behav}
    opt = optax.sgd(1.0)
    for agg in ("token_mean", "seq_mean_token_sum_norm"):
        cfg = cfg_(loss_agg=agg, max_len=5, is_correction="token_mask", veto_ratio=0.1)
        step = update.make_update(types.SimpleNamespace(jdtype=jnp.float32), cfg, opt, 1.0)
        whole, whole_aux = step(master, opt.init(master), update.split_batch(data, 1, R))[::3]
        split, split_aux = step(master, opt.init(master), update.split_batch(data, 1, 3))[::3]
        g = jax.jit(jax.grad(lambda p: grpo.policy_loss(toy_logprobs(p, None, tokens, 1.0),
                                                        toy_logprobs(master, None, tokens, 1.0), data["adv_R"],
                                                        mask, cfg, logp_behav_RT=behav)[0]))(master)
        close(split["W"], whole["W"], 1e-6)
        close(whole["W"], master["W"] - g["W"], 1e-6)
        # the loss terms exactly; the fractions (over sampled tokens, rejected ones too) exactly where the
        # microbatches weigh by their tokens (token_mean; the other modes weigh fractions by their rows)
        for k in ("loss", "pg_loss") + (("is_frac_modified", "is_weight_mean") if agg == "token_mean" else ()):
            close(split_aux[k], whole_aux[k], 1e-6)


def test_correction_metrics_by_hand():
    logp, logp_old, adv, mask, behav = is_case()
    log_rho = np.log([0.25, 1.0, 1.5, 3.0, 2.5, 1.5])
    spread = {"correction/log_ratio_std": log_rho.std(), "correction/log_ratio_min": math.log(0.25),
              "correction/log_ratio_max": math.log(3.0)}
    # icepop [.5, 5]: the .25 rejected (1/6 tokens, no sequence); kept weights (1, 1.5, 3, 2.5, 1.5):
    # sum 9.5, sum of squares 1 + 2.25 + 9 + 6.25 + 2.25 = 20.75 -> ESS = 9.5^2 / (5 * 20.75) = .8698795
    m = grpo.correction_metrics(logp_old, behav, mask, cfg_(is_correction="icepop"))
    close([m[k] for k in spread], list(spread.values()))
    close([m["correction/token_reject_frac"], m["correction/seq_reject_frac"], m["correction/ess"],
           m["correction/weight_mean"]], [1 / 6, 0.0, 9.5 ** 2 / (5 * 20.75), 1.9])
    # veto .3 with tis: row 0 rejected (4/6 tokens, 1/2 sequences); kept weights (2, 1.5): ESS 3.5^2 / (2 * 6.25) = .98
    m = grpo.correction_metrics(logp_old, behav, mask, cfg_(veto_ratio=0.3))
    close([m["correction/token_reject_frac"], m["correction/seq_reject_frac"], m["correction/ess"]], [4 / 6, 0.5, 0.98])
    # no correction: every weight 1, ESS 1
    close(grpo.correction_metrics(logp_old, behav, mask, cfg_(is_correction="none"))["correction/ess"], 1.0)
    assert grpo.correction_metrics(logp_old, behav, mask * 0, cfg_()) == {}


def test_no_behaviour_logprobs_means_no_correction():
    logp, logp_old, adv, mask, _ = is_case()
    loss, aux = grpo.policy_loss(logp, logp_old, adv, mask, cfg_(is_correction="tis"))
    close(loss, -1.0)
    assert np.array_equal(np.asarray(aux["is_weight_RT"]), np.ones((2, 4)))


# ----------------------------------------------------------------------------------------------------
# On-policy identity: clipped loss gradient == REINFORCE gradient (tiny linear softmax policy)

R, T, D, V = 4, 5, 3, 6
_rng = np.random.default_rng(0)
X_RTD = jnp.asarray(_rng.normal(size=(R, T, D)), jnp.float32)
W_DV = jnp.asarray(_rng.normal(size=(D, V)), jnp.float32)
TOK_RT = jnp.asarray(_rng.integers(0, V, size=(R, T)))
LENS = np.array([5, 3, 1, 4])
MASK_RT = jnp.asarray(np.arange(T)[None, :] < LENS[:, None], jnp.float32)
ADV_R = jnp.array([1.5, -0.5, 2.0, -1.0])


def linear_logp(W_DV, x_RTD=X_RTD, tok_RT=TOK_RT):
    logits_RTV = jnp.einsum("RTD,DV->RTV", x_RTD, W_DV)
    return jnp.take_along_axis(jax.nn.log_softmax(logits_RTV, axis=-1), tok_RT[..., None], axis=-1)[..., 0]


def reinforce_loss(W_DV, agg):
    """-A * logp aggregated the same way: the REINFORCE (score-function) gradient."""
    x_RT = -ADV_R[:, None] * linear_logp(W_DV) * MASK_RT
    if agg == "token_mean":
        return x_RT.sum() / MASK_RT.sum()
    if agg == "seq_mean_token_mean":
        return (x_RT.sum(1) / MASK_RT.sum(1)).mean()
    return x_RT.sum() / (R * 8)


@pytest.mark.parametrize("policy_loss,agg", [
    ("ppo", "token_mean"), ("ppo", "seq_mean_token_mean"), ("ppo", "seq_mean_token_sum_norm"),
    ("gspo", "seq_mean_token_mean")])
@pytest.mark.parametrize("caller_stops_gradient", [True, False])
def test_on_policy_gradient_equals_reinforce(policy_loss, agg, caller_stops_gradient):
    # caller_stops_gradient=False passes the SAME traced array as logp, logp_old and logp_behav: the
    # loss itself must stop the gradient through pi_old and the IS weight (decoupled PPO treats both as data).
    cfg = cfg_(policy_loss=policy_loss, loss_agg=agg, max_len=8, dual_clip_c=3.0)
    sg = jax.lax.stop_gradient if caller_stops_gradient else (lambda x: x)

    def clipped(W):
        logp = linear_logp(W)
        return grpo.policy_loss(logp, sg(logp), ADV_R, MASK_RT, cfg, logp_behav_RT=sg(logp))

    (loss, aux), g = jax.value_and_grad(clipped, has_aux=True)(W_DV)
    ratio = np.asarray(aux["ratio_RT"])
    assert np.array_equal(ratio, np.ones_like(ratio))  # exactly 1, every token
    assert float(aux["clip_frac_low"]) == 0.0 and float(aux["clip_frac_high"]) == 0.0
    g_ref = jax.grad(reinforce_loss)(W_DV, agg)
    assert float(jnp.abs(g_ref).max()) > 1e-3  # not a trivially zero gradient
    close(g, g_ref, 1e-6)
    # value: ratio 1 -> loss = -A aggregated
    close(loss, grpo.aggregate(-ADV_R[:, None] * jnp.ones((R, T)), MASK_RT, cfg))


# ----------------------------------------------------------------------------------------------------
# Masking: padded tokens never change the loss or its gradient

# every (policy loss, aggregation, IS correction) triple; KL + dual clip on for every other one
CONFIGS = [cfg_(policy_loss=p, loss_agg=a, max_len=8, is_correction=c, kl_beta=0.05 * (i % 2),
                dual_clip_c=3.0 if i % 2 else None)
           for i, (p, a, c) in enumerate(itertools.product(grpo_config.POLICY_LOSSES, grpo_config.LOSS_AGGS, grpo_config.IS_CORRECTIONS))]
# every policy loss x IS correction, aggregation cycling, KL on for gspo, dual clip for every other one
DEGENERATE_CONFIGS = [cfg_(policy_loss=p, loss_agg=grpo_config.LOSS_AGGS[i % 3], max_len=8, is_correction=c,
                           kl_beta=0.05 * (i // 4 % 2), dual_clip_c=3.0 if i % 2 else None)
                      for i, (p, c) in enumerate(itertools.product(grpo_config.POLICY_LOSSES, grpo_config.IS_CORRECTIONS))]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.policy_loss}-{c.loss_agg}-{c.is_correction}-{c.kl_beta}")
def test_padding_never_changes_loss_or_gradient(cfg):
    rng = np.random.default_rng(1)
    logp = jnp.asarray(-rng.uniform(0.1, 3.0, (3, 4)), jnp.float32)
    old = logp + jnp.asarray(rng.normal(0, 0.3, (3, 4)), jnp.float32)
    behav = old + jnp.asarray(rng.normal(0, 0.3, (3, 4)), jnp.float32)
    ref = logp + jnp.asarray(rng.normal(0, 0.3, (3, 4)), jnp.float32)
    mask = jnp.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], jnp.float32)
    adv = jnp.array([1.0, -2.0, 0.5])

    def run(lp, o, b, r, m):
        return grpo.policy_loss(lp, o, adv, m, cfg, logp_behav_RT=b, logp_ref_RT=r)[0]

    loss, g = jax.value_and_grad(run)(logp, old, behav, ref, mask)
    # same data, two more padded positions per row holding -inf / NaN / huge values,
    # and the existing padded positions overwritten with garbage too
    pad = lambda x, v: jnp.concatenate([jnp.where(mask > 0, x, v), jnp.full((3, 2), v)], axis=1)
    mask2 = jnp.concatenate([mask, jnp.zeros((3, 2))], axis=1)
    loss2, g2 = jax.value_and_grad(run)(pad(logp, -jnp.inf), pad(old, jnp.nan), pad(behav, 1e4),
                                        pad(ref, -jnp.inf), mask2)
    close(loss2, loss, 1e-6)
    g2 = np.asarray(g2)
    close(g2[:, :4] * np.asarray(mask), np.asarray(g) * np.asarray(mask), 1e-6)
    assert np.array_equal(g2[np.asarray(mask2) == 0], np.zeros(int((np.asarray(mask2) == 0).sum())))


# ----------------------------------------------------------------------------------------------------
# Degenerate inputs: finite, documented

@pytest.mark.parametrize("cfg", DEGENERATE_CONFIGS,
                         ids=lambda c: f"{c.policy_loss}-{c.loss_agg}-{c.is_correction}-{c.kl_beta}")
def test_degenerate_inputs_are_finite(cfg):
    def everything(lp, o, adv, m, b, r):
        (loss, aux), g = jax.value_and_grad(
            lambda x: grpo.policy_loss(x, o, adv, m, cfg, logp_behav_RT=b, logp_ref_RT=r), has_aux=True)(lp)
        rewards = np.zeros((1, len(adv)), np.float32)
        met = grpo.batch_metrics({k: v for k, v in aux.items() if not k.endswith("_RT")}, rewards, rewards, adv, b, m)
        mm = grpo.mismatch_metrics(b, lp, m)
        cm = grpo.correction_metrics(o, b, m, cfg)
        assert all_finite((loss, aux, g, met, mm, cm)), (loss, aux, g, met, mm, cm)
        return loss, g

    # all-masked batch with -inf everywhere: loss exactly 0, gradient exactly 0
    ninf = jnp.full((2, 3), -jnp.inf)
    loss, g = everything(ninf, ninf, jnp.array([1.0, -1.0]), jnp.zeros((2, 3)), ninf, ninf)
    assert float(loss) == 0.0 and np.array_equal(np.asarray(g), np.zeros((2, 3)))
    # very negative log-probs on real tokens, in every direction: -1e4 vs 0
    a = jnp.array([[-1e4, 0.0, -1e4], [0.0, -1e4, -1e4]])
    b = jnp.array([[0.0, -1e4, -1e4], [-1e4, 0.0, 0.0]])
    everything(a, b, jnp.array([1.0, -1.0]), jnp.ones((2, 3)), a, b)
    everything(b, a, jnp.array([-1.0, 1.0]), jnp.ones((2, 3)), b, a)
    # completions of length 0 and 1 beside a normal one
    lp = jnp.array([[-1.0, -2.0, -0.5], [-0.3, -jnp.inf, -jnp.inf], [-jnp.inf] * 3])
    m = jnp.array([[1, 1, 1], [1, 0, 0], [0, 0, 0]], jnp.float32)
    everything(lp, lp - 0.1, jnp.array([1.0, -1.0, 2.0]), m, lp + 0.1, lp - 0.2)


def test_empty_completion_does_not_dilute_means():
    # a length-0 row is left out of both the token mean and the mean over sequences
    logp, logp_old, adv, mask = ppo_case()
    for agg in ("token_mean", "seq_mean_token_mean"):
        cfg = cfg_(loss_agg=agg, is_correction="none")
        base = grpo.policy_loss(logp, logp_old, adv, mask, cfg)[0]
        z = jnp.zeros((1, 3))
        with_empty = grpo.policy_loss(jnp.concatenate([logp, z - jnp.inf]), jnp.concatenate([logp_old, z]),
                                      jnp.concatenate([adv, jnp.ones(1)]), jnp.concatenate([mask, z]), cfg)[0]
        close(with_empty, base, 1e-6)


def test_all_equal_group_gives_zero_loss_and_gradient():
    rewards = jnp.array([[1.0, 1.0]])
    cfg = cfg_(group_size=2, is_correction="none")
    adv_R = grpo.group_advantages(rewards, cfg).reshape(-1)
    logp = jnp.array([[-1.0, -2.0], [-0.5, -0.1]])
    loss, g = jax.value_and_grad(lambda x: grpo.policy_loss(x, logp - 0.3, adv_R, jnp.ones((2, 2)), cfg)[0])(logp)
    assert float(loss) == 0.0 and np.array_equal(np.asarray(g), np.zeros((2, 2)))


def test_shape_errors():
    logp, logp_old, adv, mask = ppo_case()
    cfg = cfg_()
    with pytest.raises(ValueError, match="adv_R"):
        grpo.policy_loss(logp, logp_old, adv[:1], mask, cfg)
    with pytest.raises(ValueError, match="mask_RT"):
        grpo.policy_loss(logp, logp_old, adv, mask[:, :2], cfg)
    with pytest.raises(ValueError, match="logp_behav_RT"):
        grpo.policy_loss(logp, logp_old, adv, mask, cfg, logp_behav_RT=logp[:1])


def test_drgrpo_max_len_counts_completion_tokens_not_T():
    # max_len is the generation budget: rows of T = 6 (3 prompt positions, masked, + completions of at
    # most 3 tokens) with max_len = 4 < T. Token losses 1..: row 0 (1, 2, 3), row 1 (4, pad, pad):
    # sum 10 / (B * max_len = 2 * 4) = 1.25. (Dividing by B * T would give 10/12.)
    loss_RT = jnp.array([[9.0, 9.0, 9.0, 1.0, 2.0, 3.0], [9.0, 9.0, 9.0, 4.0, jnp.nan, 5.0]])
    mask_RT = jnp.array([[0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 0, 0]], jnp.float32)
    close(grpo.aggregate(loss_RT, mask_RT, cfg_(loss_agg="seq_mean_token_sum_norm", max_len=4)), 1.25)


@pytest.mark.parametrize("agg", grpo_config.LOSS_AGGS)
def test_microbatch_weights_reproduce_the_whole_batch(agg):
    # sum over microbatches of weight * aggregate(microbatch) == aggregate(batch); rows of 0..4 tokens,
    # split unevenly (3, 3, 1) so that a weight by row count, token count or live rows would differ
    rng = np.random.default_rng(2)
    loss_RT = jnp.asarray(rng.normal(size=(7, 5)), jnp.float32)
    mask_RT = np.asarray(np.arange(5)[None, :] < np.array([3, 0, 4, 1, 2, 0, 4])[:, None], np.float32)
    cfg = cfg_(loss_agg=agg, max_len=5)
    totals = grpo.loss_totals(mask_RT)
    pieces = [slice(0, 3), slice(3, 6), slice(6, 7)]
    accumulated = sum(grpo.microbatch_weight(mask_RT[p], totals, cfg) * grpo.aggregate(loss_RT[p], mask_RT[p], cfg)
                      for p in pieces)
    close(accumulated, grpo.aggregate(loss_RT, mask_RT, cfg), 1e-6)


def test_unknown_loss_agg_raises_everywhere():
    # a mode added to LOSS_AGGS without its own reduction / accumulation rule must fail loudly
    cfg = cfg_()
    object.__setattr__(cfg, "loss_agg", "new_mode")  # past the config's validation, as a new mode would be
    mask = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="new_mode"):
        grpo.aggregate(jnp.ones((2, 3)), mask, cfg)
    with pytest.raises(ValueError, match="new_mode"):
        grpo.microbatch_weight(mask, grpo.loss_totals(mask), cfg)


def test_policy_loss_jits():
    logp, logp_old, adv, mask = ppo_case()
    cfg = cfg_(kl_beta=0.1)
    f = jax.jit(lambda *a: grpo.policy_loss(*a, cfg, logp_behav_RT=a[1] - 0.1, logp_ref_RT=a[0] + 0.2))
    loss_j, _ = f(logp, logp_old, adv, mask)
    loss_e, _ = grpo.policy_loss(logp, logp_old, adv, mask, cfg, logp_behav_RT=logp_old - 0.1,
                                 logp_ref_RT=logp + 0.2)
    close(loss_j, loss_e, 1e-6)


# ----------------------------------------------------------------------------------------------------
# Metrics

def test_loss_aux_reaches_the_step_metrics_by_hand():
    # ppo_case: ratios on the 5 real tokens (1.5, 1.0, .9, .5, 1.1), A = (1 | -1): the clip is active for
    # A > 0 at 1.5 > 1.28 (1 of 5 tokens) and for A < 0 at .5 < .8 (1 of 5); policy_loss's aux carries
    # them, and batch_metrics logs them as policy/* (the trainer's step metrics), beside num_tokens 5
    logp, logp_old, adv, mask = ppo_case()
    _, aux = grpo.policy_loss(logp, logp_old, adv, mask, cfg_(is_correction="none"))
    close([aux["clip_frac_low"], aux["clip_frac_high"], aux["num_tokens"]], [0.2, 0.2, 5])
    rewards = np.array([[1.0, 0.0]], np.float32)
    m = grpo.batch_metrics({k: v for k, v in aux.items() if not k.endswith("_RT")}, rewards, rewards, adv,
                           np.asarray(logp), np.asarray(mask))
    close([m["policy/clip_frac_low"], m["policy/clip_frac_high"], m["policy/num_tokens"]], [0.2, 0.2, 5])


def test_mismatch_metrics_by_hand():
    # row 0 real tokens: d = trainer - sampler = (0, -.1, .8); pad holds -inf on both sides.
    # bitwise 1/3; max|d| .8; mean|d| .9/3 = .3;
    # k3 = [0 + (e^-.1 - 1 + .1) + (e^.8 - 1 - .8)]/3 = (.0048374 + .4255409)/3 = .1434594
    # max|e^d - 1| = e^.8 - 1 = 1.2255409; e^.8 = 2.2255 > 2 -> 1/3 outside. Row 1 fully masked (NaN).
    sampler = jnp.array([[-1.0, -2.0, -0.5, -jnp.inf], [jnp.nan] * 4])
    trainer = jnp.array([[-1.0, -2.1, 0.3, -jnp.inf], [0.0] * 4])
    mask = jnp.array([[1, 1, 1, 0], [0, 0, 0, 0]])
    mm = grpo.mismatch_metrics(sampler, trainer, mask)
    close(mm["bitwise_frac"], 1 / 3)
    close(mm["max_abs_logp_diff"], 0.8)
    close(mm["mean_abs_logp_diff"], 0.3)
    close(mm["k3_kl"], 0.1434594)
    close(mm["max_abs_ratio_minus_1"], 1.2255409)
    close(mm["frac_ratio_outside_0.5_2"], 1 / 3)
    # exact equality: one f32 ulp apart is NOT bitwise equal; bf16 vs its f32 upcast IS
    x = np.float32(-1.2345)
    assert float(grpo.mismatch_metrics(jnp.array([[x]]), jnp.array([[np.nextafter(x, np.float32(0))]]),
                                       jnp.ones((1, 1)))["bitwise_frac"]) == 0.0
    xb = jnp.array([[-1.2345]], jnp.bfloat16)
    assert float(grpo.mismatch_metrics(xb, xb.astype(jnp.float32), jnp.ones((1, 1)))["bitwise_frac"]) == 1.0
    empty = grpo.mismatch_metrics(sampler, trainer, jnp.zeros((2, 4)))
    assert float(empty["bitwise_frac"]) == 1.0 and float(empty["max_abs_logp_diff"]) == 0.0


# ----------------------------------------------------------------------------------------------------
# pass@k

def test_pass_at_k_matches_brute_force():
    brute = {}
    for n in range(1, 8):
        for c in range(n + 1):
            samples = [1] * c + [0] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(range(n), k))
                brute[n, c, k] = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
                assert abs(objectives.pass_at_k(n, c, k) - brute[n, c, k]) < 1e-12, (n, c, k)
    for k in (1, 2, 5):
        keys = [(n, c) for (n, c, kk) in brute if kk == k]
        n_N, c_N = np.array([n for n, _ in keys]), np.array([c for _, c in keys])
        close(objectives.pass_at_k_array(n_N, c_N, k), [brute[n, c, k] for n, c in keys], 1e-12)
    # pass@1 = c/n; large n stays finite where C(n, k) would overflow a float
    assert abs(objectives.pass_at_k(200, 37, 1) - 37 / 200) < 1e-12
    p = objectives.pass_at_k(2000, 3, 100)
    assert 0 < p < 1 and math.isfinite(p)
    assert abs(p - (1 - math.comb(1997, 100) / math.comb(2000, 100))) < 1e-12


def test_pass_at_k_errors():
    for n, c, k in ((3, 4, 1), (3, 1, 4), (3, -1, 1), (3, 1, 0)):
        with pytest.raises(ValueError, match="pass_at_k"):
            objectives.pass_at_k(n, c, k)
    with pytest.raises(ValueError, match="int"):
        objectives.pass_at_k(3.0, 1, 1)
    with pytest.raises(ValueError, match="pass_at_k_array"):
        objectives.pass_at_k_array(np.array([3, 2]), np.array([1, 3]), 1)


# ----------------------------------------------------------------------------------------------------
# Config validation

@pytest.mark.parametrize("kw,field", [
    (dict(group_size=0), "group_size"), (dict(group_size=1), "group_size"), (dict(group_size=2.0), "group_size"),
    (dict(advantage="ppo"), "advantage"), (dict(adv_eps=0.0), "adv_eps"), (dict(policy_loss="grpo"), "policy_loss"),
    (dict(clip_eps_low=1.0), "clip_eps_low"), (dict(clip_eps_low=-0.1), "clip_eps_low"),
    (dict(clip_eps_high=0.0), "clip_eps_high"), (dict(clip_eps_high=float("nan")), "clip_eps_high"),
    (dict(dual_clip_c=1.0), "dual_clip_c"), (dict(loss_agg="sum"), "loss_agg"),
    (dict(loss_agg="seq_mean_token_sum_norm"), "max_len"), (dict(max_len=-1), "max_len"),
    (dict(kl_beta=-0.1), "kl_beta"), (dict(kl_beta=float("inf")), "kl_beta"), (dict(kl_estimator="k4"), "kl_estimator"),
    (dict(is_correction="clip"), "is_correction"), (dict(is_cap=0.5), "is_cap"),
    (dict(is_correction="token_mask", is_cap=1.0), "is_cap"),
    (dict(icepop_low=0.0), "icepop_low"), (dict(icepop_high=0.9), "icepop_high"), (dict(geo_low=1.1), "geo_low"),
    (dict(geo_high=0.99), "geo_high"), (dict(veto_ratio=1.0), "veto_ratio"), (dict(veto_ratio=-0.1), "veto_ratio"),
    (dict(overlong_buffer_len=4), "overlong_buffer_len"),
    (dict(max_len=4, overlong_buffer_len=5), "overlong_buffer_len"),
    (dict(overlong_filter=True), "max_len"), (dict(overlong_penalty_factor=-1.0), "overlong_penalty_factor"),
    (dict(advantage="passk", pass_k=0), "pass_k"), (dict(advantage="passk", pass_k=9), "pass_k"),
    (dict(advantage="passk", pass_k=2.0), "pass_k"), (dict(positive_weight=-0.1), "positive_weight"),
    (dict(cov_penalty="clip"), "cov_penalty"), (dict(cov_clip_frac=0.0), "cov_clip_frac"),
    (dict(cov_kl_frac=1.5), "cov_kl_frac"), (dict(cov_clip_low=6.0), "cov_clip_low"),
    (dict(cov_kl_coef=-1.0), "cov_kl_coef"), (dict(advantage="rloo", group_size=1), "group_size"),
])
def test_config_validation(kw, field):
    with pytest.raises(ValueError, match=f"GRPOConfig.{field}="):
        GRPOConfig(**kw)


def test_config_valid_variants():
    GRPOConfig()
    GRPOConfig(group_size=1, advantage="reinforce")
    GRPOConfig(advantage="drgrpo", loss_agg="seq_mean_token_sum_norm", max_len=1024)
    GRPOConfig(policy_loss="gspo", clip_eps_low=3e-4, clip_eps_high=4e-4, loss_agg="seq_mean_token_mean")
    GRPOConfig(max_len=100, overlong_buffer_len=20, overlong_filter=True, dynamic_sampling=True)
    GRPOConfig(group_size=1, advantage="nsr")  # no group baseline: one completion per prompt is enough
    GRPOConfig(advantage="passk", pass_k=8, cov_penalty="kl_cov", cov_kl_frac=1.0)
    hash(GRPOConfig())  # frozen: usable as a static jit argument


# ----------------------------------------------------------------------------------------------------
# Objectives that keep pass@k: Pass@k Training, NSR / W-REINFORCE, Clip-Cov / KL-Cov

def passk_by_enumeration(r_G, k, eps=1e-6):
    """The definition: every k-subset's reward is its max, normalised over the subsets (population
    std), and a completion's advantage is the mean over the subsets that hold it."""
    subsets = list(itertools.combinations(range(len(r_G)), k))
    R = np.array([max(r_G[i] for i in S) for S in subsets], np.float64)
    if np.ptp(R) == 0:
        return np.zeros(len(r_G))
    A = (R - R.mean()) / (R.std() + eps)
    return np.array([np.mean([a for a, S in zip(A, subsets) if i in S]) for i in range(len(r_G))])


@pytest.mark.parametrize("G,k", [(2, 1), (4, 2), (5, 3), (6, 2), (8, 4), (8, 7), (8, 8)])
def test_passk_advantage_equals_enumeration_over_all_subsets(G, k):
    rng = np.random.default_rng(G * 10 + k)
    groups = [rng.choice([0.0, 1.0], G) for _ in range(6)]            # 0/1 rewards
    groups += [np.round(rng.random(G), 1) for _ in range(6)]           # partial rewards, with ties
    groups += [np.zeros(G), np.ones(G), np.eye(G)[0], 1.0 - np.eye(G)[0]]
    r_BG = np.stack(groups).astype(np.float32)
    adv = np.asarray(grpo.group_advantages(r_BG, cfg_(group_size=G, advantage="passk", pass_k=k)))
    want = np.stack([passk_by_enumeration(r, k) for r in r_BG])
    close(adv, want, tol=2e-4)


def test_passk_advantage_paper_closed_form_by_hand():
    # G = 8, k = 4, 3 right and 5 wrong. R_bar = 1 - C(5,4)/C(8,4) = 1 - 5/70 = 13/14; sigma =
    # sqrt(13/14 * 1/14) = 0.2575393; A_pos = (1/14)/sigma = 0.2773501; A_neg = (1/14 - C(4,3)/C(7,3))/sigma
    # = (1/14 - 4/35)/sigma = -0.1664101. (GRPO would give +1.2909944 / -0.7745967: a wrong sample in a
    # group that is solved anyway is penalised far less.)
    r = np.array([[1, 0, 0, 1, 0, 0, 1, 0]], np.float32)
    adv = grpo.group_advantages(r, cfg_(group_size=8, advantage="passk", pass_k=4))
    close(adv, np.where(r > 0, 0.2773501, -0.1664101))
    # k = 1 is GRPO's advantage; one wrong in eight with k = 4: every subset passes, A = 0 exactly
    close(grpo.group_advantages(r, cfg_(group_size=8, advantage="passk", pass_k=1)),
          grpo.group_advantages(r, cfg_(group_size=8)))
    one_wrong = np.array([[1, 1, 1, 0, 1, 1, 1, 1]], np.float32)
    assert np.array_equal(np.asarray(objectives.passk_advantages(one_wrong, 4)), np.zeros((1, 8)))


def test_passk_weights_rows_are_distributions():
    for G, k in [(8, 4), (5, 1), (6, 6)]:
        v, W = objectives.passk_weights(G, k)
        close(v.sum(), 1.0)
        close(W.sum(1), np.ones(G))
        assert np.all(np.tril(W, -1) == 0)  # a subset's max is never below a member


def test_signed_advantages_by_hand():
    # rho = 2r - 1 = (1, -1, 0, 0.5); W-REINFORCE (lambda 0.1): (0.1, -1, 0, 0.05); NSR: (0, -1, 0, 0)
    r = np.array([[1.0, 0.0, 0.5, 0.75], [0.0, 0.0, 0.0, 0.0]], np.float32)
    close(grpo.group_advantages(r, cfg_(group_size=4, advantage="w_reinforce")), [[0.1, -1, 0, 0.05], [-1, -1, -1, -1]])
    close(grpo.group_advantages(r, cfg_(group_size=4, advantage="w_reinforce", positive_weight=1.0)),
          [[1, -1, 0, 0.5], [-1, -1, -1, -1]])
    close(grpo.group_advantages(r, cfg_(group_size=4, advantage="nsr", positive_weight=0.7)),
          [[0, -1, 0, 0], [-1, -1, -1, -1]])  # nsr is lambda = 0 whatever positive_weight says


def test_nsr_trains_on_wrong_completions_only():
    # On-policy, one token per completion: the loss's gradient is -A_i / N on completion i's log-prob,
    # so NSR's is 0 on the right completions and +1/N (push down) on the wrong ones.
    r = np.array([[1.0, 0.0, 1.0, 0.0]], np.float32)
    adv = np.asarray(grpo.group_advantages(r, cfg_(group_size=4, advantage="nsr"))).reshape(-1)
    logp = jnp.array([[-0.5], [-1.0], [-2.0], [-0.1]])
    g = jax.grad(lambda lp: grpo.policy_loss(lp, jax.lax.stop_gradient(lp), adv, jnp.ones((4, 1)),
                                             cfg_(group_size=4, advantage="nsr"))[0])(logp)
    close(g[:, 0], [0.0, 0.25, 0.0, 0.25])


# two completions of 3 tokens, the last token of row 1 is padding: N = 5 tokens
COV_LOGP = jnp.array([[-0.2, -1.0, -3.0], [-0.4, -2.2, 0.0]])
COV_MASK = jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
COV_ADV = jnp.array([1.5, -1.0])


def test_token_covariance_by_hand():
    # mean logp = (-0.2 - 1 - 3 - 0.4 - 2.2)/5 = -1.36; mean A = (3*1.5 - 2*1)/5 = 0.5
    # row 0 (A - 0.5 = 1): 1.16, 0.36, -1.64; row 1 (A - 0.5 = -1.5): -1.44, 1.26, 0 (padding)
    cov = objectives.token_covariance(COV_LOGP, COV_ADV, COV_MASK)
    close(cov, [[1.16, 0.36, -1.64], [-1.44, 1.26, 0.0]])


def test_kl_cov_penalises_the_largest_covariance_tokens_by_hand():
    # k N = 0.4 * 5 = 2 tokens: the two largest Cov, 1.26 (row 1, t 1) and 1.16 (row 0, t 0).
    cfg = cfg_(cov_penalty="kl_cov", cov_kl_frac=0.4, cov_kl_coef=2.0, is_correction="none")
    sel = objectives.covariance_tokens(COV_LOGP, COV_ADV, COV_MASK, cfg)
    assert np.array_equal(np.asarray(sel), [[True, False, False], [False, True, False]])
    old = COV_LOGP + jnp.array([[0.1, -0.05, 0.0], [0.0, -0.05, 0.0]])   # pi moved from pi_old
    base = cfg_(is_correction="none")
    loss, aux = grpo.policy_loss(COV_LOGP, old, COV_ADV, COV_MASK, cfg)
    loss0, _ = grpo.policy_loss(COV_LOGP, old, COV_ADV, COV_MASK, base)
    close(loss - loss0, 2.0 * (0.1 + 0.05) / 5)      # beta |logp - logp_old| on the two, token mean
    close(aux["cov_frac"], 2 / 5)
    g = jax.grad(lambda lp: grpo.policy_loss(lp, old, COV_ADV, COV_MASK, cfg)[0])(COV_LOGP)
    g0 = jax.grad(lambda lp: grpo.policy_loss(lp, old, COV_ADV, COV_MASK, base)[0])(COV_LOGP)
    # d|logp - old|/dlogp = sign(logp - old): -1 at (0,0) (logp below old), +1 at (1,1)
    close(g - g0, [[-2.0 / 5, 0, 0], [0, 2.0 / 5, 0]])
    # on-policy (pi = pi_old, the batch's first optimizer step) the term and its gradient are 0
    g_on = jax.grad(lambda lp: grpo.policy_loss(lp, jax.lax.stop_gradient(lp), COV_ADV, COV_MASK, cfg)[0])(COV_LOGP)
    g_on0 = jax.grad(lambda lp: grpo.policy_loss(lp, jax.lax.stop_gradient(lp), COV_ADV, COV_MASK, base)[0])(COV_LOGP)
    close(g_on, g_on0)


def test_clip_cov_detaches_random_tokens_inside_the_band():
    # band [1, 1.2]: only Cov 1.16 (row 0, t 0) is inside; r N = 0.2 * 5 = 1 token: that one.
    cfg = cfg_(cov_penalty="clip_cov", cov_clip_frac=0.2, cov_clip_low=1.0, cov_clip_high=1.2, is_correction="none")
    draw = jax.random.uniform(jax.random.PRNGKey(3), COV_MASK.shape)
    loss, aux = grpo.policy_loss(COV_LOGP, COV_LOGP, COV_ADV, COV_MASK, cfg, draw_RT=draw)
    loss0, _ = grpo.policy_loss(COV_LOGP, COV_LOGP, COV_ADV, COV_MASK, cfg_(is_correction="none"))
    close(loss, loss0)                                  # the value is unchanged: only the gradient goes
    grad = lambda c: jax.grad(lambda lp: grpo.policy_loss(lp, jax.lax.stop_gradient(lp), COV_ADV, COV_MASK, c,  # noqa: E731
                                                          draw_RT=draw)[0])(COV_LOGP)
    g, g0 = grad(cfg), grad(cfg_(is_correction="none"))
    close(g, np.where([[1, 0, 0], [0, 0, 0]], 0.0, g0))
    close(aux["cov_frac"], 1 / 5)
    with pytest.raises(ValueError, match="draw_RT"):
        grpo.policy_loss(COV_LOGP, COV_LOGP, COV_ADV, COV_MASK, cfg)


def test_clip_cov_draw_is_uniform_over_the_band_and_capped():
    # band [0, 2]: Cov 1.16, 0.36, 1.26 are inside (3 candidates); one is drawn per key, each about 1/3
    # of the time; a share above the candidates' detaches all of them, never a token outside the band.
    cfg = cfg_(cov_penalty="clip_cov", cov_clip_frac=0.2, cov_clip_low=0.0, cov_clip_high=2.0)
    draw = jax.jit(lambda key: objectives.covariance_tokens(COV_LOGP, COV_ADV, COV_MASK, cfg,
                                                      jax.random.uniform(key, COV_MASK.shape)))
    picks = np.stack([np.asarray(draw(jax.random.PRNGKey(i))) for i in range(300)])
    assert np.all(picks.sum((1, 2)) == 1)
    share = picks.mean(0)
    assert np.all(share[[0, 1], [2, 2]] == 0) and share[1, 0] == 0      # outside the band, or padding
    assert all(0.23 < share[i, j] < 0.44 for i, j in [(0, 0), (0, 1), (1, 1)]), share
    every = objectives.covariance_tokens(COV_LOGP, COV_ADV, COV_MASK, dataclasses.replace(cfg, cov_clip_frac=1.0),
                                   jnp.zeros(COV_MASK.shape))
    assert np.array_equal(np.asarray(every), [[True, True, False], [False, True, False]])


def test_token_draws_depend_on_the_row_and_position_only():
    """A row's draws are the same cut to its real length (the position after its last mask-1 token),
    moved to another place in the batch, next to other rows; another row gets other draws; in [0, 1)."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 259, (4, 12)).astype(np.int32)
    mask = np.zeros((4, 12), np.float32)
    for b, (lo, hi) in enumerate([(3, 9), (3, 5), (4, 12), (2, 3)]):
        mask[b, lo:hi] = 1
    tokens = np.where(np.arange(12) < np.array([9, 5, 12, 3])[:, None], tokens, 258)  # padding: 258
    u = np.asarray(jax.jit(objectives.token_draws)(tokens, mask))
    assert u.shape == (4, 12) and u.dtype == np.float32 and np.all((u >= 0) & (u < 1))
    # row 1 (real length 5) alone, cut to 5; then to 8 with other padding after it, behind another row
    alone = np.asarray(objectives.token_draws(tokens[1:2, :5], mask[1:2, :5]))
    np.testing.assert_array_equal(alone[0], u[1, :5])
    other = np.concatenate([tokens[3:4, :8], np.concatenate([tokens[1:2, :5], [[7, 7, 7]]], 1)])
    moved = np.asarray(objectives.token_draws(other, np.concatenate([mask[3:4, :8], mask[1:2, :8]])))
    np.testing.assert_array_equal(moved[1, :5], u[1, :5])
    np.testing.assert_array_equal(moved[0, :3], u[3, :3])
    # a row whose tokens differ draws differently
    changed = tokens.copy()
    changed[0, 4] += 1
    assert not np.array_equal(np.asarray(objectives.token_draws(changed, mask))[0], u[0])


def test_clip_cov_picks_the_same_tokens_in_packed_and_fixed_layouts():
    """The trainer's two layouts of one microbatch of 8 rows (update.split_batch: every row at T = 32,
    in order; packing.pack_batch: rows sorted by real length, cut to the bucket length 16) hold the same
    rows, so the band and the count are the same; with draws from each row's own tokens Clip-Cov
    detaches the same tokens. (A draw over the microbatch's array picks differently in each.)"""
    import packing
    import update
    rng = np.random.default_rng(1)
    B, T = 8, 32
    lengths = [16, 14, 16, 15, 16, 14, 15, 16]  # real lengths: one bucket (16), all within 15% of it
    mask = np.zeros((B, T), np.float32)
    for b, n in enumerate(lengths):
        mask[b, 4:n] = 1
    data = {"tokens_RT": rng.integers(0, 259, (B, T)).astype(np.int32), "mask_RT": mask,
            "adv_R": rng.standard_normal(B).astype(np.float32),
            "logp_RT": np.where(mask > 0, -rng.exponential(1.0, (B, T)), 0.0).astype(np.float32)}
    cfg = cfg_(cov_penalty="clip_cov", cov_clip_frac=0.1, cov_clip_low=-1e9, cov_clip_high=1e9)

    def pick(mb):
        return np.asarray(objectives.covariance_tokens(mb["logp_RT"], mb["adv_R"], mb["mask_RT"], cfg,
                                                       objectives.token_draws(mb["tokens_RT"], mb["mask_RT"])))
    [[fixed]] = update.split_batch(data, 1, B)
    [[packed]], order = packing.pack_batch(data, 1, lambda T_b: B)
    assert packed["mask_RT"].shape == (B, 16) and not np.array_equal(order, np.arange(B))
    n = int(np.floor(0.1 * mask.sum()))  # every masked token is a candidate: exactly n are detached
    sel_fixed, sel_packed = pick(fixed), packing.unpack(pick(packed), order, (B, T))
    assert sel_fixed.sum() == n == 9
    np.testing.assert_array_equal(sel_packed, sel_fixed)


def test_batch_metrics_by_hand():
    """grpo.batch_metrics, the trainer's per-step scalars about its batch, on numbers worked out by hand:
    two groups of two; the verifier gave [1, 0] and [0.5, 0.5], shaping left them as they were."""
    raw_BG = np.array([[1.0, 0.0], [0.5, 0.5]], np.float32)
    adv_R = np.array([1.0, -1.0, 0.0, 0.0], np.float32)
    mask_RT = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], np.float32)
    logp_behav_RT = np.array([[-1.0, -2.0, -9.0], [-3.0, -9.0, -9.0], [-1.0, -1.0, -1.0], [-9.0, -9.0, -9.0]],
                             np.float32)
    m = grpo.batch_metrics({"loss": 0.5, "clip_frac": 0.25}, raw_BG, raw_BG, adv_R, logp_behav_RT, mask_RT)
    assert m["loss/total"] == 0.5 and m["policy/clip_frac"] == 0.25
    assert m["reward/mean"] == pytest.approx(0.5) and m["reward/std"] == pytest.approx(np.sqrt(0.125))
    assert m["reward/frac_zero_var_groups"] == 0.5       # the second group: both 0.5
    assert m["reward/pass_frac"] == 0.25 and m["reward/partial_frac"] == 0.5
    assert m["adv/mean_right"] == 1.0 and m["adv/mean_wrong"] == -1.0
    assert m["policy/entropy"] == pytest.approx((1 + 2 + 3 + 1 + 1 + 1) / 6)   # -mean log pi over 6 tokens
    assert m["len/completion_mean"] == pytest.approx(6 / 4)


def test_mismatch_report_splits_exact_and_stale_tokens():
    """mismatch/* over the exact tokens only, offpolicy/* over the stale ones only (by hand: the exact
    tokens agree bit for bit, the stale token is off by log 2)."""
    behav = np.array([[-1.0, -2.0, -0.5]], np.float32)
    ours = np.array([[-1.0, -2.0, -0.5 + np.log(2.0)]], np.float32)
    exact, stale = np.array([[True, True, False]]), np.array([[False, False, True]])
    r = grpo.mismatch_report(behav, ours, exact, stale)
    assert r["mismatch/bitwise_frac"] == 1.0 and r["mismatch/num_tokens"] == 2
    assert r["offpolicy/num_tokens"] == 1 and r["offpolicy/mean_abs_logp_diff"] == pytest.approx(np.log(2.0), rel=1e-5)
    assert grpo.mismatch_report(behav, ours, ~exact & False, ~stale & False) == {}
