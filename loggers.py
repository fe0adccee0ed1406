"""Metric writers where RL users look at runs: TensorBoard and Weights & Biases.

metrics.jsonl stays the run's record; these are copies of it for the usual dashboards, under the same
names (reward/mean, eval/pass@1, mismatch/bitwise_frac, ...). Only finite numeric scalars are written
(a bool, a string, an array or a NaN is skipped).

    writers = make_writers("tensorboard,wandb", run_dir, config)   # trainer.py --log-to
    for w in writers: w.write(step, metrics)
    for w in writers: w.close()

  tensorboard: event files in RUN_DIR/tensorboard (`tensorboard --logdir RUN_DIR/tensorboard`), written
               with tensorboardX (pip install tensorboardX): protobuf only, no TensorFlow, no torch.
  wandb:       a W&B run in RUN_DIR/wandb (pip install wandb). WANDB_MODE says where it goes: "offline"
               (the default here: nothing leaves the machine; `wandb sync RUN_DIR/wandb/offline-run-*`
               uploads it later), "online" (needs `wandb login`), "disabled". WANDB_PROJECT names the
               project (default rlax-grpo); the run is named after the run dir.
Both are optional extras: asking for one whose package is missing is an error naming the package.
"""
from __future__ import annotations

import json
import math
import numbers
import os

import numpy as np

KINDS = ("tensorboard", "wandb")


def scalars(metrics: dict) -> dict:
    """The numeric scalars of a metrics dict, as floats, names unchanged (bools, strings, arrays and
    non-finite numbers are left out: dashboards cannot plot them usefully)."""
    out = {}
    for name, value in metrics.items():
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value.item()
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            continue
        if math.isfinite(float(value)):
            out[name] = float(value)
    return out


class MissingPackage(ImportError):
    """A writer was asked for whose package is not installed; the message names the pip package."""


def _need(package: str, kind: str):
    try:
        return __import__(package)
    except ImportError as e:
        raise MissingPackage(f"--log-to {kind} needs the {package} package: pip install {package} ({e})") from e


class TensorBoardWriter:
    """Scalars to RUN_DIR/tensorboard (tensorboardX's FileWriter); the config once, as text. The Summary
    protos are built here because tensorboardX's add_scalar rewrites tags ("eval/pass@1" -> "eval/pass_1")."""

    def __init__(self, run_dir: str, config: dict):
        tbx = _need("tensorboardX", "tensorboard")
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.summary import text
        self.Summary, self.logdir = Summary, os.path.join(run_dir, "tensorboard")
        self.writer = tbx.FileWriter(self.logdir, flush_secs=10)
        if config:
            self.writer.add_summary(text("config", "```\n" + json.dumps(config, indent=1, default=str) + "\n```"), 0)

    def write(self, step: int, metrics: dict) -> None:
        values = [self.Summary.Value(tag=name, simple_value=value) for name, value in scalars(metrics).items()]
        if values:
            self.writer.add_summary(self.Summary(value=values), int(step))
            self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbWriter:
    """A W&B run in RUN_DIR/wandb; mode from WANDB_MODE (default offline)."""

    def __init__(self, run_dir: str, config: dict):
        wandb = _need("wandb", "wandb")
        os.makedirs(run_dir, exist_ok=True)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "rlax-grpo"),
                              name=os.path.basename(os.path.abspath(run_dir)), dir=run_dir,
                              mode=os.environ.get("WANDB_MODE", "offline"), config=config or {},
                              settings=wandb.Settings(console="off", silent=True))
        self.dir = getattr(self.run, "dir", "")

    def write(self, step: int, metrics: dict) -> None:
        values = scalars(metrics)
        if values:
            self.run.log(values, step=int(step))

    def close(self) -> None:
        self.run.finish()


def make_writers(spec: str, run_dir: str, config: dict) -> list:
    """Writers for spec "" (none), "tensorboard", "wandb" or "tensorboard,wandb" (any order)."""
    kinds = [k.strip() for k in (spec or "").split(",") if k.strip()]
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"--log-to {spec!r}: unknown writer {kind!r} (writers: {', '.join(KINDS)})")
    made = {"tensorboard": TensorBoardWriter, "wandb": WandbWriter}
    return [made[kind](run_dir, config) for kind in dict.fromkeys(kinds)]
