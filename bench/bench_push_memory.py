"""Host memory of one weight push from a sharded trainer: tensor by tensor (trainer.Trainer.do_push) against
the whole-model way (cast everything, convert everything, then send).

Run:  python bench/bench_push_memory.py                      # 100m model, 8 simulated CPU devices
      python bench/bench_push_memory.py --size small --devices 1

The f32 master is made directly in its shards (sharding.param_shardings) on a (devices x 1) mesh, as the
Trainer holds it. Each variant then runs in a fresh child process (so one variant's freed memory does
not hide the other's) and streams the push the param server receives (weights_zmq.push_weights: chunks, then
the manifest), each message encoded for the wire (wire.encode; a stand-in client, no socket):
  per_tensor  trainer.Trainer.do_push itself: hf_io.iter_hf_tensors cuts, casts and gathers one tensor at a
              time and weights_zmq.push_weights sends it in chunks, so the host never holds the whole model.
  whole       the whole-model way: hf_io.to_hf_tensors(cast_params(master, bf16)): the whole bf16 model
              cast on the devices, every stacked leaf copied to the host, then transposed copies.
Measured: host_peak = tracemalloc's peak of the host (numpy) allocations during the push; extra = that
minus the bf16 model's size (negative: less than one model is ever held). rss_peak = the process's
resident set sampled every ms, minus before; on XLA:CPU the "device" buffers are host memory too, so
this also counts the devices' bf16 copy of the whole variant, which on a GPU is device memory.
Caveats: after the warm-up push the allocator reuses freed pages, so rss_peak understates (--no-warm
measures a first push, compilations included); with --devices 1 a CPU array reaches numpy without a
copy, which tracemalloc does not see, so there host_peak undercounts and rss_peak is the number to read.

Measured (2026-12-02, 2-core CPU, 100m: 237.8 MB in bf16, largest tensor 46.9 MB; 8 devices): host_peak
per_tensor 156.6 MB, whole 428.9 MB; rss_peak 153 vs 447 MB. per_tensor holds the tensor being cut and,
while its chunks are in flight (weights_zmq.PUSH_WINDOW of them, sent as views), the one before it.

Last lines: `RESULT name=push_memory variant=<v> devices=<n> model_bf16_mb=<m> largest_tensor_mb=<t>
host_peak_mb=<p> host_extra_mb=<p - m> rss_peak_delta_mb=<r> push_s=<s>`, one per variant.
"""
import argparse
import collections
import os
import subprocess
import sys
import threading
import time
import tracemalloc
import types

SIZES = {
    "small": dict(vocab_size=512, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64,
                  intermediate_size=768),
    "100m": dict(vocab_size=32000, hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4, head_dim=64,
                 intermediate_size=2048),
}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _PeakRss(threading.Thread):
    """Samples the resident set every millisecond until stopped; .peak is the largest seen."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.running = _rss_bytes(), True

    def run(self):
        while self.running:
            self.peak = max(self.peak, _rss_bytes())
            time.sleep(0.001)


def child(args) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import hf_io
    import model
    import sharding
    import trainer
    import update
    import weights_zmq
    import wire

    cfg = model.ModelConfig(**SIZES[args.size], max_seq_len=64, rope_theta=1e4, rms_norm_eps=1e-6, qkv_bias=True,
                            tie_embeddings=False)
    mesh = sharding.make_mesh(tensor=1)
    master = jax.jit(lambda: jax.tree_util.tree_map(lambda x: x.astype(jnp.float32),
                                                    model.init_params(cfg, jax.random.PRNGKey(0))),
                     out_shardings=sharding.param_shardings(cfg, mesh))()
    jax.block_until_ready(master)
    shapes = hf_io._hf_shapes(cfg)
    model_bytes = sum(int(np.prod(s)) * 2 for s in shapes.values())
    largest = max(int(np.prod(s)) * 2 for s in shapes.values())

    sent = {}

    class Client:  # the param server's side of the calls: each message encoded into wire frames
        def call(self, msg, **_):
            frames = wire.encode(msg)
            if isinstance(msg, wire.PushCommit):
                sent["n"] = len(msg.manifest["tensors"])
                return wire.Ok({})
            sent["bytes"] = sent.get("bytes", 0) + sum(len(f) for f in frames[1:])
            return wire.Ok({})

        def pipeline(self, msgs, window, **_):  # holds `window` messages in flight, as wire.Client does
            inflight = collections.deque()
            for msg in msgs:
                inflight.append(msg)
                if len(inflight) == window:
                    yield self.call(inflight.popleft())
            while inflight:
                yield self.call(inflight.popleft())

    def push_whole(self):  # the alternative: the whole model cast and converted at once, then pushed
        tensors = hf_io.to_hf_tensors(update.cast_params(self.master, self.mcfg.jdtype), self.mcfg)
        weights_zmq.push_weights(self.ps, self.step_n, self.lineage, tensors.items())

    fake = types.SimpleNamespace(master=master, mcfg=cfg, ps=Client(), step_n=1, lineage="bench", leader=True)
    push = {"per_tensor": lambda: trainer.Trainer.do_push(fake, {"version": 1, "lineage": "bench"}),
            "whole": lambda: push_whole(fake)}[args.variant]
    if args.warm:  # compile the slicing kernels first: the steady state of a run
        push()
    sent.clear()
    rss = _PeakRss()
    rss_before = _rss_bytes()
    tracemalloc.start()
    rss.start()
    t0 = time.perf_counter()
    push()
    push_s = time.perf_counter() - t0
    _, host_peak = tracemalloc.get_traced_memory()
    rss.running = False
    rss.join()
    tracemalloc.stop()
    assert sent["bytes"] == model_bytes, (sent, model_bytes)
    mb = lambda b: f"{b / 2**20:.1f}"
    print(f"RESULT name=push_memory variant={args.variant} devices={len(jax.devices())} size={args.size} "
          f"model_bf16_mb={mb(model_bytes)} largest_tensor_mb={mb(largest)} host_peak_mb={mb(host_peak)} "
          f"host_extra_mb={mb(host_peak - model_bytes)} rss_peak_delta_mb={mb(rss.peak - rss_before)} "
          f"push_s={push_s:.2f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="100m")
    parser.add_argument("--devices", type=int, default=8, help="simulated CPU devices (the trainer's mesh)")
    parser.add_argument("--variants", nargs="+", default=["per_tensor", "whole"])
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # set in the child processes
    parser.add_argument("--no-warm", dest="warm", action="store_false",
                        help="measure the first push (with its compilations) instead of a second one")
    args = parser.parse_args()
    if args.variant:
        return child(args)
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"))
    for variant in args.variants:
        cmd = [sys.executable, os.path.abspath(__file__), "--size", args.size, "--variant", variant]
        cmd += [] if args.warm else ["--no-warm"]
        subprocess.run(cmd, env=env, check=True)


if __name__ == "__main__":
    main()
