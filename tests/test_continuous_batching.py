"""Continuous batching in the sampler (model.generate_continuous): bit for bit the same per row as
model.generate() on that row alone, whatever the slot, the neighbours or the admission order.

Run:  python -m pytest -q tests/test_continuous_batching.py     (about a minute on a 2-core CPU)

A small bf16 model with the precision policy (ModelConfig's default), random weights of scale 0.08 (far
from uniform next-token distributions), 40 rows of prompt lengths 2..36 over 16 slots with a 64-position
cache, eos the token the model samples most (so completions end at different times, some at the budget).
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import model  # noqa: E402
from random_weights import random_params  # noqa: E402

CFG = model.ModelConfig(vocab_size=300, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                        intermediate_size=128, max_seq_len=256, rope_theta=1e4, rms_norm_eps=1e-6, qkv_bias=True,
                        tie_embeddings=False)
T, M, R, SLOTS, TEMP = 64, 28, 40, 16, 0.8
SCORE = jax.jit(model.token_logprobs, static_argnums=1)


def _reference(params, prompts, keys, eos_id):
    """model.generate() on each row alone (padded to 16 rows inside generate), T = the cache length."""
    refs = []
    for r, p in enumerate(prompts):
        prompt_1T = np.zeros((1, T), np.int32)
        prompt_1T[0, :p.size] = p
        out = model.generate(params, CFG, prompt_1T, np.array([p.size]), keys[r:r + 1], max_new_tokens=M,
                             temperature=TEMP, eos_id=eos_id)
        refs.append({k: v[0] for k, v in out.items()})
    return refs


@pytest.fixture(scope="module")
def setup():
    params = random_params(CFG)
    rs = np.random.RandomState(0)
    plen = rs.randint(2, 37, R)
    prompts = [rs.randint(1, CFG.vocab_size, n).astype(np.int32) for n in plen]
    keys = jax.random.split(jax.random.key(7), R)
    # eos: the most frequent token in a 16-row batch sampled without eos (same compiled program as below)
    prompt_BT = np.zeros((16, T), np.int32)
    for i in range(16):
        prompt_BT[i, :plen[i]] = prompts[i]
    out = model.generate(params, CFG, prompt_BT, plen[:16], keys[:16], max_new_tokens=M, temperature=TEMP)
    eos_id = int(np.argmax(np.bincount(out["tokens_BT"][out["mask_BT"] > 0], minlength=CFG.vocab_size)))
    cont = model.generate_continuous(params, CFG, prompts, keys, slots=SLOTS, cache_len=T, max_new_tokens=M,
                                     temperature=TEMP, eos_id=eos_id)
    return dict(params=params, prompts=prompts, keys=keys, eos_id=eos_id, cont=cont,
                refs=_reference(params, prompts, keys, eos_id))


def _assert_rows_equal(cont, refs, rows):
    for r, ref in zip(rows, refs):
        p, n = cont["prompt_len_R"][r], ref["completion_len_B"]
        assert cont["completion_len_R"][r] == n, r
        assert np.array_equal(cont["tokens"][r], ref["tokens_BT"][:p + n]), r
        assert cont["logp"][r].dtype == np.float32
        assert np.array_equal(cont["logp"][r], ref["logp_BT"][p:p + n]), r


def test_continuous_equals_generate_row_by_row(setup):
    """40 rows over 16 slots: tokens, completion lengths and log-probs of every row == generate() alone."""
    cont, refs = setup["cont"], setup["refs"]
    n_R = cont["completion_len_R"]
    assert (n_R < M).sum() >= 5 and (n_R == M).sum() >= 5, n_R  # eos ends rows at different times
    assert len(set(cont["prompt_len_R"].tolist())) > 10
    _assert_rows_equal(cont, refs, range(R))
    st = cont["stats"]
    assert st["useful_tokens"] == n_R.sum() and st["host_round_trips"] > 1
    assert 0 < st["slot_util"] <= 1
    # the batch layout helper gives generate()'s arrays
    batch = model.continuous_to_batch(cont, T)
    for r, ref in enumerate(refs):
        for k in ("tokens_BT", "logp_BT", "mask_BT"):
            assert np.array_equal(batch[k][r], ref[k]), (r, k)
    assert np.array_equal(batch["completion_len_B"], n_R)


def test_logprobs_equal_token_logprobs(setup):
    """The reported log-probs == token_logprobs (the trainer's function) on the completion tokens, bitwise."""
    batch = model.continuous_to_batch(setup["cont"], T)
    lp = np.asarray(SCORE(setup["params"], CFG, jnp.asarray(batch["tokens_BT"]), TEMP))
    m = batch["mask_BT"] > 0
    assert m.sum() == setup["cont"]["completion_len_R"].sum()
    assert np.array_equal(lp[m], batch["logp_BT"][m])


def test_admission_order_and_slot_do_not_change_rows(setup):
    """The same rows in another order (so other slots, neighbours and admission times), refilled four
    slots at a time, with 32 slots: each row's result is unchanged."""
    perm = np.random.RandomState(3).permutation(R)
    prompts = [setup["prompts"][i] for i in perm]
    for slots, refill in ((SLOTS, 4), (32, 1)):
        out = model.generate_continuous(setup["params"], CFG, prompts, setup["keys"][perm], slots=slots, cache_len=T,
                                        max_new_tokens=M, temperature=TEMP, eos_id=setup["eos_id"], refill=refill)
        _assert_rows_equal(out, [setup["refs"][i] for i in perm], range(R))


def test_per_row_budget_and_cache_full(setup):
    """A per-row max_new_tokens, and rows that end because the cache is full (prompt + completion = T)."""
    prompts = [np.arange(1, n + 1, dtype=np.int32) for n in (3, 50, 60, 10)] * 4
    budget = [5, 40, 40, 1] * 4
    out = model.generate_continuous(setup["params"], CFG, prompts, jax.random.key(1), slots=SLOTS, cache_len=T,
                                    max_new_tokens=budget, temperature=TEMP)
    assert out["completion_len_R"].tolist() == [5, 14, 4, 1] * 4
    assert all(t.size == p + n for t, p, n in zip(out["tokens"], out["prompt_len_R"], out["completion_len_R"]))


def test_rejects_bad_arguments(setup):
    with pytest.raises(ValueError, match="slots"):
        model.generate_continuous(setup["params"], CFG, [[1, 2]], jax.random.key(0), slots=8, cache_len=T,
                                  max_new_tokens=4)
    with pytest.raises(ValueError, match="prompt length"):
        model.generate_continuous(setup["params"], CFG, [list(range(1, T + 1))], jax.random.key(0), cache_len=T,
                                  max_new_tokens=4)


def test_top_p_rows_equal_generate(setup):
    """Nucleus sampling (top_p < 1, another compiled sampler) is per row generate()'s too: 20 rows."""
    prompts, keys = setup["prompts"][:20], setup["keys"][:20]
    out = model.generate_continuous(setup["params"], CFG, prompts, keys, slots=SLOTS, cache_len=T, max_new_tokens=M,
                                    temperature=TEMP, top_p=0.7, eos_id=setup["eos_id"])
    for r, p in enumerate(prompts):
        prompt_1T = np.zeros((1, T), np.int32)
        prompt_1T[0, :p.size] = p
        ref = model.generate(setup["params"], CFG, prompt_1T, np.array([p.size]), keys[r:r + 1], max_new_tokens=M,
                             temperature=TEMP, top_p=0.7, eos_id=setup["eos_id"])
        _assert_rows_equal(out, [{k: v[0] for k, v in ref.items()}], [r])
