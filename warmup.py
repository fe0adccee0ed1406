"""Cold start: a short supervised warm-up of a tiny byte-level model on the embedded task, before GRPO.

DeepSeek-R1 fine-tuned its base model on a small set of cold-start examples before RL (DeepSeek-AI 2025,
section 2.3.1), because RL from a policy that never succeeds gets no signal: with binary rewards a
group whose completions all fail has zero advantage. A randomly initialised model never writes
`2*x+1`, so we teach it the format and a first, weak version of the skill by supervised learning on
the reference solutions of TRAINING problems (tasks.train_problems; the held-out split is never
seen), then stop early on purpose: the cold-start policy should solve some held-out problems
(pass@1 roughly 10-20%) and solve more when sampled several times (pass@8 clearly higher), which is
the room RL needs.

Precision: the weights are trained in float32 (Adam on bf16 weights loses small updates) and saved
as the model's bf16 parameters (`ModelConfig.dtype="bfloat16"`), which is what the sampler and the
trainer run; the held-out numbers printed at the end are measured on the saved bf16 weights, loaded
back from disk.

Loss: next-byte cross-entropy on the completion, plus `prompt_loss_weight` times the loss on the
prompt bytes (predicting f(2) from f(-1), f(0) and f(1) in the prompt is the same skill, so the
examples are free extra supervision).

Run (the committed checkpoint, two stages: 400 steps from scratch, then 125 more at a lower peak lr):
    python warmup.py --out checkpoints/coldstart
    python warmup.py --init checkpoints/coldstart --first-problem 25600 --steps 125 --lr 1e-3 \
                     --out checkpoints/coldstart
About 3.3 + 1.3 minutes on a quiet 2-core CPU (warmup.json records both stages, the first under "init").
Why stop there: in stage 1 the loss plateaus near 0.29 (held-out pass@1 0.05); at the lower lr of
stage 2 it falls once the model finds the rules, to 0.13 after 400 steps (pass@1 0.62, pass@8 0.98:
little left for RL to do). After 125 steps the policy solves some held-out problems (pass@1 about
0.16) and many more when sampled 8 times (pass@8 about 0.7): the room RL needs (docs/task.md has the whole curve).
How much can RL add to a checkpoint, and where (held-out and training pass@1 sampled and greedy, and
what the wrong answers get wrong; about a minute):
    python warmup.py --report checkpoints/coldstart --eval-problems 256
Output: <out>/config.json + model.safetensors (hf_io.save_hf), <out>/warmup.json (task, sequence and
sampling settings, and the measured held-out pass@1/pass@8).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

import hf_io
import model
import objectives
import sampler
import sft
import tasks
from verdicts import INFRA_ERROR

# ----------------------------------------------------------------------------- config


@dataclass(frozen=True)
class WarmupConfig:
    """The cold-start run. Defaults are stage 1 of the committed checkpoints/coldstart (see the docstring)."""

    out: str = "checkpoints/coldstart"
    """Directory the checkpoint is written to."""
    seed: int = 0
    """Seed of the initialisation, the training problem stream and the evaluation samples."""
    init: str = ""
    """Continue from this checkpoint folder instead of a random initialisation ("" = from scratch)."""
    first_problem: int = 0
    """Index of the first training problem (a continued run starts where the previous one stopped)."""
    steps: int = 400
    """Supervised steps (batch of `batch_size` training problems each)."""
    batch_size: int = 64
    """Sequences per supervised step."""
    lr: float = 3e-3
    """Peak Adam learning rate (linear warm-up over 5% of the steps, then cosine decay to 10%)."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    prompt_loss_weight: float = 0.1
    """Weight of the next-byte loss on prompt bytes relative to completion bytes."""
    hidden_size: int = 128
    """D: model width. The default model has about 0.8M parameters."""
    num_layers: int = 4
    """Decoder layers."""
    num_heads: int = 4
    """N: query heads."""
    num_kv_heads: int = 2
    """K: key/value heads (grouped-query attention)."""
    intermediate_size: int = 384
    """F: SwiGLU hidden width."""
    prompt_len: int = 72
    """Longest prompt in tokens (the longest embedded prompt is 64 bytes); sequences are prompt_len + max_new_tokens."""
    max_new_tokens: int = 16
    """Completion budget when sampling (the longest reference solution is 13 bytes)."""
    temperature: float = 1.0
    """Sampling temperature of the evaluation, the same the RL workers sample at."""
    eval_problems: int = 128
    """Held-out problems in the final evaluation."""
    eval_skip: int = 0
    """--report only: skip the first this many held-out problems (256 skips those launch.sh evaluates on)"""
    eval_samples: int = 8
    """Samples per held-out problem (n of the pass@k estimator; must be >= 8 for pass@8)."""
    report: str = ""
    """Train nothing: measure this checkpoint's room for RL (see report()) on eval_problems problems"""

    def __post_init__(self):
        for name in ("steps", "batch_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "intermediate_size", "max_new_tokens", "eval_problems"):
            if getattr(self, name) < 1:
                raise ValueError(f"WarmupConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_skip < 0:
            raise ValueError(f"WarmupConfig.eval_skip must be >= 0, got {self.eval_skip}")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"WarmupConfig: hidden_size {self.hidden_size} must divide by num_heads "
                             f"{self.num_heads}, which must divide by num_kv_heads {self.num_kv_heads}")
        if not self.lr > 0 or self.prompt_loss_weight < 0 or not self.temperature > 0:
            raise ValueError("WarmupConfig: lr and temperature must be > 0, prompt_loss_weight >= 0")
        if self.eval_samples < 8:
            raise ValueError(f"WarmupConfig.eval_samples must be >= 8 to estimate pass@8, "
                             f"got {self.eval_samples}")

    def model_config(self, vocab_size: int) -> "model.ModelConfig":
        return model.ModelConfig(
            vocab_size=vocab_size, hidden_size=self.hidden_size, num_layers=self.num_layers,
            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
            head_dim=self.hidden_size // self.num_heads, intermediate_size=self.intermediate_size,
            max_seq_len=self.prompt_len + self.max_new_tokens, rope_theta=10000.0, rms_norm_eps=1e-6,
            qkv_bias=False, tie_embeddings=True, model_type="llama", dtype="bfloat16")


# ----------------------------------------------------------------------------- batching (pure)

def encode_prompts(tok, problems: list, prompt_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompt bytes, right-padded with pad_id to prompt_len: (prompt_RT int32, prompt_len_R int32).

    No BOS: inference_worker.py encodes prompts as tokenizer.encode(prompt), as Qwen2 does, and the
    cold-start policy must see exactly what the workers will feed it.
    """
    rows = [tok.encode(p.prompt) for p in problems]
    too_long = [p.item_id for p, r in zip(problems, rows) if len(r) > prompt_len]
    if too_long:
        raise ValueError(f"{len(too_long)} prompt(s) longer than prompt_len={prompt_len} tokens, "
                         f"e.g. {too_long[0]!r}")
    prompt_RT = np.full((len(rows), prompt_len), tok.pad_id, np.int32)
    for b, r in enumerate(rows):
        prompt_RT[b, :len(r)] = r
    return prompt_RT, np.array([len(r) for r in rows], np.int32)


def sft_batch(tok, problems: list, seq_len: int, prompt_loss_weight: float):
    """Teacher-forcing batch of the problems' reference solutions (sft.batch): 1 on solution bytes,
    prompt_loss_weight on prompt bytes after the first, 0 on padding."""
    pairs = []
    for p in problems:
        prompt, sol = tok.encode(p.prompt), tok.encode(p.solution)
        if len(prompt) + len(sol) > seq_len:
            raise ValueError(f"problem {p.item_id!r} needs {len(prompt) + len(sol)} tokens > {seq_len}")
        pairs.append((prompt, sol))
    return sft.batch(pairs, seq_len, tok.pad_id, prompt_loss_weight)


# ----------------------------------------------------------------------------- evaluation

_verifier = None  # score()'s verifier_client.VerifierFleet, once verifier_service() started the service
VERIFY_CHUNK = 1024  # jobs per VerifyBatch (the service takes at most 4096 in one)


def verifier_service():
    """score()'s verifier: `verifier.py` (2 executors, its default isolation) in a process of its own,
    started on first use and stopped at exit; a client of it. Not verifier.verify_batch's pool in this
    process: that pool forks to clean up after its executors (isolation.kill_uid, as root), and a fork
    in a process where JAX runs may deadlock (JAX warns "os.fork() was called ..."). subprocess.Popen
    starts the service without a Python-level fork of this process. The client is the worker's
    (verifier_client.VerifierFleet, one address): checked verdicts, a second try, INFRA_ERROR if both fail."""
    global _verifier
    if _verifier is not None:
        return _verifier
    import atexit
    import socket
    import subprocess
    import sys
    import verifier_client
    import wire
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen([sys.executable, os.path.join(here, "verifier.py"), "--bind", addr, "--executors", "2"],
                            cwd=here, env={**os.environ, "JAX_PLATFORMS": "cpu"}, stdout=subprocess.DEVNULL)

    def stop():
        proc.terminate()  # the service closes its pool (and cleans up after it) on SIGTERM
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    atexit.register(stop)
    probe, deadline = wire.Client("warmup", addr, timeout_s=1.0), time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the verifier service did not start (exit status {proc.returncode}; "
                               f"its reason is on stderr above)")
        try:
            probe.call(wire.Ping(), what="verifier start")
            break
        except TimeoutError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the verifier service at {addr} did not answer within 120 s") from None
    probe.close()
    _verifier = verifier_client.VerifierFleet("warmup", [addr], timeout_s=600.0)
    return _verifier


def score(problems: list, completions: list[str]) -> np.ndarray:
    """Reward 1.0/0.0 per (problem, completion), executed in the verifier sandbox (verifier_service).
    Raises RuntimeError if the verifier could not judge a job: an infra_error is no wrong answer."""
    jobs = [{"kind": "assert", "program": p.program(c), "tests": p.tests, "timeout_s": 2.0}
            for p, c in zip(problems, completions)]
    fleet = verifier_service()
    verdicts = [v for s in range(0, len(jobs), VERIFY_CHUNK) for v in fleet.verify(jobs[s:s + VERIFY_CHUNK])]
    if lost := [v for v in verdicts if v.status == INFRA_ERROR]:
        raise RuntimeError(f"the verifier could not judge {len(lost)} of {len(jobs)} jobs: {lost[0].detail}")
    return np.array([float(v.passed) for v in verdicts], np.float32)


def sample(params, mcfg, tok, problems: list, key, n: int, prompt_len: int, max_new_tokens: int,
           temperature: float, chunk: int = 256) -> list[str]:
    """n completions per problem (problem-major order), decoded to text, in chunks of `chunk` rows."""
    rows = [p for p in problems for _ in range(n)]
    out = []
    for s in range(0, len(rows), chunk):
        part = rows[s:s + chunk]
        # generate() wants prompts padded to the full cache length T = prompt_len + max_new_tokens
        prompt_RT, len_R = encode_prompts(tok, part + part[-1:] * (chunk - len(part)),
                                          prompt_len + max_new_tokens)
        key, sub = jax.random.split(key)
        res = sampler.generate(params, mcfg, jnp.asarray(prompt_RT), jnp.asarray(len_R), sub,
                               max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0,
                               eos_id=tok.encode("\n")[0], pad_id=tok.pad_id)
        toks_RT, mask_RT = res.tokens_RT, res.mask_RT > 0
        out += [tok.decode(t[m].tolist()) for t, m in zip(toks_RT[:len(part)], mask_RT[:len(part)])]
    return out


def evaluate(params, mcfg, tok, problems: list, key, n: int = 8, prompt_len: int = 72,
             max_new_tokens: int = 16, temperature: float = 1.0) -> dict:
    """Held-out pass@1 and pass@8 (unbiased estimator over n samples per problem) and mean reward."""
    comps = sample(params, mcfg, tok, problems, key, n, prompt_len, max_new_tokens, temperature)
    r = score([p for p in problems for _ in range(n)], comps).reshape(len(problems), n)
    c = r.sum(1).astype(int)
    return {"pass@1": float(np.mean([objectives.pass_at_k(n, ci, 1) for ci in c])),
            "pass@8": float(np.mean([objectives.pass_at_k(n, ci, 8) for ci in c])),
            "reward/mean": float(r.mean()), "n": n, "problems": len(problems)}


def answer_error(problem: tasks.Problem, completion: str, passed: bool) -> str:
    """What a completion of a generated problem gets wrong: "right", "family" (another template),
    "offset" (right template, wrong b = f(0)), "coefficient" (right template and b, wrong a or m) or
    "malformed" (no template at all)."""
    family, coeffs = tasks.split_key(problem)
    if passed:
        return "right"
    text = completion.split("\n")[0].strip()
    for name, (template, _) in tasks.FAMILIES.items():
        pattern = re.escape(template).replace(re.escape("{b:+d}"), r"(?P<b>[+-]\d+)")
        pattern = pattern.replace(re.escape("{a}"), r"(?P<a>-?\d+)").replace(re.escape("{m}"), r"(?P<m>\d+)")
        m = re.fullmatch(pattern, text)
        if m:
            return "family" if name != family else "offset" if int(m["b"]) != coeffs["b"] else "coefficient"
    return "malformed"


def report(ckpt: str, n_problems: int = 256, seed: int = 0, prompt_len: int = 72, max_new_tokens: int = 16,
           skip: int = 0) -> dict:
    """How much RL could gain from this checkpoint, and where. On held-out problems and on as many training
    problems: pass@1/pass@8 sampled at temperature 1 (what RL samples and is evaluated at) and greedy
    pass@1 (the policy's mode). RL at temperature 1 sharpens the policy towards its mode, so greedy
    minus sampled pass@1 is what sharpening alone can add; more has to be learned. Plus what the wrong
    held-out samples get wrong (answer_error)."""
    tok, (mcfg, params) = hf_io.ByteTokenizer(), hf_io.load_hf(ckpt)
    out = {}
    for split, problems in (("heldout", tasks.heldout_problems(skip + n_problems)[skip:]),
                            ("train", tasks.train_problems(seed + 1000).batch(0, n_problems))):
        key = jax.random.PRNGKey(seed + 7)
        comps = sample(params, mcfg, tok, problems, key, 8, prompt_len, max_new_tokens, 1.0)
        r = score([p for p in problems for _ in range(8)], comps).reshape(len(problems), 8)
        greedy = sample(params, mcfg, tok, problems, key, 1, prompt_len, max_new_tokens, 0.0)
        c = r.sum(1).astype(int)
        out[split] = {"pass@1": float(r.mean()), "pass@8": float(np.mean([objectives.pass_at_k(8, ci, 8) for ci in c])),
                      "greedy_pass@1": float(score(problems, greedy).mean())}
        if split == "heldout":
            errors = [answer_error(p, comp, bool(ok)) for p, comp, ok in
                      zip([p for p in problems for _ in range(8)], comps, r.reshape(-1))]
            out["heldout_samples"] = {k: errors.count(k) / len(errors) for k in
                                      ("right", "coefficient", "family", "offset", "malformed")}
    for split in ("heldout", "train"):
        o = out[split]
        print(f"{split:8s} ({n_problems} problems): pass@1 {o['pass@1']:.3f}  pass@8 {o['pass@8']:.3f}  "
              f"greedy pass@1 {o['greedy_pass@1']:.3f}  (sharpening room {o['greedy_pass@1'] - o['pass@1']:+.3f})")
    print("held-out samples: " + ", ".join(f"{k} {v:.3f}" for k, v in out["heldout_samples"].items()))
    return out


# ----------------------------------------------------------------------------- training

def main(cfg: WarmupConfig) -> dict:
    tok = hf_io.ByteTokenizer()
    mcfg = cfg.model_config(tok.vocab_size)
    key = jax.random.PRNGKey(cfg.seed)
    init_info = None
    if cfg.init:
        init_cfg, init_params = hf_io.load_hf(cfg.init)
        init_json = os.path.join(cfg.init, "warmup.json")
        if os.path.exists(init_json):
            with open(init_json) as f:
                init_info = json.load(f)
        if init_cfg != mcfg:
            raise ValueError(f"--init {cfg.init}: its config {init_cfg} differs from this run's {mcfg}")
    else:
        init_params = model.init_params(mcfg, key)
    master = jax.tree.map(lambda a: a.astype(jnp.float32), init_params)
    n_params = sum(a.size for a in jax.tree.leaves(master))
    opt = sft.optimizer(cfg.lr, cfg.steps, cfg.weight_decay)
    opt_state = opt.init(master)
    step = sft.make_train_step(mcfg, opt)  # the supervised step every SFT here uses
    stream = tasks.train_problems(cfg.seed)
    seq_len = cfg.prompt_len + cfg.max_new_tokens
    print(f"warmup: {n_params / 1e6:.2f}M parameters, {cfg.steps} steps x {cfg.batch_size} problems", flush=True)
    t0 = time.time()
    for i in range(cfg.steps):
        problems = stream.batch(cfg.first_problem + i * cfg.batch_size, cfg.batch_size)
        tokens_RT, weight_RT = sft_batch(tok, problems, seq_len, cfg.prompt_loss_weight)
        master, opt_state, loss = step(master, opt_state, jnp.asarray(tokens_RT), jnp.asarray(weight_RT))
        if i % 50 == 0 or i == cfg.steps - 1:
            print(f"step {i:4d}  loss {float(loss):.4f}  {time.time() - t0:6.1f}s", flush=True)
    train_s = time.time() - t0

    params = jax.tree.map(lambda a: a.astype(jnp.dtype(mcfg.dtype)), master)
    hf_io.save_hf(cfg.out, mcfg, params)
    mcfg2, params = hf_io.load_hf(cfg.out)
    t1 = time.time()
    ev = evaluate(params, mcfg2, tok, tasks.heldout_problems(cfg.eval_problems), jax.random.PRNGKey(cfg.seed + 1),
                  cfg.eval_samples, cfg.prompt_len, cfg.max_new_tokens, cfg.temperature)
    info = {"warmup": dataclasses.asdict(cfg), "task": dataclasses.asdict(tasks.TaskConfig()),
            "params": int(n_params), "train_s": round(train_s, 1), "eval_s": round(time.time() - t1, 1),
            "heldout": ev, "eos": "\n"}
    if init_info is not None:  # a continued warm-up keeps the record of the stage it started from
        info["init"] = init_info
    with open(os.path.join(cfg.out, "warmup.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"held-out ({ev['problems']} problems x {ev['n']} samples, T={cfg.temperature}): "
          f"pass@1 {ev['pass@1']:.3f}  pass@8 {ev['pass@8']:.3f}  (train {train_s:.0f}s)", flush=True)
    return info


# ----------------------------------------------------------------------------- main

if __name__ == "__main__":
    import cli
    config = cli.parse(WarmupConfig, description=__doc__.split("\n\n")[0])
    if config.report:
        report(config.report, config.eval_problems, config.seed, config.prompt_len, config.max_new_tokens,
               config.eval_skip)
    else:
        main(config)
