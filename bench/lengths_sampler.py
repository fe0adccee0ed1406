"""Sampler stage of the real-lengths benchmark: static batches (sampler.generate) against continuous batching
(continuous.generate_continuous) on a long-tailed completion-length distribution, side by side in one run.

Run:  python bench/lengths_sampler.py                      # defaults below, a few minutes on 2 CPU cores
      python bench/lengths_sampler.py --rows 64 --repeats 5 --hidden 128

Rows. --rows prompts of uniform random lengths in [--prompt-min, --prompt-max] (random token ids), one
PRNG key per row. Each row's completion length is drawn once from a long-tailed distribution, the shape
GRPO rollouts have (most answers short, a few long): with probability --long-frac uniform in
[--long-min, --long-max] (default 20%: 128..512 tokens), else uniform in [--short-min, --short-max]
(80%: 8..32). How the lengths are imposed (the honest, simple way): no eos; each row gets its drawn
length as its own token budget. A random model has no notion of "done", so these budgets stand in for
the step at which a trained policy would emit eos; both sides get the same rows, keys and budgets and
both stop a row exactly there.
  static:     what the worker does today: the rows in order, in batches of --slots rows, each batch one
              sampler.generate call (prompts padded to one T; generate sizes its cache and prefill to the
              batch's longest prompt and budget), decoded until its longest row is done (max_new_tokens = the batch's
              largest budget; a shorter row's tokens past its budget are not useful: with eos it would
              be done, its slot idle). generate is bitwise per row, so cutting at the budget is the
              same completion the row would get alone.
  continuous: one continuous.generate_continuous call on all rows, --slots decode slots, per-row budgets;
              a row that ends frees its slot for the next waiting row (prefill over its real prompt
              tokens only).
Both use the same cache length T = --prompt-max + --long-max (each row fits), bf16 with the precision
policy, temperature 1. Before timing, the continuous rows are checked bitwise equal to the static
rows' first budget tokens (tokens and log-probs).
Figures:
  slot_util = useful decode tokens / (slots x decode steps run): static: sum of budgets / (slots x sum
              over batches of the batch's largest budget); continuous: generate_continuous' stats.
  useful_tokens_per_s = sum of budgets / wall seconds of the whole side (prefill included), median of
              --repeats timed runs, the two sides alternating, after one warm-up run of each (compiles:
              static compiles once per distinct batch maximum, since max_new_tokens is static in jit).
Prints exactly one line:
  RESULT name=lengths stage=sampler slot_util_static=U1 slot_util_continuous=U2 useful_tokens_per_s_static=C
         useful_tokens_per_s_continuous=D speedup=Y        (speedup = D / C)
main(argv) returns the figures as a dict.
"""
import argparse
import os
import statistics
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import continuous  # noqa: E402
import model  # noqa: E402
import sampler  # noqa: E402
from random_weights import random_params  # noqa: E402


def draw_rows(args, vocab):
    rng = np.random.default_rng(args.seed)
    plen = rng.integers(args.prompt_min, args.prompt_max + 1, args.rows)
    prompts = [rng.integers(1, vocab, n).astype(np.int32) for n in plen]
    long = rng.random(args.rows) < args.long_frac
    budget = np.where(long, rng.integers(args.long_min, args.long_max + 1, args.rows),
                      rng.integers(args.short_min, args.short_max + 1, args.rows))
    return prompts, budget.astype(np.int64)


def run_static(params, cfg, prompts, keys, budget, T, slots):
    """The rows in batches of `slots`, one generate() call each; returns (seconds, per-row outputs, steps)."""
    outs, steps = [], 0
    t0 = time.perf_counter()
    for b0 in range(0, len(prompts), slots):
        rows = range(b0, min(b0 + slots, len(prompts)))
        prompt_RT = np.zeros((len(rows), T), np.int32)
        for j, r in enumerate(rows):
            prompt_RT[j, :prompts[r].size] = prompts[r]
        n = int(budget[list(rows)].max())
        out = sampler.generate(params, cfg, prompt_RT, np.array([prompts[r].size for r in rows]), keys[b0:rows.stop],
                               max_new_tokens=n)
        outs += [out.take([j]) for j in range(len(rows))]
        steps += n
    return time.perf_counter() - t0, outs, steps


def run_continuous(params, cfg, prompts, keys, budget, T, slots, refill):
    t0 = time.perf_counter()
    out = continuous.generate_continuous(params, cfg, prompts, keys, cache_len=T, max_new_tokens=budget, slots=slots,
                                    refill=refill)
    return time.perf_counter() - t0, out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=96)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--refill", type=int, default=1, help="generate_continuous refill (host round trip when this many slots are free)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt-min", type=int, default=16)
    ap.add_argument("--prompt-max", type=int, default=64)
    ap.add_argument("--short-min", type=int, default=8)
    ap.add_argument("--short-max", type=int, default=32)
    ap.add_argument("--long-min", type=int, default=128)
    ap.add_argument("--long-max", type=int, default=512)
    ap.add_argument("--long-frac", type=float, default=0.2)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    T = args.prompt_max + args.long_max
    cfg = model.ModelConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers,
                            num_heads=args.heads, num_kv_heads=args.kv_heads, head_dim=args.hidden // args.heads,
                            intermediate_size=2 * args.hidden, max_seq_len=T, rope_theta=1e4, rms_norm_eps=1e-6,
                            qkv_bias=True, tie_embeddings=False)
    params = random_params(cfg, args.seed)
    prompts, budget = draw_rows(args, cfg.vocab_size)
    keys = jax.random.split(jax.random.key(args.seed + 1), args.rows)
    useful = int(budget.sum())
    print(f"{args.rows} rows, budgets: {np.mean(budget < args.long_min):.0%} short, max {budget.max()}, "
          f"mean {budget.mean():.1f}; {useful} useful tokens; T = {T}; {args.slots} slots; "
          f"{model.param_count(cfg) / 1e6:.2f}M parameters", flush=True)

    # warm-up (compiles) + bitwise check: continuous rows == the static rows cut at their budgets
    t_s, outs, steps_static = run_static(params, cfg, prompts, keys, budget, T, args.slots)
    t_c, cont = run_continuous(params, cfg, prompts, keys, budget, T, args.slots, args.refill)
    bitwise = True
    for r, o in enumerate(outs):
        p, n = prompts[r].size, int(budget[r])
        bitwise &= (cont.completion_len_R[r] == n and np.array_equal(cont.tokens_RT[r, :p + n], o.tokens_RT[0, :p + n])
                    and np.array_equal(cont.completion(r)[1], o.logp_behav_RT[0, p:p + n]))
    util_static = useful / (args.slots * steps_static)
    st = cont.stats
    print(f"warm-up (compiles): static {t_s:.1f} s, continuous {t_c:.1f} s; continuous rows bitwise equal to "
          f"static rows: {bitwise}; static steps {steps_static}, continuous steps {st['decode_steps']}, "
          f"host round trips {st['host_round_trips']}, prefill calls {st['prefill_calls']}", flush=True)
    times = {"static": [], "continuous": []}
    for r in range(args.repeats):
        times["static"].append(run_static(params, cfg, prompts, keys, budget, T, args.slots)[0])
        times["continuous"].append(run_continuous(params, cfg, prompts, keys, budget, T, args.slots, args.refill)[0])
        print(f"repeat {r}: static {times['static'][-1]:.2f} s, continuous {times['continuous'][-1]:.2f} s", flush=True)
    c = useful / statistics.median(times["static"])
    d = useful / statistics.median(times["continuous"])
    res = {"slot_util_static": util_static, "slot_util_continuous": st["slot_util"],
           "useful_tokens_per_s_static": c, "useful_tokens_per_s_continuous": d, "speedup": d / c,
           "bitwise": bool(bitwise), "decode_steps_static": steps_static, "decode_steps_continuous": st["decode_steps"],
           "useful_tokens": useful}
    print(f"RESULT name=lengths stage=sampler slot_util_static={util_static:.4f} "
          f"slot_util_continuous={st['slot_util']:.4f} useful_tokens_per_s_static={c:.1f} "
          f"useful_tokens_per_s_continuous={d:.1f} speedup={d / c:.2f}", flush=True)
    if not bitwise:
        raise SystemExit("continuous batching's rows differ from the static rows")
    return res


if __name__ == "__main__":
    main()
