"""Tasks besides code (scorers.py, math_answers.py): math answers and a reward function in a file, from the
dataset row to the verifier's verdict; and the environments' shared episode loop with the python tool
(envs/, envs/python_tool.py).

Run: python -m pytest -q tests/test_envs.py       (about 40 s on a 2-core CPU)
"""
import contextlib
import decimal
import fractions
import io
import json
import re
import sys
import time

import numpy as np
import pytest

import curate
import envs
import envs.python_tool
import lifecycle
import math_answers
import prompts
import scorers
import tasks
import verifier
import wire
from verdicts import INFRA_ERROR, make_verdict



# Answers as models and datasets write them: GSM8K's "#### n" lines (its first training row's own
# solution among them), MATH's and MATH-500's LaTeX (\frac12, \$, \text{ cm}, ^\circ), typeset minus signs.
RIGHT = [
    ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether "
     "in April and May.\n#### 72", "72", "hash"),
    ("She sells 9 eggs at $2 each, 9 * 2 = 18.\n#### 18 dollars", "18", "hash"),
    ("#### $18.90", "18.90", "hash"),
    ("So the total is 1200 + 34 = 1234.\n#### 1,234", "1234", "hash"),
    ("#### 1234.0", "1,234", "hash"),
    ("The temperature falls to \u22127 degrees.\n#### \u22127", "-7", "hash"),
    ("The slope is $\\frac{-3}{6} = \\boxed{-\\frac{1}{2}}$.", "-\\frac{1}{2}", "boxed"),
    ("The slope is $\\boxed{\u2212\\frac{1}{2}}$.", "-\\frac{1}{2}", "boxed"),
    ("In all she pays $\\boxed{\\$18.90}$.", "\\$18.90", "boxed"),
    ("In all she pays $\\boxed{\\$18.90}$.", "18.9", "boxed"),
    ("The side has length $\\boxed{5\\text{ cm}}$.", "5", "boxed"),
    ("Each angle of the square is $\\boxed{90^\\circ}$.", "90", "boxed"),
    ("The probability is $\\boxed{\\frac12}$.", "\\frac{1}{2}", "boxed"),
    ("Thus $r = 3$ and $\\theta = \\frac{\\pi}{2}$, so $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$.",
     "\\left( 3, \\frac{\\pi}{2} \\right)", "boxed"),
    ("The solutions are $x \\le 3$, so $\\boxed{(-\\infty, 3]}$.", "(-\\infty,3]", "boxed"),
    ("So $\\sqrt{12} = \\boxed{2\\sqrt{3}}$.", "2\\sqrt{3}", "boxed"),
    ("The answer is $\\boxed{\\text{(C)}}$.", "\\text{(C)}", "boxed"),
]


@pytest.mark.parametrize("completion, answer, fmt", RIGHT)
def test_right_answers_as_the_field_writes_them_score_1(completion, answer, fmt):
    v = math_answers.math_verdict(completion, answer, fmt)
    assert (v["status"], v["reward"], v["passed"]) == ("passed", 1.0, True), v


WRONG = [
    ("Natalia sold 48 + 48 = 96 clips.\n#### 96", "72", "hash"),
    ("#### 180", "18", "hash"),
    ("#### 1,2", "12", "hash"),                                    # a list (or 1.2), never 12
    ("#### 7", "-7", "hash"),
    ("The slope is $\\boxed{\\frac{1}{2}}$.", "-\\frac{1}{2}", "boxed"),
    ("The probability is $\\boxed{\\frac13}$.", "\\frac{1}{2}", "boxed"),
    ("$\\boxed{0.5001}$", "\\frac{1}{2}", "boxed"),
    ("$\\boxed{45^\\circ}$", "90", "boxed"),
    ("$\\boxed{(-\\infty, 3)}$", "(-\\infty,3]", "boxed"),
    ("$\\boxed{\\text{(B)}}$", "\\text{(C)}", "boxed"),
    ("$\\boxed{3.4641}$", "2\\sqrt{3}", "boxed"),
    ("$\\boxed{7, 8}$", "7", "boxed"),                             # a hedge is right for neither
    ("$\\boxed{7, 8}$", "8", "boxed"),
    ("I could not solve it.", "5", "hash"),
]


@pytest.mark.parametrize("completion, answer, fmt", WRONG)
def test_wrong_answers_score_0(completion, answer, fmt):
    v = math_answers.math_verdict(completion, answer, fmt)
    assert (v["status"], v["reward"], v["passed"]) == ("failed", 0.0, False), v


@pytest.mark.parametrize("text, want", [
    ("so x = 3 and \\boxed{\\frac{1}{2}} is it. #### 9", ("\\frac{1}{2}", "boxed")),   # boxed first
    ("\\boxed{a{b}c} and then \\boxed{7}", ("7", "boxed")),                          # the last box
    ("work... #### 1,000\nthanks", ("1,000", "hash")),
    ("3 apples and 4 pears: 7 in all.", ("7", "last_number")),
    ("The answer is 42, done.", ("42", "last_number")),                               # not "42,"
    ("It costs 1,234.50 in all", ("1,234.50", "last_number")),
    ("it fell to \u22127", ("\u22127", "last_number")),
    ("no number here", (None, "none")),
    ("\\boxed{12", ("12", "last_number")),                                             # unbalanced box
])
def test_extract_answer_in_order(text, want):
    assert math_answers.extract_answer(text) == want


@pytest.mark.parametrize("completion, answer, fmt, status, reward", [
    ("3 + 4 = 7\n#### 7", "7", "hash", "passed", 1.0),
    ("The answer is 7.", "7", "hash", "lenient", 0.0),              # right, not as asked
    ("The answer is 42, done.", "42", "hash", "lenient", 0.0),
    ("\\boxed{7}", "7", "hash", "lenient", 0.0),
    ("#### 7", "7", "boxed", "lenient", 0.0),
    ("0.5", "\\frac{1}{2}", "boxed", "lenient", 0.0),
    ("#### 8\nThe answer is 7.", "7", "hash", "failed", 0.0),       # the requested answer is what counts
    ("The answer is 41, done.", "42", "hash", "failed", 0.0),
    ("", "3", "boxed", "failed", 0.0),
])
def test_math_verdict_strict_and_lenient(completion, answer, fmt, status, reward):
    v = math_answers.math_verdict(completion, answer, fmt)
    assert (v["status"], v["reward"], v["passed"]) == (status, reward, status == "passed")


def test_math_verdict_refuses_a_bad_reference():
    with pytest.raises(ValueError, match="empty"):
        math_answers.math_verdict("#### 3", " ", "hash")
    with pytest.raises(ValueError, match="longer than 400"):
        math_answers.math_verdict("#### 3", "3" * 401, "hash")
    with pytest.raises(ValueError, match="not read as math"):
        math_answers.math_verdict("#### 3", "three", "hash")
    with pytest.raises(ValueError, match="format"):
        math_answers.math_verdict("#### 3", "3", "latex")


def test_without_math_verify_a_math_dataset_is_refused_naming_the_extra(tmp_path, monkeypatch):
    """The math extra is optional: without it a math file stops the trainer at load with the file to
    install, and a code file loads as before."""
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import math_verify raises ImportError
    with pytest.raises(math_answers.MathVerifyMissing, match="pip install -r requirements-math.txt"):
        tasks.load_jsonl(write(tmp_path / "m.jsonl", GSM8K))
    code = {"prompt": "def f():\n", "test": "def check(c): pass", "entry_point": "f"}
    assert tasks.load_jsonl(write(tmp_path / "c.jsonl", [code]))[0].kind == "assert"
    out = io.StringIO()
    with contextlib.redirect_stderr(out):
        assert curate._check_main([write(tmp_path / "m.jsonl", GSM8K)]) == 2
    assert "requirements-math.txt" in out.getvalue()


REWARDS = '''
import time
def exact(completion, row):
    return float(row["score"])
def length(completion, row):
    return len(completion) / 100
def boom(completion, row):
    raise RuntimeError("the reward file has a bug")
def nan(completion, row):
    return float("nan")
def text(completion, row):
    return "1.0"
def huge(completion, row):
    return -1e39
def np_mean(completion, row):
    import numpy as np
    return np.mean([completion.count("a") > 0, True])
def np_float32(completion, row):
    import numpy as np
    return np.float32(1.0)
def np_vector(completion, row):
    import numpy as np
    return np.array([1.0])
def slow(completion, row):
    time.sleep(30)
def dies(completion, row):
    import os
    os._exit(3)
'''


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("rewards") / "rewards.py"
    path.write_text(REWARDS)
    return str(path)


def test_a_reward_function_is_called_with_the_completion_and_the_row(reward_file):
    v = scorers.call_reward(f"{reward_file}:exact", "anything", {"score": 0.25}, timeout_s=10)
    assert (v["status"], v["reward"]) == ("failed", 0.25)
    v = scorers.call_reward(f"{reward_file}:length", "x" * 150, {}, timeout_s=10)
    assert (v["status"], v["reward"]) == ("passed", 1.5)


@pytest.mark.parametrize("name, want", [("np_float32", 1.0), ("np_mean", 0.5)])
def test_a_reward_function_may_return_numpy_numbers(reward_file, name, want):
    v = scorers.call_reward(f"{reward_file}:{name}", "xyz", {}, timeout_s=10)
    assert v["reward"] == want and type(v["reward"]) is float and v["status"] != scorers.REWARD_ERROR, v


@pytest.mark.parametrize("value, want", [
    (1, 1.0), (0.25, 0.25), (True, 1.0), (False, 0.0), (fractions.Fraction(1, 4), 0.25), (decimal.Decimal("0.5"), 0.5),
    (np.float32(1.0), 1.0), (np.float64(0.5), 0.5), (np.mean([0.0, 1.0]), 0.5), (np.int64(3), 3.0),
    (np.bool_(True), 1.0), (np.array(0.75), 0.75), (np.array(2, dtype=np.int8), 2.0), (-3.4e38, -3.4e38),
])
def test_any_real_number_is_a_reward(value, want):
    got = scorers.reward_value(value)
    assert got == want and type(got) is float


@pytest.mark.parametrize("value, why", [
    ("1.0", "returned str, not a real number"), (None, "returned NoneType"), (1 + 0j, "returned complex"),
    (np.array([1.0]), "of shape (1,)"), (np.array("1"), "not a real number"), (float("inf"), "not a finite float32"),
    (float("nan"), "not a finite float32"), (-1e39, "not a finite float32"), (np.float64(4e38), "not a finite float32"),
    (fractions.Fraction(10 ** 400), "not a finite float32"), (decimal.Decimal("NaN"), "not a finite float32"),
])
def test_what_is_no_real_number_or_not_finite_in_float32_is_refused(value, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        scorers.reward_value(value)


@pytest.mark.parametrize("name, why", [
    ("boom", "raised RuntimeError: the reward file has a bug"), ("nan", "not a finite float32 number"),
    ("huge", "-1e+39, not a finite float32 number"), ("text", "returned str, not a real number"),
    ("np_vector", "returned ndarray of shape (1,), not a real number"),
    ("slow", "ran past its 1 s limit"), ("dies", "process died"),
])
def test_a_broken_reward_function_is_reported_never_scored_0(reward_file, name, why):
    """Each failure is REWARD_ERROR with its reason, which lifecycle counts with infra_error: the group
    is not trained on, and a run whose rewards keep failing stops."""
    v = scorers.call_reward(f"{reward_file}:{name}", "c", {}, timeout_s=1.0)
    assert v["status"] == scorers.REWARD_ERROR == lifecycle.REWARD_ERROR and why in v["detail"], v
    assert lifecycle.infra_failures(["passed", v["status"]]) == 1


@pytest.mark.parametrize("spec, why", [("nofile.py:f", "does not exist"), ("x.txt", "path/to/file.py:function"),
                                       ("{}:missing", "no function 'missing'")])
def test_a_reward_that_does_not_load_is_refused_at_start(reward_file, spec, why):
    with pytest.raises(ValueError, match=why):
        scorers.load_reward(spec.format(reward_file))
    with pytest.raises(ValueError, match=why):
        verifier.VerifierConfig(reward=spec.format(reward_file))


def test_the_verifier_scores_math_and_reward_jobs_and_refuses_malformed_ones(reward_file):
    pool = verifier.ExecutorPool(1, "rlimits", use_cgroup=False, reward=f"{reward_file}:exact")
    try:
        verdicts = pool.run([
            {"kind": "math", "completion": "#### 12", "answer": "12", "format": "hash"},
            {"kind": "math", "completion": "12", "answer": "12", "format": "hash"},
            {"kind": "reward", "completion": "c", "row": json.dumps({"score": 0.5})},
            {"kind": "reward", "completion": "c", "row": json.dumps({})},                 # KeyError in it
            {"kind": "reward", "completion": "c", "row": "[1, 2]"},                        # not an object
            {"kind": "math", "completion": "1", "answer": "", "format": "hash"},
            {"kind": "math", "completion": "1", "answer": "1" * 401, "format": "hash"},
            {"kind": "math", "completion": 5, "answer": "5", "format": "hash"},
            {"kind": "math", "completion": "#### 1", "answer": "many", "format": "hash"},     # reads as nothing
            {"kind": "assert", "program": "x = 1\n", "tests": "assert x == 1\n"},         # code still works
        ])
    finally:
        pool.close()
    assert [v.status for v in verdicts] == ["passed", "lenient", "failed", "reward_error", "infra_error",
                                            "infra_error", "infra_error", "infra_error", "infra_error", "passed"]
    assert verdicts[2].reward == 0.5 and "KeyError" in verdicts[3].detail and "bad job" in verdicts[4].detail
    assert "not read as math" in verdicts[8].detail


# A final answer made to be slow to read: the old number pattern backtracked cubically on the spaces
# around a slash (9 s at 1,000 characters, minutes at 3,000); nested parentheses take math-verify's
# LaTeX grammar seconds at 80 characters.
CRAFTED = "1" + " " * 1500 + "/" + " " * 1500 + "x"
NESTED = "(" * 60 + "1" + ")" * 60


def test_a_crafted_long_answer_is_refused_at_once_as_the_completions_failure():
    """About 3,000 characters in \\boxed{} or after ####: failed (never infra_error) in under a second,
    through the verifier as the service runs it (its grading process already started)."""
    pool = verifier.ExecutorPool(1, "rlimits", use_cgroup=False)
    try:
        assert pool.run([{"kind": "math", "completion": "#### 5", "answer": "5", "format": "hash"}])[0].passed
        for completion, fmt in (("\\boxed{%s}" % CRAFTED, "boxed"), ("#### " + CRAFTED, "hash")):
            t0 = time.monotonic()
            v = pool.submit({"kind": "math", "completion": completion, "answer": "1", "format": fmt}).result(timeout=30)
            assert time.monotonic() - t0 < 1.0 and v.status == "failed" and "longer than" in v.detail, v
    finally:
        pool.close()


def test_an_answer_slow_to_read_fails_at_the_time_limit_and_holds_up_no_honest_job():
    """Two answers that take math-verify many seconds are killed at their job's time limit (the
    completion's failure); honest jobs submitted after them in the same batch are scored meanwhile."""
    pool = verifier.ExecutorPool(1, "rlimits", use_cgroup=False)
    try:
        pool.run([{"kind": "math", "completion": "#### 5", "answer": "5", "format": "hash"}])  # one process up
        t0 = time.monotonic()
        slow = [pool.submit({"kind": "math", "completion": "\\boxed{%s}" % NESTED, "answer": "1", "format": "boxed",
                             "timeout_s": 6.0}) for _ in range(2)]
        honest = [pool.submit({"kind": "math", "completion": f"so #### {n}", "answer": str(n), "format": "hash"})
                  for n in range(4)]
        assert all(f.result(timeout=30).passed for f in honest)
        honest_s = time.monotonic() - t0
        verdicts = [f.result(timeout=30) for f in slow]
        slow_s = time.monotonic() - t0
    finally:
        pool.close()
    assert [(v.status, "ran past its 6 s limit" in v.detail) for v in verdicts] == [("failed", True)] * 2
    assert honest_s < 5.0 and 6.0 <= slow_s < 15, (honest_s, slow_s)


# ----------------------------------------------------------------------------- rows to problems

GSM8K = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
         {"question": "A book costs $1,200 and a pen $34. Total?", "answer": "1200 + 34 = 1234\n#### 1,234"}]
MATH = [{"problem": "What is half of 3?", "solution": "Half of 3 is $\\boxed{\\frac{3}{2}}$.", "level": "Level 1"},
        {"problem": "What is the slope of the line $2y = -x + 3$?",
         "solution": "Solving for $y$ gives $y = -\\frac{1}{2}x + \\frac{3}{2}$, so the slope is "
                     "$\\boxed{-\\frac{1}{2}}$.",
         "level": "Level 2", "type": "Algebra"}]
# MATH-500 as published: the final answer in `answer`, the worked solution beside it, a unique_id
MATH500 = [{"problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.  Enter your answer "
                       "in the form $(r,\\theta),$ where $r > 0$ and $0 \\le \\theta < 2 \\pi.$",
            "solution": "We have that $r = \\sqrt{0^2 + 3^2} = 3.$  Also, the point is on the positive $y$-axis, so "
                        "$\\theta = \\frac{\\pi}{2}.$  Therefore the polar coordinates are "
                        "$\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
            "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus", "level": 2,
            "unique_id": "test/precalculus/807.json"},
           {"problem": "Evaluate $-\\frac{3}{6}$.", "answer": "-\\frac{1}{2}", "unique_id": "test/algebra/1.json"}]


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_gsm8k_math_and_math500_rows_become_math_problems(tmp_path):
    """Rows as the three datasets publish them; a MATH reference of -\\frac{1}{2} loads."""
    probs = tasks.load_jsonl(write(tmp_path / "m.jsonl", GSM8K + MATH + MATH500))
    assert [(p.kind, p.answer, p.answer_format) for p in probs] == [
        ("math", "7", "hash"), ("math", "1,234", "hash"), ("math", "\\frac{3}{2}", "boxed"),
        ("math", "-\\frac{1}{2}", "boxed"), ("math", "\\left( 3, \\frac{\\pi}{2} \\right)", "boxed"),
        ("math", "-\\frac{1}{2}", "boxed")]
    assert [p.item_id for p in probs[4:]] == ["test/precalculus/807.json", "test/algebra/1.json"]
    assert probs[4].solutions == (MATH500[0]["solution"],) and probs[5].solutions == ()
    user = prompts.user_message(probs[2])
    assert "What is half of 3?" in user and "\\boxed{}" in user
    assert prompts.model_prompt(probs[0], "completion").startswith("Question: Tom has 3")
    assert "####" in prompts.model_prompt(probs[0], "completion")


def test_bad_math_rows_are_reported_by_line(tmp_path):
    path = write(tmp_path / "bad.jsonl", [GSM8K[0], {"question": "q", "answer": "no marker"},
                                          {"question": "q", "answer": "#### many"}])
    _, errors = tasks.scan_jsonl(path)
    assert len(errors) == 2 and ":2: " in errors[0] and "#### <number>" in errors[0] and ":3: " in errors[1], errors


def test_tasks_check_scores_each_math_reference_against_its_own_answer(tmp_path):
    """`python curate.py check` on math: every reference solution parses and scores 1 (strict)."""
    out = io.StringIO()
    path = write(tmp_path / "m.jsonl", GSM8K + MATH + MATH500)
    make_pool = lambda: verifier.ExecutorPool(1, "rlimits", use_cgroup=False)
    assert curate.check_dataset(path, make_pool, out=out) == 0
    assert out.getvalue().strip().endswith("checked 6 problems: 5 reference solutions pass, 0 fail, 0 bad lines")
    bad = write(tmp_path / "w.jsonl", GSM8K + [{"question": "q", "answer": "#### many"}])
    out = io.StringIO()
    assert curate.check_dataset(bad, make_pool, out=out) == 1  # an answer that is not a number: a bad line
    assert "w.jsonl:3: " in out.getvalue() and "2 reference solutions pass, 0 fail, 1 bad lines" in out.getvalue()


def test_rows_for_a_reward_function(tmp_path):
    rows = [{"id": "a", "prompt": "Say hi.", "score": 1}, {"id": "b", "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count to 3."}], "score": 0}]
    path = write(tmp_path / "r.jsonl", rows + [{"id": "c", "text": "no prompt"}, {"id": "d", "messages": []}])
    numbered, errors = tasks.scan_jsonl(path, reward=True)
    probs = [p for _, p in numbered]
    assert [p.item_id for p in probs] == ["a", "b"] and all(p.kind == "reward" for p in probs)
    assert [json.loads(p.row) for p in probs] == rows               # the row as read reaches the function
    assert json.loads(probs[1].messages)[0] == {"role": "system", "content": "Be brief."}
    assert len(errors) == 2 and "needs 'prompt'" in errors[0] and "'messages'" in errors[1], errors


def test_work_items_carry_the_scoring_fields_only_when_they_have_them():
    item = wire.WorkItem(item_id="i", prompt="p", group_size=2, seq_len=64, max_new_tokens=8, min_version=0)
    assert not {"answer", "answer_format", "row"} & set(item.to_dict())   # a code item travels as before
    m = wire.WorkItem(item_id="i", prompt="p", group_size=2, seq_len=64, max_new_tokens=8, min_version=0,
                      kind="math", answer="7", answer_format="hash")
    assert wire.WorkItem.from_dict(m.to_dict()) == m
    with pytest.raises(wire.WireError, match="kind"):
        wire.WorkItem.from_dict({**m.to_dict(), "kind": "poem"})


def test_worker_jobs_for_math_and_reward_items():
    m = wire.WorkItem(item_id="m", prompt="p", group_size=1, seq_len=64, max_new_tokens=8, min_version=0,
                      kind="math", answer="7", answer_format="hash", timeout_s=3.0)
    r = wire.WorkItem(item_id="r", prompt="p", group_size=2, seq_len=64, max_new_tokens=8, min_version=0,
                      kind="reward", row='{"score": 1}')
    jobs = envs.score_jobs([m, r], ["#### 7", "a", "b"])
    assert jobs == [{"kind": "math", "completion": "#### 7", "answer": "7", "format": "hash", "timeout_s": 3.0},
                    {"kind": "reward", "completion": "a", "row": '{"score": 1}', "timeout_s": 5.0},
                    {"kind": "reward", "completion": "b", "row": '{"score": 1}', "timeout_s": 5.0}]
    assert all(verifier.check_job(j) for j in jobs)


# ----------------------------------------------------------------------------- more than one turn

EOS = 0


def scripted(turns: dict):
    """A scripted policy: row r's turn t is turns[(r, t)] (token ids, eos included or not), each token
    with log-prob -(its id)/100; it records what it was shown."""
    shown = []

    def sample_turn(index, seqs, budgets, turn):
        out = []
        for r, seq, budget in zip(index, seqs, budgets):
            shown.append((r, turn, list(seq), budget))
            toks = turns[(r, turn)][:budget]
            out.append((toks, [-t / 100 for t in toks]))
        return out
    return sample_turn, shown


def text_of(ids):  # a toy tokenizer: one character per token id (id = ord, eos = 0)
    return "".join(chr(i) for i in ids)


def ids_of(text):
    return [ord(c) for c in text]


TOOL = envs.get("python_tool")
ITEM = wire.WorkItem(item_id="m", prompt="Q?", group_size=1, seq_len=200, max_new_tokens=40, min_version=0,
                     env="python_tool", max_turns=3)


def printing(output: str, ran=None):
    """A verifier stand-in: every job it is handed (recorded in `ran`) prints `output`."""
    def verify(jobs):
        (ran if ran is not None else []).extend(jobs)
        return [make_verdict("passed", output) for _ in jobs]
    return verify


def test_a_two_turn_episode_reaches_the_trainer_token_for_token():
    """Row 0 calls the tool, reads its output, answers; row 1 answers at once. The tokens are the prompt,
    the model's turns exactly as sampled and the observation tokenized once; mask 1 only on the model's
    tokens; the log-probs the tokens were sampled with; one final text per row (scored once)."""
    call = ids_of("```python\nprint(2+3)\n```") + [EOS]
    answer = ids_of("#### 5") + [EOS]
    sample_turn, shown = scripted({(0, 0): call, (0, 1): answer, (1, 0): ids_of("#### 4") + [EOS]})
    ran = []
    observe = lambda text: ids_of(f"<user>{text}<assistant>")
    prompt = ids_of("Q?")
    eps = envs.run_episodes(TOOL, [prompt, prompt], items=[ITEM] * 2, max_turns=3, seq_len=200, max_new_tokens=40,
                            sample_turn=sample_turn, verify=printing("5\n", ran), observe=observe, decode=text_of,
                            eos_id=EOS)
    obs = observe(envs.observation("5\n"))
    assert ran == [{"kind": "run", "program": "print(2+3)\n", "timeout_s": 5.0}]
    assert eps[0].tokens == prompt + call + obs + answer
    assert eps[0].mask == [0.0] * 2 + [1.0] * len(call) + [0.0] * len(obs) + [1.0] * len(answer)
    assert eps[0].logp == [0.0] * 2 + [-t / 100 for t in call] + [0.0] * len(obs) + [-t / 100 for t in answer]
    assert (eps[0].turns, eps[0].tool_calls, eps[0].final_text, eps[0].finished) == (2, 1, "#### 5", True)
    assert (eps[1].turns, eps[1].tool_calls, eps[1].final_text) == (1, 0, "#### 4")
    # the second turn was sampled after the observation, from exactly these tokens
    assert shown[-1] == (0, 1, prompt + call + obs, 40)
    # scored once: one job per row, on its last turn
    item = wire.WorkItem(item_id="m", prompt="Q?", group_size=2, seq_len=200, max_new_tokens=40, min_version=0,
                         kind="math", answer="5", answer_format="hash", env="python_tool", max_turns=3)
    jobs = envs.score_jobs([item], [e.final_text for e in eps])
    assert [math_answers.math_verdict(j["completion"], "5", "hash")["status"] for j in jobs] == ["passed", "failed"]


def test_episodes_end_at_the_turn_limit_the_budget_or_the_row_length():
    call = ids_of("```python\nprint(1)\n```") + [EOS]
    turns = {(0, t): call for t in range(5)}
    turns.update({(1, 0): ids_of("```python\nx\n```")})        # cut by its budget (no eos): no tool call
    sample_turn, _ = scripted(turns)
    observe = lambda text: ids_of(text)
    eps = envs.run_episodes(TOOL, [[1], [1]], items=[ITEM] * 2, max_turns=3, seq_len=10_000, max_new_tokens=40,
                            sample_turn=sample_turn, verify=printing("1"), observe=observe, decode=text_of, eos_id=EOS)
    assert (eps[0].turns, eps[0].tool_calls) == (3, 2)        # the last allowed turn's call is not run
    assert (eps[1].turns, eps[1].tool_calls, eps[1].finished) == (1, 0, False)
    short = envs.run_episodes(TOOL, [[1]], items=[ITEM], max_turns=3, seq_len=len(call) + 8, max_new_tokens=40,
                              sample_turn=sample_turn, verify=printing("1"), observe=observe, decode=text_of,
                              eos_id=EOS)
    assert (short[0].turns, short[0].tool_calls) == (1, 0)     # no room for the observation and an answer


def test_observation_tokens_get_no_gradient():
    """The loss's gradient with respect to the log-probs is zero on mask-0 positions (prompt and
    observation tokens) and not on the model's tokens."""
    import jax
    import jax.numpy as jnp
    import grpo
    mask = jnp.asarray([[0, 1, 1, 0, 0, 1, 1, 0]], jnp.float32)
    logp = jnp.asarray([[-1.0, -0.5, -0.2, -3.0, -2.0, -0.1, -0.7, 0.0]])
    cfg = grpo.GRPOConfig(group_size=1, advantage="reinforce")
    grad = jax.grad(lambda lp: grpo.policy_loss(lp, jax.lax.stop_gradient(lp), jnp.asarray([1.0]), mask, cfg)[0])(logp)
    assert np.all(np.asarray(grad)[np.asarray(mask) == 0] == 0) and np.all(np.asarray(grad)[np.asarray(mask) == 1] != 0)


def test_tool_code_and_observation():
    assert envs.python_tool.tool_code("try:\n```python\na=1\n```\nthen\n```python\nprint(a)\n```") == "print(a)\n"
    assert envs.python_tool.tool_code("no code here, #### 3") is None and envs.python_tool.tool_code("```\nplain\n```") is None
    assert envs.observation("5\n") == "Output:\n5\n" and "nothing printed" in envs.observation("  ")
    assert envs.observation("x" * 1000).endswith("[... cut]") and len(envs.observation("x" * 1000)) < 450


def test_the_python_tools_step_runs_each_rows_last_block_in_one_batch():
    """PythonTool.step: one verifier call for the rows that wrote a python block (the item's time
    limit), None for a row without one, and a verifier that could not run the code is said so."""
    rows = [envs.Episode([1], ITEM) for _ in range(3)]
    rows[0].final_text, rows[1].final_text, rows[2].final_text = "```python\nprint(1)\n```", "#### 1", "```py\nx\n```"
    calls = []

    def verify(jobs):
        calls.append(jobs)
        return [make_verdict("passed", "1\n"), make_verdict(INFRA_ERROR, "no verifier answered")]
    assert TOOL.step(rows, verify) == ["1\n", None, envs.python_tool.UNAVAILABLE]
    assert calls == [[{"kind": "run", "program": "print(1)\n", "timeout_s": 5.0},
                      {"kind": "run", "program": "x\n", "timeout_s": 5.0}]]
    assert TOOL.step([rows[1]], verify) == [None] and len(calls) == 1   # nothing to run: no verifier call


def test_one_registry_names_the_environments_everywhere():
    """envs.ENVS is what the trainer's --env, a work item's env and launch.sh's ENV accept."""
    import trainer_config
    assert set(envs.ENVS) >= {"python_tool", "fix_tests"} and type(envs.get("")) is envs.Env
    assert all(envs.get(name).name == name for name in envs.ENVS)
    with pytest.raises(ValueError, match="python_tool, fix_tests"):
        envs.get("chess")
    with pytest.raises(ValueError, match="unknown env 'chess'"):
        trainer_config.Config(env="chess")
    item = wire.WorkItem(item_id="i", prompt="p", group_size=1, seq_len=64, max_new_tokens=8, min_version=0)
    for name in envs.ENVS:
        assert wire.WorkItem.from_dict({**item.to_dict(), "env": name, "max_turns": 2}).env == name
    with pytest.raises(wire.WireError, match="envs.ENVS"):
        wire.WorkItem.from_dict({**item.to_dict(), "env": "chess"})


def test_launch_sh_refuses_an_env_the_registry_does_not_hold(tmp_path):
    import os
    import subprocess
    from conftest import ROOT
    run = lambda name: subprocess.run(["bash", "launch.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                                      env={**os.environ, "ENV": name, "DRY_RUN": "1", "RUN_DIR": str(tmp_path / name)})
    refused = run("chess")
    assert refused.returncode == 2 and f"ENV=chess: expected one of: {' '.join(envs.ENVS)}" in refused.stderr
    accepted = run("fix_tests")
    assert accepted.returncode == 0 and "--env fix_tests" in accepted.stdout, accepted.stderr[-2000:]


def test_the_sandbox_runs_a_tool_call_and_returns_its_output():
    pool = verifier.ExecutorPool(1, "rlimits", use_cgroup=False)
    try:
        ok, err, slow = pool.run([{"kind": "run", "program": "print(6 * 7)"}, {"kind": "run", "program": "1 / 0"},
                                  {"kind": "run", "program": "while True: pass", "timeout_s": 1.0}])
    finally:
        pool.close()
    assert (ok.status, ok.detail) == ("passed", "42\n")
    assert err.status == "runtime_error" and "ZeroDivisionError" in err.detail
    assert slow.status == "timeout"


def test_batch_metrics_of_episodes_and_math():
    """envs.batch_metrics: turns and tool calls averaged over the rows of multi-turn rollouts (a
    one-turn rollout has no env_stats), strict and lenient math accuracy over the statuses."""
    stats = [{"turns": [2, 1], "tool_calls": [1, 0]}, {"turns": [3, 2], "tool_calls": [2, 1]}]
    m = envs.batch_metrics(stats, ["passed", "lenient", "failed", "passed"], math_task=True)
    assert m == {"env/turns_mean": 2.0, "env/tool_calls_mean": 1.0, "math/strict_acc": 0.5, "math/lenient_acc": 0.75}
    assert envs.batch_metrics([{}, {}], ["passed"], math_task=False) == {}
