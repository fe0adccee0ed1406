"""The R1 recipe (recipe.py): SFT rows and their loss (sft.py), rejection sampling that keeps only what the
verifier passed (rejection_sample.py), and the stages chained through launch.sh: on the embedded task,
stopped by SIGTERM in a GRPO stage and resumed; on GSM8K-style rows with Qwen3's tokenizer and template.

Run: python -m pytest -q tests/test_recipe.py       (about 4 minutes on a 2-core CPU)
"""
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

import checkpointing
import curate
import hf_io
import prompts
import recipe
import rejection_sample
import real_tokenizers as rt
import sft
from conftest import ROOT, free_port


# ----------------------------------------------------------------------------- sft.py

def test_the_sft_loss_weighs_completion_tokens_only():
    """weight_RT[b, t] weighs predicting token t: 0 on every prompt token and on padding, 1 on every
    completion token; prompt_loss_weight puts weight on the prompt's tokens after the first."""
    tokens_RT, weight_RT = sft.batch([([5, 6, 7], [8, 9]), ([1], [2, 3, 4])], 8, pad_id=0)
    assert tokens_RT.tolist() == [[5, 6, 7, 8, 9, 0, 0, 0], [1, 2, 3, 4, 0, 0, 0, 0]]
    assert weight_RT.tolist() == [[0, 0, 0, 1, 1, 0, 0, 0], [0, 1, 1, 1, 0, 0, 0, 0]]
    _, w = sft.batch([([5, 6, 7], [8, 9])], 6, pad_id=0, prompt_loss_weight=0.5)
    assert w.tolist() == [[0, 0.5, 0.5, 1, 1, 0]]
    with pytest.raises(ValueError, match="tokens > seq_len"):
        sft.batch([([1, 2, 3], [4, 5])], 4, pad_id=0)


def test_a_chat_row_is_the_workers_prompt_and_ends_with_the_end_of_turn_token():
    """Qwen3's template: the prompt is the rendered user turn up to the assistant's header, exactly what
    a worker encodes for that problem; the completion is the answer's tokens then <|im_end|>."""
    folder = rt.need("qwen3")
    tok, template = hf_io.load_tokenizer(folder), prompts.load_chat_template(folder)
    messages = [{"role": "user", "content": "What is 6 times 7?"}, {"role": "assistant", "content": "#### 42"}]
    prompt, completion = sft.tokenize({"messages": messages}, tok, "chat", template)
    assert prompt == tok.encode(prompts.render_chat(template, messages[:1], add_generation_prompt=True))
    assert completion == tok.encode("#### 42") + [prompts.end_of_turn_id(template, tok)]
    same = sft.tokenize({"prompt": "What is 6 times 7?", "completion": "#### 42"}, tok, "chat", template)
    assert same == (prompt, completion)
    with pytest.raises(ValueError, match="chat format"):
        sft.tokenize({"messages": messages}, tok, "completion")


def test_bad_sft_rows_are_refused_by_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "a", "completion": "b"}\n\n{"prompt": "a"}\n')
    with pytest.raises(ValueError, match=r"rows.jsonl:3: a row is"):
        sft.read_rows(str(path))
    path.write_text('{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}\n')
    with pytest.raises(ValueError, match=r"rows.jsonl:1: a row is"):  # the last message is not the answer
        sft.read_rows(str(path))
    path.write_text("not json\n")
    with pytest.raises(ValueError, match=r"rows.jsonl:1: not JSON"):
        sft.read_rows(str(path))


def test_sft_lowers_the_loss_and_saves_a_checkpoint_the_trainer_loads(tmp_path):
    """On the embedded cold start: its own reference answers, 10 steps; the saved folder loads, in the
    checkpoint's dtype, and its tokenizer is the byte tokenizer as before."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"def f(x):\n    # f(0) = {b}\n    return ",
                                        "completion": f"x+{b}\n"}) + "\n" for b in range(1, 9)))
    info = sft.main(sft.Config(model=os.path.join(ROOT, "checkpoints", "coldstart"), data=str(rows),
                               out=str(tmp_path / "out"), steps=10, batch_size=8, lr=1e-3), log=lambda _: None)
    assert info["rows"] == 8 and info["steps"] == 10 and info["loss_last"] < info["loss_first"]
    mcfg, _ = hf_io.load_hf(str(tmp_path / "out"))
    assert mcfg.dtype == "bfloat16" and not os.path.exists(str(tmp_path / "out.tmp"))
    assert isinstance(hf_io.load_tokenizer(str(tmp_path / "out")), hf_io.ByteTokenizer)


# ----------------------------------------------------------------------------- rejection_sample.py

def test_pick_deduplicates_then_keeps_shortest_or_a_seeded_draw():
    right = ["x+1\n", "1+x\n", "x+1\n", "x + 1\n", "1+x \n"]
    kept, dup = rejection_sample.pick(right, 2, "shortest", np.random.default_rng(0))
    assert kept == ["x+1\n", "1+x\n"] and dup == 2
    draws = [rejection_sample.pick(right, 2, "random", np.random.default_rng(s))[0] for s in range(6)]
    assert all(len(d) == 2 and len(set(d)) == 2 and set(d) <= {"x+1\n", "1+x\n", "x + 1\n"} for d in draws)
    assert len({tuple(d) for d in draws}) > 1   # a draw, not always the first ones
    assert rejection_sample.pick(right, 9, "random", np.random.default_rng(0))[0] == ["x+1\n", "1+x\n", "x + 1\n"]


def scripted_qwen3(tmp_path, answer: str) -> str:
    """A Qwen3-vocabulary checkpoint that answers every chat prompt with `answer` then <|im_end|>."""
    folder = rt.need("qwen3")
    tok, template = hf_io.load_tokenizer(folder), prompts.load_chat_template(folder)
    gen = tok.encode(prompts.render_chat(template, [{"role": "user", "content": "."}]))[-1]
    chain = [gen] + tok.encode(answer) + [prompts.end_of_turn_id(template, tok)]
    return rt.make_scripted(str(tmp_path / "model"), folder, "qwen3", [chain])


MATH_ROWS = [{"id": f"q{i}", "question": f"What is {a} times {b}? ({i})", "answer": f"#### {a * b}"}
             for i, (a, b) in enumerate([(6, 7), (3, 14), (5, 9), (2, 21), (7, 6), (4, 11), (1, 42), (3, 15)])]


def test_rejection_sampling_keeps_only_what_the_verifier_passed(tmp_path):
    """The scripted policy writes '#### 42' for every problem: right where the answer is 42, wrong
    elsewhere. Only the right ones become SFT rows (one distinct completion each, the chat format's
    messages), every sample scored by the real verifier; the wrong ones are dropped."""
    data = tmp_path / "math.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in MATH_ROWS))
    report = rejection_sample.main(rejection_sample.Config(
        model=scripted_qwen3(tmp_path, "#### 42"), out=str(tmp_path / "rs"), data=str(data), heldout=2, k=4,
        max_new_tokens=8), log=lambda _: None)
    rates = [json.loads(line) for line in open(tmp_path / "rs" / "pass_rates.jsonl")]
    rows = [json.loads(line) for line in open(tmp_path / "rs" / "sft.jsonl")]
    assert len(rates) == 6 and report["samples"] == 24  # 8 rows, 2 held out, never sampled
    by_answer = {r["id"]: r["answer"] == "#### 42" for r in MATH_ROWS}
    for r in rates:
        assert r["k"] == 4 and r["passed"] == (4 if by_answer[r["item_id"]] else 0), r
    right = sorted(r["item_id"] for r in rates if by_answer[r["item_id"]])
    assert right and sorted(r["item_id"] for r in rows) == right and len(right) < len(rates)
    assert report["duplicates"] == 3 * len(right) and report["rows"] == len(right)
    for row in rows:
        assert row["messages"][-1] == {"role": "assistant", "content": "#### 42"} and row["passed_of_k"] == "4/4"
    sft.read_rows(str(tmp_path / "rs" / "sft.jsonl"))  # rows sft.py reads


# ----------------------------------------------------------------------------- the stages, end to end

def stage_env(tmp_path, **env) -> dict:
    return {**os.environ, "RUN_DIR": str(tmp_path / "run"), "WORKERS": "1", "VERIFIER_EXECUTORS": "1",
            "EVAL": "--eval-every 0 --eval-samples 8", "STAGES": "r1", **env}


def test_the_stages_chain_stop_on_sigterm_and_resume(tmp_path):
    """The recipe on the embedded task through launch.sh. SIGTERM during the first GRPO stage (after its
    first checkpoint) stops it with status 143 and no done.json; the same command again skips the cold
    start, resumes GRPO from its checkpoint, and runs every later stage; the table lists all five."""
    args = "--grpo-steps 3 --final-steps 1 --rs-problems 8 --rs-k 4 --heldout 4 --unseen 4"
    env = stage_env(tmp_path, PORT=str(free_port()), STAGE_ARGS=args,
                    TRAINER_ARGS="--checkpoint-every 1 --prompts-per-step 4")
    run = tmp_path / "run"
    proc = subprocess.Popen(["bash", "launch.sh"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while not checkpointing.list_checkpoints(str(run / "grpo")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)  # launch.sh exec'd recipe.py: this is recipe.py
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, out[-3000:]
    assert (run / "coldstart" / "done.json").is_file() and not (run / "grpo" / "done.json").exists()
    again = subprocess.run(["bash", "launch.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert "stage coldstart is done" in again.stdout
    assert "resumed" in open(run / "grpo" / "trainer.log").read()
    steps = [r["step"] for r in map(json.loads, open(run / "grpo" / "metrics.jsonl")) if "reward/mean" in r]
    assert sorted(set(steps)) == [1, 2, 3], steps
    fates = [json.loads(line)["item_id"] for line in open(run / "grpo" / "ledger.jsonl")]
    assert len(fates) == len(set(fates))   # every prompt one fate across the stop
    table = open(run / "recipe.md").read()
    for stage in recipe.R1:
        assert f"| {stage}" in table and (run / stage / "done.json").is_file()
    records = json.load(open(run / "recipe.json"))["stages"]
    assert records[2]["samples"] == 8 * 4 and "unseen" in records[-1]["eval"]
    assert again.stdout.strip().splitlines()[-1].startswith("recipe: heldout pass@1: coldstart")


def test_the_recipe_runs_on_a_users_dataset_with_qwen3s_template(tmp_path):
    """STAGES=r1 on GSM8K-style rows, chat format, a scripted Qwen3 checkpoint: every stage runs (GRPO
    through launch.sh twice, rejection sampling keeps the rows answered right, SFT on them in Qwen3's
    template); the held-out numbers are the dataset's held-out split's."""
    data = tmp_path / "math.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in MATH_ROWS))
    env = stage_env(tmp_path, PORT=str(free_port()), MODEL=scripted_qwen3(tmp_path, "#### 42"), DATA=str(data),
                    RECIPE="--group-size 4", TRAINER_ARGS="--prompts-per-step 2",
                    STAGE_ARGS="--grpo-steps 1 --final-steps 1 --rs-k 2 --heldout 2 --max-new-tokens 8")
    proc = subprocess.run(["bash", "launch.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    records = json.load(open(tmp_path / "run" / "recipe.json"))["stages"]
    assert [r["stage"] for r in records] == list(recipe.R1)
    train = {p.item_id for p in curate.dataset_problems(str(data), 2)[0]}  # the trainer's training split
    assert records[2]["rows"] == sum(r["answer"] == "#### 42" for r in MATH_ROWS if r["id"] in train) > 0
    for r in records:
        if "eval" in r:
            assert set(r["eval"]) == {"heldout"} and r["eval"]["heldout"]["problems"] == 2
    assert json.load(open(tmp_path / "run" / "sft" / "final" / "sft.json"))["format"] == "chat"
