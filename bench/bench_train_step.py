"""The GRPO training step: ours (update.make_update: forward + backward + optax update, jitted) vs the
same step written in PyTorch on transformers' Qwen2 model with the same weights, side by side in one run.

Run:  python bench/bench_train_step.py                     # 3m (16 x 160) and 100m (8 x 160), ~5 min on 2 cores
      python bench/bench_train_step.py --sizes 3m --repeats 5

One step, both sides: per-token log-probs at temperature 1 of a batch of B rows x 160 tokens (32 prompt
tokens, 128 completion tokens under the mask), a PPO-clip loss (clip 0.2 low / 0.28 high, token-mean
aggregation over the masked tokens, advantages given per row), backward, gradient clip to global norm
1.0, one Adam step (lr 1e-6) on float32 master weights.
  ours:  update.make_update(ModelConfig(dtype=bfloat16, bf16_fix=True|False), GRPOConfig() (its defaults:
         ppo clip, token_mean, TIS on pi_old/pi_behav), optax.chain(clip_by_global_norm(1), adam)),
         the whole batch as one microbatch. The forward runs the bf16 cast of the f32 master, as the trainer does.
  peer:  transformers Qwen2ForCausalLM loaded from the same weights (hf_io.save_hf), torch.optim.Adam,
         torch.nn.utils.clip_grad_norm_, torch.set_num_threads(nproc); two variants, both timed:
         f32 weights and compute, and f32 master weights under torch.autocast(cpu, bfloat16) (the
         mixed-precision recipe). The faster of the two is the peer in the RESULT line.
Timing: median over --repeats steps per side after two warm-up steps each (compile), the sides alternating.
tokens/s = B * 160 / step seconds. MFU = 6 * params * tokens / seconds / peak, with peak the median
GFLOP/s of a 2048^3 float32 matmul (numpy) measured in this run.

Prints `RESULT name=train_step size=.. ours_tok_s=.. peer_tok_s=.. ratio=.. nofix_tok_s=.. fix_cost=..`.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import grpo  # noqa: E402
import hf_io  # noqa: E402
import model  # noqa: E402
import update  # noqa: E402
from bench_generate import SIZES, peak_gflops  # noqa: E402

NPROC = len(os.sched_getaffinity(0))
BATCH = {"3m": 16, "100m": 8}
SEQ, PROMPT = 160, 32
LR = 1e-6


def torch_bf16_peak_gflops(n: int = 2048, reps: int = 5) -> float:
    """The bf16 matmul peak as torch reaches it here (oneDNN uses avx512_bf16 / AMX where the CPU has them)."""
    import torch
    a, b = torch.randn(n, n, dtype=torch.bfloat16), torch.randn(n, n, dtype=torch.bfloat16)
    a @ b
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        ts.append(time.perf_counter() - t0)
    return 2 * n ** 3 / statistics.median(ts) / 1e9


def make_cfg(size: str, fix: bool) -> model.ModelConfig:
    return model.ModelConfig(**SIZES[size]["cfg"], max_seq_len=256, rope_theta=10000.0, rms_norm_eps=1e-6,
                             qkv_bias=True, tie_embeddings=False, model_type="qwen2", dtype="bfloat16", bf16_fix=fix)


def batch_data(cfg, B: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab_size, (B, SEQ)).astype(np.int32)
    mask = np.zeros((B, SEQ), np.float32)
    mask[:, PROMPT:] = 1.0
    adv = rng.standard_normal(B).astype(np.float32)
    return {"tokens_RT": tokens, "mask_RT": mask, "adv_R": adv}


def ours_step(cfg, params, data):
    """A callable doing one real update (state carried between calls). data["logp_behav_RT"]: the
    sampler's log-probs (here the f32 torch model's; only their values' order of magnitude matters)."""
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(LR))
    update_fn = update.make_update(cfg, grpo.GRPOConfig(), optimizer, temperature=1.0)
    master, opt_state = update.init_state(params, cfg, optimizer)
    d = {**data, "logp_behav_RT": data["logp_behav_RT"] * data["mask_RT"]}
    B = len(d["tokens_RT"])
    state = {"master": master, "opt": opt_state}

    def step():
        state["master"], state["opt"], logp, aux = update_fn(state["master"], state["opt"],
                                                          update.split_batch(d, 1, B))
        jax.block_until_ready(state["master"])
        assert np.isfinite(aux["loss"])
    return step


def torch_step(hf_dir, data, autocast: bool):
    import torch
    import transformers
    m = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).train()
    opt = torch.optim.Adam(m.parameters(), lr=LR)
    tokens = torch.tensor(data["tokens_RT"], dtype=torch.long)
    mask = torch.tensor(data["mask_RT"][:, 1:])
    adv = torch.tensor(data["adv_R"])[:, None]
    with torch.no_grad():
        logits = m(tokens).logits[:, :-1].float()
        behav = torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None])[..., 0]
    data["logp_behav_RT"] = np.concatenate([np.zeros((len(tokens), 1), np.float32), behav.numpy()], 1)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = m(tokens).logits[:, :-1]
        logp = torch.log_softmax(logits.float() / 1.0, -1).gather(-1, tokens[:, 1:, None])[..., 0]
        old = logp.detach()  # pi_old: the policy before this (first) step, as ours
        ratio = torch.exp(logp - old)
        rho = torch.clamp(torch.exp(old - behav), max=2.0)  # TIS, as grpo's default
        surr = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - 0.2, 1 + 0.28)) * rho
        loss = (surr * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        assert torch.isfinite(loss)
    return step, sum(p.numel() for p in m.parameters())


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench(size: str, repeats: int, peak: float, with_nofix: bool, with_autocast: bool):
    import torch
    torch.set_num_threads(NPROC)
    B = BATCH[size]
    cfg = make_cfg(size, True)
    params = model.init_params(cfg, jax.random.key(0))
    n_params = model.param_count(cfg)
    data = batch_data(cfg, B)
    sides = {}
    with tempfile.TemporaryDirectory() as tmp:
        hf_io.save_hf(tmp, cfg, params)
        sides["torch_f32"], tp = torch_step(tmp, data, autocast=False)  # sets data["logp_behav_RT"]
        if with_autocast:
            sides["torch_bf16_autocast"], _ = torch_step(tmp, data, autocast=True)
    sides["ours_fix"] = ours_step(cfg, params, data)
    if with_nofix:
        sides["ours_nofix"] = ours_step(make_cfg(size, False), params, data)
    assert tp == n_params, (tp, n_params)
    # torch's threads: nproc (its usual setting) or 1, whichever steps faster here (on a shared, loaded
    # machine nproc threads can be several times slower: they spin waiting for each other)
    threads = {}
    for n in sorted({NPROC, 1}, reverse=True):
        torch.set_num_threads(n)
        sides["torch_f32"]()
        threads[n] = timed(sides["torch_f32"])
    best_threads = min(threads, key=threads.get)
    torch.set_num_threads(best_threads)
    print(f"  torch threads: one f32 step took " + ", ".join(f"{v:.2f} s with {k}" for k, v in threads.items())
          + f": using {best_threads}", flush=True)
    first = {}
    for k, f in sides.items():
        first[k] = timed(f)
        print(f"  warm-up {k}: {first[k]:.2f} s", flush=True)
    for f in sides.values():  # second warm-up
        f()
    times = {k: [] for k in sides}
    for _ in range(repeats):
        for k, f in sides.items():
            times[k].append(timed(f))
    med = {k: statistics.median(v) for k, v in times.items()}
    toks = B * SEQ
    tps = {k: toks / v for k, v in med.items()}
    mfu = {k: 6 * n_params * toks / v / (peak * 1e9) for k, v in med.items()}
    print(f"\n== {size}: {n_params / 1e6:.1f}M params, {B} x {SEQ} tokens per step, median of {repeats} ==")
    for k in sides:
        print(f"  {k:22s} {med[k]:8.3f} s/step {tps[k]:10.1f} tok/s  MFU {mfu[k] * 100:5.1f}%  "
              f"(first step {first[k]:.2f} s)")
    peer = max([k for k in ("torch_f32", "torch_bf16_autocast") if k in tps], key=lambda k: tps[k])
    line = (f"RESULT name=train_step size={size} batch={B} seq={SEQ} params_m={n_params / 1e6:.1f} repeats={repeats} "
            f"ours_tok_s={tps['ours_fix']:.1f} peer_tok_s={tps[peer]:.1f} peer_dtype={peer} "
            f"torch_f32_tok_s={tps['torch_f32']:.1f} torch_bf16_tok_s={tps.get('torch_bf16_autocast', 0):.1f} "
            f"ratio={tps['ours_fix'] / tps[peer]:.3f} ours_mfu={mfu['ours_fix']:.4f} peer_mfu={mfu[peer]:.4f} "
            f"peak_gflops={peak:.1f} torch_threads={best_threads}")
    if with_nofix:
        line += f" nofix_tok_s={tps['ours_nofix']:.1f} fix_cost={med['ours_fix'] / med['ours_nofix'] - 1:.3f}"
    print(line, flush=True)
    return "torch_bf16_autocast" in tps and tps["torch_bf16_autocast"] > tps["torch_f32"]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["3m", "100m"], choices=list(BATCH))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-nofix", action="store_true", help="skip the bf16_fix=False run")
    ap.add_argument("--autocast-sizes", nargs="*", default=["3m", "100m"],
                    help="sizes for which torch bf16 autocast is also timed. 100m only if autocast beat f32 at 3m "
                         "(or 3m is not run): on a CPU without native bf16 (no avx512_bf16 / AMX) autocast measured "
                         "6x to 27x slower than f32 at 3m, minutes per step at 100m; with avx512_bf16 2.3x faster")
    args = ap.parse_args()
    peak = peak_gflops()
    import torch
    torch.set_num_threads(NPROC)
    peak_bf16 = torch_bf16_peak_gflops()
    print(f"jax {jax.__version__}, {NPROC} cpus; measured float32 matmul peak (numpy 2048^3, median of 5): "
          f"{peak:.1f} GFLOP/s; bfloat16 (torch 2048^3): {peak_bf16:.1f} GFLOP/s")
    print(f"RESULT name=peak gflops={peak:.1f} bf16_gflops={peak_bf16:.1f}")
    autocast_won = None
    for size in args.sizes:
        with_autocast = size in args.autocast_sizes and (size == "3m" or autocast_won is not False)
        won = bench(size, args.repeats, peak, not args.no_nofix, with_autocast)
        if size == "3m" and with_autocast:
            autocast_won = won
