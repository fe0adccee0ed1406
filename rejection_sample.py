"""Rejection sampling: the policy's own verified-right completions of training problems, as an SFT dataset.

    python rejection_sample.py --model runs/x/final --out runs/x/rejection              # the embedded task
    python rejection_sample.py --model CKPT --data train.jsonl --k 8 --keep 2 --out DIR   # a dataset

Stage 3 of the R1 recipe (DeepSeek-AI 2025, section 2.3.3; docs/algorithm.md): sample the RL policy k
times per training problem, keep what the verifier passes, and fine-tune on it (sft.py). What the
policy finds in k samples becomes what it writes in its first: the step distils pass@k into pass@1.

What it does:
  1. The training problems, exactly as curate.py takes them: a dataset's training split (the held-out
     rows are never sampled), or the first --problems distinct problems of the embedded stream of --seed.
  2. --k completions per problem, built, cut and scored exactly as the workers and the verifier do
     (curate.sample_and_verify: the trainer's work items, sampler.py, envs.score_jobs, verifier.py in a
     process of its own). Only a completion the verifier PASSED is kept: a wrong, crashed or timed-out
     one never is, and an infrastructure failure (no verdict) is neither right nor kept.
  3. Per problem, the passed completions are deduplicated (the same text after trailing whitespace is
     one completion) and at most --keep of them kept, picked by --pick:
       random (default): a uniform draw among the distinct right ones, seeded. The kept set is then a
         sample of the policy's own right answers, so SFT moves the policy towards its distribution
         conditioned on being right (rejection sampling's target), without a preference of ours.
       shortest: the shortest first (ties in sampling order). A length preference: R1 filtered its
         rejection samples for readability; here it also biases the policy towards short programs.
Outputs under --out (written beside and renamed into place: the folder is whole or absent):
  sft.jsonl         the SFT rows sft.py reads: {"prompt", "completion"} in the completion format (the
                    prompt is the text the model continued), {"messages"} in the chat format (the
                    problem's messages, then the assistant's answer); plus "item_id" and "passed_of_k"
  pass_rates.jsonl  one line per problem, as curate.py writes it (k valid samples, passed, rate)
  report.json       problems, samples, how many passed, problems with a kept row, rows, duplicates
                    dropped, the pass-rate histogram and mean, the settings and seconds; printed too
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from dataclasses import dataclass

import numpy as np

import cli
import curate
import prompts
import tasks
import workitems

PICKS = ("random", "shortest")


@dataclass
class Config(curate.Sampling):
    """Rejection-sampling settings: curate.Sampling's (the trainer's defaults), then what is kept."""
    keep: int = 2
    """at most this many distinct right completions kept per problem"""
    pick: str = "random"
    """which right completions are kept when more than --keep: random or shortest (module docstring)"""

    def __post_init__(self):
        super().__post_init__()
        if self.keep < 1:
            raise ValueError(f"--keep must be >= 1, got {self.keep}")
        if self.pick not in PICKS:
            raise ValueError(f"--pick must be one of {PICKS}, got {self.pick!r}")


def pick(right: list, keep: int, how: str, rng) -> tuple[list, int]:
    """(the kept texts, duplicates dropped) from one problem's passed completions, in sampling order."""
    distinct = list(dict.fromkeys(t.rstrip() for t in right))
    firsts = [next(t for t in right if t.rstrip() == d) for d in distinct]  # each text as it was sampled
    if how == "shortest":
        kept = sorted(firsts, key=len)[:keep]  # sorted() is stable: ties stay in sampling order
    else:
        kept = [firsts[i] for i in sorted(rng.permutation(len(firsts))[:keep])]
    return kept, len(right) - len(distinct)


def sft_row(problem, completion: str, fmt: str, template, passed_of_k: str) -> dict:
    """An sft.py row that gives the model exactly the prompt the worker gave it."""
    prompt = workitems.prompt_text(problem, fmt, template)
    if fmt == "completion":
        row = {"prompt": prompt, "completion": completion}
    else:
        messages = json.loads(problem.messages) if getattr(problem, "messages", "") else \
            [{"role": "user", "content": prompts.user_message(problem)}]
        if prompts.render_chat(template, messages, add_generation_prompt=True) != prompt:
            raise ValueError(f"problem {problem.item_id!r}: its messages do not render to the prompt the "
                             f"worker sampled from")
        row = {"messages": messages + [{"role": "assistant", "content": completion}]}
    return {**row, "item_id": problem.item_id, "passed_of_k": passed_of_k}


def main(cfg: Config, log=print) -> dict:
    t0 = time.time()
    if cfg.data:
        problems, held, _ = curate.dataset_problems(cfg.data, cfg.heldout)
        every, source = problems + held, f"{cfg.data}: its training split, {len(problems)} problems"
    else:
        problems = every = curate.embedded_problems(cfg.problems, cfg.seed)
        source = f"the embedded task: the first {len(problems)} distinct training problems of seed {cfg.seed}"
    policy = curate.load_policy(cfg.model, cfg.prompt_format, cfg.dtype)
    T = curate.seq_len(policy, every, cfg.max_new_tokens, bool(cfg.data))
    log(f"rejection_sample: {source}; {cfg.k} samples each from {cfg.model} ({policy.fmt} format)")
    samples = curate.sample_and_verify(policy, problems, cfg.k, T, cfg.seed, cfg.temperature, cfg.max_new_tokens,
                                       cfg.batch_rows, log=log)
    rng, rows, rates, duplicates = np.random.default_rng(cfg.seed), [], [], 0
    for p, got in zip(problems, samples):
        if got is None:
            rates.append(curate.PassRate(tasks.problem_key(p), p.item_id, k=0, passed=0, too_long=True))
            continue
        rates.append(rate := curate.tally(tasks.problem_key(p), p.item_id, [(ok, s) for _, ok, s in got]))
        kept, dropped = pick([t for t, ok, _ in got if ok], cfg.keep, cfg.pick, rng)
        duplicates += dropped
        rows += [sft_row(p, t, policy.fmt, policy.template, f"{rate.passed}/{rate.k}") for t in kept]
    summary = curate.summarize(rates, cfg.k, curate.Band(0.0, 1.0, True, True))
    report = {"source": source, "model": cfg.model, "format": policy.fmt, "problems": len(problems),
              "samples": sum(r.k for r in rates), "passed": sum(r.passed for r in rates),
              "problems_kept": len({r["item_id"] for r in rows}), "rows": len(rows), "duplicates": duplicates,
              "mean_pass_rate": summary["mean_rate_before"], "histogram": summary["histogram"],
              "settings": dataclasses.asdict(cfg), "seconds": round(time.time() - t0, 1)}
    tmp = cfg.out.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    with open(os.path.join(tmp, "sft.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    with open(os.path.join(tmp, "pass_rates.jsonl"), "w") as f:
        f.writelines(json.dumps(r.to_json()) + "\n" for r in rates)
    with open(os.path.join(tmp, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    shutil.rmtree(cfg.out, ignore_errors=True)
    os.replace(tmp, cfg.out)
    log(f"rejection_sample: {report['passed']}/{report['samples']} samples passed (mean pass rate "
        f"{report['mean_pass_rate']:.3f}); kept {report['rows']} rows of {report['problems_kept']}/"
        f"{report['problems']} problems ({duplicates} duplicates dropped) in {report['seconds']:.0f} s -> {cfg.out}")
    return report


if __name__ == "__main__":
    config = cli.parse(Config, description=__doc__.split("\n\n")[0])
    try:
        main(config)
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"rejection_sample.py: error: {e}")
