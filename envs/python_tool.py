"""envs/python_tool.py: ENV=python_tool, a Python interpreter the model may call between its turns.

A system message tells the model it may run Python. When a model turn ends (its end-of-turn token)
holding a ```python block, the verifier fleet runs the block (a "run" job: the program alone, no
stdin, the item's time limit, the sandbox's other limits as a test run's) and what it printed comes
back as the next user message ("Output:\n..."); the model answers again, up to --max-turns turns. A
turn without a python block ends the episode. The last turn is scored by the task's own job (the
math answer, the code's tests, your reward function): Env.score_job, unchanged.

Run the tests:  python -m pytest -q tests/test_envs.py -k "episode or tool"
"""
from __future__ import annotations

import prompts
from envs import Env
from verdicts import INFRA_ERROR

TOOL_SYSTEM = ("You can run Python. To run code, write one ```python code block; what it prints comes back to "
               "you in the next message. When you know the answer, give it without a code block.")
UNAVAILABLE = "[the tool is unavailable]"  # what the model reads when no verifier could run its code


def tool_code(turn_text: str) -> str | None:
    """The program a model turn asks to run: its last ```python block, or None."""
    blocks = [content for label, content in prompts.fenced_blocks(turn_text) if label in prompts.PYTHON_LABELS]
    return blocks[-1] if blocks else None


class PythonTool(Env):
    name = "python_tool"
    system = TOOL_SYSTEM

    def step(self, episodes: list, verify) -> list:
        """Each row's last python block, run on the verifier fleet in one batch: its output (the run
        verdict's detail: what it printed, then the status and stderr's last line if it did not exit
        cleanly) is the observation; a row with no python block is done."""
        codes = [tool_code(e.final_text) for e in episodes]
        calls = [{"kind": "run", "program": code, "timeout_s": e.item.timeout_s}
                 for e, code in zip(episodes, codes) if code is not None]
        verdicts = iter(verify(calls) if calls else [])
        outputs = []
        for code in codes:
            v = next(verdicts) if code is not None else None
            outputs.append(None if v is None else v.detail if v.status != INFRA_ERROR else UNAVAILABLE)
        return outputs
