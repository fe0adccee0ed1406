"""verifier.py: the stateless code-execution sandbox ("Oubliette") that turns completions into rewards.

RLAX verifies generated code by running it against tests in an environment destroyed afterwards. The
programs come from a policy optimised to get reward, so this role assumes every program is hostile
and inventive about *looking* correct (ARCHITECTURE.md invariant 6).

How a verdict is reached (why it cannot be forged):
  * assert-style (HumanEval): two processes. The CANDIDATE, forked fresh for each execution, runs
    the program under a uid of its own; the JUDGE, under another uid, runs the tests (one judge per
    executor, reused across jobs and replaced after any timeout or failure and every
    JUDGE_RECYCLE_JOBS jobs; forked per job when there is no cgroup, see _cleanup). The judge never
    executes a line of the program: every name the program defines appears in the judge as a proxy
    that sends the call's arguments to the candidate and gets back the result as *bytes*
    (msgpack with a few tagged types), decoded into genuine int/str/list/... objects. So the
    program cannot see the tests or their expected values, patch the judge's builtins or assert
    helpers, hand over an object whose __eq__ lies, or exit/print its way to success: only the
    judge's report, on a pipe the candidate does not hold, says "passed". Names that shadow
    builtins (abs, len, ...) are never exported, so a program cannot redefine what tests use.
  * io-style (Codeforces): the program's stdout is captured by the executor (trusted) and compared
    token by token with the expected output; the exit status must be 0.
Everything else (limits, namespaces, uids, cleanup) is in sandbox.py.

Processes and sockets:
  service   `python verifier.py --bind tcp://127.0.0.1:5557 --executors 2`: a wire.Server (ROUTER)
            answering wire.VerifyBatch with wire.Verdicts (deferred reply; batches from several
            clients run concurrently over the pool); wire.Ping -> wire.Pong.
  executor  `python -E -s verifier.py --executor CONFIG` (started by the pool, never by hand): a fresh
            pre-imported interpreter that enters the sandbox once and forks a limited candidate per
            job; talks to the pool over its stdin/stdout pipes with length-prefixed msgpack.

Cost per execution (bench/bench_verifier.py): one fork of a small pre-imported process, rlimits and
setuid in the child, a cgroup join, a tmpfs scratch dir, and a msgpack round trip per call of the
program; the uid-wide kill sweep (another fork) runs only when the cgroup shows something was left.

Known limits: values crossing the boundary are plain data (None, bool, int, float, complex, str,
bytes, list, tuple, dict, set, frozenset; subclasses reduced to these): a program returning its own
class or a numpy scalar fails. Tests that call helper functions the *prompt* defines (HumanEval/32
poly, /38 encode_cyclic, /50 encode_shift) call the program's copy, which the program controls, as
in HumanEval itself. io-style comparison is by whitespace-separated tokens, no float tolerance.

Deviation from the paper: RLAX ran Oubliette on AWS Lambda with containerised dependencies; here the
same "fresh, destroyed afterwards" property comes from fork + namespaces + a uid per executor.
"""

import argparse
import builtins
import concurrent.futures
import dataclasses
import json
import linecache
import math
import os
import queue
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback

import msgpack

import sandbox

# ============================================================================ configuration


@dataclasses.dataclass
class Limits:
    """Per-execution limits; every field can be overridden per job (verify(..., memory_mb=256))."""
    timeout_s: float = 5.0
    """Wall-clock limit of one execution (one io case); CPU limit is ceil(timeout_s)."""
    memory_mb: int = 1024
    """RLIMIT_AS of each sandboxed process (address space, so a bit above resident memory)."""
    max_procs: int = 16
    """RLIMIT_NPROC for the execution's uid: processes + threads it may have at once."""
    max_file_mb: int = 16
    """RLIMIT_FSIZE: largest file the program may write (in its scratch dir)."""
    max_open_files: int = 64
    """RLIMIT_NOFILE."""
    max_output_kb: int = 1024
    """Captured stdout+stderr; more is status output_limit."""

    def __post_init__(self):
        if not (isinstance(self.timeout_s, (int, float)) and 0 < self.timeout_s <= 120):
            raise ValueError(f"timeout_s must be in (0, 120], got {self.timeout_s!r}")
        for name, lo, hi in (("memory_mb", 64, 65536), ("max_procs", 1, 4096),
                             ("max_file_mb", 0, 4096), ("max_open_files", 16, 4096),
                             ("max_output_kb", 1, 1 << 20)):
            v = getattr(self, name)
            if type(v) is not int or not lo <= v <= hi:
                raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {v!r}")


@dataclasses.dataclass
class VerifierConfig:
    """The service's settings; the CLI is built from these fields."""
    bind: str = "tcp://127.0.0.1:5557"
    """ZeroMQ address the service binds (non-loopback needs CURVE keys, see wire.py)."""
    executors: int = 2
    """Pre-started executor processes; each runs one execution at a time."""
    isolation: str = "auto"
    """auto | namespaces | rlimits (see sandbox.py; auto falls back to rlimits when it must)."""
    hide: str = ""
    """Extra comma-separated host paths to cover inside the sandbox (datasets holding tests)."""
    max_jobs: int = 4096
    """Largest batch accepted in one VerifyBatch."""
    max_request_mb: int = 64
    """Largest VerifyBatch (sum of program/test/case text); bigger gets an error reply."""

    def __post_init__(self):
        if self.isolation not in ("auto", "namespaces", "rlimits"):
            raise ValueError(f"isolation must be auto|namespaces|rlimits, got {self.isolation!r}")
        if not 1 <= self.executors <= 256:
            raise ValueError(f"executors must be in [1, 256], got {self.executors}")
        if self.max_jobs < 1 or self.max_request_mb < 1:
            raise ValueError("max_jobs and max_request_mb must be positive")


@dataclasses.dataclass
class Verdict:
    """The outcome of one execution. reward is what GRPO sees."""
    passed: bool
    reward: float
    status: str    # passed | failed | error | timeout | crashed | memory | output_limit
    detail: str    # short, human-readable reason (truncated)
    fraction: float = 0.0  # fraction of test cases passed (1.0/0.0 for assert-style)


def _verdict(status: str, detail: str = "", fraction: float | None = None,
             reward: float | None = None) -> Verdict:
    passed = status == "passed"
    fraction = (1.0 if passed else 0.0) if fraction is None else fraction
    reward = (1.0 if passed else 0.0) if reward is None else reward
    return Verdict(passed, float(reward), status, detail[:500], float(fraction))


# ============================================================================ values across the boundary
# Arguments go judge -> candidate and results come back as msgpack bytes. Only plain data crosses,
# decoded on the receiving side into builtin types (never the sender's classes); msgpack has no
# tuple/set/big-int/complex, so those travel as tagged ExtTypes.

_TUPLE, _SET, _FROZENSET, _BIGINT, _COMPLEX, _REF = range(1, 7)
MAX_DEPTH = 100
MAX_RPC_BYTES = 64 << 20


class BoundaryError(TypeError):
    """A value that cannot cross the sandbox boundary (unsupported type, too deep, malformed)."""


def to_plain(x, depth: int = 0):
    """Python value -> msgpack-able structure. Subclasses are reduced to their builtin base."""
    if depth > MAX_DEPTH:
        raise BoundaryError(f"value nested deeper than {MAX_DEPTH}")
    if x is None or isinstance(x, bool):
        return None if x is None else bool(x)
    if isinstance(x, int):
        x = int(x)
        return x if -(1 << 63) <= x < (1 << 64) else msgpack.ExtType(_BIGINT, format(x, "x").encode())
    if isinstance(x, float):
        return float(x)
    if isinstance(x, str):
        return str.__str__(x)
    if isinstance(x, (bytes, bytearray)):
        return bytes(x)
    if isinstance(x, complex):
        return msgpack.ExtType(_COMPLEX, struct.pack("<dd", x.real, x.imag))
    if isinstance(x, list):
        return [to_plain(v, depth + 1) for v in x]
    if isinstance(x, dict):
        return {to_plain(k, depth + 1): to_plain(v, depth + 1) for k, v in x.items()}
    for typ, code in ((tuple, _TUPLE), (frozenset, _FROZENSET), (set, _SET)):
        if isinstance(x, typ):
            return msgpack.ExtType(code, _pack([to_plain(v, depth + 1) for v in x]))
    if isinstance(x, _Remote):
        return msgpack.ExtType(_REF, x.name.encode())
    raise BoundaryError(f"a value of type {type(x).__name__} cannot cross the sandbox boundary")


def _pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def from_bytes(data: bytes, refs: dict | None = None):
    """msgpack bytes -> builtin values; _REF resolves through refs (candidate side only)."""
    def ext(code, payload):
        if code == _TUPLE:
            return tuple(from_bytes(payload, refs))
        if code in (_SET, _FROZENSET):
            items = from_bytes(payload, refs)
            return set(items) if code == _SET else frozenset(items)
        if code == _BIGINT:
            return int(payload.decode("ascii"), 16)
        if code == _COMPLEX:
            return complex(*struct.unpack("<dd", payload))
        if code == _REF and refs is not None:
            return refs[payload.decode()]
        raise BoundaryError(f"unknown value tag {code}")
    try:
        return msgpack.unpackb(data, ext_hook=ext, strict_map_key=False, raw=False)
    except BoundaryError:
        raise
    except Exception as e:  # msgpack raises many types on malformed input
        raise BoundaryError(f"malformed value: {type(e).__name__}: {e}") from None


def send_frame(fd: int, obj) -> None:
    data = _pack(obj)
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def recv_frame(fd: int, limit: int = MAX_RPC_BYTES):
    """Next length-prefixed msgpack frame from fd as raw bytes; None at EOF (also mid-frame)."""
    def read_exact(n):
        buf = bytearray()
        while len(buf) < n:
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)
    head = read_exact(4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    if n > limit:
        raise BoundaryError(f"frame of {n} bytes exceeds the {limit}-byte limit")
    return read_exact(n)


# ============================================================================ candidate side (untrusted)

_SKIP_NAMES = set(dir(builtins))


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:300]


def candidate_main(program: str, fd: int) -> None:
    """Runs in the sandboxed candidate: load the program, then answer the judge's calls until EOF."""
    ns = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        exec(compile(program, "<program>", "exec"), ns)
    except BaseException as e:  # noqa: BLE001 - SystemExit and friends are program failures too
        send_frame(fd, {"ok": False, "error": _describe(e)})
        return
    names = {}
    for name, value in list(ns.items()):
        if name.startswith("__") or name in _SKIP_NAMES or type(value).__name__ == "module":
            continue
        if callable(value):
            names[name] = ["f"]
        else:
            try:
                names[name] = ["v", _pack(to_plain(value))]
            except (BoundaryError, ValueError, TypeError, RecursionError):
                pass
    send_frame(fd, {"ok": True, "names": names})
    while (raw := recv_frame(fd)) is not None:
        call = from_bytes(raw)
        try:
            args = from_bytes(call["args"], ns)
            kwargs = from_bytes(call["kwargs"], ns)
            result = ns[call["name"]](*args, **kwargs)
            reply = {"ok": True, "value": _pack(to_plain(result))}
        except BaseException as e:  # noqa: BLE001 - reported to the judge, which decides
            reply = {"ok": False, "exc": type(e).__name__, "msg": str(e)[:300]}
        send_frame(fd, reply)


def io_candidate_main(program: str) -> None:
    """Runs in the sandboxed candidate for io jobs: the program as __main__ on stdin/stdout."""
    code = 0
    try:
        exec(compile(program, "<program>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - a runtime error is exit status 1, as for `python prog.py`
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        code = code or 1
    os._exit(code & 0xFF)


# ============================================================================ judge side (trusted tests)


class CandidateGone(Exception):
    """The candidate process died or stopped answering in the middle of the tests."""


class CandidateMemoryError(MemoryError):
    """The candidate raised MemoryError (its address-space limit)."""


_EXC_TYPES = {n: t for n, t in vars(builtins).items() if isinstance(t, type)
              and issubclass(t, Exception) and n not in ("StopIteration", "StopAsyncIteration")}


class _Remote:
    """A function of the program as the judge sees it: calls travel to the candidate as bytes."""
    __slots__ = ("name", "_fd")

    def __init__(self, name: str, fd: int):
        self.name, self._fd = name, fd

    def __call__(self, *args, **kwargs):
        send_frame(self._fd, {"name": self.name, "args": _pack(to_plain(list(args))),
                              "kwargs": _pack(to_plain(dict(kwargs)))})
        raw = recv_frame(self._fd)
        if raw is None:
            raise CandidateGone(f"the program died while computing {self.name}(...)")
        reply = from_bytes(raw)
        if type(reply) is not dict or type(reply.get("ok")) is not bool:
            raise BoundaryError("malformed reply from the candidate")
        if reply["ok"]:
            if type(reply.get("value")) is not bytes:
                raise BoundaryError("malformed reply from the candidate")
            return from_bytes(reply["value"])
        name, msg = str(reply.get("exc")), str(reply.get("msg"))
        if name == "MemoryError":
            raise CandidateMemoryError(msg)
        raise _EXC_TYPES.get(name, RuntimeError)(f"{name} in {self.name}(...): {msg}")

    def __repr__(self):
        return f"<program function {self.name}>"


def _test_line(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<tests>"]
    return f" at tests line {frames[-1].lineno}: {frames[-1].line}" if frames else ""


def judge_main(tests: str, entry_point: str | None, fd: int) -> dict:
    """Runs in the judge process: build the proxy namespace, run the tests, return the report."""
    raw = recv_frame(fd)
    if raw is None:
        return {"status": "crashed", "detail": "the program exited while loading"}
    hello = from_bytes(raw)
    if type(hello) is not dict or type(hello.get("ok")) is not bool:
        return {"status": "error", "detail": "malformed hello from the candidate"}
    if not hello["ok"]:
        return {"status": "error", "detail": f"program failed to load: {hello.get('error')}"}
    ns = {"__name__": "__tests__", "__builtins__": builtins}
    names = hello.get("names")
    if type(names) is not dict:
        return {"status": "error", "detail": "malformed hello from the candidate"}
    for name, spec in names.items():
        if type(name) is not str or name in _SKIP_NAMES or type(spec) is not list or not spec:
            continue
        if spec[0] == "f":
            ns[name] = _Remote(name, fd)
        elif spec[0] == "v" and len(spec) == 2 and type(spec[1]) is bytes:
            ns[name] = from_bytes(spec[1])
    if entry_point is not None and not isinstance(ns.get(entry_point), _Remote):
        return {"status": "failed", "detail": f"the program does not define {entry_point}()"}
    try:
        linecache.cache["<tests>"] = (len(tests), None, tests.splitlines(True), "<tests>")
        exec(compile(tests, "<tests>", "exec"), ns)
        if entry_point is not None:
            ns["check"](ns[entry_point])
    except AssertionError as e:
        msg = f": {str(e)[:200]}" if str(e) else ""
        return {"status": "failed", "detail": f"assertion failed{_test_line(e)}{msg}"}
    except CandidateGone as e:
        return {"status": "crashed", "detail": str(e)}
    except CandidateMemoryError:
        return {"status": "memory", "detail": "the program ran out of memory"}
    except BoundaryError as e:
        return {"status": "failed", "detail": f"{e}{_test_line(e)}"}
    except BaseException as e:  # noqa: BLE001 - any other exception in the tests is a failure
        return {"status": "error", "detail": f"{_describe(e)}{_test_line(e)}"}
    return {"status": "passed", "detail": "all tests passed"}


# ============================================================================ executor (one job at a time)

_PREIMPORT = ("math", "random", "re", "string", "collections", "itertools", "functools", "heapq",
              "bisect", "copy", "hashlib", "fractions", "statistics", "typing", "decimal", "json",
              "operator", "array", "datetime")


JUDGE_RECYCLE_JOBS = 200  # a persistent judge is replaced after this many jobs (bounds drift)
JUDGE_LIMITS = Limits(timeout_s=120, memory_mb=4096, max_procs=4, max_file_mb=0, max_open_files=64)


def judge_server(ctrl_fd: int) -> None:
    """The persistent judge's loop: a job frame with the call-channel fd attached, then a report."""
    ctrl = socket.socket(fileno=ctrl_fd)
    while True:
        _, fds, _, _ = socket.recv_fds(ctrl, 1, 1)
        if not fds:
            return  # executor closed the control socket
        raw = recv_frame(ctrl_fd)
        if raw is None:
            return
        job = from_bytes(raw)
        report = judge_main(job["tests"], job.get("entry_point"), fds[0])
        os.close(fds[0])  # the candidate sees EOF and exits
        send_frame(ctrl_fd, report)


class _Judge:
    """Executor-side handle on a persistent judge process (uid of its own, non-dumpable)."""

    def __init__(self, ex: "Executor"):
        self.sock, child = socket.socketpair()
        null = os.open("/dev/null", os.O_RDWR)
        cfd = child.fileno()
        # RLIMIT_CPU would be a lifetime total here: none; the executor's wall deadline bounds each job.
        self.pid = ex._fork(lambda: judge_server(cfd), fds={0: null, 1: null, 2: null}, keep={cfd},
                            uid=ex.uids[1], cwd="/", lim=JUDGE_LIMITS, dumpable=False, cpu_s=None)
        os.close(null)
        child.close()
        self.jobs = 0

    def start(self, job: dict, channel_fd: int) -> None:
        self.jobs += 1
        socket.send_fds(self.sock, [b"J"], [channel_fd])
        send_frame(self.sock.fileno(), {"tests": job["tests"], "entry_point": job.get("entry_point")})

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        self.sock.close()


class SandboxBreach(RuntimeError):
    """Cleanup failed: the executor must not run another job (it exits; the pool replaces it)."""


class Executor:
    """Lives in the executor process: holds the sandbox report and runs jobs by forking."""

    def __init__(self, isolation: str, hide: list[str]):
        try:  # before enter_sandbox: the chroot hides /sys
            self.cgroup = sandbox.PidsCgroup() if os.geteuid() == 0 else None
            why = "" if self.cgroup else "not root"
        except OSError as e:
            self.cgroup, why = None, str(e)
        self.report = sandbox.enter_sandbox(isolation, hide)
        self.report["cgroup"] = self.cgroup.path if self.cgroup else f"none ({why}): always sweep"
        self.isolated = self.report["mode"] == "namespaces"
        # As root, a uid of its own is cheap and does not need namespaces: keep it in the fallback.
        self.uids = sandbox.role_uids(os.getpid()) if os.geteuid() == 0 else (None, None)
        self.counter = self.sweeps = 0
        self.judge = None
        for m in _PREIMPORT:
            __import__(m)
        import gc
        gc.freeze()  # children's collections skip these objects: fewer copy-on-write page faults

    # --- plumbing ---------------------------------------------------------------------------

    def _scratch(self) -> str:
        self.counter += 1
        if self.isolated:
            path = f"/tmp/job{self.counter}"  # /tmp is the sandbox's private tmpfs
            os.mkdir(path, 0o700)
        else:
            import tempfile
            path = tempfile.mkdtemp(prefix="oubliette-")
        if self.uids[0] is not None:
            os.chown(path, self.uids[0], self.uids[0])
        return path

    def _fork(self, body, *, fds: dict[int, int], keep: set[int], uid, cwd, lim: Limits,
              dumpable: bool, join_cgroup: bool = False, cpu_s: int | None = -1) -> int:
        """Fork a confined child whose fds 0,1,2 are fds[0..2] and which keeps `keep` open."""
        pid = os.fork()
        if pid:
            return pid
        code = 71
        try:
            if join_cgroup and self.cgroup:
                self.cgroup.join()
            for target, src in fds.items():
                os.dup2(src, target)
            sandbox.close_fds_except(keep)
            sandbox.confine(uid=uid, cwd=cwd, memory_mb=lim.memory_mb,
                            cpu_s=math.ceil(lim.timeout_s) if cpu_s == -1 else cpu_s,
                            max_procs=lim.max_procs, max_file_mb=lim.max_file_mb,
                            max_open_files=lim.max_open_files, dumpable=dumpable)
            body()
            code = 0
        except BaseException:  # noqa: BLE001 - never unwind into the executor's loop in a child
            try:
                traceback.print_exc()
            except BaseException:  # noqa: BLE001
                pass
        os._exit(code)

    def _kill_all(self, pids: list[int]) -> None:
        if self.uids[0] is not None:  # the judge runs trusted tests, never forks: its group is enough
            sandbox.kill_uid(self.uids[0])
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.uids[0] is None:
            sandbox.kill_children()

    def _cleanup(self, pids: list[int], scratch: str) -> dict[int, int]:
        """Kill everything the job started, reap, remove scratch; return {pid: wait status}.

        pids are our own unreaped children, so killing them by pid is safe (no reuse). If the
        cgroup then counts zero processes, nothing else exists. Otherwise sweep the uid; we are the
        subreaper of every process a job starts, so "no child left" (ECHILD) proves nothing
        survived; the loop re-kills in case something raced a sweep.
        """
        statuses = {}
        for pid in pids:  # statuses of those that ended on their own, before we kill
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                statuses[pid] = status
        for pid in pids:
            if pid not in statuses:
                os.kill(pid, signal.SIGKILL)
                statuses[pid] = os.waitpid(pid, 0)[1]
        if self.cgroup is None or self.cgroup.current() != 0:
            self._kill_all(pids)
            deadline, next_kill = time.monotonic() + 10.0, time.monotonic() + 0.1
            while True:  # cgroup: until it is empty (a persistent judge is a live child)
                try:
                    pid, _ = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid:
                    continue
                if self.cgroup and self.cgroup.current() == 0:
                    break
                if time.monotonic() > next_kill:
                    if time.monotonic() > deadline:
                        raise SandboxBreach("a sandboxed process could not be killed within 10 s")
                    self._kill_all(pids)
                    next_kill = time.monotonic() + 0.1
                time.sleep(0.0002)
            self.sweeps += 1
        shutil.rmtree(scratch, ignore_errors=True)
        return statuses

    @staticmethod
    def _pump(readers: dict[int, bytearray], stop_fd: int | None, deadline: float, cap: int) -> str:
        """Read the fds into their buffers until all EOF / stop_fd readable / deadline / cap.
        Returns "eof", "stop", "timeout" or "output_limit"."""
        open_fds = set(readers)
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            watch = list(open_fds) + ([stop_fd] if stop_fd is not None else [])
            ready, _, _ = select.select(watch, [], [], left)
            for fd in ready:
                if fd == stop_fd:
                    return "stop"
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    open_fds.discard(fd)
                    continue
                readers[fd] += chunk
                if sum(len(b) for b in readers.values()) > cap:
                    return "output_limit"
        return "eof"

    @staticmethod
    def _signal_status(status: int) -> str | None:
        if status > 0 and os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig in (signal.SIGXCPU, signal.SIGKILL):
                return "timeout"
            if sig == signal.SIGXFSZ:
                return "output_limit"
            return "crashed"
        return None

    # --- jobs -------------------------------------------------------------------------------

    def _judge_process(self) -> "_Judge":
        if self.judge is None or self.judge.jobs >= JUDGE_RECYCLE_JOBS:
            if self.judge is not None:
                self.judge.kill()
            self.judge = _Judge(self)
        return self.judge

    def run_assert(self, job: dict, lim: Limits) -> Verdict:
        """Candidate: a fresh confined child. Judge: a persistent unprivileged child when a cgroup
        tells us when a job's processes are gone, else a fresh one per job (see _cleanup)."""
        scratch = self._scratch()
        s_judge, s_cand = socket.socketpair()  # the call channel; the only fd the candidate keeps
        out_r, out_w = os.pipe()               # candidate's stdout+stderr, only to bound it
        null = os.open("/dev/null", os.O_RDWR)
        cfd, jfd = s_cand.fileno(), s_judge.fileno()
        cand = self._fork(lambda: candidate_main(job["program"], cfd),
                          fds={0: null, 1: out_w, 2: out_w}, keep={cfd}, uid=self.uids[0],
                          cwd=scratch, lim=lim, dumpable=True, join_cgroup=True)
        s_cand.close()
        if self.cgroup:
            judge = self._judge_process()
            judge.start(job, jfd)
            report_fd, judge_pid = judge.sock.fileno(), None
        else:
            ver_r, ver_w = os.pipe()  # judge -> executor report; the candidate never holds it

            def run_judge():
                send_frame(ver_w, judge_main(job["tests"], job.get("entry_point"), jfd))
            judge_pid = self._fork(run_judge, fds={0: null, 1: null, 2: null}, keep={jfd, ver_w},
                                   uid=self.uids[1], cwd="/", lim=lim, dumpable=False)
            os.close(ver_w)
            report_fd = ver_r
        s_judge.close()
        os.close(out_w), os.close(null)
        cand_fd = os.pidfd_open(cand)
        out, ver = bytearray(), bytearray()
        deadline = time.monotonic() + lim.timeout_s
        watch, outcome = {out_r, report_fd}, None
        while outcome is None:  # until the judge's report is complete, or a limit
            left = deadline - time.monotonic()
            if left <= 0:
                outcome = "timeout"
                break
            for fd in select.select(list(watch), [], [], left)[0]:
                chunk = os.read(fd, 1 << 16)
                if fd == report_fd:
                    ver += chunk
                    if not chunk or len(ver) > 1 << 20 or (
                            len(ver) >= 4 and len(ver) >= 4 + struct.unpack(">I", ver[:4])[0]):
                        outcome = "report" if chunk else "eof"
                elif not chunk:
                    watch.discard(out_r)
                else:
                    out += chunk
                    if len(out) > lim.max_output_kb << 10:
                        outcome = "output_limit"
        try:
            report = from_bytes(bytes(ver[4:])) if outcome == "report" else None
        except BoundaryError:
            report = None
        if type(report) is not dict or report.get("status") not in (
                "passed", "failed", "error", "crashed", "memory"):
            report = None
            if self.cgroup:  # mid-test or broken: never reuse it
                self.judge.kill()
                self.judge = None
        elif report["status"] == "crashed":  # let the candidate finish dying: its status says how
            select.select([cand_fd], [], [], 0.5)
        os.close(cand_fd)
        statuses = self._cleanup([cand] + ([judge_pid] if judge_pid else []), scratch)
        os.close(out_r)
        if not self.cgroup:
            os.close(report_fd)
        if outcome in ("timeout", "output_limit"):
            return _verdict(outcome, f"{outcome} after {lim.timeout_s}s" if outcome == "timeout"
                            else f"more than {lim.max_output_kb} KiB of output")
        if report is None:
            return _verdict("error", "the test harness did not report")
        status, detail = report["status"], str(report.get("detail", ""))
        if status == "crashed":  # refine with how the candidate died
            cstat = statuses.get(cand, -1)
            status = self._signal_status(cstat) or "crashed"
            if cstat >= 0 and os.WIFSIGNALED(cstat):
                detail += f" (signal {signal.Signals(os.WTERMSIG(cstat)).name})"
            elif cstat >= 0:
                detail += f" (exit status {os.WEXITSTATUS(cstat)})"
        return _verdict(status, detail)

    def run_io_case(self, program: str, stdin: str, lim: Limits) -> tuple[str, bytes, bytes]:
        """One stdin/stdout execution -> (outcome, stdout, stderr)."""
        scratch = self._scratch()
        memfd = os.memfd_create("stdin")
        data = memoryview(stdin.encode())
        while data:
            data = data[os.write(memfd, data):]
        os.lseek(memfd, 0, os.SEEK_SET)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = self._fork(lambda: io_candidate_main(program), fds={0: memfd, 1: out_w, 2: err_w},
                         keep=set(), uid=self.uids[0], cwd=scratch, lim=lim, dumpable=True,
                         join_cgroup=True)
        for fd in (memfd, out_w, err_w):
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + lim.timeout_s
        outcome = self._pump({out_r: out, err_r: err}, pidfd, deadline, lim.max_output_kb << 10)
        if outcome == "eof":  # it closed its output; it still has to exit in time
            outcome = "stop" if select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))[0] \
                else "timeout"
        statuses = self._cleanup([pid], scratch)
        if outcome == "stop":  # everyone is dead now: drain what is left in the pipes
            outcome = self._pump({out_r: out, err_r: err}, None, time.monotonic() + 1.0,
                                 lim.max_output_kb << 10)
        for fd in (out_r, err_r, pidfd):
            os.close(fd)
        if outcome != "eof":
            return outcome, bytes(out), bytes(err)
        status = statuses[pid]
        if sig := self._signal_status(status):
            if sig == "timeout" and b"MemoryError" in err:
                sig = "memory"
            return sig, bytes(out), bytes(err)
        if os.WEXITSTATUS(status) != 0:
            return ("memory" if b"MemoryError" in err[-2000:] else "error"), bytes(out), bytes(err)
        return "ok", bytes(out), bytes(err)

    def run_io(self, job: dict, lim: Limits) -> Verdict:
        cases, partial = job["cases"], bool(job.get("partial_reward", False))
        n_pass, first_bad = 0, None
        for i, (stdin, expected) in enumerate(cases):
            outcome, out, err = self.run_io_case(job["program"], stdin, lim)
            if outcome == "ok" and out.split() == expected.encode().split():
                n_pass += 1
                continue
            if first_bad is None:
                if outcome == "ok":
                    first_bad = ("failed", f"case {i}: expected {expected[:80]!r}, got "
                                 f"{out[:80].decode('utf-8', 'replace')!r}")
                else:
                    tail = err[-200:].decode("utf-8", "replace").strip().splitlines()
                    first_bad = (outcome, f"case {i}: {outcome}" + (f": {tail[-1]}" if tail else ""))
            if not partial:
                break
        fraction = n_pass / len(cases) if cases else 0.0
        if first_bad is None:
            return _verdict("passed", f"{n_pass}/{len(cases)} cases passed", 1.0, 1.0)
        return _verdict(first_bad[0], first_bad[1], fraction, fraction if partial else 0.0)

    def run(self, job: dict) -> Verdict:
        lim = Limits(**{k: job[k] for k in LIMIT_KEYS if k in job})
        if self.cgroup:
            self.cgroup.set_max(lim.max_procs)
        return self.run_io(job, lim) if job["kind"] == "io" else self.run_assert(job, lim)


def executor_main(config_json: str) -> None:
    """Entry point of an executor process: serve jobs from stdin, verdicts to stdout, until EOF."""
    cfg = json.loads(config_json)
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0), os.dup2(null, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the pool decides when we stop (EOF or kill)
    ex = Executor(cfg["isolation"], cfg["hide"])
    send_frame(wfd, {"ready": ex.report})
    while (raw := recv_frame(rfd)) is not None:
        breach = False
        try:
            verdict = ex.run(from_bytes(raw))
        except SandboxBreach as e:
            verdict, breach = _verdict("error", f"verifier error: {e}"), True
        except Exception as e:  # noqa: BLE001 - one bad job must not take the executor down
            verdict = _verdict("error", f"verifier error: {_describe(e)}")
        send_frame(wfd, dataclasses.asdict(verdict))
        if breach:
            os._exit(3)


# ============================================================================ jobs: validation (parent side)

LIMIT_KEYS = tuple(f.name for f in dataclasses.fields(Limits))
_JOB_KEYS = {"kind", "program", "tests", "entry_point", "cases", "partial_reward", "id"} | set(LIMIT_KEYS)
MAX_PROGRAM_BYTES = 1 << 20


def check_job(job) -> dict:
    """Validate a job dict (from a caller or the wire); raise ValueError saying what is wrong."""
    if not isinstance(job, dict):
        raise ValueError(f"a job must be a dict, got {type(job).__name__}")
    if unknown := set(job) - _JOB_KEYS:
        raise ValueError(f"unknown job keys {sorted(map(str, unknown))}")
    kind = job.get("kind")
    if kind not in ("assert", "io"):
        raise ValueError(f"job kind must be 'assert' or 'io', got {kind!r}")
    if not isinstance(job.get("program"), str) or len(job["program"]) > MAX_PROGRAM_BYTES:
        raise ValueError(f"job program must be a string of at most {MAX_PROGRAM_BYTES} chars")
    if kind == "assert":
        if not isinstance(job.get("tests"), str) or len(job["tests"]) > MAX_PROGRAM_BYTES:
            raise ValueError(f"assert job needs tests: a string of at most {MAX_PROGRAM_BYTES} chars")
        ep = job.get("entry_point")
        if ep is not None and not (isinstance(ep, str) and ep.isidentifier()):
            raise ValueError(f"entry_point must be an identifier, got {ep!r}")
    else:
        cases = job.get("cases")
        if not isinstance(cases, (list, tuple)) or not cases or not all(
                isinstance(c, (list, tuple)) and len(c) == 2 and all(isinstance(s, str) for s in c)
                for c in cases):
            raise ValueError("io job needs cases: a non-empty list of (stdin, expected stdout) strings")
        if not isinstance(job.get("partial_reward", False), bool):
            raise ValueError("partial_reward must be a bool")
    Limits(**{k: job[k] for k in LIMIT_KEYS if k in job})  # raises on a bad limit
    out = {k: v for k, v in job.items() if k != "id"}
    if kind == "io":
        out["cases"] = [list(c) for c in job["cases"]]
    return out


# ============================================================================ pool (parent side)


class ExecutorDied(RuntimeError):
    """The executor process ended or stopped answering."""


class _ExecutorProcess:
    """Parent-side handle on one executor process."""

    def __init__(self, isolation: str, hide: list[str]):
        cfg = json.dumps({"isolation": isolation, "hide": hide})
        self.proc = subprocess.Popen([sys.executable, "-E", "-s", os.path.abspath(__file__), "--executor", cfg],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        raw = self._read(30.0)
        self.report = from_bytes(raw)["ready"]

    def _read(self, timeout_s: float) -> bytes:
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout_s)
        if not ready:
            raise ExecutorDied(f"executor {self.proc.pid} did not answer within {timeout_s:.0f}s")
        raw = recv_frame(fd)
        if raw is None:
            raise ExecutorDied(f"executor {self.proc.pid} exited (status {self.proc.poll()})")
        return raw

    def run(self, job: dict) -> Verdict:
        try:
            send_frame(self.proc.stdin.fileno(), to_plain(job))
        except OSError as e:
            raise ExecutorDied(f"executor {self.proc.pid}: {e}") from None
        n = len(job.get("cases", [])) or 1
        return Verdict(**from_bytes(self._read(job.get("timeout_s", 5.0) * n + 30.0)))

    def close(self) -> None:
        """Stop the executor and anything left of its jobs (their uids are known from its pid)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        if os.geteuid() == 0:
            for uid in sandbox.role_uids(self.proc.pid):
                sandbox.kill_uid(uid)
            sandbox.remove_cgroup(self.proc.pid)


class ExecutorPool:
    """N executor processes fed from one queue by N threads; a dead executor is replaced and its job
    retried once, so killing an executor loses no request."""

    def __init__(self, executors: int = 2, isolation: str = "auto", hide: list[str] | None = None):
        self.isolation, self.hide = isolation, (hide or []) + sandbox.default_hidden_paths()
        self.jobs: queue.Queue = queue.Queue()
        self.slots = [_ExecutorProcess(isolation, self.hide) for _ in range(executors)]
        self.report = self.slots[0].report
        self.restarts = 0
        self.threads = [threading.Thread(target=self._work, args=(i,), daemon=True, name=f"executor-{i}")
                        for i in range(executors)]
        for t in self.threads:
            t.start()

    def _work(self, i: int) -> None:
        while (item := self.jobs.get()) is not None:
            job, future = item
            verdict = None
            for attempt in range(2):
                try:
                    verdict = self.slots[i].run(job)
                    break
                except (ExecutorDied, BoundaryError, TypeError, KeyError) as e:
                    self.slots[i].close()
                    self.restarts += 1
                    self.slots[i] = _ExecutorProcess(self.isolation, self.hide)
                    verdict = _verdict("error", f"executor lost twice running this job: {e}")
            future.set_result(verdict)

    def submit(self, job: dict) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            job = check_job(job)
        except ValueError as e:
            future.set_result(_verdict("error", f"bad job: {e}"))
            return future
        self.jobs.put((job, future))
        return future

    def run(self, jobs: list[dict]) -> list[Verdict]:
        return [f.result() for f in [self.submit(j) for j in jobs]]

    def executor_pids(self) -> list[int]:
        return [s.proc.pid for s in self.slots]

    def close(self) -> None:
        for _ in self.threads:
            self.jobs.put(None)
        for t in self.threads:
            t.join(timeout=60)
        for s in self.slots:
            s.close()


# ============================================================================ public API

_pools: dict[int, ExecutorPool] = {}
_pools_lock = threading.Lock()


def default_pool(workers: int = 2) -> ExecutorPool:
    """A process-wide pool per worker count, started on first use (about 0.2 s) and reused."""
    with _pools_lock:
        if workers not in _pools:
            if not _pools:
                import atexit
                atexit.register(lambda: [p.close() for p in _pools.values()])
            _pools[workers] = ExecutorPool(workers)
        return _pools[workers]


def verify(program: str, tests: str, timeout_s: float = 5.0, **limits) -> Verdict:
    """Run `program`, then `tests` (asserts; with entry_point=f also check(f)), sandboxed."""
    return default_pool().run([{"kind": "assert", "program": program, "tests": tests,
                                "timeout_s": timeout_s, **limits}])[0]


def verify_io(program: str, cases: list[tuple[str, str]], timeout_s: float = 5.0,
              partial_reward: bool = False, **limits) -> Verdict:
    """Run `program` on each case's stdin; pass iff every stdout matches (whitespace-separated
    tokens) with exit status 0. partial_reward=True runs all cases and rewards the fraction."""
    return default_pool().run([{"kind": "io", "program": program, "cases": [list(c) for c in cases],
                                "timeout_s": timeout_s, "partial_reward": partial_reward, **limits}])[0]


def verify_batch(jobs: list[dict], workers: int = 2) -> list[Verdict]:
    """Many jobs at once over `workers` executors; verdicts in job order."""
    return default_pool(workers).run(jobs)


class VerifierClient:
    """Client of the verifier service (see the module docstring for the command)."""

    def __init__(self, addr: str = "tcp://127.0.0.1:5557", timeout_s: float = 120.0):
        import wire
        self.wire = wire
        self.client = wire.Client("verifier-client", addr, timeout_s=timeout_s)

    def verify_batch(self, jobs: list[dict]) -> list[Verdict]:
        reply = self.client.call(self.wire.VerifyBatch(jobs=list(jobs)), what=f"{len(jobs)} verdicts")
        return [Verdict(**v) for v in reply.verdicts]

    def close(self) -> None:
        self.client.close()


# ============================================================================ service


class VerifierService:
    """wire.Server + ExecutorPool: each VerifyBatch is queued at once and answered (deferred) from
    the serving thread's tick when its last verdict is in, so batches never block the loop."""

    def __init__(self, cfg: VerifierConfig):
        import wire
        self.wire, self.cfg = wire, cfg
        self.pool = ExecutorPool(cfg.executors, cfg.isolation, [h for h in cfg.hide.split(",") if h])
        self.server = wire.Server("verifier", cfg.bind, max_message_bytes=4 * cfg.max_request_mb << 20)
        self.server.on(wire.VerifyBatch, self.on_batch)
        self.pending: list[tuple[object, list]] = []
        self.batches = 0

    def on_batch(self, msg, peer):
        jobs = msg.jobs
        if len(jobs) > self.cfg.max_jobs:
            raise ValueError(f"{len(jobs)} jobs in one batch, at most {self.cfg.max_jobs}")
        size = sum(len(str(j)) for j in jobs)
        if size > self.cfg.max_request_mb << 20:
            raise ValueError(f"batch of {size} chars exceeds {self.cfg.max_request_mb} MiB")
        self.pending.append((peer, [self.pool.submit(j) for j in jobs]))
        self.batches += 1
        return None

    def tick(self) -> None:
        still = []
        for peer, futures in self.pending:
            if all(f.done() for f in futures):
                verdicts = [dataclasses.asdict(f.result()) for f in futures]
                self.server.reply(peer, self.wire.Verdicts(verdicts=verdicts))
            else:
                still.append((peer, futures))
        self.pending = still

    def serve(self, stop: threading.Event | None = None) -> None:
        self.server.serve(stop=stop, tick=self.tick, poll_ms=5)

    def close(self) -> None:
        self.server.close()
        self.pool.close()


def _field_docs(cls) -> dict[str, str]:
    """The one-line docstring under each dataclass field, so --help says what the code says."""
    import ast
    import inspect
    body = ast.parse(inspect.getsource(cls)).body[0].body
    return {a.target.id: b.value.value for a, b in zip(body, body[1:])
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)}


def _parse_args(argv=None) -> VerifierConfig:
    parser = argparse.ArgumentParser(description="Oubliette: sandboxed verifier service (ZeroMQ).")
    docs = _field_docs(VerifierConfig)
    for f in dataclasses.fields(VerifierConfig):
        parser.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default,
                            help=f"{docs.get(f.name, f.name)} (default: {f.default!r})")
    return VerifierConfig(**vars(parser.parse_args(argv)))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--executor":
        executor_main(sys.argv[2])
        sys.exit(0)
    cfg = _parse_args()
    service = VerifierService(cfg)
    print(f"verifier: serving {cfg.bind} with {cfg.executors} executors, isolation "
          f"{service.pool.report['mode']} ({service.pool.report['network']})", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        service.serve()
    except KeyboardInterrupt:
        pass
    finally:
        service.close()
