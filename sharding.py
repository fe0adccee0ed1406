"""sharding.py: how model.py's parameters, the optimizer state and the batch are laid out over a
("data", "tensor") mesh, for the trainer (FSDP over "data", optional tensor parallelism) and for a
tensor-parallel inference worker.

"data" shards the batch rows and (FSDP / ZeRO-3 style, Rajbhandari et al. 2020) the stored weights,
gradients and Adam state; "tensor" shards heads, MLP width and vocab (Megatron-style, Shoeybi et al.
2019). One table of PartitionSpecs, keyed by model.py's parameter names (see model.init_params for the
pytree). A spec whose mesh axis does not divide the dimension is dropped (replicated).

Two layouts per parameter:
  STORAGE  (param_shardings): the table as is. The f32 master, its gradients and Adam's moments live
           like this between steps: each device holds 1 / (data x tensor) of most tensors.
  COMPUTE  (gather_params, inside the jitted graph): "data" removed, "tensor" kept. The bf16 cast of
           the master is all-gathered over "data" before the forward, and the backward's gradients are
           summed over "data" back into STORAGE (XLA picks reduce-scatter or all-reduce + slice). So
           every row is computed whole by the devices of one tensor group, and a contraction is split
           across devices only along "tensor".
           (The whole bf16 model is gathered at once, not layer by layer inside the scan: per device
           that is 2 bytes/param, plus its gradient before the sum, next to 16 / (data x tensor) for
           the f32 master, gradients and Adam's two moments.)

Which layouts keep the PPO ratio exactly 1 (sampler log-probs == trainer log-probs, bit for bit)?
Measured on XLA:CPU, 8 simulated devices, bf16 fix on, 512 sampled tokens of a small model (4 layers, d=256, GQA, SwiGLU)
(bench/bench_mesh_parity.py; tests/test_mesh.py checks the first line on a tiny model):
  trainer d x 1 (pure data parallel / FSDP, any d) vs a sampler on one device: bitwise, every token,
      with 1 row per device and with padded microbatches too. Each row is computed whole on one device
      and no contraction is split, so the per-row arithmetic is the unsharded program's. KEEPS RATIO 1.
  anything with tensor parallelism on one side only (trainer d x t, t > 1, vs a one-device sampler; or
      an `inference_worker.py --tensor-parallel t` sampler vs a d x 1 trainer): 46-55% of tokens bitwise,
      max |delta logp| 0.026-0.035 nats, the size of the plain-bf16 mismatch. o_proj (contracting the
      sharded heads) and down_proj (the sharded F) add per-device partial sums across devices, another
      order than one device's dot; the next bf16 rounding turns last-bit f32 differences into flips.
  the same t on both sides: bitwise for t = 2 and t = 8, but 97.9% (max 0.016) for t = 4 (one 64-wide
      head per device; with 8 heads of 32, t = 4 was bitwise). The decode and the trainer's graph run
      differently shaped shards, and XLA picks kernels and partitionings by shape. Not guaranteed.
So only tensor = 1 layouts keep the ratio 1 by construction; with tensor parallelism, watch the
trainer's mismatch/* metrics and use grpo's behaviour correction (--is-correction).

LoRA (lora.py): the trainer's frozen base is stored like a master (STORAGE, in the compute dtype) and
gathered the same way; the adapter, its gradient and Adam's state are small and replicated
(update.init_lora_state). lora.merge is elementwise, so the merged weights keep the base's layout and
its bits do not depend on it (docs/lora.md, "On a mesh").
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import model
from model import ModelConfig

_PARAM_SPECS = {  # our name -> spec without the stacked L axis
    "embed": P("tensor", "data"), "final_norm": P(None), "lm_head": P("data", "tensor"),
    "input_norm": P(None), "post_norm": P(None),
    "q_norm": P(None), "k_norm": P(None),  # Qwen3 QK-norm [H]: tiny, replicated
    "q_proj": P("data", "tensor", None), "k_proj": P("data", "tensor", None), "v_proj": P("data", "tensor", None),
    "q_bias": P("tensor", None), "k_bias": P("tensor", None), "v_bias": P("tensor", None),
    "o_proj": P("tensor", None, "data"),
    "gate_proj": P("data", "tensor"), "up_proj": P("data", "tensor"), "down_proj": P("tensor", "data"),
}
ACTIVATION_SPECS = {"tokens_RT": P("data", None), "x_RTD": P("data", None, None),
                    "logits_RTV": P("data", None, "tensor"), "logp_RT": P("data", None)}


def make_mesh(data: int | None = None, tensor: int = 1, devices=None) -> Mesh:
    """A (data, tensor) mesh over the given (default: all) devices; data defaults to n_devices // tensor.
    Consecutive devices form a tensor group (on a GPU host: neighbours, usually NVLink peers)."""
    devices = list(jax.devices() if devices is None else devices)
    if tensor < 1 or len(devices) % tensor:
        raise ValueError(f"tensor parallelism {tensor} does not divide the {len(devices)} devices")
    data = len(devices) // tensor if data is None else data
    if data * tensor != len(devices):
        raise ValueError(f"mesh {data} x {tensor} does not cover the {len(devices)} devices")
    return Mesh(np.array(devices).reshape(data, tensor), ("data", "tensor"))


def role_mesh(tensor: int = 1, devices=None) -> Mesh | None:
    """The mesh a role runs on: all its visible devices as (data = n // tensor) x tensor; None when that
    is one device, where the roles run exactly the unsharded program (same graphs, same numbers)."""
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) == 1 and tensor == 1:
        return None
    return make_mesh(tensor=tensor, devices=devices)


def param_partition_specs(params: dict, cfg: ModelConfig, mesh: Mesh | None = None):
    """STORAGE PartitionSpec pytree for params (arrays or shape structs). With a mesh, an axis that does
    not divide its dimension is dropped (replicated) so any config runs on any mesh."""
    def spec_for(path, leaf):
        name = jax.tree_util.keystr(path[-1:]).strip("[]'\"")
        spec = tuple(_PARAM_SPECS[name])
        if path[0].key == "layers":
            spec = (None,) + spec
        if mesh is not None:
            spec = tuple(a if a is None or leaf.shape[i] % mesh.shape[a] == 0 else None for i, a in enumerate(spec))
        return P(*spec)
    return jax.tree_util.tree_map_with_path(spec_for, params)


def shard_params(params: dict, cfg: ModelConfig, mesh: Mesh) -> dict:
    """device_put every parameter with its STORAGE NamedSharding (numpy leaves go from the host straight
    to their shards: no device ever holds a whole copy)."""
    specs = param_partition_specs(params, cfg, mesh)
    return jax.tree_util.tree_map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), params, specs)


def _is_spec(x) -> bool:
    return isinstance(x, P)


def param_shardings(cfg: ModelConfig, mesh: Mesh) -> dict:
    """STORAGE NamedSharding pytree of cfg's parameters (the structure of model.init_params)."""
    shapes = jax.eval_shape(lambda: model.init_params(cfg, jax.random.PRNGKey(0)))
    specs = param_partition_specs(shapes, cfg, mesh)
    return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs, is_leaf=_is_spec)


def compute_shardings(cfg: ModelConfig, mesh: Mesh) -> dict:
    """COMPUTE layout: STORAGE with "data" removed (gathered over data, still split over tensor)."""
    drop = lambda s: NamedSharding(mesh, P(*(None if a == "data" else a for a in s.spec)))
    return jax.tree_util.tree_map(drop, param_shardings(cfg, mesh))


def gather_params(params: dict, cfg: ModelConfig, mesh: Mesh) -> dict:
    """Inside a jitted graph: params in the COMPUTE layout (the FSDP all-gather over "data"; its
    transpose under jax.grad is the reduce-scatter of the gradients)."""
    return jax.tree_util.tree_map(jax.lax.with_sharding_constraint, params, compute_shardings(cfg, mesh))


def opt_state_shardings(optimizer, cfg: ModelConfig, mesh: Mesh):
    """NamedSharding pytree of optimizer.init(f32 master): every parameter-shaped leaf (Adam's moments)
    like its parameter (STORAGE), the rest (step counts) replicated."""
    shapes = jax.eval_shape(lambda: model.init_params(cfg, jax.random.PRNGKey(0)))
    master = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, jnp.float32), shapes)
    return optax.tree_map_params(optimizer, lambda _, sharding: sharding, jax.eval_shape(optimizer.init, master),
                                 param_shardings(cfg, mesh),
                                 transform_non_params=lambda _: replicated(mesh))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def row_sharding(mesh: Mesh) -> NamedSharding:
    """Arrays with rows first (tokens_RT, adv_R, mask_RT, logp_RT): rows over "data", the rest whole."""
    return NamedSharding(mesh, P("data"))


def shard_rows(data: dict, mesh: Mesh) -> dict:
    """A microbatch's arrays (rows first, one row count) padded with all-zero rows up to a multiple of
    the data axis and placed rows over "data". The trainer's zero rows have mask 0 and advantage 0, so
    they add nothing to any loss or gradient (update.make_update drops their log-probs)."""
    n = len(next(iter(data.values())))
    pad = -n % mesh.shape["data"]
    put = lambda v: jax.device_put(np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)]) if pad else v,
                                   row_sharding(mesh))
    return {k: put(np.asarray(v)) for k, v in data.items()}
