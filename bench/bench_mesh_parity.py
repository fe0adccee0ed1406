"""Sampler vs trainer log-prob parity per device layout (sharding.py), on simulated CPU devices.

Run:  python bench/bench_mesh_parity.py                    # 8 devices, a small model (4 layers, d=256)
      python bench/bench_mesh_parity.py --size tiny --trainers 8x1 2x4 --samplers 1 4

Samplers: sampler.generate on one device, or on a 1 x t tensor-parallel mesh with the weights installed
as a `inference_worker.py --tensor-parallel t` worker installs them. Trainers: update.make_update (the
value_and_grad graph whose log-probs the mismatch metrics compare) on a data x tensor mesh, with the
master and Adam state placed as the Trainer places them (update.init_state); "1x1" is the unsharded
program. Every trainer scores every sampler's rows in one batch (microbatches of --microbatch rows,
padded to the data axis). Per pair: fraction of completion tokens bitwise equal, max |delta logp|.

Last lines: `RESULT name=mesh_parity trainer=<d>x<t> sampler=<1|tp<t>> bitwise_frac=<f> max_abs=<x>
tokens=<n>`, one per pair.

Measured (2-core CPU, jax 0.10.2, the defaults; bitwise fraction / max |delta logp| of 512 tokens):
    trainer \ sampler   1 device      tp2           tp4            tp8
    1x1                1.0 / 0       0.525 / 0.026 0.486 / 0.027  0.486 / 0.030
    8x1                1.0 / 0       0.525 / 0.026 0.486 / 0.027  0.486 / 0.030
    4x2                0.523 / 0.028 1.0 / 0       0.541 / 0.034  0.457 / 0.027
    2x4                0.457 / 0.035 0.547 / 0.034 0.979 / 0.016  0.500 / 0.035
    1x8                0.482 / 0.030 0.465 / 0.028 0.490 / 0.035  1.0 / 0
(also 1x4 vs tp4: 0.979 / 0.016; 8x1 and 2x1 with --microbatch 7, one row per device: 1.0 / 0)
"""
import argparse
import os
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--size", choices=["tiny", "small"], default="small")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--samplers", type=int, nargs="+", default=[1, 2, 4, 8], help="tensor degrees")
    parser.add_argument("--trainers", nargs="+", default=["1x1", "8x1", "4x2", "2x4", "1x8"], help="data x tensor")
    parser.add_argument("--rows", type=int, default=16, help="rows per sampler")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--microbatch", type=int, default=16)
    args = parser.parse_args()
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={args.devices}").strip()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax
    import numpy as np
    import optax

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import grpo
    import hf_io
    import inference_worker
    import model
    import sampler
    import sharding
    import update

    dims = {"tiny": dict(vocab_size=128, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
                         intermediate_size=64),
            "small": dict(vocab_size=512, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64,
                          intermediate_size=768)}[args.size]
    T = args.prompt_len + args.new_tokens
    cfg = model.ModelConfig(**dims, max_seq_len=T, rope_theta=1e4, rms_norm_eps=1e-6, qkv_bias=True,
                            tie_embeddings=False)
    params = model.init_params(cfg, jax.random.PRNGKey(0))
    params = jax.tree_util.tree_map(lambda x: (x * 4).astype(x.dtype) if x.ndim > 1 else x, params)
    host = jax.tree_util.tree_map(np.asarray, params)
    wire_tensors = hf_io.to_hf_tensors(params, cfg)
    rng = np.random.default_rng(0)
    prompt_len_R = rng.integers(args.prompt_len // 2, args.prompt_len + 1, args.rows).astype(np.int32)
    prompt_RT = np.zeros((args.rows, T), np.int32)
    for b in range(args.rows):
        prompt_RT[b, :prompt_len_R[b]] = rng.integers(0, cfg.vocab_size, prompt_len_R[b])

    samples = {}
    for t in args.samplers:
        mesh = inference_worker.tensor_mesh(t)
        p = jax.device_put(params, jax.devices()[0]) if mesh is None else sharding.shard_params(
            hf_io.from_hf_tensors(wire_tensors, cfg, host=True), cfg, mesh)
        samples["1" if t == 1 else f"tp{t}"] = sampler.generate(p, cfg, prompt_RT, prompt_len_R, jax.random.PRNGKey(1),
                                                                  max_new_tokens=args.new_tokens)
        print(f"sampled on tensor degree {t}", flush=True)
    names = list(samples)
    cat = lambda k: np.concatenate([getattr(samples[n], k) for n in names])
    data = {"tokens_RT": cat("tokens_RT"), "mask_RT": cat("mask_RT"), "logp_behav_RT": cat("logp_behav_RT"),
            "adv_R": rng.standard_normal(len(names) * args.rows).astype(np.float32)}
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    gcfg = grpo.GRPOConfig(max_len=args.new_tokens)
    lines = []
    for layout in args.trainers:
        d, t = map(int, layout.split("x"))
        mesh = None if d * t == 1 else sharding.make_mesh(d, t, jax.devices()[:d * t])
        master, opt_state = update.init_state(host, cfg, optimizer, mesh)
        _, _, logp_RT, _ = update.make_update(cfg, gcfg, optimizer, 1.0, mesh)(
            master, opt_state, update.split_batch(data, 1, args.microbatch))
        for i, n in enumerate(names):
            rows = slice(i * args.rows, (i + 1) * args.rows)
            m = samples[n].mask_RT > 0
            diff = np.abs(logp_RT[rows][m].astype(np.float64) - samples[n].logp_behav_RT[m])
            lines.append(f"RESULT name=mesh_parity trainer={layout} sampler={n} bitwise_frac={np.mean(diff == 0):.4f} "
                         f"max_abs={diff.max():.3g} tokens={int(m.sum())}")
            print(lines[-1], flush=True)


if __name__ == "__main__":
    main()
