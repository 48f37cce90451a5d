"""``otel-training demo``: a small training loop, instrumented, on the embedded default.

Plain Python, no ML framework: a linear model fitted by SGD on synthetic data,
with init, dataset loading, epochs, steps, gradient-accumulation substeps,
evaluation and checkpoints, so every part of the trace layout shows up.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from otel_training.cli.args import seconds, whole


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("demo", help="run a small instrumented training loop and summarise its trace")
    parser.add_argument("--epochs", type=whole("epochs"), default=2, help="epochs to train (default: %(default)s)")
    parser.add_argument("--steps", type=whole("steps"), default=20, help="steps per epoch (default: %(default)s)")
    parser.add_argument("--accumulation", type=whole("substeps"), default=2, help="substeps per step (default: %(default)s)")
    parser.add_argument("--step-time", type=seconds(zero=True), default=0.02, help="seconds of work per step (default: %(default)s)")
    parser.add_argument("--output-dir", default=None, help="trace directory (default: ./otel-traces)")
    parser.add_argument("--exporter", default=None, help="otlp, file, console or none (default: from the environment)")
    parser.add_argument("--no-stuck", dest="stuck", action="store_false",
                        help="do not inject a stuck step (by default one step hangs past the stuck threshold)")
    parser.add_argument("--stuck-threshold", type=seconds(), default=0.5,
                        help="stuck-step threshold in seconds (default: %(default)s)")
    parser.set_defaults(handler=run)


class _Summary(SpanProcessor):
    """Counts spans by name and times steps, whatever the exporter."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.step_ns: list[int] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        self.counts[span.name] += 1
        if span.name == "training.step" and span.end_time and span.start_time:
            self.step_ns.append(span.end_time - span.start_time)


def _work(seconds: float, weights: list[float], batch: list[tuple[list[float], float]], lr: float) -> float:
    """One SGD update of a linear model, padded to ``seconds`` of wall time."""
    deadline = time.perf_counter() + seconds
    loss = 0.0
    for features, target in batch:
        error = sum(w * x for w, x in zip(weights, features)) - target
        loss += error * error
        for index, x in enumerate(features):
            weights[index] -= lr * error * x / len(batch)
    while time.perf_counter() < deadline:
        pass
    return loss / len(batch)


#: The step the demo makes hang (not the first: the first step of a name gets a warm-up allowance).
STUCK_STEP = 3


def _print_alert(event: Any) -> None:
    """Show the stuck detector's alerts as they happen (they are in the trace file too)."""
    step = event.attributes.get("training.step")
    print(f"ALERT {event.kind}: {event.span_name} (step {step}) open {event.elapsed_s:.2f} s, "
          f"threshold {event.threshold_s:.2f} s ({event.threshold_source})", flush=True)


def train(args: argparse.Namespace, trainer: Any, checkpoint_dir: Path) -> int:
    """The demo loop; returns the number of steps run."""
    rng = random.Random(0)
    true_weights = [0.5, -1.0, 2.0]
    trainer.start(epochs=args.epochs, steps_per_epoch=args.steps)
    with trainer.init():
        weights = [0.0, 0.0, 0.0]
    with trainer.load_dataset(samples=args.epochs * args.steps * 8):
        data = []
        for _ in range(args.steps * 8):
            features = [rng.uniform(-1, 1) for _ in true_weights]
            data.append((features, sum(w * x for w, x in zip(true_weights, features))))
    global_step = 0
    with trainer.train():
        for epoch in range(args.epochs):
            with trainer.epoch(epoch=epoch):
                for step in range(args.steps):
                    batch = data[step * 8:(step + 1) * 8]
                    with trainer.step(global_step=global_step, batch_size=len(batch), samples=len(batch)):
                        loss = 0.0
                        for substep in range(args.accumulation):
                            with trainer.substep(substep=substep):
                                loss = _work(args.step_time / args.accumulation, weights, batch, 0.1)
                        trainer.log(loss=loss, lr=0.1)
                        if args.stuck and global_step == STUCK_STEP:
                            time.sleep(1.6 * args.stuck_threshold)  # a hang the stuck detector reports
                    global_step += 1
                with trainer.evaluate(epoch=epoch):
                    _work(args.step_time, weights, data[:8], 0.0)
                path = checkpoint_dir / f"ckpt-{global_step}.json"
                with trainer.save(path=str(path), step=global_step) as save:
                    data_bytes = json.dumps(weights).encode()
                    path.write_bytes(data_bytes)
                    save.extra_args(**{"training.checkpoint.bytes": len(data_bytes)})
    trainer.finish(global_step=global_step)
    return global_step


def run(args: argparse.Namespace) -> int:
    import otel_training

    # In this process: the demo counts its spans and prints its alerts with processors of its own, which an
    # offloaded pipeline (the default) would run in the drain process (docs/offload.md).
    options: dict[str, Any] = {"offload": False}
    if args.output_dir:
        options["output_dir"] = args.output_dir
    if args.exporter:
        options["exporter"] = args.exporter
    if args.stuck:
        options["stuck_threshold_s"] = args.stuck_threshold
    telemetry = otel_training.configure(**options)
    stuck = telemetry.stuck
    if stuck is not None:
        stuck.add_callback(_print_alert)
    summary = _Summary()
    telemetry.add_span_processor(summary)
    trainer = otel_training.TrainerProcess()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="otel-training-demo-") as checkpoints:
        steps = train(args, trainer, Path(checkpoints))
    elapsed = time.perf_counter() - started
    result = telemetry.shutdown(timeout_s=5)

    mean_ms = sum(summary.step_ns) / len(summary.step_ns) / 1e6 if summary.step_ns else 0.0
    print(f"otel-training demo: {steps} steps in {elapsed:.2f} s, mean step time {mean_ms:.1f} ms")
    print("spans: " + ", ".join(f"{name} {count}" for name, count in sorted(summary.counts.items())))
    if telemetry.trace_path is not None:
        print(f"traces: {telemetry.trace_path.resolve()}")
    else:
        print(f"traces: sent with the {telemetry.exporter_name} exporter")
    print(f"delivered {result.exported} spans, dropped {result.dropped}")
    if telemetry.trace_path is not None and telemetry.trace_path.exists():
        from otel_training import semconv as sc
        from otel_training.cli.report import HTML_NEEDS, report_paths

        print()
        summary_text, html_path = report_paths(
            [str(telemetry.trace_path)], telemetry.trace_path.parent / "otel-training-report.html",
            job_id=str(telemetry.resource.attributes.get(sc.TRAINING_JOB_ID, "")) or None)
        print(summary_text)
        if html_path is not None:
            print(f"html report: {html_path.resolve()}  ({_command()} report {telemetry.trace_path.parent} for more)")
        else:
            print(f"({HTML_NEEDS})")
    return 0 if result.dropped == 0 else 1


def _command() -> str:
    """How to call ``otel-training`` from here: its name where the shell finds it, else its path (scripts/demo
    leaves it in .venv/bin, which a new user's shell does not search)."""
    import shutil
    import sys

    on_path = shutil.which("otel-training")
    here = Path(sys.executable).parent / "otel-training"
    if on_path is not None and (not here.exists() or Path(on_path).resolve() == here.resolve()):
        return "otel-training"
    return str(here) if here.exists() else f"{sys.executable} -m otel_training.cli.main"
