"""The update's layout by real length (packing.py) and the invariance that keeps it bitwise: a row's
log-probs do not depend on its padded length, the rows beside it or how many there are.
Run: python -m pytest -q tests/test_packing.py"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import grpo
import hf_io
import model
import sampler
import packing
from random_weights import random_params
import trainer
import update

CFG = model.ModelConfig(vocab_size=300, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                        intermediate_size=128, max_seq_len=256, rope_theta=1e4, rms_norm_eps=1e-6, qkv_bias=True,
                        tie_embeddings=True, model_type="qwen2")
SCORE = jax.jit(model.token_logprobs, static_argnums=1)


def test_bucket_len_pads_by_less_than_an_eighth():
    prev = 0
    for n in range(1, 5000):
        b = packing.bucket_len(n)
        assert b >= n and b % 8 == 0 and b >= prev
        assert b - n < max(b / packing.STEPS_PER_OCTAVE, packing.MIN_BUCKET)
        prev = b
    assert packing.bucket_len(1000) == 1024 and packing.bucket_len(1025) == 1152
    assert packing.bucket_len(1000, cap=1000) == 1000  # never past the run's T


def test_real_lengths_end_at_the_last_completion_token():
    mask = np.zeros((3, 10), np.float32)
    mask[0, 4:7] = 1
    mask[1, 9] = 1
    assert packing.real_lengths(mask).tolist() == [7, 10, 1]  # row 2 has no completion tokens


@pytest.mark.parametrize("cap_rows", [1, 3, 8, 128])
def test_plan_takes_every_row_once_in_powers_of_two_of_similar_lengths(cap_rows):
    rng = np.random.default_rng(cap_rows)
    lengths = np.concatenate([rng.integers(20, 60, 37), rng.integers(300, 1000, 23)])
    rows_for = lambda T_b: max(1, cap_rows * 512 // T_b)  # noqa: E731  (more rows when shorter)
    parts = packing.plan(lengths, rows_for, cap=1024)
    seen = np.concatenate([rows for rows, _ in parts])
    assert sorted(seen.tolist()) == list(range(len(lengths)))
    for rows, T_b in parts:
        n = len(rows)
        assert n & (n - 1) == 0 and n <= max(rows_for(T_b), 1)
        assert T_b == packing.bucket_len(lengths[rows].max(), 1024)
        assert (lengths[rows[1:]] > (1 - packing.MAX_ROW_PADDING) * T_b).all()  # rows[0] set T_b
    assert [T_b for _, T_b in parts] == sorted((T_b for _, T_b in parts), reverse=True)  # longest first


def _rollout_batch(B, T, seed=0, vocab=300):
    """B rows [prompt | completion | pad] of T tokens with long-tailed real lengths."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(4, T // 2, B)
    comp = np.minimum(rng.geometric(0.08, B), T - prompt)
    tokens = rng.integers(1, vocab, (B, T)).astype(np.int32)
    mask = np.zeros((B, T), np.float32)
    for b in range(B):
        tokens[b, prompt[b] + comp[b]:] = 0
        mask[b, prompt[b]:prompt[b] + comp[b]] = 1
    return {"tokens_RT": tokens, "adv_R": rng.standard_normal(B).astype(np.float32), "mask_RT": mask,
            "logp_behav_RT": np.zeros((B, T), np.float32)}


def test_pack_batch_keeps_each_minibatch_and_unpack_restores_row_order():
    data = _rollout_batch(24, 96)
    data["row_R"] = np.arange(24)
    packed, order = packing.pack_batch(data, 3, lambda T_b: 5)
    for j, mini in enumerate(packed):  # minibatch j holds rows 8j .. 8j+7, as split_batch's would
        rows = np.concatenate([mb["row_R"] for mb in mini])
        assert sorted(rows.tolist()) == list(range(8 * j, 8 * j + 8))
        for mb in mini:
            T_b = mb["tokens_RT"].shape[1]
            assert T_b == packing.bucket_len(packing.real_lengths(mb["mask_RT"]).max(), 96)
            assert np.array_equal(mb["tokens_RT"], data["tokens_RT"][mb["row_R"], :T_b])
    assert order.tolist() == np.concatenate([mb["row_R"] for mini in packed for mb in mini]).tolist()
    cut = np.concatenate([np.pad(mb["tokens_RT"], ((0, 0), (0, 96 - mb["tokens_RT"].shape[1])))
                          for mini in packed for mb in mini])
    assert np.array_equal(packing.unpack(cut, order, (24, 96)), data["tokens_RT"])
    assert 0 <= packing.padding_frac(packed) < packing.padding_frac(update.split_batch(data, 3, 5))


def _layouts(cfg):
    """The log-probs of 5 rows of different real lengths scored five ways: at the full T = 256 in a
    batch of 16 (the other rows random), each alone at its own bucket length, all five at the longest
    one's bucket, in reverse order at T = 200 (not a bucket length), and beside other neighbours at T = 128.
    Returns ([per layout: [per row: log-probs over the row's real length]], lengths)."""
    rng = np.random.default_rng(1)
    lengths = [100, 17, 64, 9, 120]
    rows = np.zeros((16, 256), np.int32)
    rows[:] = rng.integers(1, cfg.vocab_size, (16, 256))
    for b, n in enumerate(lengths):
        rows[b, n:] = 0
    params = random_params(cfg)
    lp = lambda toks: np.asarray(SCORE(params, cfg, jnp.asarray(toks)))  # noqa: E731
    full = lp(rows)
    alone = [lp(rows[b:b + 1, :packing.bucket_len(n)]) [0] for b, n in enumerate(lengths)]
    together = lp(rows[:5, :packing.bucket_len(max(lengths))])
    reverse = lp(rows[4::-1, :200])[::-1]
    others = rows[:5, :128].copy()
    others = np.concatenate([others, rng.integers(1, cfg.vocab_size, (3, 128)).astype(np.int32)])
    beside = lp(others)
    layouts = [full[:5], alone, together, reverse, beside[:5]]
    return [[np.asarray(x[b][:n]) for b, n in enumerate(lengths)] for x in layouts], lengths


def test_row_logprobs_do_not_depend_on_length_neighbours_or_row_count():
    """PRECISION POLICY (i): bitwise equal in every layout. Negative control: the same rows under
    float32 compute, whose dots change their summation order with the matrix shape, differ somewhere
    (so the comparison can see a difference of one bit)."""
    layouts, _ = _layouts(CFG)
    for layout in layouts[1:]:
        for a, b in zip(layouts[0], layout):
            assert np.array_equal(a, b)
    f32_layouts, _ = _layouts(dataclasses.replace(CFG, dtype="float32"))
    differs = [not all(np.array_equal(a, b) for a, b in zip(f32_layouts[0], layout)) for layout in f32_layouts[1:]]
    assert any(differs), "float32 was expected to change bits with the layout (negative control)"
    for layout in f32_layouts[1:]:  # ... within float32 rounding
        for a, b in zip(f32_layouts[0], layout):
            np.testing.assert_allclose(a, b, atol=1e-4)


def _prompts(seed: int, longest: int):
    """16 random prompts of 3..longest-1 tokens, right-padded to T = 256: (prompt_RT, prompt_len_R)."""
    rng = np.random.default_rng(seed)
    prompt_len = rng.integers(3, longest, 16)
    prompts = np.zeros((16, 256), np.int32)
    for b, n in enumerate(prompt_len):
        prompts[b, :n] = rng.integers(1, CFG.vocab_size, n)
    return prompts, prompt_len


def test_sampled_logprobs_equal_scoring_at_the_bucket_length():
    """What the sampler reports at its cache length T is what the trainer computes on the row cut to
    its bucket length (the trainer's packed microbatches), bitwise."""
    params = random_params(CFG)
    prompts, prompt_len = _prompts(seed=2, longest=40)
    out = sampler.generate(params, CFG, prompts, prompt_len, jax.random.key(3), max_new_tokens=48, eos_id=5)
    data = {"tokens_RT": out.tokens_RT, "mask_RT": out.mask_RT}
    packed, order = packing.pack_batch(data, 1, lambda T_b: 4)
    assert max(mb["tokens_RT"].shape[1] for mb in packed[0]) < 256  # cut, not run at T
    logp = np.concatenate([np.pad(np.asarray(SCORE(params, CFG, jnp.asarray(mb["tokens_RT"]))),
                                  ((0, 0), (0, 256 - mb["tokens_RT"].shape[1]))) for mb in packed[0]])
    logp = packing.unpack(logp, order, (16, 256))
    m = out.mask_RT > 0
    assert m.sum() > 100 and np.array_equal(logp[m], out.logp_behav_RT[m])


def test_packed_update_equals_the_fixed_length_update():
    """The same batch as fixed-length microbatches (split_batch) and packed by length (pack_batch):
    the log-probs bitwise equal over every row's real length (back in row order), the loss and the
    update equal within the rounding of summing the (bf16) gradients in other groups. Dr. GRPO's aggregation: its normaliser counts rows, the packed path's totals
    must still count every row once."""
    cfg = dataclasses.replace(CFG, num_layers=1)
    data = _rollout_batch(16, 96, seed=3)
    master = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), random_params(cfg, seed=4))
    opt = optax.sgd(1.0)
    update_fn = update.make_update(cfg, grpo.GRPOConfig(loss_agg="seq_mean_token_sum_norm", max_len=64,
                                                      is_correction="none"), opt, 1.0)
    fixed = update_fn(master, opt.init(master), update.split_batch(data, 1, 8))
    packed, order = packing.pack_batch(data, 1, lambda T_b: 4)
    assert len(packed[0]) > 2 and packing.padding_frac(packed) < 0.5 * packing.padding_frac(
        update.split_batch(data, 1, 8))
    got = update_fn(master, opt.init(master), packed)
    real = np.arange(96)[None, :] < packing.real_lengths(data["mask_RT"])[:, None]
    assert np.array_equal(packing.unpack(got[2], order, (16, 96))[real], fixed[2][real])
    np.testing.assert_allclose(got[3]["loss"], fixed[3]["loss"], rtol=1e-5, atol=1e-7)
    for a, b, m in zip(*(jax.tree_util.tree_leaves(t) for t in (got[0], fixed[0], master))):
        da, db = np.asarray(a) - np.asarray(m), np.asarray(b) - np.asarray(m)
        assert np.abs(da - db).max() <= 2e-2 * np.abs(db).max() + 1e-8


def test_roles_compute_in_bf16_whatever_the_checkpoint_stores():
    """--dtype bfloat16 (the default of trainer and worker) overrides a float32 checkpoint's dtype;
    "checkpoint" keeps it; anything else is refused."""
    hf = hf_io.config_to_hf(dataclasses.replace(CFG, dtype="float32"))
    assert hf_io.config_from_hf(hf, **hf_io.compute_dtype_override("bfloat16")).dtype == "bfloat16"
    assert hf_io.config_from_hf(hf, **hf_io.compute_dtype_override("checkpoint")).dtype == "float32"
    assert trainer.Config().dtype == "bfloat16"
    with pytest.raises(ValueError, match="dtype"):
        trainer.Config(dtype="float16")


def test_generate_sized_to_its_rows_gives_the_bits_of_the_full_length():
    """generate(fit=True) runs its cache at the longest prompt + max_new_tokens and its prefill at the
    longest prompt (both far below T = 256 here); tokens and log-probs equal fit=False's, bitwise."""
    params = random_params(CFG)
    prompts, prompt_len = _prompts(seed=5, longest=30)
    assert sampler._fit_len(int(prompt_len.max()) + 40, 256) < 128 and sampler._fit_len(200, 256) == 256
    kw = dict(max_new_tokens=40, eos_id=5)
    fitted = sampler.generate(params, CFG, prompts, prompt_len, jax.random.key(6), **kw)
    full = sampler.generate(params, CFG, prompts, prompt_len, jax.random.key(6), fit=False, **kw)
    for k in ("tokens_RT", "logp_behav_RT", "mask_RT", "completion_len_R", "versions_RT", "stopped_R"):
        a, b = getattr(fitted, k), getattr(full, k)
        assert a.shape == b.shape and np.array_equal(a, b), k
