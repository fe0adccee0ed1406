"""loggers.py: metrics written to TensorBoard and W&B (offline) arrive under their names, with their values.

Each writer's output is read back from disk: the TensorBoard event file (TFRecord framing, Event protos
of tensorboardX) and the W&B offline run's run-*.wandb file (LevelDB log framing, Record protos of
wandb), so the test needs neither TensorFlow nor a network.
"""
import glob
import json
import os
import struct

import numpy as np
import pytest

import loggers

STEPS = {0: {"reward/mean": 0.25, "eval/pass@1": 0.5, "staleness/max": 0},
         1: {"reward/mean": 0.375, "mismatch/bitwise_frac": 1.0, "loss/total": np.float32(-0.125)},
         2: {"reward/mean": 0.5, "eval/pass@8": 0.75, "rollouts/trained": 12}}
SKIPPED = {"note": "text", "flag": True, "array": np.zeros(3), "nan": float("nan")}


def expected():
    return {(step, k): float(v) for step, m in STEPS.items() for k, v in m.items()}


def write_steps(writers):
    for step, metrics in STEPS.items():
        for w in writers:
            w.write(step, {**metrics, **SKIPPED})
    for w in writers:
        w.close()


def read_tensorboard(logdir) -> dict:
    """{(step, tag): value} of every scalar in the event files (TFRecord: length, crc, data, crc)."""
    from tensorboardX.proto import event_pb2
    out = {}
    for path in glob.glob(os.path.join(logdir, "events.out.tfevents.*")):
        data, pos = open(path, "rb").read(), 0
        while pos + 12 <= len(data):
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
            pos += 12 + n + 4
            for v in event.summary.value:
                if v.WhichOneof("value") == "simple_value":
                    out[(event.step, v.tag)] = v.simple_value
    return out


def read_wandb(run_dir) -> tuple[dict, dict]:
    """({(step, key): value} of the history rows, the run's config) from an offline run-*.wandb file:
    a LevelDB log (32 KiB blocks of records with a 7-byte header: crc32c, length, type) of wandb Records."""
    from wandb.proto import wandb_internal_pb2 as pb
    (path,) = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    data, block, pos, buf, records = open(path, "rb").read(), 32768, 7, b"", []  # 7: the W&B file header
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and n == 0:
            break
        buf, pos = buf + data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):  # FULL or LAST: a whole record
            records.append(pb.Record.FromString(buf))
            buf = b""
    history, config = {}, {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            history.update({(row["_step"], k): v for k, v in row.items() if not k.startswith("_")})
        elif r.WhichOneof("record_type") == "config":
            config.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.config.update})
        elif r.WhichOneof("record_type") == "run":
            config.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.run.config.update})
    return history, config


def test_scalars_keeps_numbers_only():
    assert loggers.scalars({"a": 1, "b": np.float32(0.5), "c": np.array(2.0), **SKIPPED}) == {"a": 1.0, "b": 0.5, "c": 2.0}


def test_no_writers_and_unknown_writer():
    assert loggers.make_writers("", "unused", {}) == []
    with pytest.raises(ValueError, match="unknown writer 'mlflow'"):
        loggers.make_writers("tensorboard,mlflow", "unused", {})


def test_tensorboard_and_wandb_offline_receive_names_and_values(tmp_path, monkeypatch):
    """One run with both writers (one W&B start: the slow part); each one's files read back."""
    pytest.importorskip("tensorboardX")
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    writers = loggers.make_writers("wandb, tensorboard", str(tmp_path), {"lr": 1e-4, "max_staleness": 2})
    assert [type(w).__name__ for w in writers] == ["WandbWriter", "TensorBoardWriter"]
    write_steps(writers)
    assert read_tensorboard(tmp_path / "tensorboard") == pytest.approx(expected())
    history, config = read_wandb(tmp_path)
    assert history == pytest.approx(expected())
    assert config.get("max_staleness") in (2, {"value": 2})


def test_missing_package_names_it(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(ImportError, match="pip install wandb"):
        loggers.make_writers("wandb", "unused", {})
