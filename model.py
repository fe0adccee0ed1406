"""model.py: a hand-written Qwen2 / Llama / Qwen3 decoder in JAX, shared bit for bit by sampler and trainer.

What is here, top to bottom:
  1. ModelConfig ("qwen2", "llama", "qwen3"; plain RoPE or Llama 3 RoPE scaling, Llama3RopeScaling).
     hf_io.py reads and writes it as a Hugging Face config.json (config_from_hf, config_to_hf).
  2. The precision policy (THE one place that fixes where bf16 rounding happens; see PRECISION POLICY).
  3. Parameters: init_params, param_count, and a picture of the pytree (hf_io.py maps it to Hugging
     Face names).
  4. The decoder: forward(...) for scoring/training, token_logprobs(...) the one log-prob function
     (its full-sequence graphs in chunks along T, to bound their memory).
  5. What the sampler builds on: the prefill (hidden), the per-layer pieces of a decode step
     (embed_tokens, layer_params, layer_qkv, attention, layer_out, rope_table) and the output head
     (next_token_logprobs). sampler.py's KV-cache sampling (generate) is made of them, so the
     log-probs it reports equal token_logprobs bit for bit.
The trainer's memory estimates built on these graphs are memory.py's.

Architecture (Qwen2, Llama and Qwen3 share it): token embedding, L x [RMSNorm -> GQA attention with RoPE ->
residual, RMSNorm -> SwiGLU MLP -> residual], final RMSNorm, unembedding (tied or untied). Qwen2 adds
a bias to the q/k/v projections; Qwen3 adds QK-norm (an RMSNorm over the head dim of each q and k head,
before RoPE). References: the transformers modeling_qwen2.py / modeling_llama.py / modeling_qwen3.py
(we check our logits against them in tests/test_model.py and tests/test_hf_checkpoints.py), RoPE
(Su et al. 2021, arXiv:2104.09864), Llama 3 RoPE scaling (introduced with Llama 3.1 in Meta's reference
code; transformers modeling_rope_utils.py, rope_type "llama3"; see _llama3_inv_freq),
GQA (Ainslie et al. 2023, arXiv:2305.13245), RMSNorm (Zhang & Sennrich 2019), SwiGLU (Shazeer 2020).

Shape key (names carry their shapes): R rows (the batch: one sequence each), T time (sequence), S time of the keys
(attention source), D model width, N query heads, K kv heads, G query heads per kv head (N = K*G),
H head dim, F mlp width, V vocab, L layers.

Run the tests:  python -m pytest -q tests/test_model.py
"""
from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

import quant

# =====================================================================================================
# 1. Config
# =====================================================================================================

_MODEL_TYPES = ("qwen2", "llama", "qwen3")
_DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3 RoPE scaling (HF rope_type "llama3"; Llama 3.1 and later): long wavelengths are
    stretched by `factor`, short ones kept, the band in between interpolated (see _llama3_inv_freq)."""

    factor: float
    """Divisor of the inverse frequencies whose wavelength exceeds original_max_position_embeddings / low_freq_factor."""
    low_freq_factor: float
    """Sets the long end of the interpolated band: wavelength original_max_position_embeddings / low_freq_factor."""
    high_freq_factor: float
    """Wavelengths below original_max_position_embeddings / high_freq_factor are left as they are."""
    original_max_position_embeddings: int
    """Context length of pretraining, before the scaling stretched it."""

    def __post_init__(self):
        if not self.factor >= 1.0:
            raise ValueError(f"llama3 rope scaling: factor must be >= 1, got {self.factor}")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(f"llama3 rope scaling: need 0 < low_freq_factor < high_freq_factor, got "
                             f"{self.low_freq_factor}, {self.high_freq_factor}")
        n = self.original_max_position_embeddings
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n <= 0:
            raise ValueError(f"llama3 rope scaling: original_max_position_embeddings must be a positive int, got {n!r}")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture + numerics of the decoder. Frozen, so hashable: it is a static arg of every jit."""

    vocab_size: int
    """V: number of token ids (rows of the embedding)."""
    hidden_size: int
    """D: width of the residual stream."""
    num_layers: int
    """L: number of decoder blocks (HF num_hidden_layers)."""
    num_heads: int
    """N: query heads (HF num_attention_heads)."""
    num_kv_heads: int
    """K: key/value heads; N % K == 0 (GQA; K == N is plain multi-head attention)."""
    head_dim: int
    """H: width of one head (HF head_dim, default hidden_size // num_heads)."""
    intermediate_size: int
    """F: width of the SwiGLU MLP."""
    max_seq_len: int
    """Longest sequence the model accepts (HF max_position_embeddings)."""
    rope_theta: float
    """RoPE base frequency (HF rope_theta / rope_parameters["rope_theta"])."""
    rms_norm_eps: float
    """Epsilon inside every RMSNorm."""
    qkv_bias: bool
    """Bias on the q/k/v projections (True for Qwen2, HF attention_bias for Llama and Qwen3; their
    attention_bias also puts a bias on o_proj, which we do not have: hf_io refuses such a checkpoint
    naming the unexpected o_proj.bias tensors)."""
    tie_embeddings: bool
    """Unembedding reuses the token embedding (HF tie_word_embeddings)."""
    model_type: str = "qwen2"
    """"qwen2", "llama" or "qwen3": which HF architecture config.json / tensor names we read and write.
    "qwen3" also means QK-norm (params q_norm / k_norm, see qk_norm)."""
    dtype: str = "bfloat16"
    """"bfloat16" or "float32": dtype of the parameters and of the activations between ops."""
    bf16_fix: bool = True
    """Precision policy on (see PRECISION POLICY); False = plain bf16, no remat (reproduces the mismatch)."""
    rope_scaling: Llama3RopeScaling | None = None
    """Llama 3 RoPE frequency scaling (HF rope_type "llama3"), or None for plain RoPE."""

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads}) for grouped-query attention")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if not self.rope_theta > 0 or not self.rms_norm_eps > 0:
            raise ValueError(f"ModelConfig.rope_theta and rms_norm_eps must be > 0, got "
                             f"{self.rope_theta}, {self.rms_norm_eps}")
        if self.model_type not in _MODEL_TYPES:
            raise ValueError(f"ModelConfig.model_type {self.model_type!r} is not supported; "
                             f"expected one of {_MODEL_TYPES}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"ModelConfig.dtype must be one of {tuple(_DTYPES)}, got {self.dtype!r}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, Llama3RopeScaling):
            raise ValueError(f"ModelConfig.rope_scaling must be None or a Llama3RopeScaling, got {self.rope_scaling!r}")

    @property
    def jdtype(self):
        return _DTYPES[self.dtype]

    @property
    def qk_norm(self) -> bool:
        """Qwen3's QK-norm: an RMSNorm with its own [H] weight on every q and k head, before RoPE."""
        return self.model_type == "qwen3"


# =====================================================================================================
# 2. PRECISION POLICY (the bf16 fix). Proven by tests/test_model.py::test_decode_logprobs_bitwise_equal_forward
#    (and its negative control test_plain_bf16_decode_differs_from_forward).
#
# Why: in bf16, XLA:CPU computes a dot in f32 and rounds to bf16 where the *compiler* chooses; the
# training graph (value_and_grad) and the sampling graph (KV-cache decode) round at different places,
# so the sampler's log-probs differ from the trainer's and the PPO/GRPO ratio is not 1 (docs/numerics.md;
# the RLAX paper's sampler/trainer mismatch). With cfg.bf16_fix=True:
#   (a) every matmul/einsum returns f32 (preferred_element_type) and is cast to the activation dtype
#       explicitly: the program, not the compiler, fixes each rounding point (_einsum below);
#   (b) elementwise chains (RMSNorm, RoPE, SwiGLU gate, softmax) run in f32 and cast once at the end;
#   (c) the output head (final norm, unembedding, log-softmax, gather) runs in f32 inside
#       jax.checkpoint(nothing_saveable), and every layer is wrapped the same way, so a graph under
#       jax.grad recomputes exactly the ops the plain forward runs (remat is a no-op without grad);
#   (d) decode attends over a KV cache of the full length T, masked with where(mask, s, -inf), so each
#       reduction has the same length as in forward; the prefill IS the forward's layer stack;
#   (e) decode runs at least MIN_DECODE_ROWS rows (dummy rows padded in): XLA:CPU matmuls are not
#       invariant to the row count below that (measured on this CPU);
#   (f) per-row transcendentals (the RMSNorm 1/sqrt, the log of the softmax sum) sit between
#       optimization barriers (_per_row below). Measured: XLA:CPU fuses a big [R*T, ...] normalisation
#       into one YNNPACK kernel whose sqrt/log differ in the last bit from the small decode-sized
#       ones, so without the barriers a scoring batch of 32 x 128 tokens stopped matching decode;
#   (g) row sums (RMSNorm mean square, softmax denominators) are a fixed pairwise tree of elementwise
#       adds (_row_sum), not a reduce op: XLA:CPU reduced a [R*T, D] array in a different order than a
#       [R, D] one (measured: one RMSNorm output element in ~10^5 flipped its bf16 rounding).
#   (h) on GPUs, XLA's Triton GEMM emitter autotunes a tiling (and split-K) per matmul SHAPE, so the
#       decode's [R, D] x [D, F] and the trainer's [R*T, D] x [D, F] add up their products in different
#       orders. Measured on an H200 (jax 0.11.2, bench/bench_parity.py): with (a)-(g) alone 0-13% of
#       tokens were bitwise; with cuBLAS GEMMs (--xla_gpu_enable_triton_gemm=false, set below for every
#       process that imports this file on a machine with JAX's CUDA plugin, unless XLA_FLAGS already
#       names the flag) every token was.
#       XLA reads XLA_FLAGS when its first backend starts, so this must run before any jax computation.
#   (i) a row's log-probs are a function of the row alone (its tokens, from position 0): not of the
#       length it is padded to, the rows beside it, how many there are, or the chunking. That is what
#       lets the trainer cut each microbatch to its rows' own length (packing.py) and still match the
#       sampler, which ran the row at the full cache length. Why it holds: rows are right-padded, so a
#       row's keys sit at 0..n-1 whatever the padding; padded keys are masked to exact zeros (d); the
#       _row_sum tree (g) pairs element j with j + width/2, so zeros past n only add x + 0 = x and the
#       real keys are summed in the same order at every padded length; the bf16 x bf16 -> f32 dots
#       were measured row-count invariant (the attention dots with at least MIN_ATTN_ROWS rows: (j)). Proven by tests/test_packing.py (alone, in a
#       batch, at other lengths, beside other rows; negative control: float32 compute, which changes
#       bits with the layout). Rows are never concatenated into one sequence: a row's keys would then
#       start at an offset, and the tree would add them in another order.
#   (j) the two batched attention dots (q.k and p.v, batched over R, K) get at least MIN_ATTN_ROWS rows
#       (G * T query rows per kv head): decode has only G = N / K of them, so zero query heads are padded
#       into each group there (their outputs are dropped). XLA:CPU runs these dots in YNNPACK, whose
#       cost model picks a kernel per dot shape (m, n, k): the kernels it picks for m <= 2 (up to m = 6
#       for some short contractions, k = 16..100) sum in another order than those for larger m, so the
#       projections' "row-count invariant" does not hold for a dot of 1 or 2 rows. Measured: m >= 8 gave
#       the bits of m = 1024 for every shape tried; without the padding, G <= 2 with head_dim 64 or 128
#       left 3-9% of the sampled tokens' log-probs off token_logprobs (one p.v output in ~10^3 rounded
#       to the neighbouring bf16, then the cache diverged).
#   (k) LoRA (lora.py): sampler and trainer run this model on the same merged weights, made by one
#       function (lora.merge: A and B rounded to the compute dtype, elementwise f32 ops, one rounding
#       of the sum to the compute dtype); the trainer's gradient is taken w.r.t. those merged weights
#       and projected onto A and B (docs/lora.md).
# With bf16_fix=False: plain bf16 einsums, no remat: the negative control that shows the mismatch.
# A float32 config runs its matmuls at Precision.HIGHEST: float32 means float32 on every backend
# (JAX's default lets GPUs use TF32 and TPUs bf16 passes; measured on the H200: logits 3e-4 away from
# transformers' float32, against under 1e-4 on CPU).
# =====================================================================================================

MIN_DECODE_ROWS = 16
MIN_ATTN_ROWS = 8  # (j)
PARITY_XLA_FLAGS = "--xla_gpu_enable_triton_gemm=false"  # (h)
_CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")  # what `pip install jax[cuda12|13]` brings


def _use_parity_xla_flags() -> None:
    """PRECISION POLICY (h): add the cuBLAS-GEMM flag where JAX can use an NVIDIA GPU (its CUDA plugin
    is installed), unless XLA_FLAGS already names the flag. CPU and TPU machines are left untouched."""
    if any(importlib.util.find_spec(m) for m in _CUDA_PLUGINS):
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_gpu_enable_triton_gemm" not in flags:
            os.environ["XLA_FLAGS"] = (flags + " " + PARITY_XLA_FLAGS).strip()


_use_parity_xla_flags()


@jax.custom_jvp
def _round_to_bf16_bits(x32):
    """Round-to-nearest-even of f32 to the nearest bf16 value, with integer ops on the bits."""
    u = jax.lax.bitcast_convert_type(x32, jnp.uint32)
    u = (u + jnp.uint32(0x7FFF) + ((u >> 16) & jnp.uint32(1))) & jnp.uint32(0xFFFF0000)
    return jax.lax.bitcast_convert_type(u, jnp.float32)


@_round_to_bf16_bits.defjvp
def _round_to_bf16_bits_jvp(primals, tangents):
    # A bitcast has derivative 0, which would silently stop every gradient; the rounding is a cast
    # in all but name, so it gets a cast's identity derivative (straight-through).
    (x32,), (t32,) = primals, tangents
    return _round_to_bf16_bits(x32), t32


def _to_act(cfg: ModelConfig, x32):
    """f32 -> activation dtype at a rounding point fixed by the program (PRECISION POLICY (a), (b)).
    Under bf16_fix the round-to-nearest-even to bf16 is done with integer ops on the f32 bits, so the
    result is an exactly representable bf16 value before the cast: a compiler that elides a
    bf16 -> f32 convert pair ("excess precision") can no longer change the value downstream.
    Its derivative is the identity, like a cast's (tests/test_model.py checks gradients flow)."""
    if cfg.bf16_fix and cfg.dtype == "bfloat16":
        x32 = _round_to_bf16_bits(x32.astype(jnp.float32))
    return x32.astype(cfg.jdtype)


def _precision(cfg: ModelConfig):
    """Matmul precision: HIGHEST for a float32 config (see the end of PRECISION POLICY), else the default."""
    return jax.lax.Precision.HIGHEST if cfg.dtype == "float32" else None


def _einsum(cfg: ModelConfig, spec: str, a, b, bias=None):
    """Every matmul of the model goes through here (PRECISION POLICY (a)); the bias is added in f32.
    b may be a quant.QuantWeight (a sampler started with --sampler-quant): the dot runs on its values
    converted to a's dtype (exact) and each output channel is scaled in f32 after the accumulation."""
    if isinstance(b, quant.QuantWeight):
        return _einsum_quant(cfg, spec, a, b, bias)
    if cfg.bf16_fix or cfg.dtype == "float32":
        out = jnp.einsum(spec, a, b, preferred_element_type=jnp.float32, precision=_precision(cfg))
        return _to_act(cfg, out if bias is None else out + bias.astype(jnp.float32))
    out = jnp.einsum(spec, a, b)
    return out if bias is None else out + bias


def _einsum_quant(cfg: ModelConfig, spec: str, a, qw, bias=None):
    """_einsum with a quantised weight (quant.py): (a . q) * scale, the product accumulated in f32 and
    scaled per output channel in f32 before the one rounding to the activation dtype (plain bf16
    arithmetic without the precision policy, like _einsum's)."""
    scale = quant.output_scale(spec, qw.scale)
    if cfg.bf16_fix or cfg.dtype == "float32":
        out = jnp.einsum(spec, a, qw.q.astype(a.dtype), preferred_element_type=jnp.float32,
                         precision=_precision(cfg)) * scale
        return _to_act(cfg, out if bias is None else out + bias.astype(jnp.float32))
    out = jnp.einsum(spec, a, qw.q.astype(a.dtype)) * scale.astype(a.dtype)
    return out if bias is None else out + bias


def _add(cfg: ModelConfig, x, y):
    """Residual add: in f32 with one fixed rounding under the policy, plain dtype arithmetic otherwise."""
    if cfg.bf16_fix or cfg.dtype == "float32":
        return _to_act(cfg, x.astype(jnp.float32) + y.astype(jnp.float32))
    return x + y


def _per_row(cfg: ModelConfig, fn, r):
    """fn applied to a per-row statistic r, fenced off from fusion (PRECISION POLICY (f))."""
    if cfg.bf16_fix:
        return jax.lax.optimization_barrier(fn(jax.lax.optimization_barrier(r)))
    return fn(r)


def _row_sum(cfg: ModelConfig, x32):
    """Sum over the last axis, keepdims. Under the policy: zero-pad to a power of two, then add halves
    log2(n) times: every output element sees the same additions in the same order whatever the shape of
    the other axes (PRECISION POLICY (g))."""
    if not cfg.bf16_fix:
        return jnp.sum(x32, axis=-1, keepdims=True)
    n = x32.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    if width != n:
        x32 = jnp.pad(x32, [(0, 0)] * (x32.ndim - 1) + [(0, width - n)])
    while width > 1:
        width //= 2
        x32 = x32[..., :width] + x32[..., width:]
    return x32


def _rms_scale(cfg: ModelConfig, x32):
    """x / sqrt(mean(x^2) + eps) in f32; sqrt and division are exact IEEE ops (rsqrt is not)."""
    ms = _row_sum(cfg, x32 * x32) * np.float32(1.0 / x32.shape[-1]) + cfg.rms_norm_eps
    return x32 / _per_row(cfg, jnp.sqrt, ms)


def _remat(cfg: ModelConfig, fn):
    """Per-layer / head rematerialisation (PRECISION POLICY (c)); no-op outside differentiation."""
    if cfg.bf16_fix:
        return jax.checkpoint(fn, policy=jax.checkpoint_policies.nothing_saveable)
    return fn


# =====================================================================================================
# 3. Parameters (hf_io.py maps them 1:1 to Hugging Face tensor names)
# =====================================================================================================
# Our pytree (layers stacked on a leading L axis so the stack runs under lax.scan):
#   embed                  [V, D]      <-> model.embed_tokens.weight
#   final_norm             [D]         <-> model.norm.weight
#   lm_head                [D, V]      <-> lm_head.weight (transposed; absent when tie_embeddings)
#   layers.input_norm      [L, D]      <-> model.layers.{i}.input_layernorm.weight
#   layers.q_proj          [L, D, N, H] <-> model.layers.{i}.self_attn.q_proj.weight  [N*H, D] (transposed)
#   layers.k_proj/v_proj   [L, D, K, H] <-> model.layers.{i}.self_attn.{k,v}_proj.weight [K*H, D]
#   layers.q_bias          [L, N, H]   <-> model.layers.{i}.self_attn.q_proj.bias (when qkv_bias)
#   layers.k_bias/v_bias   [L, K, H]   <-> model.layers.{i}.self_attn.{k,v}_proj.bias
#   layers.q_norm/k_norm   [L, H]      <-> model.layers.{i}.self_attn.{q,k}_norm.weight (when qk_norm: Qwen3)
#   layers.o_proj          [L, N, H, D] <-> model.layers.{i}.self_attn.o_proj.weight [D, N*H]
#   layers.post_norm       [L, D]      <-> model.layers.{i}.post_attention_layernorm.weight
#   layers.gate_proj/up_proj [L, D, F] <-> model.layers.{i}.mlp.{gate,up}_proj.weight [F, D]
#   layers.down_proj       [L, F, D]   <-> model.layers.{i}.mlp.down_proj.weight [D, F]


def _param_shapes(cfg: ModelConfig) -> dict:
    L, D, N, K, H, F, V = (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                           cfg.intermediate_size, cfg.vocab_size)
    layers = {"input_norm": (L, D), "q_proj": (L, D, N, H), "k_proj": (L, D, K, H), "v_proj": (L, D, K, H),
              "o_proj": (L, N, H, D), "post_norm": (L, D), "gate_proj": (L, D, F), "up_proj": (L, D, F),
              "down_proj": (L, F, D)}
    if cfg.qkv_bias:
        layers.update(q_bias=(L, N, H), k_bias=(L, K, H), v_bias=(L, K, H))
    if cfg.qk_norm:
        layers.update(q_norm=(L, H), k_norm=(L, H))
    shapes = {"embed": (V, D), "final_norm": (D,), "layers": layers}
    if not cfg.tie_embeddings:
        shapes["lm_head"] = (D, V)
    return shapes


def init_params(cfg: ModelConfig, key) -> dict:
    """Random init like HF's (normal(0, 0.02) weights, zero biases, unit norms incl. q_norm/k_norm), in cfg.dtype."""
    shapes = _param_shapes(cfg)
    flat, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=lambda x: isinstance(x, tuple))
    keys = jax.random.split(key, len(flat))
    leaves = []
    for (path, shape), k in zip(flat, keys):
        name = jax.tree_util.keystr(path)
        if "norm" in name:
            leaf = jnp.ones(shape, jnp.float32)
        elif "bias" in name:
            leaf = jnp.zeros(shape, jnp.float32)
        else:
            leaf = 0.02 * jax.random.normal(k, shape, jnp.float32)
        leaves.append(leaf.astype(cfg.jdtype))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def param_count(cfg: ModelConfig) -> int:
    """Number of parameters (elements of init_params)."""
    return sum(math.prod(s) for s in jax.tree.leaves(_param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple)))


# =====================================================================================================
# 4. The decoder
# =====================================================================================================


def _rms_norm(cfg: ModelConfig, x, w):
    """RMSNorm in f32 (PRECISION POLICY (b)), cast once; HF computes it the same way in f32."""
    x32 = _rms_scale(cfg, x.astype(jnp.float32))
    if cfg.bf16_fix or cfg.dtype == "float32":
        return _to_act(cfg, x32 * w.astype(jnp.float32))
    return x32.astype(cfg.jdtype) * w  # HF order: cast, then scale in the model dtype


def _llama3_inv_freq(inv_freq, s: Llama3RopeScaling):
    """Llama 3 RoPE scaling of the inverse frequencies (float64 numpy), the rule of Meta's Llama 3.1
    reference code that transformers implements as rope_type "llama3" (modeling_rope_utils.py). With
    L0 = original_max_position_embeddings and wavelength 2 pi / inv_freq:
      wavelength < L0 / high_freq_factor   -> unchanged (fast rotations, already seen in pretraining);
      wavelength > L0 / low_freq_factor    -> divided by factor (slow rotations: stretched for long contexts);
      in between -> inv_freq * ((1 - a) / factor + a), a = (L0 / wavelength - low) / (high - low),
      which runs from 0 at the long end to 1 at the short end, so the rule is continuous.
    Written as one clipped blend: a clipped to [0, 1] gives the two outer cases exactly."""
    wavelength = 2.0 * np.pi / inv_freq
    a = (s.original_max_position_embeddings / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    a = np.clip(a, 0.0, 1.0)
    return inv_freq * ((1.0 - a) / s.factor + a)


def rope_table(cfg: ModelConfig, T: int):
    """cos/sin [T, H/2] computed once in float64 numpy: a constant, so forward and decode read the same
    bits for a position instead of each evaluating cos() on differently shaped inputs. With
    cfg.rope_scaling the inverse frequencies are first rescaled (_llama3_inv_freq), still in float64."""
    H = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, H, 2, dtype=np.float64) / H))
    if cfg.rope_scaling is not None:
        inv_freq = _llama3_inv_freq(inv_freq, cfg.rope_scaling)
    angle = np.arange(T, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def _rope(cfg: ModelConfig, x_RTXH, cos_BTh, sin_BTh):
    """Rotate-half RoPE as in HF (pairs (i, i + H/2)), in f32, cast once."""
    x = x_RTXH.astype(jnp.float32)
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    c, s = cos_BTh[:, :, None, :], sin_BTh[:, :, None, :]
    return _to_act(cfg, jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1))


def attention(cfg: ModelConfig, q_RTNH, k_RKSH, v_RKSH, mask_RTS):
    """GQA attention over S key positions; masked scores are -inf (PRECISION POLICY (d)).
    Scores and softmax in f32; probabilities cast to the activation dtype for the PV matmul (as HF)."""
    R, T, N, H = q_RTNH.shape
    K = cfg.num_kv_heads
    G = N // K
    q_RTKGH = q_RTNH.reshape(R, T, K, G, H)
    # PRECISION POLICY (j): at least MIN_ATTN_ROWS rows (G * T) per dot; zero query heads padded in, dropped below
    g_pad = max(G, -(-MIN_ATTN_ROWS // T)) - G if cfg.bf16_fix else 0
    if g_pad:
        q_RTKGH = jnp.pad(q_RTKGH, ((0, 0), (0, 0), (0, 0), (0, g_pad), (0, 0)))
    s_RKGTS = jnp.einsum("BTKGH,BKSH->BKGTS", q_RTKGH, k_RKSH, preferred_element_type=jnp.float32,
                         precision=_precision(cfg))
    s_RKGTS = s_RKGTS * np.float32(1.0 / math.sqrt(H))
    s_RKGTS = jnp.where(mask_RTS[:, None, None, :, :], s_RKGTS, -jnp.inf)
    s_RKGTS = s_RKGTS - jax.lax.stop_gradient(jnp.max(s_RKGTS, axis=-1, keepdims=True))
    p_RKGTS = jnp.exp(s_RKGTS)
    p_RKGTS = _to_act(cfg, p_RKGTS / _row_sum(cfg, p_RKGTS))
    # output head-major then transposed (exact): XLA:CPU has no bf16 x bf16 -> f32 kernel for the
    # BTKGH output layout (UNIMPLEMENTED in DotThunk) and this one is its fast path
    o_RKGTH = _einsum(cfg, "BKGTS,BKSH->BKGTH", p_RKGTS, v_RKSH)[:, :, :G]
    return o_RKGTH.transpose(0, 3, 1, 2, 4).reshape(R, T, N, H)


# ---------------------------- memory: the full-sequence graphs in chunks along T ----------------------------
# Without chunks the trainer's graph holds float32 attention scores [R, K, G, T, T] (quadratic in T) and
# float32 head logits [R, T, V] (and their log-softmax, and the gradients of both): at T = 1024 and
# Qwen2.5's V = 151,936 that is 0.6 GB per [T, V] buffer per row. Both are now computed over chunks of
# positions (lax.map / lax.scan), each chunk a function of its own rows only, so every row runs the same
# ops on the same inputs as before and the bits are unchanged (tests/test_memory.py):
#   * attention chunks the QUERIES: each query chunk attends over all S keys with the causal mask, so
#     every softmax and PV sum still runs over the full key axis in the same order (chunking the keys,
#     as flash attention does, would change the order of those sums and break parity with decode);
#   * the head (final norm, unembedding, log-softmax, gather) runs per chunk of positions.
# The chunk sizes are static (jit specialises on them): the keyword (query_chunk= / chunk_tokens=) if
# given, 0 meaning no chunking; else, for a bf16 model (_default_chunking: float32 models are not
# chunked unless asked), the largest power of two of positions whose float32 scores / logits fit
# ATTN_CHUNK_BYTES / HEAD_CHUNK_BYTES (0 there also turns chunking off). These module values are read
# when a function is traced: set them before the first call of a jitted function, not between calls.
# T need not be a multiple of the chunk: n = ceil(T / c) chunks of ceil(T / n) positions rounded up to a
# multiple of 8, the last zero-padded (fewer than 8n padded positions, dropped again).

HEAD_CHUNK_BYTES = 128 << 20
"""Byte target of one head chunk's float32 logits [R, C, V]; 0 = the whole [R, T, V] at once."""
ATTN_CHUNK_BYTES = 32 << 20
"""Byte target of one query chunk's float32 attention scores [R, N, C, T]; 0 = all queries at once."""
MIN_CHUNK = 16
"""The fewest positions in a chunk (see _chunk_len); also MIN_DECODE_ROWS rows of a head chunk at R = 1."""


def _chunk_len(T: int, bytes_per_position: int, budget: int, chunk: int | None) -> int:
    """Positions per chunk along an axis of length T (T itself = one chunk, no chunking): `chunk` if
    given (0 = T), else the largest power of two with chunk * bytes_per_position <= budget (budget 0 = T).
    Rounded up to a multiple of 8, at least MIN_CHUNK; then evened out to n = ceil(T / chunk) chunks of
    ceil(T / n) positions rounded up to a multiple of 8 (never more than chunk), so the last chunk is
    nearly full. Why >= 16: a head chunk then has >= MIN_DECODE_ROWS rows, the row counts the parity was
    measured at (a one-position chunk took another dot path on XLA:CPU). Why multiples of 8: whole
    SIMD tiles of rows; in a float32 probe on XLA:CPU, chunks of 8k+1..8k+4 queries changed bits where
    8k did not (float32 is not bitwise under chunking anyway: _default_chunking). bf16 measured bitwise
    for every chunk length >= 2."""
    if chunk is None:
        chunk = 0 if budget <= 0 else 1 << max(int(budget // max(bytes_per_position, 1)), 1).bit_length() - 1
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 0:
        raise ValueError(f"a chunk length must be an int >= 0 (0 = no chunking), got {chunk!r}")
    chunk = max(-(-int(chunk) // 8) * 8, MIN_CHUNK) if chunk else 0
    if chunk == 0 or chunk >= T:
        return T
    n = -(-T // chunk)
    return min((-(-T // n) + 7) // 8 * 8, chunk)  # >= MIN_CHUNK, as T / n > chunk / 2


def _split_chunks(x, c: int):
    """[R, T, ...] -> [n, R, c, ...] with n = ceil(T / c); positions past T are zeros."""
    R, T = x.shape[:2]
    n = -(-T // c)
    x = jnp.pad(x, [(0, 0), (0, n * c - T)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape((R, n, c) + x.shape[2:]), 1, 0)


def _join_chunks(y, T: int):
    """Inverse of _split_chunks: [n, R, c, ...] -> [R, T, ...] (the padded positions dropped)."""
    n, R, c = y.shape[:3]
    return jnp.moveaxis(y, 0, 1).reshape((R, n * c) + y.shape[3:])[:, :T]


def _query_chunk_len(cfg: ModelConfig, R: int, T: int, query_chunk: int | None) -> int:
    """Queries per attention chunk (_chunk_len on ATTN_CHUNK_BYTES of float32 [R, N, C, T] scores);
    by default no chunking for a float32 config (see _default_chunking)."""
    if query_chunk is None and not _default_chunking(cfg):
        return T
    return _chunk_len(T, 4 * R * cfg.num_heads * T, ATTN_CHUNK_BYTES, query_chunk)


def _default_chunking(cfg: ModelConfig) -> bool:
    """Chunks by default only for a bf16 model. Measured on XLA:CPU: a bf16 x bf16 -> f32 dot gives every
    row the same bits whatever the number of rows (>= 2), so chunks keep the bits (tests/test_memory.py);
    a float32 x float32 dot does not (its summation order changes with the shape: chunked float32
    log-probs differed from unchunked in the last bit, and float32 decode already differs from forward
    at some lengths, e.g. T = 160). float32 models are the small reference models of the tests; the
    keywords still chunk them (then equal within float32 rounding, not bitwise)."""
    return cfg.dtype != "float32"


def _causal_attention(cfg: ModelConfig, q_RTNH, k_RKTH, v_RKTH, c: int):
    """Causal self-attention of T positions, queries in chunks of c (c >= T: all at once, the plain
    _attention). Each chunk attends over all T keys with where(key <= query, s, -inf): the same
    reductions, of the same length, in the same order as unchunked, and as decode's (PRECISION POLICY (d)).
    Each chunk is remat'ed, so the backward keeps only q, k, v and recomputes one chunk's scores at a time.
    k and v enter the loop as float32 (exact: they hold bf16 values, cast back inside), so that their
    gradients, one partial per chunk, are summed over the chunks in float32 rather than bf16."""
    R, T = q_RTNH.shape[:2]
    if c >= T:
        mask_RTS = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool))[None], (R, T, T))
        return attention(cfg, q_RTNH, k_RKTH, v_RKTH, mask_RTS)
    n = -(-T // c)
    pos_nC = jnp.arange(n * c).reshape(n, c)  # padded queries sit past T: they see every key, no NaN

    @partial(jax.checkpoint, policy=jax.checkpoint_policies.nothing_saveable)
    def chunk(k32, v32, q_RCNH, pos_C):
        mask_RCS = jnp.broadcast_to((pos_C[:, None] >= jnp.arange(T)[None, :])[None], (R, c, T))
        return attention(cfg, q_RCNH, k32.astype(k_RKTH.dtype), v32.astype(v_RKTH.dtype), mask_RCS)

    k32, v32 = k_RKTH.astype(jnp.float32), v_RKTH.astype(jnp.float32)
    o_nBCNH = jax.lax.map(lambda qp: chunk(k32, v32, *qp), (_split_chunks(q_RTNH, c), pos_nC))
    return _join_chunks(o_nBCNH, T)


def layer_qkv(cfg: ModelConfig, lp: dict, x_RTD, cos_BTh, sin_BTh):
    """Input RMSNorm, q/k/v projections, Qwen3's QK-norm (per head, over H, before RoPE), RoPE on q and k.
    The QK-norm is _rms_norm itself (PRECISION POLICY (b), (f), (g): f32, per-row barriers, fixed-tree
    row sum over H, one rounding), so decode's [R, 1, ., H] rows and forward's [R, T, ., H] rows get the
    same bits."""
    h_RTD = _rms_norm(cfg, x_RTD, lp["input_norm"])
    q_RTNH = _einsum(cfg, "BTD,DNH->BTNH", h_RTD, lp["q_proj"], lp.get("q_bias"))
    k_RTKH = _einsum(cfg, "BTD,DKH->BTKH", h_RTD, lp["k_proj"], lp.get("k_bias"))
    v_RTKH = _einsum(cfg, "BTD,DKH->BTKH", h_RTD, lp["v_proj"], lp.get("v_bias"))
    if cfg.qk_norm:
        q_RTNH = _rms_norm(cfg, q_RTNH, lp["q_norm"])
        k_RTKH = _rms_norm(cfg, k_RTKH, lp["k_norm"])
    return _rope(cfg, q_RTNH, cos_BTh, sin_BTh), _rope(cfg, k_RTKH, cos_BTh, sin_BTh), v_RTKH


def layer_out(cfg: ModelConfig, lp: dict, x_RTD, o_RTNH):
    """Attention output projection, residual, then the SwiGLU MLP and its residual."""
    x_RTD = _add(cfg, x_RTD, _einsum(cfg, "BTNH,NHD->BTD", o_RTNH, lp["o_proj"]))
    h_RTD = _rms_norm(cfg, x_RTD, lp["post_norm"])
    gate_RTF = _einsum(cfg, "BTD,DF->BTF", h_RTD, lp["gate_proj"])
    up_RTF = _einsum(cfg, "BTD,DF->BTF", h_RTD, lp["up_proj"])
    if cfg.bf16_fix or cfg.dtype == "float32":
        act_RTF = _to_act(cfg, jax.nn.silu(gate_RTF.astype(jnp.float32)) * up_RTF.astype(jnp.float32))
    else:
        act_RTF = jax.nn.silu(gate_RTF) * up_RTF
    return _add(cfg, x_RTD, _einsum(cfg, "BTF,FD->BTD", act_RTF, lp["down_proj"]))


def _layer(cfg: ModelConfig, lp: dict, x_RTD, cos_BTh, sin_BTh, query_chunk: int):
    """One full-sequence causal decoder block, attention queries in chunks of query_chunk positions
    (_causal_attention); also returns its K/V (the prefill's cache entries)."""
    q_RTNH, k_RTKH, v_RTKH = layer_qkv(cfg, lp, x_RTD, cos_BTh, sin_BTh)
    # K/V kept head-major [R, K, T, H], the cache layout: measured 2-4x faster batched attention
    # matmuls in decode than [R, T, K, H], and no per-step transpose of the cache
    k_RKTH, v_RKTH = k_RTKH.transpose(0, 2, 1, 3), v_RTKH.transpose(0, 2, 1, 3)
    o_RTNH = _causal_attention(cfg, q_RTNH, k_RKTH, v_RKTH, query_chunk)
    return layer_out(cfg, lp, x_RTD, o_RTNH), (k_RKTH, v_RKTH)


def check_tokens(cfg: ModelConfig, tokens_RT):
    """ValueError unless tokens_RT is an integer [R, T] array of ids in the vocabulary, T <= max_seq_len."""
    if tokens_RT.ndim != 2:
        raise ValueError(f"tokens must have shape [batch, time], got shape {tokens_RT.shape}")
    if tokens_RT.shape[1] > cfg.max_seq_len:
        raise ValueError(f"sequence length {tokens_RT.shape[1]} exceeds the model's max_seq_len {cfg.max_seq_len}")
    if not jnp.issubdtype(tokens_RT.dtype, jnp.integer):
        raise ValueError(f"tokens must be integers, got dtype {tokens_RT.dtype}")
    if not isinstance(tokens_RT, jax.core.Tracer):  # concrete input: check the id range here, readably
        t = np.asarray(tokens_RT)
        if t.size and (t.min() < 0 or t.max() >= cfg.vocab_size):
            bad = t[(t < 0) | (t >= cfg.vocab_size)]
            raise ValueError(f"token id {int(bad[0])} out of range [0, {cfg.vocab_size}) "
                             f"({bad.size} such ids in the input)")


def hidden(params: dict, cfg: ModelConfig, tokens_RT, return_kv: bool = False, query_chunk: int | None = None):
    """Embedding + the layer stack (lax.scan over L, each layer remat'ed): final residual x_RTD and,
    if asked, the stacked K/V [L, R, K, T, H] (the sampler's prefill: its KV cache entries are these).
    query_chunk: see _chunk_len."""
    R, T = tokens_RT.shape
    cos, sin = rope_table(cfg, T)
    cos_BTh = jnp.broadcast_to(cos[None], (R,) + cos.shape)
    sin_BTh = jnp.broadcast_to(sin[None], (R,) + sin.shape)
    x_RTD = embed_tokens(params, cfg, tokens_RT)
    layer = _remat(cfg, partial(_layer, cfg, query_chunk=_query_chunk_len(cfg, R, T, query_chunk)))

    def step(x_RTD, lp):
        x_RTD, kv = layer(lp, x_RTD, cos_BTh, sin_BTh)
        return x_RTD, (kv if return_kv else None)

    x_RTD, kv = jax.lax.scan(step, x_RTD, params["layers"])
    return x_RTD, kv


def embed_tokens(params: dict, cfg: ModelConfig, tokens_RT):
    """Token embedding rows [R, T, D] in the activation dtype: the residual stream's input."""
    return jnp.take(params["embed"], tokens_RT, axis=0).astype(cfg.jdtype)


def _unembed_matrix(params: dict, cfg: ModelConfig):
    """The unembedding as stored: embed [V, D] when tied (never transposed: see _head_logits), else
    lm_head [D, V]."""
    return params["embed"] if cfg.tie_embeddings else params["lm_head"]


def _head_logits(cfg: ModelConfig, final_norm, w, x_XD):
    """Output head in f32 (PRECISION POLICY (c)): final RMSNorm, unembedding -> float32 logits.
    w is embed [V, D] (tied) or lm_head [D, V]. The tied case contracts embed's D axis directly
    ("...D,VD->...V"): measured on XLA:CPU, a dot against embed.T folded the transpose into the
    dot and summed a 16-row decode batch in another order than a [R*T]-row forward (about 5 tokens
    in 1000 differed); contracting the stored layout is row-count invariant."""
    spec = "...D,VD->...V" if cfg.tie_embeddings else "...D,DV->...V"
    x32 = _rms_scale(cfg, x_XD.astype(jnp.float32))
    if cfg.bf16_fix or cfg.dtype == "float32":
        # The unembedding's inputs stay in the weight dtype and it accumulates into f32. Measured on
        # XLA:CPU: a bf16 x bf16 -> f32 dot gives the same bits for every row count >= 2, while an
        # f32 x f32 dot changes its summation order below 16..64 rows (so decode != forward).
        h = (x32 * final_norm.astype(jnp.float32)).astype(w.dtype)
        return jnp.einsum(spec, h, w, preferred_element_type=jnp.float32, precision=_precision(cfg))
    h = x32.astype(cfg.jdtype) * final_norm
    return jnp.einsum(spec, h, w).astype(jnp.float32)


def _log_softmax(cfg: ModelConfig, logits_XV, temperature):
    """log softmax(logits / temperature) in f32; temperature 0 is treated as 1 (greedy sampling reports
    the untempered log-prob). Multiplying by 1/temperature (not dividing) gives the same bits whether
    temperature is a Python constant or a traced value."""
    t = jnp.asarray(temperature, jnp.float32)
    inv_t = jnp.where(t > 0, jnp.float32(1.0) / jnp.where(t > 0, t, 1.0), jnp.float32(1.0))
    z = logits_XV.astype(jnp.float32) * inv_t
    z = z - jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
    return z - _per_row(cfg, jnp.log, _row_sum(cfg, jnp.exp(z)))


def forward(params: dict, cfg: ModelConfig, tokens_RT, *, query_chunk: int | None = None) -> jax.Array:
    """float32 logits [R, T, V] for positions 0..T-1 with a causal mask (scoring and tests; the trainer
    uses token_logprobs, which never holds [R, T, V]). query_chunk: attention chunks, see _chunk_len."""
    check_tokens(cfg, tokens_RT)
    x_RTD, _ = hidden(params, cfg, tokens_RT, query_chunk=query_chunk)
    head = _remat(cfg, partial(_head_logits, cfg))
    return head(params["final_norm"], _unembed_matrix(params, cfg), x_RTD)


def _head_token_logp(cfg: ModelConfig, final_norm, w, x_RTD, next_RT, temperature):
    """log softmax(head(x) / temperature)[next] per position: the rows' math of the sampler's reported
    log-probs (next_token_logprobs, then one gather)."""
    logits_RTV = _head_logits(cfg, final_norm, w, x_RTD)
    logp_RTV = _log_softmax(cfg, logits_RTV, temperature)
    return jnp.take_along_axis(logp_RTV, next_RT[..., None], axis=-1)[..., 0]


def _head_chunk_len(cfg: ModelConfig, R: int, T: int, chunk_tokens: int | None) -> int:
    """Positions per head chunk (_chunk_len on HEAD_CHUNK_BYTES of float32 [R, C, V] logits). A chunk
    of >= MIN_CHUNK positions has >= MIN_DECODE_ROWS rows, the row counts decode and the unchunked
    trainer run the unembedding dot at (measured row-count invariant from 2 rows on: _head_logits).
    By default (chunk_tokens None) the head is chunked only where that saves memory by the head terms
    of the trainer's memory estimate (_head_bytes): the chunked backward's float32 gradient accumulator
    costs 4.6..6.5 bytes per unembedding entry (V x D), which for a wide model and few tokens outweighs
    the [R, T, V] logits it avoids (Qwen2.5-7B's at 1 x 1024 tokens: 3.5 GB either way); the bits are
    the same both ways."""
    if chunk_tokens is None and not _default_chunking(cfg):
        return T
    c = _chunk_len(T, 4 * R * cfg.vocab_size, HEAD_CHUNK_BYTES, chunk_tokens)
    if chunk_tokens is None and c < T and _head_bytes(cfg, R, T, c) >= _head_bytes(cfg, R, T, T):
        return T
    return c


# The output head's terms of the trainer's memory estimate (memory.py, whose comment gives every term
# and its calibration): they live here because the default head chunking (_head_chunk_len) compares
# them. Bytes: chunked, the float32 weight-gradient accumulator (tied 4.6, untied 6.5 bytes * V*D) plus
# 2.5 x float32 [R, C, Vpad] per chunk (logits, exp, _row_sum's power-of-two pad, their gradients);
# unchunked, 3.5 x float32 [R, T, Vpad] (measured 2.5..3.8).
_HEAD_COEF = dict(acc_tied=4.6, acc_untied=6.5, head_chunk=2.5, head_whole=3.5)


def _head_bytes(cfg: ModelConfig, R: int, T: int, c: int) -> float:
    """The head's bytes in memory.train_step_bytes for R x T positions in chunks of c (c >= T: unchunked)."""
    k = _HEAD_COEF
    v_pad = 1 << (cfg.vocab_size - 1).bit_length() if cfg.bf16_fix else cfg.vocab_size
    if c >= T:
        return k["head_whole"] * 4 * R * T * v_pad
    acc = k["acc_tied"] if cfg.tie_embeddings else k["acc_untied"]
    return k["head_chunk"] * 4 * R * c * v_pad + acc * cfg.vocab_size * cfg.hidden_size


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _chunked_head_token_logp(cfg: ModelConfig, c: int, final_norm, w, x_RTD, next_RT, temperature):
    """_head_token_logp over chunks of c positions (lax.map): the float32 [R, c, V] logits of one chunk
    at a time. The backward (below) is a custom rule so that the weight gradients, one partial per
    chunk, are summed in float32: autodiff of a loop sums a closed-over weight's cotangent in the
    weight's dtype, which for bf16 loses the small partials once the sum is 2^8 times larger."""
    logp_nBC = jax.lax.map(lambda xn: _head_token_logp(cfg, final_norm, w, xn[0], xn[1], temperature),
                           (_split_chunks(x_RTD, c), _split_chunks(next_RT, c)))
    return _join_chunks(logp_nBC, x_RTD.shape[1])


def _chunked_head_fwd(cfg, c, final_norm, w, x_RTD, next_RT, temperature):
    # Residuals: the inputs only (no logits); the backward recomputes each chunk.
    return (_chunked_head_token_logp(cfg, c, final_norm, w, x_RTD, next_RT, temperature),
            (final_norm, w, x_RTD, next_RT, temperature))


def _chunked_head_bwd(cfg, c, res, g_RT):
    """Per chunk: recompute and differentiate that chunk (jax.vjp of _head_token_logp, the same rule
    autodiff applies unchunked), x's cotangent per chunk, final_norm's and w's summed in float32 and
    cast once. No cotangent for the token ids or the temperature (treated as constants)."""
    final_norm, w, x_RTD, next_RT, temperature = res

    def body(acc, xs):
        x_RCD, next_RC, g_RC = xs
        _, vjp = jax.vjp(lambda fn, w, x: _head_token_logp(cfg, fn, w, x, next_RC, temperature), final_norm, w, x_RCD)
        d_norm, d_w, d_x = vjp(g_RC)
        return (acc[0] + d_norm.astype(jnp.float32), acc[1] + d_w.astype(jnp.float32)), d_x

    zeros = (jnp.zeros(final_norm.shape, jnp.float32), jnp.zeros(w.shape, jnp.float32))
    (d_norm, d_w), d_x = jax.lax.scan(body, zeros, (_split_chunks(x_RTD, c), _split_chunks(next_RT, c),
                                                    _split_chunks(g_RT.astype(jnp.float32), c)))
    return d_norm.astype(final_norm.dtype), d_w.astype(w.dtype), _join_chunks(d_x, x_RTD.shape[1]), None, None


_chunked_head_token_logp.defvjp(_chunked_head_fwd, _chunked_head_bwd)


def token_logprobs(params: dict, cfg: ModelConfig, tokens_RT, temperature=1.0, *, chunk_tokens: int | None = None,
                   query_chunk: int | None = None) -> jax.Array:
    """THE log-prob function of sampler scoring and trainer: float32 [R, T] with
    logp_RT[:, t] = log softmax(logits[:, t-1] / temperature)[tokens[:, t]] and logp_RT[:, 0] = 0.
    Differentiable w.r.t. params; jit it with cfg (and the chunk keywords) static. sampler.generate
    reports the same bits. chunk_tokens: positions per output-head chunk, query_chunk: queries per
    attention chunk; 0: no chunking; None (the default): for a bf16 model sized from HEAD_CHUNK_BYTES /
    ATTN_CHUNK_BYTES (_head_chunk_len, _query_chunk_len), for a float32 model none. In bf16 the chunk
    sizes do not change the log-probs' bits (measured; tests/test_memory.py), only where the gradients'
    float32 sums are split; a chunked float32 model agrees within float32 rounding."""
    check_tokens(cfg, tokens_RT)
    x_RTD, _ = hidden(params, cfg, tokens_RT, query_chunk=query_chunk)
    R, T = tokens_RT.shape
    c = _head_chunk_len(cfg, R, T - 1, chunk_tokens)
    head = (_remat(cfg, partial(_head_token_logp, cfg)) if c >= T - 1
            else partial(_chunked_head_token_logp, cfg, c))
    logp_BT1 = head(params["final_norm"], _unembed_matrix(params, cfg), x_RTD[:, :-1], tokens_RT[:, 1:], temperature)
    return jnp.concatenate([jnp.zeros_like(logp_BT1[:, :1]), logp_BT1], axis=1)


# =====================================================================================================
# 5. What the sampler builds on (sampler.py). The prefill is hidden(..., return_kv=True); a decode step
#    (sampler.decode_step) runs one position per row through the pieces the forward's layers are made
#    of: embed_tokens, then per layer (layer_params) layer_qkv (rope_table's rows), K/V into the cache,
#    attention over the cache (PRECISION POLICY (d)), layer_out; then next_token_logprobs.
# =====================================================================================================


def layer_params(params: dict, layer: int) -> dict:
    """Layer `layer`'s weights (params["layers"] is stacked on a leading L axis for the forward's scan)."""
    return jax.tree.map(lambda w: w[layer], params["layers"])


def next_token_logprobs(params: dict, cfg: ModelConfig, x_XD, temperature) -> jax.Array:
    """float32 [..., V] log softmax(logits / temperature) of the next token from final residuals x_XD:
    the output head of token_logprobs (final RMSNorm, unembedding, log-softmax, PRECISION POLICY (c)),
    over the whole vocabulary. temperature 0 is treated as 1 (greedy sampling reports the untempered
    log-prob)."""
    head = _remat(cfg, partial(_head_logits, cfg))
    return _log_softmax(cfg, head(params["final_norm"], _unembed_matrix(params, cfg), x_XD), temperature)
