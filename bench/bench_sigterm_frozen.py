"""SIGTERM to a rank holding the GIL in a long C call: what waiting ``exit_timeout_s`` buys (issue 29).

A process whose main thread is in a C call that holds the GIL runs no Python:
the signal helper (``lifecycle/_signal_helper.py``) delivers SIGTERM's default
action ``exit_timeout_s`` after the signal if Python never took it in hand. This
measures, side by side in one run, for the C call returning 0.5 s or 1.5 s
after the signal or never (30 s), in-process (``offload=False``) and offloaded
(the default), with ``exit_timeout_s`` 2 (the default) and 0.05 (the default
action almost at once), and with 2 and a scheduler's SIGKILL 1 s after its SIGTERM:

* how long the process took to die after SIGTERM;
* how many of the step spans it ended before the signal reached the trace
  file (the drain's, or the in-process batch processor's), and whether the
  step it was in when signalled did (ended by the process's handler with the
  signal recorded, or by the drain when the process was gone).

    .venv/bin/python bench/bench_sigterm_frozen.py [--rounds 2] [--steps 2000]

Each child runs ``--steps`` quick steps (the batch processor's 5 s delay holds
them in its queue; the drain has them already), prints ``ready``, and holds the
GIL in one C call (``sum(range(n))``, calibrated: it checks no signal) inside
one more step.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent("""
    import sys, time, otel_training
    offload, budget, hold_us, steps = sys.argv[1] == "1", float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    started = time.process_time()
    sum(range(10**7))  # a C loop that holds the GIL and checks no signal: its rate, to hold it hold_us
    loops = int(10**7 * hold_us / 1e6 / (time.process_time() - started))
    otel_training.configure(exporter="file", output_dir=sys.argv[5], offload=offload, exit_timeout_s=budget)
    trainer = otel_training.TrainerProcess()
    with trainer.epoch(epoch=0):
        for index in range(steps):
            with trainer.step(global_step=index):
                pass
        with trainer.step(global_step=steps):
            print("ready", flush=True)
            sum(range(loops))
            while True:  # back in Python: the handler runs here
                time.sleep(0.1)
""")


def _descendants(pid: int) -> set[int]:
    """``pid``'s child processes and theirs (the drain runs in a session of its own, so not by group)."""
    found: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            children = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found |= {child} | _descendants(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _steps_in(output: Path, steps: int) -> tuple[int, bool]:
    """(step spans ended before the signal found in the trace files, whether the signalled step is there)."""
    seen: set[int] = set()
    for path in output.glob("*.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                document = json.loads(line)
            except ValueError:
                continue
            for resource in document.get("resourceSpans", []):
                for scope in resource.get("scopeSpans", []):
                    for span in scope.get("spans", []):
                        if span.get("name") == "training.step":
                            for attribute in span.get("attributes", []):
                                if attribute["key"] == "training.step":
                                    seen.add(int(attribute["value"]["intValue"]))
    return len(seen - {steps}), steps in seen


def run_once(offload: bool, budget_s: float, hold_s: float, steps: int,
             kill_after_s: float | None = None) -> tuple[float, int, bool]:
    with tempfile.TemporaryDirectory(prefix="bench-sigterm-") as output:
        env = {**os.environ, "PYTHONPATH": str(REPO), "OTEL_TRAINING_WATCHDOG": "false"}
        process = subprocess.Popen([sys.executable, "-c", CHILD, "1" if offload else "0", str(budget_s),
                                    str(int(hold_s * 1e6)), str(steps), output],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                                   start_new_session=True)
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        time.sleep(0.1)  # inside the C call
        helpers = _descendants(process.pid)  # the drain, the signal helper
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60 if kill_after_s is None else kill_after_s)
        except subprocess.TimeoutExpired:  # a scheduler's SIGKILL after its grace
            process.kill()
            process.wait()
        dead_s = time.monotonic() - started
        deadline = time.monotonic() + 30
        while any(map(_alive, helpers)) and time.monotonic() < deadline:  # the drain finishes its file
            time.sleep(0.05)
        delivered, signalled = _steps_in(Path(output), steps)
        return dead_s, delivered, signalled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    cases = [(offload, hold, budget, kill) for offload in (False, True) for hold in (0.5, 1.5, 30.0)
             for budget, kill in ((2.0, None), (0.05, None), (2.0, 1.0))]
    results: dict[tuple[bool, float, float, float | None], list[tuple[float, int, bool]]] = {
        case: [] for case in cases}
    for round_index in range(args.rounds):
        for case in cases if round_index % 2 == 0 else list(reversed(cases)):
            results[case].append(run_once(case[0], case[2], case[1], args.steps, case[3]))
    print(f"{args.steps} steps ended before SIGTERM, the GIL held in the next; {args.rounds} rounds each "
          "(dead: seconds from SIGTERM to death, median and range; delivered: of the ended steps, worst round)")
    for (offload, hold, budget, kill), runs in results.items():
        dead = [run[0] for run in runs]
        print(f"{'offload   ' if offload else 'in-process'}  GIL back after {'never' if hold > 10 else f'{hold} s':6s} "
              f"exit_timeout_s {budget:4}{' + SIGKILL at 1 s' if kill else '                 '}: dead {statistics.median(dead):5.2f} s ({min(dead):.2f}-{max(dead):.2f}), "
              f"delivered {min(run[1] for run in runs):5d}/{args.steps}, signalled step "
              f"{'ended' if all(run[2] for run in runs) else 'lost' if not any(run[2] for run in runs) else 'mixed'}")


if __name__ == "__main__":
    main()
