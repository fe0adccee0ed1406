"""Tests for model.py: equivalence with Hugging Face, decode == forward bit for bit, sharding, bad inputs.

Run:  python -m pytest -q tests/test_model.py
(about a minute on a 2-core CPU; needs the test extras torch==2.13.0 and transformers)
"""
import json
import os
import subprocess
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

# A tiny model in both architectures: GQA (4 query heads over 2 kv heads), head_dim 16.
HF_TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0)


def _make_hf(kind: str, path, tie=False):
    torch.manual_seed(0)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(**HF_TINY, tie_word_embeddings=tie)
        m = transformers.Qwen2ForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(**HF_TINY, tie_word_embeddings=tie, head_dim=16)
        m = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # HF inits biases to 0 and norms to 1: randomise them so the test sees them
        for name, p in m.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    m = m.float().eval()
    m.save_pretrained(str(path))
    return m


def _hf_logits(m, tokens_RT):
    with torch.no_grad():
        return m(torch.tensor(np.asarray(tokens_RT), dtype=torch.long)).logits.float().numpy()


TOKENS = np.random.RandomState(0).randint(0, HF_TINY["vocab_size"], (3, 40)).astype(np.int32)


# ------------------------------------------------ HF parity ------------------------------------------------

@pytest.mark.parametrize("kind,tie", [("qwen2", False), ("llama", False), ("llama", True)])
def test_load_hf_matches_transformers_logits_and_greedy(tmp_path, kind, tie):
    hf = _make_hf(kind, tmp_path, tie)
    cfg, params = hf_io.load_hf(str(tmp_path), dtype="float32")
    assert cfg.model_type == kind and cfg.tie_embeddings == tie and cfg.qkv_bias == (kind == "qwen2")
    ours = np.asarray(model.forward(params, cfg, TOKENS))
    ref = _hf_logits(hf, TOKENS)
    assert ours.shape == ref.shape and ours.dtype == np.float32
    assert np.abs(ours - ref).max() <= 1e-4

    # greedy decoding, 32 new tokens, rows with different prompt lengths (right-padded to T)
    prompt_len_R = np.array([5, 9, 7])
    T = 48
    prompt_RT = np.zeros((3, T), np.int32)
    for b, n in enumerate(prompt_len_R):
        prompt_RT[b, :n] = TOKENS[b, :n]
    out = sampler.generate(params, cfg, prompt_RT, prompt_len_R, jax.random.key(0), max_new_tokens=32,
                           temperature=0.0)
    for b, n in enumerate(prompt_len_R):
        with torch.no_grad():
            hf_out = hf.generate(torch.tensor(TOKENS[b:b + 1, :n], dtype=torch.long), max_new_tokens=32,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
        assert np.array_equal(out.tokens_RT[b, n:n + 32], hf_out[0, n:].numpy())
        assert out.completion_len_R[b] == 32 and out.mask_RT[b].sum() == 32


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_save_hf_loads_in_transformers(tmp_path, kind):
    _make_hf(kind, tmp_path / "src")
    cfg, params = hf_io.load_hf(str(tmp_path / "src"), dtype="float32")
    ours = np.asarray(model.forward(params, cfg, TOKENS))

    hf_io.save_hf(str(tmp_path / "single"), cfg, params)
    # small shards: several files plus model.safetensors.index.json
    hf_io.save_hf(str(tmp_path / "sharded"), cfg, params, max_shard_bytes=60_000)
    index = json.load(open(tmp_path / "sharded" / "model.safetensors.index.json"))
    assert len(set(index["weight_map"].values())) > 1
    assert not (tmp_path / "sharded" / "model.safetensors").exists()
    for sub in ("single", "sharded"):
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / sub), dtype=torch.float32).eval()
        assert type(hf).__name__ == ("Qwen2ForCausalLM" if kind == "qwen2" else "LlamaForCausalLM")
        assert np.abs(_hf_logits(hf, TOKENS) - ours).max() <= 1e-4
        cfg2, params2 = hf_io.load_hf(str(tmp_path / sub))
        assert cfg2 == cfg
        assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)))


def test_save_hf_copies_the_tokenizer_files_of_the_source_folder(tmp_path):
    cfg = hf_io.config_from_hf({**HF_TINY, "model_type": "llama", "head_dim": 16}, dtype="bfloat16")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "warmup.json"):
        (src / name).write_text(f'{{"name": "{name}"}}')
    hf_io.save_hf(str(tmp_path / "out"), cfg, model.init_params(cfg, jax.random.key(2)), tokenizer_from=str(src))
    assert sorted(os.listdir(tmp_path / "out")) == ["config.json", "generation_config.json", "model.safetensors",
                                                    "tokenizer.json", "tokenizer_config.json"]
    assert (tmp_path / "out" / "tokenizer.json").read_text() == '{"name": "tokenizer.json"}'


def test_bf16_save_load_roundtrip_and_config_dict(tmp_path):
    cfg = hf_io.config_from_hf({**HF_TINY, "model_type": "llama", "head_dim": 16}, dtype="bfloat16")
    assert hf_io.config_from_hf(hf_io.config_to_hf(cfg)) == cfg
    params = model.init_params(cfg, jax.random.key(1))
    hf_io.save_hf(str(tmp_path), cfg, params)
    cfg2, params2 = hf_io.load_hf(str(tmp_path))
    assert cfg2 == cfg and jax.tree.leaves(params2)[0].dtype == jnp.bfloat16
    assert all(np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
               for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    assert hf.model.embed_tokens.weight.shape == (cfg.vocab_size, cfg.hidden_size)


# --------------------------------------------- bitwise decode == forward ---------------------------------------------

# The tiny model of the numerics tests: bf16, GQA, Qwen2-style biases.
BF16_CFG = dict(vocab_size=256, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
                intermediate_size=256, max_seq_len=128, rope_theta=10000.0, rms_norm_eps=1e-6, qkv_bias=True,
                tie_embeddings=False, dtype="bfloat16")


def _sample_and_score(bf16_fix, n_rows, T=64, max_new=40, temperature=1.0, top_p=1.0, score_batches=(16,),
                      tie=False):
    cfg = model.ModelConfig(**{**BF16_CFG, "tie_embeddings": tie}, bf16_fix=bf16_fix)
    params = model.init_params(cfg, jax.random.key(0))
    rs = np.random.RandomState(n_rows)
    prompt_len_R = rs.randint(3, 20, n_rows)
    prompt_RT = rs.randint(0, 256, (n_rows, T)).astype(np.int32)
    prompt_RT[np.arange(T)[None] >= prompt_len_R[:, None]] = 0
    out = sampler.generate(params, cfg, prompt_RT, prompt_len_R, jax.random.key(1), max_new_tokens=max_new,
                           temperature=temperature, top_p=top_p)
    score = jax.jit(model.token_logprobs, static_argnums=1)
    scored = {}
    for sb in score_batches:
        toks = np.concatenate([out.tokens_RT] * (-(-sb // n_rows)))  # at least sb rows
        scored[sb] = np.concatenate([np.asarray(score(params, cfg, toks[i:i + sb], temperature))
                                     for i in range(0, len(toks), sb)])[:n_rows]
    return cfg, params, out, scored


def test_decode_logprobs_bitwise_equal_forward():
    """PRECISION POLICY in model.py: the sampler's reported log-probs == token_logprobs, bit for bit,
    for decode batches below and above MIN_DECODE_ROWS and scoring batches 1..32."""
    for n_rows, temperature, top_p, tie in [(4, 1.0, 1.0, False), (20, 0.7, 0.9, False), (16, 1.0, 1.0, True)]:
        cfg, params, out, scored = _sample_and_score(True, n_rows, temperature=temperature, top_p=top_p,
                                                     score_batches=(1, 5, 16, 32), tie=tie)
        m = out.mask_RT
        assert m.sum() == n_rows * 40 and (out.logp_behav_RT[m > 0] < 0).all()
        for sb, logp_RT in scored.items():
            assert np.array_equal(logp_RT * m, out.logp_behav_RT * m), (n_rows, sb)

    # the trainer's graph: the same function under value_and_grad (remat recomputes the same ops)
    def loss(p, toks):
        lp = model.token_logprobs(p, cfg, toks, temperature)
        return jnp.sum(lp * m), lp
    (_, lp_grad), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, out.tokens_RT)
    assert np.array_equal(np.asarray(lp_grad) * m, out.logp_behav_RT * m)
    assert all(np.isfinite(np.asarray(g, np.float32)).all() for g in jax.tree.leaves(grads))


def test_gradients_flow_through_the_precision_policy():
    """The bf16 rounding points have a cast's (identity) derivative: every parameter gets a non-zero
    gradient, and the bf16_fix=True gradients agree with the float32 model's (same weights, same tokens)
    up to bf16 noise. (A bitcast-based rounding without a custom derivative silently zeroed them.)"""
    cfg = model.ModelConfig(**BF16_CFG)
    cfg32 = model.ModelConfig(**{**BF16_CFG, "dtype": "float32"})
    params = model.init_params(cfg, jax.random.key(0))
    params32 = jax.tree.map(lambda x: x.astype(jnp.float32), params)
    tokens = np.random.RandomState(3).randint(0, 256, (4, 32)).astype(np.int32)

    def grads(p, c):
        return jax.jit(jax.grad(lambda p: jnp.mean(model.token_logprobs(p, c, tokens))))(p)

    g16, g32 = grads(params, cfg), grads(params32, cfg32)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g16), jax.tree.leaves(g32)):
        a, b = np.asarray(a, np.float32).ravel(), np.asarray(b, np.float32).ravel()
        name = jax.tree_util.keystr(path)
        assert np.abs(a).max() > 0, f"zero gradient for {name}"
        cos = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
        assert cos > 0.99, (name, cos)


def test_plain_bf16_decode_differs_from_forward():
    """Negative control: without the precision policy the same comparison sees a mismatch."""
    _, _, out, scored = _sample_and_score(False, 16)
    m = out.mask_RT
    assert not np.array_equal(scored[16] * m, out.logp_behav_RT * m)


def test_sampling_eos_top_p_and_padding():
    cfg = model.ModelConfig(**BF16_CFG)
    params = model.init_params(cfg, jax.random.key(0))
    prompt_RT = np.zeros((2, 32), np.int32)
    prompt_RT[:, :4] = [[1, 2, 3, 4], [5, 6, 7, 8]]
    greedy = sampler.generate(params, cfg, prompt_RT, np.array([4, 4]), jax.random.key(0), max_new_tokens=12,
                              temperature=0.0)
    # a tiny nucleus keeps only the most likely token: sampling == greedy
    nucleus = sampler.generate(params, cfg, prompt_RT, np.array([4, 4]), jax.random.key(5), max_new_tokens=12,
                               temperature=1.0, top_p=1e-6)
    assert np.array_equal(nucleus.tokens_RT, greedy.tokens_RT)
    # stop at eos: choose row 0's 3rd greedy token as eos
    eos = int(greedy.tokens_RT[0, 6])
    first = int(np.argmax(greedy.tokens_RT[0, 4:] == eos))
    out = sampler.generate(params, cfg, prompt_RT, np.array([4, 4]), jax.random.key(0), max_new_tokens=12,
                           temperature=0.0, eos_id=eos, pad_id=0)
    assert out.completion_len_R[0] == first + 1 and out.stopped_R[0]
    assert out.mask_RT[0].sum() == first + 1 and out.mask_RT[0, 4 + first] == 1
    assert (out.tokens_RT[0, 5 + first:] == 0).all() and (out.logp_behav_RT[0, 5 + first:] == 0).all()


# ------------------------------------------------ sharding ------------------------------------------------

SHARDED_SCRIPT = r"""
import sys, numpy as np, jax
sys.path.insert(0, sys.argv[1])
import model
import sharding
assert len(jax.devices()) == 8, jax.devices()
cfg = model.ModelConfig(vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                        intermediate_size=128, max_seq_len=64, rope_theta=1e4, rms_norm_eps=1e-6, qkv_bias=True,
                        tie_embeddings=False, dtype="float32")
params = model.init_params(cfg, jax.random.key(0))
tokens = np.random.RandomState(0).randint(0, 128, (4, 24)).astype(np.int32)
ref = np.asarray(jax.jit(model.forward, static_argnums=1)(jax.device_put(params, jax.devices()[0]), cfg, tokens))
mesh = sharding.make_mesh(data=2, tensor=4)
sharded = sharding.shard_params(params, cfg, mesh)
assert any(len(x.sharding.device_set) == 8 for x in jax.tree.leaves(sharded))
toks = jax.device_put(tokens, jax.sharding.NamedSharding(mesh, sharding.ACTIVATION_SPECS["tokens_RT"]))
out = jax.jit(model.forward, static_argnums=1)(sharded, cfg, toks)
assert len(out.sharding.device_set) == 8
print("MAXDIFF", float(np.abs(np.asarray(out) - ref).max()))
"""


def test_sharded_forward_on_8_cpu_devices_matches_single_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    res = subprocess.run([sys.executable, "-c", SHARDED_SCRIPT, os.path.join(os.path.dirname(__file__), "..")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    diff = float(res.stdout.split("MAXDIFF")[1])
    assert diff <= 1e-4


def test_partition_specs_cover_params():
    cfg = model.ModelConfig(**BF16_CFG)
    params = model.init_params(cfg, jax.random.key(0))
    specs = sharding.param_partition_specs(params, cfg)
    assert jax.tree.structure(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)) == \
        jax.tree.structure(params)
    assert specs["layers"]["q_proj"] == jax.sharding.PartitionSpec(None, "data", "tensor", None)


# ------------------------------------------------ bad inputs ------------------------------------------------

def test_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        hf_io.config_from_hf({**HF_TINY, "model_type": "gpt2"})
    (tmp_path / "x").mkdir()
    json.dump({**HF_TINY, "model_type": "mistral"}, open(tmp_path / "x" / "config.json", "w"))
    with pytest.raises(ValueError, match="not supported"):
        hf_io.load_hf(str(tmp_path / "x"))
    with pytest.raises(ValueError, match="no config.json"):
        hf_io.load_hf(str(tmp_path / "nothing"))

    cfg = model.ModelConfig(**BF16_CFG)
    params = model.init_params(cfg, jax.random.key(0))
    tensors = hf_io.to_hf_tensors(params, cfg)
    missing = dict(tensors)
    del missing["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"missing tensors \(1\): model.layers.1.mlp.up_proj.weight"):
        hf_io.from_hf_tensors(missing, cfg)
    with pytest.raises(ValueError, match=r"unexpected tensors \(1\): model.layers.9.foo"):
        hf_io.from_hf_tensors({**tensors, "model.layers.9.foo": np.zeros(3)}, cfg)
    bad = {**tensors, "model.norm.weight": np.zeros(7, np.float32)}
    with pytest.raises(ValueError, match=r"model.norm.weight: checkpoint \(7,\), config expects \(128,\)"):
        hf_io.from_hf_tensors(bad, cfg)

    with pytest.raises(ValueError, match=r"token id 256 out of range \[0, 256\)"):
        model.forward(params, cfg, np.array([[1, 256]], np.int32))
    with pytest.raises(ValueError, match="token id -1 out of range"):
        model.token_logprobs(params, cfg, np.array([[1, -1]], np.int32))
    with pytest.raises(ValueError, match="exceeds the model's max_seq_len 128"):
        model.forward(params, cfg, np.zeros((1, 129), np.int32))
    with pytest.raises(ValueError, match="prompt_len \\+ max_new_tokens <= T"):
        sampler.generate(params, cfg, np.zeros((1, 8), np.int32), np.array([4]), jax.random.key(0), max_new_tokens=5)
    with pytest.raises(ValueError, match="num_heads"):
        model.ModelConfig(**{**BF16_CFG, "num_kv_heads": 3})
    with pytest.raises(ValueError, match="dtype"):
        model.ModelConfig(**{**BF16_CFG, "dtype": "float16"})


# ------------------------------------------------ tokenizers ------------------------------------------------

def test_tokenizers(tmp_path):
    tok = hf_io.load_tokenizer(None)
    assert isinstance(tok, hf_io.ByteTokenizer)
    text = "def f(x):\n    return x + 1  # é"
    assert tok.decode(tok.encode(text)) == text and max(tok.encode(text)) < 256
    assert {tok.pad_id, tok.bos_id, tok.eos_id} == {256, 257, 258} and tok.vocab_size == 259

    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    hf_tok = Tokenizer(models.WordLevel({"<eos>": 0, "hello": 1, "world": 2, "[UNK]": 3}, unk_token="[UNK]"))
    hf_tok.pre_tokenizer = pre_tokenizers.Whitespace()
    hf_tok.decoder = decoders.WordPiece()
    hf_tok.save(str(tmp_path / "tokenizer.json"))
    json.dump({"eos_token_id": 0}, open(tmp_path / "config.json", "w"))
    tok = hf_io.load_tokenizer(str(tmp_path))
    assert isinstance(tok, hf_io.HFTokenizer) and tok.vocab_size == 4 and tok.eos_id == 0
    assert tok.encode("hello world hello") == [1, 2, 1]
    assert tok.decode([1, 2]) == "hello world"


def test_gpu_gemm_flag_is_set_where_jax_has_cuda(tmp_path):
    """PRECISION POLICY (h): importing model.py adds the cuBLAS-GEMM flag to XLA_FLAGS (measured
    necessary for bitwise parity on an H200) when JAX's CUDA plugin is installed, leaves a flag the
    user set alone, and changes nothing on a machine without the plugin (CPU, TPU)."""
    import importlib.util
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    (tmp_path / "jax_cuda13_plugin").mkdir()  # stands in for the installed plugin (found, never imported)
    (tmp_path / "jax_cuda13_plugin" / "__init__.py").write_text("")

    def flags_after_import(xla_flags, fake_plugin):
        env = {**os.environ, "XLA_FLAGS": xla_flags}
        if fake_plugin:
            env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
        out = subprocess.run([sys.executable, "-c", "import os, model; print(os.environ['XLA_FLAGS'])"],
                             cwd=root, env=env, capture_output=True, text=True, check=True)
        return out.stdout.split()

    assert flags_after_import("--xla_foo=1", True) == ["--xla_foo=1", model.PARITY_XLA_FLAGS]
    assert flags_after_import("--xla_gpu_enable_triton_gemm=true", True) == ["--xla_gpu_enable_triton_gemm=true"]
    if not any(importlib.util.find_spec(m) for m in model._CUDA_PLUGINS):  # this machine: no CUDA plugin
        assert flags_after_import("--xla_foo=1", False) == ["--xla_foo=1"]


def test_per_row_keys_make_each_row_independent_of_its_batch():
    """generate() with one key per row: a row's completion depends on its prompt, key and the weights
    only, so the same (prompt, key) gives the same tokens in any batch, at any position, next to any
    rows (common random numbers for evaluation); a batch key still works, and a wrong count is refused."""
    cfg = model.ModelConfig(**BF16_CFG)
    params = model.init_params(cfg, jax.random.key(0))
    rs = np.random.RandomState(0)
    prompt_RT = np.zeros((6, 48), np.int32)
    prompt_RT[:, :8] = rs.randint(1, 256, (6, 8))
    lens = np.full(6, 8)
    keys = jax.random.split(jax.random.key(7), 6)
    a = sampler.generate(params, cfg, prompt_RT, lens, keys, max_new_tokens=24)
    order = np.array([4, 0, 5])  # a different batch: fewer rows, another order
    b = sampler.generate(params, cfg, prompt_RT[order], lens[order], keys[order], max_new_tokens=24)
    assert np.array_equal(a.tokens_RT[order], b.tokens_RT)
    assert np.array_equal(a.logp_behav_RT[order], b.logp_behav_RT)
    assert len({a.tokens_RT[i, 8:].tobytes() for i in range(6)}) == 6  # different keys, different draws
    # the same prompt in every row with different keys gives different completions; same key, same one
    same = np.repeat(prompt_RT[:1], 4, axis=0)
    c = sampler.generate(params, cfg, same, lens[:4], jax.random.split(jax.random.key(3), 4), max_new_tokens=24)
    d = sampler.generate(params, cfg, same, lens[:4], jnp.stack([keys[0]] * 4), max_new_tokens=24)
    assert len({row.tobytes() for row in c.tokens_RT}) > 1
    assert all(np.array_equal(row, a.tokens_RT[0]) for row in d.tokens_RT)
    sampler.generate(params, cfg, prompt_RT, lens, jax.random.PRNGKey(1), max_new_tokens=4)  # raw batch key
    with pytest.raises(ValueError, match="one per row"):
        sampler.generate(params, cfg, prompt_RT, lens, keys[:5], max_new_tokens=4)


def test_decode_bitwise_with_two_query_heads_per_kv_head_of_width_64():
    """PRECISION POLICY (j): hidden 256, 4 query heads over 2 kv heads of width 64 gives decode's p.v
    dot 2 rows per kv head, where XLA:CPU's kernel for so few rows sums in another order than the
    forward's (without the padding to MIN_ATTN_ROWS, about 3% of the sampled tokens' log-probs were off).
    16 rows, 10-token prompts, 100 new tokens: every sampled log-prob == token_logprobs, bitwise."""
    cfg = model.ModelConfig(vocab_size=512, hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64,
                            intermediate_size=512, max_seq_len=256, rope_theta=1e4, rms_norm_eps=1e-6,
                            qkv_bias=False, tie_embeddings=True)
    params = model.init_params(cfg, jax.random.PRNGKey(0))
    prompt = np.zeros((16, 256), np.int32)
    prompt[:, :10] = np.random.default_rng(0).integers(1, 512, (16, 10))
    out = sampler.generate(params, cfg, prompt, np.full(16, 10), jax.random.PRNGKey(1), max_new_tokens=100)
    lp = np.asarray(jax.jit(model.token_logprobs, static_argnums=1)(params, cfg, out.tokens_RT))
    m = out.mask_RT > 0
    assert m.sum() == 1600 and np.array_equal(lp[m], out.logp_behav_RT[m])
