"""sharding.py: how model.py's parameters and activations are laid out over a ("data", "tensor") mesh.

"data" shards the batch and (FSDP-style) the model width of the weights; "tensor" shards heads, MLP
width and vocab (Megatron-style, Shoeybi et al. 2019). One table of PartitionSpecs, keyed by
model.py's parameter names (see model.init_params for the pytree). Checked in tests/test_model.py:
a forward sharded over 8 CPU devices equals the single-device one.
"""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from model import ModelConfig

_PARAM_SPECS = {  # our name -> spec without the stacked L axis
    "embed": P("tensor", "data"), "final_norm": P(None), "lm_head": P("data", "tensor"),
    "input_norm": P(None), "post_norm": P(None),
    "q_proj": P("data", "tensor", None), "k_proj": P("data", "tensor", None), "v_proj": P("data", "tensor", None),
    "q_bias": P("tensor", None), "k_bias": P("tensor", None), "v_bias": P("tensor", None),
    "o_proj": P("tensor", None, "data"),
    "gate_proj": P("data", "tensor"), "up_proj": P("data", "tensor"), "down_proj": P("tensor", "data"),
}
ACTIVATION_SPECS = {"tokens_BT": P("data", None), "x_BTD": P("data", None, None),
                    "logits_BTV": P("data", None, "tensor"), "logp_BT": P("data", None)}


def make_mesh(data: int | None = None, tensor: int = 1, devices=None) -> Mesh:
    """A (data, tensor) mesh over the given (default: all) devices; data defaults to n_devices // tensor."""
    devices = list(jax.devices() if devices is None else devices)
    data = len(devices) // tensor if data is None else data
    if data * tensor != len(devices):
        raise ValueError(f"mesh {data} x {tensor} does not cover the {len(devices)} devices")
    return Mesh(np.array(devices).reshape(data, tensor), ("data", "tensor"))


def param_partition_specs(params: dict, cfg: ModelConfig, mesh: Mesh | None = None):
    """PartitionSpec pytree for params. With a mesh, an axis that does not divide its dimension is
    dropped (replicated) so any config runs on any mesh."""
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
    """device_put every parameter with its NamedSharding."""
    specs = param_partition_specs(params, cfg, mesh)
    return jax.tree_util.tree_map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), params, specs)
