"""Random model weights for tests and benchmarks, drawn in numpy so that no per-shape jax program is
compiled: norms 1, biases N(0, 0.1), matrices N(0, 0.08) (larger than model.init_params' 0.02, so that
the next-token distributions are far from uniform and a one-bit difference shows in the samples); and
small steps of any weights (nudged), what a delta version carries."""
import jax
import jax.numpy as jnp
import numpy as np

import model


def random_params(cfg: model.ModelConfig, seed: int = 0) -> dict:
    """A parameter pytree of cfg's shapes and dtype (see the module docstring)."""
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        name = jax.tree_util.keystr(path)
        if "norm" in name:
            return jnp.ones(leaf.shape, cfg.jdtype)
        return jnp.asarray((0.1 if "bias" in name else 0.08) * rng.standard_normal(leaf.shape, np.float32), cfg.jdtype)
    return jax.tree_util.tree_map_with_path(draw, jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0))))


def nudged(tensors, frac: float, seed: int = 0) -> list:
    """(name, array) pairs with about `frac` of their positions moved by one ulp (their bits as unsigned
    integers, plus one), as a small optimizer step moves bf16 weights: what a delta version carries."""
    rng = np.random.default_rng(seed)
    out = []
    for name, a in tensors:
        bits = np.array(a).view(np.uint16 if a.itemsize == 2 else np.uint32)
        bits[rng.random(bits.shape) < frac] += 1
        out.append((name, bits.view(a.dtype)))
    return out
