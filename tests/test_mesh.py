"""The trainer sharded over a device mesh and a tensor-parallel sampler, on 8 simulated CPU devices.

Run:  python -m pytest -q tests/test_mesh.py        (about a minute on a 2-core CPU)

XLA fixes the number of CPU devices when it starts, so the 8-device checks run in two child processes
(this file as a script: `XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/test_mesh.py bf16`,
and `... f32`), started together so that they compile side by side; this pytest process keeps its one
device. Each child prints one `RESULT {json}` line that the tests below read.
  bf16: the production numerics. The trainer's update (update.make_update) on an 8 x 1 mesh (FSDP:
        its log-probs must be bitwise the one-device sampler's) and on a 2 x 4 mesh (FSDP x tensor
        parallel: measured), a tensor-parallel worker on 4 devices (inference_worker.tensor_mesh +
        Worker.install), and the weights the sharded trainer pushes.
  f32:  one training step on the 8 x 1 mesh against the same step on one device, float32 model:
        equal within float32 rounding. (In bf16 the backward rounds each device's partial gradient to
        bf16 before the sum over devices, so there a mesh step agrees with the one-device step to bf16
        precision: measured 4e-3 relative on Adam's first moment, while the log-probs stay bitwise.)
"""
import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import cli  # noqa: E402
import hf_io  # noqa: E402
import inference_worker  # noqa: E402
import model  # noqa: E402
import sampler  # noqa: E402
import sharding  # noqa: E402
import trainer  # noqa: E402
import update  # noqa: E402
import versions  # noqa: E402

# A tiny Qwen2-style model (untied head, q/k/v biases) whose every axis divides 8 except K (2 kv heads).
TINY = dict(vocab_size=128, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
            intermediate_size=64, max_seq_len=24, rope_theta=1e4, rms_norm_eps=1e-6, qkv_bias=True,
            tie_embeddings=False)
ROWS, T, NEW = 12, 24, 8  # sampled rows per sampler, sequence length, completion tokens


# ----------------------------------------------------------------------------- the 8-device children

def _host_params(cfg):
    """Random weights as host numpy arrays in cfg.dtype: norms 1, biases and matrices normal with
    std 0.1 and 0.08 (4x model.init_params', so that sampling is not uniform noise). numpy, not
    init_params: jax would compile its random draws once per shape, seconds per process."""
    rng = np.random.default_rng(0)
    shapes = jax.eval_shape(lambda: model.init_params(cfg, jax.random.PRNGKey(0)))

    def draw(path, leaf):
        name = jax.tree_util.keystr(path)
        if "norm" in name:
            return np.ones(leaf.shape, cfg.jdtype)
        std = 0.1 if "bias" in name else 0.08
        return (std * rng.standard_normal(leaf.shape)).astype(np.float32).astype(cfg.jdtype)
    return jax.tree_util.tree_map_with_path(draw, shapes)


def _prompts():
    rng = np.random.default_rng(0)
    prompt_len_R = rng.integers(3, 10, ROWS).astype(np.int32)
    prompt_RT = np.zeros((ROWS, T), np.int32)
    for b in range(ROWS):
        prompt_RT[b, :prompt_len_R[b]] = rng.integers(0, TINY["vocab_size"], prompt_len_R[b])
    return prompt_RT, prompt_len_R


def _parity(logp_a_RT, logp_b_RT, mask_RT) -> dict:
    """Per completion token: the fraction bitwise equal and the largest |delta logp|."""
    m = mask_RT > 0
    d = np.abs(logp_a_RT[m].astype(np.float64) - logp_b_RT[m])
    return {"bitwise_frac": float(np.mean(d == 0)), "max_abs": float(d.max()), "tokens": int(m.sum())}


def _layout(tree, shardings) -> dict:
    """Whether every leaf has its sharding.py layout, and its shards the matching shapes; the devices
    used; and the bytes one device holds as a fraction of the whole tree."""
    ok, devices, total, on_first = True, set(), 0, 0
    for x, want in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(shardings)):
        ok &= x.sharding.is_equivalent_to(want, x.ndim)
        ok &= all(s.data.shape == want.shard_shape(x.shape) for s in x.addressable_shards)
        devices |= x.sharding.device_set
        total += x.nbytes
        on_first += sum(s.data.nbytes for s in x.addressable_shards if s.device == jax.devices()[0])
    return {"ok": bool(ok), "devices": len(devices), "device0_frac": on_first / total}


def _grpo_batch(tokens_RT, mask_RT, logp_RT):
    adv_R = np.random.default_rng(1).standard_normal(len(tokens_RT)).astype(np.float32)
    return {"tokens_RT": tokens_RT, "adv_R": adv_R, "mask_RT": mask_RT, "logp_behav_RT": logp_RT}


def child_bf16() -> dict:
    import grpo
    import optax
    import wire
    cfg = model.ModelConfig(**TINY)
    host_params = _host_params(cfg)
    params = jax.device_put(host_params, jax.devices()[0])
    prompt_RT, prompt_len_R = _prompts()
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))  # as the Trainer's
    gcfg = grpo.GRPOConfig(max_len=NEW)
    res = {}

    # Sampler on one device (what an inference worker without --tensor-parallel runs)
    one = sampler.generate(params, cfg, prompt_RT, prompt_len_R,
                           jax.random.PRNGKey(1), max_new_tokens=NEW)

    # The trainer on 8 x 1 (FSDP): state laid out as sharding.py says
    mesh = sharding.role_mesh(1)
    master, opt_state = update.init_state(host_params, cfg, optimizer, mesh)
    adam = opt_state[1][0]
    res["layout_master"] = _layout(master, sharding.param_shardings(cfg, mesh))
    res["layout_adam_mu"] = _layout(adam.mu, sharding.param_shardings(cfg, mesh))
    res["layout_adam_nu"] = _layout(adam.nu, sharding.param_shardings(cfg, mesh))
    res["q_proj_shard_shape"] = list(master["layers"]["q_proj"].addressable_shards[0].data.shape)

    # Push from the sharded master, one tensor at a time: the same bytes as the unsharded cast
    pushed = list(hf_io.iter_hf_tensors(master, cfg, dtype=cfg.jdtype))
    whole = hf_io.to_hf_tensors(update.cast_params(jax.device_put(master, jax.devices()[0]), cfg.jdtype), cfg)
    res["push_same_names"] = [n for n, _ in pushed] == list(whole)
    res["push_same_bits"] = all(a.dtype == whole[n].dtype and a.tobytes() == whole[n].tobytes() for n, a in pushed)

    # A tensor-parallel worker on 4 devices installs those weights and samples
    worker = inference_worker.Worker.__new__(inference_worker.Worker)
    worker.mcfg, worker.mesh, worker.version = cfg, inference_worker.tensor_mesh(4), -1
    worker.cfg = inference_worker.Config(name="tp")
    names, arrays = [n for n, _ in pushed], [a for _, a in pushed]
    worker.install(versions.from_arrays(0, "lineage", list(zip(names, arrays))))
    res["worker_q_proj"] = {"spec": list(worker.params["layers"]["q_proj"].sharding.spec),
                            "devices": len(worker.params["layers"]["q_proj"].sharding.device_set),
                            "shard_shape": list(worker.params["layers"]["q_proj"].addressable_shards[0].data.shape)}
    tp = sampler.generate(worker.params, cfg, prompt_RT, prompt_len_R, jax.random.PRNGKey(1), max_new_tokens=NEW)

    # Both samplers' rows in one batch: rows [0, 12) sampled on one device, [12, 24) on the TP mesh
    tokens_RT = np.concatenate([one.tokens_RT, tp.tokens_RT])
    logp_RT = np.concatenate([one.logp_behav_RT, tp.logp_behav_RT])
    mask_RT = np.concatenate([one.mask_RT, tp.mask_RT])
    data = _grpo_batch(tokens_RT, mask_RT, logp_RT)
    one_rows, tp_rows = slice(0, ROWS), slice(ROWS, 2 * ROWS)
    forward = np.asarray(jax.jit(lambda p, t: model.token_logprobs(p, cfg, t))(
        params, tokens_RT))  # the trainer's numbers on one device

    # 8 x 1: the 24 rows in microbatches of 7, 7, 7, 3, each padded to 8 (one row per device)
    update_fn = update.make_update(cfg, gcfg, optimizer, 1.0, mesh)
    new_master, new_opt, logp_fsdp, aux = update_fn(master, opt_state, update.split_batch(data, 1, 7))
    res["layout_after_step"] = _layout((new_master, new_opt[1][0].mu), (sharding.param_shardings(cfg, mesh),) * 2)
    # 2 x 4: FSDP over 2, tensor parallel over 4 (the TP worker's degree)
    mesh24 = sharding.role_mesh(4)
    master24, opt24 = update.init_state(host_params, cfg, optimizer, mesh24)
    _, _, logp_24, _ = update.make_update(cfg, gcfg, optimizer, 1.0, mesh24)(
        master24, opt24, update.split_batch(data, 1, 12))
    res["parity"] = {
        "trainer 1 dev (forward) vs sampler 1 dev": _parity(forward[one_rows], one.logp_behav_RT, one.mask_RT),
        "trainer 8x1 vs sampler 1 dev": _parity(logp_fsdp[one_rows], one.logp_behav_RT, one.mask_RT),
        "trainer 8x1 vs sampler TP 4": _parity(logp_fsdp[tp_rows], tp.logp_behav_RT, tp.mask_RT),
        "trainer 1 dev (forward) vs sampler TP 4": _parity(forward[tp_rows], tp.logp_behav_RT, tp.mask_RT),
        "trainer 2x4 vs sampler 1 dev": _parity(logp_24[one_rows], one.logp_behav_RT, one.mask_RT),
        "trainer 2x4 vs sampler TP 4": _parity(logp_24[tp_rows], tp.logp_behav_RT, tp.mask_RT),
    }
    return res


def child_f32() -> dict:
    """One step of the Trainer's optimizer on a float32 model: one device vs the 8 x 1 mesh."""
    import grpo
    import optax
    cfg = model.ModelConfig(**TINY, dtype="float32")
    host_params = _host_params(cfg)
    rng = np.random.default_rng(0)
    mask_RT = np.zeros((ROWS, T), np.float32)
    for b in range(ROWS):
        mask_RT[b, 10:10 + 1 + b % NEW] = 1.0
    data = _grpo_batch(rng.integers(0, TINY["vocab_size"], (ROWS, T)).astype(np.int32), mask_RT,
                       np.full((ROWS, T), -4.0, np.float32))
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    gcfg = grpo.GRPOConfig(max_len=NEW)
    out = {}
    for name, mesh in (("one", None), ("mesh", sharding.role_mesh(1))):
        master, opt_state = update.init_state(host_params, cfg, optimizer, mesh)
        if mesh is None:
            master, opt_state = jax.device_put((master, opt_state), jax.devices()[0])
        master, opt_state, logp_RT, aux = update.make_update(cfg, gcfg, optimizer, 1.0, mesh)(
            master, opt_state, update.split_batch(data, 1, ROWS))  # 12 rows: padded to 16 on the mesh
        out[name] = (jax.tree_util.tree_leaves(jax.device_get((master, opt_state[1][0].mu, opt_state[1][0].nu))),
                     logp_RT, aux)
    (leaves1, logp1, aux1), (leaves8, logp8, aux8) = out["one"], out["mesh"]
    rel = lambda a, b: float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
    return {"max_rel_state": max(rel(np.asarray(a), np.asarray(b)) for a, b in zip(leaves8, leaves1)),
            "max_rel_logp": rel(logp8 * mask_RT, logp1 * mask_RT),
            "loss": [aux8["loss"], aux1["loss"]], "grad_norm": [aux8["grad_norm"], aux1["grad_norm"]]}


# ----------------------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def children():
    """Both children, run side by side; {name: RESULT dict}, and each one's CPU seconds."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    procs = {name: subprocess.Popen([sys.executable, os.path.abspath(__file__), name], cwd=ROOT, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in ("bf16", "f32")}
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"child {name} failed:\n{err[-4000:]}"
        line = next(line for line in out.splitlines() if line.startswith("RESULT "))
        results[name] = json.loads(line[len("RESULT "):])
    return results


def test_trainer_state_is_sharded_over_8_devices(children):
    r = children["bf16"]
    for key in ("layout_master", "layout_adam_mu", "layout_adam_nu", "layout_after_step"):
        assert r[key]["ok"] and r[key]["devices"] == 8, (key, r[key])
    # q_proj [L=1, D=32, N=4, H=8] over data=8 on D: 4 rows of D per device
    assert r["q_proj_shard_shape"] == [1, 4, 4, 8]
    # every matrix is split 8 ways; only norms and biases (a few % of this tiny model) are whole
    assert r["layout_master"]["device0_frac"] < 0.2


def test_fsdp_trainer_logprobs_are_bitwise_the_one_device_samplers(children):
    parity = children["bf16"]["parity"]
    print(json.dumps(parity, indent=1))
    for key in ("trainer 1 dev (forward) vs sampler 1 dev", "trainer 8x1 vs sampler 1 dev"):
        assert parity[key]["bitwise_frac"] == 1.0 and parity[key]["max_abs"] == 0.0, (key, parity[key])
        assert parity[key]["tokens"] > 0


def test_tensor_parallel_worker_and_trainer(children):
    r = children["bf16"]
    # q_proj [L, D, N=4, H] over tensor=4 on N: one head per device
    assert r["worker_q_proj"] == {"spec": [None, "data", "tensor", None], "devices": 4,
                                  "shard_shape": [1, 32, 1, 8]}
    # A split contraction sums in another order: not bitwise by construction (sharding.py has the
    # numbers on a bigger model). Here: measured, printed, and small (a wrong layout is not).
    parity = r["parity"]
    for key in ("trainer 8x1 vs sampler TP 4", "trainer 1 dev (forward) vs sampler TP 4",
                "trainer 2x4 vs sampler 1 dev", "trainer 2x4 vs sampler TP 4"):
        assert parity[key]["tokens"] > 0 and parity[key]["max_abs"] < 0.05, (key, parity[key])


def test_sharded_push_sends_the_same_weights(children):
    r = children["bf16"]
    assert r["push_same_names"] and r["push_same_bits"]


def test_mesh_step_equals_one_device_step_in_float32(children):
    r = children["f32"]
    print(json.dumps(r))
    assert r["max_rel_state"] < 1e-4 and r["max_rel_logp"] < 1e-5, r
    np.testing.assert_allclose(*r["loss"], rtol=1e-5)
    np.testing.assert_allclose(*r["grad_norm"], rtol=1e-5)


# ---------------------------------------------------------------- on this process's one device

def test_one_device_is_the_unsharded_program():
    assert len(jax.devices()) == 1  # the children's flag did not leak into this process
    assert sharding.role_mesh(1) is None
    with pytest.raises(ValueError, match="does not divide"):
        sharding.role_mesh(2)
    assert inference_worker.tensor_mesh(1) is None
    with pytest.raises(ValueError, match="needs that many devices"):
        inference_worker.tensor_mesh(2)


def test_tensor_parallel_flags():
    cfg, _ = cli.parse(trainer.Config, trainer.grpo.GRPOConfig, argv=["--tensor-parallel", "4"])
    assert cfg.tensor_parallel == 4 and trainer.Config().tensor_parallel == 1
    assert cli.parse(inference_worker.Config, argv=["--tensor-parallel", "2"]).tensor_parallel == 2
    for make in (trainer.Config, inference_worker.Config):
        with pytest.raises(ValueError, match="tensor_parallel must be >= 1"):
            make(tensor_parallel=0)


@pytest.mark.parametrize("tie", [True, False])
def test_iter_hf_tensors_is_to_hf_tensors_one_at_a_time(tie):
    cfg = model.ModelConfig(**{**TINY, "tie_embeddings": tie, "num_layers": 2})
    master = jax.tree_util.tree_map(lambda x: jnp.asarray(x.astype(np.float32)), _host_params(cfg))
    whole = hf_io.to_hf_tensors(update.cast_params(master, cfg.jdtype), cfg)
    for params in (master, jax.tree_util.tree_map(np.asarray, master)):  # device arrays, host arrays
        pieces = list(hf_io.iter_hf_tensors(params, cfg, dtype=cfg.jdtype))
        assert [n for n, _ in pieces] == list(whole)
        for name, array in pieces:
            assert array.flags.c_contiguous and array.dtype == whole[name].dtype
            assert np.array_equal(array.view(np.uint16), whole[name].view(np.uint16)), name


if __name__ == "__main__":  # a child: python tests/test_mesh.py bf16|f32 (with the 8-device XLA_FLAGS)
    t0 = time.process_time()
    result = {"bf16": child_bf16, "f32": child_f32}[sys.argv[1]]()
    result["cpu_s"] = time.process_time() - t0
    print("RESULT " + json.dumps(result), flush=True)
