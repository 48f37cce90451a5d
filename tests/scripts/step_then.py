"""A training process that opens a step, says it is ready, then does what a signal or exit test needs.

    python step_then.py ACTION [--ready TEXT] [--step N] [--exit-timeout S] [--output-dir DIR] [--open-files N]
                               [--steps-before N] [--in-process]

ACTION:
  raise                a RuntimeError out of the step (an uncaught exception)
  busy                 Python, forever (signals are handled by the main thread itself)
  system-sleep:S       S seconds in C with the GIL released (a rank waiting in a collective)
  hold-gil             hours in one C call that never releases the GIL (a frozen rank)
  hold-gil-then-sleep  ~1.5 s holding the GIL, then a sleep (a long C call that returns)

With ``--output-dir`` the spans go to a file there; otherwise the exporter comes from the environment
(OTLP to ``OTEL_EXPORTER_OTLP_ENDPOINT``). ``--open-files`` dups stdin that often first, so the
library's own descriptors land past 1024 (out of ``select()``'s reach). ``--steps-before``: that many
steps (``training.step`` 0, 1, ...) end first; ``--in-process``: ``offload=False``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import time

import otel_training


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("action")
    parser.add_argument("--ready", default="ready")
    parser.add_argument("--step", type=int, default=1)
    parser.add_argument("--exit-timeout", type=float)
    parser.add_argument("--output-dir")
    parser.add_argument("--open-files", type=int, default=0)
    parser.add_argument("--steps-before", type=int, default=0)
    parser.add_argument("--in-process", action="store_true")
    args = parser.parse_args()

    if args.open_files:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < args.open_files + 100:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.open_files + 100), hard))
    files = [os.dup(0) for _ in range(args.open_files)]  # noqa: F841 - held open
    options: dict = {}
    if args.output_dir:
        options.update(exporter="file", output_dir=args.output_dir)
    if args.exit_timeout is not None:
        options["exit_timeout_s"] = args.exit_timeout
    if args.in_process:
        options["offload"] = False
    otel_training.configure(**options)
    gil_loop = 0
    if args.action == "hold-gil-then-sleep":
        started = time.process_time()
        sum(range(10**7))
        gil_loop = int(10**7 * 1.5 / (time.process_time() - started))  # ~1.5 s holding the GIL

    trainer = otel_training.TrainerProcess()
    for index in range(args.steps_before):
        with trainer.step(global_step=index):
            pass
    with trainer.step(global_step=args.step):
        print(args.ready, flush=True)
        if args.action == "raise":
            raise RuntimeError("loss is NaN")
        if args.action == "busy":
            while True:
                pass
        if args.action.startswith("system-sleep:"):
            ctypes.CDLL(None).system(f"sleep {float(args.action.split(':', 1)[1])}".encode())
        elif args.action == "hold-gil":
            sum(range(10**15))  # hours, all of it holding the GIL
        elif args.action == "hold-gil-then-sleep":
            sum(range(gil_loop))
            time.sleep(60)
        else:
            raise SystemExit(f"unknown action {args.action!r}")


if __name__ == "__main__":
    main()
