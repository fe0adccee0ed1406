"""Memory of ONE trainer step on a Qwen2.5-0.5B-shaped model, 1 row x 1,024 tokens, with model.py's
chunked attention / log-probs off (before) and on (after, the default); then memory per chip for the
Qwen2.5 shapes, worked out from the measured numbers.

Run:  python bench/bench_train_memory.py            (a few minutes on a 2-core CPU; ~14 GB of RAM)

The model: hidden 896, 24 layers, 14 heads, 2 kv heads, mlp 4864, vocab 151,936, tied embeddings,
q/k/v biases, bf16 with the precision policy on; random weights made here (no download). The step is
make_update's forward + backward (f32 master -> bf16 cast -> model.token_logprobs -> grpo.policy_loss
-> gradient w.r.t. the master, mirrored here so that XLA's analysis and the run are of one compiled
program), then update.make_update's update itself (that and optax clip + Adam, as trainer.Trainer
builds it), on one microbatch of 1 x 1,024 tokens.
Each variant runs in a fresh child process (freed memory of one cannot hide the other's peak).

Measured per variant:
  peak_rss_gib      the process's peak resident set (getrusage ru_maxrss) after the microbatch's forward +
                    backward ran (the compiled mirror of make_update's grad_fn below): f32 master, Adam
                    state, the step's buffers, XLA's compiled programs (on XLA:CPU the devices' memory is
                    host memory);
  rss_before_gib    the resident set just before that step (state made, graphs compiled);
  update_peak_rss_gib  the peak after then running update.make_update's whole update once (compile,
                    forward + backward, Adam): its optimizer step, jitted without buffer donation, holds
                    two masters and two Adam states at once, 28 bytes/param, more than the step itself;
  temp_gib          XLA's compiled.memory_analysis() of the step's forward + backward graph (a mirror of
                    make_update's grad_fn: same loss, same cast): temporaries; out_gib its output (the
                    f32 gradient); apply_temp_gib / apply_out_gib the same for the optimizer update;
  est_gib           memory.train_step_bytes(cfg, 1, 1024) - 4 bytes/param (its estimate of temp_gib);
  act_per_token_kib the per-token slope of temp_gib, from a second compile at 512 tokens.
The "on" child also checks that the chunked log-probs equal the unchunked ones bit for bit (forward).

The table: bytes per chip for 1 x 1,024 tokens, from these measurements. Persistent: f32 master
(4 B/param) + Adam m, v (8) + the f32 gradient (4); working copies the step makes: the bf16 weights and
their bf16 gradients (+ the embedding's extra buffers), memory.py's calibrated terms; activations: the
measured per-token slope, scaled by layers x hidden (the residual stream kept per layer dominates it),
plus the chunk-sized head / attention buffers and the head's f32 gradient accumulator. The optimizer
update, jitted without buffer donation, briefly holds a second master + Adam state (12 B/param), shown
as its own column. FSDP over N chips: persistent bytes / N; the bf16 policy is gathered whole on every
chip (sharding.gather_params), so working copies and activations are not divided.

Last lines: `RESULT name=train_memory chunking=off|on peak_rss_gib=.. temp_gib=.. ...`, then the table.
"""
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

ROWS, T = 1, 1024
# Qwen2.5 shapes (the config.json of each model on the Hugging Face hub)
QWEN25 = {
    "0.5B": dict(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64,
                 intermediate_size=4864, tie_embeddings=True),
    "1.5B": dict(vocab_size=151936, hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2, head_dim=128,
                 intermediate_size=8960, tie_embeddings=True),
    "7B": dict(vocab_size=152064, hidden_size=3584, num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128,
               intermediate_size=18944, tie_embeddings=False),
    "32B": dict(vocab_size=152064, hidden_size=5120, num_layers=64, num_heads=40, num_kv_heads=8, head_dim=128,
                intermediate_size=27648, tie_embeddings=False),
}
COMMON = dict(max_seq_len=32768, rope_theta=1e6, rms_norm_eps=1e-6, qkv_bias=True, dtype="bfloat16")
GIB = 1 << 30


def _rss_now() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def child(chunking: str) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import grpo
    import memory
    import model
    import update
    if chunking == "off":
        model.HEAD_CHUNK_BYTES = model.ATTN_CHUNK_BYTES = 0
    cfg = model.ModelConfig(**QWEN25["0.5B"], **COMMON)
    shapes = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
    rng = np.random.default_rng(0)

    def draw(path, s):  # host bf16 weights: norms 1, biases 0, matrices N(0, 0.02) like init_params
        name = jax.tree_util.keystr(path)
        if "norm" in name or "bias" in name:
            return np.full(s.shape, 1.0 if "norm" in name else 0.0, s.dtype)
        return (0.02 * rng.standard_normal(s.shape, np.float32)).astype(s.dtype)
    params = jax.tree_util.tree_map_with_path(draw, shapes)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-6))  # as trainer.Trainer's
    master, opt_state = update.init_state(params, cfg, optimizer)
    del params
    gcfg = grpo.GRPOConfig(max_len=T // 2)
    tokens_RT = rng.integers(0, cfg.vocab_size, (ROWS, T)).astype(np.int32)
    mask_RT = np.zeros((ROWS, T), np.float32)
    mask_RT[:, T // 2:] = 1.0
    mb = {"tokens_RT": tokens_RT, "adv_R": np.ones(ROWS, np.float32), "mask_RT": mask_RT,
          "logp_behav_RT": np.full((ROWS, T), -12.0, np.float32)}

    # XLA's numbers for the graphs make_update jits (mirrored: the same loss on the same cast weights)
    def loss_fn(master, mb):
        logp_RT = model.token_logprobs(update.cast_params(master, cfg.jdtype), cfg, mb["tokens_RT"], 1.0)
        loss, _ = grpo.policy_loss(logp_RT, jax.lax.stop_gradient(logp_RT), mb["adv_R"], mb["mask_RT"], gcfg,
                                   logp_behav_RT=mb["logp_behav_RT"])
        return loss

    def analyse(rows, t):
        spec = {k: jax.ShapeDtypeStruct((rows,) + ((t,) if v.ndim == 2 else ()), v.dtype) for k, v in mb.items()}
        t0 = time.time()
        compiled = jax.jit(jax.value_and_grad(loss_fn)).lower(master, spec).compile()
        return compiled, compiled.memory_analysis(), time.time() - t0

    grad_step, ma, compile_s = analyse(ROWS, T)
    _, ma512, _ = analyse(ROWS, T // 2)

    def apply(master, opt_state, grads):
        updates, opt_state = optimizer.update(grads, opt_state, master)
        return optax.apply_updates(master, updates), opt_state
    ma_apply = jax.jit(apply).lower(master, opt_state, master).compile().memory_analysis()

    res = {"chunking": chunking, "temp_gib": ma.temp_size_in_bytes / GIB, "out_gib": ma.output_size_in_bytes / GIB,
           "arg_gib": ma.argument_size_in_bytes / GIB,
           "apply_temp_gib": ma_apply.temp_size_in_bytes / GIB, "apply_out_gib": ma_apply.output_size_in_bytes / GIB,
           "act_per_token_kib": (ma.temp_size_in_bytes - ma512.temp_size_in_bytes) / (ROWS * T // 2) / 1024,
           "est_gib": (memory.train_step_bytes(cfg, ROWS, T) - 4 * model.param_count(cfg)) / GIB,
           "params": model.param_count(cfg), "compile_s": compile_s,
           "head_chunk": model._head_chunk_len(cfg, ROWS, T - 1, None),
           "query_chunk": model._query_chunk_len(cfg, ROWS, T, None)}

    # 1) the microbatch's forward + backward (the graph analysed above; make_update's grad_fn computes
    #    the same), from a resident set of state + compiled programs: its peak is what chunking changes
    mb_dev = {k: jnp.asarray(v) for k, v in mb.items()}
    res["rss_before_gib"] = _rss_now() / GIB
    t0 = time.time()
    jax.block_until_ready(grad_step(master, mb_dev))
    res["step_s"] = time.time() - t0
    res["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB
    # 2) update.make_update's whole update (grad_fn + Adam apply), once (compiles, runs)
    step = update.make_update(cfg, gcfg, optimizer, 1.0)
    m2, o2, logp_RT, aux = step(master, opt_state, update.split_batch(mb, 1, ROWS))
    jax.block_until_ready((m2, o2))
    res["update_peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB
    res["loss_finite"] = bool(np.isfinite(aux["loss"]))
    del m2, o2

    if chunking == "on":  # the bits: chunked log-probs (default) == unchunked, on this model's shapes
        policy = update.cast_params(master, cfg.jdtype)
        on = jax.jit(lambda p, t: model.token_logprobs(p, cfg, t, 1.0))(policy, tokens_RT)
        off = jax.jit(lambda p, t: model.token_logprobs(p, cfg, t, 1.0, chunk_tokens=0, query_chunk=0))(policy, tokens_RT)
        res["chunked_bitwise_unchunked"] = bool(np.array_equal(np.asarray(on), np.asarray(off)))
        res["step_logp_bitwise_unchunked"] = bool(np.array_equal(np.asarray(logp_RT), np.asarray(off)))
    return res


def table(measured: dict) -> list[str]:
    """Per-chip GiB for each Qwen2.5 shape at 1 x 1,024 tokens (see the module docstring)."""
    import memory
    import model
    on = measured["on"]
    base = model.ModelConfig(**QWEN25["0.5B"], **COMMON)
    per_token_per_LD = on["act_per_token_kib"] * 1024 / (base.num_layers * base.hidden_size)
    k = memory._MEM_COEF
    rows = []
    head = ("model", "params", "master+adam", "grad_f32", "bf16_copies", "activations", "chunk_bufs",
            "1chip_step", "1chip_apply", "fsdp4", "fsdp8", "fsdp32", "off_1chip_step")
    rows.append(" ".join(f"{h:>12}" for h in head))
    for name, shape in QWEN25.items():
        cfg = model.ModelConfig(**shape, **COMMON)
        P = model.param_count(cfg)
        VD = cfg.vocab_size * cfg.hidden_size
        P_layers = P - VD * (1 if cfg.tie_embeddings else 2) - cfg.hidden_size
        copies = k["layer_weights"] * 2 * P_layers + (k["embed_tied"] if cfg.tie_embeddings else k["embed_untied"]) * 2 * VD
        act = per_token_per_LD * cfg.num_layers * cfg.hidden_size * ROWS * T
        # chunk-sized buffers and the head's f32 accumulator: the estimate's terms minus its other ones
        est = memory.train_step_bytes(cfg, ROWS, T)
        bufs = est - 4 * P - copies - k["carry"] * 2 * cfg.num_layers * ROWS * T * cfg.hidden_size
        state, grad = 12 * P, 4 * P
        step = state + grad + copies + act + bufs
        apply_peak = state * 2 + grad  # a second master + Adam state while the old ones are alive
        fsdp = [(state + grad) / n + copies + act + bufs for n in (4, 8, 32)]
        off = state + memory.train_step_bytes(cfg, ROWS, T, chunk_tokens=0, query_chunk=0)
        vals = [P / 1e9, state / GIB, grad / GIB, copies / GIB, act / GIB, bufs / GIB, step / GIB,
                apply_peak / GIB] + [f / GIB for f in fsdp] + [off / GIB]
        rows.append(f"{name:>12} " + " ".join(f"{v:>12.2f}" for v in vals))
    return rows


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print("CHILD " + json.dumps(child(sys.argv[2])), flush=True)
        return
    measured = {}
    for chunking in ("off", "on"):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", chunking], cwd=ROOT,
                             capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"child {chunking} failed:\n{out.stderr[-4000:]}")
        measured[chunking] = json.loads(next(l for l in out.stdout.splitlines() if l.startswith("CHILD "))[6:])
    for chunking, r in measured.items():
        extra = "".join(f" {k}={r[k]}" for k in ("chunked_bitwise_unchunked", "step_logp_bitwise_unchunked") if k in r)
        print(f"RESULT name=train_memory chunking={chunking} rows={ROWS} T={T} peak_rss_gib={r['peak_rss_gib']:.2f} "
              f"rss_before_gib={r['rss_before_gib']:.2f} update_peak_rss_gib={r['update_peak_rss_gib']:.2f} temp_gib={r['temp_gib']:.3f} out_gib={r['out_gib']:.3f} "
              f"arg_gib={r['arg_gib']:.3f} est_gib={r['est_gib']:.3f} apply_temp_gib={r['apply_temp_gib']:.3f} "
              f"apply_out_gib={r['apply_out_gib']:.3f} act_per_token_kib={r['act_per_token_kib']:.1f} "
              f"head_chunk={r['head_chunk']} query_chunk={r['query_chunk']} step_s={r['step_s']:.1f} "
              f"loss_finite={r['loss_finite']}{extra}", flush=True)
    print("\nGiB per chip, 1 x 1024 tokens, bf16 policy + f32 master + Adam (params in billions); "
          "fsdpN: persistent state over N chips, the gathered bf16 policy and activations whole on each")
    for line in table(measured):
        print(line)


if __name__ == "__main__":
    main()
