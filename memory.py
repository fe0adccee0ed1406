"""memory.py: the trainer's device memory, estimated: its persistent state, one microbatch's forward +
backward, and the most rows per microbatch that fit a budget (trainer.py's fit_microbatch picks the
microbatch with rows_for_budget).

  train_state_bytes          f32 master, Adam's moments and the summed gradient: 16 bytes per parameter
                             (LoRA: the base in the compute dtype, 16 bytes per adapter parameter)
  train_step_bytes           one microbatch of rows x T tokens: XLA's temporaries + the f32 gradient
  rows_for_budget            the most rows whose state + step bytes fit a budget
  measure_train_step_bytes   XLA's own numbers for the same graph on the running backend (one compile)

A module of its own rather than part of model.py (the decoder) or trainer.py (the run): the benches
(bench/bench_train_memory.py, bench/scale_arithmetic.py) use the estimates without a trainer, and the
estimate follows model.py's chunking (model._head_chunk_len, model._query_chunk_len); the output head's
terms live in model.py (model._head_bytes), whose default head chunking compares them.

Run the tests:  python -m pytest -q tests/test_memory.py
Benchmark:      python bench/bench_train_memory.py
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import lora
import model
from model import ModelConfig

# The trainer's microbatch graph: f32 master -> cast to cfg.dtype -> token_logprobs -> loss -> gradient
# w.r.t. the f32 master (update.make_update's grad_fn). train_step_bytes estimates the device memory
# one such call needs beyond the trainer's persistent state (train_state_bytes): XLA's temporaries plus
# the f32 gradient it returns. Derived term by term, each coefficient fitted to XLA:CPU's
# compiled.memory_analysis() of that graph for Qwen2.5-0.5B-shaped models (tied and untied head,
# mlp 4864 and 1792, 1..8 rows x 32..4096 positions; bench/bench_train_memory.py prints the comparison):
# its temporaries within 4% there with the default chunks, 8% with forced 16-position chunks, 11%
# unchunked (1 x 1024 tokens, tied: measured 2.60 GiB chunked, estimate 2.64; unchunked 5.58, 5.27).
# Other backends fuse and schedule differently; for the exact number of the running backend use
# measure_train_step_bytes (one compile, nothing run). The head is chunked by default only where these
# terms say it saves memory (model._head_chunk_len).
# It assumes cfg.bf16_fix (the remat'ed layers); without it every layer's activations are kept and
# the estimate is far too low. Terms, with a = bytes of cfg.dtype, P_L = layer parameters:
#   weights cast to cfg.dtype + their gradients there:   a * P_L        (measured 2.0 B/param, bf16)
#   embedding / unembedding (V x D each):               tied 3.85 a * V*D, untied 0.9 a * V*D
#   chunked head: float32 weight-gradient accumulator:  tied 4.6, untied 6.5 bytes * V*D     (model._HEAD_COEF)
#   residual stream kept per layer for the backward:     2 a * L * R*T*D  (measured ~4 B per element, bf16)
#   head chunk (logits, exp, _row_sum's power-of-two pad, their gradients): 2.5 x float32 [R, C, Vpad]
#     (unchunked: measured 2.5..3.8 x [R, T, Vpad]; 3.5 is used)                           (model._HEAD_COEF)
#   attention query chunk: 0.8 x float32 scores [R, N, Cq, T]
#   the f32 gradient returned: 4 * (all parameters)
_MEM_COEF = dict(layer_weights=1.0, embed_tied=3.85, embed_untied=0.9, carry=2.0, scores=0.8)


def train_state_bytes(cfg: ModelConfig, lcfg=None, devices: int = 1) -> int:
    """The trainer's persistent state per device, sharded over `devices` (FSDP; 1 = unsharded).
    Full fine-tuning: f32 master weights (4 B/param), Adam's two f32 moments (8), the f32 gradient
    summed over microbatches (4): 16 bytes per parameter. (update.make_update's optimizer step, jitted
    without buffer donation, briefly holds a second master and Adam state too: 12 more bytes per
    parameter at that moment, independent of the microbatch.)
    LoRA (lcfg, a lora.LoraConfig): the frozen base in the compute dtype (a = 2 B/param in bf16), the
    merged policy's target projections (a B per target parameter: lora.merge makes new arrays for
    them, the other leaves are the base's), both sharded; and, replicated on every device, the f32
    adapter with Adam's moments and its summed gradient: 16 bytes per adapter parameter."""
    if lcfg is None:
        return 16 * model.param_count(cfg) // devices
    a = jnp.dtype(cfg.jdtype).itemsize
    shapes = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))["layers"]
    targets = sum(int(np.prod(shapes[t].shape)) for t in lcfg.targets)
    return (a * (model.param_count(cfg) + targets)) // devices + 16 * lora.param_count(cfg, lcfg)


def train_step_bytes(cfg: ModelConfig, rows: int, T: int, *, chunk_tokens: int | None = None,
                     query_chunk: int | None = None) -> int:
    """Estimated bytes one microbatch of `rows` x T tokens needs on one device for the trainer's
    forward + backward (XLA temporaries + the f32 gradient), beyond train_state_bytes; see the comment
    above for the terms and their calibration. Chunk keywords as model.token_logprobs'."""
    if rows < 1 or T < 2:
        raise ValueError(f"train_step_bytes needs rows >= 1 and T >= 2, got rows={rows}, T={T}")
    k, a = _MEM_COEF, jnp.dtype(cfg.jdtype).itemsize
    P = model.param_count(cfg)
    VD = cfg.vocab_size * cfg.hidden_size
    P_layers = P - VD * (1 if cfg.tie_embeddings else 2) - cfg.hidden_size
    c_head = model._head_chunk_len(cfg, rows, T - 1, chunk_tokens)
    c_attn = model._query_chunk_len(cfg, rows, T, query_chunk)
    total = (k["layer_weights"] * a * P_layers
             + (k["embed_tied"] if cfg.tie_embeddings else k["embed_untied"]) * a * VD
             + k["carry"] * a * cfg.num_layers * rows * T * cfg.hidden_size
             + model._head_bytes(cfg, rows, T - 1, c_head)
             + k["scores"] * 4 * rows * cfg.num_heads * c_attn * T
             + 4 * P)
    return int(total)


def rows_for_budget(cfg: ModelConfig, T: int, budget_bytes: int, *, state_bytes: int | None = None,
                    chunk_tokens: int | None = None, query_chunk: int | None = None) -> int:
    """The most rows per microbatch whose train_step_bytes, plus state_bytes (default train_state_bytes:
    the unsharded trainer's), fit in budget_bytes; 0 if not even one row does. Leave headroom in the
    budget for the runtime and fragmentation (the estimate is XLA:CPU-calibrated)."""
    state = train_state_bytes(cfg) if state_bytes is None else state_bytes
    fits = lambda r: state + train_step_bytes(cfg, r, T, chunk_tokens=chunk_tokens, query_chunk=query_chunk) <= budget_bytes
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi):
        lo, hi = hi, hi * 2
        if hi > 1 << 24:
            return lo
    while hi - lo > 1:  # fits(lo), not fits(hi); the estimate grows with rows but chunk sizes step
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def measure_train_step_bytes(cfg: ModelConfig, rows: int, T: int, *, chunk_tokens: int | None = None,
                             query_chunk: int | None = None) -> dict:
    """XLA's own numbers for the trainer's microbatch graph on the default backend: compiles (does not
    run) jit(grad(sum(token_logprobs(cast(f32 master)) * advantage))) for abstract inputs and returns
    compiled.memory_analysis() as a dict of temp / argument / output bytes (argument: the f32 master
    and the tokens). Takes one compile (seconds to a minute for billions of parameters)."""
    shapes = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
    master = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, jnp.float32), shapes)

    def loss(m, tokens_RT, adv_R):
        p = jax.tree.map(lambda x: x.astype(cfg.jdtype), m)
        logp_RT = model.token_logprobs(p, cfg, tokens_RT, 1.0, chunk_tokens=chunk_tokens, query_chunk=query_chunk)
        return jnp.sum(logp_RT * adv_R[:, None])
    compiled = jax.jit(jax.grad(loss)).lower(master, jax.ShapeDtypeStruct((rows, T), jnp.int32),
                                             jax.ShapeDtypeStruct((rows,), jnp.float32)).compile()
    ma = compiled.memory_analysis()
    return {"temp": int(ma.temp_size_in_bytes), "argument": int(ma.argument_size_in_bytes),
            "output": int(ma.output_size_in_bytes)}
