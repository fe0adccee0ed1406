"""Weight broadcast: relay (workers pass chunks on to each other) against direct (every worker pulls
every chunk from the param server), with 1, 2, 4 and 8 real worker processes on loopback.

Run:  python bench/bench_broadcast.py                     # 256 MiB model, 2 versions per case (~10 min)
      python bench/bench_broadcast.py --model-mb 64 --workers 1 4 --versions 1

Each case starts a fresh param_server.py and N member processes. A member runs the inference worker's
own weight path (weights_zmq.WeightFetcher, made by inference_worker.weight_fetcher, and in relay mode its
ChunkServer, each with its own sockets and thread, exactly as in a worker) but no sampler: it only
reports when it holds a version (every chunk and tensor CRC checked). This process then pushes versions of a model made of random
bf16 arrays (weights_zmq.push_weights, 16 MiB chunks as the trainer does) and measures, per version:
  server_bytes_per_version  bytes the param server's socket sent (wire.Server.bytes_sent, from its
                            get_stats) from the push's start until every member holds the version
  last_worker_s             seconds from the push's start until the last member holds the version
Both are the mean over --versions pushes; the table also shows how long the push itself took (trainer
to param server, until its commit is answered), which every worker must wait for. Relay uses the param server's default tree (fan-out 2).

Output: one line per case, `RESULT workers=N mode=relay|direct server_bytes_per_version=B
last_worker_s=S`, then a table.
"""
import argparse
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import versions  # noqa: E402
import weights_zmq  # noqa: E402
import wire  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_tensors(mb: int) -> list:
    """A model of `mb` MiB as (name, bf16 array) pairs: tensors of 1 to 32 MiB (embedding-, MLP- and
    norm-like sizes), random but the same every time."""
    rng = np.random.default_rng(0)
    sizes, left = [], mb << 20
    while left > 0:
        for part in (32, 16, 8, 8, 4, 1):
            take = min(part << 20, left)
            if take <= 0:
                break
            sizes.append(take)
            left -= take
    return [(f"t{i}", rng.standard_normal(size // 2, np.float32).astype(ml_dtypes.bfloat16))
            for i, size in enumerate(sizes)]


def member(args) -> None:
    """One worker's weight path, reporting `HOLD <version> <unix time>` for each version it holds, on
    stdout in one write each (the worker's own log lines go to stderr)."""
    out, sys.stdout = sys.stdout, sys.stderr
    say = lambda text: os.write(out.fileno(), (text + "\n").encode())  # noqa: E731
    import inference_worker
    cfg = inference_worker.Config(param_server=args.param_server, name=args.name, relay=args.relay)
    fetcher = inference_worker.weight_fetcher(cfg, os.urandom(4).hex())
    say("READY")
    version, lineage = -1, ""
    while True:
        buf = fetcher.newest(version + 1, lineage, 60.0)
        if buf is not None:
            version, lineage = buf.key
            say(f"HOLD {version} {time.time():.6f}")
            fetcher.done(buf)


def run_case(n: int, relay: bool, tensors: list, versions: int, tmp: str) -> tuple[float, float, float]:
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([sys.executable, "param_server.py", "--bind", addr, "--state-dir",
                               os.path.join(tmp, f"ps-{n}-{relay}"), "--keep-versions", "1",
                               "--no-deltas"],  # whole versions: every version here is the same bytes
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)]
    holds: queue.Queue = queue.Queue()
    try:
        client = wire.Client("bench", addr, timeout_s=60)
        client.call(wire.Ping(), timeout_s=60)
        ready = threading.Semaphore(0)
        for i in range(n):
            p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--member", "--param-server", addr,
                                  "--name", f"member-{i}", "--relay" if relay else "--no-relay"],
                                 cwd=ROOT, stdout=subprocess.PIPE, text=True,
                                 stderr=open(os.path.join(tmp, f"member-{n}-{relay}-{i}.log"), "w"))
            procs.append(p)

            def read(p=p):
                for line in p.stdout:
                    if line.startswith("READY"):
                        ready.release()
                    elif line.startswith("HOLD"):
                        _, v, t = line.split()
                        holds.put((int(v), float(t)))
            threading.Thread(target=read, daemon=True).start()
        for _ in range(n):
            if not ready.acquire(timeout=120):
                raise RuntimeError("a member did not start")
        if relay:
            deadline = time.monotonic() + 60
            while len(client.call(wire.GetStats()).info["relays"]) < n:
                if time.monotonic() > deadline:
                    raise RuntimeError("members did not join the relay tree")
                time.sleep(0.2)
        time.sleep(1.0)  # every member long-polling
        sent, took, pushed = [], [], []
        for version in range(1, versions + 1):
            before = client.call(wire.GetStats()).info["bytes_sent"]
            t0 = time.time()
            weights_zmq.push_weights(client, version, "bench", tensors)
            pushed.append(time.time() - t0)
            times = []
            while len(times) < n:
                try:
                    v, t = holds.get(timeout=300)
                except queue.Empty:
                    for i in range(n):
                        with open(os.path.join(tmp, f"member-{n}-{relay}-{i}.log")) as f:
                            print(f"member {i}:", f.read()[-2000:], file=sys.stderr)
                    raise RuntimeError(f"v{version}: {len(times)} of {n} members hold it after 300 s") from None
                if v == version:
                    times.append(t)
            took.append(max(times) - t0)
            sent.append(client.call(wire.GetStats()).info["bytes_sent"] - before)
        return float(np.mean(sent)), float(np.mean(took)), float(np.mean(pushed))
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-mb", type=int, default=256, help="model size in MiB (random bf16 arrays)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--versions", type=int, default=2, help="pushes per case (results are their mean)")
    parser.add_argument("--member", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--param-server", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--relay", action=argparse.BooleanOptionalAction, default=True, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.member:
        return member(args)

    tensors = model_tensors(args.model_mb)
    model_bytes = sum(a.nbytes for _, a in tensors)
    print(f"model: {len(tensors)} tensors, {model_bytes / 2**20:.0f} MiB; chunks of {versions.CHUNK_BYTES >> 20} MiB",
          flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.workers:
            for mode in ("relay", "direct"):
                sent, took, pushed = run_case(n, mode == "relay", tensors, args.versions, tmp)
                rows.append((n, mode, sent, took, pushed))
                print(f"RESULT workers={n} mode={mode} server_bytes_per_version={sent:.0f} last_worker_s={took:.3f}",
                      flush=True)
    print(f"\n{'workers':>7} {'mode':>6} {'server MiB/version':>19} {'x model':>8} {'last worker s':>14} "
          f"{'of which push s':>16}")
    for n, mode, sent, took, pushed in rows:
        print(f"{n:>7} {mode:>6} {sent / 2**20:>19.1f} {sent / model_bytes:>8.2f} {took:>14.2f} {pushed:>16.2f}")


if __name__ == "__main__":
    main()
