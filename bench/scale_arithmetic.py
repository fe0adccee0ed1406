"""What a run like RLAX's needs, worked out: QwQ-32B on 1,024 TPU v5p chips (docs/scale.md explains it).

    python bench/scale_arithmetic.py                      # the defaults below
    python bench/scale_arithmetic.py --trainer-chips 512 --completion-mean 4096 --staleness 0

Three kinds of numbers go in, each labelled where it is printed:
  MEASURED here: the memory terms (memory.train_state_bytes / train_step_bytes, calibrated on XLA's
      memory_analysis), the relay's server bytes per version (bench/bench_broadcast.py: one model per
      version at 1, 2, 4 and 8 workers, N models direct), the verifier's executions per core-second
      (bench/bench_verifier.py).
  PUBLISHED: QwQ-32B's architecture (its config.json on Hugging Face, Qwen/QwQ-32B) and the v5p chip
      (Google Cloud's TPU v5p page: 95 GB HBM at 2,765 GB/s, 459 bf16 TFLOP/s per chip).
  ASSUMED (flags): the recipe (prompts, group, lengths), the split of chips between trainer and
      workers, model-FLOPs utilisation, decode efficiency, the hosts' network bandwidth. RLAX's paper
      gives the chip count and the wall time (1,024 v5p, 12 h 48 min), not these.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import memory  # noqa: E402
import model  # noqa: E402
import workitems  # noqa: E402

GB = 1e9
# Qwen/QwQ-32B config.json (a Qwen2 architecture)
QWQ_32B = model.ModelConfig(vocab_size=152064, hidden_size=5120, num_layers=64, num_heads=40, num_kv_heads=8,
                            head_dim=128, intermediate_size=27648, max_seq_len=40960, rope_theta=1e6,
                            rms_norm_eps=1e-5, qkv_bias=True, tie_embeddings=False)
V5P = dict(hbm_gb=95.0, hbm_gb_s=2765.0, bf16_tflops=459.0)  # per chip, Google Cloud's TPU v5p page
# bench/bench_verifier.py on this 2-core CPU: 359 HumanEval executions/s with 2 executors (docs/results.md)
VERIFIER_EXEC_PER_CORE_S = 359 / 2


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chips", type=int, default=1024)
    p.add_argument("--trainer-chips", type=int, default=256, help="ASSUMED split; the rest sample")
    p.add_argument("--trainer-tp", type=int, default=4, help="tensor axis of the trainer's mesh")
    p.add_argument("--worker-chips", type=int, default=4, help="chips per tensor-parallel worker")
    p.add_argument("--prompts", type=int, default=256, help="B: prompts per step (ASSUMED)")
    p.add_argument("--group", type=int, default=16, help="G: samples per prompt (ASSUMED)")
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--max-new-tokens", type=int, default=16384)
    p.add_argument("--completion-mean", type=int, default=8192, help="mean completion tokens (ASSUMED)")
    p.add_argument("--padding", type=float, default=0.08,
                   help="share of the update's positions that are padding when laid out by length (packing.py: "
                        "MEASURED 0.069 median, 0.089 at most over 250 HumanEval-length batches, 0.082 in bench/bench_lengths.py)")
    p.add_argument("--mfu", type=float, default=0.4, help="trainer model-FLOPs utilisation (ASSUMED)")
    p.add_argument("--decode-eff", type=float, default=0.3, help="share of HBM bandwidth a decode step reaches")
    p.add_argument("--link-gb-s", type=float, default=25.0, help="each host's network, GB/s (200 Gb/s)")
    p.add_argument("--staleness", type=int, default=1)
    a = p.parse_args(argv)
    cfg, chip = QWQ_32B, V5P
    P = model.param_count(cfg)
    T = workitems.fit_seq_len([a.prompt_len], a.max_new_tokens, 1 << 20)   # our one T per run
    workers = (a.chips - a.trainer_chips) // a.worker_chips
    rollouts = a.prompts * a.group
    print(f"QwQ-32B: {P / 1e9:.2f}B parameters; T = {T} (prompt {a.prompt_len} + {a.max_new_tokens} new, "
          f"rounded up to a power of two); {a.trainer_chips} trainer chips (tensor {a.trainer_tp}), "
          f"{workers} workers of {a.worker_chips} chips; {a.prompts} prompts x {a.group} = {rollouts} rollouts/step")

    # ---- memory per trainer chip (MEASURED terms, memory.py; XLA:CPU-calibrated, TPU's allocator differs)
    state = memory.train_state_bytes(cfg) / a.trainer_chips       # FSDP: f32 master, Adam, gradient sum
    update_peak = 12 * P / a.trainer_chips                         # the optax step's second master + moments
    budget = 0.9 * chip["hbm_gb"] * GB
    # The forward runs on the bf16 policy gathered over "data", still split over "tensor" (sharding.py
    # COMPUTE layout), and the backward makes its bf16 gradient there before the reduce-scatter: 2 + 2
    # bytes per parameter over the tensor axis. A row's activations (mostly the residual stream that
    # the rematerialised scan keeps per layer, [L, T, D]) are memory.py's calibrated per-row terms.
    weights = 4 * P / a.trainer_tp
    per_row = memory.train_step_bytes(cfg, 2, T) - memory.train_step_bytes(cfg, 1, T)
    rows = max(0, int((budget - state - update_peak - weights) // per_row))
    print("\n1. Memory per trainer chip (memory.py's calibrated terms; v5p HBM 95 GB, 90% usable):")
    print(f"   state {state / GB:.2f} GB (16 B/param over {a.trainer_chips} chips) + {update_peak / GB:.2f} GB during "
          f"the optimizer step;\n   bf16 policy + its gradient in the compute layout over tensor {a.trainer_tp}: "
          f"{weights / GB:.1f} GB;\n   {per_row / GB:.1f} GB per row of {T} tokens -> "
          + (f"{rows} row(s) per chip per microbatch: {rows * a.trainer_chips // a.trainer_tp} rows per microbatch "
             f"over the {a.trainer_chips // a.trainer_tp} data-parallel groups" if rows else
             "NOT ONE ROW FITS: raise --trainer-tp or shorten T"))
    kv_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
    worker_free = a.worker_chips * budget - 2 * P
    seqs = int(worker_free // (kv_token * (a.prompt_len + a.max_new_tokens)))
    print(f"   worker ({a.worker_chips} chips): bf16 weights {2 * P / GB:.1f} GB, KV cache {kv_token / 1e3:.0f} KB per token "
          f"-> {seqs} sequences of {a.prompt_len + a.max_new_tokens} tokens in the remaining {worker_free / GB:.0f} GB")

    # ---- bytes per weight version (MEASURED: relay sends one model per version from the server)
    version = 2 * P
    hop = version / (a.link_gb_s * GB)
    print("\n2. Bytes per weight version (bf16):")
    print(f"   one version {version / GB:.1f} GB. Direct pull: the param server sends {workers} x = "
          f"{workers * version / 1e12:.1f} TB, {workers * hop:.0f} s at {a.link_gb_s:.0f} GB/s. Relay tree (fan-out 2, "
          f"measured: one model per version from the server at 1-8 workers): {version / GB:.1f} GB from the server, "
          f"each worker sends at most 2 copies; pipelined by 16 MiB chunks the last of {workers} workers "
          f"holds it after about {2 * hop + math.ceil(math.log2(workers + 1)) * 16 * 2**20 / (a.link_gb_s * GB):.1f} s")

    # ---- rollouts per second (ASSUMED mfu / decode efficiency, PUBLISHED peaks)
    row_flops = lambda n: n * (6 * P + 6 * cfg.num_layers * cfg.num_heads * cfg.head_dim * n)  # + causal attention, fwd+bwd
    real = a.prompt_len + a.completion_mean
    positions = real / (1 - a.padding)          # a row laid out by its real length (packing.py)
    chip_flops = a.trainer_chips * chip["bf16_tflops"] * 1e12 * a.mfu
    fixed_s = rollouts * row_flops(T) / chip_flops  # every row padded to T
    train_s = rollouts * row_flops(positions) / chip_flops
    step_bytes = 2 * P / a.worker_chips + seqs * kv_token * (a.prompt_len + a.completion_mean) / a.worker_chips
    decode_step_s = step_bytes / (chip["hbm_gb_s"] * GB * a.decode_eff)
    worker_tok_s = seqs * 1 / decode_step_s
    tokens = rollouts * a.completion_mean
    fleet_s = tokens / (workers * worker_tok_s)        # the fleet's time to make one step's tokens
    latency_s = a.max_new_tokens * decode_step_s        # the longest row: a group is whole only when it ends

    def period(k: int, train: float, fleet: float) -> float:
        """Seconds per step. Staleness 0: sampling and training take turns. Staleness k >= 1: a batch may be
        sampled with weights k versions old, so k batches are in flight while the trainer trains."""
        return train + max(latency_s, fleet) if k == 0 else max(train, fleet, latency_s / k)

    print("\n3. Rollouts per second to keep the trainer busy:")
    print(f"   a step trains on {rollouts} rows of {real:,} real tokens on average, laid out by length "
          f"({a.padding:.0%} padding: {positions:,.0f} positions per row) = {rollouts * row_flops(positions) / 1e18:.1f} "
          f"EFLOP: {train_s:.0f} s at {a.mfu:.0%} MFU (every row padded to T = {T}: "
          f"{rollouts * row_flops(T) / 1e18:.1f} EFLOP, {fixed_s:.0f} s, {1 - row_flops(real) / row_flops(T):.0%} of it padding)")
    print(f"   workers: a decode step {decode_step_s * 1e3:.1f} ms ({a.decode_eff:.0%} of HBM bandwidth), {seqs} rows -> "
          f"{worker_tok_s:,.0f} tokens/s per worker, {workers * worker_tok_s / 1e3:,.0f}k for the fleet: a step's "
          f"{tokens / 1e6:.1f}M tokens in {fleet_s:.0f} s, but its longest row takes {latency_s:.0f} s")
    mean_row_s = a.completion_mean * decode_step_s  # a row of the mean length, start to end
    for k in sorted({0, 1, 2, 4, a.staleness}):
        t = period(k, train_s, fleet_s)
        # token age at the update, in versions, for a row of the mean length that ends as its batch is
        # trained: every token as old as the row's start without in-flight updates, half that on average
        # with them (a token sampled at time u of the row is (row - u) / t versions old)
        age = 0.0 if k == 0 else mean_row_s / t
        print(f"   staleness {k}: a step every {t:.0f} s, trainer busy {train_s / t:.0%}, {rollouts / t:.1f} rollouts/s "
              f"({rollouts * a.completion_mean / t / 1e3:.0f}k tokens/s) from the fleet; mean-length rows' tokens "
              f"{age:.1f} versions old, {age / 2:.1f} on average with in-flight updates")
    need = rollouts / period(a.staleness, train_s, fleet_s)
    splits = range(a.worker_chips * 8, a.chips, a.worker_chips * 8)
    pace = lambda t: period(a.staleness, train_s * a.trainer_chips / t, fleet_s * workers / ((a.chips - t) // a.worker_chips))
    best = min(splits, key=pace)
    print(f"   the fewest trainer chips that give the shortest step at staleness {a.staleness}: {best}, "
          f"{(a.chips - best) // a.worker_chips} workers, a step every {pace(best):.0f} s")

    # ---- verifier (MEASURED per-core rate)
    cores = need / VERIFIER_EXEC_PER_CORE_S
    print("\n4. Verifier executions per second:")
    print(f"   one program per rollout: {need:.1f} executions/s; at the {VERIFIER_EXEC_PER_CORE_S:.0f} per core-second "
          f"measured on HumanEval here that is {cores:.2f} cores; tasks whose tests run 100x longer need {100 * cores:.0f}")
    hours = 12 + 48 / 60
    print(f"\n12 h 48 min (RLAX's run) at staleness {a.staleness} is about {hours * 3600 / period(a.staleness, train_s, fleet_s):.0f} steps "
          f"of {rollouts} rollouts with these assumptions.")


if __name__ == "__main__":
    main()
