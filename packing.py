"""The update's layout by real length: rows grouped into microbatches of similar length, each cut to
its own length, so that the trainer computes on real tokens rather than on padding.

A rollout row is [prompt | completion | padding] in the run's fixed length T (the sampler's cache
length). Its real length is the position after its last completion token: nothing after it enters
the loss, and the model is causal, so cutting the row there changes no log-prob of the positions
kept. The trainer's batch is then laid out as follows (pack_batch):

  1. each minibatch keeps its rows (the optimizer steps see the same data as with split_batch);
  2. inside it, rows are sorted by real length, longest first;
  3. a microbatch's length is its longest row's bucket length T_b (bucket_len: 8 lengths per octave);
     it takes the next rows that are longer than (1 - MAX_ROW_PADDING) x T_b, as many as fit the memory
     budget at that length (rows_for), in a power of two: few distinct shapes (each compiles once) and
     few, full microbatches, while no row but the longest is padded by MAX_ROW_PADDING of its
     microbatch or more (the longest by less than one bucket step);
  4. each microbatch's arrays are cut to T_b.

Why this is bitwise: model.py's PRECISION POLICY makes a row's log-probs independent of the padded
length, the number of rows and the neighbouring rows (tests/test_packing.py checks each against a
negative control), so a row scored in a short microbatch gets exactly the bits the sampler reported
for it at the full length T. Rows are never concatenated into one sequence (packing with segment
ids): a row's attention sums would then start at an offset inside the pack, and the fixed-order sums
that keep the bits would see its keys in other places of the tree.

Run the tests:  python -m pytest -q tests/test_packing.py
Benchmark:      python bench/run_all.py --only lengths
"""
from __future__ import annotations

import numpy as np

MIN_BUCKET = 16
"""The shortest bucket length (also model.MIN_CHUNK: a head chunk keeps >= 16 rows)."""
STEPS_PER_OCTAVE = 8
"""Bucket lengths per doubling: a row is padded by less than 1 / STEPS_PER_OCTAVE of its bucket."""
MAX_ROW_PADDING = 0.15
"""A row joins a microbatch of length T_b only if it is longer than (1 - MAX_ROW_PADDING) x T_b.
Measured on HumanEval chat-prompt batches (8 prompts x 16 rows of 1-16 new tokens, 250 drawn steps):
padding 6.9% median, 8.8% at the 99th percentile, 8.9% at most; 5.4 microbatches per step; 44 distinct
shapes over the 250 steps. One bucket length per microbatch instead: 4.1% padding, 18 microbatches per
step, 94 shapes (each compiled once: the first steps of a run are then mostly compiling)."""


def bucket_len(n: int, cap: int | None = None) -> int:
    """The bucket length a row of n real tokens is padded to: n rounded up to a multiple of
    max(8, 2^(floor(log2 n) - 3)) (8 lengths per octave; whole SIMD tiles of 8 positions), at least
    MIN_BUCKET, at most cap (the run's T)."""
    n = max(int(n), 1)
    step = max(8, (1 << (n.bit_length() - 1)) // STEPS_PER_OCTAVE)
    out = max(MIN_BUCKET, -(-n // step) * step)
    return out if cap is None else min(out, cap)


def real_lengths(mask_RT) -> np.ndarray:
    """Tokens per row that matter: the position after the last completion token (mask > 0); 1 for a
    row with none (it carries no loss and no gradient)."""
    m = np.asarray(mask_RT) > 0
    last = m.shape[1] - np.argmax(m[:, ::-1], axis=1)
    return np.where(m.any(axis=1), last, 1).astype(np.int64)


def plan(lengths, rows_for, cap: int) -> list[tuple[np.ndarray, int]]:
    """The microbatches of one minibatch: [(row indices, length T_b)], longest rows first.
    lengths: real length per row; rows_for(T_b): the most rows a microbatch of length T_b may hold
    (>= 1); cap: the run's T. Every row is in exactly one microbatch, whose length T_b is the bucket
    length of its longest row; every other row in it is longer than (1 - MAX_ROW_PADDING) x T_b."""
    lengths = np.asarray(lengths)
    order = np.argsort(-lengths, kind="stable")
    sorted_len = lengths[order]
    out, i = [], 0
    while i < len(order):
        T_b = bucket_len(sorted_len[i], cap)
        fits = max(int(np.sum(sorted_len[i:] > (1 - MAX_ROW_PADDING) * T_b)), 1)  # the next `fits` rows
        take = min(max(int(rows_for(T_b)), 1), fits)
        take = 1 << (take.bit_length() - 1)  # a power of two: shapes repeat across steps
        out.append((order[i:i + take], T_b))
        i += take
    return out


def pack_batch(data: dict, minibatches: int, rows_for, cap: int | None = None) -> tuple[list[list[dict]], np.ndarray]:
    """The rows of `data` (tokens_RT, mask_RT, logp_behav_RT, adv_R, ...: [R, T] or [R] arrays) as
    [minibatch][microbatch] dicts (the layout update.Update takes), each microbatch's [R, T] arrays cut
    to its bucket length. Minibatches are the same contiguous row ranges as update.split_batch's.
    Returns (minibatches, order): order[j] is the original row of the j-th row of the microbatches
    taken in sequence (see unpack)."""
    n = len(data["mask_RT"])
    T = data["mask_RT"].shape[1]
    cap = T if cap is None else cap
    if not 1 <= minibatches <= n:
        raise ValueError(f"pack_batch needs 1 <= minibatches <= rows; got minibatches={minibatches}, rows={n}")
    lengths = real_lengths(data["mask_RT"])
    sizes = [n // minibatches + (j < n % minibatches) for j in range(minibatches)]
    bounds = np.cumsum([0] + sizes)
    out, order = [], []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        mini = []
        for rows, T_b in plan(lengths[lo:hi], rows_for, cap):
            rows = rows + lo
            order.append(rows)
            mini.append({k: (v[rows, :T_b] if np.ndim(v) == 2 else v[rows]) for k, v in data.items()})
        out.append(mini)
    return out, np.concatenate(order)


def unpack(x_RT, order, shape) -> np.ndarray:
    """Rows in microbatch order (x_RT, each row's first positions; the rest zero) back to the original
    row order and full length: out[order[j], :t] = x_RT[j, :t]; zeros elsewhere."""
    out = np.zeros(shape, np.asarray(x_RT).dtype)
    t = min(shape[1], x_RT.shape[1])
    out[np.asarray(order), :t] = np.asarray(x_RT)[:, :t]
    return out


def padding_frac(minibatches: list) -> float:
    """Share of the positions the update computes on that lie past a row's real length (packed
    microbatches as pack_batch gives them, or split_batch's fixed-length ones)."""
    total = real = 0
    for mini in minibatches:
        for mb in mini:
            total += mb["mask_RT"].size
            real += int(real_lengths(mb["mask_RT"]).sum())
    return 1.0 - real / max(total, 1)
