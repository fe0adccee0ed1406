"""Trainer pieces that need no processes. Run: python -m pytest -q tests/test_trainer.py"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import grpo
import model
import trainer

CFG = model.ModelConfig(vocab_size=259, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                        intermediate_size=64, max_seq_len=24, rope_theta=1e4, rms_norm_eps=1e-6, qkv_bias=False,
                        tie_embeddings=True, model_type="llama")


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_gradient_accumulation_equals_one_big_batch(agg):
    """Microbatches weighted by microbatch_weight give the full-batch update (f32 rounding aside)."""
    gcfg = grpo.GRPOConfig(loss_agg=agg, max_len=24, is_correction="none")
    rng = np.random.default_rng(0)
    B, T = 12, 24
    tokens = rng.integers(0, 256, (B, T)).astype(np.int32)
    mask = np.zeros((B, T), np.float32)
    for b in range(B):  # completions of different lengths, one of them empty
        mask[b, 8:8 + b] = 1.0
    data = {"tokens_BT": tokens, "adv_B": rng.standard_normal(B).astype(np.float32), "mask_BT": mask,
            "logp_behav_BT": np.zeros((B, T), np.float32)}
    master = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), model.init_params(CFG, jax.random.PRNGKey(0)))
    opt = optax.sgd(1.0)
    update = trainer.make_update(CFG, gcfg, opt, 1.0)
    results = []
    for size in (B, 5):  # one batch; microbatches of 5, 5, 2
        mbs = [{k: v[i:i + size] for k, v in data.items()} for i in range(0, B, size)]
        new, _, logp, aux = update(master, opt.init(master), mbs)
        results.append((new, logp, aux["loss"]))
    for new, logp, loss in results[1:]:
        np.testing.assert_allclose(loss, results[0][2], rtol=1e-5, atol=1e-7)
        assert np.array_equal(logp, results[0][1])  # log-probs do not depend on the microbatch size
        # The backward runs in bf16, so per-microbatch gradients round differently; a wrong weighting
        # would be off by a factor (2x, 3x), far outside this bf16-sized tolerance on the update.
        for a, b, m in zip(*(jax.tree_util.tree_leaves(t) for t in (new, results[0][0], master))):
            delta_a, delta_b = np.asarray(a) - np.asarray(m), np.asarray(b) - np.asarray(m)
            assert np.abs(delta_a - delta_b).max() <= 2e-2 * np.abs(delta_b).max() + 1e-8


def test_checkpoint_round_trip_and_corruption(tmp_path):
    master = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), model.init_params(CFG, jax.random.PRNGKey(1)))
    opt = optax.adam(1e-3)
    state = opt.init(master)
    trainer.save_checkpoint(str(tmp_path), 3, master, state, {"cursor": 7}, keep=2)
    trainer.save_checkpoint(str(tmp_path), 5, master, state, {"cursor": 9}, keep=2)
    m2, s2, meta = trainer.load_checkpoint(str(tmp_path), master, state)
    assert meta["step"] == 5 and meta["cursor"] == 9
    for a, b in zip(jax.tree_util.tree_leaves((master, state)), jax.tree_util.tree_leaves((m2, s2))):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    # flip one byte in the newest: detected by its CRC, the older one is used
    path = tmp_path / "checkpoints" / "step_000005" / "state.safetensors"
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF
    path.write_bytes(bytes(raw))
    _, _, meta = trainer.load_checkpoint(str(tmp_path), master, state)
    assert meta["step"] == 3
    trainer.save_checkpoint(str(tmp_path), 6, master, state, {"cursor": 1}, keep=2)   # keeps the newest 2
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000005", "step_000006"]


def test_config_validation_is_a_clear_error():
    with pytest.raises(ValueError, match="must be >= 1"):
        trainer.Config(prompts_per_step=0)
    with pytest.raises(ValueError, match="top_p"):
        trainer.Config(top_p=1.5)
