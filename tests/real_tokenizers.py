"""Real tokenizer files, and tiny checkpoints at their real vocabulary sizes, for tests.

  tokenizer_dir(name)   the folder of a real tokenizer ("qwen3": Qwen3, vocab 151,669; "llama3": Llama 3
      Instruct, vocab 128,256): tokenizer.json, tokenizer_config.json (its chat template) and
      generation_config.json, exactly as published. Looked for, in order: $RLAX_TOKENIZERS/<name>, the
      fixtures folder beside a checkout (../shared/fixtures/tokenizers/<name>), and a Hugging Face cache
      the user already has (HF_HUB_CACHE or ~/.cache/huggingface/hub) holding one of the model repos in
      CACHE_REPOS. None when none is there: tests skip, saying so (need()).
  make_scripted(out_dir, tok_dir, model_type, sequences)   a tiny checkpoint (one block, width 64) at
      the tokenizer's vocabulary size whose weights make it write given token sequences: each block's
      output projections are zero, so the logits at a position depend only on that position's token (a
      bigram table): the embedding row of each scripted token is a basis vector and the output head
      maps it to its successor with a logit of +24 (probability 1 - 6e-6 at these vocabulary sizes).
      No token may have two successors (scripted_chain names one that does). Other tokens get small
      random embeddings and a head of zeros: after them the model samples uniformly, like any random
      model.

A scripted model is what lets a test see a feature a random model never reaches: a tool call, a row
that ends at the template's end-of-turn token, an exact reward.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(os.path.dirname(ROOT), "shared", "fixtures", "tokenizers")
CACHE_REPOS = {"qwen3": ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B", "Qwen/Qwen3-8B"),
               "llama3": ("meta-llama/Meta-Llama-3-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct")}
NAMES = tuple(CACHE_REPOS)


def _complete(folder: str) -> bool:
    return all(os.path.isfile(os.path.join(folder, f)) for f in ("tokenizer.json", "tokenizer_config.json"))


def tokenizer_dir(name: str) -> str | None:
    """The folder of real tokenizer `name`, or None (see the module docstring for where it looks)."""
    candidates = []
    if os.environ.get("RLAX_TOKENIZERS"):
        candidates.append(os.path.join(os.environ["RLAX_TOKENIZERS"], name))
    candidates.append(os.path.join(FIXTURES, name))
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub")
    for repo in CACHE_REPOS[name]:
        candidates += sorted(glob.glob(os.path.join(hub, "models--" + repo.replace("/", "--"), "snapshots", "*")))
    return next((c for c in candidates if _complete(c)), None)


def need(name: str) -> str:
    """tokenizer_dir(name), or skip the test with the reason."""
    folder = tokenizer_dir(name)
    if folder is None:
        pytest.skip(f"no {name} tokenizer files: set RLAX_TOKENIZERS to a folder holding {name}/tokenizer.json "
                    f"(or keep ../shared/fixtures/tokenizers beside the checkout, or one of {CACHE_REPOS[name]} "
                    f"in the Hugging Face cache)")
    return folder


def scripted_chain(sequences: list) -> dict:
    """{token: its successor} over token sequences; ValueError naming a token with two successors."""
    succ = {}
    for seq in sequences:
        for a, b in zip(seq, seq[1:]):
            if succ.setdefault(int(a), int(b)) != int(b):
                raise ValueError(f"token {a} is followed by both {succ[int(a)]} and {b}: a bigram model "
                                 f"cannot write these texts")
    return succ


def make_scripted(out_dir: str, tok_dir: str, model_type: str, sequences: list, seed: int = 0,
                  dtype: str = "bfloat16") -> str:
    """A checkpoint in out_dir (our save_hf: config.json, model.safetensors, `dtype`) with tok_dir's
    tokenizer and generation files beside it, that continues each token of `sequences` (lists of token
    ids) with the token after it there. Returns out_dir."""
    import jax
    import hf_io
    import model

    with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    vocab = max([*tok["model"]["vocab"].values(), *(t["id"] for t in tok["added_tokens"])]) + 1
    succ = scripted_chain(sequences)
    D = 64
    scripted = sorted(set(succ))
    if len(scripted) > D:
        raise ValueError(f"at most {D} scripted tokens, got {len(scripted)}")
    cfg = model.ModelConfig(vocab_size=vocab, hidden_size=D, num_layers=1, num_heads=2, num_kv_heads=1,
                            head_dim=32, intermediate_size=64, max_seq_len=4096, rope_theta=1e6,
                            rms_norm_eps=1e-6, qkv_bias=model_type == "qwen2", tie_embeddings=False,
                            model_type=model_type, dtype="float32")
    params = jax.tree_util.tree_map(np.array, model.init_params(cfg, jax.random.PRNGKey(seed)))
    params["layers"]["o_proj"][:] = 0.0      # attention adds nothing to the residual stream
    params["layers"]["down_proj"][:] = 0.0   # nor does the MLP: the head sees the token's embedding
    embed, head = params["embed"].copy(), np.zeros_like(params["lm_head"])
    for i, t in enumerate(scripted):
        embed[t] = 0.0
        embed[t, i] = 1.0                    # after the final RMSNorm: sqrt(D) = 8 on axis i
        head[i, succ[t]] = 3.0               # logit 8 * 3 = 24 for the successor, 0 for the rest
    params["embed"], params["lm_head"] = embed, head
    cfg = dataclasses.replace(cfg, dtype=dtype)
    params = jax.tree_util.tree_map(lambda x: np.asarray(x).astype(cfg.jdtype), params)
    hf_io.save_hf(out_dir, cfg, params, tokenizer_from=tok_dir)  # generation_config.json comes along
    return out_dir
