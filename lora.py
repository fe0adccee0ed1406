"""lora.py: low-rank adapters (LoRA, Hu et al. 2021, arXiv:2106.09685) on the decoder's linear layers.

    lcfg = LoraConfig(rank=8, alpha=32.0)                 # every attention and MLP projection
    adapter = init_adapter(mcfg, lcfg, key)                # f32; B = 0, so merge gives the base exactly
    params = merge(base_params, adapter, mcfg, lcfg)       # the policy, in the compute dtype
    named = adapter_tensors(adapter, mcfg)                 # {"lora.layers.q_proj.A": [L, r, in], ...}, bf16

For each target projection W (ours stored [in..., out...], stacked over the L layers; model.py part 3)
the adapter holds, per layer, A [r, in] and B [out, r] in PEFT's orientation (its lora_A.weight and
lora_B.weight: hf_io.save_peft_adapter writes them under PEFT's names), and the policy's weight is

    W' = round_c(W + scale * (round_c(B) @ round_c(A))^T),      scale = alpha / rank

with round_c the rounding to the model's compute dtype (mcfg.jdtype) and the sum computed in f32.

ONE FUNCTION FOR BOTH ROLES. The trainer (update.py) and the inference worker both call `merge`,
one jitted function, on the same base bits, so the sampler and the trainer run the model on
bit-identical weights and the precision policy (model.py PRECISION POLICY) keeps their log-probs
bitwise equal. The trainer holds the adapter in f32 (its master: Adam updates it), but the policy
depends on it only through round_c(A) and round_c(B), so the adapter travels in the compute dtype
(adapter_tensors: half the bytes of f32 when that is bf16) and the worker, merging those values,
computes the trainer's W'. round_c is lax.reduce_precision (compute_round), an f32 -> f32 op that no
compiler pass may drop as it may drop an f32 -> bf16 -> f32 pair of casts (XLA's excess precision), and
it is idempotent: the received values, already in the compute dtype, round to themselves. With an f32
compute dtype round_c is the identity. To keep the merged bits the same whatever the layout (a
trainer's sharded base, a worker's whole one), merge uses elementwise f32 ops only: B @ A is summed
over the rank as r multiply-adds in a fixed order (k = 0, 1, ..., r-1), never by a matmul whose kernel
(and so its summation order) could depend on the shape. Each element of W' is a function of its own
inputs alone.

GRADIENTS. The trainer differentiates the loss with respect to the merged weights W' (the forward it
differentiates is then the sampler's, on the sampler's exact weights) and projects that gradient onto
A and B (`project_grads`): with G = dL/dW' in PEFT's [out, in] orientation,
    dL/dB = scale * G @ round_c(A)^T,   dL/dA = scale * round_c(B)^T @ G
which is the chain rule through W' = W + scale * round_c(B) @ round_c(A), each rounding taken to have
an identity derivative (a straight-through estimate, as model.py's casts have). docs/lora.md has the
numerics and the measurements.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

import model

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a decoder block (attention q, k, v, o and the SwiGLU MLP): the default
targets, as "LoRA Without Regret" (Schulman et al., Thinking Machines 2025) recommends for RL (MLP
layers matter most; attention-only LoRA underperforms)."""

DEFAULT_ALPHA = 32.0
"""alpha when none is given. scale = alpha / rank with alpha fixed (not alpha proportional to rank):
PEFT's and the original paper's parametrisation, under which "LoRA Without Regret" finds the best
learning rate nearly independent of the rank (they use alpha = 32), so rank 1 and rank 8 runs share one
learning rate."""

PREFIX = "lora.layers."


@dataclass(frozen=True)
class LoraConfig:
    """Which projections carry an adapter, its rank and alpha. Frozen, so hashable: a static arg of merge."""

    rank: int
    """r: the adapter's inner width (A [r, in], B [out, r])."""
    alpha: float = DEFAULT_ALPHA
    """scale = alpha / rank multiplies B @ A (PEFT's lora_alpha)."""
    targets: tuple = TARGETS
    """model.py layer keys of the adapted projections, a subset of TARGETS."""

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, (int, np.integer)) or self.rank < 1:
            raise ValueError(f"LoRA rank must be an int >= 1, got {self.rank!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0 \
                or not math.isfinite(self.alpha):
            raise ValueError(f"LoRA alpha must be a finite number > 0, got {self.alpha!r}")
        targets = tuple(self.targets)
        unknown = [t for t in targets if t not in TARGETS]
        if not targets or unknown or len(set(targets)) != len(targets):
            raise ValueError(f"LoRA targets must be distinct names among {TARGETS}; got {targets!r}")
        # a canonical order, so two configs naming the same targets are equal (and merge compiles once)
        object.__setattr__(self, "targets", tuple(t for t in TARGETS if t in targets))
        object.__setattr__(self, "rank", int(self.rank))
        object.__setattr__(self, "alpha", float(self.alpha))

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def to_dict(self) -> dict:
        return {"rank": self.rank, "alpha": self.alpha, "targets": list(self.targets)}

    @classmethod
    def from_dict(cls, d) -> "LoraConfig":
        """The config a manifest or a checkpoint carries; a malformed one is a ValueError."""
        if not isinstance(d, dict) or set(d) != {"rank", "alpha", "targets"} or not isinstance(d["targets"], (list, tuple)):
            raise ValueError(f"a LoRA config is a map of rank, alpha and targets (a list); got {d!r}")
        return cls(d["rank"], d["alpha"], tuple(d["targets"]))

    @classmethod
    def parse(cls, rank: int, alpha: float = 0.0, targets: str = "") -> "LoraConfig | None":
        """From the flags: None when rank is 0 (LoRA off); alpha 0 = DEFAULT_ALPHA; targets a comma list
        ("" = TARGETS)."""
        if rank == 0:
            return None
        names = tuple(t.strip() for t in targets.split(",") if t.strip()) if targets else TARGETS
        return cls(rank, alpha or DEFAULT_ALPHA, names)


def in_out(mcfg: model.ModelConfig, target: str) -> tuple[int, int]:
    """(in features, out features) of one target projection, as Hugging Face's nn.Linear has them."""
    D, N, K, H, F = mcfg.hidden_size, mcfg.num_heads, mcfg.num_kv_heads, mcfg.head_dim, mcfg.intermediate_size
    return {"q_proj": (D, N * H), "k_proj": (D, K * H), "v_proj": (D, K * H), "o_proj": (N * H, D),
            "gate_proj": (D, F), "up_proj": (D, F), "down_proj": (F, D)}[target]


def adapter_shapes(mcfg: model.ModelConfig, lcfg: LoraConfig) -> dict:
    """{target: {"A": (L, r, in), "B": (L, out, r)}}."""
    L, r = mcfg.num_layers, lcfg.rank
    return {t: {"A": (L, r, in_out(mcfg, t)[0]), "B": (L, in_out(mcfg, t)[1], r)} for t in lcfg.targets}


def init_adapter(mcfg: model.ModelConfig, lcfg: LoraConfig, key) -> dict:
    """A fresh f32 adapter as PEFT makes one: A ~ U(-1/sqrt(in), 1/sqrt(in)) (torch's kaiming_uniform_
    with a = sqrt(5), PEFT's default init of lora_A), B = 0. B = 0 makes merge return the base weights
    bit for bit (W + 0 rounds to W), so version 0 of a LoRA run is the base model."""
    out = {}
    for t, k in zip(lcfg.targets, jax.random.split(key, len(lcfg.targets))):
        shapes = adapter_shapes(mcfg, lcfg)[t]
        bound = 1.0 / math.sqrt(shapes["A"][2])
        out[t] = {"A": jax.random.uniform(k, shapes["A"], jnp.float32, -bound, bound),
                  "B": jnp.zeros(shapes["B"], jnp.float32)}
    return out


def compute_round(x, mcfg: model.ModelConfig):
    """round_c: f32 x rounded to the nearest value of mcfg's compute dtype (ties to even, as a cast
    rounds), kept in f32. lax.reduce_precision, not a pair of casts, so that no compiler may keep
    the excess precision; the identity when the compute dtype is f32. Traceable."""
    dtype = jnp.dtype(mcfg.jdtype)
    if dtype == jnp.float32:
        return x
    info = jnp.finfo(dtype)
    return jax.lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)


def _delta(A_LRI, B_LOR, scale: float):
    """scale * (B @ A)^T per layer, as [L, in, out] f32, summed over the rank in a fixed order with
    elementwise ops only (see the module docstring)."""
    acc = None
    for k in range(A_LRI.shape[1]):
        term = A_LRI[:, k, :, None] * B_LOR[:, None, :, k]
        acc = term if acc is None else acc + term
    return acc * jnp.float32(scale)


@partial(jax.jit, static_argnums=(2, 3))
def _merge_targets(base_layers: dict, adapter: dict, mcfg: model.ModelConfig, lcfg: LoraConfig) -> dict:
    out = {}
    for t in lcfg.targets:
        w = base_layers[t]
        n_in, n_out = in_out(mcfg, t)
        w32 = w.astype(jnp.float32).reshape(w.shape[0], n_in, n_out)
        A, B = (compute_round(adapter[t][m].astype(jnp.float32), mcfg) for m in ("A", "B"))
        delta = _delta(A, B, lcfg.scale)
        out[t] = (w32 + delta).reshape(w.shape).astype(mcfg.jdtype)
    return out


def merge(base_params: dict, adapter: dict, mcfg: model.ModelConfig, lcfg: LoraConfig) -> dict:
    """The policy's weights: the base with each target projection replaced by
    round_c(W + scale * (round_c(B) @ round_c(A))^T) in the compute dtype (one jitted function,
    _merge_targets; the other leaves are the base's own arrays). The adapter may be f32 (the trainer's
    master) or its values in the compute dtype (the wire's, widened by adapter_from_tensors): both merge
    to the same bits. Trainer and worker both call this: bit-identical weights."""
    merged = _merge_targets({t: base_params["layers"][t] for t in lcfg.targets}, adapter, mcfg, lcfg)
    return {**base_params, "layers": {**base_params["layers"], **merged}}


def project_grads(grads: dict, adapter: dict, mcfg: model.ModelConfig, lcfg: LoraConfig) -> dict:
    """The gradient with respect to A and B (f32) from the gradient with respect to the merged
    weights (model pytree, any dtype): dA = scale * round_c(B)^T G, dB = scale * G round_c(A)^T with
    G = dL/dW' in PEFT's [out, in] orientation. Traceable (update.py calls it inside its jitted backward).

    The factors are the rounded A and B, the values the forward's W' was merged from, so this is the
    exact gradient of the loss the trainer computed with respect to round_c(A) and round_c(B), applied
    to the f32 master as if the rounding were the identity (a straight-through estimate, as for any
    weight kept in f32 and used in a lower precision). Using the f32 A and B instead would be the
    gradient at a point the forward never ran on; the two differ by a relative 2^-9 (bf16) in the factor,
    far below the noise of a policy gradient, so this is a choice of consistency, not of accuracy."""
    out = {}
    hi = jax.lax.Precision.HIGHEST
    for t in lcfg.targets:
        n_in, n_out = in_out(mcfg, t)
        g = grads["layers"][t].astype(jnp.float32)
        g_LIO = g.reshape(g.shape[0], n_in, n_out)
        A, B = (compute_round(jnp.asarray(adapter[t][m], jnp.float32), mcfg) for m in ("A", "B"))
        out[t] = {"A": lcfg.scale * jnp.einsum("lio,lok->lki", g_LIO, B, precision=hi),
                  "B": lcfg.scale * jnp.einsum("lio,lki->lok", g_LIO, A, precision=hi)}
    return out


@partial(jax.jit, static_argnums=1)
def _rounded(adapter: dict, mcfg: model.ModelConfig) -> dict:
    return jax.tree_util.tree_map(lambda x: compute_round(x.astype(jnp.float32), mcfg), adapter)


def adapter_tensors(adapter: dict, mcfg: model.ModelConfig) -> dict:
    """{flat name: contiguous numpy array in the compute dtype (mcfg.jdtype)}, what an adapter version
    carries: "lora.layers.<target>.A" [L, r, in] and ".B" [L, out, r]. Each value is round_c of the
    adapter's (compute_round, the rounding merge applies; the cast after it is exact), so merging these
    gives merge(base, adapter) bit for bit. Not for keeping an adapter: master_tensors is the f32 one."""
    rounded = _rounded({t: {m: adapter[t][m] for m in ("A", "B")} for t in adapter}, mcfg)
    return {name: np.ascontiguousarray(np.asarray(x).astype(mcfg.jdtype))
            for name, x in master_tensors(rounded).items()}


def master_tensors(adapter: dict) -> dict:
    """{flat name: contiguous f32 numpy array}, adapter_tensors' names with the adapter's f32 values:
    the trainer's master as it is (fingerprint hashes these)."""
    return {f"{PREFIX}{t}.{m}": np.ascontiguousarray(np.asarray(adapter[t][m], np.float32))
            for t in adapter for m in ("A", "B")}


def adapter_from_tensors(named: dict, mcfg: model.ModelConfig, lcfg: LoraConfig) -> dict:
    """An adapter (jax f32 arrays) from named tensors in any float dtype (adapter_tensors' in the
    compute dtype, master_tensors' or a PEFT folder's in f32; widening to f32 is exact): every name of
    lcfg's targets, each of its shape, and nothing else; else a ValueError naming what differs."""
    want = {f"{PREFIX}{t}.{m}": s for t, ms in adapter_shapes(mcfg, lcfg).items() for m, s in ms.items()}
    missing, extra = sorted(set(want) - set(named)), sorted(set(named) - set(want))
    bad = sorted(f"{k} {tuple(np.shape(named[k]))} (expected {want[k]})" for k in set(want) & set(named)
                 if tuple(np.shape(named[k])) != want[k])
    if missing or extra or bad:
        raise ValueError(f"adapter tensors do not match rank {lcfg.rank}, targets {lcfg.targets}: "
                         f"missing {missing}, unexpected {extra}, shape mismatches {bad}")
    return {t: {m: jnp.asarray(np.asarray(named[f"{PREFIX}{t}.{m}"]), jnp.float32) for m in ("A", "B")}
            for t in lcfg.targets}


def fingerprint(adapter: dict, lcfg: LoraConfig) -> str:
    """sha256 (hex) of an adapter's f32 values: its config (rank, alpha, targets: the same tensors
    under another alpha are another policy) and, in name order, each master_tensors name, dtype, shape
    and f32 bytes. A hash of the tensors, not of a file: a PEFT folder saved again (other metadata,
    another tensor order in the file, bf16 values stored as f32) has the same fingerprint, and one that
    merges to another policy has another (two that differ only below the compute dtype's precision
    merge alike and still hash apart: the hash needs no model config, and refusing such a pair errs on
    the safe side). The checkpoint records --lora-init's (trainer.py, checkpointing.check_lora_resume,
    docs/lora.md)."""
    h = hashlib.sha256(json.dumps(lcfg.to_dict(), sort_keys=True).encode())
    for name, x in sorted(master_tensors(adapter).items()):
        h.update(json.dumps([name, str(x.dtype), list(x.shape)]).encode())  # the shape fixes the byte count
        h.update(x.tobytes())
    return h.hexdigest()


def param_count(mcfg: model.ModelConfig, lcfg: LoraConfig) -> int:
    """Elements of the adapter: sum over targets of L * r * (in + out)."""
    return sum(math.prod(s) for ms in adapter_shapes(mcfg, lcfg).values() for s in ms.values())


def concat(first: dict, second: dict, lcfg: LoraConfig) -> tuple[LoraConfig, dict]:
    """Two adapters of one config as one of rank 2r whose delta is the sum of theirs: A stacked along
    the rank, B side by side, alpha doubled so the scale stays alpha / r. (A --lora-init run trains a
    second adapter on the first one's merged policy; its PEFT export is this sum for the original base.
    The trainer's policy rounds the first merge to the compute dtype; the sum does not. Each half's A
    and B stay as given, so merge rounds them as it rounds each adapter alone.)"""
    out = {t: {"A": np.concatenate([np.asarray(first[t]["A"], np.float32), np.asarray(second[t]["A"], np.float32)], 1),
               "B": np.concatenate([np.asarray(first[t]["B"], np.float32), np.asarray(second[t]["B"], np.float32)], 2)}
           for t in lcfg.targets}
    return LoraConfig(2 * lcfg.rank, 2 * lcfg.alpha, lcfg.targets), out
