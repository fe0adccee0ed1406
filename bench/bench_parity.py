"""Sampler vs trainer log-prob parity on THIS backend: the precision policy (model.py, PRECISION POLICY)
measured, not assumed: GPUs and TPUs fuse differently, so the same checks must run there.

For each precision configuration and decode batch size: sample with the KV-cache decoder
(sampler.generate, the inference worker's code path), then recompute the log-probs of the same tokens the
way the trainer does, inside jax.jit(jax.value_and_grad(...)) of model.token_logprobs, at several
scoring batch sizes, and compare with grpo.mismatch_metrics. A configuration is bitwise when every
sampled token's log-prob is equal in all 32 bits.

Run:  python bench/bench_parity.py                       # small model (4 layers, d=256), both configurations
      python bench/bench_parity.py --size 100m --rows 16 64
      XLA_FLAGS=--xla_gpu_enable_triton_gemm=false python bench/bench_parity.py   # a compiler variant

Prints one line per (configuration, decode rows, scoring batch) and a verdict per configuration;
--json FILE also writes the rows.
"""
import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import grpo  # noqa: E402
import model  # noqa: E402
import sampler  # noqa: E402

SIZES = {  # "small" is the 4-layer d=256 model of docs/numerics.md "On a GPU"; "100m" the larger size of bench_generate.py
    "small": dict(vocab_size=512, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64,
                  intermediate_size=768),
    "100m": dict(vocab_size=32000, hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4, head_dim=64,
                 intermediate_size=2048),
}


def measure(size: str, bf16_fix: bool, n_rows: int, score_batches, prompt_len: int, new_tokens: int,
            temperature: float) -> list[dict]:
    T = prompt_len + new_tokens
    cfg = model.ModelConfig(**SIZES[size], max_seq_len=T, rope_theta=10000.0, rms_norm_eps=1e-6, qkv_bias=True,
                            tie_embeddings=False, model_type="qwen2", dtype="bfloat16", bf16_fix=bf16_fix)
    params = model.init_params(cfg, jax.random.key(0))
    rs = np.random.RandomState(n_rows)
    prompt_len_R = rs.randint(prompt_len // 2, prompt_len + 1, n_rows)
    prompt_RT = rs.randint(1, cfg.vocab_size, (n_rows, T)).astype(np.int32)
    prompt_RT[np.arange(T)[None] >= prompt_len_R[:, None]] = 0
    out = sampler.generate(params, cfg, prompt_RT, prompt_len_R, jax.random.key(1), max_new_tokens=new_tokens,
                           temperature=temperature)
    tokens_RT, mask_RT = out.tokens_RT, out.mask_RT

    def loss(p, toks, m):  # the trainer's graph: log-probs under value_and_grad (remat under the policy)
        lp = model.token_logprobs(p, cfg, toks, temperature)
        return jnp.sum(lp * m), lp

    score = jax.jit(jax.value_and_grad(loss, has_aux=True))
    rows = []
    for sb in score_batches:
        reps = -(-sb // n_rows)  # scoring batches bigger than the decode batch repeat its rows
        toks = np.concatenate([tokens_RT] * reps)
        msk = np.concatenate([mask_RT] * reps)
        parts = []
        for i in range(0, n_rows, sb):
            j = min(i + sb, len(toks))
            chunk, cmask = toks[i:j], msk[i:j]
            if len(chunk) < sb:  # pad the last chunk to the scoring batch with repeated rows
                chunk = np.concatenate([chunk, toks[:sb - len(chunk)]])
                cmask = np.concatenate([cmask, msk[:sb - len(cmask)]])
            (_, lp), _ = score(params, jnp.asarray(chunk), jnp.asarray(cmask))
            parts.append(np.asarray(lp)[:j - i])
        logp_trainer = np.concatenate(parts)[:n_rows]
        mm = {k: float(v) for k, v in grpo.mismatch_metrics(out.logp_behav_RT, logp_trainer, mask_RT).items()}
        rows.append({"size": size, "bf16_fix": bf16_fix, "decode_rows": n_rows, "score_batch": sb, **mm})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="small", choices=list(SIZES))
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64], help="decode batch sizes")
    ap.add_argument("--score-batches", type=int, nargs="+", default=[1, 8, 32], help="trainer batch sizes")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--fix", choices=["on", "off", "both"], default="both")
    ap.add_argument("--json", default="", help="also write the rows to this file (JSON lines)")
    args = ap.parse_args()
    dev = jax.devices()[0]
    print(f"jax {jax.__version__} on {dev.platform} ({dev.device_kind}); XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    fixes = {"on": [True], "off": [False], "both": [True, False]}[args.fix]
    all_rows = []
    for fix in fixes:
        t0, rows = time.perf_counter(), []
        for n in args.rows:
            rows += measure(args.size, fix, n, args.score_batches, args.prompt_len, args.new_tokens,
                            args.temperature)
        print(f"\n== {args.size}, bf16_fix={fix} ({time.perf_counter() - t0:.0f} s) ==")
        print(f"  {'rows':>4} {'score':>5} {'tokens':>7} {'bitwise':>8} {'max|dlogp|':>11} {'mean|dlogp|':>12}"
              f" {'k3 KL':>9}")
        for r in rows:
            print(f"  {r['decode_rows']:>4} {r['score_batch']:>5} {int(r['num_tokens']):>7} {r['bitwise_frac']:>8.4f}"
                  f" {r['max_abs_logp_diff']:>11.3g} {r['mean_abs_logp_diff']:>12.3g} {r['k3_kl']:>9.2g}")
        ok = all(r["bitwise_frac"] == 1.0 for r in rows)
        print(f"  verdict: {'BITWISE in every cell' if ok else 'NOT bitwise'} "
              f"(min bitwise_frac {min(r['bitwise_frac'] for r in rows):.4f})")
        all_rows += rows
    if args.json:
        with open(args.json, "a") as f:
            for r in all_rows:
                f.write(json.dumps({**r, "backend": dev.platform, "xla_flags": os.environ.get("XLA_FLAGS", "")}) + "\n")


if __name__ == "__main__":
    main()
