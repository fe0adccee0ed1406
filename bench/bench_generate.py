"""Generation throughput: this project's KV-cache sampler (sampler.generate) vs transformers' generate,
on the same weights and dtype, side by side in one run.

Run:  python bench/bench_generate.py                 # both sizes at their default batch, bf16 (a few minutes)
      python bench/bench_generate.py --sizes 3m --repeats 5
      python bench/bench_generate.py --sizes 3m 100m --batches 64 16 --dtypes bfloat16 float32   # run_all's grid
      python bench/bench_generate.py --torch-device cuda   # on a GPU machine (jax uses its default device)

What is measured: wall time of one full generate call (prefill + max_new_tokens sampled tokens) for a
batch of 32-token prompts, median over --repeats timed calls per side after one warm-up call each (the
warm-up includes our jit compile, reported separately). The two sides alternate call by call, so load
changes on a shared machine hit both alike. tokens/s = batch * max_new_tokens / median seconds.
Ours runs cfg.dtype (bfloat16 with cfg.bf16_fix=True, the bitwise-parity configuration, or float32);
transformers runs the same weights (saved by hf_io.save_hf, loaded by from_pretrained) in the same
dtype, with its fast settings: use_cache=True (the default), torch.no_grad, torch.set_num_threads(nproc),
the sdpa attention transformers picks by default; torch's threads are nproc or 1, whichever
generates faster in a probe call (on a loaded shared machine nproc threads can be several times slower). --torch-f32 additionally times transformers on the
f32 copy of bf16 weights (the old reference row). No eos: every row produces exactly max_new_tokens
tokens on both sides (multinomial sampling, temperature 1, top_k 0, top_p 1).

Prints `RESULT name=generation size=.. batch=.. dtype=.. ours_tok_s=.. peer_tok_s=.. ratio=..` per case.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import hf_io  # noqa: E402
import model  # noqa: E402
import sampler  # noqa: E402

SIZES = {  # issue 2: "about 3M" and "about 100M"
    "3m": dict(cfg=dict(vocab_size=512, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64,
                        intermediate_size=768), batch=64),
    "100m": dict(cfg=dict(vocab_size=32000, hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4,
                          head_dim=64, intermediate_size=2048), batch=16),
}
NPROC = len(os.sched_getaffinity(0))


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def peak_gflops(n: int = 2048, reps: int = 5) -> float:
    """This machine's float32 matmul peak: the median GFLOP/s of an n^3 numpy matmul."""
    a = np.random.default_rng(0).standard_normal((n, n), np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), np.float32)
    a @ b
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        ts.append(time.perf_counter() - t0)
    return 2 * n ** 3 / statistics.median(ts) / 1e9


def bench(size: str, prompt_len: int, new_tokens: int, repeats: int, torch_f32: bool, torch_device: str = "cpu",
          batch: int | None = None, dtype: str = "bfloat16", peak: float = 0.0):
    import torch
    import transformers

    spec = SIZES[size]
    B, T = batch or spec["batch"], prompt_len + new_tokens
    cfg = model.ModelConfig(**spec["cfg"], max_seq_len=max(T, 256), rope_theta=10000.0, rms_norm_eps=1e-6,
                            qkv_bias=True, tie_embeddings=False, model_type="qwen2", dtype=dtype,
                            bf16_fix=dtype == "bfloat16")
    params = model.init_params(cfg, jax.random.key(0))
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    prompts_RP = np.random.RandomState(0).randint(0, cfg.vocab_size, (B, prompt_len)).astype(np.int32)
    prompt_RT = np.zeros((B, T), np.int32)
    prompt_RT[:, :prompt_len] = prompts_RP
    prompt_len_R = np.full(B, prompt_len)
    keys = iter(jax.random.split(jax.random.key(1), repeats + 1))

    def ours():
        out = sampler.generate(params, cfg, prompt_RT, prompt_len_R, next(keys), max_new_tokens=new_tokens)
        assert out.mask_RT.sum() == B * new_tokens

    torch.set_num_threads(NPROC)
    tdt = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    sides = [("ours", f"ours (jax, {dtype}" + (", bf16_fix=True)" if dtype == "bfloat16" else ")"), ours)]
    with tempfile.TemporaryDirectory() as tmp:
        hf_io.save_hf(tmp, cfg, params)
        dts = [(dtype, tdt)] + ([("f32 copy", torch.float32)] if torch_f32 and dtype != "float32" else [])
        for name, dt in dts:
            hf = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=dt).eval().to(torch_device)
            inp = torch.tensor(prompts_RP, dtype=torch.long, device=torch_device)

            def theirs(hf=hf, inp=inp):
                with torch.no_grad():
                    out = hf.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=new_tokens,
                                      min_new_tokens=new_tokens, do_sample=True, temperature=1.0, top_k=0,
                                      top_p=1.0, pad_token_id=0, eos_token_id=None, use_cache=True)
                assert out.shape == (B, prompt_len + new_tokens)
                if torch_device != "cpu":
                    torch.cuda.synchronize()

            sides.append(("peer" if name == dtype else "peer_f32",
                          f"transformers {transformers.__version__} ({name}, {torch_device})", theirs))
        torch.manual_seed(0)
        first = {key: _timed(fn) for key, _, fn in sides}  # warm-up (our compile)
        if torch_device == "cpu" and NPROC > 1:
            # torch's threads: nproc (its usual setting) or 1, whichever is faster here: on a shared,
            # loaded machine nproc threads can be several times slower (they spin waiting for each other)
            probe = {}
            for n in (NPROC, 1):
                torch.set_num_threads(n)
                probe[n] = _timed(sides[1][2])
            torch.set_num_threads(min(probe, key=probe.get))
            print(f"  torch threads: " + ", ".join(f"{v:.2f} s with {k}" for k, v in probe.items())
                  + f": using {torch.get_num_threads()}", flush=True)
        times = {key: [] for key, _, _ in sides}
        for _ in range(repeats):  # alternating
            for key, _, fn in sides:
                times[key].append(_timed(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    toks = B * new_tokens
    print(f"\n== size {size}: {n_params / 1e6:.1f}M params, batch {B}, {dtype}, prompt {prompt_len}, "
          f"{new_tokens} new tokens, median of {repeats} ==")
    for key, name, _ in sides:
        print(f"  {name:<44s} {med[key]:8.3f} s  {toks / med[key]:10.1f} tok/s   (first call {first[key]:.2f} s)")
    for key, name, _ in sides[1:]:
        print(f"  ratio ours / {name}: {med[key] / med['ours']:.2f}x")
    # Matmul FLOPs per sampled token: 2 x the parameters that multiply (all but the input embedding,
    # a lookup; attention over the short cache is left out), as a share of the measured peak: how far
    # from the machine's ceiling each side is, so whether a ratio is reachable at all.
    flop_tok = 2 * (n_params - cfg.vocab_size * cfg.hidden_size)
    frac = {k: toks / med[k] * flop_tok / (peak * 1e9) if peak else 0.0 for k in ("ours", "peer")}
    if peak:
        print(f"  share of the float32 matmul peak ({peak:.0f} GFLOP/s): ours {frac['ours']:.0%}, "
              f"transformers {frac['peer']:.0%}")
    print(f"RESULT name=generation size={size} batch={B} dtype={dtype} params_m={n_params / 1e6:.1f} "
          f"new_tokens={new_tokens} repeats={repeats} ours_tok_s={toks / med['ours']:.1f} "
          f"peer_tok_s={toks / med['peer']:.1f} ratio={med['peer'] / med['ours']:.3f} "
          f"ours_peak_frac={frac['ours']:.3f} peer_peak_frac={frac['peer']:.3f} peak_gflops={peak:.1f} "
          f"ours_compile_s={first['ours'] - med['ours']:.2f} torch_threads={torch.get_num_threads()}", flush=True)
    return med


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["3m", "100m"], choices=list(SIZES), help="model sizes to run")
    ap.add_argument("--batches", nargs="+", type=int, default=None,
                    help="batch sizes to run for every size (default: 64 for 3m, 16 for 100m)")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16"], choices=["bfloat16", "float32"],
                    help="dtypes to run; both sides run the same one")
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per row")
    ap.add_argument("--new-tokens", type=int, default=128, help="sampled tokens per row")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per side (median reported)")
    ap.add_argument("--repeats-100m", type=int, default=None, help="timed calls per side for 100m (default --repeats)")
    ap.add_argument("--torch-f32", action="store_true", help="also time transformers with f32 weights")
    ap.add_argument("--torch-device", default="cpu", help="where transformers runs: cpu, or cuda on a GPU machine")
    args = ap.parse_args()
    peak = peak_gflops() if args.torch_device == "cpu" else 0.0
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {NPROC} cpus; float32 matmul peak (numpy "
          f"2048^3, median of 5) {peak:.1f} GFLOP/s")
    for size in args.sizes:
        reps = args.repeats_100m if size == "100m" and args.repeats_100m else args.repeats
        for batch in args.batches or [None]:
            for dtype in args.dtypes:
                bench(size, args.prompt_len, args.new_tokens, reps, args.torch_f32, args.torch_device, batch, dtype,
                      peak)
