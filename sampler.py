"""sampler.py: completions sampled from the decoder (model.py) with a KV cache, and the rows they are for.

What is here, top to bottom:
  1. The KV cache and one decode step (decode_step): one token per row through model.py's per-layer
     pieces, its K/V written into a full-length cache.
  2. Drawing a token (draw: inverse-CDF sampling, top-p), the stop ids that end a row (MAX_STOP_IDS,
     stop_ids, ends_row), and one PRNG key per row (keys_per_row).
  3. Samples: the one record of sampled rows that every sampling path returns (tokens, behaviour
     log-probs, the weight version of each token, completion lengths, whether a row ended on a stop
     id), laid out as a rollout carries them (wire.Rollout).
  4. generate(...): R rows in one batch, decoded until the slowest is done, whose reported log-probs
     equal model.token_logprobs bit for bit (model.py's PRECISION POLICY).
  5. The rows of work items (inference_worker.py and curate.py sample the same way): settings,
     build_prompts, row_keys, row_budgets, eos_for, cut_completions (what each row's text is scored by
     is its environment's: envs.score_jobs).

Continuous batching (a fixed number of decode slots kept busy, and new weights swapped in between decode
steps) is continuous.py: it drives this file's decode_step and draw with device state of its own (the
Slots engine). Together the two would be about 800 lines: each reads better on its own, and a reader of
generate need not read the engine.

Shape key: as model.py's (R rows, T time, S time of the keys, K kv heads, H head dim, V vocab, L layers).

Run the tests:  python -m pytest -q tests/test_model.py tests/test_continuous_batching.py
Benchmark:      python bench/bench_generate.py
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

import wire
import workitems
from model import (MIN_CHUNK, MIN_DECODE_ROWS, ModelConfig, attention, check_tokens, embed_tokens, hidden,
                   layer_out, layer_params, layer_qkv, next_token_logprobs, rope_table)

# ----------------------------------------------------------------------------- 1. the KV cache


def cache_bits(x):
    """bf16 -> its uint16 bits (the decode cache's storage type), other dtypes unchanged."""
    return jax.lax.bitcast_convert_type(x, jnp.uint16) if x.dtype == jnp.bfloat16 else x


def _write_slot(cache_RKSH, rows_R, pos_R, new_RKH):
    """cache[b, :, pos_R[b]] = new[b], in place. A bf16 cache lives in the while loop as uint16 bits:
    XLA:CPU has no bf16 scatter and otherwise converts the whole cache to f32 and back around it, every
    layer, every step (measured: that conversion was most of a decode step)."""
    return cache_RKSH.at[rows_R, :, pos_R].set(cache_bits(new_RKH))


def decode_step(params: dict, cfg: ModelConfig, cache, tok_R, pos_R):
    """One token per row at per-row position pos_R: scatters its K/V into the full-length cache (a tuple
    of L arrays [R, K, T, H] each, updated in place inside the while loop) and attends over all T slots
    with slots > pos masked out (PRECISION POLICY (d)). The layers are unrolled here (no scan): that
    lets XLA update each cache buffer in place. Returns (cache, x_RD), x_RD the final residual."""
    k_cache, v_cache = cache
    R, T = k_cache[0].shape[0], k_cache[0].shape[2]
    rows_R = jnp.arange(R)
    cos, sin = rope_table(cfg, T)
    cos_B1h, sin_B1h = jnp.asarray(cos)[pos_R][:, None], jnp.asarray(sin)[pos_R][:, None]
    mask_B1S = (jnp.arange(T)[None, :] <= pos_R[:, None])[:, None, :]
    x_B1D = embed_tokens(params, cfg, tok_R[:, None])
    k_out, v_out = [], []
    for layer in range(cfg.num_layers):
        lp = layer_params(params, layer)
        q_B1NH, k_B1KH, v_B1KH = layer_qkv(cfg, lp, x_B1D, cos_B1h, sin_B1h)
        k_RKSH = _write_slot(k_cache[layer], rows_R, pos_R, k_B1KH[:, 0])
        v_RKSH = _write_slot(v_cache[layer], rows_R, pos_R, v_B1KH[:, 0])
        as_act = lambda c: jax.lax.bitcast_convert_type(c, cfg.jdtype) if c.dtype == jnp.uint16 else c
        o_B1NH = attention(cfg, q_B1NH, as_act(k_RKSH), as_act(v_RKSH), mask_B1S)
        x_B1D = layer_out(cfg, lp, x_B1D, o_B1NH)
        k_out.append(k_RKSH)
        v_out.append(v_RKSH)
    return (tuple(k_out), tuple(v_out)), x_B1D[:, 0]


# ----------------------------------------------------------------------------- 2. drawing a token


def draw(u_R, logp_RV, top_p, greedy: bool, use_top_p: bool):
    """Draw one token per row from exp(logp_RV), restricted to the nucleus when use_top_p: the smallest
    set of most-likely tokens whose probability reaches top_p (Holtzman et al. 2019, arXiv:1904.09751).
    Inverse-CDF sampling (one uniform per row against the running sum of probabilities) instead of
    jax.random.categorical's Gumbel-max: it needs R random numbers instead of R*V, which measured
    about 3x faster per step at V = 32000 on this CPU. Masked tokens have probability 0 and are never hit.
    u_R: one uniform in [0, 1) per row. Because the token is a monotone function of u given the
    probabilities, two policies that differ a little mostly draw the same token from the same u."""
    if greedy:
        return jnp.argmax(logp_RV, axis=-1).astype(jnp.int32)
    if use_top_p:
        sorted_RV = jnp.sort(logp_RV, axis=-1)[:, ::-1]
        cum_RV = jnp.cumsum(jnp.exp(sorted_RV), axis=-1)
        # the cut: the smallest logp still inside the nucleus (the first sorted token always is)
        n_keep_R = jnp.sum((cum_RV - jnp.exp(sorted_RV)) < top_p, axis=-1)
        cut_R = jnp.take_along_axis(sorted_RV, jnp.maximum(n_keep_R - 1, 0)[:, None], axis=-1)
        logp_RV = jnp.where(logp_RV >= cut_R, logp_RV, -jnp.inf)
    cdf_RV = jnp.cumsum(jnp.exp(logp_RV - jnp.max(logp_RV, axis=-1, keepdims=True)), axis=-1)
    u_B1 = u_R[:, None] * cdf_RV[:, -1:]
    tok_R = jnp.sum(cdf_RV <= u_B1, axis=-1)
    return jnp.minimum(tok_R, logp_RV.shape[-1] - 1).astype(jnp.int32)


MAX_STOP_IDS = 8
"""The most token ids that may end a row (generate / continuous.Slots eos_id): a fixed-length
array, so any set of ids runs the same compiled sampler."""


def stop_ids(eos_id, pad_id: int, vocab_size: int):
    """eos_id (None, one id, or a sequence of ids) as the int32 [MAX_STOP_IDS] array the samplers
    compare each new token with (-1 fills unused places); ValueError for an id outside the vocabulary."""
    ids = [] if eos_id is None else [int(eos_id)] if np.ndim(eos_id) == 0 else [int(i) for i in eos_id]
    if not 0 <= pad_id < vocab_size or any(not 0 <= i < vocab_size for i in ids):
        raise ValueError(f"pad_id {pad_id} / eos_id {eos_id} out of range [0, {vocab_size})")
    if len(ids) > MAX_STOP_IDS:
        raise ValueError(f"at most {MAX_STOP_IDS} eos ids, got {len(ids)}")
    return jnp.asarray(ids + [-1] * (MAX_STOP_IDS - len(ids)), jnp.int32)


def ends_row(tok_R, eos_K):
    """True where a sampled token is one of the stop ids (eos_K from stop_ids)."""
    return jnp.any(tok_R[:, None] == eos_K[None, :], axis=-1)


def keys_per_row(key, R: int):
    """R per-row keys from one key (split) or a batch of R keys (as given); typed or raw uint32 keys."""
    key = jnp.asarray(key)
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    if key.ndim == (0 if typed else 1):
        return jax.random.split(key, R)
    if key.shape[0] != R or key.ndim != (1 if typed else 2):
        raise ValueError(f"key must be one PRNG key or {R} of them (one per row); got shape {key.shape}")
    return key


# ----------------------------------------------------------------------------- 3. the record of sampled rows


@dataclass
class Samples:
    """R sampled rows, laid out [R, T] as a rollout carries them (wire.Rollout's tokens_GT, logp_behav_GT,
    mask_GT, versions_GT, finished_G). Every sampling path returns it: generate,
    continuous.generate_continuous, and the rows of continuous.Slots (Samples.from_rows);
    inference_worker.py turns it into rollouts in one place (Worker.finish)."""

    tokens_RT: np.ndarray
    """int32: each row's prompt, then its completion, then pad_id."""
    logp_behav_RT: np.ndarray
    """float32: the behaviour policy's log-prob of each completion token under the FULL tempered
    distribution softmax(logits / temperature) (not the top_p renormalised one), so it equals
    model.token_logprobs(params, cfg, tokens_RT, temperature) bit for bit; 0 elsewhere."""
    mask_RT: np.ndarray
    """float32: 1.0 on completion tokens (a stop id that ended the row included), 0 elsewhere."""
    prompt_len_R: np.ndarray
    """int32: prompt tokens of each row (its completion starts there)."""
    completion_len_R: np.ndarray
    """int32: completion tokens of each row."""
    versions_RT: np.ndarray
    """int32: the weight version that sampled each completion token (several along a row whose weights
    were swapped in flight: continuous.Slots.swap); -1 elsewhere."""
    stopped_R: np.ndarray
    """bool: the row ended on one of its stop ids; False: it ran out of tokens (its budget or the cache)."""
    stats: dict = field(default_factory=dict)
    """continuous batching's counters (continuous.generate_continuous); empty otherwise."""

    def take(self, index) -> Samples:
        """The rows `index` (a slice or an index array) as a record of their own."""
        arrays = {k: getattr(self, k)[index] for k in ("tokens_RT", "logp_behav_RT", "mask_RT", "prompt_len_R",
                                                       "completion_len_R", "versions_RT", "stopped_R")}
        return replace(self, **arrays)

    def completion(self, r: int) -> tuple:
        """Row r's completion: (its token ids, their log-probs), numpy arrays."""
        p, n = int(self.prompt_len_R[r]), int(self.completion_len_R[r])
        return self.tokens_RT[r, p:p + n], self.logp_behav_RT[r, p:p + n]

    @classmethod
    def one_version(cls, tokens_RT, logp_behav_RT, mask_RT, prompt_len_R, version: int, stopped_R) -> Samples:
        """Rows sampled by one weight version: completion lengths from the mask, every completion token
        recorded as sampled by `version`."""
        mask_RT = np.asarray(mask_RT, np.float32)
        return cls(np.asarray(tokens_RT, np.int32), np.asarray(logp_behav_RT, np.float32), mask_RT,
                   np.asarray(prompt_len_R, np.int32), mask_RT.sum(axis=1).astype(np.int32),
                   np.where(mask_RT > 0, version, -1).astype(np.int32), np.asarray(stopped_R, bool))

    @classmethod
    def from_rows(cls, rows: list, T: int, pad_id: int = 0, stats: dict | None = None) -> Samples:
        """Rows of continuous batching (continuous.Row, ended: tokens = prompt + completion, logp and
        versions per completion token, stopped), in input order, right-padded to T."""
        R = len(rows)
        if max(r.tokens.size for r in rows) > T:
            raise ValueError(f"T = {T} is shorter than the longest row ({max(r.tokens.size for r in rows)} tokens)")
        out = cls(np.full((R, T), pad_id, np.int32), np.zeros((R, T), np.float32), np.zeros((R, T), np.float32),
                  np.array([r.prompt.size for r in rows], np.int32), np.array([r.logp.size for r in rows], np.int32),
                  np.full((R, T), -1, np.int32), np.array([r.stopped for r in rows], bool), dict(stats or {}))
        for b, (row, p) in enumerate(zip(rows, out.prompt_len_R)):
            n = row.tokens.size
            out.tokens_RT[b, :n], out.logp_behav_RT[b, p:n], out.versions_RT[b, p:n] = row.tokens, row.logp, row.versions
            out.mask_RT[b, p:n] = 1.0
        return out


def ended_on_stop(tokens_RT, prompt_len_R, completion_len_R, eos_K) -> np.ndarray:
    """bool [R]: the row's last completion token is one of the stop ids eos_K (stop_ids' array)."""
    ids = np.asarray(eos_K)
    ids = ids[ids >= 0]
    last = np.asarray(prompt_len_R) + np.asarray(completion_len_R) - 1
    has = np.asarray(completion_len_R) > 0
    last_tok = np.asarray(tokens_RT)[np.arange(len(last)), np.where(has, last, 0)]
    return has & np.isin(last_tok, ids)


# ----------------------------------------------------------------------------- 4. generate

@partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "greedy", "use_top_p", "prefill_len"))
def _generate_jit(params, cfg, prompt_RT, prompt_len_R, keys_R, temperature, top_p, eos_K, pad_id, *,
                  max_new_tokens: int, greedy: bool, use_top_p: bool, prefill_len: int):
    R, T = prompt_RT.shape
    rows_R = jnp.arange(R)
    # Prefill IS the forward's layer stack, over the first prefill_len positions (the prompts): its K/V
    # are forward's K/V (PRECISION POLICY (i): the same bits as over the full [R, T]); the cache
    # positions after it start as zeros, each written by decode before any query attends to it.
    x_RTD, (k_cache, v_cache) = hidden(params, cfg, prompt_RT[:, :prefill_len], return_kv=True)
    grow = [(0, 0)] * 3 + [(0, T - prefill_len), (0, 0)]  # [L, R, K, P, H] -> [L, R, K, T, H]
    k_cache, v_cache = jnp.pad(k_cache, grow), jnp.pad(v_cache, grow)
    x_RD = x_RTD[rows_R, prompt_len_R - 1]

    def sample_into(state, x_RD, i):
        tokens_RT, logp_behav_RT, mask_RT, done_R = state
        # row b's i-th token uses uniform(fold_in(keys_R[b], i)): a row's draws never depend on its batch
        u_R = jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, i), (), jnp.float32))(keys_R)
        logp_RV = next_token_logprobs(params, cfg, x_RD, temperature)
        tok_R = draw(u_R, logp_RV, top_p, greedy, use_top_p)
        tok_logp_R = jnp.take_along_axis(logp_RV, tok_R[:, None], axis=-1)[:, 0]
        pos_R = prompt_len_R + i
        live_R = ~done_R
        write_RT = (jnp.arange(T)[None, :] == pos_R[:, None]) & live_R[:, None]
        tokens_RT = jnp.where(write_RT, tok_R[:, None], tokens_RT)
        logp_behav_RT = jnp.where(write_RT, tok_logp_R[:, None], logp_behav_RT)
        mask_RT = jnp.where(write_RT, 1.0, mask_RT)
        done_R = done_R | ends_row(tok_R, eos_K)
        return (tokens_RT, logp_behav_RT, mask_RT, done_R), tok_R

    state = (prompt_RT, jnp.zeros((R, T), jnp.float32), jnp.zeros((R, T), jnp.float32), jnp.zeros((R,), bool))
    state, tok_R = sample_into(state, x_RD, 0)

    def cond(carry):
        i, state, _, _ = carry
        return (i < max_new_tokens) & ~jnp.all(state[3])

    def body(carry):
        i, state, cache, tok_R = carry
        cache, x_RD = decode_step(params, cfg, cache, tok_R, prompt_len_R + i - 1)
        state, tok_R = sample_into(state, x_RD, i)
        return i + 1, state, cache, tok_R

    cache = (tuple(map(cache_bits, k_cache)), tuple(map(cache_bits, v_cache)))  # [L, R, K, T, H] -> L arrays [R, K, T, H]
    _, state, _, _ = jax.lax.while_loop(cond, body, (jnp.int32(1), state, cache, tok_R))
    tokens_RT, logp_behav_RT, mask_RT, _ = state
    return tokens_RT, logp_behav_RT, mask_RT, jnp.sum(mask_RT, axis=1).astype(jnp.int32)


FIT_MIN_SAVING = 0.25
"""generate(fit=True) shortens the cache or the prefill only when that saves at least this share of
its length: every new length compiles the sampler once, which a small saving does not repay."""


def _fit_len(n: int, cap: int) -> int:
    """n rounded up to a multiple of max(8, 2^(floor(log2 n) - 3)) (8 lengths per octave, like
    packing.bucket_len), at least MIN_CHUNK; cap itself when that is not FIT_MIN_SAVING shorter."""
    step = max(8, (1 << (max(n, 1).bit_length() - 1)) // 8)
    fitted = max(MIN_CHUNK, -(-n // step) * step)
    return fitted if fitted <= (1 - FIT_MIN_SAVING) * cap else cap


def generate(params: dict, cfg: ModelConfig, prompt_RT, prompt_len_R, key, *, max_new_tokens: int,
             temperature: float = 1.0, top_p: float = 1.0, eos_id=None, pad_id: int = 0,
             fit: bool = True, version: int = 0) -> Samples:
    """Sample completions with a full-length KV cache: a Samples record of the R rows, [R, T].

    prompt_RT: int32 [R, T], each row's prompt right-padded with pad_id to the fixed length T (the cache
    length, and the length the trainer runs forward() on); prompt_len_R + max_new_tokens <= T.
    Its logp_behav_RT equals token_logprobs(params, cfg, tokens_RT, temperature) bit for bit on the
    completion tokens (the reference CPU configuration); every token is recorded as sampled by weight
    version `version`. eos_id: the token id, or the ids (at most MAX_STOP_IDS), that end a row (a chat checkpoint has several: every eos of its
    generation_config and its template's end-of-turn; the row keeps the one it sampled, mask 1); None:
    rows end only at max_new_tokens. temperature=0 is greedy and reports the untempered (temperature 1)
    log-probs.
    key: one PRNG key for the batch, or a batch of R keys, one per row. With per-row keys a row's
    completion depends only on its prompt, its key and the weights, not on the other rows: the same
    keys give common random numbers across evaluations (row_keys).
    Fewer than MIN_DECODE_ROWS rows are padded with dummy rows internally (PRECISION POLICY (e)).
    fit (default True): the work is sized to the rows, not to T: the KV cache holds the longest prompt
    plus max_new_tokens and the prefill runs over the longest prompt, each rounded up by _fit_len
    (and left at full length where that saves under FIT_MIN_SAVING); the outputs are padded back to T.
    By PRECISION POLICY (i) this changes no bit of the result (tests/test_packing.py); fit=False runs
    everything at T.
    """
    prompt_RT = np.asarray(prompt_RT)
    prompt_len_R = np.asarray(prompt_len_R)
    check_tokens(cfg, prompt_RT)
    R, T = prompt_RT.shape
    if prompt_len_R.shape != (R,):
        raise ValueError(f"prompt_len_R must have shape ({R},), got {prompt_len_R.shape}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if prompt_len_R.min() < 1 or prompt_len_R.max() + max_new_tokens > T:
        raise ValueError(f"need 1 <= prompt_len and prompt_len + max_new_tokens <= T = {T}; got prompt lengths "
                         f"in [{prompt_len_R.min()}, {prompt_len_R.max()}] and max_new_tokens={max_new_tokens}")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
    eos_K = stop_ids(eos_id, pad_id, cfg.vocab_size)
    keys_R = keys_per_row(key, R)
    n_rows = max(R, MIN_DECODE_ROWS)
    if n_rows > R:  # dummy rows: a 1-token prompt, results dropped
        prompt_RT = np.concatenate([prompt_RT, np.full((n_rows - R, T), pad_id, prompt_RT.dtype)])
        prompt_len_R = np.concatenate([prompt_len_R, np.ones(n_rows - R, prompt_len_R.dtype)])
        keys_R = jnp.concatenate([keys_R, jax.random.split(keys_R[0], n_rows - R)])
    longest = int(prompt_len_R.max())
    C = _fit_len(longest + max_new_tokens, T) if fit else T  # the cache length
    P = min(_fit_len(longest, T), C) if fit else T            # the prefill length
    tokens_RT, logp_behav_RT, mask_RT, n_R = _generate_jit(
        params, cfg, jnp.asarray(prompt_RT[:, :C], jnp.int32), jnp.asarray(prompt_len_R, jnp.int32), keys_R,
        jnp.float32(temperature), jnp.float32(top_p), eos_K, jnp.int32(pad_id), max_new_tokens=int(max_new_tokens),
        greedy=temperature == 0, use_top_p=top_p < 1, prefill_len=P)
    grow = ((0, 0), (0, T - C))  # back to [R, T]: pad tokens, log-prob 0, mask 0
    tokens_RT = np.pad(np.asarray(tokens_RT)[:R], grow, constant_values=pad_id)
    n_R = np.asarray(n_R)[:R]
    return Samples.one_version(tokens_RT, np.pad(np.asarray(logp_behav_RT)[:R], grow),
                               np.pad(np.asarray(mask_RT)[:R], grow), prompt_len_R[:R], version,
                               ended_on_stop(tokens_RT, prompt_len_R[:R], n_R, eos_K))


# ----------------------------------------------------------------------------- 5. the rows of work items
# A work item (wire.WorkItem) is sampled as G rows: its prompt repeated, one key per row, a stop rule;
# each completion is then cut at its stop string and becomes a verifier job. inference_worker.py does
# this for the trainer's items and curate.py for a dataset's problems, with these same functions.


def settings(item: wire.WorkItem) -> tuple:
    """What one generate() call needs to be the same for all its rows (the work item's sampling settings)."""
    return item.seq_len, item.max_new_tokens, item.temperature, item.top_p, tuple(item.stop)


def build_prompts(items: list, tokenizer, rows: int, pad_id: int):
    """Each item's prompt repeated G times, right-padded to the item's seq_len, then dummy rows up to
    `rows` (a fixed decode batch: one compilation). Returns (prompt_RT, prompt_len_R)."""
    T = items[0].seq_len
    prompt_RT = np.full((rows, T), pad_id, np.int32)
    prompt_len_R = np.ones(rows, np.int32)
    r = 0
    for item in items:
        ids = tokenizer.encode(item.prompt)
        if not workitems.fits(len(ids), T, item.max_new_tokens):
            raise ValueError(f"item {item.item_id}: prompt of {len(ids)} tokens does not fit "
                             f"seq_len {T} with max_new_tokens {item.max_new_tokens}")
        for _ in range(item.group_size):
            prompt_RT[r, :len(ids)], prompt_len_R[r] = ids, len(ids)
            r += 1
    return prompt_RT, prompt_len_R


def cut_completions(samples: Samples, tokenizer, stop: tuple, pad_id: int):
    """Cut every completion just after its first stop string: later tokens become padding with mask 0,
    so the trainer learns only from what the verifier saw. Returns (samples, texts, finished): finished[b]
    is True when row b ended on a stop string or on one of its stop ids (Samples.stopped_R) rather than
    at the length limit."""
    out = replace(samples, tokens_RT=samples.tokens_RT.copy(), logp_behav_RT=samples.logp_behav_RT.copy(),
                  mask_RT=samples.mask_RT.copy(), completion_len_R=samples.completion_len_R.copy(),
                  versions_RT=samples.versions_RT.copy())
    texts, finished = [], []
    has_stop = lambda ids: any(s and s in tokenizer.decode(ids) for s in stop)
    for b in range(out.tokens_RT.shape[0]):
        start, n = int(out.prompt_len_R[b]), int(out.mask_RT[b].sum())
        ids, keep = out.tokens_RT[b, start:start + n].tolist(), n
        stopped = has_stop(ids)
        if stopped:  # the shortest prefix that contains a stop string (containment grows with the prefix)
            lo, hi = 1, n
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if has_stop(ids[:mid]) else (mid + 1, hi)
            keep = lo
        texts.append(tokenizer.decode(ids[:keep]))
        finished.append(stopped or bool(out.stopped_R[b]))
        cut = slice(start + keep, None)
        out.tokens_RT[b, cut], out.logp_behav_RT[b, cut], out.mask_RT[b, cut] = pad_id, 0.0, 0.0
        out.versions_RT[b, cut], out.completion_len_R[b] = -1, keep
    return out, texts, finished


def row_keys(seed: int, items: list, version: int, rows: int):
    """One sampling key per decode row (the layout of build_prompts), for generate.

    A training item's G rows draw from its item id, the weight version and the run's seed (item.seed,
    which the trainer sets; else this worker's): whichever worker samples it, the same rows, so the
    trainer can draw a row again and compare (audit.py), and a rerun samples the same.
    An item with a "crn_key" (the trainer's evaluation items) draws from that key and the row's index
    alone, not from the version, from this worker's seed or from the items it shares a lease with. So
    every evaluation of a run uses the same random numbers whichever worker samples it (common random
    numbers): the difference between two evaluations measures the change of weights, not the luck of
    the draw, and each one is still an unbiased estimate. (The trainer puts its own seed in crn_key.)
    """
    base = jax.random.PRNGKey(seed)
    keys = []
    for item in items:
        if item.crn_key:
            item_key = jax.random.fold_in(jax.random.PRNGKey(0), zlib.crc32(item.crn_key.encode()))
        else:  # the run's seed when the item carries it (every trainer item does), so any row can be drawn again
            item_seed = jax.random.PRNGKey(item.seed) if getattr(item, "seed", -1) >= 0 else base
            item_key = jax.random.fold_in(item_seed, zlib.crc32(f"{item.item_id}@{version}".encode()))
        keys.append(jax.vmap(jax.random.fold_in, (None, 0))(item_key, jnp.arange(item.group_size)))
    n = sum(len(k) for k in keys)
    keys.append(jax.random.split(jax.random.fold_in(base, version), rows - n))  # dummy rows
    return jnp.concatenate(keys)


def row_budgets(item: wire.WorkItem, tail: float) -> list:
    """The token budget of each of the item's G rows (inference_worker --length-tail `tail`), a
    function of the item id."""
    if not tail:
        return [item.max_new_tokens] * item.group_size
    u = np.random.default_rng(zlib.crc32(item.item_id.encode())).random(item.group_size)
    return [max(1, int(item.max_new_tokens * min(1.0, 0.1 / (1 - x) ** (1 / tail)))) for x in u]


def eos_for(tokenizer, stop: tuple, end_of_turn: int | None = None) -> tuple:
    """The token ids that end a row: a stop string that is one token, every eos id of the checkpoint
    (generation_config.json may list several) and the chat template's end-of-turn token
    (prompts.end_of_turn_id), all as ids, never as decoded text (a special token decodes to "")."""
    encoded = [tokenizer.encode(s) for s in stop]
    one_token = [ids[0] for ids in encoded if len(stop) == 1 and len(ids) == 1]
    ids = one_token + list(getattr(tokenizer, "eos_ids", ())) + ([end_of_turn] if end_of_turn is not None else [])
    return tuple(dict.fromkeys(int(i) for i in ids))
