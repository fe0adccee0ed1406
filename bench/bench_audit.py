"""What checking untrusted workers costs the trainer: one training step with and without the checks.

Run:  python bench/bench_audit.py                  # the embedded cold start, B=16 prompts x G=8, ~2 min on 2 cores
      python bench/bench_audit.py --repeats 9 --prompts 32

Real rollouts: the cold-start policy samples B training items of the embedded task (G rows each, keys from
the items, the trainer's defaults for length and temperature), cut at their stop strings as a worker cuts
them, each verdict sealed as the verifier seals it (attest.py). Then, alternating, medians of --repeats:
  step     the GRPO update on that batch (update.make_update, the trainer's defaults, one microbatch)
  seal     param_server.WorkQueue.check_seals on every rollout (the param server's work at submit)
  text     audit.check_texts on every rollout (the trainer's, every rollout)
  logp     audit.check_logprobs with the trainer's forward (update.Update.old_logprobs) on every rollout
  draw     audit.check_tokens: every rollout's rows drawn again (sampler.generate) and compared
The trainer's time per step with the checks = step + text + audit_frac x (logp + draw), all of a batch's
rollouts (seal runs in the param server, beside the trainer). Each figure is for the whole batch.

Prints `RESULT name=audit size=coldstart rollouts=B step_s= text_s= logp_s= draw_s= seal_s= overhead_default=
overhead_all=` (overhead: the checks' share of the step at --audit-frac 0.125 and at 1).
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import optax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import attest  # noqa: E402
import audit  # noqa: E402
import envs  # noqa: E402
import grpo  # noqa: E402
import hf_io  # noqa: E402
import param_server  # noqa: E402
import prompts  # noqa: E402
import sampler  # noqa: E402
import tasks  # noqa: E402
import trainer_config  # noqa: E402
import update  # noqa: E402
import wire  # noqa: E402
import workitems  # noqa: E402

MODEL = os.path.join(os.path.dirname(__file__), "..", "checkpoints", "coldstart")


def rollouts(params, mcfg, tok, cfg, B: int, G: int, T: int, key: bytes, fmt: str, template):
    """B items of the embedded stream, each sampled G times and sealed: (items as dicts, Rollouts)."""
    stream, items, out = tasks.train_problems(cfg.seed), [], []
    for i in range(B):
        problem = stream[i]
        item = workitems.problem_item(problem, f"train/{i}|{problem.item_id}", cfg, G, T, 0, fmt=fmt, template=template)
        item.lease = f"lease{i}"
        prompt_RT, prompt_len_R = sampler.build_prompts([item], tok, G, tok.pad_id)
        s = sampler.generate(params, mcfg, prompt_RT, prompt_len_R, sampler.row_keys(cfg.seed, [item], 0, G),
                             max_new_tokens=item.max_new_tokens, temperature=item.temperature, top_p=item.top_p,
                             eos_id=sampler.eos_for(tok, tuple(item.stop)), pad_id=tok.pad_id)
        s, texts, finished = sampler.cut_completions(s, tok, tuple(item.stop), tok.pad_id)
        jobs = envs.score_jobs([item], texts)
        macs = [attest.seal(key, attest.context(item.item_id, item.lease, g), jobs[g], 0.0, "failed") for g in range(G)]
        out.append(wire.Rollout(item_id=item.item_id, version=0, lineage="", worker="w", prompt_len=int(prompt_len_R[0]),
                                tokens_GT=s.tokens_RT, logp_behav_GT=s.logp_behav_RT, mask_GT=s.mask_RT,
                                rewards_G=np.zeros(G, np.float32), finished_G=np.array(finished), statuses=["failed"] * G,
                                texts=texts, macs=macs))
        items.append(item)
    return items, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--audit-frac", type=float, default=trainer_config.Config.audit_frac)
    args = ap.parse_args()
    cfg, gcfg = trainer_config.Config(), grpo.GRPOConfig()
    B, G = args.prompts, gcfg.group_size
    mcfg, params = hf_io.load_hf(MODEL, bf16_fix=True)
    tok = hf_io.load_tokenizer(MODEL)
    stream = tasks.train_problems(cfg.seed)  # T: the longest prompt plus the budget, to 32s (or the model max)
    fmt, template = prompts.prompt_format(MODEL, "")
    longest = max(len(tok.encode(workitems.prompt_text(stream[i], fmt, template))) for i in range(B))
    T = min(mcfg.max_seq_len, -(-(longest + cfg.max_new_tokens) // 32) * 32)
    key_path = attest.write_key(os.path.join("/tmp", f"bench_audit_{os.getpid()}.key"))
    key = attest.read_key(key_path)
    items, batch = rollouts(params, mcfg, tok, cfg, B, G, T, key, fmt, template)
    print(f"{B} rollouts x {G} rows, T={T}, {int(sum(r.mask_GT.sum() for r in batch))} completion tokens", flush=True)

    upd = update.make_update(mcfg, gcfg, optax.adam(1e-6), cfg.temperature)
    master, opt_state = update.init_state(params, mcfg, optax.adam(1e-6))
    data = {"tokens_RT": np.concatenate([r.tokens_GT for r in batch]), "mask_RT": np.concatenate([r.mask_GT for r in batch]),
            "logp_behav_RT": np.concatenate([r.logp_behav_GT for r in batch]),
            "adv_R": np.random.default_rng(0).normal(size=B * G).astype(np.float32)}
    minibatches = update.split_batch(data, 1, B * G)
    queue = param_server.WorkQueue(param_server.Config(verdict_key=key_path))
    auditor = audit.Auditor(1.0, 0.0, tok, mcfg, tok.pad_id, eos_of=lambda stop: sampler.eos_for(tok, stop),
                            logprobs=lambda t: upd.old_logprobs(master, [{"tokens_RT": t}])[0],
                            params=lambda: update.policy_params(master, mcfg), rng=np.random.default_rng(0))
    parts = {
        "step": lambda: upd(master, opt_state, minibatches),
        "seal": lambda: [queue.check_seals(r, i.to_dict(), i.lease) for r, i in zip(batch, items)],
        "text": lambda: [audit.check_texts(r, tok.encode(i.prompt), tok.decode) for r, i in zip(batch, items)],
        "logp": lambda: [audit.check_logprobs(r, auditor.logprobs(r.tokens_GT), 0.0) for r in batch],
        "draw": lambda: [audit.check_tokens(r, auditor.draw(r, i, 0)) for r, i in zip(batch, items)],
    }
    for name, fn in parts.items():  # warm-up: compiles, and every check passes on honest rollouts
        got = fn()
        if name != "step":
            assert not any(got), (name, [w for w in got if w])
    times = {name: [] for name in parts}
    for _ in range(args.repeats):
        for name, fn in parts.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, s in med.items():
        print(f"{name:5s} {s * 1000:9.1f} ms per batch of {B} rollouts", flush=True)
    checks = lambda frac: med["text"] + frac * (med["logp"] + med["draw"])  # noqa: E731
    print(f"RESULT name=audit size=coldstart rollouts={B} step_s={med['step']:.4f} text_s={med['text']:.4f} "
          f"logp_s={med['logp']:.4f} draw_s={med['draw']:.4f} seal_s={med['seal']:.4f} "
          f"overhead_default={checks(args.audit_frac) / med['step']:.3f} overhead_all={checks(1.0) / med['step']:.3f}",
          flush=True)
    os.remove(key_path)


if __name__ == "__main__":
    main()
