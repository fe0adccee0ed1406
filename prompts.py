"""prompts.py: what the model is shown for a problem, and how its answer becomes the program we verify.

A problem (tasks.Problem) can be put to the model in one of two formats (FORMATS):

  completion  The model continues text that is already the start of the program (a base model's way).
              - assert problems (HumanEval, plain asserts, the embedded task): the problem's prompt,
                e.g. a signature and docstring; the model writes the body.
              - MBPP: the prompt is a docstring holding the task and its first test; the model writes
                the function after it.
              - stdin/stdout problems (Codeforces/APPS): the English statement is not Python, so the
                model is shown it as a comment header ("# " before every line, under two fixed lines
                of instruction) and writes the whole program after it. The header is always valid
                Python: every line of the statement (split wherever Python would split a line: \\n,
                \\r\\n or a lone \\r) becomes a comment, NUL characters (which Python source cannot
                hold) are dropped, and lone surrogates become U+FFFD (the verifier needs UTF-8 text).
              program = program_prefix + completion cut at the first stop string (cut_at_stop:
              of the stop string only its leading whitespace is kept, so "\n" ends the line and
              "\ndef " leaves a newline, never a dangling "def "), where program_prefix is exactly
              the text the model continued (model_prompt).
  chat        An instruction model gets one user message, rendered with the checkpoint's own chat
              template exactly as transformers' apply_chat_template renders it (add_generation_prompt:
              the text ends where the assistant's answer begins). The message is an instruction
              sentence plus the problem, and asks for the whole program in one ```python block:
              - code prompts (HumanEval, plain asserts, the embedded task): "Complete the following
                Python function/code" with the prompt in a fenced block;
              - MBPP: the task text and its first test (in a fenced block);
              - stdin/stdout: the statement, and that the program reads standard input and writes
                standard output.
              The sampler stops at the end-of-turn token (no stop strings), and
              program = extract_code(answer).

The code-extraction rule (extract_code), for chat answers:
  1. A fenced block opens at a line whose first non-blank characters are three or more backticks;
     the first word after them (lower-cased) is its label. It closes at the next line holding only
     backticks, at least as many as opened it (and blanks). A block never closed runs to the end of
     the answer (a reply cut by the length limit keeps the code it has). Only backtick fences count.
  2. The program is the content of the FIRST block labelled python, py or python3; if there is
     none, of the first block with no label; the fence lines themselves are not part of it.
     Blocks with another label (```text, ```bash) are never taken.
  3. If no block qualifies (no fence at all, or only other labels), the program is the whole answer.
  The first block rather than the last because answers often end with a usage example in a second
  block. Content is taken verbatim, except that an indented opening fence (a block inside a list
  item) removes up to that much leading indentation from each content line, as Markdown does.

assemble_program is the ONE function that builds a program from a completion: the inference worker
calls it with the fields carried in its work item, and `python curate.py check` calls it on the
dataset's reference solutions (reference_completions), so a dataset that passes the check is
verified exactly as the model's answers will be.
"""
from __future__ import annotations

import datetime
import functools
import json
import os
import re
from dataclasses import dataclass

FORMATS = ("chat", "completion")

# ============================================================================ chat templates


@dataclass(frozen=True)
class ChatTemplate:
    """A checkpoint's chat template: the jinja source and the special-token strings it may use."""

    source: str
    """The jinja source (tokenizer_config.json "chat_template" or chat_template.jinja)."""
    special: dict
    """Named special tokens from tokenizer_config.json, e.g. {"eos_token": "<|im_end|>"}; values are
    strings or {"content": ...} dicts as that file writes them (render_chat reads both)."""


# The named special tokens transformers passes to every chat template (its SPECIAL_TOKENS_ATTRIBUTES),
# as template variables with their string values; tokens set to null are not passed.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                       "mask_token")


def _token_text(value) -> str | None:
    """A special token's string, from "<s>" or an AddedToken dict {"content": "<s>", ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: str) -> dict:
    """A model folder's JSON file, or {} when the folder has none."""
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load_chat_template(model_dir: str | None) -> ChatTemplate | None:
    """The chat template of a checkpoint folder, or None if it has none (or model_dir is None).

    Where transformers looks, in its order: chat_template.jinja beside tokenizer_config.json (newer
    transformers save it there, and it takes precedence), else tokenizer_config.json "chat_template":
    a string, or a list of {"name", "template"} of which the one named "default" is taken (a list
    without one is a ValueError naming what it holds). Special tokens come from tokenizer_config.json,
    and from special_tokens_map.json (older checkpoints) for names the config does not set.
    Known limit: a token missing from both files is not passed, where transformers would pass the
    tokenizer class's own default (Qwen2Tokenizer's unk_token, say); templates rarely read those.
    """
    if model_dir is None:
        return None
    config_path = os.path.join(model_dir, "tokenizer_config.json")
    config = _read_json(config_path)
    source = None
    jinja_path = os.path.join(model_dir, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            source = f.read()
    else:
        source = config.get("chat_template")
        if isinstance(source, list):
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            if not isinstance(named.get("default"), str):
                raise ValueError(f"{config_path}: chat_template is a list without a 'default' template "
                                 f"(it holds {sorted(map(str, named))})")
            source = named["default"]
    if not isinstance(source, str) or not source:
        return None
    legacy = _read_json(os.path.join(model_dir, "special_tokens_map.json"))
    special = {k: legacy[k] for k in SPECIAL_TOKEN_NAMES if k in legacy}
    special.update({k: config[k] for k in SPECIAL_TOKEN_NAMES if k in config})
    special = {k: t for k, v in special.items() if (t := _token_text(v)) is not None}
    return ChatTemplate(source=source, special=special)


def default_format(model_dir: str | None) -> str:
    """"chat" when the checkpoint has a chat template, else "completion". (Base checkpoints that
    ship a template, as Qwen2.5's do, get "chat" too: pass the format by name to override.)"""
    return "chat" if load_chat_template(model_dir) is not None else "completion"


def prompt_format(model_dir: str | None, fmt: str = "") -> tuple[str, ChatTemplate | None]:
    """(format, chat template or None) for a checkpoint: `fmt` if given, else default_format; "chat"
    for a checkpoint without a template is refused."""
    fmt, template = fmt or default_format(model_dir), load_chat_template(model_dir)
    if fmt == "chat" and template is None:
        raise ValueError(f"--prompt-format chat: the checkpoint {model_dir!r} has no chat template "
                         f"(tokenizer_config.json chat_template or chat_template.jinja)")
    return fmt, template


@functools.lru_cache(maxsize=16)
def _compile(source: str):
    """The template compiled in a jinja environment set up as transformers sets up its own for
    apply_chat_template, so the same template renders the same text: a sandbox that cannot mutate
    objects, trim_blocks and lstrip_blocks, {% break %}/{% continue %}, a no-op {% generation %}
    block (_generation_block), transformers' tojson filter (_tojson) and the names of
    _template_globals."""
    import jinja2.ext
    import jinja2.sandbox

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_generation_block(), jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(_template_globals())
    return env.from_string(source)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """The templates' tojson filter as transformers defines it: JSON without HTML escaping, non-ASCII kept."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _generation_block():
    """The jinja extension of {% generation %}...{% endgeneration %} (templates that mark assistant
    text for training masks): it renders its body unchanged."""
    import jinja2.ext
    import jinja2.nodes

    class GenerationBlock(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()
    return GenerationBlock


def _template_globals() -> dict:
    """The names a template may use besides jinja's own: raise_exception, strftime_now, and dict and
    namespace, restricted so a template cannot reach Python internals through them."""
    import jinja2
    import jinja2.utils

    class Namespace(jinja2.utils.Namespace):
        """jinja's namespace(), refusing attribute names that start with an underscore."""

        def __init__(*args, **kwargs):  # jinja's own signature trick: namespace(self=1) still works
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template cannot set {name!r} on a namespace")

    class Dict:
        """dict() and dict.fromkeys() for templates, without exposing the dict type itself."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)
    return {"raise_exception": raise_exception, "strftime_now": lambda fmt: datetime.datetime.now().strftime(fmt),
            "dict": Dict(), "namespace": Namespace}


def render_chat(template: ChatTemplate, messages: list[dict], add_generation_prompt=True) -> str:
    """The conversation as text, rendered exactly as transformers' apply_chat_template(messages,
    add_generation_prompt=..., tokenize=False) renders it for the same checkpoint: the same template
    variables (messages, tools=None, documents=None, add_generation_prompt and the named special
    tokens as strings) in the same environment (_compile). Each message is prepared as transformers
    prepares it: keys whose value is None are dropped, and reasoning given under any of its names
    (reasoning_content, thinking, reasoning) is also passed as reasoning_content and thinking, the
    names templates read."""
    messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
    for i, m in enumerate(messages):
        reasoning = next((m[k] for k in ("reasoning_content", "thinking", "reasoning") if k in m), None)
        if reasoning is not None:
            messages[i] = {"thinking": reasoning, **m, "reasoning_content": reasoning}
    special = {k: t for k, v in template.special.items()
               if k in SPECIAL_TOKEN_NAMES and (t := _token_text(v)) is not None}
    return _compile(template.source).render(messages=messages, tools=None, documents=None,
                                            add_generation_prompt=add_generation_prompt, **special)


# ============================================================================ the text the model sees

_ANSWER_IN_ONE_BLOCK = "Put the complete program in one ```python code block."
_IO_HEADER = ("# Solve the following problem with a Python program that reads from standard input\n"
              "# and writes to standard output.\n")


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"prompt format must be one of {FORMATS}, got {fmt!r}")


def _fenced(code: str) -> str:
    """code in a ```python block (with the newline a closing fence needs)."""
    return "```python\n" + code + ("" if code.endswith("\n") else "\n") + "```"


def comment_header(statement: str) -> str:
    """A statement as Python comments: "# " before each line ("#" alone for a blank one), under the
    two fixed lines of _IO_HEADER; always valid Python (see the module docstring)."""
    text = statement.replace("\0", "").encode("utf-8", "replace").decode("utf-8")
    lines = text.splitlines()  # splits at \n, \r\n and a lone \r (and a few more: harmless in comments)
    return _IO_HEADER + "#\n" + "".join(("# " + line if line.strip() else "#") + "\n" for line in lines)


_MATH_ASK = {"hash": "Reason step by step, then give the final answer on its own line after '####'.",
             "boxed": "Reason step by step, then put the final answer in \\boxed{}."}


def user_message(problem) -> str:
    """The chat format's user message: an instruction sentence, the problem, the answer format."""
    if problem.style == "math":
        return f"{problem.prompt.strip()}\n\n{_MATH_ASK[problem.answer_format]}"
    if problem.style == "reward":
        return problem.prompt
    if problem.style == "io":
        return ("Solve the following programming problem in Python. The program must read from "
                "standard input and write to standard output.\n\n"
                f"{(problem.statement or problem.prompt).strip()}\n\n{_ANSWER_IN_ONE_BLOCK}")
    if problem.style == "mbpp":
        test = (f"Your code should pass this test:\n\n{_fenced(problem.shown_test.strip())}\n\n"
                if problem.shown_test.strip() else "")
        return f"{(problem.statement or problem.prompt).strip()}\n\n{test}{_ANSWER_IN_ONE_BLOCK}"
    what = "code" if problem.style == "asserts" else "function"
    return (f"Complete the following Python {what}. Answer with the whole program: its imports, every "
            f"function shown (helpers included) and yours completed.\n\n{_fenced(problem.prompt)}\n\n"
            f"{_ANSWER_IN_ONE_BLOCK}")


STAND_IN = "\u2063TURN\u2063"
"""The content of the stand-in assistant turn rendered to find what a template puts after an assistant
turn (invisible separators: no template treats them specially, no real answer holds them)."""


def end_of_turn_id(template: ChatTemplate, tokenizer) -> int | None:
    """The token that closes an assistant turn under this template, found by rendering a one-turn
    conversation with a stand-in answer: the first token of the text after the answer, when it is a
    special token of the tokenizer ("<|im_end|>" for ChatML and Qwen3, "<|eot_id|>" for Llama 3,
    "<end_of_turn>" for Gemma). None when that text starts with no special token (a template that
    closes a turn with plain text): such a model's turns end only at its eos ids."""
    text = render_chat(template, [{"role": "user", "content": "."}, {"role": "assistant", "content": STAND_IN}],
                       add_generation_prompt=False)
    if text.count(STAND_IN) != 1:
        return None
    after = text[text.index(STAND_IN) + len(STAND_IN):]
    ids = tokenizer.encode(after)
    first = tokenizer.special_text(ids[0]) if ids else None
    return ids[0] if first is not None and after.startswith(first) else None


def next_turn_text(template: ChatTemplate, content: str, end_of_turn: str) -> str:
    """The text that follows an assistant turn the model closed with its end-of-turn token (whose own
    string is `end_of_turn`, tokenizer.special_text) when a user message `content` comes next and the
    assistant answers again: what the template renders between the two, with the same template
    variables as render_chat.

    Found by rendering [user, assistant(STAND_IN), user(content)] with the generation prompt and taking
    the text after STAND_IN + end_of_turn. Only the new messages are read off the rendering, never the
    earlier ones: templates that re-render history differently once a conversation grows (Qwen3 drops
    the reasoning of turns before the last user message) still give the right text, and the model's own
    tokens stay exactly as sampled. ValueError, with the reason, for a template that does not close the
    stand-in turn with end_of_turn (check_multi_turn runs this once at start)."""
    messages = [{"role": "user", "content": "."}, {"role": "assistant", "content": STAND_IN},
                {"role": "user", "content": content}]
    text = render_chat(template, messages, add_generation_prompt=True)
    head = STAND_IN + (end_of_turn or "\0")
    if text.count(STAND_IN) != 1 or head not in text:
        raise ValueError(f"the chat template does not close an assistant turn with {end_of_turn!r} when a user "
                         f"message follows (it renders the turn as {text[text.find(STAND_IN):][:80]!r}), so the "
                         f"text between two turns cannot be read off it")
    return text[text.index(head) + len(head):]


def check_multi_turn(template: ChatTemplate | None, tokenizer) -> int:
    """Refuse, at start, a checkpoint whose chat template cannot carry several turns token in, token
    out: no template, no special token closing an assistant turn, or no user message rendered after
    it. Returns the end-of-turn token id (the one after which a tool's output may follow)."""
    if template is None:
        raise ValueError("several turns need the checkpoint's chat template (it has none)")
    eot = end_of_turn_id(template, tokenizer)
    if eot is None:
        raise ValueError("the chat template closes an assistant turn with no special token, so a turn's end "
                         "cannot be told from the model's text: several turns need one (ChatML's <|im_end|>, "
                         "Llama 3's <|eot_id|>)")
    tail = next_turn_text(template, "Output:\n42", tokenizer.special_text(eot))
    if "Output:\n42" not in tail:
        raise ValueError(f"the chat template drops a user message that follows an assistant turn ({tail!r})")
    return eot


def model_prompt(problem, fmt: str, template: ChatTemplate | None = None, system: str = "") -> str:
    """The text the model continues: completion format, the program prefix; chat format, the user
    message rendered with the checkpoint's chat template up to the assistant's turn (after a system
    message `system`, if given and the row has none of its own)."""
    _check_format(fmt)
    if fmt == "completion":
        return program_prefix(problem, fmt)
    if template is None:
        raise ValueError(f"problem {problem.item_id!r}: the chat format needs the checkpoint's chat "
                         f"template (load_chat_template found none)")
    messages = json.loads(problem.messages) if getattr(problem, "messages", "") else \
        [{"role": "user", "content": user_message(problem)}]
    if system and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system}] + messages
    return render_chat(template, messages, add_generation_prompt=True)


def program_prefix(problem, fmt: str) -> str:
    """What goes before the completion in the program. completion format: the problem's prompt for
    assert problems, the statement as a comment header for stdin/stdout ones; chat format: ""
    (the answer's code block is the whole program)."""
    _check_format(fmt)
    if fmt == "chat":
        return ""
    if problem.kind == "math":
        return f"Question: {problem.prompt.strip()}\n{_MATH_ASK[problem.answer_format]}\nAnswer:"
    return comment_header(problem.prompt) if problem.kind == "io" else problem.prompt


def stop_strings(problem, fmt: str) -> tuple:
    """completion format: the problem's stop strings; chat format: none (the sampler stops at the
    end-of-turn token, and a code block may hold anything a stop string would match)."""
    _check_format(fmt)
    return tuple(problem.stop) if fmt == "completion" else ()


# ============================================================================ from an answer to a program

_FENCE = re.compile(r"([ \t]*)(`{3,})[ \t]*([^`\s]*)[^\n]*\n?\Z")
PYTHON_LABELS = ("python", "py", "python3")  # a block with one of these labels is Python (envs read them too)


def fenced_blocks(answer: str):
    """Every fenced block as (label, content), in order (the rule in the module docstring); the label
    lowercased, "" when the fence has none."""
    lines = re.findall(r"[^\n]*\n|[^\n]+\Z", answer)
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, label = len(m.group(1).expandtabs()), len(m.group(2)), m.group(3).lower()
        body, i = [], i + 1
        while i < len(lines):
            s = lines[i].strip()
            if s and set(s) == {"`"} and len(s) >= ticks:
                break
            line = lines[i]
            strip = len(line) - len(line.lstrip(" "))
            body.append(line[min(strip, indent):])
            i += 1
        yield label, "".join(body)
        i += 1  # past the closing fence (or the end)


def extract_code(answer: str) -> str:
    """The program in a chat answer: the first ```python/```py/```python3 block, else the first
    unlabelled block, else the whole answer (the full rule is in the module docstring)."""
    unlabelled = None
    for label, content in fenced_blocks(answer):
        if label in PYTHON_LABELS:
            return content
        if label == "" and unlabelled is None:
            unlabelled = content
    return answer if unlabelled is None else unlabelled


def cut_at_stop(text: str, stop: tuple) -> str:
    """Cut `text` at the earliest occurrence of any stop string, keeping only the stop string's
    leading whitespace: "\n" is kept (it ends the line), and "\ndef " leaves the text ending with
    its newline, not with "def " (a program ending in a keyword is a syntax error). Without a stop
    string in it, the text is returned whole."""
    hits = [(i, s) for s in stop if s and (i := text.find(s)) >= 0]
    if not hits:
        return text
    i, s = min(hits, key=lambda h: (h[0], -len(h[1])))
    return text[:i] + s[:len(s) - len(s.lstrip())]


def assemble_program(fmt: str, prefix: str, completion: str, stop: tuple) -> str:
    """THE program the verifier runs for a completion. completion format: prefix + the completion
    cut at its first stop string (cut_at_stop); chat format: extract_code(completion) (prefix
    and stop are "" and () there)."""
    _check_format(fmt)
    if fmt == "completion":
        return prefix + cut_at_stop(completion, tuple(stop))
    return extract_code(completion)


def whole_program(problem, solution: str) -> str:
    """A reference solution as a whole program: the code prompt + the solution for problems whose
    prompt is the start of the program; MBPP's code and stdin/stdout solutions are whole already."""
    return solution if problem.style in ("mbpp", "io") else problem.prompt + solution


def reference_completions(problem, fmt: str) -> list[str]:
    """The problem's reference solutions as the model would have written them. completion format:
    the text after the prompt (HumanEval's canonical_solution, MBPP's code, the whole program of a
    stdin/stdout problem); chat format: the whole program in a ```python block with a sentence of
    prose around it. Empty when the dataset gives no solution."""
    _check_format(fmt)
    if fmt == "completion":
        return list(problem.solutions)
    return [f"Here is a complete solution.\n\n{_fenced(whole_program(problem, s))}\n\n"
            f"The block above is the whole program." for s in problem.solutions]
