"""What every side of the verifier agrees on: a job's limits, the verdict record and its status names.

Defined once here and imported by every process that makes or reads a verdict: the executor
(executor.py) and the judge (judge.py), the verifier role (verifier.py) and its scorers (scorers.py), the
worker, curate and the trainer (through lifecycle.py). Plain data, trusted by no one: every side that
receives a verdict checks it (verdict_from_dict). Standard library only, so any process can import it,
the sandboxed ones included. Verdict's docstring is the list of statuses.
"""

import dataclasses
import math


ROUND_TRIP_ALLOWANCE_S = 250e-6
"""What one request across the candidate/judge boundary may cost on top of the program's own work, so
that a test one process runs in a second is not a timeout here because it calls the program 300,000
times: a call's round trip measured 80-150 us (2026-12-04, this 2-core VM, idle to loaded; bench/
bench_verifier.py's micro "per call of the candidate"), and machines differ by up to 2x."""
BOUNDARY_EXTENSION = 10
"""An assert job's deadline grows by at most this many times its timeout (ROUND_TRIP_ALLOWANCE_S)."""


@dataclasses.dataclass
class Limits:
    """Per-execution limits; every field can be overridden per job (verify(..., memory_mb=256))."""
    timeout_s: float = 5.0
    """Wall-clock limit of one execution (one io case); CPU limit is ceil(timeout_s). An assert job's
    limit is the program's time, not the boundary's: each request the tests make of the program
    (a call, an attribute, a batch of items) adds ROUND_TRIP_ALLOWANCE_S to its deadline, up to
    BOUNDARY_EXTENSION times timeout_s (longest_s)."""
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

    def longest_s(self, kind: str) -> float:
        """The longest one execution of this kind may run: an assert job with its boundary allowance
        at its cap, an io case its timeout."""
        return self.timeout_s * (1 + BOUNDARY_EXTENSION) if kind == "assert" else self.timeout_s

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
"""The verifier failed (executor died, sandbox did not start, no answer), not the program. Every other
status is the program's doing and scores as the verifier says. A group holding one says nothing about
the policy, so it is never trained on (its advantages would compare a broken sandbox with real answers)."""
REWARD_ERROR = "reward_error"
"""The reward function (REWARD=file.py:function, scorers.py) raised, returned no finite number or ran past
its time limit: the verifier's failure to score a completion, counted with INFRA_ERROR (the group is
never trained on, and a run whose rewards keep failing stops)."""
PROGRAM_STATUSES = ("passed", "failed", "syntax_error", "runtime_error", "timeout", "memory",
                    "crashed", "output_limit", "too_large")
SCORE_STATUSES = ("lenient", REWARD_ERROR)  # math and reward-function verdicts (scorers.py)
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
    mac: str = ""  # the verifier's seal of this verdict (attest.py), "" when it holds no verdict key


def make_verdict(status: str, detail: str = "", fraction: float | None = None,
             reward: float | None = None) -> Verdict:
    assert status in STATUSES, status
    passed = status == "passed"
    fraction = (1.0 if passed else 0.0) if fraction is None else fraction
    reward = (1.0 if passed else 0.0) if reward is None else reward
    return Verdict(passed, float(reward), status, detail[:500], float(fraction))


class BoundaryError(TypeError):
    """A value that cannot cross the sandbox boundary (unsupported type, too deep, malformed)."""


def verdict_from_dict(d) -> Verdict:
    """A Verdict from its dict (an executor's frame, a wire reply); BoundaryError if malformed."""
    if type(d) is not dict or set(d) - {"mac"} != {f.name for f in dataclasses.fields(Verdict)} - {"mac"}:
        raise BoundaryError(f"malformed verdict {str(d)[:200]}")
    if d["status"] not in STATUSES or type(d.get("mac", "")) is not str or type(d["passed"]) is not bool or type(d["detail"]) is not str \
            or not all(type(d[k]) in (int, float) for k in ("reward", "fraction")):
        raise BoundaryError(f"malformed verdict {str(d)[:200]}")
    return Verdict(**d)


def check_batch(jobs: list, verdicts) -> None:
    """What a receiver checks of the verdicts a verifier sent for `jobs`: one per job, each well formed
    (verdict_from_dict), its reward finite and, but for a reward job (the user's function: any finite
    number), in [0, 1]. BoundaryError says what is wrong: the verifier is broken, not the programs."""
    if type(verdicts) is not list or len(verdicts) != len(jobs):
        n = len(verdicts) if type(verdicts) is list else type(verdicts).__name__
        raise BoundaryError(f"{n} verdicts for {len(jobs)} jobs")
    for job, d in zip(jobs, verdicts):
        v = verdict_from_dict(d)
        kind = job.get("kind") if isinstance(job, dict) else None
        if not math.isfinite(v.reward) or (kind != "reward" and not 0.0 <= v.reward <= 1.0):
            raise BoundaryError(f"reward {v.reward!r} out of range for a {kind} job")


LIMIT_KEYS = tuple(f.name for f in dataclasses.fields(Limits))
