"""LoRA: an adapter version vs a full version, side by side in one run, at 3M and 100M parameters.

Run:  python bench/bench_lora.py                         # 3m and 100m, rank 8 (~10 min on 2 loaded cores)
      python bench/bench_lora.py --sizes 3m --repeats 2 --no-step

sync:  this process plays the trainer: weights_zmq.push_weights into a real param_server.py process
       (--keep-versions 1); a member process runs the inference worker's own weight path
       (inference_worker.weight_fetcher, --no-relay) and install (inference_worker.Worker.install: a
       full version to the device; an adapter version lora.merge'd onto the base it holds there), and
       reports when the fetcher offers the complete version (HOLD) and when the worker has installed it
       (INSTALLED, block_until_ready). Full and adapter versions alternate: full v1, adapter v2 on base
       v1, full v3, adapter v4 on base v3, ... so each adapter version finds its base already held, as
       every version after a lineage's first does in a LoRA run. Time = from the start of the push to
       INSTALLED (sync_*), and to HOLD (hold_*). Bytes = the version's bytes (manifest), and what the
       param server sent for it (its bytes_sent: chunks, headers, manifests and long polls).
       The full version: the model's HF tensors in bfloat16 (hf_io.to_hf_tensors of random weights);
       the adapter: rank-r A and B for every attention and MLP projection (lora.TARGETS) in the
       compute dtype (bfloat16), as the trainer pushes it (lora.adapter_tensors: its f32 master rounded
       as lora.merge rounds it, so the worker's merge gives the trainer's weights bit for bit).
step:  update.make_update on one CPU device, full fine-tuning (the f32 master, Adam on every weight)
       vs LoRA (lcfg, base = the bf16 weights: the f32 adapter, Adam on it alone; each step merges
       with lora.merge and projects the merged weights' gradient onto A and B), the batch of
       bench_train_step.py (B x 160 tokens, 128 under the mask, one microbatch), alternating, after
       two warm-up steps each. State bytes = every array the update keeps between steps: full: master +
       Adam's moments; LoRA: base + adapter + Adam's moments.
Medians over --repeats (after --warmup untimed rounds per side).

Prints per size `RESULT name=lora size=.. rank=.. bytes_ratio=<adapter/full> sync_speedup=<full s/adapter s>
step_speedup=<full s/adapter s> ...`.
"""
import argparse
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from bench_weight_sync import expect, free_port, reader, say, stop  # noqa: E402  (the same process plumbing)

LINEAGE = "bench-lora"


def model_config(size: str):
    from bench_train_step import make_cfg
    return make_cfg(size, True)  # bench_train_step's: bfloat16, the fix on, untied embeddings


def adapter_named(mcfg, lcfg, seed: int = 0) -> list:
    """A rank-r adapter as the trainer pushes it (lora.adapter_tensors of a random f32 master, B != 0:
    the compute dtype)."""
    import lora
    rng = np.random.default_rng(seed)
    master = {t: {m: 0.01 * rng.standard_normal(shape, np.float32) for m, shape in ms.items()}
              for t, ms in lora.adapter_shapes(mcfg, lcfg).items()}
    return list(lora.adapter_tensors(master, mcfg).items())


def member(addr: str, size: str) -> None:
    """The worker's weight path and install; prints HOLD/INSTALLED <version> <unix time>."""
    sys.stdout = sys.stderr
    import types
    import jax
    import inference_worker
    cfg = inference_worker.Config(param_server=addr, name="member-0", relay=False)
    worker = inference_worker.Worker.__new__(inference_worker.Worker)  # the install alone: no model folder
    worker.cfg = types.SimpleNamespace(name=cfg.name, sampler_quant="none")
    worker.mcfg, worker.mesh, worker.version, worker.lineage = model_config(size), None, -1, ""
    worker.base_key = worker.base_params = worker.params = None
    worker.fetcher = inference_worker.weight_fetcher(cfg, os.urandom(4).hex())
    say("READY")
    while True:
        buf = worker.fetcher.newest(worker.version + 1, worker.lineage, 60.0)
        if buf is None:
            continue
        say(f"HOLD {buf.key.version} {time.time():.6f}")
        worker.params = None  # the version it replaces: freed as the worker's install would
        worker.install(buf)
        jax.block_until_ready(worker.params)
        say(f"INSTALLED {buf.key.version} {time.time():.6f}")
        worker.fetcher.done(buf)
        del buf


def bench_sync(size: str, rank: int, repeats: int, warmup: int, tmp: str) -> dict:
    import hf_io
    import lora
    import weights_zmq
    import wire
    from random_weights import random_params
    mcfg, lcfg = model_config(size), lora.LoraConfig(rank)
    full = list(hf_io.to_hf_tensors(random_params(mcfg), mcfg).items())
    adapter = adapter_named(mcfg, lcfg)
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs = []
    try:
        procs.append(subprocess.Popen([sys.executable, "param_server.py", "--bind", addr, "--state-dir",
                                       os.path.join(tmp, f"ps-{size}"), "--keep-versions", "1",
                                       "--no-deltas"], cwd=ROOT,  # full versions travel whole
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True))
        mq = queue.Queue()
        mem = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--member", addr, size], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True, start_new_session=True,
                               stderr=open(os.path.join(tmp, f"member-{size}.log"), "w"))
        procs.append(mem)
        threading.Thread(target=reader, args=(mem, mq), daemon=True).start()
        client = wire.Client("bench-trainer", addr, timeout_s=300)
        client.call(wire.Ping(), timeout_s=60)
        expect(mq, "READY", 300)
        time.sleep(1.0)  # the fetcher long-polling
        got = {"full": {"sync": [], "hold": [], "sent": []}, "adapter": {"sync": [], "hold": [], "sent": []}}
        nbytes = {}
        for r in range(warmup + repeats):
            for kind in ("full", "adapter"):
                version = 2 * r + 1 + (kind == "adapter")
                sent0 = client.call(wire.GetStats()).info["bytes_sent"]
                t0 = time.time()
                if kind == "full":
                    weights_zmq.push_weights(client, version, LINEAGE, full)
                else:
                    weights_zmq.push_weights(client, version, LINEAGE, adapter, base=version - 1, lora=lcfg.to_dict())
                hold = float(expect(mq, "HOLD", 600)[2])
                installed = float(expect(mq, "INSTALLED", 600)[2])
                time.sleep(0.3)
                sent = client.call(wire.GetStats()).info["bytes_sent"] - sent0
                nbytes[kind] = sum(a.nbytes for _, a in (full if kind == "full" else adapter))
                print(f"  {size} {kind:7s} v{version}: worker holds after {hold - t0:.3f} s, installed after "
                      f"{installed - t0:.3f} s, server sent {sent / 2**20:.2f} MiB"
                      + ("  (warm-up)" if r < warmup else ""), flush=True)
                if r >= warmup:
                    got[kind]["sync"].append(installed - t0)
                    got[kind]["hold"].append(hold - t0)
                    got[kind]["sent"].append(sent)
        client.close()
    finally:
        stop(procs)
    med = {kind: {k: statistics.median(v) for k, v in d.items()} for kind, d in got.items()}
    return {"full_mb": nbytes["full"] / 2**20, "adapter_mb": nbytes["adapter"] / 2**20,
            "bytes_ratio": nbytes["adapter"] / nbytes["full"],
            "sent_ratio": med["adapter"]["sent"] / med["full"]["sent"],
            "full_sync_s": med["full"]["sync"], "adapter_sync_s": med["adapter"]["sync"],
            "sync_speedup": med["full"]["sync"] / med["adapter"]["sync"],
            "full_hold_s": med["full"]["hold"], "adapter_hold_s": med["adapter"]["hold"],
            "hold_speedup": med["full"]["hold"] / med["adapter"]["hold"]}


def tree_bytes(tree) -> int:
    import jax
    return sum(x.nbytes for x in jax.tree_util.tree_leaves(tree))


def bench_step(size: str, rank: int, repeats: int) -> dict:
    import jax
    import optax
    import grpo
    import lora
    import update
    from bench_train_step import BATCH, batch_data
    from random_weights import random_params
    mcfg, lcfg = model_config(size), lora.LoraConfig(rank)
    params = random_params(mcfg)  # in the compute dtype (bf16): LoRA's frozen base
    data = batch_data(mcfg, BATCH[size])
    rng = np.random.default_rng(1)
    data["logp_behav_RT"] = (-rng.uniform(0.1, 8.0, data["mask_RT"].shape) * data["mask_RT"]).astype(np.float32)
    batch = update.split_batch(data, 1, len(data["tokens_RT"]))
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-6))  # bench_train_step's
    sides = {}
    master, opt = update.init_state(params, mcfg, optimizer)
    sides["full"] = {"fn": update.make_update(mcfg, grpo.GRPOConfig(), optimizer, 1.0),
                     "state": [master, opt], "bytes": tree_bytes((master, opt))}
    adapter = dict(adapter_named(mcfg, lcfg))
    adapter, opt_l = update.init_lora_state(lora.adapter_from_tensors(adapter, mcfg, lcfg), optimizer)
    sides["lora"] = {"fn": update.make_update(mcfg, grpo.GRPOConfig(), optimizer, 1.0, lcfg=lcfg, base=params),
                     "state": [adapter, opt_l], "bytes": tree_bytes((adapter, opt_l, params))}

    def step(side):
        t0 = time.perf_counter()
        side["state"][0], side["state"][1], _, aux = side["fn"](side["state"][0], side["state"][1], batch)
        jax.block_until_ready(side["state"][0])
        assert np.isfinite(aux["loss"])
        return time.perf_counter() - t0

    for k, side in sides.items():
        for i in range(2):
            print(f"  {size} step {k} warm-up {i}: {step(side):.2f} s", flush=True)
    times = {k: [] for k in sides}
    for _ in range(repeats):
        for k, side in sides.items():
            times[k].append(step(side))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"  {size} step: full {med['full']:.3f} s, lora {med['lora']:.3f} s (median of {repeats})", flush=True)
    return {"full_step_s": med["full"], "lora_step_s": med["lora"], "step_speedup": med["full"] / med["lora"],
            "full_state_mb": sides["full"]["bytes"] / 2**20, "lora_state_mb": sides["lora"]["bytes"] / 2**20,
            "state_ratio": sides["lora"]["bytes"] / sides["full"]["bytes"], "batch": BATCH[size]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["3m", "100m"], choices=["3m", "100m"])
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds per side (sync and step)")
    ap.add_argument("--warmup", type=int, default=2, help="sync rounds per side not timed (fresh memory, compiles)")
    ap.add_argument("--no-step", action="store_true", help="the sync half alone")
    ap.add_argument("--member", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.member:
        return member(*args.member)
    import jax
    print(f"jax {jax.__version__}, {len(os.sched_getaffinity(0))} cpus, rank {args.rank}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            r = {"size": size, "rank": args.rank, **bench_sync(size, args.rank, args.repeats, args.warmup, tmp)}
            if not args.no_step:
                r.update(bench_step(size, args.rank, args.repeats))
            first = ["size", "rank", "bytes_ratio", "sync_speedup", "step_speedup"]
            keys = [k for k in first if k in r] + [k for k in r if k not in first]
            print("RESULT name=lora " + " ".join(f"{k}={r[k]:.4g}" if isinstance(r[k], float) else f"{k}={r[k]}"
                                                 for k in keys) + f" repeats={args.repeats}", flush=True)


if __name__ == "__main__":
    main()
