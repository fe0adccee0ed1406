"""The trainer's memory: log-probs and attention in chunks along T (model.py, "memory: the full-sequence
graphs in chunks along T"), with the sampler/trainer bits unchanged; and the memory estimate (memory.py).

Run:  python -m pytest -q tests/test_memory.py        (about a minute on a 2-core CPU)

A large-vocabulary model (V = 40,000: the head's [T, V] float32 logits dominate, as with Qwen2.5's
151,936) of tiny width, sequences of T = 100 positions (not a multiple of any chunk: the last chunk is
padded), chunks forced small so that every path runs several chunks.
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import memory  # noqa: E402
import model  # noqa: E402
import sampler  # noqa: E402
from random_weights import random_params  # noqa: E402

BIG_V = dict(vocab_size=40_000, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
             intermediate_size=64, max_seq_len=256, rope_theta=1e4, rms_norm_eps=1e-6, qkv_bias=True)
T = 100
SCORE = jax.jit(model.token_logprobs, static_argnums=1, static_argnames=("chunk_tokens", "query_chunk"))


def test_chunk_len():
    """Chunk lengths: a multiple of 8 and >= MIN_CHUNK, n chunks cover T with the last one nearly full,
    0 or a chunk >= T is one chunk of T, and the byte budget picks a power of two."""
    for T_, chunk in [(100, 16), (100, 24), (99, 9), (1024, 128), (1023, 128), (4097, 256), (160, 64)]:
        c = model._chunk_len(T_, 1, 0, chunk)
        n = -(-T_ // c)
        assert c % 8 == 0 and model.MIN_CHUNK <= c <= max(chunk, model.MIN_CHUNK) and n * c >= T_
        assert (n - 1) * c < T_ and n * c - T_ < 8 * n, (T_, chunk, c)
    assert model._chunk_len(100, 1, 0, 0) == 100 and model._chunk_len(100, 1, 0, 100) == 100
    assert model._chunk_len(1024, 1000, 300_000, None) == 256 and model._chunk_len(1024, 1000, 0, None) == 1024
    with pytest.raises(ValueError, match="chunk length"):
        model._chunk_len(100, 1, 0, -1)


def test_generate_logprobs_bitwise_equal_chunked_token_logprobs(monkeypatch):
    """bf16 with the precision policy: generate()'s reported log-probs == token_logprobs bit for bit
    with the head in chunks of 16 positions and attention queries in chunks of 24, scoring one row at a
    time and in the trainer's value_and_grad graph (5 rows); generate's prefill runs its attention in
    query chunks of 32 (budget forced small). (float32 is not chunked by default, see
    model._default_chunking; its decode == forward parity is not bitwise on this CPU even unchunked.)
    Tied embeddings (Qwen2.5-0.5B's head); the untied head is in test_chunked_gradients_match_unchunked."""
    cfg = model.ModelConfig(**BIG_V, tie_embeddings=True, dtype="bfloat16")
    params = random_params(cfg)
    # generate's prefill: 16 rows x T; 16 * 4 heads * T * 4 bytes per query position -> chunks of 32
    monkeypatch.setattr(model, "ATTN_CHUNK_BYTES", 32 * 16 * 4 * T * 4)
    assert model._query_chunk_len(cfg, model.MIN_DECODE_ROWS, T, None) == 32
    rs = np.random.RandomState(1)
    n_rows = 5
    prompt_len_R = rs.randint(3, 20, n_rows)
    prompt_RT = rs.randint(0, cfg.vocab_size, (n_rows, T)).astype(np.int32)
    prompt_RT[np.arange(T)[None] >= prompt_len_R[:, None]] = 0
    out = sampler.generate(params, cfg, prompt_RT, prompt_len_R, jax.random.key(2), max_new_tokens=60,
                           temperature=0.9)
    m = out.mask_RT
    assert m.sum() == n_rows * 60
    chunks = dict(chunk_tokens=16, query_chunk=24)
    # scoring, one row at a time (head chunks of 16 rows)
    logp_RT = np.concatenate([np.asarray(SCORE(params, cfg, out.tokens_RT[i:i + 1], 0.9, **chunks))
                              for i in range(n_rows)])
    assert np.array_equal(logp_RT * m, out.logp_behav_RT * m)

    def loss(p, toks):  # the trainer's graph, all 5 rows: the same function under value_and_grad
        lp = model.token_logprobs(p, cfg, toks, 0.9, **chunks)
        return jnp.sum(lp * m), lp
    (_, lp), _ = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, out.tokens_RT)
    assert np.array_equal(np.asarray(lp) * m, out.logp_behav_RT * m)


def test_float32_is_not_chunked_by_default():
    cfg = model.ModelConfig(**BIG_V, tie_embeddings=True, dtype="float32")
    assert model._query_chunk_len(cfg, 16, 4096, None) == 4096 and model._head_chunk_len(cfg, 16, 4095, None) == 4095
    assert model._query_chunk_len(cfg, 16, 4096, 64) == 64 and model._head_chunk_len(cfg, 16, 4095, 64) == 64


def test_chunked_gradients_match_unchunked():
    """Chunked and unchunked token_logprobs: log-probs bitwise in bf16 (within 1e-6 in float32, whose
    dots are not row-count invariant), gradients equal up to where float32 sums are split. The chunked backward adds one partial gradient per chunk (weights: in float32 for
    the head's, over the loop for K/V): float32 model: within float32 rounding (1e-5 of the largest
    entry, measured ~1e-6); bf16 model: each partial is rounded to bf16 before the float32 sum, so
    within bf16 rounding (2^-6 of the largest entry, cosine > 0.9999)."""
    toks = np.random.RandomState(3).randint(0, BIG_V["vocab_size"], (2, T)).astype(np.int32)
    adv = jnp.asarray([[0.7], [-1.3]], jnp.float32)
    for dtype, rel in [("float32", 1e-5), ("bfloat16", 2 ** -6)]:
        cfg = model.ModelConfig(**{**BIG_V, "num_layers": 1}, tie_embeddings=False, dtype=dtype)
        params = random_params(cfg)

        def grads(p, chunk_tokens, query_chunk):
            def loss(p):
                lp = model.token_logprobs(p, cfg, toks, 1.0, chunk_tokens=chunk_tokens, query_chunk=query_chunk)
                return jnp.sum(lp * adv), lp
            return jax.value_and_grad(loss, has_aux=True)(p)

        ((_, lp0), g0), ((_, lp1), g1) = jax.jit(lambda p: (grads(p, 0, 0), grads(p, 16, 24)))(params)
        if dtype == "bfloat16":
            assert np.array_equal(np.asarray(lp0), np.asarray(lp1))
        else:
            np.testing.assert_allclose(np.asarray(lp1), np.asarray(lp0), rtol=1e-6, atol=1e-6)
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g0), jax.tree.leaves(g1)):
            a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
            scale = np.abs(a).max()
            assert scale > 0 and np.abs(a - b).max() <= rel * scale, (dtype, jax.tree_util.keystr(path))
            assert a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.9999, (dtype, jax.tree_util.keystr(path))


def _step_memory(cfg, B, T_, **chunks):
    """XLA's memory analysis of the trainer's graph (f32 master -> bf16 cast -> GRPO-like loss ->
    gradient w.r.t. the master), compiled for abstract inputs: nothing is allocated or run."""
    shapes = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
    master = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, jnp.float32), shapes)

    def loss(m, toks, adv):
        p = jax.tree.map(lambda x: x.astype(cfg.jdtype), m)
        return jnp.sum(model.token_logprobs(p, cfg, toks, 1.0, **chunks) * adv[:, None])
    compiled = jax.jit(jax.grad(loss)).lower(master, jax.ShapeDtypeStruct((B, T_), jnp.int32),
                                             jax.ShapeDtypeStruct((B,), jnp.float32)).compile()
    return compiled.memory_analysis()


def test_train_step_temp_memory_grows_linearly_not_like_T2_or_TV():
    """The compiled train step's temporaries, T = 256 -> 1024 (4x), head and query chunks of 64:
    chunked they grow by a few [T, D] activations per layer only, and at 1024 they are under a quarter
    of the unchunked graph's (the [T, V] logits, the [T, T] scores)."""
    cfg = model.ModelConfig(**{**BIG_V, "vocab_size": 32768, "max_seq_len": 1024, "num_layers": 1},
                            tie_embeddings=True)
    on, off = dict(chunk_tokens=64, query_chunk=64), dict(chunk_tokens=0, query_chunk=0)
    temp = {(t, k): _step_memory(cfg, 1, t, **kw).temp_size_in_bytes
            for t, k, kw in [(256, "on", on), (1024, "on", on), (1024, "off", off)]}
    logits_f32 = 1023 * cfg.vocab_size * 4
    assert temp[1024, "off"] > 3 * logits_f32 and temp[1024, "on"] < temp[1024, "off"] / 4, temp
    assert temp[1024, "on"] - temp[256, "on"] < logits_f32 / 16, temp


def test_rows_for_budget_is_the_largest_fitting_microbatch():
    """rows_for_budget inverts train_state_bytes + train_step_bytes (Qwen2.5-0.5B shape, T = 1024)."""
    cfg = model.ModelConfig(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
                            head_dim=64, intermediate_size=4864, max_seq_len=32768, rope_theta=1e6,
                            rms_norm_eps=1e-6, qkv_bias=True, tie_embeddings=True)
    assert model.param_count(cfg) == 494_032_768
    state = memory.train_state_bytes(cfg)
    step = [memory.train_step_bytes(cfg, r, 1024) for r in (1, 2, 8, 64)]
    assert step == sorted(step) and step[0] > 4 * model.param_count(cfg)
    for budget_gib in (12, 16, 40, 80):
        budget = budget_gib << 30
        r = memory.rows_for_budget(cfg, 1024, budget)
        assert r >= 1 and state + memory.train_step_bytes(cfg, r, 1024) <= budget
        assert state + memory.train_step_bytes(cfg, r + 1, 1024) > budget
    assert memory.rows_for_budget(cfg, 1024, state) == 0
    assert memory.rows_for_budget(cfg, 1024, 80 << 30, state_bytes=0) > memory.rows_for_budget(cfg, 1024, 80 << 30)
