"""envs.py: what a task is, besides code. A dataset row becomes a prompt; a completion gets a score.

Three kinds of task share the roles (the trainer makes work items, a worker samples and asks the
verifier role for verdicts, the verdict's reward is what GRPO sees):

  kind       a row                                        scored by
  ---------  -------------------------------------------  ------------------------------------------
  code       HumanEval / MBPP / asserts / stdin-stdout    the sandbox runs the program (sandbox.py)
             (tasks.py reads them)
  math       GSM8K: question + answer ending "#### 42";   math_answers.py: the final answer after any
             MATH: problem + solution with \\boxed{...};   </think> (boxed, "####", or the last number,
             MATH-500: problem + answer                   in that order), read as its dataset writes it
  reward     any row with a "prompt" (text) or            your function, REWARD=file.py:function:
             "messages" (a chat list), any other fields   function(completion: str, row: dict) -> float

MORE THAN ONE TURN (`run_episodes`, trainer --env python_tool): the model may write a ```python block; the
sandbox runs it and its output comes back as the next user message, tokenized once with loss mask 0;
the model's own tokens stay exactly as sampled (token in, token out); the last turn is scored.

A completion's verdict is {passed, reward, status, detail, fraction}, as the sandbox's. Statuses of
these kinds: "passed" (math: the right answer in the requested format), "lenient" (the right answer,
found only by a looser extraction: the metrics report strict and lenient accuracy apart, since a gain
in format alone looks like a gain in accuracy), "failed" (a wrong answer, none, one longer than
math_answers.MAX_ANSWER_CHARS, or one whose reading runs past the job's time limit), and REWARD_ERROR:
the reward function raised, returned something that is not a real number or not finite as a float32,
or ran past its time limit. REWARD_ERROR is, like the sandbox's infra_error, never a silent 0: the
group is not trained on (lifecycle.infra_failures) and it is counted (verifier/infra_error_frac).

The verifier role scores math and reward jobs (Scorer), each in a child process killed at the job's
time limit: a reward function in a process started for each call (by a fork server), a math answer
(math_answers.math_verdict) in a grading process that math-verify is loaded in once and that is
replaced when killed. A function that hangs or crashes, or an answer made to be slow to parse, costs
one verdict, and the jobs beside it wait for neither. Math needs the math extra: pip install -r
requirements-math.txt.

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

from math_answers import MathVerifyMissing, math_verdict  # curate.py reads envs.MathVerifyMissing too
from math_answers import MATH_FORMATS, MAX_ANSWER_CHARS  # noqa: F401  (verifier.py reads them from envs)
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
    it imports envs (the processes' code), math_answers and math-verify once, so a process it forks
    starts with them loaded."""
    global _CONTEXT
    if _CONTEXT is None:
        import multiprocessing
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["envs", "math_answers", "math_verify"])  # one not installed is skipped
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


def batch_metrics(env_stats: list, statuses: list, math_task: bool) -> dict:
    """A step's task metrics: env/turns_mean and env/tool_calls_mean over the rows of multi-turn
    episodes (env_stats: each rollout's {"turns": [G], "tool_calls": [G]}, {} for one turn), and for a
    math task math/strict_acc (the answer in the format asked for: the reward) and math/lenient_acc
    (a right answer found anywhere) over the verdict statuses."""
    out = {}
    if any(env_stats):
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
        out.update({f"env/{k}_mean": float(mean([x for s in env_stats for x in s.get(k, [])]))
                    for k in ("turns", "tool_calls")})
    if math_task and statuses:
        out.update({"math/strict_acc": sum(s == "passed" for s in statuses) / len(statuses),
                    "math/lenient_acc": sum(s in ("passed", "lenient") for s in statuses) / len(statuses)})
    return out


# ----------------------------------------------------------------------------- more than one turn

ENVS = ("python_tool",)
TOOL_SYSTEM = ("You can run Python. To run code, write one ```python code block; what it prints comes back to "
               "you in the next message. When you know the answer, give it without a code block.")
OBSERVATION_CHARS = 400  # a tool's output is cut to this many characters before it goes back to the model
OBSERVATION_TOKENS = 160  # what the trainer's row length (T) reserves for each observation


def tool_code(turn_text: str) -> str | None:
    """The program a model turn asks to run (the python tool): its last ```python block, or None."""
    blocks = [content for label, content in _python_blocks(turn_text)]
    return blocks[-1] if blocks else None


def _python_blocks(text: str):
    import prompts
    return [(label, content) for label, content in prompts._blocks(text) if label in prompts._PYTHON_LABELS]


def observation(output: str, chars: int = OBSERVATION_CHARS) -> str:
    """The user message that carries a tool's output back to the model (the output cut to `chars`)."""
    output = output if len(output) <= chars else output[:chars] + "\n[... cut]"
    return f"Output:\n{output}" if output.strip() else "Output: (nothing printed)"


def observation_tokens(output: str, observe, budget: int = OBSERVATION_TOKENS) -> list:
    """The tokens of the observation of `output` (observe(message) -> the template's text between two
    turns around that message, tokenized), at most `budget` of them when the output can be cut to fit:
    the output is cut to OBSERVATION_CHARS, then to the longest prefix whose tokens fit (a tokenizer
    that splits digits spends a token per character). The trainer reserves `budget` tokens per
    observation in a row's length."""
    ids = [int(t) for t in observe(observation(output))]
    if len(ids) <= budget:
        return ids
    fits = lambda n: [int(t) for t in observe(observation(output, chars=n))]
    lo, hi = 0, min(len(output), OBSERVATION_CHARS)  # the longest prefix that fits, by bisection
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if len(fits(mid)) <= budget else (lo, mid - 1)
    return fits(lo)


class Episode:
    """One row of a multi-turn rollout, token in, token out: `tokens` are the prompt, then each model
    turn exactly as sampled and each observation tokenized once; `mask` is 1 on the model's tokens only
    (the loss and the bitwise metric count those), `logp` the log-prob each model token was sampled
    with (0 elsewhere). final_text: the last model turn's text, which the task's reward scores."""

    def __init__(self, prompt: list):
        self.tokens, self.mask, self.logp = list(prompt), [0.0] * len(prompt), [0.0] * len(prompt)
        self.turns, self.tool_calls, self.final_text, self.finished, self.done = 0, 0, "", False, False
        self.turn_ended = False  # the last turn ended with the end-of-turn token (a tool may be called)


def run_episodes(prompts_ids: list, *, max_turns: int, seq_len: int, max_new_tokens: int, sample_turn,
                 run_code, observe, decode, eos_id: int, stop_ids=()) -> list:
    """The python tool's episodes for a batch of rows. Each turn, every row still going samples one model
    turn (sample_turn(row indices, token lists, budgets, turn) -> [(tokens, logps)], the sampler); a row whose turn
    ended with eos_id (the template's end-of-turn token) and holds a ```python block, with turns left
    and room for an observation and at least one more token, has the code run (run_code(programs) ->
    outputs, the sandbox) and the observation's tokens appended (observation_tokens: observe(message)
    -> token ids, the chat template's text between the turns, tokenized once, within
    OBSERVATION_TOKENS); any other row is done, its last turn the one the reward scores. A turn that
    ended with one of `stop_ids` (the checkpoint's other eos ids: the end of a document, not of a turn)
    is finished but calls no tool."""
    ends = {int(eos_id), *map(int, stop_ids)}
    eps = [Episode(p) for p in prompts_ids]
    for turn in range(max_turns):
        index = [i for i, e in enumerate(eps) if not e.done]
        live = [eps[i] for i in index]
        if not live:
            break
        budgets = [min(max_new_tokens, seq_len - len(e.tokens)) for e in live]
        for e, (toks, logps) in zip(live, sample_turn(index, [list(e.tokens) for e in live], budgets, turn)):
            toks = [int(t) for t in toks]
            e.tokens += toks
            e.mask += [1.0] * len(toks)
            e.logp += [float(x) for x in logps]
            e.turns += 1
            e.finished = bool(toks) and toks[-1] in ends
            e.final_text = decode(toks[:-1] if e.finished else toks)
            e.turn_ended = bool(toks) and toks[-1] == eos_id
        calls = []
        for e in live:
            code = tool_code(e.final_text) if e.turn_ended and turn + 1 < max_turns else None
            if code is None:
                e.done = True
            else:
                calls.append((e, code))
        for (e, _), output in zip(calls, run_code([code for _, code in calls]) if calls else []):
            obs = observation_tokens(output, observe)
            if len(e.tokens) + len(obs) + 1 >= seq_len:  # no room to answer: the episode ends here
                e.done = True
                continue
            e.tool_calls += 1
            e.tokens += obs
            e.mask += [0.0] * len(obs)
            e.logp += [0.0] * len(obs)
    return eps
