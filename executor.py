"""The executor process of the verifier ("Oubliette"): one job at a time, its launcher, and the verdict.

Trusted code, on the trusted side of the boundary: the executor and the launcher it forks never run a
line of the program or of the tests (the candidate and the judge are children the launcher forks and
confines: candidate.py and judge.py are their code, isolation.py the confinement). verifier.py is the
role (API, executor pool, ZeroMQ service); the pool starts each executor as
`python -E -s executor.py --executor CONFIG` with a minimal environment: a fresh pre-imported
interpreter that enters the sandbox once (isolation.enter_sandbox) and talks length-prefixed msgpack
on its stdin/stdout. Everything it and its children import is imported here, before the sandbox
hides the project's files: the standard library, msgpack, verdicts.py, isolation.py, boundary.py,
candidate.py, judge.py, judge_names.py and judge_handles.py (no numpy, no zmq). verifier.py's
docstring explains why a verdict cannot be forged.
"""

import dataclasses
import json
import math
import os
import select
import signal
import socket
import struct
import sys
import time
import traceback

from isolation import (MNT_DETACH, MS_NODEV, MS_NOEXEC, MS_NOSUID, PR_SET_CHILD_SUBREAPER,
                       PR_SET_PDEATHSIG, SCRATCH_INODES, InfraFailure, IsolationUnavailable, JobCgroup,
                       ProgramBreach, SandboxBreach, check_ret, close_fds_except, confine,
                       enter_sandbox, kill_children, kill_uid, libc, mount, prctl, refuse, remove_tree,
                       seccomp_program, wait_child)
from boundary import PURE_MODULES, describe, from_bytes, pack, recv_frame, send_frame
from candidate import candidate_main, io_candidate_main
from judge import CANDIDATE_GONE, JUDGE_STATUSES, judge_job
from verdicts import (INFRA_ERROR, LIMIT_KEYS, ROUND_TRIP_ALLOWANCE_S, BoundaryError, Limits, Verdict,
                      make_verdict)

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
            os.write(marks_w, b"0" + describe(e).encode("utf-8", "replace"))
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
                              cpu_s=math.ceil(lim.longest_s(req["kind"])),
                              new_ns=self.isolated, seccomp=self.seccomp)
        pidfd = os.pidfd_open(pid)
        judge = None
        if req["kind"] == "assert":  # forked now, confined once the candidate speaks (_judge)
            judge = self._judge(stdio, extra[1:], lim, pidfd)
        for fd in fds:
            os.close(fd)
        socket.send_fds(sock, [b"S"], [pidfd])
        raw = _recv_frame_within(sock.fileno(), lim.longest_s(req["kind"]) + LAUNCHER_REPLY_S)
        grace = from_bytes(raw).get("grace", 0.0) if raw else 0.0
        judge_status, judge_marks, judge_left = self._end_judge(*judge) if judge else (None, b"", None)
        if grace:  # the candidate is finishing by itself: its status says how it ended
            select.select([pidfd], [], [], min(float(grace), 1.0))
        os.close(pidfd)
        status, killed, breach = self._cleanup(pid, scratch)
        breach = breach or judge_left  # the verdict leaves only once every process of the job is gone
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
            send_frame(report_fd, judge_job(job["tests"], job["entry_point"], channel_fd, marks_fd, report_fd))
        return _child(body, fds=dict(zip((0, 1, 2), stdio)), keep={channel_fd, tests_fd, report_fd},
                      uid=self.uids[1], cwd="/", lim=JUDGE_LIMITS, cpu_s=math.ceil(lim.longest_s("assert")) + 1,
                      dumpable=False, new_ns=self.isolated,
                      join_ns=candidate_pidfd if self.isolated else None, wait_fd=channel_fd,
                      seccomp=self.seccomp)

    @staticmethod
    def _end_judge(pid: int, marks_r: int) -> tuple[int, bytes, str | None]:
        """Kill the judge (it may have exited already) and reap it: (its wait status, its marks, None
        or why it is still there). It cannot fork (JUDGE_LIMITS.max_procs), so once reaped nothing of
        it is left; one that outlives CLEANUP_S is a breach (the executor retires and is swept)."""
        try:
            os.kill(pid, signal.SIGKILL)  # our unreaped child: the pid cannot have been reused
        except ProcessLookupError:
            pass
        status = wait_child(pid, CLEANUP_S)
        if status is None:
            return signal.SIGKILL, _marks(marks_r), f"the judge's process {pid} did not die"
        return status, _marks(marks_r), None

    def _scratch(self, lim: Limits) -> str:
        """A fresh scratch directory: in the sandbox a tmpfs of its own (its size is the job's
        memory limit), so removing it is one unmount whatever the program left in it."""
        self.counter += 1
        if self.isolated:
            path = f"/tmp/job{self.counter}"
            os.mkdir(path, 0o700)
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
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
            check_ret(libc.umount2(path.encode(), MNT_DETACH), f"umount {path}")
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
        status = wait_child(pid, 0.0)
        if status is None:
            os.kill(pid, signal.SIGKILL)
            killed = True
            status = wait_child(pid, CLEANUP_S)
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
            breach = breach or f"its scratch directory could not be removed: {describe(e)}"
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

    def __init__(self, isolation: str, hide: list[str], use_cgroup: bool = True, image: str | None = None):
        try:  # before enter_sandbox: the chroot hides /sys
            self.cgroup = JobCgroup() if os.geteuid() == 0 and use_cgroup else None
            why = "" if self.cgroup else ("not root" if use_cgroup else "not requested")
        except OSError as e:
            self.cgroup, why = None, str(e)
        self.report = enter_sandbox(isolation, hide, image)
        uids = self.report.pop("uids")
        self.uids = tuple(uids) if uids else (None, None, None)
        self.isolated = self.report["mode"] == "namespaces"
        self.seccomp = seccomp_program(os.uname().machine) is not None
        if self.isolated and not self.seccomp:
            raise refuse(f"no system-call filter for {os.uname().machine} (x86_64 and aarch64 have one)")
        self.report["cgroup"] = self.cgroup.path if self.cgroup else f"none ({why}): always sweep"
        self.report["memory"] = (
            "per execution: a memory cgroup caps all its processes and its scratch at memory_mb"
            if self.cgroup is not None and self.cgroup.mem_fds else
            "per process only (no memory cgroup): an execution may hold up to max_procs x memory_mb")
        self.report["ipc"] = "a new IPC and network namespace per execution (candidate and judge)" \
            if self.isolated else "host's (NOT isolated)"
        self.report["syscalls"] = ("seccomp: keyrings, descriptors in flight, AF_UNIX sockets, new "
                                   "namespaces, page-cache probes refused"
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
    def _read_report(fd: int, lim: Limits) -> tuple[bytes, str]:
        """The judge's report frame: (bytes, "report" | "eof" | "timeout"). Before it the judge may
        send {"round_trips": n} frames: each moves the deadline by n x ROUND_TRIP_ALLOWANCE_S, up to
        lim.longest_s("assert") after the start (the limit is the program's time, not the boundary's)."""
        start = time.monotonic()
        deadline, last = start + lim.timeout_s, start + lim.longest_s("assert")
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
            while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
                n = struct.unpack(">I", buf[:4])[0]
                frame = bytes(buf[:4 + n])
                try:
                    progress = from_bytes(frame[4:])
                except BoundaryError:
                    progress = None
                if type(progress) is dict and set(progress) == {"round_trips"} \
                        and type(progress["round_trips"]) is int and 0 < progress["round_trips"] <= 1 << 20:
                    deadline = min(last, deadline + progress["round_trips"] * ROUND_TRIP_ALLOWANCE_S)
                    del buf[:4 + n]
                    continue
                return frame, "report"

    @staticmethod
    def _parse_report(raw: bytes) -> dict | None:
        try:
            report = from_bytes(raw[4:])
        except BoundaryError:
            return None
        if type(report) is not dict or report.get("status") not in JUDGE_STATUSES \
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
            data = memoryview(pack({"tests": job["tests"], "entry_point": job.get("entry_point")}))
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
            raw, outcome = self._read_report(report_r, lim)
        finally:
            os.close(report_r)
        report = self._parse_report(raw) if outcome == "report" else None
        gone = report is not None and report["status"] == CANDIDATE_GONE
        res = self._finished(self.launcher.finish(0.5 if gone else 0.0))
        jmarks = res["judge_marks"]
        # a judge with no mark at a timeout was still waiting for the program's first word
        if not jmarks.startswith(b"1") and not (outcome == "timeout" and jmarks == b""):
            raise InfraFailure("the judge could not be confined: "
                               + (jmarks[1:].decode("utf-8", "replace") or "it died first"))
        return self._verdict_of_assert(outcome, report, res, lim)

    @classmethod
    def _verdict_of_assert(cls, outcome: str, report: dict | None, res: dict, lim: Limits) -> Verdict:
        """The one place an assert job's status is decided, from the facts: how reading the judge's
        report ended (outcome), the report, and the launcher's account of both processes (res).
        The judge decides only what the tests showed; when it saw the candidate go (CANDIDATE_GONE)
        the status comes from how the candidate's process ended, which only this side sees."""
        jstatus, jmarks = res["judge_status"], res["judge_marks"]
        if outcome == "timeout":
            return make_verdict("memory" if res["oom"] else "timeout",
                            "killed by the job's memory limit" if res["oom"] else f"timeout after {lim.timeout_s}s")
        if report is None and outcome == "eof" and jmarks.startswith(b"1P"):
            # it died handling the program's values: the program's failure, like the candidate's death
            how = _signal_name(os.WTERMSIG(jstatus)) if os.WIFSIGNALED(jstatus) else \
                f"exit status {os.WEXITSTATUS(jstatus)}"
            sigxcpu = os.WIFSIGNALED(jstatus) and os.WTERMSIG(jstatus) == signal.SIGXCPU
            return make_verdict("timeout" if sigxcpu else "crashed",
                            f"the judge died while running the program's tests ({how})")
        if report is None:
            raise InfraFailure("the judge did not report (" + (
                "it died before the program's tests" if outcome == "eof" else "malformed report") + ")")
        status, detail = report["status"], report["detail"]
        if status != CANDIDATE_GONE:
            return make_verdict(status, detail)
        if res["killed"]:
            status, detail = "crashed", detail + " (it had closed its channel and was still running: killed)"
        else:  # how the candidate died
            cstat = res["status"]
            status = cls._signal_status(cstat) or "crashed"
            if os.WIFSIGNALED(cstat):
                detail += f" ({_signal_name(os.WTERMSIG(cstat))})"
            else:
                detail += f" (exit status {os.WEXITSTATUS(cstat)})"
        if res["oom"] and status in ("crashed", "timeout"):
            status, detail = "memory", detail + " (killed by the job's memory limit)"
        return make_verdict(status, detail)

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
            return make_verdict("passed", f"{n_pass}/{len(cases)} cases passed", 1.0, 1.0)
        return make_verdict(first_bad[0], first_bad[1], fraction, fraction if partial else 0.0)

    def run_tool(self, job: dict, lim: Limits) -> Verdict:
        """A "run" job (a tool call of a multi-turn task, envs/python_tool.py): the program alone, no stdin, as an
        io case is run; the verdict's detail is what it printed (capped with the detail, 500 chars),
        then, if it did not exit cleanly, the status and the last line of its stderr."""
        outcome, out, err = self.run_io_case(job["program"], "", "", lim)
        text = out.decode("utf-8", "replace")
        if outcome != "ok":
            tail = err[-300:].decode("utf-8", "replace").strip().splitlines()
            text = text[:300] + f"\n[{outcome}" + (f": {tail[-1]}]" if tail else "]")
        return make_verdict("passed" if outcome == "ok" else outcome, text)

    def run(self, job: dict) -> Verdict:
        lim = Limits(**{k: job[k] for k in LIMIT_KEYS if k in job})
        try:
            if job["kind"] == "run":
                return self.run_tool(job, lim)
            return self.run_io(job, lim) if job["kind"] == "io" else self.run_assert(job, lim)
        except ProgramBreach as e:  # the program's doing; this executor is in doubt: retire it
            self.retire = True
            return make_verdict("failed", f"the program left what cleanup could not remove: {e}")


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
        ex = Executor(cfg["isolation"], cfg["hide"], cfg.get("use_cgroup", True), cfg.get("image"))
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
            verdict = make_verdict(INFRA_ERROR, f"verifier error: {e}")
        except Exception as e:  # noqa: BLE001 - a bug of ours: report it, then start afresh
            verdict = make_verdict(INFRA_ERROR, f"verifier error: {describe(e)}")
        send_frame(wfd, {"verdict": dataclasses.asdict(verdict), "retire": retire})
        if retire:
            os._exit(3)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--executor":
        executor_main(sys.argv[2])
    else:
        sys.exit("executor.py is started by verifier.py's executor pool: --executor CONFIG")
