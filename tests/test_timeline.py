"""timeline.py: the roles' spans of work, as the timeline figure and the step breakdown read them."""
import json
import time

import timeline


def test_spans_are_written_read_in_order_and_summed(tmp_path):
    t = timeline.Timeline(str(tmp_path / "timeline" / "worker-1.jsonl"), "worker-1")
    with t.span("sample", version=3) as span:
        time.sleep(0.02)
        span["tokens"] = 17
    t.add("verify", 100.0, 100.5, version=3)
    trainer = timeline.Timeline(str(tmp_path / "timeline" / "trainer.jsonl"), "trainer")
    trainer.add("train", 50.0, 52.0, step=1)
    with open(tmp_path / "timeline" / "trainer.jsonl", "a") as f:
        f.write('{"role": "trainer", "span": "pu')  # a role killed mid-line
    spans = timeline.read(str(tmp_path))
    assert [s["span"] for s in spans] == ["train", "verify", "sample"]  # sorted by start
    sample = spans[-1]
    assert sample["tokens"] == 17 and sample["version"] == 3 and sample["end"] - sample["start"] >= 0.02
    totals = timeline.totals(spans)
    assert totals[("trainer", "train")] == 2.0 and totals[("worker", "verify")] == 0.5
    assert set(json.loads(open(tmp_path / "timeline" / "worker-1.jsonl").readline())) == {
        "role", "span", "start", "end", "version", "tokens"}


def test_no_path_writes_nothing(tmp_path):
    t = timeline.Timeline("", "trainer")
    with t.span("train"):
        pass
    assert timeline.read(str(tmp_path)) == []
