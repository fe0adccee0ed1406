"""Wire format and socket behaviour. Run: python -m pytest -q tests/test_wire.py"""
import threading
import time
import zlib

import ml_dtypes
import numpy as np
import pytest
import zmq

import versions
import curve
import wire


@pytest.mark.parametrize("cls", list(wire.MESSAGES.values()))
def test_every_message_round_trips(cls):
    # Fill every field with a value of its declared type, arrays included where lists are allowed.
    values = {}
    for f in wire.dataclasses.fields(cls):
        hint = wire.typing.get_type_hints(cls)[f.name]
        values[f.name] = {int: 7, float: 0.5, str: "x", bool: True,
                          list: [np.arange(6, dtype=np.int32).reshape(2, 3), "s", 3],
                          dict: {"a": np.ones(3, ml_dtypes.bfloat16), "b": [1, 2]},
                          np.ndarray: np.arange(6, dtype=np.uint8)}[hint]
    msg = cls(**values)
    got, rid = wire.decode(wire.encode(msg, rid=42))
    assert rid == 42 and type(got) is cls
    for name, value in values.items():
        out = getattr(got, name)
        if isinstance(value, list):
            assert np.array_equal(out[0], value[0]) and out[0].dtype == np.int32 and out[1:] == value[1:]
        elif isinstance(value, np.ndarray):
            assert out.dtype == value.dtype and np.array_equal(out, value)
        elif isinstance(value, dict):
            assert out["a"].dtype == ml_dtypes.bfloat16 and np.array_equal(out["a"], value["a"])
            assert out["b"] == [1, 2]
        else:
            assert out == value


def test_bf16_array_travels_bit_exact():
    x = (np.random.default_rng(0).standard_normal((17, 5)) * 1e3).astype(ml_dtypes.bfloat16)
    msg, _ = wire.decode(wire.encode(wire.Rollouts([{"w": x}])))
    assert msg.rollouts[0]["w"].tobytes() == x.tobytes() and msg.rollouts[0]["w"].shape == (17, 5)


@pytest.mark.parametrize("frames, reason", [
    ([], "empty"),
    ([b"\xc1garbage"], "not msgpack"),
    ([wire.msgpack.packb([1, 2])], "must be a map"),
    ([wire.msgpack.packb({"type": "ping", "v": 99, "rid": 1, "body": {}})], "protocol version"),
    ([wire.msgpack.packb({"type": "nope", "v": 1, "rid": 1, "body": {}})], "unknown message type"),
    ([wire.msgpack.packb({"type": "lease_work", "v": 1, "rid": 1, "body": {}})], "missing fields"),
    ([wire.msgpack.packb({"type": "ping", "v": 1, "rid": 1, "body": {"x": 1}})], "unknown fields"),
    ([wire.msgpack.packb({"type": "lease_work", "v": 1, "rid": 1, "body": {"worker": 5}})], "must be str"),
    ([wire.msgpack.packb({"type": "weights_unchanged", "v": 1, "rid": 1, "body": {"version": True}})],
     "must be int"),
    ([wire.msgpack.packb({"type": "work", "v": 1, "rid": 1,
                          "body": {"items": [{"__nd__": 0, "dtype": "float32", "shape": [4]}]}}), b"abc"],
     "expected"),
    ([wire.msgpack.packb({"type": "work", "v": 1, "rid": 1,
                          "body": {"items": [{"__nd__": 3, "dtype": "float32", "shape": [1]}]}})],
     "bad array reference"),
    ([wire.msgpack.packb({"type": "work", "v": 1, "rid": 1,
                          "body": {"items": [{"__nd__": 0, "dtype": "object", "shape": [1]}]}}), b"x"],
     "bad array reference"),
])
def test_malformed_messages_are_clear_errors(frames, reason):
    with pytest.raises(wire.WireError, match=reason):
        wire.decode(frames)


# ----------------------------------------------------------------------------- a version per token


def rollout_map(drop=(), **over):
    """A rollout map as a worker with --inflight sends it: G = 2 rows of T = 5 slots, [prompt, 3
    completion tokens, padding] and [prompt, 4 completion tokens]; both rows started at version 4,
    row 1 finished at 5 (the weights changed in the middle of it). Unsampled slots hold 0. `over`
    replaces fields, `drop` removes them."""
    d = dict(item_id="train/0|p0", version=4, lineage="L", worker="w", prompt_len=1,
             tokens_GT=np.arange(10, dtype=np.int32).reshape(2, 5),
             logp_behav_GT=np.full((2, 5), -0.5, np.float32),
             mask_GT=np.array([[0, 1, 1, 1, 0], [0, 1, 1, 1, 1]], np.float32),
             rewards_G=np.array([0.0, 1.0], np.float32), finished_G=np.array([True, False]),
             statuses=["failed", "passed"],
             versions_GT=np.array([[0, 4, 4, 4, 0], [0, 4, 4, 5, 5]], np.int32), inflight="keep")
    d.update(over)
    return {k: v for k, v in d.items() if k not in drop}


def through_the_wire(d):
    """The map as the param server receives it (SubmitRollout) and as the trainer does (Rollouts,
    after the server's Rollout.to_dict): both parsed by Rollout.from_dict."""
    msg, _ = wire.decode(wire.encode(wire.SubmitRollout("w", d["item_id"], "lease", d)))
    at_server = wire.Rollout.from_dict(msg.rollout)
    msg, _ = wire.decode(wire.encode(wire.Rollouts([at_server.to_dict()])))
    return at_server, wire.Rollout.from_dict(msg.rollouts[0])


@pytest.mark.parametrize("over", [
    {},
    {"inflight": "recompute"},
    {"versions_GT": np.array([[0, 4, 5, 6, 0], [0, 5, 5, 5, 6]], np.int32)},   # two swaps; rows differ
    {"versions_GT": np.array([[-1, 4, 4, 4, 99], [7, 5, 5, 5, 5]], np.int32)},  # unsampled slots: anything
    {"versions_GT": np.full((2, 5), 4, np.int32), "inflight": "off"},           # one version, spelled out
    {"version": 0, "versions_GT": np.array([[0, 0, 0, 1, 0], [0, 0, 1, 1, 1]], np.int32)},
])
def test_a_rollout_with_token_versions_round_trips(over):
    import lifecycle
    d = rollout_map(**over)
    for r in (wire.Rollout.from_dict(d), *through_the_wire(d)):
        assert r.version == d["version"] and r.inflight == d["inflight"]
        assert r.versions_GT.dtype == np.int32 and np.array_equal(r.versions_GT, d["versions_GT"])
        assert r.token_versions().dtype == np.int32 and np.array_equal(r.token_versions(), d["versions_GT"])
        assert lifecycle.rollout_version(r.token_versions(), r.mask_GT) == r.version
        for name in ("tokens_GT", "logp_behav_GT", "mask_GT", "rewards_G", "finished_G"):
            assert np.array_equal(getattr(r, name), d[name]) and getattr(r, name).dtype == d[name].dtype


@pytest.mark.parametrize("over, reason", [
    ({"versions_GT": np.full((2, 4), 4, np.int32)}, r"versions_GT must be int32 of shape \(2, 5\)"),
    ({"versions_GT": np.full((5, 2), 4, np.int32)}, "versions_GT must be int32 of shape"),
    ({"versions_GT": np.full((3, 5), 4, np.int32)}, "versions_GT must be int32 of shape"),
    ({"versions_GT": np.full(10, 4, np.int32)}, "versions_GT must be int32 of shape"),       # [G * T]
    ({"versions_GT": np.full((1, 2, 5), 4, np.int32)}, "versions_GT must be int32 of shape"),
    ({"versions_GT": np.full((2, 5), 4, np.int64)}, "versions_GT must be int32"),
    ({"versions_GT": np.full((2, 5), 4, np.int16)}, "versions_GT must be int32"),
    ({"versions_GT": np.full((2, 5), 4, np.float32)}, "versions_GT must be int32"),
    ({"versions_GT": np.full((2, 5), 4, np.uint32)}, "versions_GT must be int32"),
    ({"versions_GT": [[4] * 5] * 2}, "versions_GT must be ndarray"),
    ({"version": 5}, "rollout.version 5 is not its oldest token's version 4"),   # the newest, not the oldest
    ({"version": 3}, "is not its oldest token's version 4"),                     # older than any token
    ({"version": 0}, "is not its oldest token's version 4"),                     # an unsampled slot's
    ({"versions_GT": np.array([[0, 4, 4, 4, 3], [0, 4, 4, 5, 5]], np.int32), "version": 3},
     "is not its oldest token's version 4"),                                     # ... as is padding
    ({"inflight": "on"}, "inflight must be off, keep or recompute"),
    ({"inflight": "KEEP"}, "inflight must be off, keep or recompute"),
    ({"inflight": ""}, "inflight must be off, keep or recompute"),
    ({"inflight": 1}, "inflight must be str"),
    ({"inflight": None}, "inflight must be str"),
])
def test_a_rollout_with_malformed_token_versions_is_refused(over, reason):
    d = rollout_map(**over)
    with pytest.raises(wire.WireError, match=reason):
        wire.Rollout.from_dict(d)
    msg, _ = wire.decode(wire.encode(wire.SubmitRollout("w", d["item_id"], "lease", d)))
    with pytest.raises(wire.WireError, match=reason):  # the same, as the param server receives it
        wire.Rollout.from_dict(msg.rollout)


@pytest.mark.parametrize("drop, over", [
    (("versions_GT", "inflight"), {}),                       # an old worker: neither field
    (("versions_GT",), {"inflight": "off"}),
    ((), {"versions_GT": np.zeros((0, 0), np.int32), "inflight": "off"}),   # empty: every token at version
])
def test_an_old_style_rollout_parses_and_every_token_has_its_version(drop, over):
    d = rollout_map(drop=drop, **over)
    for r in (wire.Rollout.from_dict(d), *through_the_wire(d)):
        assert r.inflight == "off" and r.versions_GT.size == 0
        assert r.token_versions().dtype == np.int32 and r.token_versions().tolist() == [[4] * 5] * 2
    assert wire.Rollout.from_dict(rollout_map(drop=drop, version=9, **over)).token_versions().tolist() == \
        [[9] * 5] * 2  # any version: nothing to compare it with


def test_server_answers_bad_messages_and_keeps_serving():
    server = wire.Server("echo", "tcp://127.0.0.1:0")
    port = server.sock.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1]
    addr = f"tcp://127.0.0.1:{port}"

    def lease(msg, peer):
        if msg.max_items < 0:
            raise ValueError("max_items must be >= 0")
        return wire.Work(items=[{"n": msg.max_items}])
    server.on(wire.LeaseWork, lease)
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
    thread.start()
    try:
        client = wire.Client("t", addr, timeout_s=5)
        raw = zmq.Context.instance().socket(zmq.DEALER)
        raw.connect(addr)
        raw.send_multipart([b"\x00\xffjunk", b"tail"])       # garbage
        reply, _ = wire.decode(raw.recv_multipart())
        assert isinstance(reply, wire.Error) and "malformed" in reply.error
        with pytest.raises(wire.RemoteError, match="max_items must be >= 0"):
            client.call(wire.LeaseWork(worker="w", max_items=-1))
        with pytest.raises(wire.RemoteError, match="does not serve"):
            client.call(wire.GetStats())
        assert client.call(wire.LeaseWork(worker="w", max_items=2)).items == [{"n": 2}]
        assert isinstance(client.call(wire.Ping()), wire.Pong)
        assert server.bad_messages == 2
        raw.close(0)
    finally:
        stop.set()
        thread.join()
        server.close()


def test_pipeline_keeps_requests_in_flight_and_yields_replies_in_order():
    """A server that holds every request until it has `window` of them, then answers them newest
    first: the client must have sent them all without waiting, and must still hand the replies out in
    request order; an Error reply ends the pipeline with RemoteError, and the client stays usable."""
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def serve():
        held = []
        while not stop.is_set():
            if not router.poll(50):
                continue
            frames = router.recv_multipart()
            msg, rid = wire.decode(frames[1:])
            reply = (wire.Error("no 13 here") if msg.max_items == 13 else wire.Work([{"n": msg.max_items}]))
            held.append((frames[0], rid, reply))
            if len(held) == 3 or msg.max_items in (13, 99):
                for identity, r, answer in reversed(held):
                    router.send_multipart([identity] + wire.encode(answer, r))
                held = []
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        client = wire.Client("t", f"tcp://127.0.0.1:{port}", timeout_s=5)
        msgs = (wire.LeaseWork(worker="w", max_items=n) for n in range(6))
        assert [r.items[0]["n"] for r in client.pipeline(msgs, window=3)] == list(range(6))
        with pytest.raises(TimeoutError):  # a window of 2 never fills this server's batch of 3
            list(client.pipeline((wire.LeaseWork(worker="w", max_items=n) for n in range(4)), window=2,
                                 timeout_s=0.5))
        got = []
        with pytest.raises(wire.RemoteError, match="no 13 here"):
            for r in client.pipeline((wire.LeaseWork(worker="w", max_items=n) for n in (10, 11, 13, 14)), 3):
                got.append(r.items[0]["n"])
        assert got == [10, 11]
        assert client.call(wire.LeaseWork(worker="w", max_items=99)).items == [{"n": 99}]  # stale replies dropped
    finally:
        stop.set()
        thread.join()
        router.close(0)


def cut_all(arrays, chunk_bytes):
    """versions.cut_chunks run to its end: (chunks, their CRCs, the manifest's tensor entries)."""
    gen, pieces = versions.cut_chunks(iter(arrays), chunk_bytes=chunk_bytes), []
    while True:
        try:
            pieces.append(next(gen))
        except StopIteration as end:
            return [c for c, _ in pieces], [crc for _, crc in pieces], end.value


def test_cut_chunks_views_big_tensors_and_lays_bytes_end_to_end():
    """Chunks are the tensors' bytes end to end, at most chunk_bytes each; a tensor of at least
    chunk_bytes / 16 has chunks of its own that are views of it (no copy, no tensor boundary inside),
    smaller ones are packed together into assembled chunks; the chunk and tensor CRCs (combined from
    the pieces') are zlib's."""
    rng = np.random.default_rng(0)
    arrays = [("a", rng.standard_normal(5).astype(np.float32)),           # 20 B: small (< 1024 / 16)
              ("b", rng.standard_normal(300).astype(np.float32)),         # 1200 B: 1024 + 176, views
              ("c", np.arange(7, dtype=np.int32)), ("e", np.zeros(0, np.float32)),
              ("f", rng.standard_normal(3).astype(np.float32)),           # c + f: 40 B packed
              ("d", rng.standard_normal((40, 3)).astype(ml_dtypes.bfloat16))]  # 240 B: its own
    arrays += [(f"s{i}", rng.standard_normal(15).astype(np.float32)) for i in range(30)]  # 60 B each: 1800 B packed
    chunks, crcs, tensors = cut_all(arrays, chunk_bytes=1024)
    stream = np.concatenate([a.reshape(-1).view(np.uint8) for _, a in arrays])
    assert np.array_equal(np.concatenate(chunks), stream)
    assert [len(c) for c in chunks] == [20, 1024, 176, 40, 240, 1024, 776]
    assert np.shares_memory(chunks[1], arrays[1][1]) and np.shares_memory(chunks[2], arrays[1][1])
    assert np.shares_memory(chunks[4], arrays[5][1]) and not np.shares_memory(chunks[3], arrays[2][1])
    assert crcs == [zlib.crc32(c.tobytes()) for c in chunks]
    assert [t[0] for t in tensors] == [name for name, _ in arrays]
    assert [t[3] for t in tensors] == [zlib.crc32(a.tobytes()) for _, a in arrays]


def test_crc32_combine_is_zlibs_crc_of_the_joined_bytes():
    rng = np.random.default_rng(1)
    for _ in range(200):
        a, b = (rng.integers(0, 256, int(rng.choice([0, 1, 3, rng.integers(0, 4000)])), np.uint8).tobytes()
                for _ in range(2))
        assert versions.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_check_tensors_from_known_chunk_crcs_agrees_with_reading_the_bytes():
    """Given the chunks' CRCs, check_tensors solves each chunk's largest segment instead of reading
    it: for chunk sizes that put the tensor boundaries anywhere, it accepts the true manifest and
    names a tensor whose CRC is wrong, as reading every byte does."""
    rng = np.random.default_rng(2)
    arrays = [("a", rng.standard_normal(1000).astype(np.float32)), ("b", rng.standard_normal(10).astype(np.float32)),
              ("e", np.zeros(0, np.float32)), ("c", rng.standard_normal(700).astype(np.float32))]
    for chunk_bytes in (16, 100, 512, 4000, 4040, 8192):
        chunks, crcs, tensors = cut_all(arrays, chunk_bytes=chunk_bytes)
        m = versions.Manifest(1, "", tensors, [[int(c.size), crc] for c, crc in zip(chunks, crcs)])
        m.check_tensors(chunks)
        m.check_tensors(chunks, crcs)
        for wrong in ("a", "b", "c"):
            bad = versions.Manifest(1, "", [t[:3] + [t[3] ^ 1] if t[0] == wrong else t for t in tensors], m.chunks)
            for given in (None, crcs):
                with pytest.raises(ValueError, match=f"checksum mismatch for tensor '{wrong}'"):
                    bad.check_tensors(chunks, given)


def test_client_timeout_names_what_it_waited_for():
    ctx = zmq.Context.instance()
    silent = ctx.socket(zmq.ROUTER)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    client = wire.Client("worker-0", f"tcp://127.0.0.1:{port}", timeout_s=0.2)
    with pytest.raises(TimeoutError, match=r"worker-0: no reply to lease_work \(work item\) from tcp://127.0.0.1"):
        client.call(wire.LeaseWork(worker="w"), what="work item")
    silent.close(0)
    client.close()


def test_send_receive_reconnect_are_call_in_parts():
    """A request's id comes back on its reply; receive gives None when nothing came; after reconnect
    the reply to a request sent before it is never read (what call relies on when it gives up)."""
    server = wire.Server("echo", "tcp://127.0.0.1:0")
    addr = server.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
    stop = threading.Event()
    held, release = [], threading.Event()  # a LeaseWork is answered only once `release` is set

    def tick():  # on the serving thread: a ZeroMQ socket belongs to one thread
        if release.is_set() and held:
            server.reply(held.pop(), wire.Work(items=[]))
    server.on(wire.LeaseWork, lambda msg, peer: held.append(peer))
    thread = threading.Thread(target=server.serve, args=(stop, tick), daemon=True)
    thread.start()
    client = wire.Client("t", addr, timeout_s=5)
    try:
        assert client.receive(0.05) is None
        first, second = client.send(wire.Ping()), client.send(wire.Ping())
        got = [client.receive(5), client.receive(5)]
        assert second > first and [rid for _, rid in got] == [first, second]
        assert all(isinstance(reply, wire.Pong) for reply, _ in got)
        client.send(wire.LeaseWork(worker="w"))
        assert wait_for(lambda: held)
        client.reconnect()
        release.set()  # the reply goes to the old socket: lost with it
        assert wait_for(lambda: not held)
        rid = client.send(wire.Ping())
        assert client.receive(5)[1] == rid and client.receive(0.2) is None
    finally:
        client.close()
        stop.set()
        thread.join()
        server.close()


def test_call_with_pings_waits_on_a_live_server_and_gives_up_on_a_hung_one():
    """call(ping_s=...) pings while the reply is outstanding: a server that defers its reply but
    answers pings is waited for; one whose serving loop hangs (no pong within 2 x ping_s) is given
    up on long before timeout_s, and the socket is fresh: the late reply is never read."""
    server = wire.Server("slow", "tcp://127.0.0.1:0")
    addr = server.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
    stop, held, pings = threading.Event(), [], []

    def tick():  # answer a held LeaseWork 0.5 s after it came
        if held and time.monotonic() > held[0][1] + 0.5:
            server.reply(held.pop()[0], wire.Work(items=[]))
    server.on(wire.Ping, lambda msg, peer: pings.append(peer) or wire.Pong("slow", server.instance))
    server.on(wire.LeaseWork, lambda msg, peer: held.append((peer, time.monotonic())))
    server.on(wire.GetStats, lambda msg, peer: time.sleep(0.8) or wire.Ok())  # the loop hangs meanwhile
    thread = threading.Thread(target=server.serve, args=(stop, tick, 10), daemon=True)
    thread.start()
    client = wire.Client("t", addr, timeout_s=5)
    try:
        assert isinstance(client.call(wire.LeaseWork(worker="w"), ping_s=0.1), wire.Work)
        assert len(pings) >= 2  # about one per 0.1 s of the 0.5 s wait
        with pytest.raises(TimeoutError, match=r"no reply to get_stats \(stats\) from .* and no pong within 0.2s"):
            client.call(wire.GetStats(), what="stats", ping_s=0.1)
        assert isinstance(client.call(wire.Ping()), wire.Pong)  # not the late Ok
    finally:
        client.close()
        stop.set()
        thread.join()
        server.close()


def wait_for(predicate, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def test_non_loopback_bind_requires_curve():
    with pytest.raises(ValueError, match="without CURVE keys"):
        wire.Server("ps", "tcp://0.0.0.0:0")


def test_curve_client_without_key_is_refused(tmp_path):
    import subprocess, sys
    subprocess.run([sys.executable, "curve.py", "keygen", str(tmp_path)], check=True,
                   cwd=wire.__file__.rsplit("/", 1)[0], capture_output=True)
    key = str(tmp_path / "curve.key")
    server = wire.Server("secure", "tcp://127.0.0.1:0", curve_key=key)
    port = server.sock.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1]
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
    thread.start()
    try:
        good = wire.Client("good", f"tcp://127.0.0.1:{port}", timeout_s=5, curve_key=key)
        assert isinstance(good.call(wire.Ping()), wire.Pong)
        bad = wire.Client("bad", f"tcp://127.0.0.1:{port}", timeout_s=0.5)
        with pytest.raises(TimeoutError):
            bad.call(wire.Ping())
        good.close(); bad.close()
    finally:
        stop.set(); thread.join(); server.close()


def _keygen(tmp_path, sub, name):
    """`python curve.py keygen` itself: the pair DIR/NAME.key (chmod 600) and DIR/NAME.pub."""
    import subprocess, sys
    out = tmp_path / sub
    subprocess.run([sys.executable, "curve.py", "keygen", str(out), "--name", name], check=True,
                   cwd=wire.__file__.rsplit("/", 1)[0], capture_output=True)
    key, pub = out / f"{name}.key", out / f"{name}.pub"
    assert key.stat().st_mode & 0o777 == 0o600
    assert pub.read_text().strip() == key.read_text().splitlines()[0]
    return str(key), str(pub)


def _serve(server):
    port = server.sock.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1]
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
    thread.start()
    return f"tcp://127.0.0.1:{port}", stop, thread


def test_curve_allowlist_admits_listed_clients_only(tmp_path, monkeypatch):
    server_key, server_pub = _keygen(tmp_path, "server", "server")
    allowed_key, _ = _keygen(tmp_path, "clients", "worker0")  # clients/worker0.pub: the allowlist
    stranger_key, _ = _keygen(tmp_path, "elsewhere", "stranger")  # a valid pair nobody allowed
    server = wire.Server("ps", "tcp://127.0.0.1:0", curve_key=server_key,
                         curve_clients=str(tmp_path / "clients"))
    pings = []
    server.on(wire.Ping, lambda m, p: pings.append(p) or wire.Pong(server.name, server.instance))
    addr, stop, thread = _serve(server)
    monkeypatch.setenv("RLAX_CURVE_SERVER_KEY", server_pub)  # clients find the server key in the env
    try:
        good = wire.Client("good", addr, timeout_s=5, curve_key=allowed_key)
        assert isinstance(good.call(wire.Ping()), wire.Pong) and len(pings) == 1
        bad = wire.Client("bad", addr, timeout_s=0.5, curve_key=stranger_key)
        with pytest.raises(TimeoutError, match="bad: no reply to ping"):
            bad.call(wire.Ping())
        assert len(pings) == 1  # the stranger's request never reached a handler
        assert server.refused_clients >= 1
        assert isinstance(good.call(wire.Ping()), wire.Pong) and len(pings) == 2  # still serving
        good.close(); bad.close()
    finally:
        stop.set(); thread.join(); server.close()


def test_shared_pair_allows_only_its_own_key(tmp_path):
    # Only RLAX_CURVE_KEY, as today: the shared pair's public key is the one allowed client key.
    shared, shared_pub = _keygen(tmp_path, "keys", "curve")
    stranger, _ = _keygen(tmp_path, "other", "curve")
    server = wire.Server("ps", "tcp://127.0.0.1:0", curve_key=shared)
    addr, stop, thread = _serve(server)
    try:
        good = wire.Client("good", addr, timeout_s=5, curve_key=shared)
        assert isinstance(good.call(wire.Ping()), wire.Pong)
        bad = wire.Client("bad", addr, timeout_s=0.5, curve_key=stranger, curve_server_key=shared_pub)
        with pytest.raises(TimeoutError):
            bad.call(wire.Ping())
        assert isinstance(good.call(wire.Ping()), wire.Pong)
        good.close(); bad.close()
    finally:
        stop.set(); thread.join(); server.close()


def test_allowlist_sources_and_misconfiguration(tmp_path, monkeypatch):
    a, b = (zmq.curve_keypair()[0] for _ in range(2))
    listing = tmp_path / "clients.txt"
    listing.write_text(f"# the workers\n{a.decode()}\n\n{b.decode()}  # worker1\n")
    assert curve.load_client_keys(str(listing)) == {a, b}
    assert curve.load_client_keys([a.decode(), b]) == {a, b}
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no client public keys"):
        curve.load_client_keys(str(tmp_path / "empty"))
    listing.write_text("not-a-key\n")
    with pytest.raises(ValueError, match="not a Z85 CURVE key"):
        curve.load_client_keys(str(listing))
    monkeypatch.setenv("RLAX_CURVE_CLIENTS", str(tmp_path / "empty"))
    monkeypatch.delenv("RLAX_CURVE_KEY", raising=False)
    with pytest.raises(ValueError, match="needs the server's own CURVE key pair"):
        wire.Server("ps", "tcp://127.0.0.1:0")
    with pytest.raises(ValueError, match="needs the client's own CURVE key pair"):
        wire.Client("w", "tcp://127.0.0.1:1", curve_server_key=str(listing))
