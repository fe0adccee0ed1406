"""grpo_config.py: which variant of the GRPO update a run chooses (GRPOConfig), and the choices it has.

Test: python -m pytest -q tests/test_grpo.py -k config

grpo.py computes the update from these settings (the functions named in the fields' docs are its,
unless another module is named); objectives.py holds the pass@k objectives some of them select. A
setting is checked when the config is made, so a bad value fails at startup with its field's name,
never deep inside a jitted step. The trainer's command line has a flag per field (cli.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ADVANTAGES = ("grpo", "drgrpo", "rloo", "reinforce", "passk", "nsr", "w_reinforce")
SIGNED_ADVANTAGES = ("nsr", "w_reinforce")  # no baseline: the sign of (2r - 1) is the advantage's
COV_PENALTIES = ("none", "clip_cov", "kl_cov")
POLICY_LOSSES = ("ppo", "gspo")
LOSS_AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
KL_ESTIMATORS = ("k1", "k2", "k3")
IS_CORRECTIONS = ("none", "tis", "seq_tis", "token_mask", "seq_mask", "icepop")
REJECTING_CORRECTIONS = ("token_mask", "seq_mask", "icepop")  # the is_correction choices that reject tokens


def is_int(x) -> bool:
    """An integer setting: a Python or numpy int, never a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def is_real(x) -> bool:
    """A real setting: a finite Python or numpy number, never a bool."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class GRPOConfig:
    """Which variant of the policy-gradient update to run; paper symbols in each field's doc."""

    group_size: int = 8
    """G: completions sampled per prompt (GRPO Alg. 1). >= 2 for every group baseline, >= 1 for reinforce."""
    advantage: str = "grpo"
    """grpo: (r - mean_G)/(std_G + eps); drgrpo: r - mean_G; rloo: r_i - mean_{j!=i} r_j; reinforce: r - mean_batch;
    passk: the Pass@k Training advantage (Chen et al. 2025, `objectives.passk_advantages`); nsr / w_reinforce: negative
    sample reinforcement and its weighted form (Zhu et al. 2025, `objectives.signed_advantages`)."""
    pass_k: int = 4
    """k of Pass@k Training (advantage=passk): a group's reward is the max reward of k of its G
    completions, averaged over all C(G, k) subsets; 1 <= k <= G (k = 1 is GRPO's advantage exactly)."""
    positive_weight: float = 0.1
    """lambda of W-REINFORCE (advantage=w_reinforce, Zhu et al. 2025 use 0.1): a right completion's
    advantage, a wrong one's being -1; NSR is lambda = 0 (advantage=nsr ignores this field)."""
    adv_eps: float = 1e-6
    """eps in the GRPO std division; > 0 (a zero-variance group gets A = 0 exactly regardless)."""
    policy_loss: str = "ppo"
    """ppo: token-level clipped surrogate; gspo: sequence-level, length-normalised ratio (Zheng et al. 2025)."""
    clip_eps_low: float = 0.2
    """epsilon_low: the ratio is clipped below at 1 - epsilon_low; in (0, 1). GSPO's paper uses 3e-4."""
    clip_eps_high: float = 0.28
    """epsilon_high: the ratio is clipped above at 1 + epsilon_high (DAPO clip-higher: 0.28). GSPO's paper: 4e-4."""
    dual_clip_c: float | None = None
    """c of dual-clip PPO (Ye et al. 2020): for A < 0 the loss is capped at -c*A; None = off; must be > 1."""
    loss_agg: str = "token_mean"
    """token_mean (DAPO) | seq_mean_token_mean (GRPO) | seq_mean_token_sum_norm (Dr. GRPO, / (R * max_len))."""
    max_len: int = 0
    """L_max: the generation budget in completion tokens (not prompt + completion); Dr. GRPO's constant
    normaliser and DAPO's overlong limit; set it to the sampler's max new tokens; 0 = unset."""
    kl_beta: float = 0.0
    """beta: weight of the KL(pi || pi_ref) penalty in the loss; 0 skips the reference policy entirely."""
    kl_estimator: str = "k3"
    """k1 | k2 | k3 (Schulman 2020); GRPO uses k3 (Shao et al. 2024)."""
    is_correction: str = "tis"
    """Off-policy weight on rho_t = pi_old/pi_behav (`is_weights`): none | tis (min(rho_t, C)) | seq_tis
    (min(rho_i, C), rho_i = prod_t rho_t over sequence i) | token_mask (rho_t; tokens outside [1/C, C]
    rejected) | seq_mask (rho_i; sequences outside [1/C, C] rejected) | icepop (rho_t; tokens outside
    [icepop_low, icepop_high] rejected). Rejected tokens leave the loss, numerator and denominator."""
    is_cap: float = 2.0
    """C: TIS truncation (Yao et al. 2025 use 2); the masks keep [1/C, C] inclusive; >= 1 (> 1 for masks)."""
    icepop_low: float = 0.5
    """alpha of IcePop (is_correction=icepop): tokens with rho_t < alpha are rejected; in (0, 1]."""
    icepop_high: float = 5.0
    """beta of IcePop: tokens with rho_t > beta are rejected; >= 1."""
    geo_reject: bool = False
    """Geometric-mean rejection, with any is_correction: a sequence whose exp(mean_t log rho_t) lies
    outside [geo_low, geo_high] is rejected whole (verl's geometric rejection sampling)."""
    geo_low: float = 0.999
    """lower bound of the geometric-mean ratio a sequence keeps (--geo-reject); in (0, 1]."""
    geo_high: float = 1.001
    """upper bound of the geometric-mean ratio a sequence keeps (--geo-reject); >= 1."""
    veto_ratio: float = 0.0
    """Veto, with any is_correction: a sequence holding any token with rho_t < this is rejected whole
    (a catastrophic token: the sampler was far surer than the trainer); 0 = off; in [0, 1)."""
    overlong_buffer_len: int = 0
    """L_cache of DAPO's soft overlong punishment; 0 = off; needs 0 < L_cache <= max_len."""
    overlong_penalty_factor: float = 1.0
    """Scale of the overlong punishment (DAPO: 1.0); the reward drops linearly to -factor over the buffer."""
    overlong_filter: bool = False
    """DAPO overlong filtering: give truncated completions zero loss weight (see `overlong_mask`)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose G rewards are all equal, up to 4 x B looked at (`keep_group`)."""
    cov_penalty: str = "none"
    """Restrain the tokens whose log-prob covaries most with their advantage, which drive the entropy
    collapse (Cui et al. 2025, `objectives.covariance_tokens`): none | clip_cov (detach the gradient of a random
    r of the tokens with omega_low <= Cov <= omega_high) | kl_cov (add beta |log pi - log pi_old| to the top-k of Cov)."""
    cov_clip_frac: float = 2e-4
    """r of Clip-Cov: the share of the (micro)batch's tokens detached (at least one); Cui et al. use 2e-4
    on batches of millions of tokens."""
    cov_clip_low: float = 1.0
    """omega_low of Clip-Cov: tokens with Cov below it are never detached (Cui et al.: 1)."""
    cov_clip_high: float = 5.0
    """omega_high of Clip-Cov: tokens with Cov above it are never detached (Cui et al.: 5)."""
    cov_kl_frac: float = 2e-3
    """k of KL-Cov: the share of the (micro)batch's tokens, largest Cov first, that get the KL term (at least one)."""
    cov_kl_coef: float = 1.0
    """beta of KL-Cov (Cui et al.: 1). The term is 0 with gradient 0 where pi = pi_old, i.e. at the
    batch's first optimizer step: it acts from the second (--minibatches or --ppo-epochs > 1)."""

    def __post_init__(self):
        def bad(field, why):
            raise ValueError(f"GRPOConfig.{field}={getattr(self, field)!r}: {why}")

        for name, allowed in (("advantage", ADVANTAGES), ("policy_loss", POLICY_LOSSES),
                              ("loss_agg", LOSS_AGGS), ("kl_estimator", KL_ESTIMATORS),
                              ("is_correction", IS_CORRECTIONS)):
            if getattr(self, name) not in allowed:
                bad(name, f"must be one of {allowed}")
        if not is_int(self.group_size) or self.group_size < 1:
            bad("group_size", "must be an int >= 1")
        if self.advantage not in ("reinforce",) + SIGNED_ADVANTAGES and self.group_size < 2:
            bad("group_size", f"advantage={self.advantage!r} needs a group baseline, so G >= 2")
        if self.advantage == "passk" and (not is_int(self.pass_k) or not 1 <= self.pass_k <= self.group_size):
            bad("pass_k", f"must be an int in 1..group_size ({self.group_size})")
        if not is_real(self.positive_weight) or self.positive_weight < 0:
            bad("positive_weight", "must be a finite number >= 0")
        if self.cov_penalty not in COV_PENALTIES:
            bad("cov_penalty", f"must be one of {COV_PENALTIES}")
        for name in ("cov_clip_frac", "cov_kl_frac"):
            if not is_real(getattr(self, name)) or not 0 < getattr(self, name) <= 1:
                bad(name, "must be a share of the tokens in (0, 1]")
        if not (is_real(self.cov_clip_low) and is_real(self.cov_clip_high)) or self.cov_clip_low > self.cov_clip_high:
            bad("cov_clip_low", f"must be finite and <= cov_clip_high ({self.cov_clip_high})")
        if not is_real(self.cov_kl_coef) or self.cov_kl_coef < 0:
            bad("cov_kl_coef", "must be a finite number >= 0")
        if not is_real(self.adv_eps) or self.adv_eps <= 0:
            bad("adv_eps", "must be a finite number > 0")
        if not is_real(self.clip_eps_low) or not 0 < self.clip_eps_low < 1:
            bad("clip_eps_low", "must be in (0, 1) so that 1 - eps_low is a positive ratio")
        if not is_real(self.clip_eps_high) or self.clip_eps_high <= 0:
            bad("clip_eps_high", "must be a finite number > 0")
        if self.dual_clip_c is not None and (not is_real(self.dual_clip_c) or self.dual_clip_c <= 1):
            bad("dual_clip_c", "must be None or a finite number > 1 (Ye et al. 2020)")
        if not is_int(self.max_len) or self.max_len < 0:
            bad("max_len", "must be an int >= 0")
        if self.loss_agg == "seq_mean_token_sum_norm" and self.max_len <= 0:
            bad("max_len", "loss_agg='seq_mean_token_sum_norm' (Dr. GRPO) needs the constant max_len > 0")
        if not is_real(self.kl_beta) or self.kl_beta < 0:
            bad("kl_beta", "must be a finite number >= 0")
        if not is_real(self.is_cap) or self.is_cap < 1:
            bad("is_cap", "must be a finite number >= 1")
        if self.is_correction in ("token_mask", "seq_mask") and self.is_cap <= 1:
            bad("is_cap", "the masked corrections keep [1/C, C], which needs C > 1")
        self._check_rejection_bands(bad)
        if not is_int(self.overlong_buffer_len) or self.overlong_buffer_len < 0:
            bad("overlong_buffer_len", "must be an int >= 0")
        if self.overlong_buffer_len > 0 and not 0 < self.overlong_buffer_len <= self.max_len:
            bad("overlong_buffer_len", f"needs 0 < L_cache <= max_len (max_len={self.max_len})")
        if not is_real(self.overlong_penalty_factor) or self.overlong_penalty_factor < 0:
            bad("overlong_penalty_factor", "must be a finite number >= 0")
        if (self.overlong_filter or self.overlong_buffer_len > 0) and self.max_len <= 0:
            bad("max_len", "the overlong filter/penalty needs max_len > 0")

    def _check_rejection_bands(self, bad):
        """The rollout correction's bands each hold ratio 1 (a sampler equal to the trainer rejects nothing)."""
        if not is_real(self.icepop_low) or not 0 < self.icepop_low <= 1:
            bad("icepop_low", "must be in (0, 1] (IcePop's alpha: the band [alpha, beta] holds rho = 1)")
        if not is_real(self.icepop_high) or self.icepop_high < 1:
            bad("icepop_high", "must be a finite number >= 1 (IcePop's beta)")
        if not is_real(self.geo_low) or not 0 < self.geo_low <= 1:
            bad("geo_low", "must be in (0, 1] (the band [geo_low, geo_high] holds ratio 1)")
        if not is_real(self.geo_high) or self.geo_high < 1:
            bad("geo_high", "must be a finite number >= 1")
        if not is_real(self.veto_ratio) or not 0 <= self.veto_ratio < 1:
            bad("veto_ratio", "must be in [0, 1): 0 = off, else a ratio below 1")

    @property
    def rejects(self) -> bool:
        """Whether a rollout correction may reject tokens (then the loss's denominators are known only
        after the forward that gives pi_old: see `rejected_tokens` and `kept_denominator`)."""
        return self.is_correction in REJECTING_CORRECTIONS or self.geo_reject or self.veto_ratio > 0
