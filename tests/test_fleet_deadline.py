"""One sample must not veto its batch: the worker's verifier client waits as long as the verifier says
the batch may take (its jobs' own limits and the work queued ahead of them), so a looping or slow
program gets its own verdict and its neighbours theirs; a batch the client gives up on is dropped by
the verifier (at its CancelBatch, or when it stops pinging), so its jobs hold no executor a later
batch waits for.

Run: python -m pytest -q tests/test_fleet_deadline.py      (about 45 s)
"""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import verifier
import wire
from conftest import ROOT, free_port, wait_until

GOOD = {"kind": "assert", "program": "def f(x):\n    return x * 2\n",
        "tests": "def check(c):\n    assert c(21) == 42\n", "entry_point": "f"}
ADD = {"kind": "io", "program": "a, b = map(int, input().split())\nprint(a + b)\n",
       "cases": [["1 2\n", "3\n"], ["5 5\n", "10\n"]], "timeout_s": 1.0}
SLOW_BUT_RIGHT = {"kind": "io", "program": "import time\nx = input()\ntime.sleep(0.2)\nprint(x)\n",
                  "cases": [["7\n", "7\n"]] * 8, "timeout_s": 1.0, "partial_reward": True}


def looping(cases: int, timeout_s: float) -> dict:
    """A program that never ends, scored on every case (partial_reward): cases x timeout_s on its executor."""
    return {"kind": "io", "program": "while True:\n    pass\n", "cases": [["1\n", "1\n"]] * cases,
            "timeout_s": timeout_s, "partial_reward": True}


def _pong(client):
    try:
        return client.call(wire.Ping())
    except TimeoutError:
        return None


@pytest.fixture(scope="module")
def service_process(tmp_path_factory):
    """A real verifier service (`python verifier.py`, 2 executors) on a free port: (address, log path)."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    log = tmp_path_factory.mktemp("verifier") / "verifier.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "verifier.py"), "--bind", addr,
                                 "--executors", "2"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    ping = wire.Client("test", addr, timeout_s=2)
    try:
        wait_until(lambda: proc.poll() is not None or _pong(ping), 90, f"the verifier at {addr} to answer a ping")
        assert proc.poll() is None, log.read_text()
        yield addr, log
    finally:
        ping.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.mark.parametrize("verify_timeout_s", [None, 2.0], ids=["worker_defaults", "floor_below_the_batch"])
def test_a_looping_sample_gets_its_own_timeout_and_its_neighbours_their_verdicts(service_process, verify_timeout_s):
    """The worker's client (inference_worker.verifier_fleet) and a batch holding a program that loops on
    each of its 10 cases (5 s of one executor) beside honest ones, one of them slow (8 x 0.2 s). At the
    worker's defaults; and with verify_timeout_s at 2 s, below the batch's 5 s, as the worker's 120 s is
    below the batch of a looping sample with more than 24 cases of 5 s: a deadline of verify_timeout_s
    per try would give up on the batch twice and report every job infra_error. The verifier's bound
    for the batch is what the client waits for."""
    import inference_worker
    addr, _ = service_process
    settings = {} if verify_timeout_s is None else {"verify_timeout_s": verify_timeout_s}
    cfg = inference_worker.Config(verifier=addr, name=f"w-{verify_timeout_s}", **settings)
    fleet = inference_worker.verifier_fleet(cfg)
    try:
        t0 = time.monotonic()
        verdicts = fleet.verify([looping(10, 0.5), GOOD, SLOW_BUT_RIGHT, ADD, GOOD])
        took = time.monotonic() - t0
        assert [v.status for v in verdicts] == ["timeout", "passed", "passed", "passed", "passed"], verdicts
        assert verdicts[0].detail.startswith("case 0: timeout") and verdicts[0].reward == 0.0
        assert took > 5.0  # the looping program ran every case to its limit: no try was cut short
        assert fleet.bound_s >= took  # the verifier's bound covered the batch
    finally:
        fleet.close()


def test_a_cancelled_batch_frees_its_executors(service_process):
    """A client that gives up on its batch says so (wire.CancelBatch): the verifier stops its running
    jobs and drops its queued ones, so a later batch is served at once rather than after the
    abandoned jobs' 10 s. Pongs name a connection's batches while they run, and only then."""
    import inference_worker
    addr, log = service_process
    quitter = wire.Client("quitter", addr, timeout_s=5)
    try:
        rid = quitter.send(wire.VerifyBatch(jobs=[looping(20, 0.5)] * 3))  # both executors, one queued
        pong = quitter.call(wire.Ping())
        assert str(rid) in pong.info["batches"] and pong.info["batches"][str(rid)] > 20
        time.sleep(1.0)  # both executors are inside a looping job
        answer = quitter.call(wire.CancelBatch(request=rid))
        assert isinstance(answer, wire.Ok) and answer.info["cancelled"] == 3
        assert quitter.call(wire.Ping()).info["batches"] == {}
        with pytest.raises(wire.RemoteError, match=f"no batch {rid} of this connection"):
            quitter.call(wire.CancelBatch(request=rid))

        fleet = inference_worker.verifier_fleet(inference_worker.Config(verifier=addr, name="w-after"))
        t0 = time.monotonic()
        assert [v.status for v in fleet.verify([GOOD, ADD, GOOD])] == ["passed"] * 3
        assert time.monotonic() - t0 < 6.0  # the abandoned jobs had 9 s to run
        fleet.close()
    finally:
        quitter.close()
    wait_until(lambda: f"batch {rid} cancelled by its client: 3 of 3 jobs dropped" in log.read_text(), 5,
               "the verifier's log line")


def test_a_batch_whose_client_fell_silent_is_dropped(service_process):
    """A client that said it pings every 0.2 s (wire.VerifyBatch.ping_s) dies with its batch out: no
    cancel, no more pings. The verifier drops the batch after 5 pings' silence (verifier.SILENT_PINGS)
    and a later batch is served at once rather than after the abandoned jobs' 10 s."""
    import inference_worker
    addr, log = service_process
    gone = wire.Client("gone", addr, timeout_s=5)
    rid = gone.send(wire.VerifyBatch(jobs=[looping(20, 0.5)] * 3, ping_s=0.2))
    assert str(rid) in gone.call(wire.Ping()).info["batches"]
    gone.close()
    t0 = time.monotonic()
    wait_until(lambda: f"batch {rid} given up: its client has sent nothing" in log.read_text(), 5,
               "the verifier to drop the batch")
    assert time.monotonic() - t0 > 1.5  # 5 x 0.2 s + 1 s of silence
    fleet = inference_worker.verifier_fleet(inference_worker.Config(verifier=addr, name="w-after-silence"))
    t0 = time.monotonic()
    assert [v.status for v in fleet.verify([GOOD, ADD])] == ["passed", "passed"]
    assert time.monotonic() - t0 < 6.0  # the abandoned jobs had about 8 s left
    fleet.close()


@pytest.fixture
def bound_too_short(monkeypatch):
    """An in-process verifier whose bounds are far too short (every job's allowance 0.1 s): a verifier
    that overruns what it told its clients, which only a bug of its own would do."""
    monkeypatch.setattr(verifier, "job_allowance_s", lambda job: 0.1)
    monkeypatch.setattr(verifier, "SERVICE_SLACK_S", 0.0)
    svc = verifier.VerifierService(verifier.VerifierConfig(bind=f"tcp://127.0.0.1:{free_port()}", executors=2))
    stop = threading.Event()
    thread = threading.Thread(target=svc.serve, args=(stop,), daemon=True)
    thread.start()
    yield svc
    stop.set()
    thread.join(10)
    svc.close()


def test_a_batch_past_the_verifiers_own_bound_is_cancelled_there(bound_too_short):
    """When the verifier lets its own bound pass, the fleet gives up on the batch (infra_error: the
    verifier's failure) and first tells the verifier to drop it: the looping jobs of both tries are
    stopped, and the next batch is served at once."""
    import verifier_client
    svc, lines = bound_too_short, []
    fleet = verifier_client.VerifierFleet("w", [svc.cfg.bind], timeout_s=0.5, ping_s=0.2, log=lines.append)
    try:
        restarts = svc.pool.restarts
        verdicts = fleet.verify([looping(20, 0.5), looping(20, 0.5), GOOD])
        assert [v.status for v in verdicts] == ["infra_error"] * 3
        assert len(lines) == 2 and all("it dropped 3 of its jobs" in line for line in lines), lines
        assert "the verifier's bound for the batch" in lines[0]
        assert svc.pending == [] and svc.pool.restarts >= restarts + 2  # executors killed under their jobs

        later = verifier_client.VerifierFleet("w2", [svc.cfg.bind], timeout_s=30)
        t0 = time.monotonic()
        assert [v.status for v in later.verify([GOOD, ADD])] == ["passed", "passed"]
        assert time.monotonic() - t0 < 6.0  # the abandoned loops had about 9 s left
        later.close()
    finally:
        fleet.close()


def test_a_verifier_that_lost_the_batch_is_left_at_its_first_pong():
    """A verifier whose pong does not name the batch (it restarted and lost it) is given up on at once,
    not after the deadline."""
    import verifier_client
    addr = f"tcp://127.0.0.1:{free_port()}"
    fake = wire.Server("forgetful", addr)
    fake.on(wire.VerifyBatch, lambda msg, peer: None)  # never answered
    fake.on(wire.Ping, lambda msg, peer: wire.Pong("forgetful", "x", info={"batches": {}}))
    stop = threading.Event()
    thread = threading.Thread(target=fake.serve, args=(stop,), daemon=True)
    thread.start()
    fleet = verifier_client.VerifierFleet("w", [addr], timeout_s=60, ping_s=0.5, log=lambda _: None)
    try:
        t0 = time.monotonic()
        verdicts = fleet.verify([GOOD])
        assert [v.status for v in verdicts] == ["infra_error"] and "does not hold" in verdicts[0].detail
        assert time.monotonic() - t0 < 3.0  # each try at its first pong (0.5 s), not at 60 s
    finally:
        fleet.close()
        stop.set()
        thread.join(10)
        fake.close()
