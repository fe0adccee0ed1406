"""workitems.py: a problem as a work item, in one place: the text the model sees (as the item's
environment writes it, envs.Env.prompt), how many tokens that is, the row length T of a dataset,
whether a prompt fits, and the item itself (wire.WorkItem).

The trainer makes the items it feeds (and measures its dataset with fit_seq_len), curate.py samples
the same items as the trainer would, and the inference worker checks with `fits` what it leases.
"""
from __future__ import annotations

import envs
import prompts
import tasks
import wire


def prompt_text(problem: tasks.Problem, fmt: str, template=None, env: str = "") -> str:
    """The text the model continues for `problem`: as its environment writes it (envs.Env.prompt:
    prompts.model_prompt with the env's system message; "": the single-turn task's)."""
    return envs.get(env).prompt(problem, fmt, template)


def prompt_len(tokenizer, problem: tasks.Problem, fmt: str, template=None, env: str = "") -> int:
    """Tokens of prompt_text (its chat rendering in the chat format)."""
    return len(tokenizer.encode(prompt_text(problem, fmt, template, env)))


def fits(prompt_tokens: int, T: int, max_new_tokens: int) -> bool:
    """Whether a prompt of prompt_tokens tokens leaves room for max_new_tokens in a row of T."""
    return 0 < prompt_tokens <= T - max_new_tokens


def problem_item(problem: tasks.Problem, item_id: str, cfg, G: int, T: int, version: int,
                 evaluate: bool = False, lineage: str = "", temperature: float | None = None,
                 fmt: str = "completion", template=None) -> wire.WorkItem:
    """A work item: everything a worker needs to sample and verify one group: the text the model
    continues and how to build the program from its completion (prompts.py), the tests, the settings."""
    return wire.WorkItem(
        item_id=item_id, prompt=prompt_text(problem, fmt, template, cfg.env),
        env=cfg.env, max_turns=cfg.max_turns if cfg.env else 1,
        prompt_format=fmt, program_prefix=prompts.program_prefix(problem, fmt),
        partial_reward=cfg.partial_reward and problem.kind == "io" and not evaluate,
        tests=problem.tests, entry_point=problem.entry_point or "", answer=problem.answer,
        answer_format=problem.answer_format, row=problem.row,
        kind=problem.kind, cases=[list(c) for c in problem.cases] if problem.kind == "io" else [],
        group_size=G, seq_len=T, max_new_tokens=cfg.max_new_tokens, min_version=version,
        temperature=cfg.temperature if temperature is None else temperature, top_p=cfg.top_p,
        stop=list(prompts.stop_strings(problem, fmt)), eval=evaluate, lineage=lineage,
        seed=getattr(cfg, "seed", -1))


SEQ_LEN_MIN = 64


def fit_seq_len(prompt_lens: list, max_new_tokens: int, max_seq_len: int) -> int:
    """T for a dataset: the longest prompt plus the generation budget, rounded up to a power of two (at
    least SEQ_LEN_MIN) so that datasets of similar lengths share compiled programs, and at most the
    model's max_seq_len (longer prompts are then skipped, each with the fate skipped_too_long)."""
    need = max(prompt_lens, default=1) + max_new_tokens
    return min(max_seq_len, max(SEQ_LEN_MIN, 1 << (need - 1).bit_length()))
