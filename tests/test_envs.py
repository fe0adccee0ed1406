"""Tasks besides code (envs.py): math answers and a reward function in a file, from the dataset row to
the verifier's verdict.

Run: python -m pytest -q tests/test_envs.py       (about 20 s on a 2-core CPU)
"""
import fractions
import io
import json

import pytest

import envs
import lifecycle
import prompts
import tasks
import verifier
import wire

F = fractions.Fraction


@pytest.mark.parametrize("text, want", [
    ("42", F(42)), ("-7", F(-7)), ("1,234", F(1234)), ("1,234,567.5", F(2469135, 2)), ("0.25", F(1, 4)),
    (".5", F(1, 2)), ("3/4", F(3, 4)), ("\\frac{3}{4}", F(3, 4)), ("\\dfrac{-1}{2}", F(-1, 2)), ("$5$", F(5)),
    ("$18", F(18)), ("50%", F(50)), ("x = 5", F(5)), ("5.", F(5)), ("  12  ", F(12)),
    ("1,2", None), ("12,34", None), ("five", None), ("", None), (None, None), ("1/0", None), ("2x", None),
])
def test_parse_number(text, want):
    assert envs.parse_number(text) == want


@pytest.mark.parametrize("text, want", [
    ("so x = 3 and \\boxed{\\frac{1}{2}} is it. #### 9", ("\\frac{1}{2}", "boxed")),   # boxed first
    ("\\boxed{a{b}c} and then \\boxed{7}", ("7", "boxed")),                          # the last box
    ("work... #### 1,000\nthanks", ("1,000", "hash")),
    ("3 apples and 4 pears: 7 in all.", ("7", "last_number")),
    ("no number here", (None, "none")),
    ("\\boxed{12", ("12", "last_number")),                                             # unbalanced box
])
def test_extract_answer_in_order(text, want):
    assert envs.extract_answer(text) == want


@pytest.mark.parametrize("completion, answer, fmt, status, reward", [
    ("3 + 4 = 7\n#### 7", "7", "hash", "passed", 1.0),
    ("#### 7.0", "7", "hash", "passed", 1.0),                       # numerically equal
    ("#### 1,234", "1234", "hash", "passed", 1.0),
    ("The answer is 7.", "7", "hash", "lenient", 0.0),              # right, not as asked
    ("\\boxed{7}", "7", "hash", "lenient", 0.0),
    ("#### 8", "7", "hash", "failed", 0.0),
    ("#### 8 but really 7", "7", "hash", "failed", 0.0),            # the requested answer is what counts
    ("so \\boxed{\\frac{2}{4}}", "\\frac{1}{2}", "boxed", "passed", 1.0),
    ("0.5", "\\frac{1}{2}", "boxed", "lenient", 0.0),
    ("", "3", "boxed", "failed", 0.0),
])
def test_math_verdict_strict_and_lenient(completion, answer, fmt, status, reward):
    v = envs.math_verdict(completion, answer, fmt)
    assert (v["status"], v["reward"], v["passed"]) == (status, reward, status == "passed")


def test_math_verdict_refuses_a_bad_reference():
    with pytest.raises(ValueError, match="not a number"):
        envs.math_verdict("#### 3", "three", "hash")
    with pytest.raises(ValueError, match="format"):
        envs.math_verdict("#### 3", "3", "latex")


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
def yes(completion, row):
    return True
def text(completion, row):
    return "1.0"
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
    v = envs.call_reward(f"{reward_file}:exact", "anything", {"score": 0.25}, timeout_s=10)
    assert (v["status"], v["reward"]) == ("failed", 0.25)
    v = envs.call_reward(f"{reward_file}:length", "x" * 150, {}, timeout_s=10)
    assert (v["status"], v["reward"]) == ("passed", 1.5)


@pytest.mark.parametrize("name, why", [
    ("boom", "raised RuntimeError: the reward file has a bug"), ("nan", "not a finite number"),
    ("yes", "returned bool, not a number"), ("text", "returned str, not a number"),
    ("slow", "ran past its 1 s limit"), ("dies", "process died"),
])
def test_a_broken_reward_function_is_reported_never_scored_0(reward_file, name, why):
    """Each failure is REWARD_ERROR with its reason, which lifecycle counts with infra_error: the group
    is not trained on, and a run whose rewards keep failing stops."""
    v = envs.call_reward(f"{reward_file}:{name}", "c", {}, timeout_s=1.0)
    assert v["status"] == envs.REWARD_ERROR == lifecycle.REWARD_ERROR and why in v["detail"], v
    assert lifecycle.infra_failures(["passed", v["status"]]) == 1


@pytest.mark.parametrize("spec, why", [("nofile.py:f", "does not exist"), ("x.txt", "path/to/file.py:function"),
                                       ("{}:missing", "no function 'missing'")])
def test_a_reward_that_does_not_load_is_refused_at_start(reward_file, spec, why):
    with pytest.raises(ValueError, match=why):
        envs.load_reward(spec.format(reward_file))
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
            {"kind": "math", "completion": "1", "answer": "one", "format": "hash"},
            {"kind": "math", "completion": 5, "answer": "5", "format": "hash"},
            {"kind": "assert", "program": "x = 1\n", "tests": "assert x == 1\n"},         # code still works
        ])
    finally:
        pool.close()
    assert [v.status for v in verdicts] == ["passed", "lenient", "failed", "reward_error", "infra_error",
                                            "infra_error", "infra_error", "passed"]
    assert verdicts[2].reward == 0.5 and "KeyError" in verdicts[3].detail and "bad job" in verdicts[4].detail


# ----------------------------------------------------------------------------- rows to problems

GSM8K = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
         {"question": "A book costs $1,200 and a pen $34. Total?", "answer": "1200 + 34 = 1234\n#### 1,234"}]
MATH = [{"problem": "What is half of 3?", "solution": "Half of 3 is $\\boxed{\\frac{3}{2}}$.", "level": "Level 1"}]


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_gsm8k_and_math_rows_become_math_problems(tmp_path):
    probs = tasks.load_jsonl(write(tmp_path / "m.jsonl", GSM8K + MATH))
    assert [(p.kind, p.answer, p.answer_format) for p in probs] == [
        ("math", "7", "hash"), ("math", "1,234", "hash"), ("math", "\\frac{3}{2}", "boxed")]
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
    """`python tasks.py check` on math: every reference solution parses and scores 1 (strict)."""
    out = io.StringIO()
    path = write(tmp_path / "m.jsonl", GSM8K + MATH)
    make_pool = lambda: verifier.ExecutorPool(1, "rlimits", use_cgroup=False)
    assert tasks.check_dataset(path, make_pool, out=out) == 0
    assert out.getvalue().strip().endswith("checked 3 problems: 3 reference solutions pass, 0 fail, 0 bad lines")
    bad = write(tmp_path / "w.jsonl", GSM8K + [{"question": "q", "answer": "#### many"}])
    out = io.StringIO()
    assert tasks.check_dataset(bad, make_pool, out=out) == 1  # an answer that is not a number: a bad line
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
    import inference_worker
    m = wire.WorkItem(item_id="m", prompt="p", group_size=1, seq_len=64, max_new_tokens=8, min_version=0,
                      kind="math", answer="7", answer_format="hash", timeout_s=3.0)
    r = wire.WorkItem(item_id="r", prompt="p", group_size=2, seq_len=64, max_new_tokens=8, min_version=0,
                      kind="reward", row='{"score": 1}')
    jobs = inference_worker.verify_jobs([m, r], ["#### 7", "a", "b"])
    assert jobs == [{"kind": "math", "completion": "#### 7", "answer": "7", "format": "hash", "timeout_s": 3.0},
                    {"kind": "reward", "completion": "a", "row": '{"score": 1}', "timeout_s": 5.0},
                    {"kind": "reward", "completion": "b", "row": '{"score": 1}', "timeout_s": 5.0}]
    assert all(verifier.check_job(j) for j in jobs)
