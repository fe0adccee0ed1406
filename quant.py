"""quant.py: the sampler's weights in 8 bits (QuaRL's quantised actors), as pure functions.

An inference worker started with --sampler-quant int8 (launch.sh SAMPLER_QUANT=int8) quantises every
weight version it installs (inference_worker.py:Worker.install, the one place) and samples with it; the
trainer keeps its bf16 forward and float32 master weights, so the mismatch/* metrics it logs measure
the quantised sampler against it, token by token (docs/numerics.md, "What int8 sampling changes").

The scheme: weight-only, per output channel, symmetric. For a weight w whose contracted (input) axes
are I and output axes O, each output channel o gets one scale s_o = max_I |w[I, o]| / QMAX and
q[I, o] = round(w[I, o] / s_o) (computed as w * QMAX / max |w|), stored as int8 (QMAX 127) or float8 e4m3 (QMAX 448, "fp8"). A channel
of zeros gets s = 0 and q = 0 (no division by zero). The scale is float32, kept with size-1 contracted
axes ([L, 1, N, H] for q_proj [L, D, N, H]) so that it broadcasts against q and slices with it.

What is quantised: the seven projections of every layer (QUANTISED: q/k/v/o, gate/up/down), stacked on
their leading L axis like the bf16 weights, so lax.scan and the decode's per-layer slice see a
QuantWeight per layer. What is not: the embedding (a row lookup, B rows per decode step, so 8 bits
would save no reads), the output head (lm_head, or the tied embedding; its logits are the log-probs
directly, with no normalisation after it to absorb an error), norms and biases (vectors).

How a QuantWeight is used: model.py:_einsum multiplies the activations by q converted to the
activation dtype (exact: every int8 and e4m3 value is a bf16 value), accumulates in float32 as for any
weight, and only then multiplies each output channel by its scale, in float32; so the result is that
of the weights dequantise(q, s) up to float32 rounding, with no bf16 copy of the dequantised weights.

Run the tests:  python -m pytest -q tests/test_quant.py
Benchmark:      python bench/bench_quant.py
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

QUANTISED = {"q_proj": 1, "k_proj": 1, "v_proj": 1, "o_proj": 2, "gate_proj": 1, "up_proj": 1, "down_proj": 1}
"""params["layers"] names that are quantised -> how many contracted (input) axes follow the layer axis L
(the layout of model.py's parameter picture: o_proj [L, N, H, D] contracts N and H)."""

FORMATS = {"int8": (jnp.int8, 127.0), "fp8": (jnp.float8_e4m3fn, 448.0)}
"""--sampler-quant value -> (storage dtype, QMAX: the largest magnitude a channel's max maps to)."""
MODES = ("none",) + tuple(FORMATS)


@jax.tree_util.register_pytree_node_class
class QuantWeight:
    """A quantised weight: q (int8 or float8_e4m3fn, the weight's shape) and scale (float32, the weight's
    shape with its contracted axes of size 1). A pytree of those two leaves, so jit, lax.scan over the
    stacked layers and tree maps (the decode's per-layer slice, device_put) treat it like any weight."""

    def __init__(self, q, scale):
        self.q, self.scale = q, scale

    def tree_flatten(self):
        return (self.q, self.scale), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def shape(self):
        return self.q.shape

    def __repr__(self):
        return f"QuantWeight(q={getattr(self.q, 'dtype', '?')}{tuple(self.q.shape)}, scale={tuple(self.scale.shape)})"


def quantise(w, n_lead: int, n_contract: int, fmt: str = "int8") -> QuantWeight:
    """One weight, per output channel: axes [0, n_lead) are stacking axes (a layer's L), the next
    n_contract are contracted, the rest are the output channel. s = max |w| over the contracted axes /
    QMAX (float32), q = round(w * QMAX / max |w|) in the format's dtype (int8: round half to even; fp8: the cast's
    round to nearest), q = 0 and s = 0 on an all-zero channel. A numpy weight is quantised in numpy, a
    jax one by jax, with the same bits (test_quant.py)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown quantisation format {fmt!r}; expected one of {tuple(FORMATS)}")
    xp = np if isinstance(w, np.ndarray) else jnp  # host arrays stay on the host (the same IEEE ops, bits)
    w32 = w.astype(np.float32)
    axes = tuple(range(n_lead, n_lead + n_contract))
    if n_contract < 1 or n_lead + n_contract >= w32.ndim:
        raise ValueError(f"a weight of shape {w32.shape} has no output axis after {n_lead} stacking and "
                         f"{n_contract} contracted axes")
    dtype, qmax = FORMATS[fmt]
    amax = xp.max(xp.abs(w32), axis=axes, keepdims=True)
    # Products, not quotients, where XLA may rewrite one: XLA:CPU divides by a broadcast or constant
    # divisor as a multiply by its reciprocal (measured: w / s gave 63.499996 where numpy gives 63.5),
    # so both paths multiply by the same float32 numbers: 1 / QMAX, and QMAX / amax per channel.
    scale = amax * np.float32(1.0 / qmax)
    x = w32 * (np.float32(qmax) / xp.where(amax > 0, amax, np.float32(1.0)))
    if fmt == "int8":
        x = xp.clip(xp.round(x), -qmax, qmax)
    return QuantWeight(xp.where(amax > 0, x, np.float32(0.0)).astype(dtype), scale)


def dequantise(qw: QuantWeight):
    """q * scale in float32: the weight a QuantWeight stands for (for tests and error measurements)."""
    return qw.q.astype(np.float32) * qw.scale


def quantise_params(params: dict, fmt: str = "int8") -> dict:
    """The model's params with every QUANTISED layer weight a QuantWeight (stacked over L, per output
    channel); everything else (embedding, head, norms, biases) the same arrays. fmt "none": params as given."""
    if fmt == "none":
        return params
    layers = dict(params["layers"])
    for name, n_contract in QUANTISED.items():
        if name not in layers:
            raise ValueError(f"params['layers'] has no {name!r}: not this model's parameter tree")
        layers[name] = quantise(layers[name], 1, n_contract, fmt)
    return {**params, "layers": layers}


def params_bytes(params) -> int:
    """Bytes of every array of a params tree, QuantWeights' int8 values and float32 scales included."""
    return int(sum(np.dtype(x.dtype).itemsize * int(np.prod(x.shape)) for x in jax.tree.leaves(params)))


def output_scale(spec: str, scale):
    """A QuantWeight's scale laid out for the output of jnp.einsum(spec, x, q): its contracted axes
    dropped, the output axes in the order the output names them, size 1 for the output's other axes.
    spec "BTD,DNH->BTNH" with scale [1, N, H] -> [1, 1, N, H]."""
    ins, out = spec.split("->")
    w_axes = ins.split(",")[1]
    if len(w_axes) != scale.ndim:
        raise ValueError(f"einsum {spec!r}: the weight has {len(w_axes)} axes, its scale {scale.ndim}")
    keep = [i for i, a in enumerate(w_axes) if a in out]
    s = jnp.squeeze(scale, axis=tuple(i for i in range(scale.ndim) if i not in keep))
    kept = [w_axes[i] for i in keep]
    s = jnp.transpose(s, sorted(range(len(kept)), key=lambda i: out.index(kept[i])))
    return jnp.reshape(s, [s.shape[sorted(kept, key=out.index).index(a)] if a in kept else 1 for a in out])
