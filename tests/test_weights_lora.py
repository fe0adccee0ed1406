"""Adapter versions (LoRA) on the weight path: manifests, the param server's pinned base, fetchers
that get the base once, and the worker's install (lora.merge onto the base on the device).

Run: python -m pytest -q tests/test_weights_lora.py      (about 15 s on a 2-core CPU)

A LoRA trainer pushes its base as a full version once per lineage; every later version is the
adapter alone, naming that base. These tests check the wire's side of it with small tensors: an
adapter version carries only adapter bytes, the param server keeps its base whatever keep_versions
says and across a restart, a fetcher that lacks the base (late, restarted, a relay's child) gets the
base then the newest adapter, a new lineage drops the old base, and malformed manifests are refused
while the server keeps serving.
"""
import threading
import types

import jax
import ml_dtypes
import numpy as np
import pytest

import hf_io
import inference_worker
import lora
import model
import versions
import weights_zmq
import wire
from conftest import free_port, wait_until
from random_weights import random_params

LORA = {"rank": 2, "alpha": 4.0, "targets": ["q_proj", "v_proj"]}


def full(version, n=3000):
    """A full version's tensors: big enough for chunks of their own (chunk_bytes 4096)."""
    return [("w.big", np.full(n, version + 1, ml_dtypes.bfloat16)), ("w.small", np.arange(7, dtype=np.float32))]


def adapter(version):
    return [("lora.layers.q_proj.A", np.full((1, 2, 8), version, np.float32)),
            ("lora.layers.q_proj.B", np.full((1, 8, 2), -version, np.float32))]


def nbytes(named):
    return sum(a.nbytes for _, a in named)


def commit(store, version, lineage, named, base=None, lora_cfg=None):
    """A push straight into a WeightStore (no socket): the chunks, then the commit."""
    push_id = f"{lineage}/{version}/{base}"
    chunks = list(versions.cut_chunks(named, 4096))
    for i, (data, crc) in enumerate(chunks):
        store.receive_chunk(wire.PushChunk(push_id, i, data.copy(), crc))
    tensors = [[n, a.dtype.name, list(a.shape), versions.crc32(a)] for n, a in named]
    manifest = versions.Manifest(version, lineage, tensors, [[int(d.size), c] for d, c in chunks], base, lora_cfg)
    store.commit(wire.PushCommit(push_id, manifest.to_dict()))


def served(store, version, lineage):
    """The bytes of (version, lineage) as the store serves them, chunk by chunk."""
    v = store.held(version, lineage)
    return None if v is None else b"".join(
        store.chunk(wire.GetChunk(version, lineage, i)).data.tobytes() for i in range(len(v.chunks)))


def test_adapter_manifests_are_checked():
    named = adapter(1)
    good = {"version": 3, "lineage": "L", "tensors": [[n, "float32", list(a.shape), versions.crc32(a)] for n, a in named],
            "chunks": [[nbytes(named), 0]], "base": 0, "lora": LORA}
    m = versions.Manifest.from_dict(good)
    assert (m.base, m.lora, m.base_key) == (0, LORA, versions.VersionKey(0, "L"))
    assert versions.Manifest.from_dict(m.to_dict()) == m
    plain = versions.Manifest.from_dict({k: v for k, v in good.items() if k not in ("base", "lora")})
    assert plain.base is None and plain.base_key is None and set(plain.to_dict()) == {"version", "lineage", "tensors", "chunks"}
    base_only = {k: v for k, v in good.items() if k != "lora"}
    lora_only = {k: v for k, v in good.items() if k != "base"}
    bad = [base_only, lora_only] + [{**good, **change} for change in (
        {"base": 3}, {"base": 7}, {"base": -1}, {"base": True}, {"base": 1.0}, {"base": None}, {"lora": None},
        {"lora": []}, {"lora": {**LORA, "rank": 0}}, {"lora": {**LORA, "rank": True}},
        {"lora": {**LORA, "alpha": float("nan")}}, {"lora": {**LORA, "alpha": -1.0}}, {"lora": {**LORA, "targets": []}},
        {"lora": {**LORA, "targets": ["q", "q"]}}, {"lora": {**LORA, "targets": "q_proj"}},
        {"lora": {**LORA, "extra": 1}}, {"lora": {"rank": 2, "alpha": 4.0}})]
    for data in bad:
        with pytest.raises(wire.WireError):
            versions.Manifest.from_dict(data)
    with pytest.raises(ValueError):  # the trainer's side: caught before any byte is sent
        weights_zmq.push_weights(None, 2, "L", named, base=2, lora=LORA)
    with pytest.raises(ValueError):
        weights_zmq.push_weights(None, 2, "L", named, base=0)


def test_the_store_pins_its_base_refuses_orphans_persists_both_and_a_new_lineage_drops_the_base(tmp_path):
    logs = []
    store = weights_zmq.WeightStore(str(tmp_path / "ps"), keep=1, log=logs.append)
    with pytest.raises(ValueError, match="not held here"):  # an adapter with no base held: refused
        commit(store, 1, "A", adapter(1), base=0, lora_cfg=LORA)
    commit(store, 0, "A", full(0))
    for v in (1, 2, 3):
        commit(store, v, "A", adapter(v), base=0, lora_cfg=LORA)
    assert (store.newest, list(store.versions)) == (3, [3])           # keep=1: one version ...
    assert served(store, 0, "A") == b"".join(a.tobytes() for _, a in full(0))  # ... and the pinned base
    assert store.versions[3].manifest.nbytes == nbytes(adapter(3))    # adapter bytes only
    assert store.base_manifest(store.versions[3].manifest).key == versions.VersionKey(0, "A")
    with pytest.raises(ValueError, match="not held here"):            # a base other than the pinned one
        commit(store, 4, "A", adapter(4), base=1, lora_cfg=LORA)
    assert store.newest == 3 and store.pending is None

    # A restarted store serves the base and the newest adapter, from disk.
    assert store.flush(30)
    again = weights_zmq.WeightStore(str(tmp_path / "ps"), keep=1, log=logs.append)
    assert (again.newest, again.base.manifest.key) == (3, versions.VersionKey(0, "A"))
    assert served(again, 3, "A") == served(store, 3, "A") and served(again, 0, "A") == served(store, 0, "A")
    assert again.versions[3].manifest.to_dict() == store.versions[3].manifest.to_dict()  # base and lora too
    commit(again, 4, "A", adapter(4), base=0, lora_cfg=LORA)           # and takes the next adapter onto it
    v4 = again.versions[4].manifest
    assert again.base_manifest(v4).key == versions.VersionKey(0, "A")
    commit(again, 5, "A", full(7))                                     # a new full version: the new base
    assert again.base.manifest.key == versions.VersionKey(5, "A") and again.base_manifest(v4) is None

    # A new lineage's full version replaces the base; the old lineage's versions are gone.
    commit(again, 0, "B", full(5))
    assert served(again, 0, "A") is None and served(again, 4, "A") is None
    assert again.base.manifest.key == versions.VersionKey(0, "B")
    with pytest.raises(ValueError, match="not held here"):            # an adapter onto the old lineage's base
        commit(again, 5, "A", adapter(5), base=0, lora_cfg=LORA)
    commit(again, 1, "B", adapter(1), base=0, lora_cfg=LORA)
    assert again.flush(30)
    third = weights_zmq.WeightStore(str(tmp_path / "ps"), keep=1, log=logs.append)
    assert (third.newest, third.lineage, third.base.manifest.key) == (1, "B", versions.VersionKey(0, "B"))
    assert served(third, 0, "B") == b"".join(a.tobytes() for _, a in full(5))

    # An adapter file whose base is not the persisted full version is ignored: the base alone is served.
    commit(third, 0, "C", full(6))
    assert third.flush(30)
    store_c = weights_zmq.WeightStore(str(tmp_path / "ps"), keep=1, log=logs.append)
    assert (store_c.newest, store_c.lineage) == (0, "C")


def fetcher(addr, name, relay=True):
    return weights_zmq.WeightFetcher(name, addr, name + "-1", log=lambda text: None, timeout_s=5.0,
                                 relay_bind="tcp://127.0.0.1:*" if relay else None, relay_timeout_s=2.0)


def test_late_and_relayed_fetchers_get_the_base_then_the_newest_adapter_also_after_a_restart(roles, tmp_path):
    addr = f"tcp://127.0.0.1:{free_port()}"
    start = lambda: roles.start("ps", "param_server.py", "--bind", addr, "--state-dir", str(tmp_path / "ps"),
                                "--keep-versions", "1")
    proc = start()
    client = wire.Client("test", addr, timeout_s=10)
    client.call(wire.Ping(), timeout_s=30, what="param server start")
    base_bytes = b"".join(a.tobytes() for _, a in full(0, n=200_000))
    weights_zmq.push_weights(client, 0, "A", full(0, n=200_000), chunk_bytes=64 << 10)
    for v in (1, 2):
        weights_zmq.push_weights(client, v, "A", adapter(v), base=0, lora=LORA)
    assert client.call(wire.Ping()).info["base"] == 0

    # Bad adapter pushes: refused with an Error, and the server keeps serving v2.
    with pytest.raises(wire.RemoteError, match="not held here"):
        weights_zmq.push_weights(client, 3, "A", adapter(3), base=1, lora=LORA)
    manifest = versions.Manifest(3, "A", [["x", "float32", [2], 0]], [[8, 0]], 0, {**LORA, "rank": 0}).to_dict()
    client.call(wire.PushChunk("bad", 0, np.zeros(8, np.uint8), versions.crc32(np.zeros(8, np.uint8))))
    with pytest.raises(wire.RemoteError, match="lora"):
        client.call(wire.PushCommit("bad", manifest))
    assert client.call(wire.Ping()).info["version"] == 2

    # A late fetcher: base v0 then adapter v2; a relay child gets the base from it, not the server.
    first = fetcher(addr, "late")
    wait_until(lambda: first.ready is not None and first.ready.key == (2, "A"), 30, "the late fetcher to hold v2")
    assert first.ready.base is first.base and first.base.key == (0, "A")
    assert first.base.stream.tobytes() == base_bytes
    assert first.ready.manifest.nbytes == nbytes(adapter(2))
    sent = client.call(wire.GetStats()).info["bytes_sent"]
    child = fetcher(addr, "child")
    wait_until(lambda: child.ready is not None and child.ready.key == (2, "A"), 30, "the child to hold v2")
    assert child.base.stream.tobytes() == base_bytes
    assert client.call(wire.GetStats()).info["bytes_sent"] - sent < len(base_bytes) / 4  # the relay sent it

    # The next version: adapter bytes only, onto the base each already holds.
    sent, held = client.call(wire.GetStats()).info["bytes_sent"], first.base
    weights_zmq.push_weights(client, 3, "A", adapter(3), base=0, lora=LORA)
    wait_until(lambda: all(f.ready.key == (3, "A") for f in (first, child)), 30, "both to hold v3")
    assert first.base is held and client.call(wire.GetStats()).info["bytes_sent"] - sent < 64 << 10

    # The param server restarts: base and newest adapter come back from disk; a new fetcher gets both.
    wait_until(lambda: client.call(wire.GetStats()).info["persisted_version"] == 3, 30, "v3 on disk")
    roles.kill(proc)
    proc = start()
    client.call(wire.Ping(), timeout_s=30, what="param server restart")
    assert {k: client.call(wire.Ping()).info[k] for k in ("version", "lineage", "base")} == {
        "version": 3, "lineage": "A", "base": 0}
    fresh = fetcher(addr, "fresh", relay=False)
    wait_until(lambda: fresh.ready is not None and fresh.ready.key == (3, "A"), 30, "the fresh fetcher to hold v3")
    assert fresh.base.stream.tobytes() == base_bytes
    assert fresh.ready.stream.tobytes() == b"".join(a.tobytes() for _, a in adapter(3))
    fresh.done(fresh.ready)  # without relay the installed base's bytes go (the worker has it on its device) ...
    fresh.done(fresh.base)
    assert fresh.base.stream is None
    held = fresh.base        # ... but it is still known as held: the next adapter comes alone
    weights_zmq.push_weights(client, 4, "A", adapter(4), base=0, lora=LORA)
    wait_until(lambda: fresh.ready.key == (4, "A"), 30, "the fresh fetcher to hold v4")
    assert fresh.base is held and fresh.ready.base is held

    # A new lineage: its full version replaces every fetcher's base; the old base is no longer served.
    weights_zmq.push_weights(client, 0, "B", full(9), chunk_bytes=4096)
    wait_until(lambda: all(f.base.key == (0, "B") for f in (first, child, fresh)), 30, "the new base everywhere")
    with pytest.raises(wire.RemoteError, match="not held"):
        client.call(wire.GetChunk(0, "A", 0))
    # A relay whose worker installed the full version keeps its bytes while it is the base: a child
    # still to come fetches it there.
    wait_until(lambda: first.ready.key == (0, "B"), 30, "the relay to be offered v0 of B")
    first.done(first.ready)
    weights_zmq.push_weights(client, 1, "B", adapter(1), base=0, lora=LORA)
    wait_until(lambda: first.ready.key == (1, "B"), 30, "the relay to hold v1 of B")
    assert first.held(0, "B") is first.base and first.base.stream is not None


TINY = model.ModelConfig(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=8,
                         intermediate_size=32, max_seq_len=16, rope_theta=1e4, rms_norm_eps=1e-6, qkv_bias=True,
                         tie_embeddings=True)


def buffer(version, lineage, named, base=None, lora_cfg=None):
    """A complete VersionBuffer as the fetcher offers it, from (name, array) pairs."""
    return versions.from_arrays(version, lineage, named, base, lora_cfg, 1 << 20)


def test_a_fetcher_fetches_an_adapters_base_unless_it_holds_that_very_one():
    f = weights_zmq.WeightFetcher.__new__(weights_zmq.WeightFetcher)  # no thread, no socket: base_for alone
    f.cond, fetched = threading.Condition(), []
    f.fetch = lambda m, sources, base=None, offer=True: fetched.append((m.key, offer)) or "fetched"
    f.base = held = buffer(0, "A", full(0))
    on_a, on_b = (buffer(1, lineage, adapter(1), 0, LORA).manifest for lineage in ("A", "B"))
    base_b = buffer(0, "B", full(1)).manifest.to_dict()
    assert f.base_for(on_a, {}, [""]) is held and fetched == []
    assert f.base_for(on_b, base_b, [""]) == "fetched" and fetched == [((0, "B"), False)]  # fetched, not offered
    for wrong in ({}, held.manifest.to_dict(), buffer(1, "B", adapter(1), 0, LORA).manifest.to_dict()):
        with pytest.raises(wire.WireError):
            f.base_for(on_b, wrong, [""])


def test_the_worker_installs_an_adapter_version_as_lora_merge_onto_its_base():
    """The trainer's f32 master goes out as lora.adapter_tensors (bf16, TINY's compute dtype) through
    the wire's chunks; the worker's install of it is the trainer's own lora.merge of the f32 master,
    bit for bit, although the master's values are not bf16 values."""
    base_named = list(hf_io.to_hf_tensors(random_params(TINY), TINY).items())
    lcfg = lora.LoraConfig(rank=2, alpha=4.0, targets=("q_proj", "down_proj"))
    rng = np.random.default_rng(1)  # numpy draws: no jax program compiled per shape
    master = {t: {m: 0.1 * rng.standard_normal(shape, np.float32) for m, shape in ms.items()}
              for t, ms in lora.adapter_shapes(TINY, lcfg).items()}
    named = list(lora.adapter_tensors(master, TINY).items())
    assert {a.dtype for _, a in named} == {np.dtype(ml_dtypes.bfloat16)}
    assert nbytes(named) == 2 * lora.param_count(TINY, lcfg)
    assert np.mean(np.asarray(dict(named)["lora.layers.q_proj.A"], np.float32) != master["q_proj"]["A"]) > 0.9

    done = []
    worker = inference_worker.Worker.__new__(inference_worker.Worker)
    worker.cfg = types.SimpleNamespace(name="w", sampler_quant="none")
    worker.mcfg, worker.mesh, worker.version, worker.lineage = TINY, None, -1, ""
    worker.base_key = worker.base_params = None
    worker.fetcher = types.SimpleNamespace(done=done.append)
    base = buffer(0, "L", base_named)
    v1 = buffer(1, "L", named, 0, lcfg.to_dict())
    with pytest.raises(ValueError, match="lacks"):  # no base held, none with the version
        worker.install(v1)
    v1.base = base
    worker.install(v1)  # a new worker: base, then adapter
    assert (worker.version, worker.base_key, done) == (1, versions.VersionKey(0, "L"), [base])
    want = lora.merge(jax.device_put(hf_io.from_hf_tensors(dict(base_named), TINY)), master, TINY, lcfg)  # the trainer's
    same = jax.tree_util.tree_map(lambda a, b: a.dtype == b.dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes(),
                                  worker.params, want)
    assert all(jax.tree_util.tree_leaves(same))
    assert not np.array_equal(np.asarray(worker.params["layers"]["q_proj"]), np.asarray(worker.base_params["layers"]["q_proj"]))
    # The next version onto the base it holds: the base buffer is not needed (nor read) again.
    v2 = buffer(2, "L", named, 0, lcfg.to_dict())
    worker.install(v2)
    assert worker.version == 2 and done == [base]
    # An adapter of another lineage whose base the worker lacks: refused, the worker keeps v2.
    other = buffer(1, "M", named, 0, lcfg.to_dict())
    with pytest.raises(ValueError, match="lacks"):
        worker.install(other)
    assert (worker.version, worker.base_key) == (2, versions.VersionKey(0, "L"))
    # A full version is the new base.
    worker.install(buffer(0, "M", base_named))
    assert worker.base_key == versions.VersionKey(0, "M") and worker.params is worker.base_params
