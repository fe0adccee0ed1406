"""Weights streamed in chunks, and relayed worker to worker: real processes on loopback.

Run: python -m pytest -q tests/test_broadcast.py      (about 1-2 minutes on a 2-core CPU)

The param server refuses a push with a corrupt chunk, never shows a push that stopped half-way (its
trainer killed) and shows a version only once it is complete; relaying workers (inference_worker.py
--relay) make the server send about one model per version whatever their number, a relay killed in
the middle of a version costs its children nothing but a detour, and malformed chunk requests get
an Error from every chunk server, which keeps serving. A worker whose pulls bring nothing (the server
down) keeps a leased item of a trainer newer than its weights instead of abandoning it.
"""
import time

import jax
import numpy as np
import pytest

import hf_io
import model
import versions
import weights_zmq
import wire
from conftest import free_port, wait_until
from random_weights import nudged

CHUNK = 16 << 10  # small chunks: the tiny model travels as a few dozen of them


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 2-layer byte-level Qwen2 checkpoint (config + weights) and its tensors as pushed (bf16)."""
    path = str(tmp_path_factory.mktemp("tiny"))
    cfg = model.ModelConfig(vocab_size=259, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                            head_dim=16, intermediate_size=192, max_seq_len=96, rope_theta=1e4,
                            rms_norm_eps=1e-6, qkv_bias=True, tie_embeddings=True)
    params = model.init_params(cfg, jax.random.PRNGKey(0))
    hf_io.save_hf(path, cfg, params)
    return path, list(hf_io.iter_hf_tensors(params, cfg, dtype=cfg.jdtype))


def start_ps(roles, tmp_path, *flags):
    addr = f"tcp://127.0.0.1:{free_port()}"
    # --delta-wait-s: a delta of these tiny versions is waited for, however its encoding and the push race
    proc = roles.start("param_server", "param_server.py", "--bind", addr, "--state-dir", str(tmp_path / "ps"),
                       "--delta-wait-s", "30", *flags)
    client = wire.Client("test", addr, timeout_s=10)
    client.call(wire.Ping(), timeout_s=30, what="param server start")
    return proc, client, addr


def start_workers(roles, addr, model_path, n, *flags):
    verifier = f"tcp://127.0.0.1:{free_port()}"  # never called: the workers get no work items
    return [roles.start(f"worker{i}", "inference_worker.py", "--param-server", addr, "--verifier", verifier,
                        "--model", model_path, "--name", f"worker-{i}", "--relay-timeout-s", "1", *flags)
            for i in range(n)]


def fetch(client, version, lineage=""):
    """The served version's tensors, fetched chunk by chunk as a worker does (CRCs checked)."""
    reply = client.call(wire.GetWeights(have_version=-1))
    m = versions.Manifest.from_dict(reply.manifest)
    assert (m.version, m.lineage) == (version, lineage)
    stream = np.concatenate([client.call(wire.GetChunk(m.version, m.lineage, i)).data.copy()
                             for i in range(len(m.chunks))])
    m.check_tensors([stream])
    return m.tensor_views(stream)


def holds(roles, proc, version) -> bool:
    """The worker swapped in `version` (its main thread's log line, after every CRC checked)."""
    return f"weights v{version} in " in roles.log(proc)


def test_a_version_shows_only_complete_and_a_corrupt_chunk_discards_the_push(roles, tmp_path, tiny):
    _, client, _ = start_ps(roles, tmp_path)
    _, tensors = tiny
    weights_zmq.push_weights(client, 1, "", tensors, chunk_bytes=CHUNK)
    chunks = [data for data, _ in versions.cut_chunks(tensors, CHUNK)]
    assert len(chunks) > 4
    # Half a push of version 2: invisible, version 1 is what everyone gets.
    for i, data in enumerate(chunks[:3]):
        client.call(wire.PushChunk("v2", i, data, versions.crc32(data)))
    assert isinstance(client.call(wire.GetWeights(have_version=1)), wire.WeightsUnchanged)
    # One flipped bit in chunk 3: refused at once, and the whole push is gone.
    bad = chunks[3].copy()
    bad[17] ^= 1
    with pytest.raises(wire.RemoteError, match="CRC mismatch on chunk 3: push discarded, still serving v1"):
        client.call(wire.PushChunk("v2", 3, bad, versions.crc32(chunks[3])))
    with pytest.raises(wire.RemoteError, match="no such push"):
        client.call(wire.PushCommit("v2", {}))
    got = fetch(client, 1)
    assert all(got[n].tobytes() == a.tobytes() for n, a in tensors)
    # A complete push with a manifest that lies about a tensor: refused, v1 still served.
    for i, data in enumerate(chunks):
        client.call(wire.PushChunk("v2b", i, data, versions.crc32(data)))
    entries = [[n, a.dtype.name, list(a.shape), versions.crc32(a)] for n, a in tensors]
    entries[-1][3] ^= 1
    manifest = versions.Manifest(2, "", entries, [[int(c.size), versions.crc32(c)] for c in chunks])
    with pytest.raises(wire.RemoteError, match=f"checksum mismatch for tensor '{entries[-1][0]}'"):
        client.call(wire.PushCommit("v2b", manifest.to_dict()))
    fetch(client, 1)
    # The honest version 2 goes through, and only at its commit.
    weights_zmq.push_weights(client, 2, "", tensors, chunk_bytes=CHUNK)
    fetch(client, 2)
    assert client.call(wire.GetStats()).info["pushes_discarded"] == 2


PUSHER = """
import sys, time, numpy as np, weights_zmq, wire
c = wire.Client("pusher", sys.argv[1], timeout_s=10)
def slow():
    for i in range(100):
        yield f"t{i}", np.full(4096, i, np.float32)
        time.sleep(0.05)
print("pushing", flush=True)
weights_zmq.push_weights(c, 9, "", slow(), chunk_bytes=16384)
"""


def test_a_push_whose_trainer_dies_midway_never_shows(roles, tmp_path, tiny):
    proc, client, addr = start_ps(roles, tmp_path, "--push-timeout-s", "1")
    _, tensors = tiny
    weights_zmq.push_weights(client, 1, "", tensors, chunk_bytes=CHUNK)
    pusher = roles.start("pusher", "-c", PUSHER, addr)
    wait_until(lambda: "pushing" in roles.log(pusher), 60, "the pusher to start")
    time.sleep(1.5)                                     # about a dozen chunks in
    roles.kill(pusher)
    assert isinstance(client.call(wire.GetWeights(have_version=1)), wire.WeightsUnchanged)
    wait_until(lambda: "no chunk for 1s" in roles.log(proc), 10, "the half push to be discarded")
    assert client.call(wire.GetStats()).info["version"] == 1
    fetch(client, 1)
    weights_zmq.push_weights(client, 2, "", tensors, chunk_bytes=CHUNK)  # the restarted trainer's push is fine
    fetch(client, 2)


def test_relaying_workers_cost_the_server_one_model_per_version(roles, tmp_path, tiny):
    model_path, tensors = tiny
    nbytes = sum(a.nbytes for _, a in tensors)
    _, client, addr = start_ps(roles, tmp_path)
    workers = start_workers(roles, addr, model_path, 4, "--relay")
    wait_until(lambda: len(client.call(wire.GetStats()).info["relays"]) == 4, 120, "4 workers in the relay tree")
    for version, pushed in ((1, tensors), (2, nudged(tensors, 0.01))):
        info = client.call(wire.GetStats()).info
        before, relayed_before = info["bytes_sent"], info["weights"]["bytes_relayed"]
        weights_zmq.push_weights(client, version, "", pushed, chunk_bytes=CHUNK)
        wait_until(lambda: all(holds(roles, w, version) for w in workers), 60, f"every worker to hold v{version}")
        sent = client.call(wire.GetStats()).info["bytes_sent"] - before
        if version == 1:  # one model (plus message headers and the workers' long polls), not four
            assert nbytes <= sent < 1.3 * nbytes, (version, sent, nbytes)
            # and the relays sent the other three (each reports its count at its next long poll)
            wait_until(lambda: client.call(wire.GetStats()).info["weights"]["bytes_relayed"] >= 3 * nbytes, 30,
                       "the relays to report three models relayed")
        else:  # 1% of the positions changed: the workers hold v1, so a delta travels, once, down the tree
            assert sent < 0.15 * nbytes, (version, sent, nbytes)
            assert all("as a delta from v1" in roles.log(w) for w in workers)
            time.sleep(weights_zmq.WeightFetcher.POLL_S + 1)  # every relay's count reported
            relayed = client.call(wire.GetStats()).info["weights"]["bytes_relayed"] - relayed_before
            assert 0 < relayed < 0.5 * nbytes  # the delta's bytes, relayed to the three children
    assert not any("failed on chunk" in roles.log(w) for w in workers)  # nobody had to go round a relay

    # Malformed chunk requests, to a worker's chunk server and to the param server: Errors, and both
    # keep serving.
    relay = wire.Client("test-relay", next(iter(client.call(wire.GetStats()).info["relays"].values())), timeout_s=10)
    for target in (relay, client):
        for bad in (wire.GetChunk(2, "", -1), wire.GetChunk(2, "", 10**9), wire.GetChunk(2, "other", 0),
                    wire.GetChunk(1 << 62, "", 0), wire.GetChunk(2, "", 0, wait_s=1e9)):
            with pytest.raises(wire.RemoteError):
                target.call(bad)
        target.sock.send_multipart([b"\x92\x01"])  # truncated msgpack: an Error with request id 0
        with pytest.raises(wire.RemoteError, match="malformed"):
            target.call(wire.Ping())
        data = target.call(wire.GetChunk(2, "", 0)).data
        assert versions.crc32(data) == versions.Manifest.from_dict(
            client.call(wire.GetWeights()).manifest).chunks[0][1]
    weights_zmq.push_weights(client, 3, "", tensors, chunk_bytes=CHUNK)
    wait_until(lambda: all(holds(roles, w, 3) for w in workers), 60, "every worker to hold v3")


def test_a_relay_killed_midway_costs_its_children_nothing(roles, tmp_path, tiny):
    model_path, tensors = tiny
    _, client, addr = start_ps(roles, tmp_path, "--relay-fanout", "1")  # a chain: server -> a -> b -> c
    workers = {f"worker-{i}": w for i, w in
               enumerate(start_workers(roles, addr, model_path, 3, "--relay", "--fetch-delay-s", "0.05"))}
    wait_until(lambda: len(client.call(wire.GetStats()).info["relays"]) == 3, 120, "3 workers in the relay tree")
    names = list(client.call(wire.GetStats()).info["relays"])
    a, b, c = [workers[n] for n in names]
    weights_zmq.push_weights(client, 1, "", tensors, chunk_bytes=4096)  # ~60 chunks, 50 ms each at every hop
    time.sleep(0.8)
    assert "fetched weights v1" not in roles.log(b)
    roles.kill(b)                                                   # the middle relay dies mid-version
    wait_until(lambda: holds(roles, a, 1) and holds(roles, c, 1), 60, "a and c to hold v1")
    assert "failed on chunk" in roles.log(c)                        # c went round the dead relay
    # The next version reaches c too, and b restarted (same name) rejoins and gets it.
    b2 = roles.start("worker1-restarted", "inference_worker.py", "--param-server", addr, "--verifier",
                     f"tcp://127.0.0.1:{free_port()}", "--model", model_path, "--name", names[1],
                     "--relay-timeout-s", "1", "--relay")
    wait_until(lambda: "weights v1 in" in roles.log(b2), 120, "the restarted b to hold v1")
    weights_zmq.push_weights(client, 2, "", tensors, chunk_bytes=4096)
    wait_until(lambda: all(holds(roles, w, 2) for w in (a, c, b2)), 90, "a, c and the restarted b to hold v2")
    # A delta version (everyone holds v2), and the middle relay dies in the middle of it: c goes round it
    # for the delta's bytes, and still rebuilds v3 from its own v2.
    detours = roles.log(c).count("failed on chunk")
    weights_zmq.push_weights(client, 3, "", nudged(tensors, 0.01), chunk_bytes=4096)
    time.sleep(0.8)
    assert "fetched weights v3" not in roles.log(b2)
    roles.kill(b2)
    wait_until(lambda: holds(roles, a, 3) and holds(roles, c, 3), 60, "a and c to hold v3")
    assert all("as a delta from v2" in roles.log(w) for w in (a, c))
    assert roles.log(c).count("failed on chunk") > detours


def test_a_worker_that_heard_nothing_new_keeps_a_live_item(roles, tmp_path, tiny):
    """inference_worker.Worker.wait_for_weights: a worker holding v3 of trainer lineage "old" leases
    an item of the newer trainer "new". While the param server is down its pulls bring nothing, and
    that says nothing about the server's newest weights: the worker waits (the item is live) rather
    than abandon it. Once the server is back with the new trainer's weights it samples the item; and
    an item of the old lineage is abandoned only after the server itself named another lineage."""
    import threading

    import inference_worker
    model_path, tensors = tiny
    port = free_port()
    addr = f"tcp://127.0.0.1:{port}"
    proc = roles.start("param_server", "param_server.py", "--bind", addr, "--state-dir", str(tmp_path / "ps1"))
    client = wire.Client("test", addr, timeout_s=10)
    client.call(wire.Ping(), timeout_s=30, what="param server start")
    weights_zmq.push_weights(client, 3, "old", tensors, chunk_bytes=CHUNK)
    worker = inference_worker.Worker(inference_worker.Config(
        param_server=addr, verifier=f"tcp://127.0.0.1:{free_port()}", model=model_path, name="w-live",
        relay=False, timeout_s=1.0))
    worker.WAIT_S = 0.5
    wait_until(lambda: worker.pull(wait_s=0.2) or worker.version == 3, 60, "the worker to hold v3")

    def item(lineage):
        return wire.WorkItem.from_dict({"item_id": f"train/0|{lineage}", "prompt": "x", "group_size": 2,
                                        "seq_len": 16, "max_new_tokens": 4, "min_version": 0,
                                        "lineage": lineage})

    def decide(lineage):
        done = {}
        t = threading.Thread(target=lambda: done.setdefault("action", worker.wait_for_weights([item(lineage)])),
                             daemon=True)
        t.start()
        return t, done

    roles.kill(proc)                                  # the server is gone: pulls time out
    t, done = decide("new")
    t.join(timeout=12)  # pulls that bring nothing (WAIT_S each; over 10 s: Worker's default too) and unanswered questions
    assert "action" not in done, f"the live item was decided without the server: {done}"
    assert (worker.version, worker.lineage) == (3, "old")

    # The server comes back, serving the new trainer's weights: the worker takes them and samples.
    roles.start("param_server2", "param_server.py", "--bind", addr, "--state-dir", str(tmp_path / "ps2"))
    client = wire.Client("test2", addr, timeout_s=10)
    client.call(wire.Ping(), timeout_s=30, what="param server restart")
    weights_zmq.push_weights(client, 0, "new", tensors, chunk_bytes=CHUNK)
    t.join(timeout=60)
    assert done.get("action") == "sample" and (worker.version, worker.lineage) == (0, "new")

    # An item of the old trainer, whose lineage the server no longer serves: abandoned, and only
    # because the server said so.
    t, done = decide("old")
    t.join(timeout=30)
    assert done.get("action") == "abandon"
