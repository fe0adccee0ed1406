"""ENV=fix_tests (envs/fix_tests.py): a program that fails its tests is shown the failure and written
again, once; the final program's verdict is the reward. The env's step and observation with a
scripted policy and a stand-in verifier, then the whole system through launch.sh on the embedded task.

Run: python -m pytest -q tests/test_env_fix_tests.py       (about 90 s on a 2-core CPU)
"""
import json
import os
import subprocess

import envs
import envs.fix_tests
import wire
from conftest import ROOT, free_port
from verdicts import INFRA_ERROR, make_verdict

FIX = envs.get("fix_tests")
ITEM = wire.WorkItem(item_id="i", prompt="p", group_size=1, seq_len=400, max_new_tokens=40, min_version=0,
                     prompt_format="chat", tests="assert f(2) == 4\n", entry_point="f", env="fix_tests", max_turns=3)
EOS = 0
WRONG, RIGHT, BROKEN = "```python\ndef f(x): return x\n```", "```python\ndef f(x): return 2 * x\n```", "```py\n(\n```"


def ids_of(text):  # a toy tokenizer: one character per token id (id = ord, eos = 0)
    return [ord(c) for c in text]


def text_of(ids):
    return "".join(chr(i) for i in ids)


def checker(jobs_seen: list, infra: bool = False):
    """A verifier stand-in: runs each assert job's program against its tests in this process."""
    def verify(jobs):
        jobs_seen.append(jobs)
        out = []
        for job in jobs:
            if infra:
                out.append(make_verdict(INFRA_ERROR, "no verifier answered"))
                continue
            try:
                scope = {}
                exec(job["program"], scope)
                exec(job["tests"], scope)
                out.append(make_verdict("passed"))
            except AssertionError:
                out.append(make_verdict("failed", "assert f(2) == 4: expected 4, got 2"))
            except SyntaxError as e:
                out.append(make_verdict("syntax_error", f"SyntaxError: {e.msg}"))
        return out
    return verify


def run(turns: dict, rows: int, verify):
    """run_episodes in fix_tests with a scripted policy: row r's turn t writes turns[(r, t)] + eos."""
    def sample_turn(index, seqs, budgets, turn):
        return [(ids_of(turns[(r, turn)]) + [EOS], [-0.5] * (len(turns[(r, turn)]) + 1)) for r in index]
    observe = lambda text: ids_of(f"<user>{text}<assistant>")
    return envs.run_episodes(FIX, [ids_of("Q?")] * rows, items=[ITEM] * rows, max_turns=3, seq_len=400,
                             max_new_tokens=40, sample_turn=sample_turn, verify=verify, observe=observe,
                             decode=text_of, eos_id=EOS)


def test_a_failing_program_is_shown_its_failure_and_written_again_once():
    """Row 0 fails, reads the failure, fixes it; row 1 passes at once (one turn); row 2 fails twice and
    gets no third turn though max_turns is 3. The tests ran once per first turn, in one batch."""
    seen = []
    eps = run({(0, 0): WRONG, (0, 1): RIGHT, (1, 0): RIGHT, (2, 0): WRONG, (2, 1): WRONG}, 3, checker(seen))
    assert [(e.turns, e.tool_calls, e.final_text) for e in eps] == [(2, 1, RIGHT), (1, 0, RIGHT), (2, 1, WRONG)]
    assert len(seen) == 1 and [j["program"] for j in seen[0]] == ["def f(x): return x\n", "def f(x): return 2 * x\n",
                                                                  "def f(x): return x\n"]
    assert seen[0][0] == FIX.score_job(ITEM, WRONG)      # the same job the reward comes from
    shown = text_of(eps[0].tokens[len("Q?") + len(WRONG) + 1:-len(RIGHT) - 1])
    assert shown == "<user>" + FIX.observation("failed: assert f(2) == 4: expected 4, got 2") + "<assistant>"
    assert "expected 4, got 2" in shown and "Write the whole program again" in shown
    assert eps[0].mask.count(0.0) == len("Q?") + len(shown)   # the failure shown is never trained on


def test_a_syntax_error_is_a_failure_and_an_unchecked_program_ends_the_episode():
    seen = []
    eps = run({(0, 0): BROKEN, (0, 1): RIGHT}, 1, checker(seen))
    assert (eps[0].turns, eps[0].final_text) == (2, RIGHT) and "syntax_error: SyntaxError" in text_of(eps[0].tokens)
    eps = run({(0, 0): WRONG, (0, 1): RIGHT}, 1, checker([], infra=True))
    assert (eps[0].turns, eps[0].tool_calls) == (1, 0)    # never asked to fix what nobody checked


def test_the_observation_is_cut_and_the_second_turn_asks_nothing():
    long = "failed: " + "x" * 1000
    text = FIX.observation(long)
    assert "[... cut]" in text and len(text) < envs.OBSERVATION_CHARS + 200
    second = envs.Episode([1], ITEM)
    second.turns, second.final_text = 2, WRONG
    calls = []
    assert FIX.step([second], checker(calls)) == [None] and calls == []   # done, no verifier call
    assert FIX.prompt.__func__ is envs.Env.prompt and envs.fix_tests.SYSTEM == FIX.system


# ----------------------------------------------------------------------------- through launch.sh

# the embedded task's f, wrong for every problem; with no fence the whole answer is the program
# (prompts.extract_code): the small tokenizer writes ``` as three tokens, which a bigram model cannot
WRONG_PROGRAM = "def f(x):\n    return 0"


def scripted_chat_model(tmp_path) -> str:
    """A ChatML checkpoint (a small BPE trained here) whose weights write WRONG_PROGRAM then the
    end-of-turn token after every assistant header (tests/real_tokenizers.py:make_scripted)."""
    import hf_io
    import hf_local
    import prompts
    import real_tokenizers as rt
    tok_dir = hf_local.make_tokenizer(str(tmp_path / "tok"), hf_local.CHATML_TEMPLATE, vocab_size=1024)
    tok, template = hf_io.load_tokenizer(tok_dir), prompts.load_chat_template(tok_dir)
    gen = tok.encode(prompts.render_chat(template, [{"role": "user", "content": "."}]))[-1]
    chain = [gen] + tok.encode(WRONG_PROGRAM) + [prompts.end_of_turn_id(template, tok)]
    return rt.make_scripted(str(tmp_path / "model"), tok_dir, "qwen2", [chain])


def test_fix_tests_runs_end_to_end_through_launch_sh(tmp_path):
    """ENV=fix_tests on the embedded task, 2 steps: every episode took two turns, the first failed and
    its failure came back (one observation per row), the second program was scored by the verifier
    (reward 0: its f is wrong; no infra errors), and the model's tokens are bitwise the trainer's."""
    run_dir = str(tmp_path / "run")  # T 512: the embedded task would take the model's 4096
    env = {**os.environ, "RUN_DIR": run_dir, "PORT": str(free_port()), "MODEL": scripted_chat_model(tmp_path),
           "ENV": "fix_tests", "STEPS": "2", "WORKERS": "1", "VERIFIER_EXECUTORS": "1", "RECIPE": "--group-size 4",
           "EVAL": "--eval-every 0 --eval-samples 2",
           "TRAINER_ARGS": "--max-new-tokens 24 --prompts-per-step 2 --heldout 2 --seq-len 512"}
    proc = subprocess.run(["bash", "launch.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "--env fix_tests" in open(os.path.join(run_dir, "commands.sh")).read()
    steps = [r for r in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl"))) if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["env/turns_mean"] == 2.0 and r["env/tool_calls_mean"] == 1.0, r   # failed, shown, retried
        assert r["reward/mean"] == 0.0 and r.get("verifier/infra_error_frac", 0) == 0, r
        assert r["mismatch/bitwise_frac"] == 1.0, r
    # the rewards are the verifier's verdicts: every batch sampled was verified, a program per row
    spans = [json.loads(line) for line in open(os.path.join(run_dir, "timeline", "worker-0.jsonl"))]
    batches = [(a["rows"], b["programs"]) for a, b in zip(spans, spans[1:]) if a["span"] == "sample"
               and b["span"] == "verify"]
    assert len(batches) >= 2 and all(rows == programs for rows, programs in batches), spans
    assert "reward 0.00" in open(os.path.join(run_dir, "worker-0.log")).read()
