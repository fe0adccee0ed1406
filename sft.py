"""Supervised fine-tuning on prompts and completions, from any checkpoint, saved in Hugging Face layout.

    python sft.py --model CKPT --data rows.jsonl --out DIR                # 2 epochs, loss on completions
    python sft.py --model CKPT --data rows.jsonl --out DIR --epochs 3 --lr 1e-4 --batch-size 32

The supervised stages of the R1 recipe (docs/algorithm.md) use it: the rejection-sampling SFT on the
policy's own verified completions (rejection_sample.py writes its rows). warmup.py's cold start is the
same training step (make_train_step) on the embedded task's reference solutions.

Rows, one JSON object per line (a line that is not one of these is an error naming its line):
  {"prompt": "...", "completion": "..."}
      completion format: the model continues `prompt` verbatim with `completion` (the text must carry
      its own ending: the embedded task's "\\n", a code row's stop string);
      chat format: `prompt` is the user's message, rendered with the checkpoint's chat template up to
      the assistant's turn, and the completion is followed by the end-of-turn token.
  {"messages": [{"role": "user", "content": "..."}, ..., {"role": "assistant", "content": "..."}]}
      chat format only: every message but the last rendered with the template (add_generation_prompt),
      the last (the assistant's) is the completion, followed by the end-of-turn token.
The format is the checkpoint's, as the trainer picks it (prompts.prompt_format: chat when it has a chat
template), or --prompt-format. Prompt and completion are tokenized apart, exactly as a sampler sees them:
the prompt as the workers encode it, the completion as the tokens the model would write.

Loss: mean next-token cross-entropy over completion tokens (the end-of-turn token included), plus
--prompt-loss-weight times the loss on prompt tokens (0 by default: the loss is on completions only).
Weights train in float32 (AdamW on a warm-up + cosine schedule) and are saved in the checkpoint's dtype,
which is what the sampler and the trainer run; the forward runs in that dtype too.
Output: DIR/config.json, model.safetensors and the tokenizer files (hf_io.save_hf), DIR/sft.json (the
settings, rows, steps, first and last loss, seconds).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax

import hf_io
import model
import prompts


@dataclass(frozen=True)
class Config:
    """An SFT run."""
    model: str = ""
    """the starting checkpoint: a Hugging Face folder (required)"""
    data: str = ""
    """JSON lines of prompt/completion or messages rows (required)"""
    out: str = ""
    """directory the fine-tuned checkpoint is written to (required)"""
    epochs: float = 2.0
    """passes over the rows (steps = ceil(epochs x rows / batch_size)), unless --steps is given"""
    steps: int = 0
    """optimizer steps; 0 = from --epochs"""
    batch_size: int = 64
    """rows per step"""
    lr: float = 3e-4
    """peak AdamW learning rate (linear warm-up over 5% of the steps, then cosine decay to 10%)"""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay"""
    prompt_loss_weight: float = 0.0
    """weight of the loss on prompt tokens relative to completion tokens (0 = completions only)"""
    prompt_format: str = ""
    """"completion" or "chat" (prompts.py); "" = chat when the checkpoint has a chat template"""
    seed: int = 0
    """the order rows are drawn in"""

    def __post_init__(self):
        for name in ("model", "data", "out"):
            if not getattr(self, name):
                raise ValueError(f"--{name} is required")
        if not os.path.isfile(os.path.join(self.model, "config.json")):
            raise ValueError(f"--model {self.model!r} is not a checkpoint folder (no config.json there)")
        if self.batch_size < 1 or self.steps < 0 or not self.epochs > 0 or not self.lr > 0:
            raise ValueError("--batch-size must be >= 1, --steps >= 0, --epochs and --lr > 0")
        if self.prompt_loss_weight < 0 or self.weight_decay < 0:
            raise ValueError("--prompt-loss-weight and --weight-decay must be >= 0")
        if self.prompt_format not in ("",) + prompts.FORMATS:
            raise ValueError(f"--prompt-format must be one of {prompts.FORMATS} or ''")


# ----------------------------------------------------------------------------- rows -> tokens (pure)

def read_rows(path: str) -> list[dict]:
    """Every row of a JSON-lines file; a line that is not a prompt/completion or messages object raises
    ValueError naming the file and line (blank lines are skipped)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from None
            ok = isinstance(row, dict) and (
                (isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str)) or
                (isinstance(row.get("messages"), list) and len(row["messages"]) >= 2 and
                 all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in row["messages"]) and
                 row["messages"][-1].get("role") == "assistant"))
            if not ok:
                raise ValueError(f"{path}:{n}: a row is {{\"prompt\": str, \"completion\": str}} or "
                                 f"{{\"messages\": [..., {{\"role\": \"assistant\", \"content\": str}}]}}")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def tokenize(row: dict, tok, fmt: str, template=None) -> tuple[list, list]:
    """(prompt ids, completion ids) of a row, tokenized apart as the sampler sees them (module docstring)."""
    if fmt == "completion":
        if "messages" in row:
            raise ValueError("a messages row needs the chat format (a checkpoint with a chat template)")
        return tok.encode(row["prompt"]), tok.encode(row["completion"])
    messages = row.get("messages") or [{"role": "user", "content": row["prompt"]},
                                       {"role": "assistant", "content": row["completion"]}]
    prompt = prompts.render_chat(template, messages[:-1], add_generation_prompt=True)
    end = prompts.end_of_turn_id(template, tok)
    if end is None:
        raise ValueError("the chat template names no end-of-turn token this tokenizer has")
    return tok.encode(prompt), tok.encode(messages[-1]["content"]) + [end]


def batch(pairs: list, seq_len: int, pad_id: int, prompt_loss_weight: float = 0.0):
    """Teacher-forcing batch of (prompt ids, completion ids) pairs: tokens_RT (prompt + completion,
    padded) and weight_RT, the weight of predicting tokens_RT[b, t] from tokens_RT[b, :t] (the indexing
    of model.token_logprobs): 1 on completion tokens, prompt_loss_weight on prompt tokens after the
    first, 0 on padding."""
    tokens_RT = np.full((len(pairs), seq_len), pad_id, np.int32)
    weight_RT = np.zeros((len(pairs), seq_len), np.float32)
    for b, (prompt, completion) in enumerate(pairs):
        n = len(prompt) + len(completion)
        if n > seq_len:
            raise ValueError(f"row {b}: {n} tokens > seq_len {seq_len}")
        tokens_RT[b, :n] = list(prompt) + list(completion)
        weight_RT[b, 1:len(prompt)] = prompt_loss_weight
        weight_RT[b, len(prompt):n] = 1.0
    return tokens_RT, weight_RT


# ----------------------------------------------------------------------------- the training step

def optimizer(lr: float, steps: int, weight_decay: float):
    """AdamW, gradients clipped to norm 1, linear warm-up over 5% of the steps then cosine decay to lr/10."""
    warm = max(1, steps // 20)
    sched = optax.warmup_cosine_decay_schedule(0.0, lr, warm, max(steps, warm + 1), end_value=lr * 0.1)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=weight_decay))


def make_train_step(mcfg, opt):
    """One AdamW step on float32 master weights; the forward runs on their cast to mcfg.dtype (the sampler's).

    Supervised learning needs no bitwise parity with a sampler, so the step uses the plain forward
    (bf16_fix=False): no remat and no fixed rounding points, so it is the cheaper step.
    """
    run_dtype = jnp.dtype(mcfg.dtype)
    mcfg = dataclasses.replace(mcfg, bf16_fix=False)

    def loss_fn(master, tokens_RT, weight_RT):
        params = jax.tree.map(lambda a: a.astype(run_dtype), master)
        logp_RT = model.token_logprobs(params, mcfg, tokens_RT, 1.0)
        return -(logp_RT * weight_RT).sum() / weight_RT.sum()

    @jax.jit
    def step(master, opt_state, tokens_RT, weight_RT):
        loss, grads = jax.value_and_grad(loss_fn)(master, tokens_RT, weight_RT)
        updates, opt_state = opt.update(grads, opt_state, master)
        return optax.apply_updates(master, updates), opt_state, loss
    return step


# ----------------------------------------------------------------------------- main

def main(cfg: Config, log=print) -> dict:
    t0 = time.time()
    mcfg, params = hf_io.load_hf(cfg.model)
    tok = hf_io.load_tokenizer(cfg.model)
    fmt, template = prompts.prompt_format(cfg.model, cfg.prompt_format)
    pairs = []
    for n, row in enumerate(read_rows(cfg.data), 1):
        try:
            pairs.append(tokenize(row, tok, fmt, template))
        except ValueError as e:
            raise ValueError(f"{cfg.data}: row {n}: {e}") from None
    longest = max(len(p) + len(c) for p, c in pairs)
    if longest > mcfg.max_seq_len:
        raise ValueError(f"{cfg.data}: a row of {longest} tokens is longer than the model's max_seq_len "
                         f"{mcfg.max_seq_len}")
    seq_len = min(mcfg.max_seq_len, 8 * math.ceil(longest / 8))  # one shape: one compile
    steps = cfg.steps or math.ceil(cfg.epochs * len(pairs) / cfg.batch_size)
    opt = optimizer(cfg.lr, steps, cfg.weight_decay)
    master = jax.tree.map(lambda a: a.astype(jnp.float32), params)
    opt_state, step = opt.init(master), make_train_step(mcfg, opt)
    rng, order, losses = np.random.default_rng(cfg.seed), np.zeros(0, int), []
    log(f"sft: {len(pairs)} rows ({fmt} format, seq_len {seq_len}), {steps} steps x {cfg.batch_size} rows "
        f"from {cfg.model}")
    for i in range(steps):
        while len(order) < cfg.batch_size:  # epochs of shuffled rows, back to back
            order = np.concatenate([order, rng.permutation(len(pairs))])
        take, order = order[:cfg.batch_size], order[cfg.batch_size:]
        tokens_RT, weight_RT = batch([pairs[j] for j in take], seq_len, tok.pad_id, cfg.prompt_loss_weight)
        master, opt_state, loss = step(master, opt_state, jnp.asarray(tokens_RT), jnp.asarray(weight_RT))
        losses.append(float(loss))
        if i % 20 == 0 or i == steps - 1:
            log(f"sft: step {i:4d}  loss {losses[-1]:.4f}  {time.time() - t0:6.1f}s")
    tmp = cfg.out.rstrip("/") + ".tmp"  # whole or absent: written beside, renamed into place
    shutil.rmtree(tmp, ignore_errors=True)
    hf_io.save_hf(tmp, mcfg, jax.tree.map(lambda a: a.astype(jnp.dtype(mcfg.dtype)), master),
                  tokenizer_from=cfg.model)
    info = {"sft": dataclasses.asdict(cfg), "rows": len(pairs), "format": fmt, "seq_len": seq_len,
            "steps": steps, "loss_first": losses[0], "loss_last": losses[-1], "seconds": round(time.time() - t0, 1)}
    with open(os.path.join(tmp, "sft.json"), "w") as f:
        json.dump(info, f, indent=1)
    shutil.rmtree(cfg.out, ignore_errors=True)
    os.replace(tmp, cfg.out)
    log(f"sft: wrote {cfg.out} (loss {losses[0]:.4f} -> {losses[-1]:.4f}, {info['seconds']:.0f} s)")
    return info


if __name__ == "__main__":
    import cli
    config = cli.parse(Config, description=__doc__.split("\n\n")[0])
    try:
        main(config)
    except (ValueError, OSError) as e:
        raise SystemExit(f"sft.py: error: {e}")
