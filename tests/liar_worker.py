"""Workers that lie (tests only): the real inference worker with one lie, chosen by RLAX_LIE:

  reward  every completion reported passed with reward 1, whatever the verifier said (the verifier's seals
          kept: they seal other verdicts)
  logp    the behaviour log-probs reported 0.01 higher than the sampler's
  seed    the rows drawn from keys of its own choosing (another seed): real samples of the policy, their
          true log-probs, texts and sealed verdicts, but not the draws the trainer asked for (cherry-picking)

Run as the worker is: RLAX_LIE=reward python tests/liar_worker.py --param-server ... --verifier ... --model ..."""
import dataclasses
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cli  # noqa: E402
import inference_worker  # noqa: E402

LIE = os.environ.get("RLAX_LIE", "reward")


class Liar(inference_worker.Worker):
    def __init__(self, cfg):
        super().__init__(cfg)
        if LIE == "reward":
            honest = self.verifiers.verify
            self.verifiers.verify = lambda jobs: [dataclasses.replace(v, passed=True, reward=1.0, status="passed")
                                                  for v in honest(jobs)]

    def sample_and_submit(self, items):
        if LIE == "seed":
            items = [dataclasses.replace(i, seed=i.seed + 7) for i in items]
        return super().sample_and_submit(items)

    def finish(self, items, samples, *args, **kwargs):
        if LIE == "logp":
            samples = dataclasses.replace(samples, logp_behav_RT=samples.logp_behav_RT + np.float32(0.01) * samples.mask_RT)
        return super().finish(items, samples, *args, **kwargs)


if __name__ == "__main__":
    assert LIE in ("reward", "logp", "seed"), LIE
    Liar(cli.parse(inference_worker.Config)).run()
