"""LoRA (lora.py): the merge both roles call, its gradient, the names on the wire, PEFT in and out.

Run: python -m pytest -q tests/test_lora.py
     python tests/test_lora.py mesh      (LoRA on 8 simulated CPU devices against one: a script, see mesh_check)
"""
import os
import sys

if __name__ == "__main__":  # python tests/test_lora.py mesh: 8 CPU devices, set before jax starts
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lora
import model
from random_weights import random_params

CFG = model.ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                        intermediate_size=48, max_seq_len=32, rope_theta=10000.0, rms_norm_eps=1e-6,
                        qkv_bias=True, tie_embeddings=False)


def random_adapter(cfg, lcfg, seed=1):
    """An adapter with B != 0 (a fresh one has B = 0), drawn in numpy."""
    rng = np.random.default_rng(seed)
    return {t: {m: jnp.asarray(0.05 * rng.standard_normal(s), jnp.float32) for m, s in ms.items()}
            for t, ms in lora.adapter_shapes(cfg, lcfg).items()}


def test_merge_is_base_plus_scaled_BA_and_bit_identical_across_calls():
    """W' = round(W + scale * (round(B) @ round(A))^T) per layer (round: to bf16), checked against a
    float64 numpy product of the bf16-rounded A and B; the bits are the same from a second call and from
    inside another jitted function (the trainer's graph)."""
    lcfg = lora.LoraConfig(rank=3, alpha=6.0)
    base, adapter = random_params(CFG, 0), random_adapter(CFG, lcfg)
    merged = lora.merge(base, adapter, CFG, lcfg)
    for t in lcfg.targets:
        n_in, n_out = lora.in_out(CFG, t)
        w = np.asarray(base["layers"][t], np.float64).reshape(CFG.num_layers, n_in, n_out)
        A, B = (np.asarray(adapter[t][m]).astype(jnp.bfloat16).astype(np.float64) for m in "AB")
        want = w + 2.0 * np.einsum("lor,lri->lio", B, A)
        got = np.asarray(merged["layers"][t], np.float64).reshape(want.shape)
        # one bf16 rounding of the f32 sum: within half a bf16 ulp (2^-8 relative) plus f32 slack
        assert np.all(np.abs(got - want) <= np.abs(want) * 2.0 ** -8 + 1e-6), t
    assert merged["embed"] is base["embed"] and merged["layers"]["input_norm"] is base["layers"]["input_norm"]
    again = lora.merge(base, adapter, CFG, lcfg)
    inside = jax.jit(lambda b, a: lora.merge(b, a, CFG, lcfg))(base, adapter)
    for t in lcfg.targets:
        bits = np.asarray(merged["layers"][t]).view(np.uint16)
        assert np.array_equal(bits, np.asarray(again["layers"][t]).view(np.uint16))
        assert np.array_equal(bits, np.asarray(inside["layers"][t]).view(np.uint16))


def test_a_fresh_adapter_merges_to_the_base_exactly():
    lcfg = lora.LoraConfig(rank=2)
    adapter = lora.init_adapter(CFG, lcfg, jax.random.key(0))
    bound = 1 / np.sqrt(CFG.hidden_size)  # PEFT's kaiming-uniform(a=sqrt(5)) of lora_A
    A = np.asarray(adapter["q_proj"]["A"])
    assert 0.5 * bound < np.abs(A).max() <= bound and not np.asarray(adapter["q_proj"]["B"]).any()
    base = random_params(CFG, 0)
    merged = lora.merge(base, adapter, CFG, lcfg)
    for t in lcfg.targets:
        assert np.array_equal(np.asarray(merged["layers"][t]).view(np.uint16),
                              np.asarray(base["layers"][t]).view(np.uint16)), t


def test_projected_gradient_equals_the_gradient_through_a_float32_merge():
    """project_grads (dA = s B^T G, dB = s G A^T) against jax.grad of a loss through the merge itself,
    in float32 so rounding does not hide a wrong transpose or scale."""
    cfg32 = model.ModelConfig(**{**CFG.__dict__, "dtype": "float32"})
    lcfg = lora.LoraConfig(rank=2, alpha=3.0, targets=("q_proj", "o_proj", "down_proj"))
    base, adapter = random_params(cfg32, 0), random_adapter(cfg32, lcfg)
    rng = np.random.default_rng(0)  # a loss that weighs every element of every target differently
    weights = {t: jnp.asarray(rng.standard_normal(base["layers"][t].shape), jnp.float32) for t in lcfg.targets}
    loss = lambda p: sum(jnp.sum(jnp.sin(p["layers"][t]) * w) for t, w in weights.items())  # noqa: E731
    want = jax.grad(lambda a: loss(lora.merge(base, a, cfg32, lcfg)))(adapter)
    got = lora.project_grads(jax.grad(loss)(lora.merge(base, adapter, cfg32, lcfg)), adapter, cfg32, lcfg)
    for t in lcfg.targets:
        for m in "AB":
            np.testing.assert_allclose(got[t][m], want[t][m], rtol=2e-4, atol=1e-6, err_msg=f"{t}.{m}")


def test_names_round_trip_and_bad_tensors_are_refused():
    lcfg = lora.LoraConfig(rank=2, alpha=4, targets=("up_proj", "q_proj"))
    assert lcfg.targets == ("q_proj", "up_proj") and lcfg.scale == 2.0
    assert lora.LoraConfig.from_dict(lcfg.to_dict()) == lcfg
    adapter = random_adapter(CFG, lcfg)
    named = lora.master_tensors(adapter)  # the f32 master's names and values
    assert sorted(named) == ["lora.layers.q_proj.A", "lora.layers.q_proj.B", "lora.layers.up_proj.A",
                             "lora.layers.up_proj.B"]
    assert named["lora.layers.up_proj.B"].shape == (2, 48, 2) and named["lora.layers.q_proj.A"].dtype == np.float32
    back = lora.adapter_from_tensors(named, CFG, lcfg)
    assert all(np.array_equal(back[t][m], adapter[t][m]) for t in lcfg.targets for m in "AB")
    assert sorted(lora.adapter_tensors(adapter, CFG)) == sorted(named)
    assert lora.param_count(CFG, lcfg) == 2 * 2 * (32 + 32) + 2 * 2 * (32 + 48)
    with pytest.raises(ValueError, match="missing"):
        lora.adapter_from_tensors({k: v for k, v in named.items() if "up_proj.B" not in k}, CFG, lcfg)
    with pytest.raises(ValueError, match="shape"):
        lora.adapter_from_tensors({**named, "lora.layers.q_proj.A": np.zeros((2, 3, 32), np.float32)}, CFG, lcfg)
    for bad in ({"rank": 0, "alpha": 1, "targets": ["q_proj"]}, {"rank": 2, "alpha": 1, "targets": ["lm_head"]},
                {"rank": 2, "alpha": -1, "targets": ["q_proj"]}, {"rank": 2, "targets": ["q_proj"]}, [2, 1]):
        with pytest.raises(ValueError):
            lora.LoraConfig.from_dict(bad)
    assert lora.LoraConfig.parse(0) is None
    assert lora.LoraConfig.parse(4, 0.0, "q_proj, v_proj") == lora.LoraConfig(4, lora.DEFAULT_ALPHA, ("q_proj", "v_proj"))


def test_the_adapter_travels_in_the_compute_dtype_and_merges_to_the_trainers_bits():
    """adapter_tensors: bf16 (CFG's compute dtype), each value the f32 master's rounded to nearest even,
    half the f32 bytes. A worker's merge of those (widened by adapter_from_tensors) is the trainer's merge
    of its f32 master bit for bit, and it must be: the rounding of A and B changes the merged bits (a
    merge of the f32 values, rounded once at the end, differs). With a float32 compute dtype the adapter
    travels as the master itself."""
    lcfg = lora.LoraConfig(rank=3, alpha=6.0)
    base, master = random_params(CFG, 0), random_adapter(CFG, lcfg)
    named = lora.adapter_tensors(master, CFG)
    assert {x.dtype for x in named.values()} == {np.dtype(jnp.bfloat16)}
    assert sum(x.nbytes for x in named.values()) == 2 * lora.param_count(CFG, lcfg)
    for name, x in lora.master_tensors(master).items():
        assert np.array_equal(named[name].view(np.uint16), x.astype(jnp.bfloat16).view(np.uint16)), name
        assert np.mean(named[name].astype(np.float32) != x) > 0.9, name  # not already bf16 values
    trainer = lora.merge(base, master, CFG, lcfg)
    worker = lora.merge(base, lora.adapter_from_tensors(named, CFG, lcfg), CFG, lcfg)
    cfg32 = model.ModelConfig(**{**CFG.__dict__, "dtype": "float32"})
    base32 = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), base)
    unrounded = lora.merge(base32, master, cfg32, lcfg)  # W + scale * (B @ A)^T of the f32 values, in f32
    for t in lcfg.targets:
        bits = np.asarray(trainer["layers"][t]).view(np.uint16)
        assert np.array_equal(bits, np.asarray(worker["layers"][t]).view(np.uint16)), t
        assert not np.array_equal(bits, np.asarray(unrounded["layers"][t].astype(jnp.bfloat16)).view(np.uint16)), t
    named32 = lora.adapter_tensors(master, cfg32)
    assert all(named32[k].dtype == np.float32 and np.array_equal(named32[k], x)
               for k, x in lora.master_tensors(master).items())


def test_the_gradient_uses_the_rounded_A_and_B_the_forward_merged():
    """project_grads' factors are round(A) and round(B) (a straight-through estimate: the master is f32)."""
    lcfg = lora.LoraConfig(rank=2, alpha=3.0, targets=("q_proj", "down_proj"))
    base, adapter = random_params(CFG, 0), random_adapter(CFG, lcfg)
    rng = np.random.default_rng(3)
    grads = {"layers": {t: jnp.asarray(rng.standard_normal(base["layers"][t].shape), jnp.bfloat16) for t in lcfg.targets}}
    got = lora.project_grads(grads, adapter, CFG, lcfg)
    rounded = {t: {m: jnp.asarray(adapter[t][m]).astype(jnp.bfloat16).astype(jnp.float32) for m in "AB"} for t in lcfg.targets}
    cfg32 = model.ModelConfig(**{**CFG.__dict__, "dtype": "float32"})  # no rounding: the given factors
    want, f32_factors = lora.project_grads(grads, rounded, cfg32, lcfg), lora.project_grads(grads, adapter, cfg32, lcfg)
    for t in lcfg.targets:
        for m in "AB":
            np.testing.assert_array_equal(got[t][m], want[t][m], err_msg=f"{t}.{m}")
            assert not np.array_equal(got[t][m], f32_factors[t][m]), f"{t}.{m}"


def test_peft_folder_loads_in_peft_with_our_logits_and_loads_back(tmp_path):
    """save_peft_adapter's folder, loaded by peft.PeftModel.from_pretrained onto the base in transformers
    (float32), gives our logits of merge(base, adapter) within 1e-4; load_peft_adapter gives the adapter
    back bit for bit (what --lora-init reads). A folder with a setting lora.py does not implement is
    refused, naming it."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    import json

    import hf_io
    cfg32 = model.ModelConfig(**{**CFG.__dict__, "dtype": "float32"})
    lcfg = lora.LoraConfig(rank=3, alpha=8.0, targets=("q_proj", "k_proj", "o_proj", "gate_proj", "down_proj"))
    base, adapter = random_params(cfg32, 0), random_adapter(cfg32, lcfg)
    hf_io.save_hf(str(tmp_path / "base"), cfg32, base)
    hf_io.save_peft_adapter(str(tmp_path / "adapter"), cfg32, lcfg, adapter, str(tmp_path / "base"))
    config = json.load(open(tmp_path / "adapter" / "adapter_config.json"))
    assert (config["peft_type"], config["r"], config["lora_alpha"], config["task_type"]) == ("LORA", 3, 8.0, "CAUSAL_LM")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"), dtype=torch.float32)
    hf = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()
    tokens = np.random.default_rng(0).integers(0, CFG.vocab_size, (2, 12))
    with torch.no_grad():
        theirs = hf(torch.tensor(tokens)).logits.numpy()
    ours = np.asarray(model.forward(lora.merge(base, adapter, cfg32, lcfg), cfg32, jnp.asarray(tokens, jnp.int32)))
    without = np.asarray(model.forward(base, cfg32, jnp.asarray(tokens, jnp.int32)))
    assert np.abs(ours - without).max() > 1e-2  # the adapter changes the logits: the comparison means something
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
    back_cfg, back = hf_io.load_peft_adapter(str(tmp_path / "adapter"), cfg32)
    assert back_cfg == lcfg
    assert all(np.array_equal(back[t][m], adapter[t][m]) for t in lcfg.targets for m in "AB")
    json.dump({**config, "use_dora": True}, open(tmp_path / "adapter" / "adapter_config.json", "w"))
    with pytest.raises(ValueError, match="use_dora"):
        hf_io.load_peft_adapter(str(tmp_path / "adapter"), cfg32)


def test_concat_is_one_adapter_with_the_sum_of_the_deltas():
    """--lora-init's export: the loaded adapter and the trained one as one of rank 2r (float32 merge)."""
    cfg32 = model.ModelConfig(**{**CFG.__dict__, "dtype": "float32"})
    lcfg = lora.LoraConfig(rank=2, alpha=4.0, targets=("v_proj", "up_proj"))
    base, first, second = random_params(cfg32, 0), random_adapter(cfg32, lcfg, 1), random_adapter(cfg32, lcfg, 2)
    both_cfg, both = lora.concat(first, second, lcfg)
    assert both_cfg.rank == 4 and both_cfg.scale == lcfg.scale
    twice = lora.merge(lora.merge(base, first, cfg32, lcfg), second, cfg32, lcfg)
    once = lora.merge(base, both, cfg32, both_cfg)
    for t in lcfg.targets:
        np.testing.assert_allclose(once["layers"][t], twice["layers"][t], atol=1e-6)



def test_memory_counts_the_base_in_the_compute_dtype_and_adam_for_the_adapter_alone():
    """memory.train_state_bytes with LoRA, by hand for CFG (bf16, 2 layers, D 32, N*H 32, K*H 16, F 48):
    targets q and down: base 2 B x (all params + the merged copy of the targets) over the devices, plus
    16 B per adapter parameter on every device."""
    import memory
    lcfg = lora.LoraConfig(rank=2, targets=("q_proj", "down_proj"))
    P = model.param_count(CFG)
    targets = 2 * 32 * 32 + 2 * 48 * 32
    adapter = 2 * 2 * (32 + 32) + 2 * 2 * (48 + 32)
    assert lora.param_count(CFG, lcfg) == adapter
    assert memory.train_state_bytes(CFG) == 16 * P
    assert memory.train_state_bytes(CFG, lcfg) == 2 * (P + targets) + 16 * adapter
    assert memory.train_state_bytes(CFG, lcfg, devices=4) == 2 * (P + targets) // 4 + 16 * adapter



def test_a_checkpoint_holds_the_adapter_and_its_adam_state(tmp_path):
    """What a LoRA trainer checkpoints (the f32 adapter, Adam's state for it alone) comes back bit for
    bit; a full model's master does not load from it (the names differ), nor the reverse."""
    import optax

    import checkpointing
    import update
    lcfg = lora.LoraConfig(rank=2, targets=("k_proj", "up_proj"))
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    adapter, state = update.init_lora_state(random_adapter(CFG, lcfg), opt)
    rng = np.random.default_rng(0)  # Adam's moments != 0 (drawn in numpy: no per-shape compile)
    state = jax.tree_util.tree_map(lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype)
                                   if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
    checkpointing.save_checkpoint(str(tmp_path), 3, adapter, state, {"lora": lcfg.to_dict()}, keep=2)
    like_a, like_s = update.init_lora_state(random_adapter(CFG, lcfg, seed=2), opt)
    got_a, got_s, meta = checkpointing.load_checkpoint(str(tmp_path), like_a, like_s)
    assert meta["lora"] == lcfg.to_dict() and meta["step"] == 3
    for x, y in zip(jax.tree_util.tree_leaves((adapter, state)), jax.tree_util.tree_leaves((got_a, got_s))):
        assert np.array_equal(np.asarray(x), np.asarray(y))
    with pytest.raises(FileNotFoundError):  # refused on the names, before the optimizer state is read
        checkpointing.load_checkpoint(str(tmp_path), random_params(CFG, 0), None)


# ----------------------------------------------------------------------------- end to end (launch.sh)

@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """ONE launch.sh run with LORA_RANK=4 (a tiny random model, one worker, 4 steps): worker-0 is
    SIGKILLed once step 1 is done; the supervisor restarts it, and as the only worker it must fetch
    base + adapter again for the run to finish. Returns (run dir, model dir, launch log)."""
    from test_faults import finish, kill_role, launch, steps_done
    import hf_io
    from conftest import wait_until
    model_dir = str(tmp_path_factory.mktemp("tiny"))
    cfg = model.ModelConfig(vocab_size=259, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                            intermediate_size=192, max_seq_len=96, rope_theta=1e4, rms_norm_eps=1e-6,
                            qkv_bias=True, tie_embeddings=True)
    hf_io.save_hf(model_dir, cfg, random_params(cfg, 0))
    tmp = tmp_path_factory.mktemp("lora")
    # A random model never solves a task: a reward of the completion's parity gives groups mixed
    # rewards, so the adapter really moves (B leaves 0) and the versions differ.
    (tmp / "parity.py").write_text("def parity(completion, row):\n    return float(len(completion) % 2)\n")
    (tmp / "rows.jsonl").write_text("".join(f'{{"id": "p{i}", "prompt": "def f{i}(x):"}}\n' for i in range(16)))
    run_dir = str(tmp / "run")
    proc = launch(run_dir, model_dir, steps=4, workers=1, LORA_RANK="4", XLA_FLAGS="", DATA=str(tmp / "rows.jsonl"),
                  REWARD=f"{tmp / 'parity.py'}:parity")
    try:
        wait_until(lambda: steps_done(run_dir) >= 1 or proc.poll() is not None, 240, "step 1")
        kill_role(run_dir, "worker-0")
    finally:
        log = finish(proc, run_dir, 300)
    return run_dir, model_dir, log


def test_lora_run_is_bitwise_sends_adapters_and_survives_a_worker_restart(lora_run):
    """bitwise_frac 1.0 at every step; the param server's store holds version 0 as the full base and the
    newest version as the adapter alone (only lora.* tensors, the adapter's bytes); the restarted worker
    fetched the base and then an adapter version, and the run finished on it."""
    import json
    import os
    import struct
    run_dir, model_dir, log = lora_run
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == list(range(1, 5))
    assert all(r["mismatch/bitwise_frac"] == 1.0 for r in steps), [r.get("mismatch/bitwise_frac") for r in steps]

    def header(name):
        with open(os.path.join(run_dir, "param_server", name), "rb") as f:
            h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        return h.pop("__metadata__"), h
    meta, full = header("weights.safetensors")
    assert meta["version"] == "0" and "model.embed_tokens.weight" in full and not any(k.startswith("lora.") for k in full)
    meta, adapter = header("adapter.safetensors")
    assert meta["version"] == "4" and adapter and all(k.startswith("lora.layers.") for k in adapter), sorted(adapter)
    cfg = hf_io_config(model_dir)
    nbytes = sum(h["data_offsets"][1] - h["data_offsets"][0] for h in adapter.values())
    assert nbytes == 2 * lora.param_count(cfg, lora.LoraConfig(4))  # bf16 A and B, nothing else
    assert {h["dtype"] for h in adapter.values()} == {"BF16"}
    assert nbytes < sum(h["data_offsets"][1] - h["data_offsets"][0] for h in full.values()) / 4
    worker = open(os.path.join(run_dir, "worker-0.log")).read()
    assert "restart" in log and worker.count("fetched weights v0") >= 2, worker[-2000:]
    after = worker[worker.rindex("fetched weights v0"):]
    assert "adapter v" in after and "on base v0" in after, after[:2000]


def hf_io_config(model_dir):
    import hf_io
    return hf_io.load_hf(model_dir)[0]


def test_lora_run_final_loads_in_peft_with_our_logits(lora_run):
    """final/ is the merged policy the workers sampled (merge of the base and the final adapter, bit for
    bit) and final/adapter loads in peft onto the base with our logits (float32, 1e-4)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    import os

    import hf_io
    run_dir, model_dir, _ = lora_run
    cfg, base = hf_io.load_hf(model_dir)
    lcfg, adapter = hf_io.load_peft_adapter(os.path.join(run_dir, "final", "adapter"), cfg)
    assert lcfg == lora.LoraConfig(4) and np.abs(np.asarray(adapter["q_proj"]["B"])).max() > 0
    _, final = hf_io.load_hf(os.path.join(run_dir, "final"))
    merged = lora.merge(base, adapter, cfg, lcfg)
    for t in lcfg.targets:
        assert np.array_equal(np.asarray(final["layers"][t]).view(np.uint16), np.asarray(merged["layers"][t]).view(np.uint16))
    cfg32, base32 = hf_io.load_hf(model_dir, dtype="float32")
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 16))
    ours = np.asarray(model.forward(lora.merge(base32, adapter, cfg32, lcfg), cfg32, jnp.asarray(tokens, jnp.int32)))
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    hf = peft.PeftModel.from_pretrained(hf, os.path.join(run_dir, "final", "adapter")).eval()
    with torch.no_grad():
        theirs = hf(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)


# ----------------------------------------------------------------------------- on a mesh (a script, not a test)

def mesh_check():
    """LoRA on an 8 x 1 simulated CPU mesh (FSDP) against one device: the merged bits, the update's
    log-probs against the one-device sampler's, and the adapter after one step. Run as
    `python tests/test_lora.py mesh` (XLA fixes the device count when it starts, so not in pytest's
    process); docs/lora.md "On a mesh" has its output."""
    import optax

    import grpo
    import sharding
    import update
    from test_mesh import TINY, _host_params
    cfg = model.ModelConfig(**TINY)
    lcfg = lora.LoraConfig(4)
    host = _host_params(cfg)
    mesh = sharding.make_mesh(8, 1)
    rng = np.random.default_rng(1)
    adapter = {t: {m: jnp.asarray(0.05 * rng.standard_normal(s), jnp.float32) for m, s in ms.items()}
               for t, ms in lora.adapter_shapes(cfg, lcfg).items()}
    base1 = jax.tree_util.tree_map(jnp.asarray, host)
    baseM = sharding.shard_params(host, cfg, mesh)
    m1 = lora.merge(base1, adapter, cfg, lcfg)
    mM = lora.merge(baseM, jax.device_put(adapter, sharding.replicated(mesh)), cfg, lcfg)
    print("merged bitwise mesh vs one device:", all(np.array_equal(np.asarray(m1["layers"][t]).view(np.uint16), np.asarray(mM["layers"][t]).view(np.uint16)) for t in lcfg.targets),
          "sharding of merged q_proj:", mM["layers"]["q_proj"].sharding.spec)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
    B, T = 8, 24
    tokens = rng.integers(0, cfg.vocab_size, (B, T)).astype(np.int32)
    sampler = np.asarray(model.token_logprobs(m1, cfg, jnp.asarray(tokens), 1.0))
    data = {"tokens_RT": tokens, "adv_R": rng.standard_normal(B).astype(np.float32), "mask_RT": np.ones((B, T), np.float32), "logp_behav_RT": sampler}
    res = {}
    for name, mesh_, base in (("one", None, base1), ("mesh", mesh, baseM)):
        a, st = update.init_lora_state(adapter, opt, mesh_)
        up = update.make_update(cfg, grpo.GRPOConfig(), opt, 1.0, mesh_, lcfg, base)
        a, st, logp, aux = up(a, st, update.split_batch(data, 1, 4))
        res[name] = (a, logp)
        print(name, "logp bitwise the sampler's:", np.array_equal(logp[:, :sampler.shape[1]], sampler), "grad_norm", aux["grad_norm"])
    d = max(float(np.abs(np.asarray(res["one"][0][t][m]) - np.asarray(res["mesh"][0][t][m])).max()) for t in lcfg.targets for m in "AB")
    print("adapter after one step, mesh vs one device: max abs diff", d)


if __name__ == "__main__" and sys.argv[1:] == ["mesh"]:
    mesh_check()
