"""Asynchrony: steps per minute and held-out pass@1 / pass@8 after the same wall time, for
MAX_STALENESS 0, 1, 2 and auto with the same workers (launch.sh's default run: 2 workers, 1 verifier).

Run:  python bench/bench_async.py --seconds 120          # 4 runs of 120 s + evaluations (~11 min)
      python bench/bench_async.py --staleness 0 2 --seconds 60 --keep-dir /tmp/async

Each run: bash launch.sh with STEPS large (10000), the default recipe (k3 KL beta 0.2, DAPO dynamic
sampling, lr 1e-4), a tiny start-of-run evaluation (8 problems, 1 sample: not used here), stopped after
--seconds of wall time: SIGTERM to the trainer (it finishes its step, checkpoints and exits), then to
launch.sh's process group. Steps counted are those done by then (the step in flight when the stop
came is finished and kept, a few seconds more). Its
newest checkpoint is then evaluated here, the same way for every run: --heldout held-out problems
(tasks.heldout_problems), 8 samples each at temperature 1 by model.generate (the sampler), the programs
run by verifier.verify_batch; pass@k by grpo.pass_at_k_array. The cold-start policy is evaluated the
same way (pass1_start). steps/min = steps done / wall minutes of the run (startup and compile included,
which is the same for every run). The runs are much shorter than a real run (250 steps): a SHORT run.

Prints `RESULT name=asynchrony staleness=k steps=.. wall_s=.. steps_per_min=.. pass1=.. pass8=..`.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from bench_e2e_trl import metrics, run_launch  # noqa: E402


def load_policy(run_dir: str | None):
    """(cfg, params) of a run's newest checkpoint, or of the cold start (run_dir None)."""
    import hf_io
    import checkpointing
    import trainer
    cfg, params = hf_io.load_hf(os.path.join(ROOT, "checkpoints/coldstart"))
    if run_dir is None:
        return cfg, params
    master = trainer.cast_params(params, "float32")
    tensors, meta = checkpointing.read_checkpoint(run_dir, master)
    flat = {k[len("master/"):]: v for k, v in tensors.items() if k.startswith("master/")}
    return cfg, trainer.cast_params(checkpointing._unflat(master, flat), cfg.jdtype)


def evaluate(cfg, params, n_problems: int, n_samples: int = 8, seed: int = 0) -> dict:
    import jax
    import numpy as np
    import grpo
    import hf_io
    import prompts
    import tasks
    import verifier
    tok = hf_io.ByteTokenizer()
    probs = tasks.heldout_problems(n_problems)
    L = 16
    ids = [tok.encode(prompts.model_prompt(p, "completion")) for p in probs]
    T = 1 << (max(map(len, ids)) + L - 1).bit_length()
    T = min(max(T, 64), cfg.max_seq_len)
    rows = [(j, i) for j, i in enumerate(ids) for _ in range(n_samples)]
    prompt_BT = np.full((len(rows), T), tok.pad_id, np.int32)
    plen = np.zeros(len(rows), np.int32)
    for r, (_, i) in enumerate(rows):
        prompt_BT[r, :len(i)], plen[r] = i, len(i)
    out = {}
    for lo in range(0, len(rows), 256):
        o = __import__("model").generate(params, cfg, prompt_BT[lo:lo + 256], plen[lo:lo + 256],
                                         jax.random.key(seed + lo), max_new_tokens=L, eos_id=10, pad_id=tok.pad_id)
        for k, v in o.items():
            out.setdefault(k, []).append(v)
    out = {k: np.concatenate(v) for k, v in out.items()}
    jobs = []
    for r, (j, _) in enumerate(rows):
        p = probs[j]
        comp = out["tokens_BT"][r][plen[r]:plen[r] + int(out["completion_len_B"][r])]
        text = tok.decode(comp)
        jobs.append({"kind": "assert", "program": prompts.assemble_program(
            "completion", prompts.program_prefix(p, "completion"), text, tuple(prompts.stop_strings(p, "completion"))),
            "tests": p.tests, "timeout_s": 5.0})
    verdicts = verifier.verify_batch(jobs, workers=2)
    correct = np.array([sum(verdicts[j * n_samples + s].reward >= 1.0 for s in range(n_samples))
                        for j in range(len(probs))])
    n = np.full_like(correct, n_samples)
    return {"pass1": float(grpo.pass_at_k_array(n, correct, 1).mean()),
            "pass8": float(grpo.pass_at_k_array(n, correct, 8).mean())}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--staleness", nargs="+", default=["0", "1", "2", "auto"],
                    help="MAX_STALENESS values: numbers of versions, or auto (the bound that sets itself)")
    ap.add_argument("--seconds", type=float, default=120.0, help="wall time of each run")
    ap.add_argument("--heldout", type=int, default=64, help="held-out problems per evaluation")
    ap.add_argument("--keep-dir", default="", help="keep the run dirs here (staleness-<k>), for the breakdown part")
    args = ap.parse_args()
    keep = args.keep_dir or tempfile.mkdtemp(prefix="rlax-async-")
    os.makedirs(keep, exist_ok=True)
    t0 = time.monotonic()
    start = evaluate(*load_policy(None), args.heldout)
    print(f"cold start: held-out pass@1 {start['pass1']:.3f} pass@8 {start['pass8']:.3f} "
          f"({args.heldout} problems x 8 samples; {time.monotonic() - t0:.0f} s)", flush=True)
    for k in args.staleness:
        run_dir = os.path.join(keep, f"staleness-{k}")
        shutil.rmtree(run_dir, ignore_errors=True)
        wall = run_launch(run_dir, 10000, {"MAX_STALENESS": str(k), "EVAL": "--heldout 8 --eval-every 0",
                                           "RECIPE": "--kl-beta 0.2 --dynamic-sampling --lr 1e-4",
                                           "TRAINER_ARGS": "--eval-samples 1 --no-eval-greedy"},
                          timeout_s=args.seconds + 120, stop_after_s=args.seconds)
        rows = [r for r in metrics(run_dir) if r.get("step", 0) > 0]
        steps = max((r["step"] for r in rows), default=0)
        try:
            ev = evaluate(*load_policy(run_dir), args.heldout)
        except FileNotFoundError as e:
            print(f"staleness {k}: no checkpoint ({e})", flush=True)
            ev = {"pass1": float("nan"), "pass8": float("nan")}
        stale = [r.get("staleness/mean", 0.0) for r in rows]
        limits = [r["staleness/limit"] for r in rows if "staleness/limit" in r]
        print(f"staleness {k}: {steps} steps in {wall:.0f} s; held-out pass@1 {ev['pass1']:.3f} pass@8 {ev['pass8']:.3f}",
              flush=True)
        print(f"RESULT name=asynchrony staleness={k} steps={steps} wall_s={wall:.1f} "
              f"steps_per_min={steps / wall * 60:.2f} pass1={ev['pass1']:.4f} pass8={ev['pass8']:.4f} "
              f"pass1_start={start['pass1']:.4f} pass8_start={start['pass8']:.4f} heldout={args.heldout} "
              f"mean_staleness={(sum(stale) / len(stale) if stale else 0):.3f} "
              f"max_limit={max(limits, default=0)} run_dir={run_dir}", flush=True)


if __name__ == "__main__":
    main()
