"""Span and trace ids never come from the ``random`` module's global state (``otel_training/_ids.py``).

Training scripts seed it (every rank and every run would draw the same ids) and ``torch.compile`` restores it
after tracing (ids another thread drew meanwhile came again: two spans with one id, one counted lost).
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
from environ import child_environ
from otlp_json import read_spans

from otel_training._ids import PrivateIdGenerator, getrandbits

REPO = Path(__file__).resolve().parent.parent

SEEDED = """
import random, sys, otel_training
random.seed(0)  # as a training script seeds for reproducibility
otel_training.configure(exporter="file", output_dir=sys.argv[1], offload=sys.argv[2] == "1", signal_hooks=False)
trainer = otel_training.TrainerProcess()
with trainer.train():
    with trainer.step(global_step=0):
        pass
"""


def test_restoring_the_global_random_state_does_not_repeat_our_ids() -> None:
    ids = PrivateIdGenerator()
    state = random.getstate()  # what torch.compile does around a traced frame
    first = (ids.generate_trace_id(), ids.generate_span_id(), getrandbits(64))
    random.setstate(state)
    second = (ids.generate_trace_id(), ids.generate_span_id(), getrandbits(64))
    assert all(a != b for a, b in zip(first, second))


@pytest.mark.parametrize(("offload", "native"), [(False, "on"), (True, "off"), (True, "on")],
                         ids=["in-process", "offloaded-fallback", "offloaded-native"])
def test_two_processes_that_seed_random_alike_still_get_their_own_ids(tmp_path: Path, offload: bool,
                                                                        native: str) -> None:
    env = child_environ()
    env.update(PYTHONPATH=str(REPO), OTEL_TRAINING_NATIVE=native)
    ids = []
    for run in ("a", "b"):
        out = tmp_path / run
        done = subprocess.run([sys.executable, "-c", SEEDED, str(out), "1" if offload else "0"], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        spans = read_spans(out / "traces-r0.jsonl")
        assert len(spans) == 2
        ids.append({(span["trace_id"], span["span_id"]) for span in spans})
    assert not ids[0] & ids[1] and len({trace for trace, _ in ids[0] | ids[1]}) == 2
