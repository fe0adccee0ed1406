"""verifier.py: the stateless code-execution sandbox ("Oubliette") that turns completions into rewards.

RLAX verifies generated code by running it against tests in an environment destroyed afterwards. The
programs come from a policy optimised to get reward, so this role assumes every program is hostile
and inventive about *looking* correct, and that the verifier must fail closed.

How a verdict is reached (why it cannot be forged):
  * assert-style (HumanEval): two processes. The CANDIDATE, forked fresh for each execution from a
    launcher process that never held a job (so no test, expected output or environment is in its
    memory), runs the program under a uid of its own; the JUDGE, under another uid, runs the tests
    (forked for each job and confined as the candidate is: seccomp filter, the execution's IPC and
    network namespaces; its death while it handles the program's values is the program's failure). The judge never
    executes a line of the program: every name the program defines appears in the judge as a proxy
    that sends the call's arguments to the candidate and gets back the result as *bytes*
    (msgpack with a few tagged types), decoded into genuine int/str/list/... objects. So the
    program cannot see the tests or their expected values, patch the judge's builtins or assert
    helpers, hand over an object whose __eq__ lies, or exit/print its way to success: only the
    judge's report, on a pipe the candidate does not hold, says "passed". Names that shadow
    builtins (abs, len, ...) and dunders (__builtins__) are never bound, so a program cannot
    redefine what tests use; the judge imports a module the program imported only if it is a pure
    one (boundary.PURE_MODULES), by name, itself, and binds no program object under a
    standard-library module's name.
    Objects that are not plain data (instances of the program's classes, closures, generators)
    stay in the candidate; the judge holds a handle it can call, read attributes of and pass back,
    and decides `==` itself (a handle equals only itself, never a plain value): judge_handles.Handle
    says why that cannot forge a pass.
  * io-style (Codeforces): the program's stdout is captured by the executor (trusted) and compared
    token by token with the expected output; the exit status must be 0.
The candidate and the judge are in candidate.py and judge.py, their codec in boundary.py, the
isolation (namespaces, uids, limits, cleanup) in isolation.py, the executor that runs them in
executor.py (a separate process: this role never imports it), the verdict record in verdicts.py.
  * math and reward jobs (scorers.py) run no program: a math completion's final answer is compared with
    the reference by math-verify, in a grading process killed at the job's time limit (an answer that
    runs past it, or is longer than scorers.MAX_ANSWER_CHARS, fails); a reward job calls the user's
    function (--reward file.py:function) with the completion and the dataset row, in a child process
    of its own with the job's time limit. Their statuses add "lenient" (the right answer, not in the
    format asked for) and "reward_error" (the function raised, returned no real number finite as a
    float32, or ran too long: never scored, like infra_error).

Statuses: verdicts.Verdict's docstring is the list. All but one are the program's own outcomes;
infra_error says the verifier could not judge (an executor died twice or could not start, the
sandbox could not be set up, a protocol broke, a bad job). It says nothing about the program: a
caller must not score it (the trainer drops every group that holds one), and a program cannot
cause it: every byte it controls is decoded with bounds on the trusted side, whatever cleanup
cannot undo is its failure, and every wait is bounded (docs/verifier.md, "Threat model").

Isolation fails closed: `--isolation namespaces` (the default) or the verifier refuses to start,
saying what is missing; `--isolation rlimits` (no network or filesystem isolation) only when asked
for by name, and then every batch served logs a warning. There is no "auto": a level picked for
the caller would be a silent fallback to weaker isolation.

Processes and sockets:
  service   `python verifier.py --bind tcp://127.0.0.1:5557 --executors 2`: a wire.Server (ROUTER)
            answering wire.VerifyBatch with wire.Verdicts (deferred reply; batches from several
            clients run concurrently over the pool); wire.Ping -> wire.Pong, saying how long each
            batch of the pinging connection may still take (ExecutorPool.submit_batch: its client
            waits that long); wire.CancelBatch -> wire.Ok, dropping a batch its client gave up on.
            Its client is verifier_client.VerifierFleet (its own module: no role imports this one).
  executor  `python -E -s executor.py --executor CONFIG` (started by the pool, never by hand): a fresh
            pre-imported interpreter that enters the sandbox once and forks a limited candidate per
            job; talks to the pool over its stdin/stdout pipes with length-prefixed msgpack.

Cost per execution (bench/bench_verifier.py): one fork of a small pre-imported process (two for an
assert job: the candidate and its judge), rlimits, setuid, IPC and network namespaces and a seccomp
filter in each, a cgroup join, a tmpfs scratch mount, and a msgpack round trip per call of the
program; the uid-wide kill sweep (another fork) runs only when the cgroup shows something was left.

Known limits: plain data (None, bool, int, float, complex, str, bytes, list, tuple, dict, set,
frozenset) crosses by value, a subclass of one of them as its builtin value (its methods stay
behind); anything else as a handle, so a program returning a numpy int where a test expects an int
fails (a handle never equals a plain value), and so does a test comparing two program objects
(`make() == Point(1, 2)`: identity) rather than their attributes. Tests that call helper functions
the *prompt* defines (HumanEval/32 poly, /38 encode_cyclic, /50 encode_shift) call the program's
copy, which the program controls, as in HumanEval itself. io-style comparison is by
whitespace-separated tokens, no float tolerance; stdout is capped at max(max_output_kb, 2 x the
expected output) (past it: output_limit), stderr is dropped; assert-style output goes to /dev/null.

Deviation from the paper: RLAX ran Oubliette on AWS Lambda with containerised dependencies; here the
same "fresh, destroyed afterwards" property comes from fork + namespaces + a uid per executor.
"""

import argparse
import concurrent.futures
import dataclasses
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time

import attest
import rootfs
import scorers
from isolation import (ISOLATION_MODES, IsolationUnavailable, SandboxBreach, default_hidden_paths,
                       kill_uid, refuse, remove_cgroup, remove_stale_cgroups, role_uids)
from boundary import from_bytes, recv_frame, send_frame, to_plain
from verdicts import (INFRA_ERROR, LIMIT_KEYS, BoundaryError, Limits, Verdict,
                      make_verdict, verdict_from_dict)

# ============================================================================ configuration


@dataclasses.dataclass
class VerifierConfig:
    """The service's settings; the CLI is built from these fields."""
    bind: str = "tcp://127.0.0.1:5557"
    """ZeroMQ address the service binds (non-loopback needs CURVE keys, see wire.py)."""
    executors: int = 2
    """Pre-started executor processes; each runs one execution at a time."""
    isolation: str = "namespaces"
    """namespaces (refuse to start if unavailable) | rlimits (no network/file isolation; only by
    name, and every batch logs a warning). See isolation.py."""
    hide: str = ""
    """Extra comma-separated host paths to cover inside the sandbox (datasets holding tests)."""
    packages: str = ",".join(rootfs.DEFAULT_PACKAGES)
    """Comma-separated third-party modules a program may import (copied, with what they require, into
    the sandbox's in-memory file image: rootfs.py); others are not there. "": the standard library only"""
    max_jobs: int = 4096
    """Largest batch accepted in one VerifyBatch."""
    max_request_mb: int = 64
    """Largest VerifyBatch (sum of program/test/case text); bigger gets an error reply."""
    reward: str = ""
    """path/to/file.py:function scoring "reward" jobs, called as function(completion, row) -> float in a
    child process with the job's time limit (scorers.py; launch.sh REWARD). "": reward jobs get reward_error"""
    verdict_key: str = ""
    """A file holding the run's verdict key (attest.py; launch.sh writes $RUN_DIR/verdict.key): every verdict of
    a job that names the row it scores ("seal") is sealed with it, so the param server can tell it from a
    forged one. Never give it to a worker. "": verdicts are not sealed"""

    def __post_init__(self):
        if self.isolation not in ISOLATION_MODES:
            raise ValueError(f"isolation must be {'|'.join(ISOLATION_MODES)} (weaker isolation only "
                             f"by name, no automatic choice), got {self.isolation!r}")
        if not 1 <= self.executors <= 256:
            raise ValueError(f"executors must be in [1, 256], got {self.executors}")
        if self.max_jobs < 1 or self.max_request_mb < 1:
            raise ValueError("max_jobs and max_request_mb must be positive")
        if self.reward:
            scorers.load_reward(self.reward)  # raises on a file or function that is not there


# ============================================================================ jobs: validation (parent side)

_JOB_KEYS = {"kind", "program", "tests", "entry_point", "cases", "partial_reward", "id", "seal",
             "completion", "answer", "format", "row"} | set(LIMIT_KEYS)
MAX_PROGRAM_BYTES = 1 << 20


def check_job(job) -> dict:
    """Validate a job dict (from a caller or the wire); raise ValueError saying what is wrong.
    Only the caller's mistakes: the program's own text is judged by program_verdict."""
    if not isinstance(job, dict):
        raise ValueError(f"a job must be a dict, got {type(job).__name__}")
    if unknown := set(job) - _JOB_KEYS:
        raise ValueError(f"unknown job keys {sorted(map(str, unknown))}")
    kind = job.get("kind")
    if kind in scorers.SCORED_KINDS:
        return check_scored_job(job)
    if kind not in ("assert", "io", "run"):
        raise ValueError(f"job kind must be 'assert', 'io', 'run', 'math' or 'reward', got {kind!r}")
    if not isinstance(job.get("program"), str):
        raise ValueError("job program must be a string")
    if kind == "assert":
        if not isinstance(job.get("tests"), str) or len(job["tests"]) > MAX_PROGRAM_BYTES:
            raise ValueError(f"assert job needs tests: a string of at most {MAX_PROGRAM_BYTES} chars")
        ep = job.get("entry_point")
        if ep is not None and not (isinstance(ep, str) and ep.isidentifier()):
            raise ValueError(f"entry_point must be an identifier, got {ep!r}")
    elif kind == "io":
        cases = job.get("cases")
        if not isinstance(cases, (list, tuple)) or not cases or not all(
                isinstance(c, (list, tuple)) and len(c) == 2 and all(isinstance(s, str) for s in c)
                for c in cases):
            raise ValueError("io job needs cases: a non-empty list of (stdin, expected stdout) strings")
        if not isinstance(job.get("partial_reward", False), bool):
            raise ValueError("partial_reward must be a bool")
    Limits(**{k: job[k] for k in LIMIT_KEYS if k in job})  # raises on a bad limit
    out = {k: v for k, v in job.items() if k not in ("id", "seal")}
    if kind == "io":
        out["cases"] = [list(c) for c in job["cases"]]
    for key in ("tests", "entry_point", "cases"):
        _check_utf8(key, out.get(key))
    return out


def check_scored_job(job: dict) -> dict:
    """A math job {"kind": "math", "completion", "answer", "format"} or a reward job {"kind": "reward",
    "completion", "row": the dataset line as JSON text} (scorers.py scores them); ValueError if malformed."""
    if not isinstance(job.get("completion"), str) or len(job["completion"]) > MAX_PROGRAM_BYTES:
        raise ValueError(f"{job['kind']} job needs a completion: a string of at most {MAX_PROGRAM_BYTES} chars")
    if job["kind"] == "math":
        answer = job.get("answer")  # read by math-verify in a grading process (scorers.Scorer), never here
        if job.get("format") not in scorers.MATH_FORMATS or not isinstance(answer, str) or not answer.strip() \
                or len(answer) > scorers.MAX_ANSWER_CHARS:
            raise ValueError(f"math job needs format in {scorers.MATH_FORMATS} and an answer: a non-empty string "
                             f"of at most {scorers.MAX_ANSWER_CHARS} characters")
    else:
        try:
            if not isinstance(json.loads(job.get("row")), dict):
                raise ValueError
        except (TypeError, ValueError):
            raise ValueError("reward job needs row: the dataset line, a JSON object as text") from None
    Limits(**{k: job[k] for k in LIMIT_KEYS if k in job})
    out = {k: v for k, v in job.items() if k not in ("id", "seal")}
    for key in ("completion", "row", "answer"):
        _check_utf8(key, out.get(key))
    return out


def _check_utf8(key: str, value) -> None:
    """ValueError if a str (or one in a list) cannot be sent as UTF-8 (it holds lone surrogates)."""
    if isinstance(value, list):
        for v in value:
            _check_utf8(key, v)
    elif isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{key} is not UTF-8 text: {e}") from None


def program_verdict(job: dict) -> Verdict | None:
    """The verdict on a checked job decided by its program text alone (too_large, or syntax_error
    for text that is not UTF-8), else None. A program's own failings, never infra_error."""
    program = job["program"]
    if len(program) > MAX_PROGRAM_BYTES:
        return make_verdict("too_large", f"the program has {len(program)} chars, above {MAX_PROGRAM_BYTES}")
    try:
        size = len(program.encode("utf-8"))
    except UnicodeEncodeError as e:
        return make_verdict("syntax_error", f"the program is not UTF-8 text: {e}")
    if size > MAX_PROGRAM_BYTES:
        return make_verdict("too_large", f"the program has {size} bytes, above {MAX_PROGRAM_BYTES}")
    return None


# ============================================================================ pool (parent side)


# The executor is a script of its own, started by path: the pool neither imports it nor the
# candidate's and judge's code it pre-imports.
EXECUTOR_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "executor.py")
EXECUTOR_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
EXECUTOR_START_S = 30.0
"""How long a new executor may take to say it is ready."""
EXECUTOR_CLOSE_S = 15.0
"""The most closing an executor takes (_ExecutorProcess.close): its two uids' kill sweeps (5 s each at
most) and its cgroup's removal (2 s), with a margin."""
EXECUTOR_REPLY_S = 30.0
"""What the pool allows an executor beyond its job's own running time (the launcher's cleanup, the
verdict's trip) before it takes the executor for lost."""
SERVICE_SLACK_S = 10.0
"""Added to a batch's bound (submit_batch) for the service's own work: its tick, the reply's trip."""
SILENT_PINGS = 5
"""A batch whose client said it pings every ping_s (wire.VerifyBatch) and has sent nothing for this
many ping_s, plus a second, has been given up: it is dropped (VerifierService.tick)."""


def executor_wait_s(job: dict) -> float:
    """How long the pool waits for an executor's verdict on a checked job before it takes the executor
    for lost: every case's longest run (Limits.longest_s: an assert job's boundary allowance at its
    cap) plus EXECUTOR_REPLY_S."""
    longest = Limits(timeout_s=job.get("timeout_s", Limits.timeout_s)).longest_s(job["kind"])
    return longest * (len(job.get("cases", ())) or 1) + EXECUTOR_REPLY_S


def job_allowance_s(job: dict) -> float:
    """The longest the pool may take to answer a checked job once its turn has come. An executor's job:
    two tries (a lost executor's job is retried once), each an executor wait and the executor's
    replacement (closed, a new one started). A math or reward job (scorers.Scorer): its time limit and a
    grading process's start."""
    if job["kind"] in scorers.SCORED_KINDS:
        return job.get("timeout_s", Limits.timeout_s) + scorers.GRADER_START_S
    return 2 * (executor_wait_s(job) + EXECUTOR_CLOSE_S + EXECUTOR_START_S)


def list_bound_s(ahead_s: float, batch_s: list[float], lanes: int) -> float:
    """The latest the last of a batch's jobs ends, from now, on `lanes` workers taking jobs first in,
    first out: each job starts once the work queued or running ahead of it (at most ahead_s, and the
    batch's own before it) leaves no worker idle, so by (ahead_s + sum(batch_s)) / lanes, and runs at
    most its own allowance."""
    return (ahead_s + sum(batch_s)) / lanes + max(batch_s) if batch_s else 0.0


class ExecutorDied(RuntimeError):
    """The executor process ended or stopped answering."""


class _ExecutorProcess:
    """Parent-side handle on one executor process."""

    def __init__(self, isolation: str, hide: list[str], use_cgroup: bool = True, image: str | None = None):
        cfg = json.dumps({"isolation": isolation, "hide": hide, "use_cgroup": use_cgroup, "image": image})
        command = [sys.executable, "-E", "-s", EXECUTOR_SCRIPT, "--executor", cfg]
        # A minimal environment: the verifier's own (its secrets included) never enters an
        # executor's memory, so no program can find it there.
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
                                     env=EXECUTOR_ENV)
        try:
            hello = from_bytes(self._read(EXECUTOR_START_S))
            if type(hello) is dict and "refused" in hello:
                raise IsolationUnavailable(str(hello["refused"]))
            if type(hello) is not dict or type(hello.get("ready")) is not dict:
                raise ExecutorDied(f"executor {self.proc.pid} sent a malformed hello")
        except BaseException:
            self.close()
            raise
        self.report = hello["ready"]

    def _read(self, timeout_s: float) -> bytes:
        try:
            fd = self.proc.stdout.fileno()
        except ValueError:
            raise ExecutorDied(f"executor {self.proc.pid} is closed") from None
        ready, _, _ = select.select([fd], [], [], timeout_s)
        if not ready:
            raise ExecutorDied(f"executor {self.proc.pid} did not answer within {timeout_s:.0f}s")
        raw = recv_frame(fd)
        if raw is None:
            raise ExecutorDied(f"executor {self.proc.pid} exited (status {self.proc.poll()})")
        return raw

    def run(self, job: dict) -> tuple[Verdict, bool]:
        """(verdict, retire): retire = the executor exits after this job (an infra failure)."""
        try:
            send_frame(self.proc.stdin.fileno(), to_plain(job, None))
        except (OSError, ValueError) as e:  # ValueError: the pipe was already closed
            raise ExecutorDied(f"executor {self.proc.pid}: {e}") from None
        reply = from_bytes(self._read(executor_wait_s(job)))
        if type(reply) is not dict or type(reply.get("retire")) is not bool:
            raise BoundaryError(f"executor {self.proc.pid} sent a malformed reply")
        return verdict_from_dict(reply.get("verdict")), reply["retire"]

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
            cand, judge, reaper = role_uids(self.proc.pid)
            for uid in (cand, judge):
                try:
                    kill_uid(uid, reaper)
                except SandboxBreach as e:  # logged; the uid is never reused while we run
                    print(f"verifier: {e}", file=sys.stderr, flush=True)
            remove_cgroup(self.proc.pid)


class ExecutorPool:
    """N executor processes fed from one queue by N threads. A dead executor, or one that failed for
    reasons of its own (an infra_error it retires after), is replaced and its job retried once on
    the fresh one, so killing an executor loses no request; a job whose executor is lost twice (or
    cannot be started) gets infra_error, and the pool goes on serving. submit_batch says by when a
    batch's verdicts are all in (its client's deadline); cancel drops the jobs of a batch whose client
    gave up, so they hold no executor that a later batch waits for."""

    def __init__(self, executors: int = 2, isolation: str = "namespaces", hide: list[str] | None = None,
                 use_cgroup: bool = True, reward: str = "", packages: tuple[str, ...] = rootfs.DEFAULT_PACKAGES):
        """Raises IsolationUnavailable if `isolation` cannot be had (nothing falls back).
        use_cgroup=False: no cgroup (as on a machine without one): a kill sweep after every
        execution, and memory limited per process only. For tests and the benchmark.
        packages: the third-party modules a program may import (namespaces: rootfs.py's image)."""
        if isolation not in ISOLATION_MODES:
            raise ValueError(f"isolation must be {'|'.join(ISOLATION_MODES)}, got {isolation!r}")
        if os.geteuid() == 0:
            remove_stale_cgroups()  # of executors whose verifier was killed before closing
        self.isolation, self.hide = isolation, (hide or []) + default_hidden_paths()
        self.use_cgroup = use_cgroup
        self.image = None
        if isolation == "namespaces":  # every file a program can read, in memory (rootfs.py)
            try:
                self.image = rootfs.acquire(tuple(packages))
            except (rootfs.ImageError, OSError) as e:
                raise refuse(f"the sandbox's in-memory file image could not be built: {e}") from None
        self.image_path = self.image.path if self.image else None
        self.scorer = scorers.Scorer(reward, workers=executors)  # math and reward jobs (REWARD=file.py:fn)
        self.jobs: queue.Queue = queue.Queue()
        self.slots: list[_ExecutorProcess] = []
        try:
            for _ in range(executors):
                self.slots.append(_ExecutorProcess(isolation, self.hide, use_cgroup, self.image_path))
        except BaseException:
            for s in self.slots:
                s.close()
            self.scorer.close()
            if self.image:
                rootfs.release(self.image)
            raise
        self.report = dict(self.slots[0].report)
        if self.image:
            self.report["files"] = self.image.describe()
        self.restarts = 0
        self.lock = threading.RLock()  # the fields below, and a future's result against its cancel
        self.backlog_s = self.scored_backlog_s = 0.0  # allowances of the jobs queued or running, per lane
        self.running: list = [None] * executors  # the future of the job each executor runs now
        self.stopped: set[int] = set()  # executors cancel() killed under their job
        self.threads = [threading.Thread(target=self._work, args=(i,), daemon=True, name=f"executor-{i}")
                        for i in range(executors)]
        for t in self.threads:
            t.start()

    def weak_isolation_warning(self, what: str) -> str | None:
        """The log line owed for every batch served with weaker isolation than namespaces."""
        r = self.report
        if r["mode"] == "namespaces":
            return None
        return (f"verifier: WARNING: {what} with --isolation {r['mode']}: network {r['network']}; "
                f"files {r['filesystem']}; uid {r['uid']}")

    def _restart(self, i: int) -> str:
        """Replace executor i; returns "" or why it could not be started (then its dead handle stays:
        the next job finds it dead and tries again)."""
        self.slots[i].close()
        self.restarts += 1
        try:
            self.slots[i] = _ExecutorProcess(self.isolation, self.hide, self.use_cgroup, self.image_path)
            return ""
        except Exception as e:  # noqa: BLE001 - refused, died, malformed: all the same here
            why = f"could not start executor {i}: {type(e).__name__}: {e}"
            print(f"verifier: {why}", file=sys.stderr, flush=True)
            return why

    def _run_job(self, i: int, job: dict, future: concurrent.futures.Future) -> Verdict | None:
        """A job is retried once on a fresh executor when its executor was lost or failed for
        reasons of its own (infra_error and retire: a launcher, judge or sandbox that broke); an
        infra_error the job itself explains (tests that do not compile) is not retried. None: the
        job was cancelled (cancel), and the executor cancel killed under it is replaced."""
        lost = []
        for attempt in range(2):
            with self.lock:
                if future.cancelled():
                    return None
                self.running[i] = future
            error = None
            try:
                verdict, retire = self.slots[i].run(job)
            except (ExecutorDied, BoundaryError, TypeError, KeyError) as e:
                error = str(e) or type(e).__name__
            finally:
                with self.lock:
                    self.running[i] = None
                    stopped = i in self.stopped
                    self.stopped.discard(i)
            if stopped:
                self._restart(i)
                return None
            if error is not None:
                lost.append(error)
                if why := self._restart(i):
                    lost.append(why)
                continue
            if retire:  # it exits after this reply: start its successor now
                if why := self._restart(i):
                    lost.append(why)
                if verdict.status == INFRA_ERROR and attempt == 0:
                    lost.append(verdict.detail)
                    continue
            return verdict
        return make_verdict(INFRA_ERROR, "verifier error: executor lost twice running this job: "
                        + "; ".join(lost))

    def _work(self, i: int) -> None:
        while (item := self.jobs.get()) is not None:
            job, future, allowance = item
            try:
                verdict = self._run_job(i, job, future)
            except Exception as e:  # noqa: BLE001 - a bug here must not stop this thread
                verdict = make_verdict(INFRA_ERROR, f"verifier error: {type(e).__name__}: {e}")
            with self.lock:
                self.backlog_s -= allowance
                if verdict is not None and not future.cancelled():
                    future.set_result(verdict)

    def submit(self, job: dict) -> concurrent.futures.Future:
        """A Future of the job's Verdict (a bad job's, a too large program's: set at once)."""
        return self._submit(job)[0]

    def _submit(self, job) -> tuple[concurrent.futures.Future, str, float]:
        """(future, lane, allowance): lane "executor" or "scorer" where the job waits its turn, counted in
        that lane's backlog at its job_allowance_s; "" and 0 for a verdict decided here."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            job = check_job(job)
        except ValueError as e:
            future.set_result(make_verdict(INFRA_ERROR, f"bad job: {e}"))
            return future, "", 0.0
        allowance = job_allowance_s(job)
        if job["kind"] in scorers.SCORED_KINDS:  # math answers and reward functions: scorers.py
            with self.lock:
                self.scored_backlog_s += allowance
            return self._scored(self.scorer.submit(job), allowance), "scorer", allowance
        if (verdict := program_verdict(job)) is not None:
            future.set_result(verdict)
            return future, "", 0.0
        with self.lock:
            self.backlog_s += allowance
        self.jobs.put((job, future, allowance))
        return future, "executor", allowance

    def _scored(self, scoring: concurrent.futures.Future, allowance: float) -> concurrent.futures.Future:
        """The Verdict future of a scorers.Scorer job (a dict future); a scorer that failed: infra_error.
        Cancelling it cancels the scoring if that has not started."""
        out: concurrent.futures.Future = concurrent.futures.Future()

        def done(f):
            try:
                verdict = verdict_from_dict(f.result())
            except concurrent.futures.CancelledError:
                verdict = None
            except Exception as e:  # noqa: BLE001 - the scorer's failure, not the completion's
                verdict = make_verdict(INFRA_ERROR, f"scorer failed: {type(e).__name__}: {e}")
            with self.lock:
                self.scored_backlog_s -= allowance
                if verdict is not None and not out.cancelled():
                    out.set_result(verdict)
        out.add_done_callback(lambda o: o.cancelled() and scoring.cancel())
        scoring.add_done_callback(done)
        return out

    def submit_batch(self, jobs: list) -> tuple[list[concurrent.futures.Future], float]:
        """Queue a batch: (a Future per job, the time.monotonic() by which every verdict is in). The bound
        holds whatever the programs do: each job ahead of the batch (queued or running) and each of
        its own counts at its job_allowance_s, each lane (the executors; the scorer's threads) takes
        its jobs first in, first out (list_bound_s), and SERVICE_SLACK_S is added. A job that runs
        long uses up its own allowance, never its neighbours'."""
        with self.lock:  # nothing is queued between reading the backlog and queueing the batch
            now, ahead = time.monotonic(), {"executor": self.backlog_s, "scorer": self.scored_backlog_s}
            futures, own = [], {"executor": [], "scorer": []}
            for job in jobs:
                future, lane, allowance = self._submit(job)
                futures.append(future)
                if lane:
                    own[lane].append(allowance)
        scorer_lanes = getattr(self.scorer.pool, "_max_workers", 1)  # a ThreadPoolExecutor's threads
        bound = max(list_bound_s(ahead["executor"], own["executor"], len(self.slots)),
                    list_bound_s(ahead["scorer"], own["scorer"], scorer_lanes))
        return futures, now + bound + SERVICE_SLACK_S

    def cancel(self, futures: list) -> int:
        """Drop jobs whose verdicts no one will read (their client gave up): their futures are cancelled,
        a job still queued is never run, a running one has its executor killed (its thread starts a
        fresh one at once); a math or reward job being scored ends at its own time limit. Returns how
        many jobs were dropped."""
        with self.lock:
            n = sum(f.cancel() for f in futures)
            for i, f in enumerate(self.running):
                if f is not None and f.cancelled() and i not in self.stopped:
                    self.stopped.add(i)
                    self.slots[i].proc.kill()
        return n

    def run(self, jobs: list[dict]) -> list[Verdict]:
        verdicts = [f.result() for f in [self.submit(j) for j in jobs]]
        if warning := self.weak_isolation_warning(f"{len(verdicts)} verdicts served"):
            print(warning, file=sys.stderr, flush=True)
        return verdicts

    def executor_pids(self) -> list[int]:
        return [s.proc.pid for s in self.slots]

    def close(self) -> None:
        for _ in self.threads:
            self.jobs.put(None)
        for t in self.threads:
            t.join(timeout=60)
        for s in self.slots:
            s.close()
        self.scorer.close()
        if self.image:
            rootfs.release(self.image)
            self.image = None


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


# ============================================================================ service


@dataclasses.dataclass
class _Batch:
    """A VerifyBatch being served."""
    peer: tuple      # (connection identity, request id): where its verdicts go
    futures: list    # a Verdict future per job
    deadline: float  # time.monotonic() by which every verdict is in (ExecutorPool.submit_batch)
    ping_s: float    # the client pings this often while it waits (0: it did not say)
    heard: float     # time.monotonic() of the connection's last message
    seals: list      # per job: (the row it scores, the job) to seal its verdict with (attest.seal), or None

    def of(self, peer) -> bool:
        """Whether `peer` (a later message's) is this batch's connection."""
        return bytes(peer[0]) == bytes(self.peer[0])


class VerifierService:
    """wire.Server + ExecutorPool: each VerifyBatch is queued at once and answered (deferred) from
    the serving thread's tick when its last verdict is in, so batches never block the loop. A Pong
    tells the pinging connection how long each of its batches may still take (its client's deadline:
    ExecutorPool.submit_batch). A batch its client gave up on is dropped (ExecutorPool.cancel): at its
    CancelBatch, or once the connection stops pinging (SILENT_PINGS), as when the client died."""

    def __init__(self, cfg: VerifierConfig):
        import wire
        self.wire, self.cfg = wire, cfg
        self.pool = ExecutorPool(cfg.executors, cfg.isolation, [h for h in cfg.hide.split(",") if h],
                                 reward=cfg.reward, packages=tuple(p for p in cfg.packages.split(",") if p))
        self.server = wire.Server("verifier", cfg.bind, max_message_bytes=4 * cfg.max_request_mb << 20)
        self.server.on(wire.VerifyBatch, self.on_batch)
        self.server.on(wire.Ping, self.on_ping)
        self.server.on(wire.CancelBatch, self.on_cancel)
        self.pending: list[_Batch] = []
        self.batches = 0
        self.key = attest.read_key(cfg.verdict_key) if cfg.verdict_key else None

    def on_batch(self, msg, peer):
        jobs = msg.jobs
        if len(jobs) > self.cfg.max_jobs:
            raise ValueError(f"{len(jobs)} jobs in one batch, at most {self.cfg.max_jobs}")
        size = sum(len(str(j)) for j in jobs)
        if size > self.cfg.max_request_mb << 20:
            raise ValueError(f"batch of {size} chars exceeds {self.cfg.max_request_mb} MiB")
        # The row each job scores, as its sender names it ("seal"): its verdict is sealed for that row
        seals = [(j["seal"], j) if self.key and isinstance(j, dict) and isinstance(j.get("seal"), str) else None
                 for j in jobs]
        self.pending.append(_Batch(peer, *self.pool.submit_batch(jobs), msg.ping_s, time.monotonic(), seals))
        self.batches += 1
        return None

    def on_ping(self, msg, peer):
        """Pong; info["batches"]: request id (as text) -> seconds it may still take, for each batch of
        the pinging connection not yet answered (wire.VerifyBatch)."""
        now, batches = time.monotonic(), {}
        for b in self.pending:
            if b.of(peer):
                b.heard = now
                batches[str(b.peer[1])] = round(max(0.0, b.deadline - now), 3)
        return self.wire.Pong(self.server.name, self.server.instance, info={"batches": batches})

    def on_cancel(self, msg, peer):
        """Drop the batch the client gave up on: Ok(info={"cancelled": jobs dropped}), or an Error when
        this connection has no such batch (answered already, or never sent)."""
        for batch in self.pending:
            if batch.of(peer) and batch.peer[1] == msg.request:
                self.pending.remove(batch)
                return self.wire.Ok(info={"cancelled": self._drop(batch, "cancelled by its client")})
        raise ValueError(f"no batch {msg.request} of this connection is being served")

    def _drop(self, batch: _Batch, why: str) -> int:
        """Cancel a batch no one waits for (ExecutorPool.cancel) and say so; returns the jobs dropped."""
        cancelled = self.pool.cancel(batch.futures)
        print(f"verifier: batch {batch.peer[1]} {why}: {cancelled} of {len(batch.futures)} jobs dropped", flush=True)
        return cancelled

    def tick(self) -> None:
        still, now = [], time.monotonic()
        for batch in self.pending:
            if all(f.done() for f in batch.futures):
                verdicts = [dataclasses.asdict(f.result()) for f in batch.futures]
                for v, sealing in zip(verdicts, batch.seals):
                    if sealing:
                        v["mac"] = attest.seal(self.key, sealing[0], sealing[1], v["reward"], v["status"])
                if warning := self.pool.weak_isolation_warning(f"{len(verdicts)} verdicts served"):
                    print(warning, file=sys.stderr, flush=True)  # logged before the client has them
                self.server.reply(batch.peer, self.wire.Verdicts(verdicts=verdicts))
            elif batch.ping_s and now - batch.heard > SILENT_PINGS * batch.ping_s + 1.0:
                self._drop(batch, f"given up: its client has sent nothing for {now - batch.heard:.1f}s")
            else:
                still.append(batch)
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
    try:
        return VerifierConfig(**vars(parser.parse_args(argv)))
    except ValueError as e:
        parser.error(str(e))


if __name__ == "__main__":
    cfg = _parse_args()
    try:
        service = VerifierService(cfg)
    except IsolationUnavailable as e:
        print(f"verifier: refusing to start: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    print(f"verifier: serving {cfg.bind} with {cfg.executors} executors, isolation "
          f"{service.pool.report['mode']} ({service.pool.report['network']})", flush=True)
    if warning := service.pool.weak_isolation_warning("every verdict will be served"):
        print(warning, file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        service.serve()
    except KeyboardInterrupt:
        pass
    finally:
        service.close()
