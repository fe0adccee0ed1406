"""objectives.py: the objectives that keep pass@k, and pass@k itself, as pure functions (no I/O).

Test: python -m pytest -q tests/test_grpo.py -k "passk or signed or nsr or cov or draws or pass_at_k"

grpo.py composes the GRPO update; this file holds what a run chooses instead of its defaults when
pass@k matters more than pass@1 (docs/results.md measures them here), and the unbiased pass@k the
evaluation reports:
  - `passk_advantages`: Pass@k Training's advantage (advantage=passk), from `passk_weights`.
  - `signed_advantages`: NSR and W-REINFORCE (advantage=nsr / w_reinforce).
  - `covariance_tokens`: Clip-Cov and KL-Cov's token selection (cov_penalty), from `token_covariance`
    and, for Clip-Cov, the layout-independent draws of `token_draws`.
  - `pass_at_k`, `pass_at_k_array`: the unbiased pass@k estimator, one problem or many; `eval_metrics`,
    the trainer's eval/* from them.

Sources: pass@k: Chen et al. 2021 (Codex, arXiv:2107.03374, eq. 1 and its numerically stable form).
Pass@k Training: Chen et al. 2025 (arXiv:2508.10751). NSR and W-REINFORCE: Zhu et al. 2025
(arXiv:2506.01347). Clip-Cov and KL-Cov: Cui et al. 2025 (arXiv:2505.22617).

Shape key (suffixes of names), as in grpo.py: B prompts, G group size (completions per prompt),
R rows (one per completion: B x G), T token positions, N problems (pass@k) or tokens (a flat list).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from grpo_config import GRPOConfig, is_int, is_real


def masked_mean(x_RT, m_RT):
    """Sum of x over the mask / number of mask tokens; 0 when the mask is empty (grpo.py's loss
    metrics use it too)."""
    return jnp.sum(x_RT * m_RT) / jnp.maximum(jnp.sum(m_RT), 1.0)


# ----------------------------------------------------------------------------------------------------
# Advantages that keep pass@k (one row per prompt, G completions each)

def _comb(n: int, k: int) -> int:
    return math.comb(n, k) if 0 <= k <= n else 0


def passk_weights(G: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(v_G, W_GG) for `passk_advantages`, over a group's rewards sorted ascending (0-based positions):
    v[j] = C(j, k-1) / C(G, k): the share of the k-subsets whose max is the j-th smallest reward (ties
    go to the later position; the max's VALUE is the same either way);
    W[p, j] = the share of the k-subsets holding position p whose max is position j: C(p, k-1) / C(G-1, k-1)
    for j = p (the other k-1 all below p), C(j-1, k-2) / C(G-1, k-1) for j > p, 0 for j < p. Rows sum to 1."""
    v_G = np.array([_comb(j, k - 1) for j in range(G)], np.float64) / _comb(G, k)
    W_GG = np.zeros((G, G), np.float64)
    for p in range(G):
        W_GG[p, p] = _comb(p, k - 1)
        for j in range(p + 1, G):
            W_GG[p, j] = _comb(j - 1, k - 2)
    return v_G, W_GG / _comb(G - 1, k - 1)


def passk_advantages(rewards_BG, k: int, eps: float = 1e-6):
    """Pass@k Training's advantage (Chen et al. 2025, "Pass@k Training for Adaptively Balancing
    Exploration and Exploitation of Large Reasoning Models", arXiv:2508.10751, analytical form), f32.

    Split a group of G completions into every k-subset S (C(G, k) of them); the subset's reward is
    max_{i in S} r_i (with 0/1 rewards: 1 if any of the k passes, i.e. pass@k); normalise the subset
    rewards over the subsets, A_S = (R_S - mean_S R) / (std_S R + eps) (population std); a completion's
    advantage is the mean A_S over the C(G-1, k-1) subsets that hold it. In closed form, with
    R_bar = mean_S R_S, sigma = std_S R_S and m_i = mean_{S ni i} R_S:   A_i = (m_i - R_bar) / (sigma + eps).
    With 0/1 rewards and N_neg wrong completions this is the paper's result:
        R_bar = 1 - C(N_neg, k) / C(G, k),   sigma = sqrt(R_bar (1 - R_bar)),
        A_pos = (1 - R_bar) / sigma,         A_neg = (1 - R_bar - C(N_neg - 1, k - 1) / C(G - 1, k - 1)) / sigma.
    Any rewards work (not only 0/1): the means over subsets come from the sorted rewards with the fixed
    weights of `passk_weights`. A wrong completion in a group that some other completion solves gets a
    smaller penalty than under GRPO (most of its subsets pass anyway): the policy is pushed less towards
    one answer. A group whose every k-subset has the same max (all equal, or its G - k + 1 best equal)
    gets A = 0 exactly. k = 1 is GRPO's advantage."""
    r_BG = jnp.asarray(rewards_BG, jnp.float32)
    B, G = r_BG.shape
    if not is_int(k) or not 1 <= k <= G:
        raise ValueError(f"passk_advantages: k={k!r} must be an int in 1..G={G}")
    v_G, W_GG = (jnp.asarray(x, jnp.float32) for x in passk_weights(G, k))
    order_BG = jnp.argsort(r_BG, axis=1, stable=True)
    s_BG = jnp.take_along_axis(r_BG, order_BG, axis=1)              # ascending
    mean_B1 = (s_BG @ v_G)[:, None]                                  # R_bar
    var_B1 = jnp.maximum((jnp.square(s_BG) @ v_G)[:, None] - jnp.square(mean_B1), 0.0)
    m_sorted_BG = s_BG @ W_GG.T                                      # m_i at sorted position p
    adv_sorted_BG = (m_sorted_BG - mean_B1) / (jnp.sqrt(var_B1) + eps)
    adv_BG = jnp.zeros_like(r_BG).at[jnp.arange(B)[:, None], order_BG].set(adv_sorted_BG)
    constant_B1 = s_BG[:, k - 1:k] == s_BG[:, -1:]                   # every subset's max is the same value
    return jnp.where(constant_B1, 0.0, adv_BG)


def signed_advantages(rewards_BG, positive_weight: float):
    """NSR and W-REINFORCE (Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in
    LLM Reasoning", arXiv:2506.01347), f32. Their rewards are +1 / -1 and their objective
    lambda * L_PSR + L_NSR is REINFORCE without a baseline, positive samples weighted by lambda: with our
    rewards r in [0, 1] mapped to rho = 2r - 1,
        A_i = lambda * rho_i  if rho_i > 0,   rho_i  otherwise
    (0/1 rewards: lambda for a right completion, -1 for a wrong one). NSR is lambda = 0: only wrong
    completions are trained on, their probability pushed down and spread over the other tokens, which
    keeps the model's other answers (its pass@k); W-REINFORCE (lambda = 0.1 in the paper) adds a little
    of the positive signal. No group baseline: a group whose completions all fail is still pushed down."""
    if not is_real(positive_weight) or positive_weight < 0:
        raise ValueError(f"signed_advantages: positive_weight={positive_weight!r} must be a finite number >= 0")
    rho_BG = 2.0 * jnp.asarray(rewards_BG, jnp.float32) - 1.0
    return jnp.where(rho_BG > 0, positive_weight * rho_BG, rho_BG)


# ----------------------------------------------------------------------------------------------------
# Clip-Cov and KL-Cov: the tokens whose update is restrained (one row per completion)

def token_covariance(logp_RT, adv_R, mask_RT):
    """Cov_t = (log pi(y_t) - mean log pi) * (A_t - mean A) per token, the means over the masked tokens
    of the (micro)batch (Cui et al. 2025, eq. 11's per-token terms), stop-gradient, f32; 0 on padding.
    A_t is its completion's advantage. A large positive Cov marks a token that is both likely and
    rewarded (or unlikely and penalised): the updates that sharpen the policy and collapse its entropy."""
    m_RT = jnp.asarray(mask_RT).astype(bool)
    mf_RT = m_RT.astype(jnp.float32)
    logp_RT = jax.lax.stop_gradient(jnp.where(m_RT, jnp.asarray(logp_RT, jnp.float32), 0.0))
    adv_RT = jnp.where(m_RT, jnp.asarray(adv_R, jnp.float32)[:, None], 0.0)
    cov_RT = (logp_RT - masked_mean(logp_RT, mf_RT)) * (adv_RT - masked_mean(adv_RT, mf_RT))
    return jnp.where(m_RT, cov_RT, 0.0)


def _nth_largest(x_N, n):
    """The n-th largest of x (n >= 1, traced or not)."""
    return jnp.sort(x_N)[::-1][n - 1]


def covariance_tokens(logp_RT, adv_R, mask_RT, cfg: GRPOConfig, draw_RT=None):
    """Step 4b's token selection (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for
    Reasoning Language Models", arXiv:2505.22617, section 4): a bool [B, T], True on the tokens whose
    update is restrained. N = masked tokens of the (micro)batch, Cov = `token_covariance`:
      clip_cov: max(1, floor(r N)) tokens drawn uniformly from those with omega_low <= Cov <= omega_high
                (fewer if fewer are there): the candidates with the largest `draw_RT` (a uniform in
                [0, 1) per token, `token_draws`); their gradient is detached.
      kl_cov:   the max(1, floor(k N)) tokens of largest Cov (ties at the threshold all count); they get
                beta |log pi - log pi_old| added to their loss.
    The shares and the means in Cov are of the tokens the loss sees at once: with gradient accumulation,
    of a microbatch. The draw is not: `token_draws` gives each token a uniform from its own row and
    position, so a row's tokens get the same draws in any layout (packed or fixed, any neighbours)."""
    m_RT = jnp.asarray(mask_RT).astype(bool)
    if cfg.cov_penalty == "none":
        return jnp.zeros(m_RT.shape, bool)
    cov_RT = token_covariance(logp_RT, adv_R, m_RT)
    n_tokens = jnp.sum(m_RT)
    if cfg.cov_penalty == "kl_cov":
        n = jnp.maximum(jnp.floor(cfg.cov_kl_frac * n_tokens).astype(jnp.int32), 1)
        threshold = _nth_largest(jnp.where(m_RT, cov_RT, -jnp.inf).reshape(-1), n)
        return m_RT & (cov_RT >= threshold)
    if draw_RT is None:
        raise ValueError("cov_penalty='clip_cov' draws its tokens at random: pass draw_RT (token_draws)")
    if jnp.shape(draw_RT) != m_RT.shape:
        raise ValueError(f"draw_RT has shape {jnp.shape(draw_RT)}; expected the mask's {m_RT.shape}")
    n = jnp.maximum(jnp.floor(cfg.cov_clip_frac * n_tokens).astype(jnp.int32), 1)
    candidate_RT = m_RT & (cov_RT >= cfg.cov_clip_low) & (cov_RT <= cfg.cov_clip_high)
    # a uniform random order of the candidates: the n with the largest draws (others get -1)
    u_RT = jnp.where(candidate_RT, jnp.asarray(draw_RT, jnp.float32), -1.0)
    threshold = _nth_largest(u_RT.reshape(-1), n)
    return candidate_RT & (u_RT >= threshold)


def token_draws(tokens_RT, mask_RT):
    """Clip-Cov's draw: a uniform in [0, 1) per token, f32 [B, T], that depends only on the token's row
    and its position in it, so the same row gives the same draws in any layout of the update (cut to
    any length past its last completion token, next to any rows, in any order). Row b's key is folded
    from a hash of its tokens up to its real length (the position after its last mask-1 token, where
    packing.pack_batch cuts it); position t's draw is a uniform from that key folded with t. Different
    rows give other draws, the same row the same ones (a rerun repeats it). jit-able."""
    t_RT = jnp.asarray(tokens_RT).astype(jnp.uint32)
    m_RT = jnp.asarray(mask_RT) > 0
    pos_T = jnp.arange(t_RT.shape[1], dtype=jnp.uint32)
    # real_RT: t is at or before the row's last mask-1 position (all False on a row with none)
    real_RT = jnp.cumsum(m_RT[:, ::-1], axis=1)[:, ::-1] > 0
    hash_R = jnp.sum(jnp.where(real_RT, t_RT * (pos_T * jnp.uint32(2654435761) + jnp.uint32(1)), jnp.uint32(0)),
                     axis=1, dtype=jnp.uint32)
    base = jax.random.PRNGKey(0)

    def row(h):
        key = jax.random.fold_in(base, h)
        return jax.vmap(lambda t: jax.random.uniform(jax.random.fold_in(key, t)))(pos_T)

    return jax.vmap(row)(hash_R)


# ----------------------------------------------------------------------------------------------------
# Evaluation: unbiased pass@k (Chen et al. 2021)

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    Chen et al. 2021 (Codex paper, Fig. 3) evaluate it as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never
    forms the huge binomials; if n - c < k every k-subset holds a correct sample and pass@k = 1.
    """
    for name, v in (("n", n), ("c", c), ("k", k)):
        if not is_int(v):
            raise ValueError(f"pass_at_k: {name}={v!r} must be an int")
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_at_k_array(n_N, c_N, k: int) -> np.ndarray:
    """pass_at_k for arrays of (n, c) pairs (e.g. one per problem), vectorised in numpy, float64.

    Row j multiplies (1 - k/i) over i = n_j - c_j + 1 .. n_j, padded with factors of 1 to max(c).
    """
    n_N = np.asarray(n_N)
    c_N = np.asarray(c_N)
    if n_N.shape != c_N.shape or n_N.ndim != 1:
        raise ValueError(f"pass_at_k_array needs 1-D n and c of one shape; got {n_N.shape}, {c_N.shape}")
    if not (np.issubdtype(n_N.dtype, np.integer) and np.issubdtype(c_N.dtype, np.integer)) and n_N.size:
        raise ValueError("pass_at_k_array: n and c must be integer arrays")
    if not is_int(k) or k < 1 or np.any(c_N < 0) or np.any(c_N > n_N) or np.any(n_N < k):
        raise ValueError(f"pass_at_k_array needs 0 <= c <= n and 1 <= k <= n elementwise; got k={k!r}")
    if n_N.size == 0:
        return np.zeros((0,), np.float64)
    j_C = np.arange(int(c_N.max()))
    i_NC = (n_N - c_N + 1)[:, None] + j_C[None, :]
    factor_NC = np.where(j_C[None, :] < c_N[:, None], 1.0 - k / np.maximum(i_NC, 1), 1.0)
    return np.where(n_N - c_N < k, 1.0, 1.0 - np.prod(factor_NC, axis=1))


def eval_metrics(correct_N, n: int, greedy_N=()) -> dict:
    """The trainer's eval/* numbers: pass@1 and pass@min(8, n) (pass_at_k_array) over problems of which
    correct_N[i] of n samples passed, how many problems, and greedy_pass@1, the mean of greedy_N (1 where
    a problem's one greedy completion passed), when there is one."""
    c_N = np.asarray(correct_N, np.int64)
    n_N, k = np.full_like(c_N, n), min(8, n)
    return {"eval/pass@1": float(pass_at_k_array(n_N, c_N, 1).mean()),
            f"eval/pass@{k}": float(pass_at_k_array(n_N, c_N, k).mean()), "eval/problems": len(c_N),
            **({"eval/greedy_pass@1": float(np.mean(greedy_N))} if len(greedy_N) else {})}
