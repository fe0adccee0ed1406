"""The parameter server as a real process on loopback. Run: python -m pytest -q tests/test_param_server.py"""
import re
import threading
import time

import ml_dtypes
import numpy as np
import pytest
import zmq

import versions
import weights_zmq
import wire
from conftest import Roles, free_port, wait_until


def start(roles, tmp_path, name="ps"):
    port = free_port()
    proc = roles.start(name, "param_server.py", "--bind", f"tcp://127.0.0.1:{port}",
                       "--state-dir", str(tmp_path / "ps_state"))
    client = wire.Client("test", f"tcp://127.0.0.1:{port}", timeout_s=10)
    client.call(wire.Ping(), timeout_s=30, what="param server start")
    return proc, client, port


def tensors(version, scale=1.0):
    return [("a.weight", np.full((4, 3), scale * version, ml_dtypes.bfloat16)),
            ("b.bias", np.arange(5, dtype=np.float32) * scale)]


def push(client, version, scale=1.0, lineage=""):
    """A streamed push of two small tensors, in 8-byte chunks (a chunk spans both tensors)."""
    return weights_zmq.push_weights(client, version, lineage, tensors(version, scale), chunk_bytes=8)


def get(client, **kw):
    """GetWeights, then every chunk of the announced version: (version, lineage, {name: array}),
    or the WeightsUnchanged reply."""
    reply = client.call(wire.GetWeights(**kw))
    if not isinstance(reply, wire.WeightManifest):
        return reply
    m = versions.Manifest.from_dict(reply.manifest)
    stream = np.concatenate([client.call(wire.GetChunk(m.version, m.lineage, i)).data.copy()
                             for i in range(len(m.chunks))])
    m.check_tensors([stream])
    return m.version, m.lineage, m.tensor_views(stream)


def item(i, **kw):
    return {"item_id": f"it{i}", "prompt": f"p{i}", "group_size": 2, "seq_len": 8,
            "max_new_tokens": 4, "min_version": 0, **kw}


def rollout(item_id, version=0, G=2, T=8):
    return {"item_id": item_id, "version": version, "lineage": "", "worker": "w", "prompt_len": 3,
            "tokens_GT": np.ones((G, T), np.int32), "logp_behav_GT": np.zeros((G, T), np.float32),
            "mask_GT": np.ones((G, T), np.float32), "rewards_G": np.array([1.0, 0.0], np.float32),
            "finished_G": np.ones(G, bool), "statuses": ["passed", "failed"]}


def test_weights_versioned_verified_and_persisted(roles, tmp_path):
    proc, client, port = start(roles, tmp_path)
    assert client.call(wire.GetWeights()).version == -1           # nothing yet: WeightsUnchanged(-1)
    chunks = []
    for i, (data, _) in enumerate(versions.cut_chunks(tensors(1), 8)):
        client.call(wire.PushChunk("p1", i, data, versions.crc32(data)))
        chunks.append([int(data.size), versions.crc32(data)])
    bad = versions.Manifest(1, "", [["a.weight", "bfloat16", [4, 3], versions.crc32(tensors(1)[0][1])],
                                ["b.bias", "float32", [5], 12345]], chunks)  # one tensor's checksum wrong
    with pytest.raises(wire.RemoteError, match="checksum mismatch for tensor 'b.bias'"):
        client.call(wire.PushCommit("p1", bad.to_dict()))
    assert isinstance(client.call(wire.GetWeights()), wire.WeightsUnchanged)  # nothing half-applied
    push(client, 1); push(client, 2)
    version, _, got = get(client, have_version=1)
    assert version == 2 and got["a.weight"].dtype == ml_dtypes.bfloat16 and float(got["a.weight"][0, 0]) == 2.0
    assert isinstance(client.call(wire.GetWeights(have_version=2)), wire.WeightsUnchanged)

    # A waiter for a future version is answered as soon as it is pushed.
    result = {}
    waiter = wire.Client("waiter", f"tcp://127.0.0.1:{port}", timeout_s=10)
    t = threading.Thread(target=lambda: result.setdefault("r", waiter.call(
        wire.GetWeights(have_version=2, min_version=3, wait_s=5))))
    t.start(); time.sleep(0.3)
    push(client, 3); t.join()
    assert versions.Manifest.from_dict(result["r"].manifest).version == 3

    # Written to disk by a thread after the commit is answered (GetStats says when); killed and
    # restarted, the server serves it from there.
    deadline = time.monotonic() + 10
    while client.call(wire.GetStats()).info["persisted_version"] != 3:
        assert time.monotonic() < deadline, "version 3 never reached the disk"
        time.sleep(0.05)
    roles.kill(proc)
    _, client2, _ = start(roles, tmp_path, name="ps2")
    version, _, got = get(client2)
    assert version == 3 and np.array_equal(got["b.bias"], np.arange(5, dtype=np.float32))
    import safetensors.numpy                                      # the persisted file is plain safetensors
    assert float(safetensors.numpy.load_file(str(tmp_path / "ps_state" / "weights.safetensors"))["a.weight"][0, 0]) == 3

    # A trainer resumed from an earlier checkpoint rolls the versions back.
    push(client2, 2, scale=-1.0)
    version, _, got = get(client2, have_version=3)
    assert version == 2 and float(got["b.bias"][1]) == -1.0


def test_corrupt_persisted_weights_are_ignored(roles, tmp_path):
    (tmp_path / "ps_state").mkdir()
    (tmp_path / "ps_state" / "weights.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{trunc")
    proc, client, _ = start(roles, tmp_path)
    assert client.call(wire.GetWeights()).version == -1
    assert "ignoring corrupt persisted weights" in roles.log(proc)


def test_leases_expire_and_duplicates_are_used_once(roles, tmp_path):
    _, client, _ = start(roles, tmp_path)
    assert client.call(wire.EnqueueWork([item(0), item(1), item(0)])).info["added"] == 2
    first = client.call(wire.LeaseWork("slow", max_items=1, lease_s=0.3)).items
    assert [i["item_id"] for i in first] == ["it0"]
    time.sleep(0.6)                                                # the lease runs out...
    again = client.call(wire.LeaseWork("fast", max_items=2, lease_s=30)).items
    assert [i["item_id"] for i in again] == ["it0", "it1"]         # ...and it0 is reissued first
    ok = client.call(wire.SubmitRollout("fast", "it0", again[0]["lease"], rollout("it0")))
    assert ok.info["status"] == "accepted"
    late = client.call(wire.SubmitRollout("slow", "it0", first[0]["lease"], rollout("it0")))
    assert late.info["status"] == "duplicate"                      # the slow original: dropped
    got = client.call(wire.GetRollouts(max_items=10))
    assert [r["item_id"] for r in got.rollouts] == ["it0"]
    assert client.call(wire.GetRollouts(max_items=10, ack=["it0"])).rollouts == []  # acknowledged
    again2 = client.call(wire.SubmitRollout("slow", "it0", first[0]["lease"], rollout("it0")))
    assert again2.info["status"] == "duplicate"                    # still recognised after delivery
    stats = client.call(wire.GetStats()).info
    assert stats["duplicate"] == 2 and stats["reissued"] == 1 and stats["lease_expired"] == 1
    with pytest.raises(wire.RemoteError, match="never issued"):    # a lease the server never gave out
        client.call(wire.SubmitRollout("w", "it1", "forged", rollout("it1")))
    # Enqueueing a delivered item again is a no-op, unless the trainer asks for a requeue (resume).
    assert client.call(wire.EnqueueWork([item(0)])).info["added"] == 0
    assert client.call(wire.EnqueueWork([item(0)], requeue=True)).info["added"] == 1


def test_long_polls_for_work_and_rollouts(roles, tmp_path):
    _, client, port = start(roles, tmp_path)
    other = wire.Client("w", f"tcp://127.0.0.1:{port}", timeout_s=10)
    t0 = time.monotonic()
    assert client.call(wire.LeaseWork("w", wait_s=0.3)).items == []  # empty queue: answered at the deadline
    assert 0.25 < time.monotonic() - t0 < 5
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("r", other.call(wire.GetRollouts(5, wait_s=5))))
    t.start(); time.sleep(0.2)
    client.call(wire.EnqueueWork([item(7)]))
    leased = client.call(wire.LeaseWork("w", wait_s=1)).items
    client.call(wire.SubmitRollout("w", "it7", leased[0]["lease"], rollout("it7", version=4)))
    t.join()
    assert [r["version"] for r in result["r"].rollouts] == [4]


@pytest.fixture(scope="module")
def bad_request_server(tmp_path_factory):
    """One param server for every bad request below: each case checks that its request changed nothing
    (stats before and after), so on a shared server a request that did change something still fails
    its own case, and would show in the next ones too. Saves a process start per case."""
    tmp_path = tmp_path_factory.mktemp("bad_requests")
    roles = Roles(str(tmp_path))
    try:
        _, client, port = start(roles, tmp_path)
        yield client, port
    finally:
        roles.stop_all()


@pytest.mark.parametrize("msg, reason", [
    (wire.EnqueueWork([{"item_id": "x"}]), "lacks field"),
    (wire.EnqueueWork([item(1, group_size=0)]), "must be positive"),
    (wire.EnqueueWork(["not a dict"]), "must be a map"),
    (wire.SubmitRollout("w", "it1", "l", {**rollout("it1"), "logp_behav_GT": np.zeros((2, 3), np.float32)}),
     "logp_behav_GT must be float32 of shape"),
    (wire.SubmitRollout("w", "it1", "l", {**rollout("it1"), "rewards_G": np.array([np.nan, 1], np.float32)}),
     "finite"),
    (wire.PushChunk("p", 0, np.zeros(4, np.uint8), 1), "CRC mismatch on chunk 0"),
    (wire.PushChunk("p", 3, np.zeros(4, np.uint8), 0), "has not seen begin"),
    (wire.PushCommit("nope", {}), "no such push"),
    (wire.GetChunk(0, "", 0), "not held"),
    (wire.GetRollouts(0), "max_items"),
    (wire.LeaseWork("w", lease_s=-1), "lease_s"),
])
def test_bad_requests_get_errors_and_change_nothing(bad_request_server, msg, reason):
    client, port = bad_request_server
    client.call(wire.EnqueueWork([item(1)]))
    before = client.call(wire.GetStats()).info
    with pytest.raises(wire.RemoteError, match=reason):
        client.call(msg)
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.connect(f"tcp://127.0.0.1:{port}")
    raw.send_multipart([b"\x92\x01"])                              # truncated msgpack
    assert isinstance(wire.decode(raw.recv_multipart())[0], wire.Error)
    raw.close(0)
    after = client.call(wire.GetStats()).info
    for key in ("queued", "leased", "finished", "submitted", "version"):
        assert after.get(key) == before.get(key)


def test_a_new_trainer_lineage_resets_the_work_of_the_old_one(roles, tmp_path):
    _, client, _ = start(roles, tmp_path)
    push(client, 1, lineage="old")
    client.call(wire.EnqueueWork([item(0), item(1)]))
    leased = client.call(wire.LeaseWork("w", max_items=1)).items
    push(client, 0, lineage="new")                        # a trainer resumed from an earlier checkpoint
    stats = client.call(wire.GetStats()).info
    assert stats["queued"] == stats["leased"] == 0 and stats["reset_items"] == 2
    version, lineage, _ = get(client, have_version=1, have_lineage="old")
    assert (version, lineage) == (0, "new")
    # A rollout sampled with the dead trainer's weights is refused, even for a re-enqueued item id.
    client.call(wire.EnqueueWork([item(0)]))
    late = client.call(wire.SubmitRollout("w", "it0", leased[0]["lease"], {**rollout("it0"), "lineage": "old"}))
    assert late.info["status"] == "old_lineage"
    lease = client.call(wire.LeaseWork("w", max_items=1)).items[0]["lease"]
    ok = client.call(wire.SubmitRollout("w", "it0", lease, {**rollout("it0"), "lineage": "new"}))
    assert ok.info["status"] == "accepted"


def test_a_resumed_trainer_can_reuse_item_ids_already_delivered(roles, tmp_path):
    # Found by bench_soak.py: the old lineage's delivered ids must not block the new lineage's items.
    _, client, _ = start(roles, tmp_path)
    push(client, 1, lineage="A")
    client.call(wire.EnqueueWork([item(0)]))
    lease = client.call(wire.LeaseWork("w")).items[0]["lease"]
    client.call(wire.SubmitRollout("w", "it0", lease, {**rollout("it0"), "lineage": "A"}))
    assert len(client.call(wire.GetRollouts(5)).rollouts) == 1       # delivered; queue now empty
    push(client, 1, lineage="B")
    assert client.call(wire.EnqueueWork([item(0)])).info["added"] == 1


def refused(proc, client, lease, bad, reason):
    """Submitting `bad` under `lease` is answered with an Error naming `reason`, the server keeps
    serving, the item stays leased, and the trainer's GetRollouts gets nothing."""
    with pytest.raises(wire.RemoteError, match=re.escape(f"item {bad['item_id']}: rollout refused: {reason}")):
        client.call(wire.SubmitRollout("w", bad["item_id"], lease, bad))
    assert proc.poll() is None
    stats = client.call(wire.GetStats()).info
    assert [stats.get(k, 0) for k in ("leased", "finished", "submitted", "refused")] == [1, 0, 0, 1]
    assert client.call(wire.GetRollouts(max_items=10)).rollouts == []


@pytest.mark.parametrize("change, reason", [
    ({"version": 2}, "version 2 is older than the item's min_version 3"),
    ({"G": 3}, "3 completions, the item's group_size is 2"),
    ({"T": 16}, "16 tokens per row, the item's seq_len is 8"),
    ({"eval": True}, "eval=True, the item's is eval=False"),
])
def test_a_rollout_that_is_not_what_its_item_asked_for_is_refused(roles, tmp_path, change, reason):
    """WorkQueue.check_against_item: refused at submit with an Error naming the mismatch; the server
    keeps serving, the item stays leased (and leasable again when its lease runs out), and the
    trainer's GetRollouts never returns the refused rollout, only the good one submitted after."""
    proc, client, _ = start(roles, tmp_path)
    push(client, 3, lineage="L")
    client.call(wire.EnqueueWork([item(0, min_version=3, lineage="L")]))
    first = client.call(wire.LeaseWork("w", max_items=1, lease_s=0.5)).items[0]
    shape = {"G": change.pop("G", 2), "T": change.pop("T", 8)}
    bad = {**rollout("it0", version=3, **shape), "lineage": "L", **change}
    if shape["G"] != 2:
        bad.update(rewards_G=np.zeros(shape["G"], np.float32), statuses=["failed"] * shape["G"])
    refused(proc, client, first["lease"], bad, reason)
    time.sleep(0.7)                                                              # the lease runs out
    again = client.call(wire.LeaseWork("w2", max_items=1, lease_s=30)).items     # the item is sampled again
    assert [i["item_id"] for i in again] == ["it0"]
    good = {**rollout("it0", version=4), "lineage": "L"}
    assert client.call(wire.SubmitRollout("w2", "it0", again[0]["lease"], good)).info["status"] == "accepted"
    got = client.call(wire.GetRollouts(max_items=10)).rollouts
    assert [(r["item_id"], r["version"]) for r in got] == [("it0", 4)]


def test_a_rollout_of_another_lineage_than_its_item_is_refused(roles, tmp_path):
    """The server's lineage is L but the item was enqueued for trainer K: a rollout sampled with L's
    weights is not K's, so it is refused like any other mismatch (one of a dead lineage, neither the
    server's nor the item's, is the status "old_lineage" instead)."""
    proc, client, _ = start(roles, tmp_path)
    push(client, 3, lineage="L")
    client.call(wire.EnqueueWork([item(0, lineage="K")]))
    lease = client.call(wire.LeaseWork("w", max_items=1)).items[0]["lease"]
    refused(proc, client, lease, {**rollout("it0", version=3), "lineage": "L"}, "lineage 'L', the item's is 'K'")


def test_a_worker_reports_an_item_it_cannot_sample_and_goes_on(roles, tmp_path, capsys):
    """An error of the worker's own while sampling one item (a bug, a prompt its tokenizer or template
    cannot handle) is reported for that item: the param server receives a group of infra_error verdicts
    carrying the error, which the trainer's books give the fate verifier_failed. The worker does not
    crash (a restarted worker would lease the same item and fail the same way, forever)."""
    import types
    import hf_io
    import inference_worker
    import lifecycle
    _, client, port = start(roles, tmp_path)
    client.call(wire.EnqueueWork([item(0), item(1)]))
    leased = [wire.WorkItem.from_dict(i) for i in client.call(wire.LeaseWork("w", max_items=2, lease_s=30)).items]
    worker = object.__new__(inference_worker.Worker)  # the real methods, without weights or verifiers
    worker.cfg = inference_worker.Config(name="w", param_server=f"tcp://127.0.0.1:{port}")
    worker.ps, worker.tokenizer, worker.version, worker.lineage = client, hf_io.ByteTokenizer(), 0, ""
    worker.pad_id = worker.tokenizer.pad_id

    def broken(items):
        raise KeyError("a token the template does not know")
    worker.sample_and_submit = broken
    assert worker.sample_or_report(leased[:1]) == 1            # returns: the worker goes on
    assert "cannot sample ['it0']: KeyError" in capsys.readouterr().out
    worker.sample_and_submit = types.MethodType(lambda self, items: (_ for _ in ()).throw(TimeoutError("ps")), worker)
    with pytest.raises(TimeoutError):                           # a peer's hiccup is the caller's to retry
        worker.sample_or_report(leased[1:])
    got = client.call(wire.GetRollouts(max_items=10)).rollouts
    assert [r["item_id"] for r in got] == ["it0"]
    rollout_ = wire.Rollout.from_dict(got[0])
    assert rollout_.statuses == [lifecycle.INFRA_ERROR] * 2 and "KeyError" in rollout_.texts[0]
    assert rollout_.mask_GT.sum() == 0                          # nothing to train on
    fates = []
    books = lifecycle.Books(max_staleness=1, batch_size=2, lineage="", fate=lambda i, f: fates.append((i, f)))
    books.add(leased[0])
    assert books.receive(rollout_, version=0) == lifecycle.VERIFIER_FAILED and fates == [("it0", "verifier_failed")]
