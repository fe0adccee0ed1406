"""grpo.py: GRPO and its state-of-the-art variants as pure JAX functions (no I/O, no model code).

Test: python -m pytest -q tests/test_grpo.py

The trainer composes these functions; a researcher changes the algorithm here, and its settings, each
checked when a run starts, in grpo_config.py (GRPOConfig, imported here for every function's cfg).
The DEFAULT variant, `GRPOConfig()` with no arguments, is:
  1. Advantages: GRPO group normalisation, A_i = (r_i - mean_G(r)) / (std_G(r) + eps), with the std
     WITHIN each group of G completions of one prompt [Shao et al. 2024, outcome supervision]. We use the
     population std (ddof=0); torch-based trainers such as TRL use torch.std (ddof=1), a factor
     sqrt(G/(G-1)) larger. A group whose rewards are all equal gets A = 0 exactly.
  2. No KL term: beta = 0, so the reference policy is never run or read (DAPO, Dr. GRPO drop it).
  3. Token-level PPO clipped surrogate with the ratio centred on the proximal ("old") policy and the
     DAPO clip-higher range [1 - eps_low, 1 + eps_high] = [0.8, 1.28] [Yu et al. 2025, "Clip-Higher"]; no dual clip.
  4. Loss = token mean over every completion token of the batch (DAPO token-level loss), NOT the
     per-sequence mean of the original GRPO.
  5. Off-policy correction: truncated importance sampling w = min(pi_old / pi_behav, C), C = 2, in the
     decoupled PPO form (clip around pi_old, weight the samples by pi_old / pi_behav) [Hilton et al. 2022;
     Yao et al. 2025]. When the behaviour log-probs are not given (or equal pi_old) w = 1 exactly. No
     token or sequence is rejected (the rollout-correction suite, `is_weights` and `rejected_tokens`, is
     off but for this weight).

The policy loss, step by step (the same step numbers mark the code in `policy_loss`):
  Step 1  mask:    padded tokens are replaced by 0 BEFORE any arithmetic, so -inf/NaN there never reach
                   the loss or the gradient.
  Step 2  ratio:   ppo:  r_t = exp(logp_t - sg(logp_old_t))              (token level)
                   gspo: s_i = exp(1/|y_i| * sum_t (logp_t - sg(logp_old_t)))  (sequence level, length
                         normalised [Zheng et al. 2025]), broadcast to the tokens of sequence i.
                   log-ratios are clamped to [-20, 20] (as verl does) so exp() stays finite.
  Step 3  clip:    l_t = max(-A_i r_t, -A_i clip(r_t, 1 - eps_low, 1 + eps_high))   (= -min(...) of PPO)
  Step 4  dual:    if A_i < 0: l_t = min(l_t, -C_dual A_i)      [Ye et al. 2020, dual-clip PPO]
  Step 4b cov:     clip_cov: l_t = sg(l_t) on r N random tokens with omega_low <= Cov_t <= omega_high;
                   kl_cov:   l_t = l_t + beta |logp_t - logp_old_t| on the k N tokens of largest Cov_t,
                   Cov_t = (logp_t - mean logp)(A_t - mean A)        [Cui et al. 2025]; none by default.
  Step 5  IS:      l_t = w_t l_t, w = f(pi_old / pi_behav) per `is_correction`, stop-gradient;
                   tokens that `rejected_tokens` rejects (masked IS, IcePop, geometric rejection, veto)
                   leave the loss: m becomes m_kept in Step 7, numerator and denominator.
  Step 6  KL:      l_t = l_t + beta * k(logp_t, logp_ref_t)  (k1/k2/k3 of Schulman 2020); skipped if beta=0.
  Step 7  reduce:  token_mean:              sum_{i,t} m l / sum_{i,t} m                 (DAPO)
                   seq_mean_token_mean:     mean_{i: |y_i|>0} (sum_t m l / |y_i|)        (GRPO)
                   seq_mean_token_sum_norm: sum_{i,t} m l / (R * max_len)              (Dr. GRPO)
                   (max_len: the generation budget in completion tokens, whatever T is)

Around the loss, the trainer calls, in order: `keep_group` while collecting groups (DAPO dynamic
sampling), `shape_rewards` (DAPO overlong punishment and filter), `group_advantages`, then, per
microbatch, `policy_loss` weighted by `microbatch_weight` (with `loss_totals` of the whole minibatch),
so that accumulated microbatches give exactly the loss of one big batch.

Sources: GRPO: Shao et al. 2024 (DeepSeekMath, arXiv:2402.03300). Dr. GRPO: Liu et al. 2025
("Understanding R1-Zero-Like Training", arXiv:2503.20783). DAPO: Yu et al. 2025 (arXiv:2503.14476).
GSPO: Zheng et al. 2025 (arXiv:2507.18071). RLOO: Ahmadian et al. 2024 ("Back to Basics",
arXiv:2402.14740). KL estimators k1/k2/k3: J. Schulman, "Approximating KL divergence" (2020 blog).
TIS: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (blog).
Decoupled PPO: Hilton et al. 2022 ("Batch size-invariance for policy optimization", arXiv:2110.00641).
Dual clip: Ye et al. 2020 ("Mastering Complex Control in MOBA Games", arXiv:1912.09729).
Rollout correction: sequence-level truncated IS and geometric-mean rejection: verl's rollout correction
and Liu, Li et al. 2025 ("When Speed Kills Stability: Demystifying RL Collapse from the
Training-Inference Mismatch", blog); IcePop: Ling Team 2025 (Ring-1T, "Every Step Evolves",
arXiv:2510.18855). The objectives that keep pass@k (Pass@k Training, NSR, W-REINFORCE, Clip-Cov,
KL-Cov) and pass@k itself live in objectives.py, with their sources.

Shape key (suffixes of names): B prompts, G group size (completions per prompt), R rows (one per
completion, B x G of them: row b*G + g is completion g of prompt b), T token positions (the trainer's
rows hold prompt + completion). The advantage functions take rewards_BG; the loss takes rows (logp_RT,
adv_R). A `mask_RT` is 1 on completion tokens that count and 0 on prompt or padding positions, so a
row's completion length is mask_RT.sum(1).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

import objectives
from grpo_config import IS_CORRECTIONS, KL_ESTIMATORS, LOSS_AGGS, SIGNED_ADVANTAGES, GRPOConfig, is_int, is_real
from objectives import masked_mean

LOSS_TERMS = ("pg_loss", "kl_loss")  # policy_loss's aux entries that are terms of the loss (the rest: fractions)

# exp(20) ~ 4.9e8: far outside any sane ratio, still finite in f32 (and its square is too).
LOG_RATIO_CLAMP = 20.0


# ----------------------------------------------------------------------------------------------------
# Advantages and group filters (one row per prompt, G completions each)

def group_advantages(rewards_BG, cfg: GRPOConfig):
    """A_BG from rewards_BG (B prompts x G completions), per `cfg.advantage`; f32.

    The baselines differ in what they estimate: GRPO and Dr. GRPO subtract the group mean (GRPO also
    divides by the group std, which Dr. GRPO shows biases the update towards easy and hard prompts);
    RLOO subtracts the mean of the OTHER G-1 completions, which keeps the estimator unbiased; REINFORCE
    subtracts the mean over the whole batch. When every reward of a group (for reinforce: of the batch) is
    equal the advantage is exactly 0, not a rounding residue divided by eps.
    """
    r_BG = jnp.asarray(rewards_BG, jnp.float32)
    if r_BG.ndim != 2 or r_BG.shape[1] != cfg.group_size:
        raise ValueError(f"rewards_BG has shape {r_BG.shape}; expected (B, G={cfg.group_size})")
    G = cfg.group_size
    mean_B1 = r_BG.mean(axis=1, keepdims=True)
    if cfg.advantage == "grpo":
        std_B1 = r_BG.std(axis=1, keepdims=True)  # ddof=0, within the group (not over the batch)
        adv_BG = (r_BG - mean_B1) / (std_B1 + cfg.adv_eps)
    elif cfg.advantage == "drgrpo":
        adv_BG = r_BG - mean_B1
    elif cfg.advantage == "rloo":
        baseline_BG = (r_BG.sum(axis=1, keepdims=True) - r_BG) / (G - 1)  # mean of the other G-1
        adv_BG = r_BG - baseline_BG
    elif cfg.advantage == "passk":
        return objectives.passk_advantages(r_BG, cfg.pass_k, cfg.adv_eps)
    elif cfg.advantage in SIGNED_ADVANTAGES:
        return objectives.signed_advantages(r_BG, 0.0 if cfg.advantage == "nsr" else cfg.positive_weight)
    else:  # reinforce with a batch baseline
        adv_BG = r_BG - r_BG.mean()
        return jnp.where(jnp.all(r_BG == r_BG.reshape(-1)[0]), 0.0, adv_BG)
    return jnp.where(zero_variance_groups(r_BG)[:, None], adv_BG, 0.0)


def zero_variance_groups(rewards_BG):
    """keep_B: True where a group's rewards are NOT all equal (DAPO "Dynamic Sampling", Yu et al. 2025).

    A group whose G completions all got the same reward has advantage 0 under every group baseline, so it
    adds no gradient, only dilutes the token mean; DAPO over-samples and keeps only groups with keep=True.
    """
    r_BG = jnp.asarray(rewards_BG)
    if r_BG.ndim != 2:
        raise ValueError(f"rewards_BG must be 2-D (B, G); got shape {r_BG.shape}")
    return jnp.any(r_BG != r_BG[:, :1], axis=1)


def overlong_penalty(lengths_R, max_len: int, buffer_len: int, penalty: float = 1.0):
    """DAPO soft overlong punishment R_length (Yu et al. 2025, "Overlong Reward Shaping"), f32, to ADD to the rewards.

    With L_max = max_len and L_cache = buffer_len:
        0                                    if |y| <= L_max - L_cache
        ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
        -1                                   if |y| > L_max
    all multiplied by `penalty`.
    """
    if not is_int(max_len) or not is_int(buffer_len) or not 0 < buffer_len <= max_len:
        raise ValueError(f"overlong_penalty needs ints 0 < buffer_len <= max_len; got {buffer_len=}, {max_len=}")
    if not is_real(penalty) or penalty < 0:
        raise ValueError(f"overlong_penalty: penalty must be a finite number >= 0; got {penalty!r}")
    L_R = jnp.asarray(lengths_R, jnp.float32)
    soft_start = max_len - buffer_len
    ramp_R = (soft_start - L_R) / buffer_len
    r_R = jnp.where(L_R <= soft_start, 0.0, jnp.where(L_R <= max_len, ramp_R, -1.0))
    return penalty * r_R


def overlong_mask(lengths_R, max_len: int, finished_R=None):
    """keep_R for DAPO overlong filtering: False for completions cut off by the length budget.

    Without `finished_R` a completion that used the whole budget (length >= max_len) counts as truncated,
    since the length alone cannot tell whether its last token was EOS; pass finished_R (True where the
    sampler emitted EOS) to keep those. Multiply the loss mask by keep_R[:, None].
    """
    if not is_int(max_len) or max_len <= 0:
        raise ValueError(f"overlong_mask: max_len must be an int > 0; got {max_len!r}")
    keep_R = jnp.asarray(lengths_R) < max_len
    if finished_R is not None:
        keep_R = keep_R | jnp.asarray(finished_R, bool)
    return keep_R


def turn_lengths(mask_RT):
    """lengths_R: each row's longest model turn, in tokens (int64, host-side numpy). A model turn is a
    run of consecutive loss-mask-1 tokens; a multi-turn row (envs/) has one per turn, separated by the
    prompt, tool observations and next-turn headers (mask 0), and the generation budget (max_new_tokens,
    the L_max of `shape_rewards`) applies to each turn, not to their sum. A one-turn row's longest run
    is its completion length. A row without sampled tokens has length 0."""
    m_RT = np.asarray(mask_RT) > 0
    if m_RT.ndim != 2:
        raise ValueError(f"turn_lengths: mask_RT must be 2-D (R, T); got shape {m_RT.shape}")
    c_RT = np.cumsum(m_RT, axis=1)
    # the count at the last mask-0 position at or before t: a run's length is c minus it
    base_RT = np.maximum.accumulate(np.where(m_RT, 0, c_RT), axis=1)
    return (c_RT - base_RT).max(axis=1, initial=0).astype(np.int64)


def shape_rewards(rewards_BG, lengths_R, finished_R, cfg: GRPOConfig):
    """DAPO's length-based reward shaping, as configured: (rewards_BG, keep_R), f32 and bool.

    rewards_BG: B prompts x G completions (the verifier's rewards). lengths_R: the completion length in
    tokens of each of the R = B*G completion rows (row b*G + g is completion g of prompt b), measured against
    max_len, the generation budget of one model turn: `turn_lengths` of the loss mask (a one-turn row's
    completion tokens; a multi-turn row's longest turn, so an episode is punished or filtered for the
    turn that came closest to the budget, never for the sum of turns each within it).
    finished_R: True where the sampler stopped on EOS/a stop string, or None (then a completion that
    used the whole budget counts as truncated, see `overlong_mask`).
      overlong_buffer_len > 0: rewards_BG + `overlong_penalty` (soft overlong punishment), else unchanged;
      overlong_filter:         keep_R = `overlong_mask` (truncated completions get no loss), else all True.
    Multiply the loss mask by keep_R[:, None]; compute advantages from the returned rewards.
    """
    r_BG = jnp.asarray(rewards_BG, jnp.float32)
    if r_BG.ndim != 2 or r_BG.shape[1] != cfg.group_size:
        raise ValueError(f"shape_rewards: rewards_BG has shape {r_BG.shape}; expected (B, G={cfg.group_size})")
    lengths_R = jnp.asarray(lengths_R)
    if lengths_R.shape != (r_BG.size,):
        raise ValueError(f"shape_rewards: lengths_R has shape {lengths_R.shape}; expected ({r_BG.size},), "
                         "one per completion")
    if finished_R is not None and jnp.shape(finished_R) != (r_BG.size,):
        raise ValueError(f"shape_rewards: finished_R has shape {jnp.shape(finished_R)}; expected ({r_BG.size},)")
    if cfg.overlong_buffer_len > 0:
        r_BG = r_BG + overlong_penalty(lengths_R, cfg.max_len, cfg.overlong_buffer_len,
                                       cfg.overlong_penalty_factor).reshape(r_BG.shape)
    if cfg.overlong_filter:
        keep_R = overlong_mask(lengths_R, cfg.max_len, finished_R)
    else:
        keep_R = jnp.ones(lengths_R.shape, bool)
    return r_BG, keep_R


# DAPO dynamic sampling over-samples until the batch is full; we bound that at this many times the batch.
DYNAMIC_SAMPLING_MAX_FACTOR = 4


def keep_group(rewards_G, seen: int, batch_size: int, cfg: GRPOConfig) -> bool:
    """Whether a finished group goes into the batch being assembled (DAPO "Dynamic Sampling", Yu et al. 2025).

    rewards_G: the G rewards of one prompt's completions. seen: how many groups the batch has looked
    at so far, this one included (1-based). batch_size: B, the groups a batch needs.
    With cfg.dynamic_sampling, a group whose every completion has advantage 0 (no gradient, only a
    diluted token mean) is dropped, and the caller samples more. Under a group baseline (grpo, drgrpo,
    rloo, passk, reinforce) that is a group whose G rewards are all equal. Under the signed advantages
    (nsr, w_reinforce) there is no baseline, so equal rewards do not mean advantage 0: an all-wrong
    group has A = -1 on every completion, and it is exactly the signal NSR trains on (and most of
    W-REINFORCE's). The default run's recipe turns dynamic sampling on; a user who adds
    `--advantage nsr` expects NSR, not NSR with its negative samples thrown away, so for these two
    the rule keeps what their advantage says carries a gradient: NSR drops only groups with no wrong
    completion (reward >= 1/2 everywhere: A = 0), W-REINFORCE with lambda > 0 drops only groups of
    rewards exactly 1/2.
    DAPO over-samples without bound; we cap it: once DYNAMIC_SAMPLING_MAX_FACTOR * B (= 4B) groups have
    been seen, every group is kept, so a batch of mostly solved (or mostly hopeless) prompts still
    finishes, with some zero-advantage groups in it. Without dynamic_sampling every group is kept. Pure,
    host-side: `zero_variance_groups` (or `objectives.signed_advantages`) on a single group.
    """
    if not is_int(seen) or not is_int(batch_size) or seen < 1 or batch_size < 1:
        raise ValueError(f"keep_group needs ints seen >= 1 and batch_size >= 1; got {seen=!r}, {batch_size=!r}")
    r_G = np.asarray(rewards_G)
    if r_G.ndim != 1 or r_G.size == 0:
        raise ValueError(f"keep_group: rewards_G must be 1-D and non-empty; got shape {r_G.shape}")
    if not cfg.dynamic_sampling or seen > DYNAMIC_SAMPLING_MAX_FACTOR * batch_size:
        return True
    if cfg.advantage in SIGNED_ADVANTAGES:
        weight = 0.0 if cfg.advantage == "nsr" else cfg.positive_weight
        return bool(np.any(np.asarray(objectives.signed_advantages(r_G[None, :], weight)) != 0))
    return bool(np.any(r_G != r_G[0]))


# ----------------------------------------------------------------------------------------------------
# KL estimators and the policy loss (one row per completion)

def kl_penalty(logp_RT, logp_ref_RT, estimator: str = "k3", mask_RT=None):
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi (Schulman 2020), f32.

    With log r = logp_ref - logp (r = pi_ref/pi):  k1 = -log r;  k2 = (log r)^2 / 2;  k3 = (r - 1) - log r.
    k1 is unbiased but can be negative; k3 is unbiased and >= 0 (the one in GRPO's objective); k2 is
    biased, with low variance.
    log r is clamped to [-20, 20] so k3 stays finite. With mask_RT, masked positions are 0 (and may hold
    -inf/NaN); without it, inputs must be finite.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_penalty: estimator={estimator!r} must be one of {KL_ESTIMATORS}")
    logp_RT = jnp.asarray(logp_RT, jnp.float32)
    logp_ref_RT = jnp.asarray(logp_ref_RT, jnp.float32)
    if logp_RT.shape != logp_ref_RT.shape:
        raise ValueError(f"kl_penalty: logp {logp_RT.shape} and logp_ref {logp_ref_RT.shape} differ")
    if mask_RT is not None:
        mask_RT = jnp.asarray(mask_RT).astype(bool)
        logp_RT = jnp.where(mask_RT, logp_RT, 0.0)
        logp_ref_RT = jnp.where(mask_RT, logp_ref_RT, 0.0)
    log_r_RT = jnp.clip(logp_ref_RT - logp_RT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if estimator == "k1":
        kl_RT = -log_r_RT
    elif estimator == "k2":
        kl_RT = 0.5 * jnp.square(log_r_RT)
    else:
        kl_RT = jnp.expm1(log_r_RT) - log_r_RT
    return kl_RT if mask_RT is None else jnp.where(mask_RT, kl_RT, 0.0)


def _check_RT(name, x, shape_RT):
    if x.shape != shape_RT:
        raise ValueError(f"{name} has shape {x.shape}; expected {shape_RT} like logp_RT")


def aggregate(loss_RT, mask_RT, cfg: GRPOConfig, rows=None):
    """Step 7: reduce per-token losses to a scalar per `cfg.loss_agg` (see the module docstring).

    token_mean: every token of the batch weighs the same, so long completions are not under-weighted
    (DAPO). seq_mean_token_mean: each completion weighs the same (GRPO); completions with no tokens are
    left out of the mean over sequences. seq_mean_token_sum_norm: divide by the constant R * max_len, so
    neither length nor the number of live tokens scales a token's gradient (Dr. GRPO); max_len is the
    generation budget in COMPLETION tokens (as in the Dr. GRPO paper), so T (which may count prompt
    positions) may exceed it. A completion longer than max_len is not an error here (the sampler's
    budget bounds it); its tokens simply count, the normaliser stays the constant.
    An all-masked batch gives exactly 0 in every mode. An unknown loss_agg raises.
    rows: the R of R * max_len (default: every row); `policy_loss` leaves out the rows a rollout
    correction rejected whole, as the other modes leave out their tokens through the mask.
    """
    m_RT = jnp.asarray(mask_RT).astype(jnp.float32)
    x_RT = jnp.where(m_RT > 0, loss_RT, 0.0)
    if cfg.loss_agg == "token_mean":
        return jnp.sum(x_RT) / jnp.maximum(jnp.sum(m_RT), 1.0)
    if cfg.loss_agg == "seq_mean_token_mean":
        len_R = jnp.sum(m_RT, axis=1)
        seq_R = jnp.sum(x_RT, axis=1) / jnp.maximum(len_R, 1.0)
        return jnp.sum(seq_R) / jnp.maximum(jnp.sum(len_R > 0), 1)
    if cfg.loss_agg == "seq_mean_token_sum_norm":
        # max_len is the generation budget (completion tokens), not T: the [R, T] rows may also hold
        # prompt positions (masked out), so T > max_len is normal.
        return jnp.sum(x_RT) / ((x_RT.shape[0] if rows is None else jnp.maximum(rows, 1)) * cfg.max_len)
    raise ValueError(f"aggregate: unknown loss_agg {cfg.loss_agg!r}; expected one of {LOSS_AGGS}")


def loss_totals(mask_RT):
    """(tokens, non-empty rows, rows) of the whole (mini)batch whose loss is being accumulated: the
    denominators of `aggregate` that a microbatch cannot see. Host-side numpy; pass to `microbatch_weight`."""
    m_RT = np.asarray(mask_RT)
    if m_RT.ndim != 2:
        raise ValueError(f"loss_totals: mask_RT must be 2-D (R, T); got shape {m_RT.shape}")
    return m_RT.sum(), np.any(m_RT > 0, axis=1).sum(), m_RT.shape[0]


def microbatch_weight(mask_RT, totals, cfg: GRPOConfig):
    """The share of the (mini)batch loss that one microbatch's `aggregate` carries, so that the sum of
    weight * aggregate(microbatch) over the microbatches equals aggregate(whole batch) (gradient
    accumulation). `totals` = loss_totals(mask of the whole batch) = (tokens, non-empty rows, rows):
      token_mean:              tokens in the microbatch / tokens in the batch
      seq_mean_token_mean:     non-empty rows in the microbatch / non-empty rows in the batch
      seq_mean_token_sum_norm: rows in the microbatch / rows in the batch (the normaliser is rows * max_len)
    An empty batch gives weight 0 (its loss is 0 anyway). Every mode has its own branch: a new loss_agg
    must say how it accumulates, or this raises.
    """
    total_tokens, total_seqs, total_rows = totals
    if cfg.loss_agg == "token_mean":
        return jnp.sum(mask_RT) / jnp.maximum(total_tokens, 1.0)
    if cfg.loss_agg == "seq_mean_token_mean":
        return jnp.sum(jnp.any(mask_RT > 0, axis=1)) / jnp.maximum(total_seqs, 1.0)
    if cfg.loss_agg == "seq_mean_token_sum_norm":
        return mask_RT.shape[0] / total_rows
    raise ValueError(f"microbatch_weight: unknown loss_agg {cfg.loss_agg!r}; expected one of {LOSS_AGGS}")


def kept_denominator(totals, rejected, cfg: GRPOConfig):
    """The denominator of the whole (mini)batch's loss when a rollout correction rejects tokens
    (cfg.rejects): `loss_totals`' count for cfg.loss_agg (tokens, non-empty rows or rows) minus what
    the rejections took out of it, summed over the microbatches (policy_loss's aux["den_rejected"]).
    Which tokens are rejected depends on pi_old, known only after each microbatch's forward, so
    `microbatch_weight` cannot be computed first; instead each microbatch's loss is scaled by its own
    kept denominator (aux["den_kept"]: loss x den_kept is its numerator) and the summed gradient is
    divided by this, once: exactly the loss of one big batch over its kept tokens (update.py does it)."""
    total_tokens, total_seqs, total_rows = totals
    if cfg.loss_agg == "token_mean":
        return total_tokens - rejected
    if cfg.loss_agg == "seq_mean_token_mean":
        return total_seqs - rejected
    if cfg.loss_agg == "seq_mean_token_sum_norm":
        return total_rows - rejected
    raise ValueError(f"kept_denominator: unknown loss_agg {cfg.loss_agg!r}; expected one of {LOSS_AGGS}")


def _surrogate(logp_RT, logp_old_RT, adv_R, mask_RT, cfg: GRPOConfig):
    """Steps 1-4 of `policy_loss`. Inputs must be float arrays of equal shape."""
    # Step 1: masked positions become 0 before any arithmetic (their values may be -inf or NaN).
    m_RT = jnp.asarray(mask_RT).astype(bool)
    logp_RT = jnp.where(m_RT, logp_RT.astype(jnp.float32), 0.0)
    logp_old_RT = jax.lax.stop_gradient(jnp.where(m_RT, logp_old_RT.astype(jnp.float32), 0.0))
    A_R1 = jax.lax.stop_gradient(adv_R.astype(jnp.float32))[:, None]

    # Step 2: importance ratio to the proximal policy pi_old.
    if cfg.policy_loss == "ppo":
        log_ratio_RT = jnp.clip(logp_RT - logp_old_RT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    else:  # gspo: s_i = (pi(y_i)/pi_old(y_i))^(1/|y_i|), the geometric mean of the token ratios
        len_R = jnp.maximum(jnp.sum(m_RT, axis=1), 1)
        log_s_R = jnp.sum(logp_RT - logp_old_RT, axis=1) / len_R
        log_s_R = jnp.clip(log_s_R, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        log_ratio_RT = jnp.broadcast_to(log_s_R[:, None], logp_RT.shape)
    ratio_RT = jnp.exp(log_ratio_RT)

    # Step 3: clipped surrogate, l = max(-A r, -A clip(r)); ties go to the unclipped term (its gradient).
    lo, hi = 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high
    pg_unclipped_RT = -A_R1 * ratio_RT
    pg_clipped_RT = -A_R1 * jnp.clip(ratio_RT, lo, hi)
    clip_active_RT = pg_clipped_RT > pg_unclipped_RT
    pg_RT = jnp.where(clip_active_RT, pg_clipped_RT, pg_unclipped_RT)

    # Step 4: dual clip: for A < 0 a huge ratio would give an unbounded loss; cap it at -c A.
    dual_active_RT = jnp.zeros_like(m_RT)
    if cfg.dual_clip_c is not None:
        pg_dual_B1 = -cfg.dual_clip_c * A_R1
        dual_active_RT = (A_R1 < 0) & (pg_RT > pg_dual_B1)
        pg_RT = jnp.where(dual_active_RT, pg_dual_B1, pg_RT)

    return dict(m_RT=m_RT, logp_RT=logp_RT, logp_old_RT=logp_old_RT, ratio_RT=ratio_RT, pg_RT=pg_RT,
                clip_low_RT=clip_active_RT & (ratio_RT < lo) & m_RT,
                clip_high_RT=clip_active_RT & (ratio_RT > hi) & m_RT,
                dual_RT=dual_active_RT & m_RT)


def _log_rho(logp_old_RT, logp_behav_RT, m_RT):
    """log rho_t = log pi_old - log pi_behav per token, f32, stop-gradient, 0 on padding (unclamped)."""
    old_RT = jnp.where(m_RT, jnp.asarray(logp_old_RT, jnp.float32), 0.0)
    behav_RT = jnp.where(m_RT, jnp.asarray(logp_behav_RT, jnp.float32), 0.0)
    return jax.lax.stop_gradient(old_RT - behav_RT)


def is_weights(logp_old_RT, logp_behav_RT, mask_RT, cfg: GRPOConfig):
    """Step 5: off-policy weight w_RT on rho = pi_old / pi_behav (stop-gradient), f32; 1 on padding,
    0 on the tokens `rejected_tokens` rejects.

    pi_behav is the policy that SAMPLED the tokens (a stale version, a quantised sampler, or the same
    weights computed by the sampler's graph); pi_old is the proximal policy the clip is centred on.
    Decoupled PPO (Hilton et al. 2022) weights the clipped objective by rho; the variants bound its variance:
      none:       w = 1
      tis:        w_t = min(rho_t, C)                                     (Yao et al. 2025)
      seq_tis:    w_t = min(rho_i, C), rho_i = prod_t rho_t over sequence i's tokens (truncated
                  sequence-level IS: verl's "sequence" mode; Liu, Li et al. 2025)
      token_mask: w_t = rho_t, tokens outside [1/C, C] rejected           (masked IS, per token)
      seq_mask:   w_t = rho_i, sequences outside [1/C, C] rejected        (sequence-level masked IS)
      icepop:     w_t = rho_t, tokens outside [alpha, beta] rejected      (IcePop, Ring-1T 2025)
    geo_reject and veto_ratio reject whole sequences on top of any of these (`rejected_tokens`).
    Computed in log space: log rho_t clamped to [-20, 20] for exp(); a sequence's sum is not clamped
    before its band test, so a -1e4 behaviour log-prob still rejects the sequence, and w stays finite.
    """
    m_RT = jnp.asarray(mask_RT).astype(bool)
    if logp_behav_RT is None:
        return jnp.ones(m_RT.shape, jnp.float32)
    log_rho_RT = _log_rho(logp_old_RT, logp_behav_RT, m_RT)
    log_C = math.log(cfg.is_cap)
    if cfg.is_correction == "none":
        w_RT = jnp.ones(m_RT.shape, jnp.float32)
    elif cfg.is_correction in ("tis", "token_mask", "icepop"):
        # the masks reject every rho_t above their band, so the cap only bounds exp() there
        cap = log_C if cfg.is_correction != "icepop" else math.log(cfg.icepop_high)
        w_RT = jnp.exp(jnp.clip(log_rho_RT, -LOG_RATIO_CLAMP, cap))
    elif cfg.is_correction in ("seq_tis", "seq_mask"):
        log_rho_R1 = jnp.sum(log_rho_RT, axis=1, keepdims=True)
        w_RT = jnp.broadcast_to(jnp.exp(jnp.clip(log_rho_R1, -LOG_RATIO_CLAMP, log_C)), m_RT.shape)
    else:
        raise ValueError(f"is_weights: unknown is_correction {cfg.is_correction!r}; expected one of {IS_CORRECTIONS}")
    w_RT = jnp.where(rejected_tokens(logp_old_RT, logp_behav_RT, m_RT, cfg), 0.0, w_RT)
    return jnp.where(m_RT, w_RT, 1.0)


def rejected_tokens(logp_old_RT, logp_behav_RT, mask_RT, cfg: GRPOConfig):
    """The tokens a rollout correction rejects, bool [R, T] (False on padding): they leave the loss,
    its numerator AND its denominator (`policy_loss`), so the kept tokens are averaged among themselves.
    With log rho_t = log pi_old - log pi_behav, each rule on its own:
      token_mask: |log rho_t| > log C                               (the token)
      seq_mask:   |sum_t log rho_t| > log C                          (its whole sequence)
      icepop:     rho_t outside [alpha, beta]                       (the token; Ring-1T 2025)
      geo_reject: exp(mean_t log rho_t) outside [geo_low, geo_high]  (its whole sequence; verl)
      veto_ratio: some rho_t < veto_ratio in the sequence           (its whole sequence)
    A token is rejected if any configured rule rejects it. No behaviour log-probs: nothing rejected."""
    m_RT = jnp.asarray(mask_RT).astype(bool)
    if logp_behav_RT is None or not cfg.rejects:
        return jnp.zeros(m_RT.shape, bool)
    log_rho_RT = _log_rho(logp_old_RT, logp_behav_RT, m_RT)
    log_C = math.log(cfg.is_cap)
    rej_RT = jnp.zeros(m_RT.shape, bool)
    rej_R = jnp.zeros(m_RT.shape[:1], bool)
    if cfg.is_correction == "token_mask":
        rej_RT = jnp.abs(log_rho_RT) > log_C
    elif cfg.is_correction == "icepop":
        rej_RT = (log_rho_RT < math.log(cfg.icepop_low)) | (log_rho_RT > math.log(cfg.icepop_high))
    elif cfg.is_correction == "seq_mask":
        rej_R = jnp.abs(jnp.sum(log_rho_RT, axis=1)) > log_C
    if cfg.geo_reject:
        mean_R = jnp.sum(log_rho_RT, axis=1) / jnp.maximum(jnp.sum(m_RT, axis=1), 1)
        rej_R = rej_R | (mean_R < math.log(cfg.geo_low)) | (mean_R > math.log(cfg.geo_high))
    if cfg.veto_ratio > 0:
        rej_R = rej_R | jnp.any(m_RT & (log_rho_RT < math.log(cfg.veto_ratio)), axis=1)
    return m_RT & (rej_RT | rej_R[:, None])


def _loss_inputs(logp_RT, logp_old_RT, adv_R, mask_RT, logp_behav_RT, logp_ref_RT, cfg: GRPOConfig):
    """policy_loss's arguments as arrays, their shapes checked (ValueError says which is wrong)."""
    logp_RT = jnp.asarray(logp_RT)
    shape_RT = logp_RT.shape
    if logp_RT.ndim != 2:
        raise ValueError(f"logp_RT must be 2-D (R, T); got shape {shape_RT}")
    logp_old_RT, mask_RT = jnp.asarray(logp_old_RT), jnp.asarray(mask_RT)
    _check_RT("logp_old_RT", logp_old_RT, shape_RT)
    _check_RT("mask_RT", mask_RT, shape_RT)
    adv_R = jnp.asarray(adv_R)
    if adv_R.shape != shape_RT[:1]:
        raise ValueError(f"adv_R has shape {adv_R.shape}; expected ({shape_RT[0]},), one per completion")
    if logp_behav_RT is not None:
        logp_behav_RT = jnp.asarray(logp_behav_RT)
        _check_RT("logp_behav_RT", logp_behav_RT, shape_RT)
    if cfg.kl_beta > 0:
        if logp_ref_RT is None:
            raise ValueError("kl_beta > 0 needs logp_ref_RT (the reference policy's log-probs)")
        logp_ref_RT = jnp.asarray(logp_ref_RT)
        _check_RT("logp_ref_RT", logp_ref_RT, shape_RT)
    return logp_RT, logp_old_RT, adv_R, mask_RT, logp_behav_RT, logp_ref_RT


def _is_modified(logp_old_RT, logp_behav_RT, rejected_RT, m_RT, cfg: GRPOConfig):
    """Tokens whose off-policy weight the correction changed: truncated by tis / seq_tis, or rejected."""
    if logp_behav_RT is None or cfg.is_correction == "none":
        return rejected_RT
    log_rho_RT = _log_rho(logp_old_RT, logp_behav_RT, m_RT)
    if cfg.is_correction == "tis":
        return m_RT & ((log_rho_RT > math.log(cfg.is_cap)) | rejected_RT)
    if cfg.is_correction == "seq_tis":
        return m_RT & ((jnp.sum(log_rho_RT, axis=1, keepdims=True) > math.log(cfg.is_cap)) | rejected_RT)
    return rejected_RT


def _kept(m_RT, rejected_RT, cfg: GRPOConfig):
    """The tokens the loss keeps once rejected ones leave it, whole: (kept mask f32, R of R * max_len
    without the sequences rejected whole, this microbatch's denominator for cfg.loss_agg after
    rejection, and what rejection took from that denominator: `kept_denominator` sums the latter)."""
    kept_RT = m_RT & ~rejected_RT
    kf_RT = kept_RT.astype(jnp.float32)
    rows_rejected = jnp.sum(jnp.any(m_RT, axis=1) & ~jnp.any(kept_RT, axis=1))
    rows = m_RT.shape[0] - rows_rejected
    if cfg.loss_agg == "token_mean":
        den_kept, den_rejected = jnp.sum(kf_RT), jnp.sum(m_RT) - jnp.sum(kf_RT)
    elif cfg.loss_agg == "seq_mean_token_mean":
        den_kept, den_rejected = jnp.sum(jnp.any(kept_RT, axis=1)), rows_rejected
    elif cfg.loss_agg == "seq_mean_token_sum_norm":
        den_kept, den_rejected = rows, rows_rejected
    else:
        raise ValueError(f"policy_loss: unknown loss_agg {cfg.loss_agg!r}; expected one of {LOSS_AGGS}")
    return kf_RT, rows, den_kept, den_rejected


def policy_loss(logp_RT, logp_old_RT, adv_R, mask_RT, cfg: GRPOConfig, *, logp_behav_RT=None,
                logp_ref_RT=None, draw_RT=None):
    """The policy-gradient loss (to MINIMISE) and an aux dict; see the module docstring for the steps.

    logp_RT: log pi_theta of the sampled tokens (differentiated). logp_old_RT: the proximal policy pi_old
    (stop-gradient; at the first step on-policy it equals logp_RT, so the ratio is exactly 1).
    logp_behav_RT: the sampler's log-probs (None = the same as pi_old: no correction). logp_ref_RT: the
    reference policy, read only when kl_beta > 0. adv_R: one advantage per completion row (flatten the
    B x G advantages). Masked positions may hold anything, -inf and NaN included. draw_RT: Clip-Cov's
    draw, a uniform in [0, 1) per token (cov_penalty=clip_cov needs it; `objectives.token_draws` makes it from the
    rows, the same in any layout).

    aux: pg_loss, kl_loss (aggregated like the loss; 0 when beta = 0), clip_frac_low / clip_frac_high
    (fraction of tokens whose clip is active, i.e. zero gradient: A<0 & r<1-eps_low / A>0 & r>1+eps_high),
    dual_clip_frac, is_weight_mean, is_frac_modified (tokens truncated by tis / seq_tis or rejected),
    cov_frac (tokens Clip-Cov detached or KL-Cov penalised), num_tokens, den_kept and den_rejected (the
    loss's denominator after rejection and what rejection took from it: `kept_denominator`), and the
    arrays ratio_RT and is_weight_RT (1 on padding, 0 on rejected tokens).
    """
    logp_RT, logp_old_RT, adv_R, mask_RT, logp_behav_RT, logp_ref_RT = _loss_inputs(
        logp_RT, logp_old_RT, adv_R, mask_RT, logp_behav_RT, logp_ref_RT, cfg)
    s = _surrogate(logp_RT, logp_old_RT, adv_R, mask_RT, cfg)  # Steps 1-4
    m_RT, mf_RT = s["m_RT"], s["m_RT"].astype(jnp.float32)

    # Step 4b: Clip-Cov / KL-Cov restrain the few tokens of largest covariance (none: nothing selected).
    cov_RT = objectives.covariance_tokens(s["logp_RT"], adv_R, m_RT, cfg, draw_RT)
    if cfg.cov_penalty == "clip_cov":  # same value, no gradient
        s["pg_RT"] = jnp.where(cov_RT, jax.lax.stop_gradient(s["pg_RT"]), s["pg_RT"])
    elif cfg.cov_penalty == "kl_cov":
        d_RT = s["logp_RT"] - s["logp_old_RT"]  # |d| with gradient sign(d): 0 at d = 0, where KL(pi_old || pi) is least
        s["pg_RT"] = s["pg_RT"] + jnp.where(cov_RT, cfg.cov_kl_coef * d_RT * jax.lax.stop_gradient(jnp.sign(d_RT)), 0.0)

    # Step 5: off-policy correction weight (decoupled PPO), no gradient; rejected tokens leave the loss.
    w_RT = is_weights(logp_old_RT, logp_behav_RT, m_RT, cfg)
    rejected_RT = rejected_tokens(logp_old_RT, logp_behav_RT, m_RT, cfg)
    kf_RT, rows, den_kept, den_rejected = _kept(m_RT, rejected_RT, cfg)
    pg_RT = w_RT * s["pg_RT"]
    pg_loss = aggregate(pg_RT, kf_RT, cfg, rows)

    # Step 6: KL to the reference; with beta = 0 logp_ref_RT is never touched.
    kl_loss = jnp.zeros((), jnp.float32)
    if cfg.kl_beta > 0:
        kl_RT = kl_penalty(s["logp_RT"], logp_ref_RT, cfg.kl_estimator, m_RT)
        kl_loss = aggregate(kl_RT, kf_RT, cfg, rows)
    # Step 7 happened in aggregate(); both terms are reduced the same way, so the sum is too.
    loss = pg_loss + cfg.kl_beta * kl_loss

    modified_RT = _is_modified(logp_old_RT, logp_behav_RT, rejected_RT, m_RT, cfg)
    aux = dict(pg_loss=pg_loss, kl_loss=kl_loss,
               clip_frac_low=masked_mean(s["clip_low_RT"], mf_RT),
               clip_frac_high=masked_mean(s["clip_high_RT"], mf_RT),
               dual_clip_frac=masked_mean(s["dual_RT"], mf_RT),
               is_weight_mean=masked_mean(w_RT, mf_RT),
               is_frac_modified=masked_mean(modified_RT, mf_RT),
               cov_frac=masked_mean(cov_RT, mf_RT),
               num_tokens=jnp.sum(mf_RT),
               den_kept=den_kept.astype(jnp.float32), den_rejected=den_rejected.astype(jnp.float32),
               ratio_RT=jax.lax.stop_gradient(jnp.where(m_RT, s["ratio_RT"], 1.0)),
               is_weight_RT=w_RT)
    return loss, aux


# ----------------------------------------------------------------------------------------------------
# Metrics that explain a step

def mismatch_report(logp_behav_RT, logp_RT, exact_RT, stale_RT) -> dict:
    """mismatch/*: mismatch_metrics over the tokens our weights sampled from inputs our weights computed
    (exact_RT: the bf16 problem, bitwise_frac 1.0 when the fix holds); offpolicy/*: its KL and spread
    over the stale tokens (stale_RT: sampled by older versions). Empty where a mask selects nothing."""
    out = {}
    if np.any(exact_RT):
        out.update({f"mismatch/{k}": float(v) for k, v in mismatch_metrics(logp_behav_RT, logp_RT, exact_RT).items()})
    if np.any(stale_RT):
        mm = mismatch_metrics(logp_behav_RT, logp_RT, stale_RT)
        out.update({f"offpolicy/{k}": float(mm[k]) for k in
                    ("k3_kl", "mean_abs_logp_diff", "frac_ratio_outside_0.5_2", "num_tokens")})
    return out


MISMATCH_EDGES = np.arange(-10.0, 1.01, 0.5)  # log10 |trainer - sampler log-prob|, nats


def mismatch_histogram(logp_behav_RT, logp_RT, exact_RT) -> dict:
    """One line of $RUN_DIR/mismatch.jsonl (plot.py draws it): of the tokens exact_RT selects, how many
    have a trainer log-prob exactly the sampler's ("zero"), and a histogram of log10 |difference| of
    the others over MISMATCH_EDGES."""
    delta = np.abs(np.asarray(logp_RT) - np.asarray(logp_behav_RT))[np.asarray(exact_RT)].astype(np.float64)
    nonzero = delta[delta > 0]
    counts = np.histogram(np.log10(np.clip(nonzero, 1e-10, 10.0)), bins=MISMATCH_EDGES)[0]
    return {"tokens": int(delta.size), "zero": int(delta.size - nonzero.size),
            "log10_edges": MISMATCH_EDGES.tolist(), "counts": counts.tolist()}


def correction_metrics(logp_old_RT, logp_behav_RT, mask_RT, cfg: GRPOConfig) -> dict:
    """correction/*: what the rollout correction did to the batch, over its sampled tokens (numpy,
    host side; logp_old_RT: the trainer's log-probs before the update, which update.py returns):
    token_reject_frac and seq_reject_frac (tokens, and sequences with tokens, that `rejected_tokens`
    took out of the loss), ess (effective sample size of the kept tokens' weights `is_weights`,
    (sum w)^2 / (n sum w^2): 1 when every weight is equal, 1/n when one token carries them all; 0 when
    none is kept), weight_mean over the kept tokens, and the spread of log rho = log pi_old -
    log pi_behav over every sampled token (log_ratio_std, log_ratio_min, log_ratio_max). {} when the
    batch has no sampled token."""
    m_RT = np.asarray(mask_RT) > 0
    if not m_RT.any():
        return {}
    w_RT = np.asarray(is_weights(logp_old_RT, logp_behav_RT, m_RT, cfg), np.float64)
    kept_RT = m_RT & ~np.asarray(rejected_tokens(logp_old_RT, logp_behav_RT, m_RT, cfg))
    log_rho = np.asarray(logp_old_RT, np.float64)[m_RT] - np.asarray(logp_behav_RT, np.float64)[m_RT]
    w = w_RT[kept_RT]
    rows_R = m_RT.any(axis=1)
    return {"correction/token_reject_frac": float(1.0 - kept_RT.sum() / m_RT.sum()),
            "correction/seq_reject_frac": float((rows_R & ~kept_RT.any(axis=1)).sum() / rows_R.sum()),
            "correction/ess": float(w.sum() ** 2 / (w.size * np.square(w).sum())) if w.size and w.any() else 0.0,
            "correction/weight_mean": float(w.mean()) if w.size else 0.0,
            "correction/log_ratio_std": float(log_rho.std()), "correction/log_ratio_min": float(log_rho.min()),
            "correction/log_ratio_max": float(log_rho.max())}


def batch_metrics(aux: dict, raw_BG, rewards_BG, adv_R, logp_behav_RT, mask_RT) -> dict:
    """The step's scalars about its batch (numpy, host side; the trainer logs them every step): the
    update's own (aux, from policy_loss: loss/*, policy/*), the rewards as the verifier gave them
    (raw_BG: reward/pass_frac, reward/partial_frac) and as shaped (rewards_BG: reward/mean, std, the
    share of groups with one reward), how the advantages treat right and wrong completions
    (adv/mean_right, adv/mean_wrong), the sampler's entropy estimate on the trained tokens
    (-mean log pi_behav) and the mean completion length."""
    names = {"loss": "loss/total", "pg_loss": "loss/pg", "kl_loss": "loss/kl"}
    raw_R, adv_R = np.asarray(raw_BG).reshape(-1), np.asarray(adv_R).reshape(-1)
    mask_RT, logp_behav_RT = np.asarray(mask_RT), np.asarray(logp_behav_RT)
    return {**{names.get(k, f"policy/{k}"): float(v) for k, v in aux.items()},
            "reward/mean": float(np.mean(rewards_BG)), "reward/std": float(np.std(rewards_BG)),
            "reward/frac_zero_var_groups": float(np.mean(np.ptp(rewards_BG, axis=1) == 0)),
            "reward/pass_frac": float(np.mean(raw_R >= 1.0)),
            "reward/partial_frac": float(np.mean((raw_R > 0) & (raw_R < 1))),
            **{f"adv/mean_{name}": float(adv_R[sel].mean()) for name, sel in
               (("right", raw_R >= 1.0), ("wrong", raw_R <= 0.0)) if sel.any()},
            "policy/entropy": float(-np.where(mask_RT > 0, logp_behav_RT, 0.0).sum() / max(mask_RT.sum(), 1)),
            "len/completion_mean": float(mask_RT.sum(1).mean())}


def mismatch_metrics(logp_behav_RT, logp_RT, mask_RT):
    """How far the trainer's log-probs are from what the sampler reported for the same tokens (docs/numerics.md).

    With d = logp_RT (trainer) - logp_behav_RT (sampler) over masked tokens: bitwise_frac = fraction with EXACT equality
    (compared in f32, which is exact for bf16/f32 inputs); max/mean |d|; k3_kl = mean(exp(d) - 1 - d), the
    k3 estimate of KL(sampler || trainer); max |exp(d) - 1|; fraction of exp(d) outside [0.5, 2]. exp()
    uses d clamped to [-20, 20]. With no tokens: bitwise_frac = 1 (nothing differs), the rest 0.
    """
    s_RT, t_RT = jnp.asarray(logp_behav_RT), jnp.asarray(logp_RT)
    if s_RT.ndim != 2:
        raise ValueError(f"logp_behav_RT must be 2-D (R, T); got shape {s_RT.shape}")
    _check_RT("logp_RT", t_RT, s_RT.shape)
    m_RT = jnp.asarray(mask_RT)
    _check_RT("mask_RT", m_RT, s_RT.shape)
    m_RT = m_RT.astype(bool)
    mf_RT = m_RT.astype(jnp.float32)
    n = jnp.sum(mf_RT)
    s_RT = jnp.where(m_RT, s_RT.astype(jnp.float32), 0.0)
    t_RT = jnp.where(m_RT, t_RT.astype(jnp.float32), 0.0)
    d_RT = t_RT - s_RT
    dc_RT = jnp.clip(d_RT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio_RT = jnp.exp(dc_RT)
    return {"bitwise_frac": jnp.where(n > 0, masked_mean(s_RT == t_RT, mf_RT), 1.0),
            "max_abs_logp_diff": jnp.max(jnp.where(m_RT, jnp.abs(d_RT), 0.0)),
            "mean_abs_logp_diff": masked_mean(jnp.abs(d_RT), mf_RT),
            "k3_kl": masked_mean(jnp.expm1(dc_RT) - dc_RT, mf_RT),
            "max_abs_ratio_minus_1": jnp.max(jnp.where(m_RT, jnp.abs(ratio_RT - 1.0), 0.0)),
            "frac_ratio_outside_0.5_2": masked_mean((ratio_RT < 0.5) | (ratio_RT > 2.0), mf_RT),
            "num_tokens": n}
