"""Delta versions (deltas.py): exact on the bits, checked against the version itself, and the full
version fetched whenever a delta cannot be trusted or used.

Run: python -m pytest -q tests/test_deltas.py      (about a minute on a 2-core CPU)

The codec against every kind of change a bf16 step makes (one ulp, sign flips, -0.0, NaN payloads,
f32 tensors packed with bf16 ones); then a real param_server.py process and this process's own
weights_zmq.WeightFetcher (the worker's weight path): every version it holds equals what was pushed, bit
for bit; a corrupt delta chunk is refused and the version fetched whole; a param server restarted from its
state directory makes the next delta from the version it persisted; a fetcher started afresh (a restarted
worker) gets the full version, then deltas.
"""
import concurrent.futures
import time

import ml_dtypes
import numpy as np
import pytest

import deltas
import versions
import weights_zmq
import wire
from conftest import free_port, wait_until
from random_weights import nudged

CHUNK = 8 << 10


def model(seed=0):
    rng = np.random.default_rng(seed)
    bf = lambda *s: (rng.normal(size=s) * 0.02).astype(ml_dtypes.bfloat16)  # noqa: E731
    return [("model.embed_tokens.weight", bf(200, 64)), ("model.layers.0.input_layernorm.weight", np.ones(64, ml_dtypes.bfloat16)),
            ("model.layers.0.self_attn.q_proj.weight", bf(64, 64)), ("model.layers.0.self_attn.q_proj.bias", bf(64)),
            ("model.layers.0.mlp.up_proj.weight", bf(128, 64)), ("model.norm.weight", rng.normal(size=64).astype(np.float32)),
            ("lm_head.weight", bf(200, 64))]


def delta_of(old, new):
    """(DeltaManifest, chunks) of the version `new` against `old`, as the param server encodes it."""
    va, vb = versions.from_arrays(1, "L", old, chunk_bytes=CHUNK), versions.from_arrays(2, "L", new, chunk_bytes=CHUNK)
    enc = deltas.Encoder(versions.Version(va.manifest, va.chunks()), concurrent.futures.ThreadPoolExecutor(2))
    for i, c in enumerate(vb.chunks()):
        enc.add(i, c)
    assert enc.finish(vb.manifest, 60.0) is enc
    wait_until(lambda: enc.done, 10, "the delta to be encoded")
    return va, vb, deltas.DeltaManifest.from_dict(enc.manifest.to_dict(), vb.manifest), enc.chunks


def rebuild(va, vb, dm, chunks):
    out = np.zeros(vb.manifest.nbytes, np.uint8)
    for i, at in enumerate(vb.manifest.offsets()):
        n = vb.manifest.chunks[i][0]
        deltas.decode(dm.chunks[i][0], chunks[i], va.chunk(i), out[at:at + n], dm.chunks[i][3])
    return out


def test_every_encoding_rebuilds_the_bits_exactly():
    old = model()
    new = [(n, np.array(a)) for n, a in nudged(old, 0.004, 1)]
    emb = new[0][1].view(np.uint16)
    emb[3, :] ^= 0x8000                                   # sign flips: a huge integer difference
    emb[4, :2] = [0x8000, 0x0000]                         # -0.0 and +0.0 (a float compare calls them equal)
    emb[5, :2] = [0x7FC1, 0xFFC3]                         # NaNs with payloads (a float compare never matches)
    new[2] = (new[2][0], np.array(new[2][1]).view(np.uint16) ^ np.uint16(1))  # every position: xor or full
    new[2] = (new[2][0], new[2][1].view(ml_dtypes.bfloat16))
    new[5][1][7] = np.float32(np.nan)
    va, vb, dm, chunks = delta_of(old, new)
    assert (rebuild(va, vb, dm, chunks) == vb.stream).all()
    codecs = {c[0] for c in dm.chunks}
    assert {"same", "sparse"} <= codecs and codecs & {"xor", "full"}, dm.chunks
    assert dm.nbytes < vb.manifest.nbytes / 2
    assert dm.changed["attention"][0] >= 4000 and dm.changed["norms"][0] >= 1
    assert dm.changed["head"][0] < dm.changed["head"][1] * 0.01


def test_a_corrupt_or_misapplied_delta_is_caught_by_the_versions_own_crc():
    va, vb, dm, chunks = delta_of(model(), nudged(model(), 0.01, 2))
    i = next(i for i, c in enumerate(dm.chunks) if c[0] == "sparse")
    out = vb.chunk(i).copy()
    bad = chunks[i].copy()
    bad[-1] ^= 1                                          # one bit of a new value
    deltas.decode("sparse", bad, va.chunk(i), out, dm.chunks[i][3])
    assert versions.crc32(out) != vb.manifest.chunks[i][1]
    bad = chunks[i].copy()
    bad[:4] = 255                                         # an index past the chunk's end
    with pytest.raises(ValueError, match="outside its chunk"):
        deltas.decode("sparse", bad, va.chunk(i), out, dm.chunks[i][3])
    with pytest.raises(ValueError, match="does not decompress"):
        deltas.decode("xor", np.frombuffer(b"not zlib", np.uint8), va.chunk(i), out, 2)
    # the right delta on the wrong base: the rebuilt chunk is not the version's
    other = versions.from_arrays(1, "L", nudged(model(), 0.05, 9), chunk_bytes=CHUNK)
    deltas.decode("sparse", chunks[i], other.chunk(i), out, dm.chunks[i][3])
    assert versions.crc32(out) != vb.manifest.chunks[i][1]
    # a delta manifest that does not describe the version is refused where it is received
    with pytest.raises(wire.WireError):
        deltas.DeltaManifest.from_dict({**dm.to_dict(), "chunks": dm.chunks[:-1]}, vb.manifest)
    with pytest.raises(wire.WireError):
        deltas.DeltaManifest.from_dict({**dm.to_dict(), "base": 5}, vb.manifest)


def start_ps(roles, state_dir, addr=None):
    addr = addr or f"tcp://127.0.0.1:{free_port()}"
    # --delta-wait-s: each delta is waited for, however its encoding and the (millisecond) push race
    proc = roles.start("param_server", "param_server.py", "--bind", addr, "--state-dir", str(state_dir),
                       "--delta-wait-s", "30")
    client = wire.Client("test", addr, timeout_s=10)
    client.call(wire.Ping(), timeout_s=30, what="param server start")
    return proc, client, addr


class Fetcher:
    """The worker's weight path in this process: weights_zmq.WeightFetcher, its log kept."""

    def __init__(self, addr, name="w"):
        self.lines = []
        self.f = weights_zmq.WeightFetcher(name, addr, "inc-" + name, log=self.lines.append, timeout_s=5,
                                           relay_bind=None, relay_timeout_s=1)

    def take(self, version, lineage="L"):
        """The version once offered: installed (done), its bytes returned (a copy)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            buf = self.f.newest(version, lineage, 1.0)
            if buf is not None and buf.key.version == version:
                stream = buf.stream.copy()
                self.f.done(buf)
                return stream, buf
        raise AssertionError(f"v{version} never arrived: {self.lines[-5:]}")


def pushed(version, tensors):
    return versions.from_arrays(version, "L", tensors, chunk_bytes=CHUNK).stream


def test_the_fetcher_holds_every_version_bit_for_bit_and_falls_back_to_the_whole_version(roles, tmp_path, monkeypatch):
    _, client, addr = start_ps(roles, tmp_path / "ps")
    w = Fetcher(addr)
    tensors = model()
    weights_zmq.push_weights(client, 1, "L", tensors, chunk_bytes=CHUNK)
    got, buf = w.take(1)
    assert buf.delta is None and (got == pushed(1, tensors)).all()
    for v in (2, 3, 4):                                   # deltas, each from the version before
        tensors = nudged(tensors, 0.01, v)
        weights_zmq.push_weights(client, v, "L", tensors, chunk_bytes=CHUNK)
        got, buf = w.take(v)
        assert buf.delta is not None and buf.delta.base == v - 1
        assert (got == pushed(v, tensors)).all()
        assert buf.fetched_bytes < 0.2 * buf.manifest.nbytes
    stats = client.call(wire.GetStats()).info["weights"]
    assert 0 < stats["bytes_served_delta"] < 0.5 * stats["bytes_served_full"]
    assert stats["delta_changed"]["mlp"][1] == 128 * 64 and 0 < stats["delta_bytes"] < stats["version_bytes"]

    # A delta chunk corrupted on its way: refused, and the version fetched whole, still bit for bit.
    real_ask = weights_zmq.WeightFetcher.ask

    def corrupting(self, source, manifest, indices, delta=False):
        for reply in real_ask(self, source, manifest, indices, delta):
            if delta and reply.index == indices[-1]:
                reply.data = reply.data.copy()
                reply.data[0] ^= 1
            yield reply
    monkeypatch.setattr(weights_zmq.WeightFetcher, "ask", corrupting)
    full_before = client.call(wire.GetStats()).info["weights"]["bytes_served_full"]
    tensors = nudged(tensors, 0.01, 5)
    weights_zmq.push_weights(client, 5, "L", tensors, chunk_bytes=CHUNK)
    got, buf = w.take(5)
    assert buf.delta is None and (got == pushed(5, tensors)).all()
    assert any("(delta) refused" in line and "corrupt" in line for line in w.lines), w.lines[-5:]
    assert client.call(wire.GetStats()).info["weights"]["bytes_served_full"] - full_before == buf.manifest.nbytes


def test_restarts_of_the_server_and_of_a_worker_end_with_the_right_bits(roles, tmp_path):
    proc, client, addr = start_ps(roles, tmp_path / "ps")
    w = Fetcher(addr, "a")
    tensors = model()
    weights_zmq.push_weights(client, 1, "L", tensors, chunk_bytes=CHUNK)
    w.take(1)
    # The server restarts from its state directory: it serves v1 from disk, and the trainer's next
    # version reaches the worker (which kept v1) as a delta from it.
    weights_zmq.push_weights(client, 2, "L", tensors := nudged(tensors, 0.01, 2), chunk_bytes=CHUNK)
    w.take(2)
    wait_until(lambda: client.call(wire.GetStats()).info["persisted_version"] == 2, 30, "v2 on disk")
    roles.kill(proc)
    _, client, _ = start_ps(roles, tmp_path / "ps", addr)
    assert client.call(wire.GetStats()).info["version"] == 2
    weights_zmq.push_weights(client, 3, "L", tensors := nudged(tensors, 0.01, 3), chunk_bytes=CHUNK)
    got, buf = w.take(3)
    assert buf.delta is not None and buf.delta.base == 2 and (got == pushed(3, tensors)).all()
    # A worker started afresh holds nothing: the whole version, then deltas again.
    fresh = Fetcher(addr, "b")
    got, buf = fresh.take(3)
    assert buf.delta is None and (got == pushed(3, tensors)).all()
    weights_zmq.push_weights(client, 4, "L", tensors := nudged(tensors, 0.01, 4), chunk_bytes=CHUNK)
    for f in (w, fresh):
        got, buf = f.take(4)
        assert buf.delta is not None and (got == pushed(4, tensors)).all()
    # A new trainer lineage (a restarted trainer) is never a delta of the old one's versions.
    weights_zmq.push_weights(client, 0, "M", tensors, chunk_bytes=CHUNK)
    got, buf = w.take(0, "M")
    assert buf.delta is None and (got == versions.from_arrays(0, "M", tensors, chunk_bytes=CHUNK).stream).all()
