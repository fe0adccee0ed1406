"""Checkpoints beyond plain Qwen2 / Llama: Llama 3 RoPE scaling (rope_type "llama3") and Qwen3 (QK-norm,
head_dim != hidden_size / num_heads). Each is checked against transformers (torch CPU, float32) the
way tests/test_model.py checks Qwen2 / Llama: logits, greedy decoding, save_hf -> transformers, and
in bf16 the sampler's log-probs equal token_logprobs bit for bit (PRECISION POLICY in model.py).

Run:  python -m pytest -q tests/test_hf_checkpoints.py
(needs the test extras torch and transformers)
"""
import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import hf_io  # noqa: E402
import model  # noqa: E402
import sampler  # noqa: E402
import sharding  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HF_TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6)
# head_dim 16, theta 1e4: wavelengths 2 pi / inv_freq are 6.3, 20, 63, 199, 628, ... With a pretraining
# context of 64, low 1 and high 4, the band edges are 64 / 4 = 16 and 64 / 1 = 64: the first pair is kept,
# the next two are interpolated and the other five are divided by the factor. All three cases occur.
LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)
QWEN3_HEAD_DIM = 24  # != hidden_size / num_attention_heads = 16

TOKENS = np.random.RandomState(0).randint(0, HF_TINY["vocab_size"], (3, 40)).astype(np.int32)


def _make_hf(kind: str, path, tie: bool):
    torch.manual_seed(0)
    if kind == "llama3":
        cfg = transformers.LlamaConfig(**HF_TINY, head_dim=16, tie_word_embeddings=tie,
                                       rope_parameters=dict(LLAMA3_ROPE))
        m = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen3Config(**HF_TINY, head_dim=QWEN3_HEAD_DIM, tie_word_embeddings=tie)
        m = transformers.Qwen3ForCausalLM(cfg)
    with torch.no_grad():  # HF inits norms to 1 (q_norm / k_norm too): randomise them so the test sees them
        for name, p in m.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    m = m.float().eval()
    m.save_pretrained(str(path))
    return m


def _hf_logits(m, tokens_RT):
    with torch.no_grad():
        return m(torch.tensor(np.asarray(tokens_RT), dtype=torch.long)).logits.float().numpy()


# ------------------------------------------------ the RoPE table ------------------------------------------------

def _llama3_hf_config():
    return transformers.LlamaConfig(**HF_TINY, head_dim=16, rope_parameters=dict(LLAMA3_ROPE))


def test_llama3_rope_table_scales_some_frequencies_like_transformers():
    cfg = hf_io.config_from_hf(_llama3_hf_config().to_dict(), dtype="float32")
    assert cfg.rope_scaling == model.Llama3RopeScaling(8.0, 1.0, 4.0, 64)
    plain = dataclasses.replace(cfg, rope_scaling=None)
    # the angle of position 1 is the inverse frequency itself (all below pi)
    cos, sin = model.rope_table(cfg, 2)
    inv_freq = np.arctan2(sin[1].astype(np.float64), cos[1])
    cos0, sin0 = model.rope_table(plain, 2)
    ratio = np.arctan2(sin0[1].astype(np.float64), cos0[1]) / inv_freq
    assert np.allclose(ratio[:1], 1.0, rtol=1e-6)  # short wavelengths: kept
    assert np.all((ratio[1:3] > 1.01) & (ratio[1:3] < 7.99))  # the band between: interpolated
    assert np.allclose(ratio[3:], 8.0, rtol=1e-6)  # long wavelengths: divided by the factor
    # the same frequencies as transformers' rotary embedding (which computes them in float32)
    hf_rope = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(_llama3_hf_config())
    assert np.allclose(inv_freq, hf_rope.inv_freq.double().numpy(), rtol=1e-6, atol=0)


# ------------------------------------------------ HF parity ------------------------------------------------

@pytest.mark.parametrize("kind,tie", [("llama3", False), ("qwen3", False), ("qwen3", True)])
def test_checkpoint_loads_generates_and_saves_like_transformers(tmp_path, kind, tie):
    """Logits, greedy decoding (untied cases; the tied head's decode is covered bitwise below and by
    tests/test_model.py) and save_hf -> transformers. One case per compiled graph keeps the file fast."""
    hf = _make_hf(kind, tmp_path / "src", tie)
    cfg, params = hf_io.load_hf(str(tmp_path / "src"), dtype="float32")
    assert cfg.tie_embeddings == tie and not cfg.qkv_bias
    if kind == "llama3":
        assert cfg.model_type == "llama" and cfg.rope_scaling is not None and not cfg.qk_norm
    else:
        assert cfg.model_type == "qwen3" and cfg.rope_scaling is None and cfg.qk_norm
        assert cfg.head_dim == QWEN3_HEAD_DIM != cfg.hidden_size // cfg.num_heads
        assert params["layers"]["q_norm"].shape == params["layers"]["k_norm"].shape == (2, QWEN3_HEAD_DIM)
        assert params["layers"]["q_proj"].shape == (2, 64, 4, QWEN3_HEAD_DIM)
    ours = np.asarray(model.forward(params, cfg, TOKENS))
    ref = _hf_logits(hf, TOKENS)
    assert ours.shape == ref.shape and ours.dtype == np.float32
    assert np.abs(ours - ref).max() <= 1e-4
    if kind == "llama3":  # the scaling matters here: unscaled RoPE is 10x the tolerance away (measured 5e-3;
        # a random tiny model's logits are only about 0.1 in size)
        plain = type(hf)(transformers.LlamaConfig(**{**hf.config.to_dict(), "rope_parameters": None}))
        plain.load_state_dict(hf.state_dict())
        assert plain.config.rope_parameters["rope_type"] == "default"
        assert np.abs(_hf_logits(plain.float().eval(), TOKENS) - ref).max() > 1e-3

    if not tie:  # greedy decoding, 32 new tokens, rows with different prompt lengths (right-padded to T)
        prompt_len_R = np.array([5, 9, 7])
        prompt_RT = np.zeros((3, 48), np.int32)
        for b, n in enumerate(prompt_len_R):
            prompt_RT[b, :n] = TOKENS[b, :n]
        out = sampler.generate(params, cfg, prompt_RT, prompt_len_R, jax.random.key(0), max_new_tokens=32,
                               temperature=0.0)
        for b, n in enumerate(prompt_len_R):
            with torch.no_grad():
                hf_out = hf.generate(torch.tensor(TOKENS[b:b + 1, :n], dtype=torch.long), max_new_tokens=32,
                                     do_sample=False, eos_token_id=None, pad_token_id=0)
            assert np.array_equal(out.tokens_RT[b, n:n + 32], hf_out[0, n:].numpy())

    # save_hf -> transformers: the same architecture, RoPE and logits; and back to the same cfg and bits
    hf_io.save_hf(str(tmp_path / "out"), cfg, params)
    hf2 = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), dtype=torch.float32).eval()
    assert type(hf2).__name__ == ("LlamaForCausalLM" if kind == "llama3" else "Qwen3ForCausalLM")
    assert hf2.config.rope_parameters["rope_type"] == ("llama3" if kind == "llama3" else "default")
    assert np.abs(_hf_logits(hf2, TOKENS) - ours).max() <= 1e-4
    cfg2, params2 = hf_io.load_hf(str(tmp_path / "out"))
    assert cfg2 == cfg
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)))


# --------------------------------------------- bitwise decode == forward ---------------------------------------------

# One bf16 model with both new pieces in its graph (compiled once): Qwen3's QK-norm with head_dim 48
# (!= 128 / 4), tied head, and the Llama 3 RoPE scaling (its table has kept, interpolated and divided
# frequencies at head_dim 48 with a pretraining context of 64).
BF16_CFG = dict(vocab_size=256, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=48,
                intermediate_size=256, max_seq_len=128, rope_theta=10000.0, rms_norm_eps=1e-6, qkv_bias=False,
                tie_embeddings=True, model_type="qwen3", dtype="bfloat16",
                rope_scaling=model.Llama3RopeScaling(8.0, 1.0, 4.0, 64))


def test_decode_logprobs_bitwise_equal_forward():
    """PRECISION POLICY in model.py with the QK-norm and the scaled RoPE table in the graph: generate()'s
    reported log-probs == token_logprobs, bit for bit, scored in batches of 16 rows and under
    value_and_grad on the 4 sampled rows (the trainer's graph)."""
    cfg = model.ModelConfig(**BF16_CFG)
    assert cfg.bf16_fix and cfg.qk_norm
    params = model.init_params(cfg, jax.random.key(0))
    rs = np.random.RandomState(1)
    for name in ("q_norm", "k_norm"):  # init makes them 1: give the QK-norm weights something to do
        w = params["layers"][name]
        params["layers"][name] = jnp.asarray(1 + 0.2 * rs.randn(*w.shape), cfg.jdtype)
    n_rows, T, max_new, temperature = 4, 64, 32, 0.8
    rs = np.random.RandomState(0)
    prompt_len_R = rs.randint(3, 20, n_rows)
    prompt_RT = rs.randint(0, 256, (n_rows, T)).astype(np.int32)
    prompt_RT[np.arange(T)[None] >= prompt_len_R[:, None]] = 0
    out = sampler.generate(params, cfg, prompt_RT, prompt_len_R, jax.random.key(1), max_new_tokens=max_new,
                           temperature=temperature)
    m = out.mask_RT
    assert m.sum() == n_rows * max_new and (out.logp_behav_RT[m > 0] < 0).all()
    toks = np.concatenate([out.tokens_RT] * 4)  # 16 rows
    logp_RT = np.asarray(jax.jit(model.token_logprobs, static_argnums=1)(params, cfg, toks, temperature))
    for i in range(4):
        assert np.array_equal(logp_RT[i * n_rows:(i + 1) * n_rows] * m, out.logp_behav_RT * m), i

    def loss(p, toks):
        lp = model.token_logprobs(p, cfg, toks, temperature)
        return jnp.sum(lp * m), lp
    (_, lp_grad), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, out.tokens_RT)
    assert np.array_equal(np.asarray(lp_grad) * m, out.logp_behav_RT * m)
    for name in ("q_norm", "k_norm"):
        g = np.asarray(grads["layers"][name], np.float32)
        assert np.isfinite(g).all() and np.abs(g).max() > 0, name


# ------------------------------------------------ configs, sharding, errors ------------------------------------------------

def test_config_layouts_and_refusals():
    base = {**HF_TINY, "model_type": "llama", "head_dim": 16}
    v5 = hf_io.config_from_hf({**base, "rope_parameters": dict(LLAMA3_ROPE)})
    # transformers 4.x layout: rope_theta at the top level, the scaling under rope_scaling (key "type" or "rope_type")
    old = {k: v for k, v in LLAMA3_ROPE.items() if k not in ("rope_type", "rope_theta")}
    for key in ("type", "rope_type"):
        v4 = hf_io.config_from_hf({**base, "rope_theta": 10000.0, "rope_scaling": {key: "llama3", **old}})
        assert v4 == v5
    assert hf_io.config_from_hf(hf_io.config_to_hf(v5)) == v5
    # original_max_position_embeddings defaults to max_position_embeddings, as in transformers
    no_orig = {k: v for k, v in LLAMA3_ROPE.items() if k != "original_max_position_embeddings"}
    cfg = hf_io.config_from_hf({**base, "rope_parameters": no_orig})
    assert cfg.rope_scaling.original_max_position_embeddings == 128

    for rope_type in ("linear", "dynamic", "yarn", "longrope"):
        with pytest.raises(ValueError, match=f"rope_type '{rope_type}' is not implemented"):
            hf_io.config_from_hf({**base, "rope_scaling": {"rope_type": rope_type, "factor": 2.0}})
        with pytest.raises(ValueError, match=f"rope_type '{rope_type}' is not implemented"):
            hf_io.config_from_hf({**base, "rope_parameters": {"rope_type": rope_type, "factor": 2.0,
                                                                        "rope_theta": 1e4}})
    with pytest.raises(ValueError, match="missing factor"):
        hf_io.config_from_hf({**base, "rope_parameters": {**LLAMA3_ROPE, "factor": None}})
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        hf_io.config_from_hf({**base, "partial_rotary_factor": 0.5})
    with pytest.raises(ValueError, match="low_freq_factor < high_freq_factor"):
        model.Llama3RopeScaling(8.0, 4.0, 1.0, 64)

    qwen3 = {**HF_TINY, "model_type": "qwen3"}
    assert hf_io.config_from_hf(qwen3).head_dim == 128  # Qwen3Config's default, not hidden / heads
    cfg = hf_io.config_from_hf({**qwen3, "head_dim": QWEN3_HEAD_DIM})
    d = hf_io.config_to_hf(cfg)
    assert d["architectures"] == ["Qwen3ForCausalLM"] and d["head_dim"] == QWEN3_HEAD_DIM
    assert not d["attention_bias"] and "rope_scaling" not in d
    assert hf_io.config_from_hf(d) == cfg
    with pytest.raises(ValueError, match="sliding-window"):
        hf_io.config_from_hf({**qwen3, "use_sliding_window": True})


def test_qwen3_params_have_partition_specs_and_hf_names():
    cfg = model.ModelConfig(**BF16_CFG)
    params = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
    specs = sharding.param_partition_specs(params, cfg)
    assert jax.tree.structure(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)) == \
        jax.tree.structure(params)
    assert specs["layers"]["q_norm"] == specs["layers"]["k_norm"] == jax.sharding.PartitionSpec(None, None)
    shapes = hf_io._hf_shapes(cfg)
    assert shapes["model.layers.1.self_attn.q_norm.weight"] == shapes["model.layers.0.self_attn.k_norm.weight"] \
        == (48,)
