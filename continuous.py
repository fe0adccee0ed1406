"""continuous.py: the sampler's continuous batching, and weight updates between its decode steps.

sampler.generate() decodes R rows until the slowest is done: a row that ends early keeps its slot idle.
Here a fixed number of decode slots stays busy instead: when a row ends (eos, its token budget, or a
full cache) the next waiting row is prefilled into the freed slot. Two ways to drive it:

  generate_continuous(params, cfg, prompts, key, ...)   all rows with one weight version, start to end
                                                        (inference_worker --slots N);
  Slots(params, cfg, ...)                               the engine underneath, driven by the caller:
                                                        add rows at any time, run decode steps, harvest
                                                        the rows that ended, and swap in new weights
                                                        between steps (inference_worker --inflight).

IN-FLIGHT WEIGHT UPDATES (`Slots.swap`). A new version is installed between two decode steps without
dropping the rows in progress. mode "keep": the rows go on with the KV cache the older weights
computed (PipelineRL); cheap, but a token sampled after the swap saw keys and values of the old
weights, so its log-prob is neither policy's exactly. mode "recompute": each row in progress first has
its prompt and its tokens so far run through the new weights (one prefill of those rows), so from the
swap on the row is sampled exactly as the new weights would have sampled it from that prefix: its
later tokens' log-probs are the trainer's bit for bit (AReaL recomputes the same way). Either way each
token records the version that sampled it (Row.versions) and keeps the log-prob it was sampled with:
lifecycle.py says what a row with several versions is worth. Ended rows become a sampler.Samples
record (Samples.from_rows), the one record every sampling path returns.

Device state (_cb_init): the KV cache, L arrays [S, K, C, H] (S slots, C = cache_len, uint16 bits for
bf16 as in sampler.generate), and per slot: the hidden state to sample from next (x_SD), the count
of tokens sampled (n_S), live flag, token budget, prompt length, PRNG key, and the sampled tokens /
log-probs so far ([S, M], M = the largest budget). Jitted programs act on it (donated: in place):
  _cb_prefill:   new rows' prompts through the forward's layer stack (model.hidden, return_kv) at a
                 short padded length Tp (a power of two >= 16, at most C: few compiles), K/V written
                 into cache positions [0, Tp) of their slots, x at the last prompt position kept;
  _cb_recompute: the same for rows in progress (prompt + tokens so far), keeping their counters;
  _cb_decode:    a while loop; each step samples one token per live slot from x_SD (row r's i-th
                 token from uniform(fold_in(key_r, i)), as sampler.generate), records it, then runs
                 sampler.decode_step for all slots at their own positions. It returns to the host after
                 max_steps steps, or as soon as enough slots are free while rows are waiting, or when
                 no slot is live; the host harvests ended rows and prefills new ones.
Bitwise: per row the same ops as sampler.generate() alone with T = cache_len: decode over the full-length
cache with S >= MIN_DECODE_ROWS rows (model.py PRECISION POLICY (d), (e)); a prefill differs only in
padding (Tp positions instead of T, other rows in the batch), which the layer stack does not see:
causal masks give padded positions probability 0, the row-sum tree over zero padding is exact, and
the bf16 matmuls are row-count invariant: PRECISION POLICY (i) (tests/test_continuous_batching.py
checks it bit for bit against generate() and token_logprobs, and a swap in both modes).
Cache positions a slot has not written for its current row (stale K/V of a previous row) are always
masked out: a row writes position p (prefill or decode) before any query attends to it.

Run the tests:  python -m pytest -q tests/test_continuous_batching.py
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from model import MIN_CHUNK, MIN_DECODE_ROWS, ModelConfig, hidden, next_token_logprobs
from sampler import Samples, cache_bits, decode_step, draw, ended_on_stop, ends_row, keys_per_row, stop_ids

MODES = ("keep", "recompute")


# ----------------------------------------------------------------------------- the device programs

def _cb_init(params, cfg: ModelConfig, slots: int, cache_len: int, width: int, keys_S):
    """The empty continuous-batching state (see the module docstring) for `slots` slots."""
    cdt = jnp.uint16 if cfg.jdtype == jnp.bfloat16 else cfg.jdtype
    shape = (slots, cfg.num_kv_heads, cache_len, cfg.head_dim)
    cache = tuple(tuple(jnp.zeros(shape, cdt) for _ in range(cfg.num_layers)) for _ in range(2))
    return {"cache": cache, "x_SD": jnp.zeros((slots, cfg.hidden_size), cfg.jdtype),
            "n_S": jnp.zeros((slots,), jnp.int32), "live_S": jnp.zeros((slots,), bool),
            "budget_S": jnp.ones((slots,), jnp.int32), "plen_S": jnp.ones((slots,), jnp.int32),
            "keys_S": keys_S, "tok_SM": jnp.zeros((slots, width), jnp.int32),
            "logp_SM": jnp.zeros((slots, width), jnp.float32)}


def _prefill_into(params, cfg, state, seq_nT, seq_len_n, slot_n):
    """seq_nT (right-padded to Tp) through the layer stack: K/V into cache positions [0, Tp) of slots
    slot_n, x at each row's last position into x_SD."""
    n, Tp = seq_nT.shape
    x_nTD, (k_LnKTH, v_LnKTH) = hidden(params, cfg, seq_nT, return_kv=True)
    k_cache, v_cache = state["cache"]
    k_cache = tuple(c.at[slot_n, :, :Tp].set(cache_bits(k_LnKTH[i])) for i, c in enumerate(k_cache))
    v_cache = tuple(c.at[slot_n, :, :Tp].set(cache_bits(v_LnKTH[i])) for i, c in enumerate(v_cache))
    x_nD = x_nTD[jnp.arange(n), seq_len_n - 1]
    return dict(state, cache=(k_cache, v_cache), x_SD=state["x_SD"].at[slot_n].set(x_nD))


@partial(jax.jit, static_argnames=("cfg",), donate_argnames=("state",))
def _cb_prefill(params, cfg, state, prompt_nT, prompt_len_n, slot_n, keys_n, budget_n):
    """Prefill n new rows (prompts right-padded to Tp) into slots slot_n (repeated slots carry
    identical rows: padding of n to a bucket)."""
    state = _prefill_into(params, cfg, state, prompt_nT, prompt_len_n, slot_n)
    return dict(state, n_S=state["n_S"].at[slot_n].set(0), live_S=state["live_S"].at[slot_n].set(True),
                budget_S=state["budget_S"].at[slot_n].set(budget_n),
                plen_S=state["plen_S"].at[slot_n].set(prompt_len_n), keys_S=state["keys_S"].at[slot_n].set(keys_n))


@partial(jax.jit, static_argnames=("cfg",), donate_argnames=("state",))
def _cb_recompute(params, cfg, state, seq_nT, seq_len_n, slot_n):
    """Rows in progress, their prompt + tokens so far right-padded to Tp, recomputed under `params`:
    cache positions [0, seq_len) and the hidden state to sample from next; counters unchanged."""
    return _prefill_into(params, cfg, state, seq_nT, seq_len_n, slot_n)


@partial(jax.jit, static_argnames=("cfg", "greedy", "use_top_p"), donate_argnames=("state",))
def _cb_decode(params, cfg, state, temperature, top_p, eos_K, waiting, refill, max_steps, *, greedy: bool,
               use_top_p: bool):
    """Sample + decode steps until no slot is live, min(refill, waiting) slots are free while rows
    wait, or max_steps steps ran. Returns (state, steps run, tokens sampled for live rows)."""
    S, M = state["tok_SM"].shape
    C = state["cache"][0][0].shape[2]

    def cond(carry):
        live_S, steps = carry[0]["live_S"], carry[1]
        free = S - jnp.sum(live_S.astype(jnp.int32))
        refill_now = (waiting > 0) & (free >= jnp.minimum(refill, waiting))
        return jnp.any(live_S) & ~refill_now & (steps < max_steps)

    def body(carry):
        st, steps, useful = carry
        live_S, n_S = st["live_S"], st["n_S"]
        u_S = jax.vmap(lambda k, i: jax.random.uniform(jax.random.fold_in(k, i), (), jnp.float32))(st["keys_S"], n_S)
        logp_SV = next_token_logprobs(params, cfg, st["x_SD"], temperature)
        tok_S = draw(u_S, logp_SV, top_p, greedy, use_top_p)
        tok_logp_S = jnp.take_along_axis(logp_SV, tok_S[:, None], axis=-1)[:, 0]
        write_SM = live_S[:, None] & (jnp.arange(M)[None, :] == n_S[:, None])
        n_S = n_S + live_S.astype(jnp.int32)
        ended_S = ends_row(tok_S, eos_K) | (n_S >= st["budget_S"])
        pos_S = jnp.clip(st["plen_S"] + n_S - 1, 0, C - 1)  # the new token's position (ended slots: harmless)
        cache, x_SD = decode_step(params, cfg, st["cache"], tok_S, pos_S)
        st = dict(st, cache=cache, x_SD=x_SD, n_S=n_S, live_S=live_S & ~ended_S,
                  tok_SM=jnp.where(write_SM, tok_S[:, None], st["tok_SM"]),
                  logp_SM=jnp.where(write_SM, tok_logp_S[:, None], st["logp_SM"]))
        return st, steps + 1, useful + jnp.sum(live_S.astype(jnp.int32))

    return jax.lax.while_loop(cond, body, (state, jnp.int32(0), jnp.int32(0)))


def _cb_bucket(n: int, cap: int, least: int = 1) -> int:
    """The power of two >= max(n, least), at most cap (cap itself past it)."""
    return min(cap, 1 << (max(n, least) - 1).bit_length())


def _padded_batch(seqs: list, cap: int, pad_id: int):
    """Sequences right-padded to a power-of-two length (>= MIN_CHUNK, <= cap), their count padded to a
    power of two by repeating the first (few compiled shapes). Returns (seq_nT, index_n): index_n[j]
    is which of seqs row j is."""
    k = len(seqs)
    index_n = np.concatenate([np.arange(k), np.zeros((1 << (k - 1).bit_length()) - k, np.int64)])
    Tp = _cb_bucket(max(s.size for s in seqs), cap, least=MIN_CHUNK)
    seq_nT = np.full((index_n.size, Tp), pad_id, np.int32)
    for j, i in enumerate(index_n):
        seq_nT[j, :seqs[i].size] = seqs[i]
    return seq_nT, index_n


# ----------------------------------------------------------------------------- the engine

@dataclass
class Row:
    """One completion to sample. The caller sets prompt, key, budget and tag (anything: which item and
    sample this row is); the engine fills tokens (prompt + completion), logp (per completion token, the
    log-prob it was sampled with), versions (per completion token, the weight version that sampled
    it) and stopped (it ended on a stop id) when the row ends. Samples.from_rows lays rows out [R, T]."""
    prompt: np.ndarray
    key: jax.Array
    budget: int
    tag: object = None
    tokens: np.ndarray | None = None
    logp: np.ndarray | None = None
    versions: np.ndarray | None = None
    stopped: bool = False
    segments: list = field(default_factory=list)  # (first token index, version) from each swap on


class Slots:
    """Continuous batching driven by the caller, with in-flight weight swaps (see the module docstring).

        engine = Slots(params, cfg, slots=16, cache_len=T, width=max_new, version=v, ...)
        engine.add(Row(prompt, key, budget, tag)) ...        # any time
        ended = engine.step(max_steps=32)                    # admit waiting rows, decode, harvest
        engine.swap(new_params, v + 1, "recompute")          # between steps
    """

    def __init__(self, params, cfg: ModelConfig, *, slots: int, cache_len: int, width: int, version: int = 0,
                 temperature: float = 1.0, top_p: float = 1.0, eos_id=None, pad_id: int = 0,
                 refill: int = 1):
        if slots < MIN_DECODE_ROWS:
            raise ValueError(f"slots must be >= MIN_DECODE_ROWS = {MIN_DECODE_ROWS} (PRECISION POLICY (e)), got {slots}")
        if not 1 < cache_len <= cfg.max_seq_len:
            raise ValueError(f"cache_len must be in [2, max_seq_len = {cfg.max_seq_len}], got {cache_len}")
        if temperature < 0 or not 0 < top_p <= 1:
            raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
        self.params, self.cfg, self.version = params, cfg, version
        self.cache_len, self.width, self.pad_id, self.refill = cache_len, width, pad_id, refill
        self.eos_K = stop_ids(eos_id, pad_id, cfg.vocab_size)
        self.scalars = (jnp.float32(temperature), jnp.float32(top_p), self.eos_K)
        self.flags = dict(greedy=temperature == 0, use_top_p=top_p < 1)
        self.state = None  # made at the first admission (it needs a key of the callers' kind)
        self.slot_row: list[Row | None] = [None] * slots
        self.n_S = np.zeros(slots, np.int64)          # tokens each slot's row has sampled (host copy)
        self.tok_SM = np.zeros((slots, width), np.int32)
        self.waiting: collections.deque[Row] = collections.deque()
        self.stats = collections.Counter()

    # -- what the caller asks
    def add(self, row: Row) -> None:
        """Queue a row; it is admitted in order as slots free up."""
        row.prompt = np.asarray(row.prompt).reshape(-1)
        p = row.prompt
        if not 1 <= p.size < self.cache_len:
            raise ValueError(f"need 1 <= prompt length < cache_len = {self.cache_len}; got {p.size}")
        if not np.issubdtype(p.dtype, np.integer) or p.min() < 0 or p.max() >= self.cfg.vocab_size:
            raise ValueError(f"prompt token ids must be integers in [0, {self.cfg.vocab_size})")
        if row.budget < 1:
            raise ValueError(f"a row's token budget must be >= 1, got {row.budget}")
        row.budget = int(min(row.budget, self.width, self.cache_len - p.size))
        self.waiting.append(row)

    def live(self) -> int:
        return sum(r is not None for r in self.slot_row)

    def busy(self) -> bool:
        return bool(self.waiting) or self.live() > 0

    def step(self, max_steps: int = 1 << 30) -> list:
        """Admit waiting rows into free slots, run up to max_steps decode steps (fewer when enough
        slots free up while rows wait, or none is live), and return the rows that ended, finished."""
        self._admit()
        if not self.live():
            return []
        self.state, s, u = _cb_decode(self.params, self.cfg, self.state, *self.scalars, jnp.int32(len(self.waiting)),
                                      jnp.int32(self.refill), jnp.int32(max_steps), **self.flags)
        live, n_S, tok_SM, logp_SM, s, u = jax.device_get(
            (self.state["live_S"], self.state["n_S"], self.state["tok_SM"], self.state["logp_SM"], s, u))
        self.stats.update(decode_steps=int(s), useful_tokens=int(u), host_round_trips=1)
        self.n_S[:], self.tok_SM[:] = n_S, tok_SM
        ended = []
        for sl in np.flatnonzero([r is not None for r in self.slot_row] & ~live):
            row, c = self.slot_row[sl], int(n_S[sl])
            row.tokens = np.concatenate([row.prompt.astype(np.int32), tok_SM[sl, :c]])
            row.logp = logp_SM[sl, :c].copy()
            row.stopped = bool(ended_on_stop(row.tokens[None], [row.prompt.size], [c], self.eos_K)[0])
            row.versions = np.zeros(c, np.int32)
            for first, version in row.segments:
                row.versions[first:] = version
            self.slot_row[sl] = None
            ended.append(row)
        return ended

    def swap(self, params, version: int, mode: str) -> None:
        """Install weights `version` between decode steps; the rows in progress go on with them: with
        the KV cache computed so far ("keep") or with their prompt and tokens so far run through the new
        weights first ("recompute"). Their next tokens are recorded as sampled by `version`."""
        if mode not in MODES:
            raise ValueError(f"unknown in-flight mode {mode!r}; expected one of {MODES}")
        self.params, self.version = params, version
        slots = [sl for sl, r in enumerate(self.slot_row) if r is not None]
        for sl in slots:
            self.slot_row[sl].segments.append((int(self.n_S[sl]), version))
        if mode == "recompute" and slots:
            seqs = [np.concatenate([self.slot_row[sl].prompt, self.tok_SM[sl, :self.n_S[sl]]]).astype(np.int32)
                    for sl in slots]
            seq_nT, index_n = _padded_batch(seqs, self.cache_len, self.pad_id)
            self.state = _cb_recompute(params, self.cfg, self.state, jnp.asarray(seq_nT),
                                       jnp.asarray([seqs[i].size for i in index_n], jnp.int32),
                                       jnp.asarray(np.asarray(slots)[index_n], jnp.int32))
            self.stats.update(recompute_calls=1, recomputed_rows=len(slots))

    def drop(self, which) -> list:
        """Remove the rows (waiting or in progress) for which which(row) is true; returns them. A slot
        freed this way is simply reused (its cache positions are rewritten before they are read)."""
        gone = [r for r in self.waiting if which(r)]
        self.waiting = collections.deque(r for r in self.waiting if not which(r))
        for sl, r in enumerate(self.slot_row):
            if r is not None and which(r):
                gone.append(r)
                self.slot_row[sl] = None
                self.state = dict(self.state, live_S=self.state["live_S"].at[sl].set(False))
        return gone

    # -- inside
    def _admit(self) -> None:
        free = [sl for sl, r in enumerate(self.slot_row) if r is None]
        rows = [self.waiting.popleft() for _ in range(min(len(free), len(self.waiting)))]
        if not rows:
            return
        if self.state is None:
            self.state = _cb_init(self.params, self.cfg, len(self.slot_row), self.cache_len, self.width,
                                  jnp.stack([rows[0].key] * len(self.slot_row)))
        slot_k = np.asarray(free[:len(rows)])
        prompt_nT, index_n = _padded_batch([r.prompt for r in rows], self.cache_len, self.pad_id)
        for sl, row in zip(slot_k, rows):
            self.slot_row[sl] = row
            row.segments = [(0, self.version)]
            self.n_S[sl] = 0
        self.state = _cb_prefill(self.params, self.cfg, self.state, jnp.asarray(prompt_nT),
                                 jnp.asarray([rows[i].prompt.size for i in index_n], jnp.int32),
                                 jnp.asarray(slot_k[index_n], jnp.int32), jnp.stack([rows[i].key for i in index_n]),
                                 jnp.asarray([rows[i].budget for i in index_n], jnp.int32))
        self.stats.update(prefill_calls=1)


# ----------------------------------------------------------------------------- all rows at once

def generate_continuous(params: dict, cfg: ModelConfig, prompts, key, *, cache_len: int, max_new_tokens,
                        slots: int = MIN_DECODE_ROWS, temperature: float = 1.0, top_p: float = 1.0,
                        eos_id=None, pad_id: int = 0, refill: int = 1, version: int = 0) -> Samples:
    """Sample completions for R prompts with continuous batching over `slots` decode rows, one version.

    prompts: R token-id sequences of any lengths 1 <= len < cache_len. key: one PRNG key (split into R)
    or R keys, one per row, as sampler.generate(). max_new_tokens: an int or R ints (a per-row budget);
    a row also ends at eos_id (one id or several, as sampler.generate) or when its cache is full
    (prompt_len + completion_len == cache_len).
    Per row the result equals sampler.generate() on that row alone with T = cache_len and the same key,
    bit for bit (tokens, completion length, log-probs): a completion depends only on its prompt, its
    key and the weights, never on its neighbours, its slot or when it was admitted.
    Rows are admitted in the given order (row r before row r + 1; finished rows free their slot for
    the next one), so a GRPO worker that lists a prompt's G samples next to each other gets each group
    done at about the same time. refill: the decode loop returns to the host (to prefill waiting rows)
    once min(refill, rows waiting) slots are free; 1 keeps the slots fullest, larger means fewer host
    round trips. slots >= MIN_DECODE_ROWS (PRECISION POLICY (e)).
    Returns a sampler.Samples record of the R rows in input order, [R, cache_len], every token sampled
    by weight version `version`, with stats: decode_steps (sample+decode steps run), useful_tokens
    (tokens sampled for rows), slot_util = useful_tokens / (slots * decode_steps), host_round_trips,
    prefill_calls."""
    prompts = [np.asarray(p).reshape(-1) for p in prompts]
    R = len(prompts)
    if R == 0:
        raise ValueError("generate_continuous: no prompts")
    budget_R = np.broadcast_to(np.asarray(max_new_tokens, np.int64), (R,))
    if budget_R.min() < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    keys_R = keys_per_row(key, R)
    plen_R = np.array([p.size for p in prompts], np.int64)
    width = int(np.minimum(budget_R, np.maximum(cache_len - plen_R, 1)).max())
    engine = Slots(params, cfg, slots=slots, cache_len=cache_len, width=width, version=version,
                   temperature=temperature, top_p=top_p, eos_id=eos_id, pad_id=pad_id, refill=refill)
    rows = [Row(p, keys_R[r], int(budget_R[r]), tag=r) for r, p in enumerate(prompts)]
    for row in rows:
        engine.add(row)
    while engine.busy():
        engine.step()
    st = engine.stats
    stats = {"decode_steps": st["decode_steps"], "useful_tokens": st["useful_tokens"],
             "slot_util": st["useful_tokens"] / max(slots * st["decode_steps"], 1),
             "host_round_trips": st["host_round_trips"], "prefill_calls": st["prefill_calls"]}
    return Samples.from_rows(rows, cache_len, pad_id, stats)
