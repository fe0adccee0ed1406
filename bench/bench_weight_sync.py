"""Weight sync: from the trainer's push until a worker holds the version, vs a bare ZeroMQ transfer of
the same bytes (the ceiling), measured side by side in one run.

Run:  python bench/bench_weight_sync.py                       # 256 MiB and 1 GiB, 3 versions each (~2 min)
      python bench/bench_weight_sync.py --sizes-mb 64 --repeats 2
      python bench/bench_weight_sync.py --weights-dir /tmp/shared   # the shared-directory transport instead

ours:     this process plays the trainer: weights_zmq.push_weights (16 MiB chunks, 4 in flight, a receipt for each,
          commit with the manifest) into a real param_server.py process; a member process runs the inference
          worker's own weight path (weights_zmq.WeightFetcher, made by inference_worker.weight_fetcher;
          --no-relay: one worker fetches from the param server; its own thread and sockets, every chunk
          and tensor CRC-checked) and reports when the fetcher offers the complete version (HOLD) and
          when it has installed it as jax arrays on its device (INSTALLED: jax.device_put of every
          tensor, block_until_ready; what Worker.install does, without the model-specific renaming).
          Time = from the start of the push to HOLD (the goal's number), and to INSTALLED.
          --weights-dir DIR: the same, through the shared-directory transport (weights_fs.DirTransport):
          the param server also publishes each version into DIR (written, fsynced, renamed) and the
          member reads it from there (inference_worker --weights-dir) instead of fetching chunks.
ceiling:  two bare processes, ZeroMQ PUSH -> PULL on loopback, the same bytes in 16 MiB messages,
          send(copy=False) / recv(copy=False): no encoding, no checksums, no receipts, one hop.
          Time = from the sender's first send to the receiver's last recv.
Both sides alternate version by version, after --warmup versions each that are not timed (the first
versions fault in fresh memory in every process, which on the VMs measured here costs 5-7x a write to
recycled memory; a run pushing every step recycles it); medians over --repeats. MiB/s = model MiB / seconds.
Note: ours is two hops (trainer -> param server -> worker), so at the ceiling's speed per hop it would
score 50%; the param server also writes the newest version to disk (its --state-dir, here a temporary
directory; from a thread, after the commit is answered), which the ceiling does not.

Per hop: push_s (trainer -> param server, the commit answered) and fetch_s (from then until HOLD: the worker's
long poll answered, every chunk fetched and checked), each against the one-hop ceiling: push_frac = ceiling_s /
push_s, fetch_frac = ceiling_s / fetch_s (1.0: that hop at the ceiling's speed). cpu_<role>_s: CPU seconds
(user + system, all threads, /proc) each process spends per version, ours' (trainer, ps: the param server,
persisting included; member: installing included) against the ceiling's (source, sink); machine-load noise
moves these far less than wall times. *_paired: the same fractions taken version by version (ours, then the
ceiling right after it, under about the same load), medians.

Prints `RESULT name=weight_sync mb=.. transport=zmq|dir ours_s=.. installed_s=.. push_s=.. fetch_s=.. ceiling_s=..
ours_mb_s=.. ceiling_mb_s=.. frac=.. cpu_*_s=.. push_frac=.. fetch_frac=..`.
"""
import argparse
import os
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

CHUNK = 16 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def say(text: str) -> None:
    os.write(1, (text + "\n").encode())


def member(addr: str, weights_dir: str) -> None:
    """The worker's weight path; prints HOLD/INSTALLED <version> <unix time>."""
    sys.stdout = sys.stderr
    import jax
    import inference_worker
    cfg = inference_worker.Config(param_server=addr, name="member-0", relay=False, weights_dir=weights_dir)
    fetcher = inference_worker.weight_fetcher(cfg, os.urandom(4).hex())
    say("READY")
    version, lineage = -1, ""
    while True:
        buf = fetcher.newest(version + 1, lineage, 60.0)
        if buf is None:
            continue
        version, lineage = buf.key
        say(f"HOLD {version} {time.time():.6f}")
        tensors = buf.manifest.tensor_views(buf.stream)
        params = jax.device_put(dict(tensors))
        jax.block_until_ready(params)
        say(f"INSTALLED {version} {time.time():.6f}")
        fetcher.done(buf)
        del params, tensors, buf


def sink(port_file: str) -> None:
    """Ceiling receiver: PULL; each round: a header (total bytes), then messages until that many."""
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.PULL)
    port = s.bind_to_random_port("tcp://127.0.0.1")
    say(f"PORT {port}")
    while True:
        total = int(s.recv())
        got, frames = 0, []
        while got < total:
            f = s.recv(copy=False)
            got += len(f.buffer)
            frames.append(f)
        say(f"DONE {time.time():.6f}")
        del frames


def source(port: int, nbytes: int) -> None:
    """Ceiling sender: the bytes made once; on each GO line from stdin, send them all."""
    import zmq
    data = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.connect(f"tcp://127.0.0.1:{port}")
    say("READY")
    for line in sys.stdin:
        if not line.startswith("GO"):
            continue
        t0 = time.time()
        s.send(str(nbytes).encode())
        for i in range(0, nbytes, CHUNK):
            s.send(memoryview(data[i:i + CHUNK]), copy=False)
        say(f"SENT {t0:.6f}")


def cpu_s(pid) -> float:
    """CPU seconds (user + system, every thread) a process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(procs) -> None:
    """Kill each process's whole session (they start with start_new_session) and reap it."""
    for p in procs:
        try:
            os.killpg(p.pid, 9)
        except ProcessLookupError:
            pass
        p.wait()


def reader(p, q):
    for line in p.stdout:
        parts = line.split()
        if parts:
            q.put(parts)


def expect(q, word, timeout=300):
    deadline = time.monotonic() + timeout
    while True:
        parts = q.get(timeout=max(0.1, deadline - time.monotonic()))
        if parts[0] == word:
            return parts


def bench(mb: int, repeats: int, warmup: int, tmp: str, weights_dir: str = "") -> dict:
    import weights_zmq
    import wire
    from bench_broadcast import model_tensors
    tensors = model_tensors(mb)  # tensors of 1 to 32 MiB, as bench_broadcast's
    nbytes = sum(a.nbytes for _, a in tensors)
    addr = f"tcp://127.0.0.1:{free_port()}"
    procs = []
    me = os.path.abspath(__file__)
    try:
        ps = subprocess.Popen([sys.executable, "param_server.py", "--bind", addr, "--state-dir",
                               os.path.join(tmp, f"ps-{mb}"), "--keep-versions", "1",
                               "--no-deltas",  # the whole-version path (every version here is the same bytes)
                               *(["--weights-dir", weights_dir] if weights_dir else [])], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(ps)
        mq, sq, rq = queue.Queue(), queue.Queue(), queue.Queue()
        mem = subprocess.Popen([sys.executable, me, "--member", addr, "--weights-dir", weights_dir], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                               stderr=open(os.path.join(tmp, f"member-{mb}.log"), "w"), start_new_session=True)
        procs.append(mem)
        threading.Thread(target=reader, args=(mem, mq), daemon=True).start()
        rcv = subprocess.Popen([sys.executable, me, "--sink"], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
        procs.append(rcv)
        threading.Thread(target=reader, args=(rcv, rq), daemon=True).start()
        port = int(expect(rq, "PORT")[1])
        snd = subprocess.Popen([sys.executable, me, "--source", str(port), str(nbytes)], cwd=ROOT,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        procs.append(snd)
        threading.Thread(target=reader, args=(snd, sq), daemon=True).start()
        client = wire.Client("bench-trainer", addr, timeout_s=120)
        client.call(wire.Ping(), timeout_s=60)
        expect(mq, "READY", 120)
        expect(sq, "READY", 120)
        time.sleep(1.0)  # the fetcher long-polling, the PUSH connected
        ours, inst, push, fetch, ceil = [], [], [], [], []
        roles = {"trainer": os.getpid(), "ps": ps.pid, "member": mem.pid, "source": snd.pid, "sink": rcv.pid}
        cpu = {role: [] for role in roles}
        for version in range(1, warmup + repeats + 1):  # the first `warmup` of each are not counted
            cpu0 = {role: cpu_s(pid) for role, pid in roles.items()}
            t0 = time.time()
            weights_zmq.push_weights(client, version, "bench", tensors)
            t_push = time.time() - t0
            hold = float(expect(mq, "HOLD")[2])
            installed = float(expect(mq, "INSTALLED")[2])
            time.sleep(0.5)
            snd.stdin.write("GO\n")
            snd.stdin.flush()
            t_sent = float(expect(sq, "SENT")[1])
            t_done = float(expect(rq, "DONE")[1])
            print(f"  {mb} MiB v{version}: push {t_push:.2f} s, worker holds after {hold - t0:.2f} s (fetch "
                  f"{hold - t0 - t_push:.2f} s), installed "
                  f"after {installed - t0:.2f} s; ceiling {t_done - t_sent:.2f} s"
                  + ("  (warm-up)" if version <= warmup else ""), flush=True)
            if version > warmup:
                ours.append(hold - t0)
                inst.append(installed - t0)
                push.append(t_push)
                fetch.append(hold - t0 - t_push)
                ceil.append(t_done - t_sent)
            time.sleep(0.5)
            if version > warmup:  # the whole round: ours' processes idle through the ceiling's and back
                for role, pid in roles.items():
                    cpu[role].append(cpu_s(pid) - cpu0[role])
        client.close()
    finally:
        stop(procs)
    med = lambda xs: statistics.median(xs)  # noqa: E731
    mib = nbytes / 2 ** 20
    r = dict(mb=mb, transport="dir" if weights_dir else "zmq", ours_s=med(ours), installed_s=med(inst), push_s=med(push), fetch_s=med(fetch), ceiling_s=med(ceil))
    r.update(ours_mb_s=mib / r["ours_s"], installed_mb_s=mib / r["installed_s"], ceiling_mb_s=mib / r["ceiling_s"])
    r["frac"] = r["ours_mb_s"] / r["ceiling_mb_s"]
    r["installed_frac"] = r["installed_mb_s"] / r["ceiling_mb_s"]
    # CPU seconds per version, each process (the param server's include persisting it; the member's
    # installing it), and all of ours against the ceiling's two.
    r.update({f"cpu_{role}_s": med(xs) for role, xs in cpu.items()})
    r["cpu_ours_s"] = r["cpu_trainer_s"] + r["cpu_ps_s"] + r["cpu_member_s"]
    r["cpu_ceiling_s"] = r["cpu_source_s"] + r["cpu_sink_s"]
    # The same ratios version by version (each of ours beside the ceiling's right after it, so both ran under
    # about the same load from whatever else shares the machine), medians: steadier than the ratio of medians.
    r["frac_paired"] = med([c / o for c, o in zip(ceil, ours)])
    r["push_frac_paired"] = med([c / p for c, p in zip(ceil, push)])
    r["fetch_frac_paired"] = med([c / f for c, f in zip(ceil, fetch)])
    # Each hop alone against the one-hop ceiling (1.0: that hop at the ceiling's speed).
    r["push_frac"], r["fetch_frac"] = r["ceiling_s"] / r["push_s"], r["ceiling_s"] / r["fetch_s"]
    print("RESULT name=weight_sync " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                for k, v in r.items()) + f" repeats={repeats} warmup={warmup}", flush=True)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--repeats", type=int, default=3, help="timed versions per size (after the warm-ups)")
    ap.add_argument("--warmup", type=int, default=3,
                    help="versions per size not timed: the first ones allocate fresh memory in every process (the "
                         "param server's received chunks, the fetcher's buffers, the sink's); from the third on "
                         "each process recycles its earlier versions' memory, as in a run that pushes every step")
    ap.add_argument("--weights-dir", default="", help="measure the shared-directory transport through this directory")
    ap.add_argument("--member", help=argparse.SUPPRESS)
    ap.add_argument("--sink", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--source", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.member:
        return member(args.member, args.weights_dir)
    if args.sink:
        return sink("")
    if args.source:
        return source(*args.source)
    with tempfile.TemporaryDirectory() as tmp:
        for mb in args.sizes_mb:
            bench(mb, args.repeats, args.warmup, tmp, args.weights_dir)


if __name__ == "__main__":
    main()
