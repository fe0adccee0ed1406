"""Where our jitted programs spend their time, op by op: a jax.profiler trace of the decode loop or the
train step, summed per XLA op and printed as a table. It is the profile behind bench/README.md's
"what stands in the way" notes.

Run:  python bench/profile_ops.py generate --size 3m --batch 64 --dtype float32
      python bench/profile_ops.py train --size 3m
      python bench/profile_ops.py train --coldstart         # the embedded model at the e2e run's shape

What it does: compiles the program, runs it once untimed, then --calls times under
jax.profiler.trace(DIR) (DIR kept with --keep, viewable in TensorBoard / Perfetto), reads the trace
back with jax.profiler.ProfileData and sums the duration of every event on the host's XLA threads by
op name (fusion numbers folded: "fusion.12" and "fusion.40" are one "fusion" kind; --by-name keeps
them apart). Ops run on several threads at once, so the shares are of summed op time, not wall time.
Ops are grouped: matmul (dot, convolution, and the YNNPACK/XNNPACK/oneDNN fusions XLA:CPU builds
around dots), fusion (elementwise chains XLA fused), copy/transpose, scatter/gather/dynamic-slice (the KV cache), while/call/other control,
and everything else.

Prints `RESULT name=profile program=.. kind=.. share=..` per group, then the top ops.
"""
import argparse
import collections
import os
import re
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import jax  # noqa: E402
import numpy as np  # noqa: E402

GROUPS = [  # first match wins; matched against the lower-cased op name
    ("matmul", ("dot", "convolution", "matmul", "gemm", "onednn", "eigen", "ynn", "xnn")),  # ynn_fusion: a
    # YNNPACK kernel XLA:CPU builds around a dot (with what it fused into it)
    ("scatter/gather/slice", ("scatter", "gather", "dynamic-slice", "dynamic_slice", "dynamic-update-slice",
                              "dynamic_update_slice", "slice")),
    ("copy/transpose", ("copy", "transpose", "bitcast", "broadcast", "concatenate", "pad")),
    ("reduce/sort", ("reduce", "sort", "cumsum", "argmax")),
    ("fusion", ("fusion",)),
    ("control", ("while", "call", "conditional", "tuple", "parameter", "constant", "thunk", "optimization-barrier",
                 "opt-barrier")),
]


def group_of(name: str) -> str:
    low = name.lower()
    for group, keys in GROUPS:
        if any(k in low for k in keys):
            return group
    return "other"


def program(kind: str, args):
    """(callable running the program once and blocking, description)."""
    import dataclasses
    import grpo
    import hf_io
    import model
    import sampler
    import optax
    import update
    from bench_generate import SIZES
    if args.coldstart:
        cfg, params = hf_io.load_hf(os.path.join(ROOT, "checkpoints", "coldstart"))
        cfg = dataclasses.replace(cfg, dtype=args.dtype)
        B, T, prompt = 128, cfg.max_seq_len, 60
    else:
        spec = SIZES[args.size]
        B = args.batch or spec["batch"]
        T, prompt = 160, 32
        cfg = model.ModelConfig(**spec["cfg"], max_seq_len=256, rope_theta=10000.0, rms_norm_eps=1e-6, qkv_bias=True,
                                tie_embeddings=False, model_type="qwen2", dtype=args.dtype,
                                bf16_fix=args.dtype == "bfloat16")
        params = model.init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (B, T)).astype(np.int32)
    what = f"{kind} {'coldstart' if args.coldstart else args.size} B={B} T={T} {args.dtype}"
    if kind == "generate":
        prompt_RT = np.where(np.arange(T)[None] < prompt, tokens, 0).astype(np.int32)
        keys = iter(jax.random.split(jax.random.key(1), 10_000))

        def run():
            out = sampler.generate(params, cfg, prompt_RT, np.full(B, prompt), next(keys), max_new_tokens=T - prompt)
            jax.block_until_ready(out.tokens_RT)
        return run, what
    mask = np.zeros((B, T), np.float32)
    mask[:, prompt:] = 1
    data = {"tokens_RT": tokens, "mask_RT": mask, "adv_R": rng.standard_normal(B).astype(np.float32),
            "logp_behav_RT": np.full((B, T), -3.0, np.float32) * mask}
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-6))
    step = update.make_update(cfg, grpo.GRPOConfig(), optimizer, temperature=1.0)
    state = list(update.init_state(params, cfg, optimizer))
    minibatches = update.split_batch(data, 1, B)

    def run():
        state[0], state[1], _, _ = step(state[0], state[1], minibatches)
        jax.block_until_ready(state[0])
    return run, what


def summarize(trace_dir: str, by_name: bool):
    """{op name: summed ns} over the XLA events of every trace file under trace_dir."""
    totals = collections.Counter()
    for root, _, files in os.walk(trace_dir):
        for f in files:
            if not f.endswith(".xplane.pb"):
                continue
            data = jax.profiler.ProfileData.from_file(os.path.join(root, f))
            for plane in data.planes:
                for line in plane.lines:
                    if "python" in line.name.lower():  # our own Python frames (not XLA's op threads)
                        continue
                    for ev in line.events:
                        name = ev.name
                        if not name or name.startswith(("$", "PjRt", "Pjrt", "ThunkExecutor", "TfrtCpu")):
                            continue
                        if not by_name:
                            name = re.sub(r"[._-]?\d+$", "", name)
                        totals[name] += ev.duration_ns
    return totals


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kind", choices=["generate", "train"])
    ap.add_argument("--size", default="3m", choices=["3m", "100m"])
    ap.add_argument("--batch", type=int, default=0, help="rows (default: the size's bench batch; train: 16/8)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--coldstart", action="store_true", help="the embedded cold-start model, 128 rows (e2e shape)")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--by-name", action="store_true", help="keep fusion.12 and fusion.40 apart")
    ap.add_argument("--keep", default="", help="write the trace here and keep it")
    args = ap.parse_args()
    if args.kind == "train" and not args.batch and not args.coldstart:
        args.batch = {"3m": 16, "100m": 8}[args.size]
    run, what = program(args.kind, args)
    run()  # compile, untraced
    trace_dir = args.keep or tempfile.mkdtemp(prefix="rlax-profile-")
    t0 = time.perf_counter()
    with jax.profiler.trace(trace_dir):
        for _ in range(args.calls):
            run()
    wall = (time.perf_counter() - t0) / args.calls
    totals = summarize(trace_dir, args.by_name)
    total = sum(totals.values()) or 1
    groups = collections.Counter()
    for name, ns in totals.items():
        groups[group_of(name)] += ns
    print(f"{what}: {wall * 1e3:.1f} ms per call (traced), summed op time {total / 1e6 / args.calls:.1f} ms per call")
    for g, ns in groups.most_common():
        print(f"  {g:22s} {ns / total:6.1%}")
        print(f"RESULT name=profile program={what.replace(' ', '_')} kind={g.replace('/', '_')} share={ns / total:.3f}")
    print(f"top {args.top} ops (summed over threads and calls):")
    for name, ns in totals.most_common(args.top):
        print(f"  {ns / total:6.1%}  {ns / 1e6 / args.calls:8.2f} ms/call  {name}  [{group_of(name)}]")
    if not args.keep:
        import shutil
        shutil.rmtree(trace_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
