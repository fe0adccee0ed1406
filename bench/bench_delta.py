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
(medians over the step pairs): the offline codec, to compare encodings.

--sync SIZE [SIZE ...] (3m, 100m; bench/run_all.py's `delta` part) measures deltas on the wire instead.
Consecutive versions are made by real optimizer steps: update.make_update on bench_train_step.py's model
and batch (B x 160 tokens), Adam at --lr (launch.sh's recipe: 1e-4) after clipping at 1.0 as the trainer
does, each version the bf16 cast of the f32 master as the trainer pushes it (hf_io.iter_hf_tensors). Two
real param_server.py processes, one serving deltas (the default) and one --no-deltas, each with a member
process running the worker's own weight path (bench_weight_sync.py --member: inference_worker.weight_fetcher,
then every tensor to the device), get the same versions, alternating server by server. Time = from the
push's start to the member holding the version (complete, every chunk checked); bytes = what the server
served for it (GetStats: bytes_served_full + bytes_served_delta). The first version is whole on both
(nobody holds a base); the later ones are deltas on the first server.
Prints per size and rate `RESULT name=delta size= lr= bytes_ratio=<bytes served, delta server / whole server>
sync_speedup=<whole s / delta s> changed_frac= delta_weighs=<the delta's bytes / the version's> ...` (medians
over the versions after --warmup). delta_weighs is what the delta weighs even where the server sent the
version whole because the encoding could not keep up with the wire (deltas.Encoder.finish), encoded here
tensor by tensor as the server would (deltas.encode).
"""
import argparse
import collections
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib

import numpy as np
import optax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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


def made_versions(size: str, n: int, lr: float) -> list:
    """n consecutive versions (lists of (name, bf16 array)) of bench_train_step's model, each one real
    Adam step after the one before, as the trainer pushes them."""
    import jax
    from bench_train_step import BATCH, batch_data, make_cfg
    from random_weights import random_params
    mcfg = make_cfg(size, True)
    data = batch_data(mcfg, BATCH[size])
    rng = np.random.default_rng(1)
    data["logp_behav_RT"] = (-rng.uniform(0.1, 8.0, data["mask_RT"].shape) * data["mask_RT"]).astype(np.float32)
    batch = update.split_batch(data, 1, len(data["tokens_RT"]))
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(lr))
    upd = update.make_update(mcfg, grpo.GRPOConfig(), optimizer, 1.0)
    master, opt_state = update.init_state(random_params(mcfg), mcfg, optimizer)
    out = []
    for k in range(n):
        if k:
            t0 = time.perf_counter()
            master, opt_state, _, _ = upd(master, opt_state, batch)
            jax.block_until_ready(master)
            print(f"  {size}: step {k} in {time.perf_counter() - t0:.1f} s", flush=True)
        out.append([(name, np.asarray(t).copy()) for name, t in hf_io.iter_hf_tensors(master, mcfg, dtype=mcfg.jdtype)])
    return out


def offline_weighs(old: list, new: list) -> float:
    """What the server's delta of `new` against `old` weighs against the version, encoded here (deltas.encode,
    tensor by tensor): reported also where the server sent the version whole."""
    import deltas
    sent = total = 0
    for (_, a), (_, b) in zip(old, new):
        codec, data, _ = deltas.encode(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8), a.itemsize)
        sent, total = sent + (0 if data is None else data.size), total + b.nbytes
    return sent / total


def offline_changed(old: list, new: list) -> float:
    return sum(int(np.count_nonzero(as_uint(a) != as_uint(b))) for (_, a), (_, b) in zip(old, new)) / sum(
        a.size for _, a in old)


def bench_sync(size: str, lr: float, repeats: int, warmup: int, tmp: str) -> dict:
    import weights_zmq
    import wire
    from bench_weight_sync import expect, free_port, reader, stop
    made = made_versions(size, 1 + warmup + repeats, lr)
    nbytes = sum(a.nbytes for _, a in made[0])
    sides, procs = {}, []
    try:
        for side, flags in (("delta", []), ("whole", ["--no-deltas"])):
            addr = f"tcp://127.0.0.1:{free_port()}"
            procs.append(subprocess.Popen([sys.executable, "param_server.py", "--bind", addr, "--state-dir",
                                           os.path.join(tmp, f"ps-{size}-{lr:g}-{side}"), "--keep-versions", "2", *flags],
                                          cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                          start_new_session=True))
            q = queue.Queue()
            mem = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench", "bench_weight_sync.py"), "--member",
                                    addr], cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True,
                                   stderr=open(os.path.join(tmp, f"member-{size}-{lr:g}-{side}.log"), "w"))
            procs.append(mem)
            threading.Thread(target=reader, args=(mem, q), daemon=True).start()
            client = wire.Client(f"bench-{side}", addr, timeout_s=300)
            client.call(wire.Ping(), timeout_s=60)
            expect(q, "READY", 300)
            sides[side] = {"client": client, "q": q, "s": [], "bytes": [], "changed": [], "weighs": []}
        time.sleep(1.0)  # the fetchers long-polling
        for version, tensors in enumerate(made):
            for side, d in sides.items():
                served = lambda: sum(d["client"].call(wire.GetStats()).info["weights"][k]  # noqa: E731
                                     for k in ("bytes_served_full", "bytes_served_delta"))
                before = served()
                t0 = time.time()
                weights_zmq.push_weights(d["client"], version, "bench-delta", tensors)
                hold = float(expect(d["q"], "HOLD", 600)[2])
                expect(d["q"], "INSTALLED", 600)
                sent = served() - before
                while d["client"].call(wire.GetStats()).info["weights"]["delta"] == "encoding":  # for its metrics
                    time.sleep(0.05)
                w = d["client"].call(wire.GetStats()).info["weights"]
                changed = (sum(c for c, _ in w["delta_changed"].values()) /
                           max(sum(n for _, n in w["delta_changed"].values()), 1)) if w["delta_changed"] else float("nan")
                if side == "delta" and version and w["delta"] != "made":
                    changed = offline_changed(made[version - 1], tensors)
                weighs = offline_weighs(made[version - 1], tensors) if version else float("nan")
                print(f"  {size} {side} v{version}: held after {hold - t0:.3f} s, served {sent / 2**20:.2f} MiB"
                      + (f"; {changed:.4f} of positions changed, the delta weighs {weighs:.4f}x"
                         if side == "delta" and version else "")
                      + ("  (whole: nothing held yet)" if version == 0 else "  (warm-up)" if version <= warmup else ""),
                      flush=True)
                if version > warmup:
                    d["s"].append(hold - t0)
                    d["bytes"].append(sent)
                    d["changed"].append(changed)
                    d["weighs"].append(weighs)
                time.sleep(0.3)
    finally:
        stop(procs)
    med = {side: {k: statistics.median(d[k]) for k in ("s", "bytes")} for side, d in sides.items()}
    r = {"size": size, "lr": lr, "mb": nbytes / 2**20,
         "bytes_ratio": statistics.median(a / b for a, b in zip(sides["delta"]["bytes"], sides["whole"]["bytes"])),
         "sync_speedup": med["whole"]["s"] / med["delta"]["s"], "delta_s": med["delta"]["s"],
         "whole_s": med["whole"]["s"], "changed_frac": statistics.median(sides["delta"]["changed"]),
         "delta_weighs": statistics.median(sides["delta"]["weighs"])}
    print("RESULT name=delta " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items())
          + f" repeats={repeats} warmup={warmup}", flush=True)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--lr", type=float, nargs="+", default=[1e-4],
                    help="Adam's learning rate (--sync: one run per rate; else the first)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--sync", nargs="+", choices=["3m", "100m"], help="measure deltas on the wire at these sizes")
    ap.add_argument("--repeats", type=int, default=3, help="--sync: timed versions per size")
    ap.add_argument("--warmup", type=int, default=1, help="--sync: delta versions not timed (after the first, whole)")
    args = ap.parse_args()
    if args.sync:
        with tempfile.TemporaryDirectory() as tmp:
            for size in args.sync:
                for lr in args.lr:
                    bench_sync(size, lr, args.repeats, args.warmup, tmp)
        return
    args.lr = args.lr[0]
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
