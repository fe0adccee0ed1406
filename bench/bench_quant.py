"""The int8 sampler (quant.py, SAMPLER_QUANT=int8) against the bf16 one: generation speed, weight bytes,
and how far its log-probs are from the bf16 trainer's, side by side in one run.

Run:  python bench/bench_quant.py                          # 3m and 100m, 16 rows (a few minutes on 2 cores)
      python bench/bench_quant.py --sizes 3m --repeats 5
      python bench/bench_quant.py --sizes coldstart        # the embedded policy (checkpoints/coldstart)

What is measured, per size (bench_generate.py's 3m and 100m configs with random weights, bf16 with the
precision policy; or the embedded cold-start checkpoint):
  * tokens/s of sampler.generate on the int8 weights and on the bf16 weights (16 rows of 32-token random
    prompts, --new-tokens sampled tokens each, no eos), after one untimed warm-up call per side (the
    compile), the two sides alternating call by call, median of --repeats; speedup = int8 / bf16;
  * the weight bytes the worker holds (quant.params_bytes): bytes_ratio = int8 / bf16 for the whole
    tree (the embedding and head stay bf16) and layer_bytes_ratio for the quantised layers alone;
  * the mismatch, per sampled token of the int8 calls: the int8 sampler's reported log-probs against
    the bf16 trainer's model.token_logprobs on the same tokens, as the trainer's mismatch/* metrics
    compute them (grpo.mismatch_metrics): k3_kl = mean(exp(d) - 1 - d), mean_abs_dlogp = mean |d|,
    d = log p_bf16 - log p_int8; and bf16_bitwise, the same comparison for the bf16 sampler (1.0: the
    control, the fix holds, so every difference on the int8 side is the quantisation's).

Prints `RESULT name=quant size=.. speedup=.. k3_kl=.. mean_abs_dlogp=.. bytes_ratio=.. ...` per size.
"""
import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import grpo  # noqa: E402
import hf_io  # noqa: E402
import model  # noqa: E402
import sampler  # noqa: E402
import quant  # noqa: E402
from bench_generate import SIZES  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def model_for(size: str, T: int):
    """(cfg, bf16 params): bench_generate's random-weight config, or the embedded cold-start policy."""
    if size == "coldstart":
        return hf_io.load_hf(os.path.join(ROOT, "checkpoints", "coldstart"), dtype="bfloat16")
    cfg = model.ModelConfig(**SIZES[size]["cfg"], max_seq_len=max(T, 256), rope_theta=10000.0, rms_norm_eps=1e-6,
                            qkv_bias=True, tie_embeddings=False, model_type="qwen2", dtype="bfloat16")
    return cfg, model.init_params(cfg, jax.random.key(0))


def bench(size: str, rows: int, prompt_len: int, new_tokens: int, repeats: int) -> None:
    cfg, params = model_for(size, prompt_len + new_tokens)
    if prompt_len + new_tokens > cfg.max_seq_len:  # the cold start's 88 positions
        new_tokens = cfg.max_seq_len - prompt_len
    T = prompt_len + new_tokens
    qparams = quant.quantise_params(params, "int8")
    rng = np.random.RandomState(0)
    prompt_RT = np.zeros((rows, T), np.int32)
    prompt_RT[:, :prompt_len] = rng.randint(0, cfg.vocab_size, (rows, prompt_len))
    prompt_len_R = np.full(rows, prompt_len)
    keys = iter(jax.random.split(jax.random.key(1), 2 * repeats + 2))
    outs = {"bf16": [], "int8": []}

    def side(name, p):
        def call():
            out = sampler.generate(p, cfg, prompt_RT, prompt_len_R, next(keys), max_new_tokens=new_tokens)
            assert out.mask_RT.sum() == rows * new_tokens
            outs[name].append(out)
        return call

    sides = {"bf16": side("bf16", params), "int8": side("int8", qparams)}
    first = {}
    for name, fn in sides.items():  # warm-up: the compile
        t0 = time.perf_counter()
        fn()
        first[name] = time.perf_counter() - t0
    times = {name: [] for name in sides}
    for _ in range(repeats):  # alternating
        for name, fn in sides.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    tok_s = {k: rows * new_tokens / v for k, v in med.items()}

    # the mismatch: each sampler's reported log-probs against the bf16 trainer's on the same tokens
    score = jax.jit(lambda p, t: model.token_logprobs(p, cfg, t))
    mm = {}
    for name in sides:
        behav = np.concatenate([o.logp_behav_RT for o in outs[name]])
        tokens = np.concatenate([o.tokens_RT for o in outs[name]])
        mask = np.concatenate([o.mask_RT for o in outs[name]])
        trainer = np.concatenate([np.asarray(score(params, jnp.asarray(tokens[i:i + rows])))
                                  for i in range(0, len(tokens), rows)])
        mm[name] = {k: float(v) for k, v in grpo.mismatch_metrics(behav, trainer, mask).items()}
    b_bf16, b_int8 = quant.params_bytes(params), quant.params_bytes(qparams)
    layers = lambda p: quant.params_bytes(p["layers"])  # noqa: E731
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    m = mm["int8"]
    print(f"\n== size {size}: {n_params / 1e6:.1f}M params, {rows} rows, prompt {prompt_len}, {new_tokens} new "
          f"tokens, median of {repeats} ==")
    for name in sides:
        print(f"  {name:5s} {med[name]:8.3f} s  {tok_s[name]:9.1f} tok/s  (first call {first[name]:.2f} s)")
    print(f"  weights: bf16 {b_bf16 / 2**20:.1f} MiB, int8 {b_int8 / 2**20:.1f} MiB (layers {layers(params) / 2**20:.1f}"
          f" -> {layers(qparams) / 2**20:.1f} MiB)")
    print(f"  int8 sampler vs bf16 trainer over {int(m['num_tokens'])} tokens: k3 KL {m['k3_kl']:.3g}, mean |dlogp| "
          f"{m['mean_abs_logp_diff']:.3g}, max |dlogp| {m['max_abs_logp_diff']:.3g}, bitwise {m['bitwise_frac']:.3f}; "
          f"bf16 sampler: bitwise {mm['bf16']['bitwise_frac']:.3f}")
    print(f"RESULT name=quant size={size} params_m={n_params / 1e6:.1f} rows={rows} new_tokens={new_tokens} "
          f"repeats={repeats} int8_tok_s={tok_s['int8']:.1f} bf16_tok_s={tok_s['bf16']:.1f} "
          f"speedup={tok_s['int8'] / tok_s['bf16']:.3f} k3_kl={m['k3_kl']:.4g} mean_abs_dlogp={m['mean_abs_logp_diff']:.4g} "
          f"max_abs_dlogp={m['max_abs_logp_diff']:.4g} int8_bitwise={m['bitwise_frac']:.4f} "
          f"bf16_bitwise={mm['bf16']['bitwise_frac']:.4f} tokens={int(m['num_tokens'])} "
          f"bytes_ratio={b_int8 / b_bf16:.3f} layer_bytes_ratio={layers(qparams) / layers(params):.3f} "
          f"bf16_mib={b_bf16 / 2**20:.1f} int8_mib={b_int8 / 2**20:.1f}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["3m", "100m"], choices=list(SIZES) + ["coldstart"])
    ap.add_argument("--rows", type=int, default=16, help="decode rows (prompts) per call")
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per row")
    ap.add_argument("--new-tokens", type=int, default=64, help="sampled tokens per row")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per side (median reported)")
    args = ap.parse_args()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {len(os.sched_getaffinity(0))} cpus")
    for size in args.sizes:
        bench(size, args.rows, args.prompt_len, args.new_tokens, args.repeats)
