"""The verifier as a ZeroMQ service: bad requests, concurrency, an executor killed mid-run, the CLI,
and failing closed: refusing to start without namespaces unless weaker isolation is asked for by name.

Run: python -m pytest -q tests/test_verifier_service.py      (about 15 s)
"""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import msgpack
import pytest
import zmq

import verifier
import verifier_client
import wire
from verdicts import BoundaryError, check_batch
from conftest import ROOT, free_port, wait_until

GOOD = {"kind": "assert", "program": "def f(x):\n    return x * 2\n",
        "tests": "def check(c):\n    assert c(21) == 42\n", "entry_point": "f"}
SLOW = {"kind": "assert", "program": "import time\ntime.sleep(0.4)\ndef f(x):\n    return x * 2\n",
        "tests": GOOD["tests"], "entry_point": "f"}


@pytest.fixture(scope="module")
def service():
    cfg = verifier.VerifierConfig(bind=f"tcp://127.0.0.1:{free_port()}", executors=2, max_request_mb=1)
    svc = verifier.VerifierService(cfg)
    stop = threading.Event()
    thread = threading.Thread(target=svc.serve, args=(stop,), daemon=True)
    thread.start()
    yield svc
    stop.set()
    thread.join(timeout=10)
    svc.close()


def raw_request(addr: str, frames: list) -> object:
    """Send arbitrary frames on a DEALER socket; return the decoded reply (or fail on no reply)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(addr)
    try:
        sock.send_multipart(frames)
        assert sock.poll(10_000), "no reply to a bad request"
        return wire.decode(sock.recv_multipart())[0]
    finally:
        sock.close(0)


def test_good_batch_and_bad_jobs(service):
    client = verifier_client.VerifierFleet("test", [service.cfg.bind], timeout_s=60)
    bad_job = {"kind": "assert", "program": 5}
    verdicts = client.verify([GOOD, {**GOOD, "program": "def f(x):\n    return 0\n"}, bad_job,
                                    "not a job"])
    assert [v.status for v in verdicts] == ["passed", "failed", "infra_error", "infra_error"]
    assert verdicts[0].reward == 1.0 and verdicts[1].reward == 0.0
    client.close()


def _v(status="passed", reward=1.0):
    return {"passed": status == "passed", "reward": reward, "status": status, "detail": "", "fraction": 1.0}


@pytest.mark.parametrize("jobs, verdicts, ok", [
    ([GOOD, GOOD], [_v(), _v("failed", 0.0)], True),
    ([{"kind": "reward"}], [_v("failed", -3.5)], True),          # a reward function's value: any finite
    ([GOOD, GOOD], [_v()], False),                                # one verdict short
    ([GOOD], [_v(), _v()], False),                                # one too many
    ([GOOD], {"0": _v()}, False),                                 # not a list
    ([GOOD], [_v("pased")], False),                               # an unknown status
    ([GOOD], [_v(reward=1.5)], False),                            # a code job's reward above 1
    ([GOOD], [_v(reward=float("nan"))], False),
    ([{"kind": "reward"}], [_v(reward=float("inf"))], False),
    ([GOOD], [{**_v(), "extra": 1}], False),                      # not a verdict's fields
], ids=["good", "reward_any_finite", "short", "long", "not_a_list", "unknown_status", "reward_above_1",
        "nan", "reward_inf", "extra_field"])
def test_a_receiver_checks_every_verdict(jobs, verdicts, ok):
    """What the worker checks of a verifier's reply before it trusts it (a bad one: that verifier's
    infra failure)."""
    if ok:
        check_batch(jobs, verdicts)
    else:
        with pytest.raises(BoundaryError):
            check_batch(jobs, verdicts)


@pytest.mark.parametrize("bad", ["short", "unknown_status", "reward_above_1"])
def test_a_bad_reply_is_that_verifiers_failure(service, bad):
    """verifier_client.VerifierFleet over a verifier that answers badly (one verdict short, an unknown status, a
    reward above 1) and a good one: the bad one is skipped for its cooldown and the batch is judged
    by the good one. Alone, the bad one is tried twice and every job gets infra_error, never a score."""
    answers = {"short": [_v()], "unknown_status": [_v("pased")] * 2, "reward_above_1": [_v(reward=1.5)] * 2}
    addr = f"tcp://127.0.0.1:{free_port()}"
    fake = wire.Server("bad-verifier", addr)
    batches = []
    fake.on(wire.VerifyBatch, lambda msg, peer: batches.append(msg) or wire.Verdicts(verdicts=answers[bad]))
    stop = threading.Event()
    thread = threading.Thread(target=fake.serve, args=(stop,), daemon=True)
    thread.start()
    lines = []
    both = verifier_client.VerifierFleet("test", [addr, service.cfg.bind], timeout_s=30, log=lines.append)
    alone = verifier_client.VerifierFleet("test", [addr], timeout_s=30, log=lines.append)
    try:
        both.next = 0  # the bad one first
        assert [v.status for v in both.verify([GOOD, GOOD])] == ["passed", "passed"]
        assert len(batches) == 1 and list(both.down) == [0]
        assert len(lines) == 1 and lines[0].startswith("verifier attempt 1/2 failed: ")
        assert lines[0].endswith(f"; skipping {addr} for 30s")
        assert [v.status for v in both.verify([GOOD, GOOD])] == ["passed", "passed"]  # cooling down: not asked
        assert len(batches) == 1

        verdicts = alone.verify([GOOD, GOOD])
        assert [v.status for v in verdicts] == ["infra_error", "infra_error"] and len(batches) == 3
        assert verdicts[0].detail.startswith("BoundaryError: ") and not any(v.passed for v in verdicts)
    finally:
        both.close(), alone.close()
        stop.set()
        thread.join(10)
        fake.close()


def test_a_verifier_process_killed_mid_batch_loses_no_job(roles):
    """Two real verifier processes, started by the command line; the one holding a batch is killed
    (SIGKILL) while it runs it. The fleet finds it gone by the missing pong, sends the whole batch to
    the other and every job is judged (none lost, no infra_error); later batches skip the dead one.
    The other, stopped with SIGTERM, exits with status 0."""
    addrs = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    lines = []
    fleet = verifier_client.VerifierFleet("test", addrs, timeout_s=60, ping_s=0.3, log=lines.append)
    victim = fleet.next  # the first batch's verifier: one executor, so the batch is still running at 1 s
    procs = [roles.start(f"verifier{k}", os.path.join(ROOT, "verifier.py"), "--bind", a,
                         "--executors", "1" if k == victim else "2") for k, a in enumerate(addrs)]
    for a in addrs:
        ping = wire.Client("test", a, timeout_s=2)
        wait_until(lambda: _pong(ping), 60, f"the verifier at {a} to answer a ping")
        ping.close()
    try:
        out = {}
        t = threading.Thread(target=lambda: out.update(v=fleet.verify([SLOW] * 6 + [{**GOOD, "tests": "assert False"}])))
        t.start()
        time.sleep(1.0)  # the victim has started the batch (6 x 0.4 s on one executor)
        roles.kill(procs[victim])
        t.join(60)
        assert [v.status for v in out["v"]] == ["passed"] * 6 + ["failed"]
        assert len(lines) == 1 and "no pong" in lines[0] and f"skipping {addrs[victim]} for 30s" in lines[0]
        for _ in range(3):
            assert [v.status for v in fleet.verify([GOOD])] == ["passed"]
        assert len(lines) == 1  # the dead one is cooling down: not tried again
        survivor = procs[1 - victim]
        roles.kill(survivor, signal.SIGTERM)
        assert survivor.returncode == 0, roles.log(survivor)
    finally:
        fleet.close()


def _pong(client):
    try:
        return client.call(wire.Ping())
    except TimeoutError:
        return None


def test_malformed_truncated_oversized_requests_get_errors(service):
    addr = service.cfg.bind
    good = wire.encode(wire.VerifyBatch(jobs=[GOOD]), rid=1)
    header = bytes(good[0])
    cases = {
        "garbage": [b"\x00\xffnot msgpack"],
        "truncated": [header[: len(header) // 2]],
        "wrong version": [msgpack.packb({"type": "verify_batch", "v": 99, "rid": 1, "body": {"jobs": []}})],
        "jobs not a list": [msgpack.packb({"type": "verify_batch", "v": 1, "rid": 1, "body": {"jobs": 5}})],
        "unknown type": [msgpack.packb({"type": "rm_rf", "v": 1, "rid": 1, "body": {}})],
        "oversized": wire.encode(wire.VerifyBatch(jobs=[{**GOOD, "tests": "#" * (2 << 20)}]), rid=1),
        "too many jobs": wire.encode(wire.VerifyBatch(jobs=[GOOD] * 5000), rid=1),
    }
    for what, frames in cases.items():
        reply = raw_request(addr, frames)
        assert isinstance(reply, wire.Error), (what, reply)
        assert reply.error, what
    # Above ZeroMQ's MAXMSGSIZE (4 x max_request_mb) the peer is dropped before we see anything:
    # no reply can be sent, but nothing changes on the server.
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(addr)
    sock.send_multipart(wire.encode(wire.VerifyBatch(jobs=[{**GOOD, "tests": "#" * (5 << 20)}]), rid=1))
    assert not sock.poll(500)
    sock.close(0)
    # ... and the service still serves.
    client = verifier_client.VerifierFleet("test", [addr], timeout_s=60)
    assert client.verify([GOOD])[0].passed
    client.close()


def test_concurrent_clients_are_served_at_once(service):
    results, errors = {}, []

    def worker(i):
        try:
            c = verifier_client.VerifierFleet("test", [service.cfg.bind], timeout_s=60)
            expect = i % 2 == 0
            prog = GOOD if expect else {**GOOD, "program": "def f(x):\n    return -1\n"}
            results[i] = (expect, [v.passed for v in c.verify([prog] * 5)])
            c.close()
        except Exception as e:  # noqa: BLE001 - surfaced by the assert below
            errors.append(e)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert all(passed == [expect] * 5 for expect, passed in results.values()) and len(results) == 4


def test_killing_an_executor_mid_run_loses_no_request(service):
    pool = service.pool
    restarts = pool.restarts
    client = verifier_client.VerifierFleet("test", [service.cfg.bind], timeout_s=120)
    out = {}
    t = threading.Thread(target=lambda: out.update(v=client.verify([SLOW] * 8)))
    t.start()
    time.sleep(0.6)  # both executors are busy with their first or second job
    victim = pool.slots[0].proc
    os.kill(victim.pid, signal.SIGKILL)
    t.join(timeout=120)
    assert [v.status for v in out["v"]] == ["passed"] * 8
    assert pool.restarts == restarts + 1 and pool.slots[0].proc.pid != victim.pid
    client.close()


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="isolation"):
        verifier.VerifierConfig(isolation="docker")
    with pytest.raises(ValueError, match="isolation"):
        verifier.VerifierConfig(isolation="auto")  # weaker isolation is never chosen for the caller
    assert verifier.VerifierConfig().isolation == "namespaces"
    with pytest.raises(ValueError, match="executors"):
        verifier.VerifierConfig(executors=0)
    with pytest.raises(ValueError, match="timeout_s"):
        verifier.Limits(timeout_s=0)


# ----------------------------------------------------------------------------- failing closed
# A real missing capability, not a simulation: setpriv drops CAP_SYS_ADMIN from the bounding set,
# as in an unprivileged container, so unshare() is refused to the verifier and its executors.
WITHOUT_SYS_ADMIN = ["setpriv", "--bounding-set", "-sys_admin"]
needs_setpriv = pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0,
                                   reason="needs root and setpriv (util-linux)")


@needs_setpriv
def test_without_namespaces_the_verifier_refuses_to_start():
    proc = subprocess.run([*WITHOUT_SYS_ADMIN, sys.executable, os.path.join(ROOT, "verifier.py"),
                           "--bind", f"tcp://127.0.0.1:{free_port()}", "--executors", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr
    assert "refusing to start" in err and "unshare" in err and "CAP_SYS_ADMIN" in err, err
    assert "--isolation rlimits" in err, err  # ... and names the override
    assert "serving" not in proc.stdout


@needs_setpriv
def test_rlimits_only_by_name_and_every_batch_warns(tmp_path):
    addr = f"tcp://127.0.0.1:{free_port()}"
    log_path = tmp_path / "verifier.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*WITHOUT_SYS_ADMIN, sys.executable, os.path.join(ROOT, "verifier.py"),
                                 "--bind", addr, "--executors", "1", "--isolation", "rlimits"],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        client = verifier_client.VerifierFleet("test", [addr], timeout_s=60)
        assert [v.status for v in client.verify([GOOD])] == ["passed"]
        assert [v.status for v in client.verify([GOOD, {**GOOD, "tests": "assert False"}])] \
            == ["passed", "failed"]
        client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    text = log_path.read_text()
    assert "every verdict will be served with --isolation rlimits" in text, text
    warnings = [line for line in text.splitlines() if "verdicts served with --isolation rlimits" in line]
    assert [w.split("WARNING: ")[1].split(" verdicts")[0] for w in warnings] == ["1", "2"], text
    assert all("network host (NOT isolated)" in w for w in warnings), warnings
