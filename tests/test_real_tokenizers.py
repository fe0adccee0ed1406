"""Real tokenizer files (Qwen3, Llama 3 Instruct), as a researcher brings them, through every path that
reads a token: every eos id, special tokens as ids, the text between two turns on a thinking template,
observations within their token reserve, and launch.sh end to end with a checkpoint at the real
vocabulary size whose weights write a given text (tests/real_tokenizers.py):

  tokenizer x format x task       what the scripted model writes          what must hold
  Qwen3    x chat       x python_tool  a ```python block, twice              a tool call, an observation
                                                                             and a second turn in every row
  Qwen3    x chat       x code         a correct function                    reward 1 from the sandbox
  Llama 3  x completion x reward file  " 42" then <|eot_id|>                 every row stops at <|eot_id|>
  Llama 3  x chat       x reward file  "42" then <|eot_id|>                  (128009, generation_config's
                                                                             second eos): reward 1
and in every run the sampler's log-probs equal the trainer's bit for bit.

Run: python -m pytest -q tests/test_real_tokenizers.py     (skips, saying why, without the tokenizer files)
"""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from conftest import ROOT, free_port
import real_tokenizers as rt

import envs
import hf_io
import prompts
import sampler

EXPECTED = {  # name: (eos ids in order, end-of-turn id, its text, model_type)
    "qwen3": ((151645, 151643), 151645, "<|im_end|>", "qwen3"),
    "llama3": ((128009, 128001), 128009, "<|eot_id|>", "llama"),
}


@pytest.fixture(scope="module", params=rt.NAMES)
def real(request):
    folder = rt.need(request.param)
    return request.param, folder, hf_io.load_tokenizer(folder), prompts.load_chat_template(folder)


# ----------------------------------------------------------------------------- tokens and templates

def test_every_eos_id_is_kept_and_the_end_of_turn_is_an_id(real):
    name, folder, tok, template = real
    eos_ids, eot, eot_text, _ = EXPECTED[name]
    assert tok.vocab_size == {"qwen3": 151669, "llama3": 128256}[name]
    assert tok.eos_ids == eos_ids and tok.eos_id == eos_ids[0]
    assert tok.decode([eot]) == ""                      # why the end of turn is never found by decoding
    assert tok.special_text(eot) == eot_text and tok.special_text(tok.encode("a")[0]) is None
    assert prompts.end_of_turn_id(template, tok) == eot
    # a chat row stops at every eos id and at the template's end of turn; a one-token stop string adds itself
    assert set(sampler.eos_for(tok, (), eot)) == set(eos_ids) | {eot}
    newline = tok.encode("\n")
    assert sampler.eos_for(tok, ("\n",), eot)[0] == newline[0] and set(eos_ids) <= set(
        sampler.eos_for(tok, ("\n",), eot))


def test_special_tokens_written_as_added_token_dicts_are_read(tmp_path):
    """tokenizer_config.json may write a named token as {"__type": "AddedToken", "content": ...}; with no
    generation_config.json the eos is that token's id."""
    src = rt.need("llama3")
    dst = tmp_path / "tok"
    dst.mkdir()
    shutil.copy2(os.path.join(src, "tokenizer.json"), dst)
    config = json.load(open(os.path.join(src, "tokenizer_config.json")))
    config["eos_token"] = {"__type": "AddedToken", "content": "<|eot_id|>", "lstrip": False, "normalized": False,
                           "rstrip": False, "single_word": False}
    config["bos_token"] = {"__type": "AddedToken", "content": "<|begin_of_text|>"}
    (dst / "tokenizer_config.json").write_text(json.dumps(config))
    tok = hf_io.load_tokenizer(str(dst))
    assert (tok.eos_id, tok.eos_ids, tok.bos_id) == (128009, (128009,), 128000)
    assert prompts.render_chat(prompts.load_chat_template(str(dst)), [{"role": "user", "content": "x"}]).startswith(
        "<|begin_of_text|>")


def test_the_text_between_two_turns_equals_transformers_on_thinking_templates(real):
    """A model turn (with reasoning, which Qwen3's template drops from earlier turns once a user message
    follows), then a tool's output as the next user message: transformers' rendering of the whole
    conversation ends with the end-of-turn token + next_turn_text, whatever it did to the history."""
    transformers = pytest.importorskip("transformers")
    name, folder, tok, template = real
    eot_text = EXPECTED[name][2]
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    turn = "<think>\nI should compute it.\n</think>\n\n```python\nprint(6 * 7)\n```"
    for first in ([{"role": "user", "content": "What is 6 x 7?"}],
                  [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 6 x 7?"}]):
        for obs in ("Output:\n42", envs.observation("9" * 1000)):
            whole = theirs.apply_chat_template(first + [{"role": "assistant", "content": turn},
                                                        {"role": "user", "content": obs}],
                                               add_generation_prompt=True, tokenize=False)
            tail = prompts.next_turn_text(template, obs, eot_text)
            assert whole.endswith(eot_text + tail) and obs in tail, (whole[-300:], tail)
            # tokenized after the sampled end-of-turn token, the tail gives transformers' ids
            ids = theirs(whole, add_special_tokens=False)["input_ids"]
            assert ids[-len(tok.encode(tail)) - 1:] == [EXPECTED[name][1]] + tok.encode(tail)
    assert prompts.check_multi_turn(template, tok) == EXPECTED[name][1]


def test_a_template_that_cannot_carry_turns_is_refused_with_the_reason(real):
    name, folder, tok, _ = real
    plain = prompts.ChatTemplate("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                                 "{% if add_generation_prompt %}assistant: {% endif %}", {})
    with pytest.raises(ValueError, match="no special token"):
        prompts.check_multi_turn(plain, tok)
    with pytest.raises(ValueError, match="chat template"):
        prompts.check_multi_turn(None, tok)


def test_an_observation_keeps_to_its_token_reserve_on_digit_splitting_tokenizers(real):
    """Qwen3 spends a token per digit: 400 characters of digits are ~400 tokens, over the 160 the trainer
    reserves per observation; cut in tokens, it fits, and keeps as much output as fits."""
    name, folder, tok, template = real
    observe = lambda text: tok.encode(prompts.next_turn_text(template, text, EXPECTED[name][2]))
    output = "".join(str(i % 10) for i in range(1000))
    if name == "qwen3":  # cut in characters only, it would not fit
        assert len(observe(envs.observation(output))) > envs.OBSERVATION_TOKENS
    ids = envs.observation_tokens(output, observe)
    assert len(ids) <= envs.OBSERVATION_TOKENS
    assert "[... cut]" in tok.decode(ids) and "0123456789" in tok.decode(ids)
    small = envs.observation_tokens(output, observe, 100)
    assert len(small) <= 100 < len(envs.observation_tokens(output, observe, 110))  # the longest that fits
    assert envs.observation_tokens("42\n", observe) == observe(envs.observation("42\n"))  # short: as is


# ----------------------------------------------------------------------------- launch.sh, end to end

def chat_chain(tok, template, text: str) -> list:
    """The generation prompt's last token, the text's tokens, the end-of-turn token."""
    gen = tok.encode(prompts.render_chat(template, [{"role": "user", "content": "."}]))[-1]
    return [gen] + tok.encode(text) + [prompts.end_of_turn_id(template, tok)]


def launch(tmp_path, model_dir: str, rows: list, steps: int = 1, **env) -> tuple:
    """launch.sh on model_dir with a data file of `rows`: `steps` steps of 2 prompts x 4 samples."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_dir = str(tmp_path / "run")
    env = {**os.environ, "RUN_DIR": run_dir, "PORT": str(free_port()), "MODEL": model_dir, "DATA": str(data),
           "STEPS": str(steps), "RECIPE": "--group-size 4", "EVAL": "--eval-every 0 --eval-samples 2",
           "TRAINER_ARGS": "--max-new-tokens 16 --prompts-per-step 2 --heldout 2", **env}
    proc = subprocess.run(["bash", "launch.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    trained = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in trained] == list(range(1, steps + 1))
    for r in trained:
        assert r["mismatch/bitwise_frac"] == 1.0, r   # the bf16 fix on the model's tokens
        assert r.get("verifier/infra_error_frac", 0) == 0, r
    return run_dir, trained


def test_qwen3_tool_calling_episodes_through_launch_sh(tmp_path):
    """ENV=python_tool on Qwen3's template: each turn the model writes a python block and ends it with
    <|im_end|>; the sandbox runs it, the output comes back as the next user message rendered by the
    template, and the model answers again: two turns and one tool call in every row, at both steps
    (the second sampled with the trained weights, bitwise too)."""
    folder = rt.need("qwen3")
    tok, template = hf_io.load_tokenizer(folder), prompts.load_chat_template(folder)
    model_dir = rt.make_scripted(str(tmp_path / "model"), folder, "qwen3",
                                 [chat_chain(tok, template, "```python\n\nprint(42)")])
    rows = [{"question": f"What is {a} times {b}?", "answer": f"#### {a * b}"} for a, b in
            [(6, 7), (3, 14), (2, 21), (7, 6), (1, 42), (42, 1)]]
    run_dir, steps = launch(tmp_path, model_dir, rows, steps=2, ENV="python_tool",
                            TRAINER_ARGS="--max-new-tokens 16 --prompts-per-step 2 --heldout 2 --max-turns 2")
    for r in steps:
        assert r["env/tool_calls_mean"] == 1.0 and r["env/turns_mean"] == 2.0, r
    worker_log = "".join(open(os.path.join(run_dir, f)).read() for f in os.listdir(run_dir)
                         if f.startswith("worker") and f.endswith(".log"))
    assert "cannot sample" not in worker_log


def test_qwen3_code_task_scores_a_correct_program(tmp_path):
    """The code task in the chat format on Qwen3: the scripted answer is a correct function, which the
    real sandbox passes: reward 1 at every step."""
    folder = rt.need("qwen3")
    tok, template = hf_io.load_tokenizer(folder), prompts.load_chat_template(folder)
    model_dir = rt.make_scripted(str(tmp_path / "model"), folder, "qwen3",
                                 [chat_chain(tok, template, "```python\n\ndef answer(): return 42")])
    rows = [{"task_id": 700 + i, "text": f"Write a function answer() that returns 42 ({i}).",
             "code": "def answer():\n    return 42\n", "test_list": ["assert answer() == 42"]} for i in range(6)]
    _, steps = launch(tmp_path, model_dir, rows, PROMPT_FORMAT="chat")
    assert all(r["reward/mean"] == 1.0 for r in steps), steps


REWARD_FILE = '''
import numpy as np

def exact(completion, row):
    """1 when the completion is exactly the row's text: a row that ran on past its end scores 0."""
    return np.float32(completion == row["want"])
'''


@pytest.mark.parametrize("fmt", ["completion", "chat"])
def test_llama3_rows_stop_at_eot_id_in_both_formats(tmp_path, fmt):
    """Llama 3 Instruct ends a turn with <|eot_id|> (128009), the second eos of its generation_config:
    a row that did not stop there would run on into random tokens. The reward function (returning a
    numpy float) scores the exact text: 1 at every step."""
    folder = rt.need("llama3")
    tok, template = hf_io.load_tokenizer(folder), prompts.load_chat_template(folder)
    eot = EXPECTED["llama3"][1]
    prompt = "The answer to everything is:"
    if fmt == "chat":
        chain, want = chat_chain(tok, template, "42"), "42"
    else:
        chain, want = tok.encode(prompt)[-1:] + tok.encode(" 42") + [eot], " 42"
    model_dir = rt.make_scripted(str(tmp_path / "model"), folder, "llama", [chain])
    reward = tmp_path / "exact.py"
    reward.write_text(REWARD_FILE)
    rows = [{"id": f"r{i}", "prompt": prompt if fmt == "completion" else f"{prompt} ({i})", "want": want}
            for i in range(6)]
    _, steps = launch(tmp_path, model_dir, rows, REWARD=f"{reward}:exact", PROMPT_FORMAT=fmt)
    assert all(r["reward/mean"] == 1.0 for r in steps), steps
