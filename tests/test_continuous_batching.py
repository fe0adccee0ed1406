"""Continuous batching in the sampler (continuous.py): bit for bit the same per row as sampler.generate()
on that row alone, whatever the slot, the neighbours or the admission order; and in-flight weight
updates (continuous.Slots.swap): per-token versions, and in mode recompute the tokens after the swap
bitwise the new weights' token_logprobs.

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
import continuous  # noqa: E402
import model  # noqa: E402
import sampler  # noqa: E402
from random_weights import random_params  # noqa: E402

CFG = model.ModelConfig(vocab_size=300, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                        intermediate_size=128, max_seq_len=256, rope_theta=1e4, rms_norm_eps=1e-6, qkv_bias=True,
                        tie_embeddings=False)
T, M, R, SLOTS, TEMP = 64, 28, 40, 16, 0.8
SCORE = jax.jit(model.token_logprobs, static_argnums=1)


def _alone(params, p, key_1, **kw):
    """sampler.generate() on one row alone (padded to 16 rows inside generate), T = the cache length.
    fit=False: every row runs the one program at T, instead of one program per (cache, prefill) length
    that fit=True picks from the row's prompt length (7 of them for these 40 rows, each compiled, tens of
    seconds apiece on 2 cores). By PRECISION POLICY (i) fit changes no bit of the result, which
    tests/test_packing.py checks; so this is the same reference, compiled once."""
    prompt_1T = np.zeros((1, T), np.int32)
    prompt_1T[0, :p.size] = p
    return sampler.generate(params, CFG, prompt_1T, np.array([p.size]), key_1, max_new_tokens=M, temperature=TEMP,
                            fit=False, **kw)


def _reference(params, prompts, keys, eos_id):
    """sampler.generate() on each row alone (_alone)."""
    return [_alone(params, p, keys[r:r + 1], eos_id=eos_id) for r, p in enumerate(prompts)]


@pytest.fixture(scope="module")
def setup():
    params = random_params(CFG)
    rs = np.random.RandomState(0)
    plen = rs.randint(2, 37, R)
    prompts = [rs.randint(1, CFG.vocab_size, n).astype(np.int32) for n in plen]
    keys = jax.random.split(jax.random.key(7), R)
    # eos: the most frequent token in a 16-row batch sampled without eos (same compiled program as below)
    prompt_RT = np.zeros((16, T), np.int32)
    for i in range(16):
        prompt_RT[i, :plen[i]] = prompts[i]
    out = sampler.generate(params, CFG, prompt_RT, plen[:16], keys[:16], max_new_tokens=M, temperature=TEMP, fit=False)
    eos_id = int(np.argmax(np.bincount(out.tokens_RT[out.mask_RT > 0], minlength=CFG.vocab_size)))
    cont = continuous.generate_continuous(params, CFG, prompts, keys, slots=SLOTS, cache_len=T, max_new_tokens=M,
                                     temperature=TEMP, eos_id=eos_id)
    return dict(params=params, prompts=prompts, keys=keys, eos_id=eos_id, cont=cont,
                refs=_reference(params, prompts, keys, eos_id))


def _assert_rows_equal(cont, refs, rows):
    """Row r of cont (a Samples record) == refs' one row (generate alone), for r in rows."""
    for r, ref in zip(rows, refs):
        p, n = cont.prompt_len_R[r], ref.completion_len_R[0]
        assert cont.completion_len_R[r] == n and cont.stopped_R[r] == ref.stopped_R[0], r
        assert np.array_equal(cont.tokens_RT[r, :p + n], ref.tokens_RT[0, :p + n]), r
        assert cont.logp_behav_RT.dtype == np.float32
        assert np.array_equal(cont.completion(r)[1], ref.logp_behav_RT[0, p:p + n]), r


def test_continuous_equals_generate_row_by_row(setup):
    """40 rows over 16 slots: tokens, completion lengths and log-probs of every row == generate() alone."""
    cont, refs = setup["cont"], setup["refs"]
    n_R = cont.completion_len_R
    assert (n_R < M).sum() >= 5 and (n_R == M).sum() >= 5, n_R  # eos ends rows at different times
    assert cont.stopped_R[n_R < M].all()  # a row that ended early ended on eos
    assert len(set(cont.prompt_len_R.tolist())) > 10
    _assert_rows_equal(cont, refs, range(R))
    st = cont.stats
    assert st["useful_tokens"] == n_R.sum() and st["host_round_trips"] > 1
    assert 0 < st["slot_util"] <= 1
    # the record's [R, T] arrays are generate()'s, row by row
    for r, ref in enumerate(refs):
        for k in ("tokens_RT", "logp_behav_RT", "mask_RT", "versions_RT"):
            assert np.array_equal(getattr(cont, k)[r], getattr(ref, k)[0]), (r, k)


def test_logprobs_equal_token_logprobs(setup):
    """The reported log-probs == token_logprobs (the trainer's function) on the completion tokens, bitwise."""
    batch = setup["cont"]
    lp = np.asarray(SCORE(setup["params"], CFG, jnp.asarray(batch.tokens_RT), TEMP))
    m = batch.mask_RT > 0
    assert m.sum() == batch.completion_len_R.sum()
    assert np.array_equal(lp[m], batch.logp_behav_RT[m])


def test_admission_order_and_slot_do_not_change_rows(setup):
    """The same rows in another order (so other slots, neighbours and admission times), refilled four
    slots at a time, with 32 slots: each row's result is unchanged."""
    perm = np.random.RandomState(3).permutation(R)
    prompts = [setup["prompts"][i] for i in perm]
    for slots, refill in ((SLOTS, 4), (32, 1)):
        out = continuous.generate_continuous(setup["params"], CFG, prompts, setup["keys"][perm], slots=slots, cache_len=T,
                                        max_new_tokens=M, temperature=TEMP, eos_id=setup["eos_id"], refill=refill)
        _assert_rows_equal(out, [setup["refs"][i] for i in perm], range(R))


def test_per_row_budget_and_cache_full(setup):
    """A per-row max_new_tokens, and rows that end because the cache is full (prompt + completion = T)."""
    prompts = [np.arange(1, n + 1, dtype=np.int32) for n in (3, 50, 60, 10)] * 4
    budget = [5, 40, 40, 1] * 4
    out = continuous.generate_continuous(setup["params"], CFG, prompts, jax.random.key(1), slots=SLOTS, cache_len=T,
                                    max_new_tokens=budget, temperature=TEMP)
    assert out.completion_len_R.tolist() == [5, 14, 4, 1] * 4
    assert np.array_equal(out.mask_RT.sum(axis=1), out.completion_len_R) and not out.stopped_R.any()


def test_rejects_bad_arguments(setup):
    with pytest.raises(ValueError, match="slots"):
        continuous.generate_continuous(setup["params"], CFG, [[1, 2]], jax.random.key(0), slots=8, cache_len=T,
                                  max_new_tokens=4)
    with pytest.raises(ValueError, match="prompt length"):
        continuous.generate_continuous(setup["params"], CFG, [list(range(1, T + 1))], jax.random.key(0), cache_len=T,
                                  max_new_tokens=4)


def test_top_p_rows_equal_generate(setup):
    """Nucleus sampling (top_p < 1, another compiled sampler) is per row generate()'s too: 20 rows."""
    prompts, keys = setup["prompts"][:20], setup["keys"][:20]
    out = continuous.generate_continuous(setup["params"], CFG, prompts, keys, slots=SLOTS, cache_len=T, max_new_tokens=M,
                                    temperature=TEMP, top_p=0.7, eos_id=setup["eos_id"])
    for r, p in enumerate(prompts):
        _assert_rows_equal(out, [_alone(setup["params"], p, keys[r:r + 1], top_p=0.7, eos_id=setup["eos_id"])], [r])


# ----------------------------------------------------------------------------- in-flight weight updates

def _newer(params, seed: int = 5):
    """The next version: every weight moved by ~2% (an optimizer step's size, not a different model)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda w: (np.asarray(w, np.float32) * (1 + 0.02 * rng.standard_normal(w.shape, np.float32))
                                   ).astype(w.dtype), params)


def _swap_run(setup, mode, swap_after=6):
    """20 rows over 16 slots with weights v0; after `swap_after` decode steps v1 is swapped in (rows in
    progress keep going), and the rest run to their end. Returns the rows in input order."""
    new = jax.tree.map(jnp.asarray, _newer(setup["params"]))
    engine = continuous.Slots(setup["params"], CFG, slots=SLOTS, cache_len=T, width=M, version=0,
                              temperature=TEMP, eos_id=setup["eos_id"])
    rows = [continuous.Row(p, setup["keys"][r], M, tag=r) for r, p in enumerate(setup["prompts"][:20])]
    for row in rows:
        engine.add(row)
    ended = engine.step(max_steps=swap_after)
    engine.swap(new, 1, mode)
    while engine.busy():
        ended += engine.step(max_steps=4)
    assert sorted(r.tag for r in ended) == list(range(20))
    return rows, new


def _score(params, rows):
    batch = sampler.Samples.from_rows(rows, T)
    return batch, np.asarray(SCORE(params, CFG, jnp.asarray(batch.tokens_RT), TEMP))


def test_a_row_started_at_v_and_finished_at_v_plus_1_recompute(setup):
    """mode recompute: a row in progress at the swap has its tokens before the swap recorded as version 0
    with v0's log-probs (bitwise token_logprobs under v0), and its tokens after as version 1 with v1's
    log-probs, bitwise token_logprobs under v1: from the swap on it is sampled exactly as v1 would."""
    rows, new = _swap_run(setup, "recompute")
    batch, lp_old = _score(setup["params"], rows)
    _, lp_new = _score(new, rows)
    crossed = 0
    for r, row in enumerate(rows):
        p, n = row.prompt.size, row.logp.size
        assert row.versions.shape == (n,) and set(row.versions.tolist()) <= {0, 1}
        assert np.all(np.diff(row.versions) >= 0)  # versions only grow along a row
        old, new_ = row.versions == 0, row.versions == 1
        assert np.array_equal(row.logp[old], lp_old[r, p:p + n][old]), r
        assert np.array_equal(row.logp[new_], lp_new[r, p:p + n][new_]), r
        crossed += old.any() and new_.any()
    assert crossed >= 8  # rows that were in progress at the swap
    assert any((row.versions == 1).all() for row in rows)  # rows admitted after it: v1 only


def test_keep_mode_records_versions_but_is_not_exact(setup):
    """mode keep: the same per-token versions, tokens before the swap bitwise v0's; after the swap a row
    that started with v0 attends to v0's keys and values, so its log-probs are NOT v1's (that is why
    lifecycle.exact_tokens leaves them out of mismatch/bitwise_frac), while rows that started with v1
    are bitwise v1's."""
    rows, new = _swap_run(setup, "keep")
    _, lp_old = _score(setup["params"], rows)
    _, lp_new = _score(new, rows)
    differs = 0
    for r, row in enumerate(rows):
        p, n = row.prompt.size, row.logp.size
        old, new_ = row.versions == 0, row.versions == 1
        assert np.array_equal(row.logp[old], lp_old[r, p:p + n][old]), r
        if not old.any():
            assert np.array_equal(row.logp, lp_new[r, p:p + n]), r
        elif new_.any():
            differs += not np.array_equal(row.logp[new_], lp_new[r, p:p + n][new_])
    assert differs >= 5, differs


def test_drop_removes_waiting_and_running_rows(setup):
    """Slots.drop (the worker abandons a dead trainer's rows): dropped rows never come back, the others
    still equal generate() alone, and the freed slots are reused."""
    engine = continuous.Slots(setup["params"], CFG, slots=SLOTS, cache_len=T, width=M, temperature=TEMP,
                              eos_id=setup["eos_id"])
    rows = [continuous.Row(p, setup["keys"][r], M, tag=r) for r, p in enumerate(setup["prompts"][:24])]
    for row in rows:
        engine.add(row)
    ended = engine.step(max_steps=3)
    gone = engine.drop(lambda row: row.tag % 3 == 0)
    assert sorted(r.tag for r in gone) == [t for t in range(24) if t % 3 == 0 and t not in {r.tag for r in ended}]
    while engine.busy():
        ended += engine.step(max_steps=5)
    kept = sorted({r.tag for r in ended})
    assert kept == sorted(set(range(24)) - {r.tag for r in gone})
    by_tag = {r.tag: r for r in ended}
    for t in kept:
        ref, p = setup["refs"][t], by_tag[t].prompt.size
        n = ref.completion_len_R[0]
        assert np.array_equal(by_tag[t].tokens, ref.tokens_RT[0, :p + n]), t
        assert np.array_equal(by_tag[t].logp, ref.logp_behav_RT[0, p:p + n]), t


def test_a_two_turn_row_scores_bitwise_on_the_model_tokens(setup):
    """Multi-turn (envs.run_episodes): turn 1 sampled, an observation appended as plain tokens, turn 2
    sampled from the whole prefix. token_logprobs over the finished row (what the trainer computes)
    equals the sampler's log-prob at every model token of both turns, bit for bit."""
    params, rs = setup["params"], np.random.RandomState(5)
    prompts = [setup["prompts"][r][:12] for r in range(16)]
    t1 = continuous.generate_continuous(params, CFG, prompts, setup["keys"][:16], cache_len=T, max_new_tokens=8,
                                        temperature=TEMP)
    obs = [rs.randint(1, CFG.vocab_size, 6).astype(np.int32) for _ in range(16)]
    prefix = [np.concatenate([t1.tokens_RT[r, :t1.prompt_len_R[r] + t1.completion_len_R[r]], o])
              for r, o in enumerate(obs)]
    t2 = continuous.generate_continuous(params, CFG, prefix, jax.random.split(jax.random.key(9), 16), cache_len=T,
                                        max_new_tokens=8, temperature=TEMP)
    lp = np.asarray(SCORE(params, CFG, jnp.asarray(t2.tokens_RT), TEMP))
    for r in range(16):
        p, n1, n2 = prompts[r].size, t1.completion_len_R[r], t2.completion_len_R[r]
        assert np.array_equal(lp[r, p:p + n1], t1.completion(r)[1]), r                # turn 1
        start = p + n1 + obs[r].size
        assert np.array_equal(lp[r, start:start + n2], t2.completion(r)[1]), r        # turn 2, after the observation
