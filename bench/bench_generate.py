"""Generation throughput: this project's KV-cache sampler (model.generate) vs transformers' generate,
on the same weights, side by side in one run.

Run:  python bench/bench_generate.py                 # both sizes from issue 2 (a few minutes on 2 cores)
      python bench/bench_generate.py --sizes 3m --repeats 5
      python bench/bench_generate.py --torch-device cuda   # on a GPU machine (jax uses its default device)

What is measured: wall time of one full generate call (prefill + max_new_tokens sampled tokens) for a
batch of 32-token prompts, median over --repeats after one warm-up call (the warm-up includes our jit
compile, reported separately). tokens/s = batch * max_new_tokens / median seconds. Ours runs in
cfg.dtype=bfloat16 with cfg.bf16_fix=True (the bitwise-parity configuration); transformers runs the same
bf16 weights (torch bf16 CPU kernels) and, for reference, the f32 copy. No eos: every row produces exactly
max_new_tokens tokens on both sides (multinomial sampling, temperature 1).
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

SIZES = {  # issue 2: "about 3M" and "about 100M"
    "3m": dict(cfg=dict(vocab_size=512, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64,
                        intermediate_size=768), batch=64),
    "100m": dict(cfg=dict(vocab_size=32000, hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4,
                          head_dim=64, intermediate_size=2048), batch=16),
}


def _time(fn, repeats):
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def bench(size: str, prompt_len: int, new_tokens: int, repeats: int, torch_f32: bool, torch_device: str = "cpu"):
    import torch
    import transformers

    spec = SIZES[size]
    B, T = spec["batch"], prompt_len + new_tokens
    cfg = model.ModelConfig(**spec["cfg"], max_seq_len=max(T, 256), rope_theta=10000.0, rms_norm_eps=1e-6,
                            qkv_bias=True, tie_embeddings=False, model_type="qwen2", dtype="bfloat16", bf16_fix=True)
    params = model.init_params(cfg, jax.random.key(0))
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    prompts_BP = np.random.RandomState(0).randint(0, cfg.vocab_size, (B, prompt_len)).astype(np.int32)
    prompt_BT = np.zeros((B, T), np.int32)
    prompt_BT[:, :prompt_len] = prompts_BP
    prompt_len_B = np.full(B, prompt_len)
    keys = iter(jax.random.split(jax.random.key(1), repeats + 1))

    def ours():
        out = model.generate(params, cfg, prompt_BT, prompt_len_B, next(keys), max_new_tokens=new_tokens)
        assert out["mask_BT"].sum() == B * new_tokens

    first, ours_s = _time(ours, repeats)
    rows = [("ours (jax, bf16, bf16_fix=True)", ours_s, first)]

    with tempfile.TemporaryDirectory() as tmp:
        hf_io.save_hf(tmp, cfg, params)
        torch.set_num_threads(os.cpu_count())
        dtypes = [("bf16", torch.bfloat16)] + ([("f32", torch.float32)] if torch_f32 else [])
        for name, dt in dtypes:
            hf = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=dt).eval().to(torch_device)
            inp = torch.tensor(prompts_BP, dtype=torch.long, device=torch_device)

            def theirs():
                with torch.no_grad():
                    out = hf.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=new_tokens,
                                      min_new_tokens=new_tokens, do_sample=True, temperature=1.0, top_k=0,
                                      top_p=1.0, pad_token_id=0, eos_token_id=None)
                assert out.shape == (B, prompt_len + new_tokens)
                if torch_device != "cpu":
                    torch.cuda.synchronize()

            torch.manual_seed(0)
            first_hf, hf_s = _time(theirs, repeats)
            rows.append((f"transformers {transformers.__version__} ({name}, {torch_device})", hf_s, first_hf))

    toks = B * new_tokens
    print(f"\n== size {size}: {n_params / 1e6:.1f}M params, batch {B}, prompt {prompt_len}, {new_tokens} new tokens, "
          f"median of {repeats} ==")
    for name, s, first in rows:
        print(f"  {name:<40s} {s:8.3f} s  {toks / s:10.1f} tok/s   (first call {first:.2f} s)")
    for name, s, _ in rows[1:]:
        print(f"  ratio ours / {name}: {s / ours_s:.2f}x")
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["3m", "100m"], choices=list(SIZES), help="model sizes to run")
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per row")
    ap.add_argument("--new-tokens", type=int, default=128, help="sampled tokens per row")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per side (median reported)")
    ap.add_argument("--torch-f32", action="store_true", help="also time transformers with f32 weights")
    ap.add_argument("--torch-device", default="cpu", help="where transformers runs: cpu, or cuda on a GPU machine")
    args = ap.parse_args()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} cpus")
    for size in args.sizes:
        bench(size, args.prompt_len, args.new_tokens, args.repeats, args.torch_f32, args.torch_device)
