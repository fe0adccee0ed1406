"""hf_io.py: model.py's config, weights and text in the Hugging Face formats.

  1. config.json <-> model.ModelConfig: config_from_hf (transformers 4.x or 5.x layout; refuses what
     the decoder does not implement, naming it), config_to_hf.
  2. The 1:1 mapping between our parameter pytree (model.py section 3 draws it) and the HF safetensors
     names of Qwen2 / Llama / Qwen3: to_hf_tensors, from_hf_tensors (which names every mismatch).
  3. Checkpoint folders: load_hf / save_hf (config.json + model.safetensors, or shards with an index);
     PEFT LoRA adapter folders: save_peft_adapter / load_peft_adapter (lora.py's adapters).
  4. Tokenizers: the built-in ByteTokenizer, or the HF `tokenizers` package when tokenizer.json exists.

Kept apart from model.py so that file is the model's math only. Tested in tests/test_model.py and
tests/test_hf_checkpoints.py (Qwen3, Llama 3 RoPE scaling).
"""
from __future__ import annotations

import json
import os
import shutil
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

import lora
import multihost
from model import _DTYPES, _MODEL_TYPES, Llama3RopeScaling, ModelConfig, _param_shapes

# =====================================================================================================
# 1. config.json <-> ModelConfig
# =====================================================================================================

_ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def _read_hf_rope(d: dict) -> tuple[float, Llama3RopeScaling | None]:
    """(rope_theta, scaling) from a config.json. transformers 4.x writes rope_theta at the top level and
    the scaling as rope_scaling (rope_type or the older key type); 5.x writes both into rope_parameters.
    Like transformers 5.x, rope_scaling wins when both are present."""
    scaling, params = d.get("rope_scaling") or {}, d.get("rope_parameters") or {}
    rope = scaling or params
    if any(isinstance(v, dict) for v in rope.values()):
        raise ValueError(f"per-layer-type RoPE parameters {sorted(rope)} are not implemented")
    theta = rope.get("rope_theta", params.get("rope_theta", d.get("rope_theta", 10000.0)))
    rotary = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if rotary is not None and float(rotary) != 1.0:
        raise ValueError(f"partial_rotary_factor {rotary} is not implemented; only RoPE over the whole head")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type != "llama3":  # linear, dynamic, yarn, longrope, ...: refused rather than run with wrong angles
        raise ValueError(f"RoPE scaling rope_type {rope_type!r} is not implemented; only 'default' and 'llama3' are")
    missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor") if rope.get(k) is None]
    if missing:
        raise ValueError(f"llama3 RoPE scaling is missing {', '.join(missing)}")
    # transformers gives a top-level original_max_position_embeddings priority, then the scaling's own,
    # then max_position_embeddings
    original = d.get("original_max_position_embeddings") or rope.get("original_max_position_embeddings") \
        or d.get("max_position_embeddings")
    if original is None:
        raise ValueError("llama3 RoPE scaling needs original_max_position_embeddings")
    return float(theta), Llama3RopeScaling(
        factor=float(rope["factor"]), low_freq_factor=float(rope["low_freq_factor"]),
        high_freq_factor=float(rope["high_freq_factor"]), original_max_position_embeddings=int(original))


def _rope_to_hf(scaling: Llama3RopeScaling | None) -> dict:
    """The RoPE scaling as config.json's rope_parameters / rope_scaling hold it (without rope_theta)."""
    if scaling is None:
        return {"rope_type": "default"}
    return {"rope_type": "llama3", "factor": scaling.factor, "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings}


COMPUTE_DTYPES = ("bfloat16", "float32", "checkpoint")


def compute_dtype_override(compute_dtype: str) -> dict:
    """The ModelConfig override for a role's --dtype: "bfloat16" or "float32" compute in that dtype
    whatever the checkpoint stores (a float32 checkpoint under "bfloat16" is cast once, on load);
    "checkpoint" computes in the dtype config.json names. Why bf16 is the roles' default: the
    precision policy (model.py) makes bf16 log-probs bitwise equal between sampler and trainer at any
    length, row count and chunking; float32 dots on XLA:CPU change their summation order with the
    matrix shape, so float32 sampler and trainer log-probs differ in the last bits (docs/numerics.md)."""
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"dtype must be one of {COMPUTE_DTYPES}, got {compute_dtype!r}")
    return {} if compute_dtype == "checkpoint" else {"dtype": compute_dtype}


def config_from_hf(d: dict, **overrides) -> ModelConfig:
    """The ModelConfig of a Hugging Face config.json dict (transformers 4.x or 5.x layout); overrides
    replace fields of the result (dtype, bf16_fix, ...)."""
    model_type = d.get("model_type")
    if model_type not in _MODEL_TYPES:
        raise ValueError(f"config.json model_type {model_type!r} is not supported; "
                         f"expected one of {_MODEL_TYPES}")
    try:
        rope_theta, rope_scaling = _read_hf_rope(d)
        if d.get("use_sliding_window"):
            raise ValueError("sliding-window attention (use_sliding_window) is not implemented")
        if d.get("mlp_bias"):
            raise ValueError("Llama mlp_bias=True is not implemented")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {d.get('hidden_act')!r} is not implemented; only silu")
        heads = d["num_attention_heads"]
        # head_dim may differ from hidden_size // heads (Qwen3 does that); a config.json without it
        # means what transformers' config class defaults to: 128 for Qwen3Config, hidden // heads else
        default_head_dim = 128 if model_type == "qwen3" else d["hidden_size"] // heads
        kw = dict(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], num_layers=d["num_hidden_layers"],
            num_heads=heads, num_kv_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or default_head_dim,
            intermediate_size=d["intermediate_size"], max_seq_len=d.get("max_position_embeddings", 2048),
            rope_theta=rope_theta, rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            qkv_bias=True if model_type == "qwen2" else bool(d.get("attention_bias", False)),
            tie_embeddings=bool(d.get("tie_word_embeddings", False)), model_type=model_type,
            rope_scaling=rope_scaling)
    except KeyError as e:
        raise ValueError(f"config.json is missing the required field {e.args[0]!r}") from None
    hf_dtype = d.get("dtype") or d.get("torch_dtype")
    if hf_dtype in _DTYPES:
        kw["dtype"] = hf_dtype
    kw.update(overrides)
    return ModelConfig(**kw)


def config_to_hf(cfg: ModelConfig) -> dict:
    """A config.json dict that transformers (4.x and 5.x) loads as Qwen2ForCausalLM / LlamaForCausalLM /
    Qwen3ForCausalLM. RoPE scaling is written twice: rope_parameters (5.x) and rope_scaling with
    rope_theta at the top level (4.x; 5.x reads rope_scaling first and adds rope_theta to it)."""
    rope = _rope_to_hf(cfg.rope_scaling)
    d = {
        "architectures": [_ARCHITECTURES[cfg.model_type]],
        "model_type": cfg.model_type, "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size, "max_position_embeddings": cfg.max_seq_len,
        "rope_theta": cfg.rope_theta, "rope_parameters": {**rope, "rope_theta": cfg.rope_theta},
        "rms_norm_eps": cfg.rms_norm_eps, "tie_word_embeddings": cfg.tie_embeddings,
        "hidden_act": "silu", "dtype": cfg.dtype, "torch_dtype": cfg.dtype,
    }
    if cfg.rope_scaling is not None:
        d["rope_scaling"] = rope
    if cfg.model_type == "llama":
        d["attention_bias"] = cfg.qkv_bias
        d["mlp_bias"] = False
    elif cfg.model_type == "qwen3":
        d["attention_bias"] = cfg.qkv_bias
        d["use_sliding_window"] = False
    elif not cfg.qkv_bias:
        raise ValueError("a qwen2 checkpoint always has q/k/v biases; use model_type='llama' for qkv_bias=False")
    return d


# =====================================================================================================
# 2. Our pytree <-> Hugging Face tensor names
# =====================================================================================================

def _hf_layer_map(cfg: ModelConfig):
    """(our layer key, HF suffix, ours->HF numpy fn, HF->ours numpy fn) for one layer slice."""
    D, N, K, H = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    ident = lambda x: x
    rows = [
        ("input_norm", "input_layernorm.weight", ident, ident),
        ("q_proj", "self_attn.q_proj.weight", lambda w: w.reshape(D, N * H).T, lambda w: w.T.reshape(D, N, H)),
        ("k_proj", "self_attn.k_proj.weight", lambda w: w.reshape(D, K * H).T, lambda w: w.T.reshape(D, K, H)),
        ("v_proj", "self_attn.v_proj.weight", lambda w: w.reshape(D, K * H).T, lambda w: w.T.reshape(D, K, H)),
        ("o_proj", "self_attn.o_proj.weight", lambda w: w.reshape(N * H, D).T, lambda w: w.T.reshape(N, H, D)),
        ("post_norm", "post_attention_layernorm.weight", ident, ident),
        ("gate_proj", "mlp.gate_proj.weight", lambda w: w.T, lambda w: w.T),
        ("up_proj", "mlp.up_proj.weight", lambda w: w.T, lambda w: w.T),
        ("down_proj", "mlp.down_proj.weight", lambda w: w.T, lambda w: w.T),
    ]
    if cfg.qkv_bias:
        rows += [("q_bias", "self_attn.q_proj.bias", lambda b: b.reshape(N * H), lambda b: b.reshape(N, H)),
                 ("k_bias", "self_attn.k_proj.bias", lambda b: b.reshape(K * H), lambda b: b.reshape(K, H)),
                 ("v_bias", "self_attn.v_proj.bias", lambda b: b.reshape(K * H), lambda b: b.reshape(K, H))]
    if cfg.qk_norm:  # Qwen3: one [H] weight per layer for q, one for k, shared by all heads
        rows += [("q_norm", "self_attn.q_norm.weight", ident, ident),
                 ("k_norm", "self_attn.k_norm.weight", ident, ident)]
    return rows


def _to_numpy(x) -> np.ndarray:
    """On the host; for an array sharded over several processes (the trainer across hosts) an
    all-gather that every process makes (multihost.to_host)."""
    return multihost.to_host(x)


def to_hf_tensors(params: dict, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Our pytree -> {HF safetensors name: array} (contiguous numpy, dtype kept)."""
    out = {"model.embed_tokens.weight": _to_numpy(params["embed"]),
           "model.norm.weight": _to_numpy(params["final_norm"])}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = _to_numpy(params["lm_head"]).T
    for ours, suffix, to_hf, _ in _hf_layer_map(cfg):
        stacked = _to_numpy(params["layers"][ours])
        for i in range(cfg.num_layers):
            out[f"model.layers.{i}.{suffix}"] = to_hf(stacked[i])
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


@partial(jax.jit, static_argnames="dtype")
def _device_layer(stacked, i, dtype):
    """Layer i of a stacked [L, ...] leaf, cast to dtype, where the leaf lives (sharded or not)."""
    return jax.lax.dynamic_index_in_dim(stacked, i, 0, keepdims=False).astype(dtype)


def iter_hf_tensors(params: dict, cfg: ModelConfig, dtype=None):
    """to_hf_tensors one tensor at a time: yields (HF name, contiguous numpy array) in the same order,
    with the same bits after the cast to `dtype` (None: keep each leaf's). A tensor is cut out of its
    leaf and cast on the device the leaf lives on (a sharded leaf stays sharded), and only that one
    tensor is copied to the host: the host holds one tensor's worth beyond what the caller keeps
    (trainer.push sends a sharded f32 master as bf16 this way)."""
    def whole(x):
        x = x if dtype is None else x.astype(dtype)
        return _to_numpy(x)

    def layer(stacked, i):
        if isinstance(stacked, jax.Array):
            return _to_numpy(_device_layer(stacked, i, jnp.dtype(dtype or stacked.dtype)))
        return np.asarray(stacked[i]).astype(dtype or np.asarray(stacked).dtype)

    yield "model.embed_tokens.weight", np.ascontiguousarray(whole(params["embed"]))
    yield "model.norm.weight", np.ascontiguousarray(whole(params["final_norm"]))
    if not cfg.tie_embeddings:
        yield "lm_head.weight", np.ascontiguousarray(whole(params["lm_head"]).T)
    for ours, suffix, to_hf, _ in _hf_layer_map(cfg):
        for i in range(cfg.num_layers):
            array = to_hf(layer(params["layers"][ours], i))
            yield f"model.layers.{i}.{suffix}", np.ascontiguousarray(array)


def _hf_shapes(cfg: ModelConfig) -> dict[str, tuple]:
    shapes = _param_shapes(cfg)
    out = {"model.embed_tokens.weight": shapes["embed"], "model.norm.weight": shapes["final_norm"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = shapes["lm_head"][::-1]
    for ours, suffix, to_hf, _ in _hf_layer_map(cfg):
        hf_shape = to_hf(np.zeros(shapes["layers"][ours][1:], np.float32)).shape
        for i in range(cfg.num_layers):
            out[f"model.layers.{i}.{suffix}"] = tuple(hf_shape)
    return out


def from_hf_tensors(tensors: dict, cfg: ModelConfig, host: bool = False) -> dict:
    """{HF name: array} -> our pytree in cfg.dtype. Raises ValueError naming every missing, unexpected or
    mis-shaped tensor. A tied checkpoint that still carries lm_head.weight is accepted (it is ignored).
    host=True: numpy arrays (for sharding.shard_params to send straight to their shards), else jax
    arrays on the default device."""
    expected = _hf_shapes(cfg)
    given = dict(tensors)
    if cfg.tie_embeddings:
        given.pop("lm_head.weight", None)
    given = {k: v for k, v in given.items() if not k.endswith("rotary_emb.inv_freq")}
    missing = sorted(set(expected) - set(given))
    extra = sorted(set(given) - set(expected))
    bad = sorted(f"{k}: checkpoint {tuple(np.shape(given[k]))}, config expects {expected[k]}"
                 for k in set(expected) & set(given) if tuple(np.shape(given[k])) != expected[k])
    if missing or extra or bad:
        lines = []
        if missing:
            lines.append(f"missing tensors ({len(missing)}): {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
        if extra:
            lines.append(f"unexpected tensors ({len(extra)}): {', '.join(extra[:8])}{' ...' if len(extra) > 8 else ''}")
        if bad:
            lines.append(f"shape mismatches ({len(bad)}): {'; '.join(bad[:8])}")
        raise ValueError("checkpoint does not match the model config:\n  " + "\n  ".join(lines))
    dt = cfg.jdtype
    array = np.asarray if host else jnp.asarray
    conv = lambda x: array(np.asarray(x, dtype=np.float32) if np.asarray(x).dtype != dt else x, dtype=dt)
    params = {"embed": conv(given["model.embed_tokens.weight"]), "final_norm": conv(given["model.norm.weight"])}
    if not cfg.tie_embeddings:
        params["lm_head"] = conv(np.asarray(given["lm_head.weight"]).T)
    params["layers"] = {
        ours: conv(np.stack([from_hf(np.asarray(given[f"model.layers.{i}.{suffix}"]))
                             for i in range(cfg.num_layers)]))
        for ours, suffix, _, from_hf in _hf_layer_map(cfg)}
    return params


# =====================================================================================================
# 3. Checkpoint folders in the Hugging Face layout
# =====================================================================================================


TOKENIZER_FILES = ("special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json",
                   "generation_config.json", "chat_template.jinja")  # plus every tokenizer*


def save_hf(path: str, cfg: ModelConfig, params: dict, max_shard_bytes: int | None = None,
            tokenizer_from: str | None = None) -> None:
    """Write config.json and model.safetensors (or model-0000i-of-0000n.safetensors shards plus
    model.safetensors.index.json when the tensors exceed max_shard_bytes), in cfg.dtype.
    tokenizer_from: a model folder whose tokenizer and generation files are copied along, so the
    saved folder loads with its tokenizer (a trained policy next to the model it started from)."""
    from safetensors.numpy import save_file
    import ml_dtypes  # noqa: F401  (numpy bfloat16 support, a jax dependency)

    os.makedirs(path, exist_ok=True)
    for name in sorted(os.listdir(tokenizer_from)) if tokenizer_from else ():
        if name in TOKENIZER_FILES or name.startswith("tokenizer"):
            shutil.copy2(os.path.join(tokenizer_from, name), path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config_to_hf(cfg), f, indent=2)
    tensors = to_hf_tensors(params, cfg)
    if max_shard_bytes is None or sum(t.nbytes for t in tensors.values()) <= max_shard_bytes:
        save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        return
    shards, current, size = [], {}, 0
    for name, t in tensors.items():
        if current and size + t.nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = t
        size += t.nbytes
    shards.append(current)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(path, fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in shard})
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)


def load_hf(path: str, dtype: str | None = None, host: bool = False, **overrides) -> tuple[ModelConfig, dict]:
    """Read a HF checkpoint folder (config.json + model.safetensors or a sharded index) -> (cfg, params).
    dtype overrides the checkpoint's dtype ("bfloat16" / "float32"); host=True returns numpy arrays (see
    from_hf_tensors); other kwargs override config fields."""
    from safetensors.numpy import load_file

    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise ValueError(f"{path!r} is not a Hugging Face checkpoint folder: no config.json")
    with open(cfg_path) as f:
        hf = json.load(f)
    if dtype is not None:
        overrides["dtype"] = dtype
    cfg = config_from_hf(hf, **overrides)
    single, index = os.path.join(path, "model.safetensors"), os.path.join(path, "model.safetensors.index.json")
    tensors = {}
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        for fname in files:
            tensors.update(load_file(os.path.join(path, fname)))
    elif os.path.isfile(single):
        tensors = load_file(single)
    else:
        raise ValueError(f"{path!r} has neither model.safetensors nor model.safetensors.index.json")
    return cfg, from_hf_tensors(tensors, cfg, host=host)


# PEFT's LoRA adapter folders (what peft.PeftModel.from_pretrained / save_pretrained read and write):
# adapter_config.json and adapter_model.safetensors, one lora_A.weight [r, in] and lora_B.weight
# [out, r] per adapted nn.Linear, named after the module they wrap. lora.py keeps the same
# orientation, stacked over the layers, so the mapping is a per-layer slice.
PEFT_CONFIG, PEFT_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
_PEFT_MODULES = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
                 "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
                 "down_proj": "mlp.down_proj"}


def _peft_name(i: int, target: str, m: str) -> str:
    return f"base_model.model.model.layers.{i}.{_PEFT_MODULES[target]}.lora_{m}.weight"


def save_peft_adapter(path: str, cfg: ModelConfig, lcfg, adapter: dict, base_model: str = "") -> None:
    """Write a lora.py adapter (lcfg a lora.LoraConfig) as a PEFT LoRA folder: adapter_config.json (peft_type
    LORA, r, lora_alpha, target_modules, task_type CAUSAL_LM, base_model_name_or_path) and
    adapter_model.safetensors in float32 under PEFT's tensor names."""
    from safetensors.numpy import save_file

    os.makedirs(path, exist_ok=True)
    tensors = {}
    for t in lcfg.targets:
        A, B = (_to_numpy(adapter[t][m]).astype(np.float32) for m in ("A", "B"))
        for i in range(cfg.num_layers):
            tensors[_peft_name(i, t, "A")] = np.ascontiguousarray(A[i])
            tensors[_peft_name(i, t, "B")] = np.ascontiguousarray(B[i])
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
              "r": lcfg.rank, "lora_alpha": lcfg.alpha, "target_modules": list(lcfg.targets),
              "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
              "use_dora": False, "init_lora_weights": True, "inference_mode": True, "modules_to_save": None}
    with open(os.path.join(path, PEFT_CONFIG), "w") as f:
        json.dump(config, f, indent=2)
    save_file(tensors, os.path.join(path, PEFT_WEIGHTS), metadata={"format": "pt"})


def read_peft_config(path: str):
    """The lora.LoraConfig of a PEFT LoRA folder, from its adapter_config.json alone (no model needed:
    trainer_config checks the --lora-* flags against it at start). Refuses, naming it, what lora.py
    does not implement (another peft_type, DoRA, rsLoRA, per-module ranks, trained biases or extra
    modules, a regex target)."""
    try:
        with open(os.path.join(path, PEFT_CONFIG)) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path!r} is not a PEFT adapter folder: cannot read {PEFT_CONFIG} ({e})") from None
    unsupported = [k for k, ok in (("peft_type", d.get("peft_type") == "LORA"), ("use_dora", not d.get("use_dora")),
                                   ("use_rslora", not d.get("use_rslora")), ("fan_in_fan_out", not d.get("fan_in_fan_out")),
                                   ("bias", d.get("bias", "none") == "none"), ("modules_to_save", not d.get("modules_to_save")),
                                   ("rank_pattern", not d.get("rank_pattern")), ("alpha_pattern", not d.get("alpha_pattern")),
                                   ("layers_to_transform", d.get("layers_to_transform") is None),
                                   ("target_modules", isinstance(d.get("target_modules"), list))) if not ok]
    if unsupported:
        raise ValueError(f"{path}: PEFT adapter settings lora.py does not implement: "
                         + ", ".join(f"{k}={d.get(k)!r}" for k in unsupported))
    try:
        return lora.LoraConfig(d.get("r"), d.get("lora_alpha"), tuple(d["target_modules"]))
    except ValueError as e:
        raise ValueError(f"{path}/{PEFT_CONFIG}: {e}") from None


def load_peft_adapter(path: str, cfg: ModelConfig):
    """(lora.LoraConfig, f32 adapter) from a PEFT LoRA folder for this model: read_peft_config's
    refusals, and any missing, unexpected or mis-shaped tensor."""
    from safetensors.numpy import load_file

    lcfg = read_peft_config(path)
    try:
        given = load_file(os.path.join(path, PEFT_WEIGHTS))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read {PEFT_WEIGHTS} ({e})") from None
    named, missing = {}, []
    for t in lcfg.targets:
        for m in ("A", "B"):
            names = [_peft_name(i, t, m) for i in range(cfg.num_layers)]
            missing += [n for n in names if n not in given]
            if not any(n not in given for n in names):
                shapes = {given[n].shape for n in names}
                if len(shapes) != 1:
                    raise ValueError(f"{path}: {t}.lora_{m} differs in shape across layers: {sorted(shapes)}")
                named[f"{lora.PREFIX}{t}.{m}"] = np.stack([given[n].astype(np.float32) for n in names])
    extra = sorted(set(given) - {_peft_name(i, t, m) for i in range(cfg.num_layers) for t in lcfg.targets
                                 for m in ("A", "B")})
    if missing or extra:
        raise ValueError(f"{path}: adapter tensors do not match the model: missing {missing[:6]}, "
                         f"unexpected {extra[:6]}")
    return lcfg, lora.adapter_from_tensors(named, cfg, lcfg)


def check_lora_flags(init_dir: str, init_cfg, rank=0, alpha=0.0, targets="") -> None:
    """With --lora-init the folder's adapter_config.json is the run's LoRA config (as PEFT's
    PeftModel.from_pretrained takes r, lora_alpha and target_modules from it): each --lora-* flag
    given beside it (rank != 0, alpha != 0, targets != "") must equal the folder's value, else a
    ValueError naming the flag, its value and the folder's. None is ignored in silence."""
    bad = []
    if rank and int(rank) != init_cfg.rank:
        bad.append(f"--lora-rank {rank} (the folder's r is {init_cfg.rank})")
    if alpha and float(alpha) != init_cfg.alpha:
        bad.append(f"--lora-alpha {alpha:g} (the folder's lora_alpha is {init_cfg.alpha:g})")
    if targets:
        names = tuple(t.strip() for t in targets.split(",") if t.strip())
        try:
            same = lora.LoraConfig(init_cfg.rank, init_cfg.alpha, names).targets == init_cfg.targets
        except ValueError:
            same = False
        if not same:
            bad.append(f"--lora-targets {targets} (the folder's target_modules are {','.join(init_cfg.targets)})")
    if bad:
        raise ValueError(f"--lora-init {init_dir}: its {PEFT_CONFIG} sets the run's LoRA config, and "
                         + "; ".join(bad) + " contradicts it: drop the flag or give the folder's value")


def lora_start(cfg: ModelConfig, rank=0, alpha=0.0, targets="", init_dir=None) -> tuple:
    """A run's (lora.LoraConfig or None, starting adapter or None), from its --lora-* flags
    (LoraConfig.parse) or, with init_dir (--lora-init), the PEFT folder's config and adapter: rank,
    alpha or targets given beside it must be the folder's (check_lora_flags; each flag is checked on
    its own, whether or not --lora-rank is given)."""
    if not init_dir:
        return lora.LoraConfig.parse(rank, alpha, targets), None
    init_cfg, adapter = load_peft_adapter(init_dir, cfg)
    check_lora_flags(init_dir, init_cfg, rank, alpha, targets)
    return init_cfg, adapter


def save_final(out: str, cfg: ModelConfig, policy: dict, tokenizer_from: str, lcfg=None, adapter=None) -> str:
    """A trained policy as a Hugging Face folder `out` (save_hf, with tokenizer_from's tokenizer files),
    plus, with a LoRA adapter, `out/adapter` (save_peft_adapter, for the model tokenizer_from). Written
    beside and renamed into place, so it is whole or absent. Returns out."""
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_hf(tmp, cfg, policy, tokenizer_from=tokenizer_from)
    if lcfg is not None:
        save_peft_adapter(os.path.join(tmp, "adapter"), cfg, lcfg, adapter, tokenizer_from)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


# =====================================================================================================
# 4. Tokenizers
# =====================================================================================================


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; then pad (256), bos (257), eos (258). vocab_size 259 (models may be
    larger). For the embedded tiny models: no files, no downloads, round-trips any text."""

    def __init__(self):
        self.pad_id, self.bos_id, self.eos_id = 256, 257, 258
        self.eos_ids = (258,)
        self.vocab_size = 259

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def special_text(self, token_id: int) -> str | None:
        """pad, bos and eos have no text (a chat template cannot name them)."""
        return None


class HFTokenizer:
    """Same interface around a Hugging Face `tokenizers` tokenizer.json. encode() adds no special
    tokens: a chat prompt carries them as text (prompts.render_chat), and the tokenizer recognises them
    there, which gives the ids transformers' apply_chat_template(tokenize=True) gives. decode() skips
    special tokens (a completion's text is what the model wrote, not its end-of-turn); a special token's
    own text comes from special_text(id), never from decode.

    eos_ids: every id that ends generation (generation_config.json lists several: Llama 3 Instruct's
    [128001, 128009], Qwen3's [151645, 151643]); eos_id: the primary one (tokenizer_config.json's
    eos_token where it names one, else the first listed)."""

    def __init__(self, tokenizer_json: str, pad_id=None, bos_id=None, eos_id=None, eos_ids=()):
        from tokenizers import Tokenizer  # imported only when a checkpoint ships a tokenizer.json

        self._tok = Tokenizer.from_file(tokenizer_json)
        self.vocab_size = self._tok.get_vocab_size()
        self._special = {i: t.content for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        self.set_ids(pad_id, bos_id, eos_id, eos_ids)

    def set_ids(self, pad_id=None, bos_id=None, eos_id=None, eos_ids=()) -> None:
        self.bos_id, self.eos_id = bos_id, eos_id
        self.eos_ids = tuple(dict.fromkeys(([eos_id] if eos_id is not None else []) + [int(i) for i in eos_ids]))
        self.pad_id = pad_id if pad_id is not None else (eos_id if eos_id is not None else 0)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def special_text(self, token_id: int) -> str | None:
        """A special token's own string ("<|im_end|>"), None for an ordinary token."""
        return self._special.get(int(token_id))

    def token_id(self, text: str) -> int | None:
        """The id of a token given by its string ("<|eot_id|>"), None when the vocabulary has none."""
        return self._tok.token_to_id(text)


def _token_string(value) -> str | None:
    """A token in tokenizer_config.json: "<s>", or an AddedToken dict {"__type": "AddedToken",
    "content": "<s>", ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def load_tokenizer(path_or_none: str | None):
    """HFTokenizer when path has tokenizer.json, else the ByteTokenizer. Special ids come from
    config.json, then generation_config.json (which wins, as transformers' generate reads it), then
    tokenizer_config.json's named tokens (strings or AddedToken dicts) for what those leave unset;
    every eos id any of them lists is kept (eos_ids)."""
    if path_or_none is None or not os.path.isfile(os.path.join(path_or_none, "tokenizer.json")):
        return ByteTokenizer()
    tok = HFTokenizer(os.path.join(path_or_none, "tokenizer.json"))
    ids, eos_ids = {}, []
    for fname in ("config.json", "generation_config.json"):
        p = os.path.join(path_or_none, fname)
        if os.path.isfile(p):
            with open(p) as f:
                d = json.load(f)
            for k in ("pad_token_id", "bos_token_id", "eos_token_id"):
                v = d.get(k)
                listed = [int(i) for i in (v if isinstance(v, list) else [] if v is None else [v])]
                if k == "eos_token_id":
                    eos_ids += listed
                if listed:
                    ids[k[:-len("_token_id")] + "_id"] = listed[0]
    p = os.path.join(path_or_none, "tokenizer_config.json")
    named = {}
    if os.path.isfile(p):
        with open(p, encoding="utf-8") as f:
            d = json.load(f)
        for k in ("pad_token", "bos_token", "eos_token"):
            text = _token_string(d.get(k))
            if text is not None and tok.token_id(text) is not None:
                named[k[:-len("_token")] + "_id"] = tok.token_id(text)
    if "eos_id" in named:  # the tokenizer's own eos is the primary one (a chat checkpoint's end-of-turn)
        eos_ids.insert(0, named["eos_id"])
    ids = {**named, **ids, "eos_id": eos_ids[0] if eos_ids else None}
    tok.set_ids(eos_ids=eos_ids, **ids)
    return tok
