"""envs: what a task is, besides its dataset: how a problem becomes the prompt, what answers the model
between its turns, and which verifier job's verdict is the reward. One interface, `Env`, and one
registry, `ENVS`, that launch.sh (ENV=), the trainer (--env) and the wire (a work item's env) all read.

The names are reinforcement learning's, as Gym made them common: an *environment* is what the policy
acts in, an *episode* is one row's turns from the prompt to the last answer, a *step* is what the
environment does after one model turn, and what it says back is an *observation*.

  Env method                    called by                       returns
  ----------------------------  ------------------------------  ---------------------------------------
  prompt(problem, fmt, tmpl)    workitems.py (the trainer)      the text the model continues
  step(episodes, verify)        run_episodes (the worker)       per row: None (done) or an output to
                                                                show; verify(jobs) runs verifier jobs
  observation(output, chars)    run_episodes                    the user message carrying that output
  score_job(item, text)         score_jobs (worker, curate)     the verifier job whose verdict is the
                                                                reward of a row's final text

The base class is the single-turn task, the default (ENV empty, no registry entry): a problem's
prompt as prompts.py writes it, no second turn, and the dataset's own check as the reward:

  kind     a row                                          the job (scored in the verifier role)
  -------  ---------------------------------------------  ------------------------------------------
  assert   HumanEval / MBPP / plain asserts (tasks.py)    the program (prompts.assemble_program) and
  io       stdin/stdout cases                              its tests, run in the sandbox (executor.py)
  math     GSM8K, MATH, MATH-500 (a reference answer)     the completion and the answer (scorers.py)
  reward   a "prompt" or "messages" row, REWARD=f.py:fn   the completion and the row (scorers.py)

A registered environment is a subclass in a module of this package, named in ENVS by "module:Class"
(imported when first asked for, so reading the names imports no environment's code):

  python_tool  the model may write a ```python block; the sandbox runs it and what it printed comes
               back; the last turn is scored by the task's own job (envs/python_tool.py)
  fix_tests    the model writes the program; if it fails its tests, the failure comes back and the
               model gets one more turn to fix it; the final program is scored (envs/fix_tests.py)

The episode loop (run_episodes) is shared: token in, token out. The model's tokens stay exactly as
sampled, each observation is tokenized once (loss mask 0), and the last turn's text is scored once.
docs/environments.md walks through the interface and fix_tests.

Run the tests:  python -m pytest -q tests/test_envs.py tests/test_env_fix_tests.py
"""
from __future__ import annotations

import functools
import importlib

import prompts

# The registry: name -> "module:Class" in this package. The empty name is the single-turn default (Env).
ENVS = {
    "python_tool": "envs.python_tool:PythonTool",
    "fix_tests": "envs.fix_tests:FixTests",
}

OBSERVATION_CHARS = 400  # an output is cut to this many characters before it goes back to the model
OBSERVATION_TOKENS = 160  # what the trainer's row length (T) reserves for each observation


class Env:
    """The single-turn task, and the base of every environment. A subclass sets `name` (its key in
    ENVS) and `system` (the system message of its prompts), and overrides step (and observation, when
    its outputs read better in other words)."""
    name = ""
    system = ""

    def prompt(self, problem, fmt: str, template=None) -> str:
        """The text the model continues for a tasks.Problem (prompts.model_prompt), with this env's
        system message."""
        return prompts.model_prompt(problem, fmt, template, self.system)

    def step(self, episodes: list, verify) -> list:
        """After a model turn, for the rows whose turn ended at the end-of-turn token with turns left
        (Episode: .item, .final_text, .turns so far): per row, None when the episode is done, else the
        output the next user message carries (observation). verify(jobs) -> a verdicts.Verdict per job,
        run on the verifier fleet; call it once per step with every row's jobs, so they run side by side.
        The single-turn task: every row is done."""
        return [None] * len(episodes)

    def observation(self, output: str, chars: int = OBSERVATION_CHARS) -> str:
        """The user message that carries `output` back to the model (cut to `chars`)."""
        return observation(output, chars)

    def score_job(self, item, text: str) -> dict:
        """The verifier job whose verdict is the reward of `text`, a row's final turn (item: its
        wire.WorkItem). Code: the program prompts.assemble_program builds (as `python curate.py check`
        builds it from a reference solution) with the tests or cases; math and reward items: the
        completion itself, scored by scorers.py in the verifier role."""
        if item.kind == "math":
            return {"kind": "math", "completion": text, "answer": item.answer, "format": item.answer_format,
                    "timeout_s": item.timeout_s}
        if item.kind == "reward":
            return {"kind": "reward", "completion": text, "row": item.row, "timeout_s": item.timeout_s}
        program = prompts.assemble_program(item.prompt_format, item.program_prefix, text, tuple(item.stop))
        if item.kind == "io":
            return {"kind": "io", "program": program, "cases": item.cases, "timeout_s": item.timeout_s,
                    "partial_reward": item.partial_reward}
        # tasks.Problem.tests is self-contained (HumanEval's ends with check(entry_point))
        return {"kind": "assert", "program": program, "tests": item.tests, "timeout_s": item.timeout_s}


def score_jobs(items: list, texts: list) -> list:
    """One verifier job per completion, in row order (each item's group_size rows, item after item):
    the one its item's environment scores it by (Env.score_job). The worker and curate.py build the
    jobs a reward comes from only here."""
    jobs, r = [], 0
    for item in items:
        env = get(item.env)
        jobs += [env.score_job(item, texts[r + g]) for g in range(item.group_size)]
        r += item.group_size
    return jobs


@functools.lru_cache(maxsize=None)
def get(name: str) -> Env:
    """The environment registered as `name` ("" : the single-turn Env); ValueError naming the
    registered ones for any other name."""
    if name == "":
        return Env()
    if name not in ENVS:
        raise ValueError(f"unknown env {name!r}: expected one of {', '.join(ENVS)} (or '': one turn)")
    module, _, cls = ENVS[name].partition(":")
    return getattr(importlib.import_module(module), cls)()


# ----------------------------------------------------------------------------- observations

def observation(output: str, chars: int = OBSERVATION_CHARS) -> str:
    """The user message that carries a tool's output back to the model (the output cut to `chars`)."""
    output = output if len(output) <= chars else output[:chars] + "\n[... cut]"
    return f"Output:\n{output}" if output.strip() else "Output: (nothing printed)"


def observation_tokens(output: str, observe, budget: int = OBSERVATION_TOKENS, render=observation) -> list:
    """The tokens of the observation of `output` (render(output, chars) -> the message, an Env's
    observation; observe(message) -> the template's text between two turns around that message,
    tokenized), at most `budget` of them when the output can be cut to fit: the output is cut to
    OBSERVATION_CHARS, then to the longest prefix whose tokens fit (a tokenizer that splits digits
    spends a token per character). The trainer reserves `budget` tokens per observation in a row."""
    ids = [int(t) for t in observe(render(output, OBSERVATION_CHARS))]
    if len(ids) <= budget:
        return ids
    fits = lambda n: [int(t) for t in observe(render(output, n))]
    lo, hi = 0, min(len(output), OBSERVATION_CHARS)  # the longest prefix that fits, by bisection
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if len(fits(mid)) <= budget else (lo, mid - 1)
    return fits(lo)


# ----------------------------------------------------------------------------- the episode loop

class Episode:
    """One row of a multi-turn rollout, token in, token out: `tokens` are the prompt, then each model
    turn exactly as sampled and each observation tokenized once; `mask` is 1 on the model's tokens only
    (the loss and the bitwise metric count those), `logp` the log-prob each model token was sampled
    with (0 elsewhere). final_text: the last model turn's text, which the env's score_job scores.
    item: the row's work item; tool_calls: the observations the env appended."""

    def __init__(self, prompt: list, item=None):
        self.tokens, self.mask, self.logp = list(prompt), [0.0] * len(prompt), [0.0] * len(prompt)
        self.turns, self.tool_calls, self.final_text, self.finished, self.done = 0, 0, "", False, False
        self.turn_ended = False  # the last turn ended with the end-of-turn token (the env may answer)
        self.item = item


def run_episodes(env: Env, prompts_ids: list, *, items: list, max_turns: int, seq_len: int, max_new_tokens: int,
                 sample_turn, verify, observe, decode, eos_id: int, stop_ids=()) -> list:
    """The episodes of a batch of rows (items[r]: row r's work item) in environment `env`. Each turn,
    every row still going samples one model turn (sample_turn(row indices, token lists, budgets, turn)
    -> [(tokens, logps)], the sampler); the rows whose turn ended with eos_id (the template's end-of-turn
    token) with turns left go to env.step(episodes, verify) together; a row it answers, with room for
    the observation and at least one more token, gets the observation's tokens appended
    (observation_tokens: observe(message) -> token ids, the chat template's text between the turns,
    tokenized once, within OBSERVATION_TOKENS); any other row is done, its last turn the one that is
    scored. A turn that ended with one of `stop_ids` (the checkpoint's other eos ids: the end of a
    document, not of a turn) is finished but goes to no step."""
    ends = {int(eos_id), *map(int, stop_ids)}
    eps = [Episode(p, item) for p, item in zip(prompts_ids, items)]
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
        asked = [e for e in live if e.turn_ended and turn + 1 < max_turns]
        for e in live:
            e.done = not (e.turn_ended and turn + 1 < max_turns)
        for e, output in zip(asked, env.step(asked, verify) if asked else []):
            if output is None:
                e.done = True
                continue
            obs = observation_tokens(output, observe, render=env.observation)
            if len(e.tokens) + len(obs) + 1 >= seq_len:  # no room to answer: the episode ends here
                e.done = True
                continue
            e.tool_calls += 1
            e.tokens += obs
            e.mask += [0.0] * len(obs)
            e.logp += [0.0] * len(obs)
    return eps


# ----------------------------------------------------------------------------- the trainer's metrics

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
