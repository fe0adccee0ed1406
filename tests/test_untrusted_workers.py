"""Workers nobody has to trust: a reward counts only if the verifier sealed it (attest.py).

The real verifier service (with a verdict key) scores real programs; the real work queue checks what a
worker submits. Each liar here does what a worker with a valid connection could do: claim reward 1 for
a wrong program, move a sealed verdict onto another completion, another item or an older lease, or
leave the seals out. Each is refused, its worker refused from then on, and its items issued to others;
honest rollouts (and unsealed verifier failures) still count.
Run: python -m pytest -q tests/test_untrusted_workers.py
"""
import json
import os
import threading
import time

import numpy as np
import pytest
import zmq

import attest
import envs
import param_server
import verifier
import wire
from conftest import free_port, wait_until

TESTS = "def check(f):\n    assert f(2) == 4\n    assert f(5) == 25\n\ncheck(f)\n"
RIGHT, WRONG = "    return x * x\n", "    return x + x\n"


@pytest.fixture(scope="module")
def key_path(tmp_path_factory):
    return attest.write_key(str(tmp_path_factory.mktemp("keys") / "verdict.key"))


@pytest.fixture(scope="module")
def fleet(key_path):
    cfg = verifier.VerifierConfig(bind=f"tcp://127.0.0.1:{free_port()}", executors=2, verdict_key=key_path)
    svc = verifier.VerifierService(cfg)
    stop = threading.Event()
    thread = threading.Thread(target=svc.serve, args=(stop,), daemon=True)
    thread.start()
    client = wire.Client("test-worker", cfg.bind, timeout_s=60)
    yield client
    stop.set()
    thread.join(timeout=10)
    svc.close()


def work_item(i: int) -> dict:
    return wire.WorkItem(item_id=f"train/{i}|sq", prompt="def f(x):\n", group_size=2, seq_len=16,
                         max_new_tokens=8, min_version=0, tests=TESTS, entry_point="f",
                         prompt_format="completion", program_prefix="def f(x):\n").to_dict()


def queue(key_path, n=3) -> param_server.WorkQueue:
    q = param_server.WorkQueue(param_server.Config(verdict_key=key_path))
    q.enqueue([work_item(i) for i in range(n)], requeue=False)
    return q


def verify(fleet, leased: dict, texts: list, seal=True) -> list:
    """What a worker does (inference_worker.Worker.finish): the item's jobs, each naming its row."""
    item = wire.WorkItem.from_dict(leased)
    jobs = envs.score_jobs([item], texts)
    if seal:
        for g, job in enumerate(jobs):
            job["seal"] = attest.context(item.item_id, item.lease, g)
    return fleet.call(wire.VerifyBatch(jobs)).verdicts


def submission(leased: dict, texts: list, verdicts: list, worker="w") -> wire.SubmitRollout:
    G, T = len(texts), leased["seq_len"]
    rollout = wire.Rollout(
        item_id=leased["item_id"], version=0, lineage="", worker=worker, prompt_len=3,
        tokens_GT=np.ones((G, T), np.int32), logp_behav_GT=np.zeros((G, T), np.float32),
        mask_GT=np.ones((G, T), np.float32), rewards_G=np.array([v["reward"] for v in verdicts], np.float32),
        finished_G=np.ones(G, bool), statuses=[v["status"] for v in verdicts], texts=list(texts),
        macs=[v.get("mac", "") for v in verdicts])
    return wire.SubmitRollout(worker, leased["item_id"], leased["lease"], rollout.to_dict())


def test_the_verifier_seals_each_verdict_for_its_row(fleet, key_path):
    q = queue(key_path)
    [leased] = q.lease("w", 1, 60)
    verdicts = verify(fleet, leased, [RIGHT, WRONG])
    assert [v["status"] for v in verdicts] == ["passed", "failed"]
    assert all(len(v["mac"]) == 64 for v in verdicts)
    assert q.submit(submission(leased, [RIGHT, WRONG], verdicts), "") == "accepted"
    assert q.counts["forged"] == 0 and not q.refused
    unsealed = fleet.call(wire.VerifyBatch(envs.score_jobs([wire.WorkItem.from_dict(leased)], [RIGHT, WRONG]))).verdicts
    assert unsealed[0]["mac"] == ""  # a job that names no row (curate.py, a tool call) is not sealed


def lies(fleet, leased, other):
    """(name, the SubmitRollout a liar sends for `leased`); `other` is a second item it also holds."""
    submission = lambda *a: globals()["submission"](*a, worker="liar")
    honest = verify(fleet, leased, [RIGHT, WRONG])
    forged_reward = [dict(v) for v in honest]
    forged_reward[1]["reward"], forged_reward[1]["status"], forged_reward[1]["passed"] = 1.0, "passed", True
    other_verdicts = verify(fleet, other, [RIGHT, RIGHT])
    return [
        ("reward 1 for a wrong program", submission(leased, [RIGHT, WRONG], forged_reward)),
        ("a passing verdict moved onto another completion", submission(leased, [RIGHT, WRONG], [honest[0]] * 2)),
        ("the verdicts of another row order", submission(leased, [WRONG, RIGHT], honest[::-1])),
        ("another item's verdicts", submission(leased, [RIGHT, RIGHT], other_verdicts)),
        ("no seals", submission(leased, [RIGHT, RIGHT], [{**honest[0], "mac": ""}] * 2)),
    ]


@pytest.mark.parametrize("lie", range(5))
def test_a_liar_is_refused_for_good_and_its_items_go_to_others(fleet, key_path, lie):
    q = queue(key_path)
    leased, other, third = q.lease("liar", 3, 60)
    name, msg = lies(fleet, leased, other)[lie]
    with pytest.raises(ValueError, match="forged"):
        q.submit(msg, "")
    assert q.counts["forged"] == 1, name
    assert "name:liar" in q.refused, name
    # Every item the liar held is queued again at once, for someone else
    assert sorted(q.queue) == sorted(i["item_id"] for i in (leased, other, third)), name
    with pytest.raises(ValueError, match="refused"):
        q.lease("liar", 1, 60)
    with pytest.raises(ValueError, match="refused"):  # even a genuine rollout of the liar's no longer counts
        q.submit(submission(other, [RIGHT, RIGHT], verify(fleet, other, [RIGHT, RIGHT]), worker="liar"), "")
    # An honest worker gets the item and its rollout counts
    again = next(i for i in q.lease("honest", 3, 60) if i["item_id"] == leased["item_id"])
    assert q.submit(submission(again, [RIGHT, WRONG], verify(fleet, again, [RIGHT, WRONG]), worker="honest"), "") \
        == "accepted"
    assert q.stats()["refused_workers"] == ["name:liar"]


def test_a_rollout_replayed_from_an_older_lease_is_forged(fleet, key_path):
    q = queue(key_path, n=1)
    [first] = q.lease("slow", 1, 0.01)
    old = submission(first, [RIGHT, RIGHT], verify(fleet, first, [RIGHT, RIGHT]), worker="replayer")
    q.expire()
    [second] = q.lease("replayer", 1, 60)  # re-issued: a new lease of the same item
    assert second["lease"] != first["lease"]
    replay = wire.SubmitRollout("replayer", second["item_id"], second["lease"], old.rollout)
    with pytest.raises(ValueError, match="forged"):
        q.submit(replay, "")
    # ... while the slow worker's own late rollout, under its own lease, is genuine and counts
    assert q.submit(wire.SubmitRollout("slow", first["item_id"], first["lease"], old.rollout), "") == "accepted"


def test_unsealed_verifier_failures_count_and_no_key_means_no_check(fleet, key_path):
    q = queue(key_path, n=2)
    a, b = q.lease("w", 2, 60)
    failed = [{"passed": False, "reward": 0.0, "status": "infra_error", "detail": "no verifier", "fraction": 0.0}] * 2
    assert q.submit(submission(a, ["x", "y"], failed), "") == "accepted"  # never trained on (infra_error)
    claimed = [{**failed[0], "reward": 1.0}] * 2  # ... but an unsealed reward is forged
    with pytest.raises(ValueError, match="forged"):
        q.submit(submission(b, ["x", "y"], claimed), "")
    plain = param_server.WorkQueue(param_server.Config())  # no verdict key: rewards are the worker's word
    plain.enqueue([work_item(0)], requeue=False)
    [c] = plain.lease("w", 1, 60)
    assert plain.submit(submission(c, [RIGHT, WRONG], claimed), "") == "accepted"


def test_the_trainers_audit_refuses_the_submitter_and_reissues_the_item(fleet, key_path, tmp_path):
    server = param_server.ParamServer(param_server.Config(bind=f"tcp://127.0.0.1:{free_port()}",
                                                          state_dir=str(tmp_path / "ps"), verdict_key=key_path))
    try:
        server.work.enqueue([work_item(0)], requeue=False)
        [leased] = server.work.lease("liar", 1, 60)
        assert server.work.submit(submission(leased, [RIGHT, WRONG], verify(fleet, leased, [RIGHT, WRONG]),
                                             worker="liar"), "") == "accepted"
        [sent] = server.work.take(1)
        reply = server.on_forged(wire.ForgedRollout(sent["item_id"], "tokens the policy did not sample"), None)
        assert reply.info == {"refused": "name:liar", "reissued": True}
        assert list(server.work.queue) == [leased["item_id"]]
        assert server.work.take(1, ack=[leased["item_id"]]) == []  # the trainer's ack of it forgets nothing
        [again] = server.work.lease("honest", 1, 60)
        assert again["item_id"] == leased["item_id"]
        with pytest.raises(ValueError, match="no record"):
            server.on_forged(wire.ForgedRollout("train/9|none", "?"), None)
        # A lease the liar parked before it was refused is answered with an error, and the server serves on
        server.work.enqueue([work_item(1)], requeue=False)
        server.server.client_key = ""
        parked = wire.LeaseWork("liar2", 1, 60.0, 5.0)
        assert server.on_lease(wire.LeaseWork("honest", 5, 60.0, 5.0), (b"honest", 1)).items
        assert server.on_lease(parked, (b"liar2", 2)) is None  # nothing queued: it waits
        server.work.refuse("name:liar2", "found out while it waited")
        server.work.enqueue([work_item(2)], requeue=False)
        server.tick()  # answers the parked lease: an Error, not an exception out of the serving loop
        assert not server.lease_waiters
        assert isinstance(server.parked_lease(parked), wire.Error)
    finally:
        server.server.close()


XLA = {"XLA_FLAGS": ""}


def start_servers(roles, tmp_path) -> tuple:
    """The param server and a verifier as real processes sharing a new verdict key: (run_dir, ps, va)."""
    key = attest.write_key(str(tmp_path / "verdict.key"))
    run_dir, ps, va = str(tmp_path / "run"), f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    roles.start("param_server", "param_server.py", "--bind", ps, "--state-dir", f"{run_dir}/ps",
                "--verdict-key", key, env=XLA)
    roles.start("verifier", "verifier.py", "--bind", va, "--executors", "1", "--verdict-key", key, env=XLA)
    return run_dir, ps, va


LIES = ("reward", "logp", "seed")


def test_a_run_with_liars_trains_on_the_honest_workers_work(roles, tmp_path, tiny_model_dir):
    """Every role a real process; three workers lie (tests/liar_worker.py): rewards of 1 (the verifier's
    seal refuses them at the param server), log-probs off by 0.01, and rows drawn from keys of their own
    choosing (the trainer's audit, every rollout audited here, finds both). Each liar is refused at its
    first rollout, its items go to the honest worker, and the run finishes on that worker's work:
    bitwise at every step, every prompt one fate, no liar's reward, the honest worker never refused."""
    run_dir, ps, va = start_servers(roles, tmp_path)
    worker = ("--param-server", ps, "--verifier", va, "--model", tiny_model_dir, "--bf16-fix", "--batch-items", "1")
    liars = [roles.start(f"liar-{lie}", "tests/liar_worker.py", *worker, "--name", f"liar-{lie}",
                         env={**XLA, "RLAX_LIE": lie}) for lie in LIES]
    for liar in liars:  # they lease first
        wait_until(lambda: "started:" in roles.log(liar), 180, f"{liar.name} to start")
    roles.start("worker0", "inference_worker.py", *worker, "--name", "worker-0", env=XLA)
    trainer = roles.start("trainer", "trainer.py", "--run-dir", run_dir, "--param-server", ps,
                          "--model", tiny_model_dir, "--heldout", "4", "--eval-samples", "8", "--eval-every", "0",
                          "--prompts-per-step", "4", "--rollout-timeout-s", "120", "--bf16-fix", "--steps", "3",
                          "--audit-frac", "1", "--timeline", f"{run_dir}/timeline.jsonl", env=XLA)
    wait_until(lambda: trainer.poll() is not None, 400, "the trainer to finish")
    assert trainer.returncode == 0, roles.log(trainer)[-3000:]
    stats = wire.Client("test", ps, timeout_s=10).call(wire.GetStats()).info
    assert stats["refused_workers"] == sorted(f"name:liar-{lie}" for lie in LIES), (stats, roles.log(trainer)[-3000:])
    assert stats["forged"] >= 3, stats
    trainer_log = roles.log(trainer)
    assert "log-probs differ from the policy's" in trainer_log and "draws other tokens" in trainer_log, trainer_log
    with open(os.path.join(run_dir, "timeline.jsonl")) as f:
        forged = [e for e in map(json.loads, f) if e["span"] == "forged"]
    assert {e["worker"] for e in forged} == {"liar-logp", "liar-seed"}  # the trainer's finds (the seal's: param server)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [r for r in map(json.loads, f) if "mismatch/bitwise_frac" in r]  # the training steps' lines
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["mismatch/bitwise_frac"] == 1.0 for r in rows), [r["mismatch/bitwise_frac"] for r in rows]
    assert rows[-1]["workers/refused"] == 3 and rows[-1]["rollouts/forged"] >= 3
    assert rows[-1]["rollouts/audited"] >= 12  # the honest worker's every rollout, and none forged
    assert all(r["reward/pass_frac"] < 0.5 for r in rows)  # a liar's group would be all 1s
    with open(os.path.join(run_dir, "ledger.jsonl")) as f:
        fates = [json.loads(line)["item_id"] for line in f]
    assert len(fates) == len(set(fates)) >= 12  # every prompt one fate


def key_pair(directory, name: str) -> str:
    """A CURVE key pair file as `python curve.py keygen` writes it, and its .pub beside it."""
    public, secret = zmq.curve_keypair()
    (directory / f"{name}.key").write_text(public.decode() + "\n" + secret.decode() + "\n")
    (directory / f"{name}.pub").write_text(public.decode() + "\n")
    return str(directory / f"{name}.key")


def test_under_curve_a_liar_is_refused_by_its_key_whatever_name_it_gives(fleet, key_path, tmp_path, monkeypatch):
    clients = tmp_path / "clients"
    clients.mkdir()
    server_key = key_pair(tmp_path, "server")
    liar_key, honest_key, trainer_key = (key_pair(clients, n) for n in ("liar", "honest", "trainer"))
    monkeypatch.setenv("RLAX_CURVE_KEY", server_key)
    monkeypatch.setenv("RLAX_CURVE_CLIENTS", str(clients))
    server = param_server.ParamServer(param_server.Config(bind=f"tcp://127.0.0.1:{free_port()}",
                                                          state_dir=str(tmp_path / "ps"), verdict_key=key_path))
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
    thread.start()
    client = lambda name, key: wire.Client(name, server.cfg.bind, timeout_s=20, curve_key=key,  # noqa: E731
                                           curve_server_key=str(tmp_path / "server.pub"))
    try:
        client("trainer", trainer_key).call(wire.EnqueueWork([work_item(i) for i in range(3)]))
        liar = client("liar", liar_key)
        [leased] = liar.call(wire.LeaseWork("liar", 1, 60.0)).items
        verdicts = [dict(v, reward=1.0, status="passed", passed=True) for v in verify(fleet, leased, [RIGHT, WRONG])]
        with pytest.raises(wire.RemoteError, match="forged"):
            liar.call(submission(leased, [RIGHT, WRONG], verdicts, worker="liar"))
        for name in ("liar", "honest-looking"):  # a new name does not help: the key is the identity
            with pytest.raises(wire.RemoteError, match="refused"):
                liar.call(wire.LeaseWork(name, 1, 60.0))
        liar_pub = (clients / "liar.pub").read_text().strip()
        assert server.work.refused.keys() == {f"key:{liar_pub}"}
        honest = client("honest", honest_key)
        got = honest.call(wire.LeaseWork("liar", 3, 60.0)).items  # ... nor does an honest key lose by a name
        assert leased["item_id"] in [i["item_id"] for i in got] and len(got) == 3
    finally:
        stop.set()
        thread.join(timeout=10)
        server.server.close()


def test_the_shared_pair_names_no_one(tmp_path):
    """Every role of the shared-pair setup holds the server's own key: then the name is the identity (a
    liar refused by that key would refuse every honest worker too)."""
    server = param_server.ParamServer(param_server.Config(bind=f"tcp://127.0.0.1:{free_port()}",
                                                          state_dir=str(tmp_path / "ps")))
    try:
        server.server.public_key = server.server.client_key = "K" * 40
        assert server.who(wire.LeaseWork("worker-3")) == "name:worker-3"
        server.server.client_key = "Q" * 40
        assert server.who(wire.LeaseWork("worker-3")) == "key:" + "Q" * 40
    finally:
        server.server.close()


def test_a_worker_whose_network_drops_mid_rollout_loses_nothing(roles, tmp_path, tiny_model_dir):
    """A worker stops answering while it samples (SIGSTOP: no heartbeat, no submission, as when its
    network drops), its leases lapse and its items go to the other worker; when it comes back its late
    rollouts are honest (sealed for its own lease) and count once at most. Nobody is refused, every
    prompt gets one fate."""
    import signal
    run_dir, ps, va = start_servers(roles, tmp_path)
    worker = ("--param-server", ps, "--verifier", va, "--model", tiny_model_dir, "--bf16-fix", "--lease-s", "3")
    dropped = roles.start("dropped", "inference_worker.py", *worker, "--name", "worker-dropped",
                          "--token-delay-s", "0.3", env=XLA)  # ~5 s a batch: long enough to be cut mid-rollout
    wait_until(lambda: "started:" in roles.log(dropped), 180, "the worker to start")
    trainer = roles.start("trainer", "trainer.py", "--run-dir", run_dir, "--param-server", ps,
                          "--model", tiny_model_dir, "--heldout", "4", "--eval-every", "0", "--no-eval-greedy",
                          "--eval-samples", "8", "--prompts-per-step", "4", "--rollout-timeout-s", "120",
                          "--bf16-fix", "--steps", "2", env=XLA)
    wait_until(lambda: "weights v0" in roles.log(dropped), 180, "the worker to hold weights")
    time.sleep(1.0)  # sampling its first items
    os.killpg(dropped.pid, signal.SIGSTOP)
    roles.start("worker0", "inference_worker.py", *worker, "--name", "worker-0", env=XLA)
    client = wire.Client("test", ps, timeout_s=10)
    wait_until(lambda: client.call(wire.GetStats()).info.get("lease_expired", 0) >= 1, 120, "its leases to lapse")
    wait_until(lambda: (trainer.poll() is not None or
                        os.path.exists(os.path.join(run_dir, "metrics.jsonl"))), 300, "a step without it")
    os.killpg(dropped.pid, signal.SIGCONT)  # its network is back: it submits what it sampled
    wait_until(lambda: trainer.poll() is not None, 300, "the trainer to finish")
    assert trainer.returncode == 0, roles.log(trainer)[-3000:]
    stats = client.call(wire.GetStats()).info
    assert stats["reissued"] >= 1 and stats["refused_workers"] == [] and stats.get("forged", 0) == 0, stats
    with open(os.path.join(run_dir, "ledger.jsonl")) as f:
        fates = [json.loads(line)["item_id"] for line in f]
    assert len(fates) == len(set(fates)) >= 8  # every prompt one fate
