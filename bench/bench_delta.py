"""How much of a weight version changes from one step to the next, and what a lossless delta of it weighs.

Run:  python bench/bench_delta.py                 # the embedded cold start, 6 steps, ~2 min on 2 cores
      python bench/bench_delta.py --steps 10 --lr 1e-6

Consecutive versions are made the way the trainer makes them: real rollouts of the cold-start policy (the
embedded task, bench_audit.rollouts), the GRPO update (update.make_update, the trainer's defaults, Adam at
--lr, launch.sh's 1e-4 by default), each version the bf16 cast of the f32 master as pushed
(hf_io.iter_hf_tensors). For each pair of consecutive versions and each tensor family (embedding, attention,
MLP, norms, head) it reports the fraction of positions whose bits changed, and the bytes of two lossless
encodings of the difference, against the full version's bytes:
  xor     the bits XORed as unsigned integers of the dtype's width, then zlib (level 1) of the whole
  sparse  the changed positions as int32 indices + their new values
  best    per tensor, the smaller of the two (what a delta that chooses per tensor would send)
The rollouts are sampled once; the steps reuse them with fresh advantages, which is enough to move the
weights as Adam does (what changes is set by the update's size, not by which rollouts made it).

Prints `RESULT name=delta_codec size=coldstart lr= changed_frac= xor_ratio= sparse_ratio= best_ratio=`
(medians over the step pairs). This is the codec's measurement only: the wire, the server and the relay
do not carry deltas yet.
"""
import argparse
import collections
import os
import statistics
import sys
import zlib

import numpy as np
import optax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import grpo  # noqa: E402
import hf_io  # noqa: E402
import prompts  # noqa: E402
import tasks  # noqa: E402
import trainer_config  # noqa: E402
import update  # noqa: E402
import workitems  # noqa: E402
from bench_audit import MODEL, rollouts  # noqa: E402


def family(name: str) -> str:
    for key, fam in (("embed", "embedding"), ("lm_head", "head"), ("norm", "norms"), ("self_attn", "attention"),
                     ("mlp", "mlp")):
        if key in name:
            return fam
    return "other"


def as_uint(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize]).reshape(-1)


def encode_sizes(old: np.ndarray, new: np.ndarray) -> tuple[int, int, int]:
    """(changed positions, xor+zlib bytes, sparse bytes) of new against old."""
    a, b = as_uint(old), as_uint(new)
    diff = a ^ b
    changed = int(np.count_nonzero(diff))
    return changed, len(zlib.compress(diff.tobytes(), 1)), changed * (4 + b.itemsize)


def version(master, mcfg) -> dict:
    return {name: np.asarray(t).copy() for name, t in hf_io.iter_hf_tensors(master, mcfg, dtype=mcfg.jdtype)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--prompts", type=int, default=16)
    args = ap.parse_args()
    cfg, gcfg = trainer_config.Config(), grpo.GRPOConfig()
    B, G = args.prompts, gcfg.group_size
    mcfg, params = hf_io.load_hf(MODEL, bf16_fix=True)
    tok = hf_io.load_tokenizer(MODEL)
    stream, (fmt, template) = tasks.train_problems(cfg.seed), prompts.prompt_format(MODEL, "")
    longest = max(len(tok.encode(workitems.prompt_text(stream[i], fmt, template))) for i in range(B))
    T = min(mcfg.max_seq_len, -(-(longest + cfg.max_new_tokens) // 32) * 32)
    _, batch = rollouts(params, mcfg, tok, cfg, B, G, T, b"k" * 32, fmt, template)
    optimizer = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(args.lr))
    upd = update.make_update(mcfg, gcfg, optimizer, cfg.temperature)
    master, opt_state = update.init_state(params, mcfg, optimizer)
    base = {"tokens_RT": np.concatenate([r.tokens_GT for r in batch]), "mask_RT": np.concatenate([r.mask_GT for r in batch]),
            "logp_behav_RT": np.concatenate([r.logp_behav_GT for r in batch])}
    rng = np.random.default_rng(0)
    prev, pairs = version(master, mcfg), []
    for step in range(args.steps):
        data = {**base, "adv_R": rng.normal(size=B * G).astype(np.float32)}
        master, opt_state, _, _ = upd(master, opt_state, update.split_batch(data, 1, B * G))
        cur = version(master, mcfg)
        fams = collections.defaultdict(lambda: [0, 0])
        full = xor = sparse = best = 0
        for name, new in cur.items():
            changed, x, s = encode_sizes(prev[name], new)
            fams[family(name)][0] += changed
            fams[family(name)][1] += new.size
            full, xor, sparse, best = full + new.nbytes, xor + x, sparse + s, best + min(x, s)
        frac = sum(c for c, _ in fams.values()) / sum(n for _, n in fams.values())
        pairs.append({"changed": frac, "xor": xor / full, "sparse": sparse / full, "best": best / full})
        print(f"v{step} -> v{step + 1}: changed {frac:.4f} of positions; bytes vs the full version: xor+zlib "
              f"{xor / full:.4f}, sparse {sparse / full:.4f}, per-tensor best {best / full:.4f}; by family: "
              + ", ".join(f"{f} {c / n:.4f}" for f, (c, n) in sorted(fams.items())), flush=True)
        prev = cur
    med = {k: statistics.median(p[k] for p in pairs) for k in pairs[0]}
    print(f"RESULT name=delta_codec size=coldstart lr={args.lr:g} changed_frac={med['changed']:.4f} "
          f"xor_ratio={med['xor']:.4f} sparse_ratio={med['sparse']:.4f} best_ratio={med['best']:.4f}", flush=True)


if __name__ == "__main__":
    main()
