"""scorers.py: the verifier role's scorers of completions that run no program: a math answer graded
against its reference, and a reward function of your own (REWARD=file.py:function) called on it.

  kind     a job holds                                   scored by
  -------  --------------------------------------------  -----------------------------------------------
  math     the completion, the reference answer and its   math_answers.math_verdict, in a grading process
           format ("hash": #### n, "boxed": \\boxed{n})   that math-verify is loaded in once
  reward   the completion and the dataset row (JSON)      function(completion: str, row: dict) -> float,
                                                         in a process started for the call

Each job runs in a child process killed at the job's time limit: a reward function in a process started
for each call (by a fork server), a math answer in a grading process that is replaced when killed. A
function that hangs or crashes, or an answer made to be slow to parse, costs one verdict, and the jobs
beside it wait for neither. A verdict is {passed, reward, status, detail, fraction}, as the sandbox's:
"passed", "lenient" (math: the right answer found only by a looser extraction), "failed", or
REWARD_ERROR (the reward function raised, returned something that is not a real number or not finite
as a float32, or ran past its time limit): like the sandbox's infra_error, never a silent 0.

verifier.py hands math and reward jobs to a Scorer; curate.py reads MathVerifyMissing from here. Math
needs the math extra: pip install -r requirements-math.txt.

Run the tests:  python -m pytest -q tests/test_envs.py
"""
from __future__ import annotations

import concurrent.futures
import decimal
import importlib.util
import json
import math
import numbers
import os
import queue
import resource
import threading

from math_answers import MathVerifyMissing, math_verdict  # curate.py reads scorers.MathVerifyMissing too
from math_answers import MATH_FORMATS, MAX_ANSWER_CHARS  # noqa: F401  (verifier.py reads them from here)
from verdicts import REWARD_ERROR


def _v(status: str, reward: float, detail: str) -> dict:
    return {"passed": status == "passed", "reward": float(reward), "status": status, "detail": detail[:500],
            "fraction": 1.0 if status == "passed" else 0.0}


# ----------------------------------------------------------------------------- a reward in a file

def load_reward(spec: str):
    """REWARD=path/to/file.py:function -> the function (imported once, in the process that calls it)."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not name.isidentifier():
        raise ValueError(f"a reward is given as path/to/file.py:function, got {spec!r}")
    if not os.path.isfile(path):
        raise ValueError(f"reward file {path!r} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"reward_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{path} has no function {name!r}")
    return fn


FLOAT32_MAX = 3.4028234663852886e38  # rewards travel as float32 (wire.Rollout.rewards_G)


def reward_value(value) -> float:
    """What a reward function returned, as a float: any real number is accepted (int, float, bool,
    Fraction, Decimal, numpy scalars and 0-d arrays of bool, int or float: np.float32(1.0),
    np.mean(...), np.bool_); ValueError saying why for anything else (a string, None, a complex, an
    array with elements) and for a value that is not finite as a float32 (NaN, inf, -1e39)."""
    dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
    if isinstance(value, (numbers.Real, decimal.Decimal)):
        pass
    elif getattr(dtype, "kind", None) in ("b", "i", "u", "f") and shape == ():  # numpy scalars, 0-d arrays
        pass
    else:
        what = type(value).__name__ + (f" of shape {tuple(shape)}" if isinstance(shape, tuple) else "")
        raise ValueError(f"returned {what}, not a real number")
    try:
        x = float(value)
    except (OverflowError, ValueError, TypeError):
        x = math.inf
    if not (math.isfinite(x) and abs(x) <= FLOAT32_MAX):
        raise ValueError(f"returned {str(value)[:80]}, not a finite float32 number")
    return x


def _reward_child(spec: str, completion: str, row: dict, conn) -> None:
    """In the child: load the function, call it, send {"reward": x} or {"error": why}. Its address
    space is capped as a grading process's is (GRADER_MEMORY_MB): a reward that needs more raises
    MemoryError, a reward_error, and never takes the verifier's host."""
    try:
        resource.setrlimit(resource.RLIMIT_AS, (GRADER_MEMORY_MB << 20, GRADER_MEMORY_MB << 20))
        out = {"reward": reward_value(load_reward(spec)(completion, row))}
    except BaseException as e:  # noqa: BLE001 - whatever it raised is the verdict's detail
        out = {"error": str(e) if type(e) is ValueError and str(e).startswith("returned ")
               else f"raised {type(e).__name__}: {str(e)[:300]}"}
    conn.send(out)


_CONTEXT = None


def _context():
    """The fork server that starts reward and grading processes (safe beside the verifier's threads);
    it imports scorers (the processes' code), math_answers and math-verify once, so a process it forks
    starts with them loaded."""
    global _CONTEXT
    if _CONTEXT is None:
        import multiprocessing
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["scorers", "math_answers", "math_verify"])  # one not installed is skipped
        _CONTEXT = ctx
    return _CONTEXT


def call_reward(spec: str, completion: str, row: dict, timeout_s: float) -> dict:
    """The reward function `spec` called as function(completion, row) in a fresh child process (from a
    fork server: safe beside the verifier's threads), with a wall-clock limit. The verdict: reward =
    what it returned as a float (reward_value; status passed when >= 1, else failed), or REWARD_ERROR
    when it raised, returned no real number or one not finite as a float32, or ran past timeout_s (then
    it is killed)."""
    ctx = _context()
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_reward_child, args=(spec, completion, row, child), daemon=True)
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout_s):
            return _v(REWARD_ERROR, 0.0, f"reward function ran past its {timeout_s:g} s limit")
        out = parent.recv()
    except (EOFError, OSError):
        return _v(REWARD_ERROR, 0.0, f"reward function's process died (exit code {proc.exitcode})")
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        parent.close()
    if "error" in out:
        return _v(REWARD_ERROR, 0.0, f"reward function {out['error']}")
    return _v("passed" if out["reward"] >= 1.0 else "failed", out["reward"], "")


# ----------------------------------------------------------------------------- the verifier's side

SCORED_KINDS = ("math", "reward")
GRADER_MEMORY_MB = 2048   # address-space limit of a grading process (a huge power must not take the host)
GRADER_JOBS = 500         # a grading process is replaced after this many answers (sympy's caches grow)
GRADER_START_S = 60.0     # the time a new grading process may take to load math-verify


def _grader_main(conn) -> None:
    """A grading process: math_verdict on each (completion, answer, format) received, until EOF. It
    grades one answer at a time and is killed by its parent when an answer runs past its time limit."""
    try:
        resource.setrlimit(resource.RLIMIT_AS, (GRADER_MEMORY_MB << 20, GRADER_MEMORY_MB << 20))
        math_verdict("\\boxed{\\frac12}", "0.5", "boxed")  # the first parse loads the LaTeX grammar
        conn.send({"ready": True})
    except BaseException as e:  # noqa: BLE001 - sent to the parent, which raises it
        conn.send({"error": f"{type(e).__name__}: {e}", "missing": isinstance(e, MathVerifyMissing)})
        return
    while True:
        try:
            completion, answer, fmt = conn.recv()
        except (EOFError, OSError):
            return
        try:
            out = {"verdict": math_verdict(completion, answer, fmt)}
        except ValueError as e:  # the reference does not read: the job's fault, not the completion's
            out = {"bad_reference": str(e)}
        except (MemoryError, RecursionError) as e:
            out = {"verdict": _v("failed", 0.0, f"reading the answer raised {type(e).__name__}")}
        conn.send(out)


class _Grader:
    """One grading process (_grader_main), forked by the fork server with math-verify loaded."""

    def __init__(self):
        ctx = _context()
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_grader_main, args=(child,), daemon=True, name="math-grader")
        self.proc.start()
        child.close()
        self.jobs = 0
        try:
            if not self.conn.poll(GRADER_START_S):
                raise RuntimeError(f"a math grading process did not start in {GRADER_START_S:g} s")
            hello = self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(5)
            hello = {"error": f"a math grading process died at start (exit code {self.proc.exitcode})"}
        except BaseException:
            self.kill()
            raise
        if "error" in hello:
            self.kill()
            raise (MathVerifyMissing if hello.get("missing") else RuntimeError)(hello["error"])

    def alive(self) -> bool:
        return self.proc.is_alive() and self.jobs < GRADER_JOBS

    def grade(self, completion: str, answer: str, fmt: str, timeout_s: float) -> dict:
        """math_verdict in this process, at most timeout_s: an answer that runs past it, or that kills
        the process, is the completion's failure (the process is killed and replaced)."""
        self.jobs += 1
        self.conn.send((completion, answer, fmt))
        try:
            if not self.conn.poll(timeout_s):
                self.kill()
                return _v("failed", 0.0, f"reading the answer ran past its {timeout_s:g} s limit")
            out = self.conn.recv()
        except (EOFError, OSError):
            self.kill()
            return _v("failed", 0.0, f"reading the answer ended its grading process (exit code {self.proc.exitcode})")
        if "bad_reference" in out:
            raise ValueError(out["bad_reference"])
        return out["verdict"]

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()
        self.conn.close()


class Scorer:
    """Scores math and reward jobs for the verifier role: submit(job) -> a Future of the verdict dict.
    reward_spec: the REWARD function (None: reward jobs get REWARD_ERROR). Every job runs in a child
    process (a reward function: one per call; a math answer: a grading process, reused), so the threads
    here only wait: there are 2 * workers of them (at least 4), and an answer that runs to its time
    limit holds one thread, never the jobs queued beside it."""

    def __init__(self, reward_spec: str = "", workers: int = 2):
        if reward_spec:
            load_reward(reward_spec)  # refuse to start with a reward that does not load
        self.spec = reward_spec
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(4, 2 * workers),
                                                          thread_name_prefix="scorer")
        self.idle: queue.SimpleQueue = queue.SimpleQueue()
        self.graders: set = set()
        self.lock = threading.Lock()

    def score(self, job: dict) -> dict:
        if job["kind"] == "math":
            return self.grade(job["completion"], job["answer"], job["format"], job.get("timeout_s", 5.0))
        if not self.spec:
            return _v(REWARD_ERROR, 0.0, "this verifier has no reward function (verifier.py --reward)")
        return call_reward(self.spec, job["completion"], json.loads(job["row"]), job.get("timeout_s", 5.0))

    def grade(self, completion: str, answer: str, fmt: str, timeout_s: float) -> dict:
        """math_verdict in an idle grading process (a new one if none is idle), killed at timeout_s."""
        grader = None
        while grader is None:
            try:
                grader = self.idle.get_nowait()
            except queue.Empty:
                grader = _Grader()
                with self.lock:
                    self.graders.add(grader)
            if not grader.alive():  # died while idle, or served its GRADER_JOBS: not this answer's doing
                self._drop(grader)
                grader = None
        try:
            return grader.grade(completion, answer, fmt, timeout_s)
        finally:
            if grader.alive():
                self.idle.put(grader)
            else:
                self._drop(grader)

    def _drop(self, grader: _Grader) -> None:
        grader.kill()
        with self.lock:
            self.graders.discard(grader)

    def submit(self, job: dict) -> concurrent.futures.Future:
        return self.pool.submit(self.score, job)

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        with self.lock:
            graders, self.graders = list(self.graders), set()
        for g in graders:
            g.kill()
