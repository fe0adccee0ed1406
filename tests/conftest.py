"""Shared test helpers: free loopback ports and role processes that are always cleaned up."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Roles:
    """Starts role scripts as real processes; kills whatever is left at the end of the test."""

    def __init__(self, log_dir):
        self.log_dir, self.procs = log_dir, []

    def start(self, name: str, *args: str, env: dict | None = None) -> subprocess.Popen:
        log = open(os.path.join(self.log_dir, f"{name}.log"), "ab")
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        proc.name, proc.log_path = name, log.name
        self.procs.append(proc)
        return proc

    def log(self, proc) -> str:
        with open(proc.log_path, errors="replace") as f:
            return f.read()

    def kill(self, proc, sig=signal.SIGKILL) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=30)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=30)


@pytest.fixture
def roles(tmp_path):
    r = Roles(str(tmp_path))
    yield r
    r.stop_all()


def wait_until(predicate, timeout_s: float, what: str, poll_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
