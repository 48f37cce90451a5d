"""Our goodput accounting beside ml-goodput-measurement's, on the same job timelines.

Each scenario is one timeline with explicit timestamps, told twice: as our spans
(``otel_training.analysis.account``, what the report and the live metrics run)
and as ml-goodput-measurement's recorder calls, read back by its own
``GoodputCalculator`` through an in-memory stand-in for Cloud Logging. Where the
definitions are the same, the figures must agree; the table prints both and
their difference in milliseconds.

    python -m venv /tmp/mlg && /tmp/mlg/bin/pip install ml-goodput-measurement==0.2.3
    PYTHONPATH=. /tmp/mlg/bin/python bench/compare_ml_goodput.py

Bucket mapping (docs/goodput.md): their PROGRAM_STARTUP holds the first step's
excess over the ideal, which is our ``compilation``; their
INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION is our ``downtime`` + ``recovery``.
"""

from __future__ import annotations

import datetime
import sys
import tempfile

from otel_training import semconv as sc
from otel_training.analysis import RunKey, SpanRecord, account

ORIGIN = 1_700_000_000.0


class MemoryLog:
    """Cloud Logging for one job, in memory: entries back in time order."""

    def __init__(self, job: str) -> None:
        self.job_name = job
        self.entries: list[dict] = []

    def write_cloud_logging_entry(self, entry: dict) -> None:
        self.entries.append(entry)

    def flush(self) -> None:
        pass

    def read_cloud_logging_entries(self, start_time=None, end_time=None, last_entry_info=None):
        def when(entry: dict) -> float:
            return next(value for key, value in entry.items() if "time" in key)

        ordered = sorted(self.entries, key=when)
        return ordered, (None, None)


class Timeline:
    """A job told both ways: our span records and their recorder calls."""

    def __init__(self, job: str) -> None:
        from ml_goodput_measurement.src import goodput

        self.job = job
        self.log = MemoryLog(job)
        self.recorder = goodput.GoodputRecorder(job, "compare", logging_enabled=True, cloud_logger=self.log)
        self.records: list[SpanRecord] = []
        self.life: RunKey | None = None
        self.lives = 0

    @staticmethod
    def t(seconds: float) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(ORIGIN + seconds, datetime.timezone.utc)

    @staticmethod
    def ns(seconds: float) -> int:
        return int(round((ORIGIN + seconds) * 1e9))

    def span(self, name: str, start: float, end: float, **attributes) -> None:
        assert self.life is not None
        self.records.append(SpanRecord(name, self.ns(start), self.ns(end), self.life, attributes=attributes,
                                       span_id=f"{len(self.records) + 1:016x}"))

    def start_life(self, at: float) -> None:
        self.life = RunKey(self.job, 0, self.lives, f"{self.job}-{self.lives}", f"life-{self.lives}", self.ns(at))
        self.lives += 1
        self.recorder.record_job_start_time(self.t(at))

    def init(self, start: float, end: float) -> None:
        self.span(sc.SPAN_INIT, start, end)
        self.recorder.record_tpu_init_start_time(self.t(start))
        self.recorder.record_tpu_init_end_time(self.t(end))

    def prep(self, start: float, end: float) -> None:
        self.span(sc.SPAN_LOAD_DATASET, start, end)
        self.recorder.record_training_preparation_start_time(self.t(start))
        self.recorder.record_training_preparation_end_time(self.t(end))

    def restore(self, start: float, end: float, step: int) -> None:
        self.span(sc.SPAN_LOAD_CHECKPOINT, start, end, **{sc.CHECKPOINT_STEP: step})

    def steps(self, first: int, starts: list[float], end: float) -> None:
        """Contiguous steps: each ends where the next starts, the last at ``end``."""
        for index, start in enumerate(starts):
            stop = starts[index + 1] if index + 1 < len(starts) else end
            self.span(sc.SPAN_STEP, start, stop, **{sc.STEP: first + index})
            self.recorder.record_step_start_time(first + index, self.t(start))

    def end_life(self, at: float, *, finished: bool) -> None:
        if finished:
            self.span(sc.SPAN_TRAIN, at, at)
        self.recorder.record_job_end_time(self.t(at))

    def compare(self, name: str) -> list[tuple[str, float, float]]:
        from ml_goodput_measurement.src import goodput

        with tempfile.TemporaryDirectory() as cache:  # their cache outlives a calculator otherwise
            calculator = goodput.GoodputCalculator(self.job, "compare", cloud_logger=self.log, cache_dir=cache)
            theirs_pct, badput_pct, _ = calculator.get_job_goodput(include_badput_breakdown=True)
            details = calculator.get_job_goodput_details()
        ours = account(self.records)
        total = ours.total_s
        their_total = details["total_elapsed_time"]
        theirs = {bucket.name: value / 100 * their_total for bucket, value in badput_pct.items()
                  if isinstance(value, (int, float))}
        rows = [("job time (s)", total, their_total), ("goodput (s)", ours.productive_s, theirs_pct / 100 * their_total)]
        pairs = [
            ("PROGRAM_STARTUP", (sc.BADPUT_COMPILATION,)),
            # Restores are not told to their recorder here, so theirs land in OTHER.
            ("OTHER", (sc.BADPUT_PROGRAM_STARTUP, sc.BADPUT_HOST_OUTSIDE_STEPS, sc.BADPUT_OTHER,
                       sc.BADPUT_CHECKPOINT_RESTORE)),
            ("TPU_INITIALIZATION", (sc.BADPUT_INITIALIZATION,)),
            ("TRAINING_PREP", (sc.BADPUT_TRAINING_PREP,)),
            ("WASTED_PROGRESS_FROM_DISRUPTION", (sc.BADPUT_WASTED_PROGRESS,)),
            ("INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION", (sc.BADPUT_DOWNTIME, sc.BADPUT_RECOVERY)),
        ]
        for theirs_name, our_buckets in pairs:
            rows.append((theirs_name, sum(ours.seconds.get(bucket, 0.0) for bucket in our_buckets),
                         theirs.get(theirs_name, 0.0)))
        print(f"\n{name}: job time {total:.3f} s")
        print(f"  {'bucket':<42} {'ours s':>10} {'theirs s':>10} {'diff ms':>9}")
        for label, our_value, their_value in rows:
            print(f"  {label:<42} {our_value:10.3f} {their_value:10.3f} {(our_value - their_value) * 1e3:9.1f}")
        return rows


def clean_run() -> list:
    job = Timeline("clean-run")
    job.start_life(0)
    job.init(0, 2)
    job.prep(2, 4)
    starts = [5.0, 10.0] + [10.0 + 2.0 * index for index in range(1, 20)]  # a 5 s first step, then 2 s
    job.steps(0, starts, 50.0)
    job.end_life(50.0, finished=True)
    return job.compare("clean run (5 s first step, 2 s steps)")


def crash_and_restart() -> list:
    job = Timeline("crash-and-restart")
    job.start_life(0)
    job.init(0, 2)
    job.steps(0, [3.0 + 2.0 * index for index in range(15)], 33.0)  # steps 0-14, crash at 33
    job.end_life(33.0, finished=False)
    job.start_life(40.0)  # restarted 7 s later, resumes from the checkpoint of step 9
    job.init(40, 42)
    job.restore(42, 43, 9)
    job.steps(10, [43.0 + 2.0 * index for index in range(20)], 83.0)
    job.end_life(83.0, finished=True)
    return job.compare("crash and restart (resume from step 9)")


def killed_before_its_first_span() -> list:
    """Issue 29's finding: a life SIGKILLed never ends a span of its own start-up; what it had before its first
    step counts from its process's creation (``process.creation.time``), and its restart likewise."""
    job = Timeline("killed-life-start-up")
    job.start_life(0)  # created at 0; imports, data and NCCL until 6 s, no span of them survives
    job.steps(0, [6.0 + 2.0 * index for index in range(12)], 30.0)  # steps 0-11, SIGKILL at 30
    job.end_life(30.0, finished=False)
    job.start_life(36.0)  # restarted 6 s later; its own start-up until 40, resumes from step 5's checkpoint
    job.restore(40, 41, 5)
    job.steps(6, [41.0 + 2.0 * index for index in range(19)], 80.0)
    job.end_life(80.0, finished=True)
    return job.compare("a life killed with no span of its start-up, then restarted")


def sub_second_steps() -> list:
    job = Timeline("sub-second-steps")
    job.start_life(0)
    job.init(0, 1)
    job.steps(0, [1.5 + 0.25 * index for index in range(400)], 101.5)
    job.end_life(101.5, finished=True)
    return job.compare("400 steps of 250 ms")


def main() -> int:
    try:
        import ml_goodput_measurement  # noqa: F401
    except ImportError:
        print("needs ml-goodput-measurement: see this script's docstring", file=sys.stderr)
        return 2
    goodput_worst = bucket_worst = 0.0
    for scenario in (clean_run, crash_and_restart, killed_before_its_first_span, sub_second_steps):
        for label, ours, theirs in scenario():
            if label.startswith(("goodput", "job time")):
                goodput_worst = max(goodput_worst, abs(ours - theirs))
            else:
                bucket_worst = max(bucket_worst, abs(ours - theirs))
    print(f"\nlargest difference in job time and goodput: {goodput_worst * 1e3:.1f} ms; in a badput bucket: "
          f"{bucket_worst * 1e3:.1f} ms")
    print("(by definition: the step running when a life crashed is wasted progress here, disruption there)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
