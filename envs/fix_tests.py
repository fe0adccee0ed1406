"""envs/fix_tests.py: ENV=fix_tests, "fix the failing test": a second try at a code task, with the failure.

  turn 1   the model writes the program (the task's prompt, after a system message saying how the
           episode goes)
  step     the verifier fleet runs it against the problem's tests: the job the reward comes from
           (Env.score_job), so "fails" means what a reward of 0 means
  turn 2   only if it failed: the verdict's status and detail (the first failing assertion; for a
           stdin/stdout task the case, what it expected and what was printed; or the error's last
           line; cut to OBSERVATION_CHARS) are the next user message, and the model writes the
           program again
  reward   the final turn's program, scored by the same job (Env.score_job, in the worker's finish)

A program that passes at once ends the episode after one turn. A verifier that could not run the
program (infra_error) ends it too: the model is never asked to fix what nobody checked, and the
final verdict says what happened. env/turns_mean is 1 + the share of first programs that failed;
env/tool_calls_mean counts the failures shown.

Its test: tests/test_env_fix_tests.py.
"""
from __future__ import annotations

from envs import OBSERVATION_CHARS, Env
from verdicts import INFRA_ERROR

SYSTEM = ("Write the program in one ```python block. It is run against hidden tests; if it fails, you are "
          "shown the failure and may write the whole program again, fixed.")


class FixTests(Env):
    name = "fix_tests"
    system = SYSTEM

    def step(self, episodes: list, verify) -> list:
        """After the first turn: each row's program against its tests, in one batch; a failure's
        verdict (status: detail) is the observation, a pass or an unchecked program ends the episode.
        After the second turn: done."""
        first = [e for e in episodes if e.turns == 1]
        verdicts = iter(verify([self.score_job(e.item, e.final_text) for e in first]) if first else [])
        outputs = []
        for e in episodes:
            v = next(verdicts) if e.turns == 1 else None
            failed = v is not None and not v.passed and v.status != INFRA_ERROR
            outputs.append(f"{v.status}: {v.detail}" if failed else None)
        return outputs

    def observation(self, output: str, chars: int = OBSERVATION_CHARS) -> str:
        failure = output if len(output) <= chars else output[:chars] + " [... cut]"
        return (f"Your program failed its tests.\n{failure}\n"
                "Write the whole program again, fixed, in one ```python block.")
