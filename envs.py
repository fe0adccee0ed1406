"""envs.py: what a task is, besides code. A dataset row becomes a prompt; a completion gets a score.

Three kinds of task share the roles (the trainer makes work items, a worker samples and asks the
verifier role for verdicts, the verdict's reward is what GRPO sees):

  kind       a row                                        scored by
  ---------  -------------------------------------------  ------------------------------------------
  code       HumanEval / MBPP / asserts / stdin-stdout    the sandbox runs the program (sandbox.py)
             (tasks.py reads them)
  math       GSM8K: question + answer ending "#### 42";   math_verdict: the final answer extracted
             MATH: problem + solution with \\boxed{...}    (boxed, "####", or the last number, in that
                                                          order) and compared as a number
  reward     any row with a "prompt" (text) or            your function, REWARD=file.py:function:
             "messages" (a chat list), any other fields   function(completion: str, row: dict) -> float

MORE THAN ONE TURN (`run_episodes`, trainer --env python_tool): the model may write a ```python block; the
sandbox runs it and its output comes back as the next user message, tokenized once with loss mask 0;
the model's own tokens stay exactly as sampled (token in, token out); the last turn is scored.

A completion's verdict is {passed, reward, status, detail, fraction}, as the sandbox's. Statuses of
these kinds: "passed" (math: the right answer in the requested format), "lenient" (the right answer,
found only by a looser extraction: the metrics report strict and lenient accuracy apart, since a gain
in format alone looks like a gain in accuracy), "failed", and REWARD_ERROR: the reward function raised,
returned something that is not a finite number, or ran past its time limit. REWARD_ERROR is, like
the sandbox's infra_error, never a silent 0: the group is not trained on (lifecycle.infra_failures)
and it is counted (verifier/infra_error_frac).

The verifier role scores math and reward jobs (Scorer); a reward function runs in a child process
started for each call (by a fork server), killed at its time limit, so a function that hangs or
crashes costs one verdict.

Run the tests:  python -m pytest -q tests/test_envs.py
"""
from __future__ import annotations

import concurrent.futures
import fractions
import importlib.util
import json
import math
import os
import re

REWARD_ERROR = "reward_error"
MATH_FORMATS = ("boxed", "hash")  # MATH's \boxed{...}; GSM8K's "#### answer"


# ----------------------------------------------------------------------------- math answers

def _boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}), braces balanced; None if there is none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i:j - 1].strip() if depth == 0 else None


def _after_hash(text: str) -> str | None:
    """What follows the last "####" up to the end of its line; None if there is none."""
    at = text.rfind("####")
    if at < 0:
        return None
    line = text[at + 4:].strip().split("\n")[0].strip()
    return line or None


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")


def _last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def parse_number(text: str | None) -> fractions.Fraction | None:
    """A final answer as an exact number, or None: integers, decimals, fractions (a/b, \\frac{a}{b},
    \\dfrac), thousands separators (1,234), a leading $ or trailing %, surrounding $...$ or text such as
    "x = 5"; a number alone, nothing else around it but units-free punctuation."""
    if text is None:
        return None
    s = text.strip().strip("$").strip()
    s = re.sub(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", s)
    s = re.sub(r"^[A-Za-z]\w*\s*=\s*", "", s)          # "x = 5"
    s = s.replace("\\!", "").replace("{,}", ",").replace("\\%", "%").rstrip(".").strip()
    s = s.rstrip("%").strip().lstrip("$").strip()
    m = re.fullmatch(r"\(?\s*(-?[\d,]*\.?\d+)\s*\)?(?:\s*/\s*\(?\s*(-?[\d,]*\.?\d+)\s*\)?)?", s)
    if not m:
        return None
    num, den = m.group(1), m.group(2)
    try:
        for part in (num, den):
            if part and "," in part and not re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", part):
                return None  # "1,2" is a list, not a number
        value = fractions.Fraction(num.replace(",", ""))
        if den is not None:
            d = fractions.Fraction(den.replace(",", ""))
            if d == 0:
                return None
            value /= d
        return value
    except (ValueError, ZeroDivisionError):
        return None


def extract_answer(text: str) -> tuple[str | None, str]:
    """(the final answer, how it was found): boxed, then "####", then the last number in the text."""
    for how, find in (("boxed", _boxed), ("hash", _after_hash), ("last_number", _last_number)):
        if (found := find(text)) is not None:
            return found, how
    return None, "none"


def math_verdict(completion: str, answer: str, fmt: str) -> dict:
    """The verdict on a math completion against the reference final answer. Strict: the answer in the
    requested format (fmt "boxed" or "hash") is right; lenient: the first answer extract_answer finds
    is right. reward = 1 for strict, else 0 (a policy is rewarded for answering as asked)."""
    if fmt not in MATH_FORMATS:
        raise ValueError(f"math answer format must be one of {MATH_FORMATS}, got {fmt!r}")
    want = parse_number(answer)
    if want is None:
        raise ValueError(f"the reference answer {answer!r} is not a number")
    requested = (_boxed if fmt == "boxed" else _after_hash)(completion)
    if requested is not None and parse_number(requested) == want:
        return _v("passed", 1.0, f"{fmt}: {requested[:80]}")
    found, how = extract_answer(completion)
    if found is not None and parse_number(found) == want:
        return _v("lenient", 0.0, f"right answer found by {how}, not in the {fmt} format")
    return _v("failed", 0.0, f"{how}: {str(found)[:80]}" if found is not None else "no answer found")


def _v(status: str, reward: float, detail: str) -> dict:
    return {"passed": status == "passed", "reward": float(reward), "status": status, "detail": detail[:500],
            "fraction": 1.0 if status == "passed" else 0.0}


def math_reference(rec: dict) -> tuple[str, str, str] | None:
    """(question, final answer, format) of a GSM8K- or MATH-style row; None if it is neither."""
    if isinstance(rec.get("question"), str) and isinstance(rec.get("answer"), str) and "####" in rec["answer"]:
        return rec["question"], _after_hash(rec["answer"]) or "", "hash"
    if isinstance(rec.get("problem"), str) and isinstance(rec.get("solution"), str):
        boxed = _boxed(rec["solution"])
        if boxed is not None:
            return rec["problem"], boxed, "boxed"
    return None


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


def _reward_child(spec: str, completion: str, row: dict, conn) -> None:
    """In the child: load the function, call it, send {"reward": x} or {"error": why}."""
    try:
        value = load_reward(spec)(completion, row)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            out = {"error": f"returned {type(value).__name__}, not a number"}
        elif not math.isfinite(value):
            out = {"error": f"returned {value!r}, not a finite number"}
        else:
            out = {"reward": float(value)}
    except BaseException as e:  # noqa: BLE001 - whatever it raised is the verdict's detail
        out = {"error": f"raised {type(e).__name__}: {str(e)[:300]}"}
    conn.send(out)


_CONTEXT = None


def call_reward(spec: str, completion: str, row: dict, timeout_s: float) -> dict:
    """The reward function `spec` called as function(completion, row) in a fresh child process (from a
    fork server: safe beside the verifier's threads), with a wall-clock limit. The verdict: reward =
    what it returned (status passed when >= 1, else failed), or REWARD_ERROR when it raised, returned a
    bool, a non-number or a non-finite number, or ran past timeout_s (then it is killed)."""
    import multiprocessing
    global _CONTEXT
    _CONTEXT = _CONTEXT or multiprocessing.get_context("forkserver")
    parent, child = _CONTEXT.Pipe(duplex=False)
    proc = _CONTEXT.Process(target=_reward_child, args=(spec, completion, row, child), daemon=True)
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


class Scorer:
    """Scores math and reward jobs for the verifier role, `workers` at a time: submit(job) -> a Future
    of the verdict dict. reward_spec: the REWARD function (None: reward jobs get REWARD_ERROR)."""

    def __init__(self, reward_spec: str = "", workers: int = 2):
        if reward_spec:
            load_reward(reward_spec)  # refuse to start with a reward that does not load
        self.spec = reward_spec
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="scorer")

    def score(self, job: dict) -> dict:
        if job["kind"] == "math":
            return math_verdict(job["completion"], job["answer"], job["format"])
        if not self.spec:
            return _v(REWARD_ERROR, 0.0, "this verifier has no reward function (verifier.py --reward)")
        return call_reward(self.spec, job["completion"], json.loads(job["row"]), job.get("timeout_s", 5.0))

    def submit(self, job: dict) -> concurrent.futures.Future:
        return self.pool.submit(self.score, job)

    def close(self) -> None:
        self.pool.shutdown(wait=False)


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


def observation(output: str) -> str:
    """The user message that carries a tool's output back to the model."""
    output = output if len(output) <= OBSERVATION_CHARS else output[:OBSERVATION_CHARS] + "\n[... cut]"
    return f"Output:\n{output}" if output.strip() else "Output: (nothing printed)"


class Episode:
    """One row of a multi-turn rollout, token in, token out: `tokens` are the prompt, then each model
    turn exactly as sampled and each observation tokenized once; `mask` is 1 on the model's tokens only
    (the loss and the bitwise metric count those), `logp` the log-prob each model token was sampled
    with (0 elsewhere). final_text: the last model turn's text, which the task's reward scores."""

    def __init__(self, prompt: list):
        self.tokens, self.mask, self.logp = list(prompt), [0.0] * len(prompt), [0.0] * len(prompt)
        self.turns, self.tool_calls, self.final_text, self.finished, self.done = 0, 0, "", False, False


def run_episodes(prompts_ids: list, *, max_turns: int, seq_len: int, max_new_tokens: int, sample_turn,
                 run_code, observe, decode, eos_id: int) -> list:
    """The python tool's episodes for a batch of rows. Each turn, every row still going samples one model
    turn (sample_turn(row indices, token lists, budgets, turn) -> [(tokens, logps)], the sampler); a row whose turn
    ended with eos_id and holds a ```python block, with turns left and room for an observation and at
    least one more token, has the code run (run_code(programs) -> outputs, the sandbox) and the
    observation's tokens appended (observe(output) -> token ids: the chat template's text between the
    turns, tokenized once); any other row is done, its last turn the one the reward scores."""
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
            e.finished = bool(toks) and toks[-1] == eos_id
            e.final_text = decode(toks[:-1] if e.finished else toks)
        calls = []
        for e in live:
            code = tool_code(e.final_text) if e.finished and turn + 1 < max_turns else None
            if code is None:
                e.done = True
            else:
                calls.append((e, code))
        for (e, _), output in zip(calls, run_code([code for _, code in calls]) if calls else []):
            obs = [int(t) for t in observe(observation(output))]
            if len(e.tokens) + len(obs) + 1 >= seq_len:  # no room to answer: the episode ends here
                e.done = True
                continue
            e.tool_calls += 1
            e.tokens += obs
            e.mask += [0.0] * len(obs)
            e.logp += [0.0] * len(obs)
    return eps
