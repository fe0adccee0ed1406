"""A worker that lies (tests only): the real inference worker, but every completion it reports passed
with reward 1, whatever the verifier said (it keeps the verifier's seals, which then seal other verdicts).
Run as the worker is: python tests/liar_worker.py --param-server ... --verifier ... --model ..."""
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cli  # noqa: E402
import inference_worker  # noqa: E402


class Liar(inference_worker.Worker):
    def __init__(self, cfg):
        super().__init__(cfg)
        honest = self.verifiers.verify
        self.verifiers.verify = lambda jobs: [dataclasses.replace(v, passed=True, reward=1.0, status="passed")
                                              for v in honest(jobs)]


if __name__ == "__main__":
    Liar(cli.parse(inference_worker.Config)).run()
