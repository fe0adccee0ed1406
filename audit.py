"""Tokens only the policy would sample: the trainer's audit of each rollout a worker sends.

The verifier's seal (attest.py) makes a reward the verifier's verdict of a completion's *text*; the
trainer learns from *tokens* and their behaviour log-probs. These checks bind the two, cheapest first:

1. The prompt and the text, every rollout: each row starts with the item's prompt as the trainer's own
   tokenizer encodes it, its completion is one run of masked tokens right after it, and those tokens
   decode to the text the verifier scored. (The worker cut and decoded exactly so: sampler.cut_completions.)
2. The log-probs, on audited rows: the trainer's forward (update.Update.logp_fn, the one that computes pi_old)
   at the weights that sampled the row must give the log-probs the worker reported, bit for bit, because
   the sampler and the trainer compute the same bits (model.py's precision policy, `--bf16-fix`).
3. The tokens, on the same rows: drawn again from their keys (sampler.row_keys: the item id, the version,
   the run's seed, which the trainer puts in the item so no worker chooses it) they must be the same
   tokens, over the row's length (a row the worker's budget ended early is a prefix of the draw).

Which training rollouts get 2 and 3 is the trainer's own random draw (--audit-frac) when each arrives: a
worker cannot know in advance. (Evaluation rollouts get check 1 and the seal: they are never trained on,
and their sampling settings, greedy for one, are not the training forward's.) They need the weights of the version that sampled the rows: the trainer audits
the rows of its current version, one version per row, sampled whole (no in-flight swaps), and only a
policy on one device (a trainer sharded over a mesh computes the same values in another order). Rows it
cannot audit this way still get check 1 and the seal. For int8 workers (SAMPLER_QUANT) the log-probs
are not the trainer's bits: --audit-logp-tol is then the largest mean |delta log p| allowed, and the
tokens are not drawn again. What each check costs: bench/bench_audit.py.
"""

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import lifecycle
import sampler
from verdicts import INFRA_ERROR


def completion_span(mask_T: np.ndarray, prompt_len: int) -> tuple[int, int] | None:
    """(start, n) of the row's completion: the masked tokens, one run starting right after the prompt;
    None if the mask is anything else."""
    n = int((mask_T > 0).sum())
    if n and not (mask_T[prompt_len:prompt_len + n] > 0).all():
        return None
    return prompt_len, n


def check_texts(rollout, prompt_ids: list, decode: Callable[[list], str]) -> str:
    """Check 1: why the rollout's tokens are not its prompt and its texts, or ""."""
    p = rollout.prompt_len
    if p != len(prompt_ids):
        return f"prompt of {p} tokens, the item's is {len(prompt_ids)}"
    for g in range(len(rollout.rewards_G)):
        if rollout.statuses[g] == INFRA_ERROR:
            continue  # never trained on; a worker that failed reports no tokens
        if rollout.tokens_GT[g, :p].tolist() != prompt_ids:
            return f"row {g}: its prompt tokens are not the item's prompt"
        span = completion_span(rollout.mask_GT[g], p)
        if span is None:
            return f"row {g}: its masked tokens are not one completion after the prompt"
        if g < len(rollout.texts) and decode(rollout.tokens_GT[g, p:p + span[1]].tolist()) != rollout.texts[g]:
            return f"row {g}: its tokens do not decode to the completion the verifier scored"
    return ""


def check_logprobs(rollout, logp_GT: np.ndarray, tol: float) -> str:
    """Check 2: the trainer's log-probs logp_GT against the reported ones, on the completion tokens:
    equal bit for bit (tol 0), or within a mean |delta| of tol."""
    m = rollout.mask_GT > 0
    ours, theirs = np.asarray(logp_GT, np.float32)[m], rollout.logp_behav_GT[m]
    if tol == 0:
        bad = int((ours != theirs).sum())
        return f"{bad} of {int(m.sum())} log-probs differ from the policy's" if bad else ""
    delta = float(np.abs(ours - theirs).mean()) if m.any() else 0.0
    return f"mean |delta log p| {delta:.4g} is above {tol:g}" if delta > tol else ""


def check_tokens(rollout, drawn_GT: np.ndarray) -> str:
    """Check 3: each row's completion tokens equal the same positions of the row drawn again."""
    p = rollout.prompt_len
    for g in range(len(rollout.rewards_G)):
        span = completion_span(rollout.mask_GT[g], p)
        if span and not np.array_equal(rollout.tokens_GT[g, p:p + span[1]], drawn_GT[g, p:p + span[1]]):
            return f"row {g}: the policy draws other tokens from this row's key"
    return ""


def auditable(rollout, version: int) -> bool:
    """Whether the trainer at `version` holds the weights that sampled every token of the rollout."""
    return (rollout.version == version and rollout.inflight == lifecycle.OFF and not rollout.env_stats
            and (not rollout.versions_GT.size or bool((rollout.versions_GT[rollout.mask_GT > 0] == version).all())))


@dataclass
class Auditor:
    """The trainer's checks (the module docstring). `logprobs(tokens_GT)` and `params()` are the trainer's
    at its current version (None: checks 2 and 3 off); `eos_of(stop)` the ids that end a row, as the
    worker computes them; `rng` the trainer's own draw of which rollouts to audit."""
    frac: float
    logp_tol: float
    tokenizer: object
    mcfg: object
    pad_id: int
    eos_of: Callable[[tuple], tuple]
    logprobs: Callable | None
    params: Callable | None
    rng: np.random.Generator
    counts: dict = field(default_factory=lambda: {"audited": 0, "forged": 0})

    def check(self, rollout, item, version: int) -> str:
        """Why the rollout is forged, or "". item: the work item it answers (wire.WorkItem)."""
        if item.env:
            return ""  # multi-turn rows interleave observations: the seal covers the final text
        why = check_texts(rollout, self.tokenizer.encode(item.prompt), self.tokenizer.decode)
        if not why and self.logprobs is not None and not rollout.eval and auditable(rollout, version) \
                and not any(s == INFRA_ERROR for s in rollout.statuses) and self.rng.random() < self.frac:
            self.counts["audited"] += 1
            why = check_logprobs(rollout, self.logprobs(rollout.tokens_GT), self.logp_tol)
            if not why and self.logp_tol == 0:
                why = check_tokens(rollout, self.draw(rollout, item, version))
        self.counts["forged"] += bool(why)
        return why

    def draw(self, rollout, item, version: int) -> np.ndarray:
        """The rollout's rows drawn again: the item's prompt, its keys at `version`, its settings."""
        G = len(rollout.rewards_G)
        prompt_RT, prompt_len_R = sampler.build_prompts([item], self.tokenizer, G, self.pad_id)
        keys = sampler.row_keys(item.seed, [item], version, G)
        seq_len, max_new, temperature, top_p, stop = sampler.settings(item)
        out = sampler.generate(self.params(), self.mcfg, prompt_RT, prompt_len_R, keys, max_new_tokens=max_new,
                               temperature=temperature, top_p=top_p, eos_id=self.eos_of(stop),
                               pad_id=self.pad_id, version=version)
        return out.tokens_RT
