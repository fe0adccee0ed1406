"""Shared test helpers: free loopback ports and role processes that are always cleaned up."""
import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# One persistent JAX compilation cache for the whole session, inherited by every role process a test
# starts (and used by this one): the many short runs of the same tiny model then load their compiled
# programs instead of compiling them again, each time, on two cores. A cache hit is the same executable,
# so no number changes. Removed at exit; a JAX_COMPILATION_CACHE_DIR set by the caller is used as is.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="rlax-tests-jax-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ.update(JAX_COMPILATION_CACHE_DIR=_cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


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


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer byte-level Qwen2 with sharpened random weights (so sampling is not uniform noise), in
    Hugging Face layout: test_system.tiny, which several modules import. Built once per session (the
    same PRNGKey(0) weights every time, so sharing it changes no test); no test writes into it."""
    import jax
    import hf_io
    import model
    path = str(tmp_path_factory.mktemp("tiny"))
    cfg = model.ModelConfig(vocab_size=259, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                            head_dim=16, intermediate_size=192, max_seq_len=96, rope_theta=1e4,
                            rms_norm_eps=1e-6, qkv_bias=True, tie_embeddings=True)
    params = model.init_params(cfg, jax.random.PRNGKey(0))
    params = jax.tree_util.tree_map(lambda x: (x * 4).astype(x.dtype) if x.ndim > 1 else x, params)
    hf_io.save_hf(path, cfg, params)
    return path


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
