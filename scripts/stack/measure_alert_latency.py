#!/usr/bin/env python3
"""How long a hang takes to become a page, hop by hop, on the native stack with the shipped intervals.

For each round, starts the native stack (``otelstack.Stack``: shipped intervals unless ``--fast``) and
runs a small instrumented loop (this file, ``child`` mode) whose fourth step hangs until released, and
polls the stack's APIs for that round's job, timing each hop from the step's threshold crossing (its
start + ``--threshold``):

* ``jaeger``: the ``training.alert`` span (kind ``stuck``) in Jaeger's query API;
* ``metric``: its span metric (``traces_span_metrics_calls_total``) counted in Prometheus (above 0: the
  spanmetrics connector reports each new series at 0 first, and its count one flush later);
* ``prometheus``: ``TrainingStepStuck`` firing in Prometheus' alerts API;
* ``alertmanager``: the alert active in Alertmanager's API;
* ``page``: the firing notification at the stack's own webhook receiver.

The step is released once all five are seen (or ``--deadline`` passes). Each round runs on a stack of its
own, started for it: within one stack the flush, scrape and evaluation cycles keep fixed phases to one
another (Prometheus staggers scrapes and rule groups by a hash, the collector flushes from its start), so
fresh stacks are what samples those phases as a user's stack would have them. Usage::

    .venv/bin/python scripts/stack/measure_alert_latency.py --rounds 3

docs/pipeline.md ("From a hang to a page") has the figures and which setting sets each hop.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path

from otelstack import Stack, StackError, http_get

HOPS = ("jaeger", "metric", "prometheus", "alertmanager", "page")
#: The step that hangs: not the first of its name, which gets the detector's warm-up allowance.
STUCK_STEP = 3
POLL_S = 0.1


# -- the instrumented loop (a child process) -----------------------------------------------------------
def child(threshold: float, start_file: Path, release_file: Path) -> int:
    """Three quick steps, then one that hangs until ``release_file`` exists; its start time goes to
    ``start_file`` (wall clock) so the parent can time from the threshold crossing."""
    import otel_training

    telemetry = otel_training.configure(stuck_threshold_s=threshold)
    trainer = otel_training.TrainerProcess()
    with trainer.train():
        with trainer.epoch(epoch=0):
            for step in range(STUCK_STEP + 1):
                with trainer.step(global_step=step):
                    if step == STUCK_STEP:
                        start_file.write_text(repr(time.time()))
                        while not release_file.exists():  # the hang: released by the parent
                            time.sleep(0.05)
                    else:
                        time.sleep(0.05)
    result = telemetry.shutdown(timeout_s=10)
    return 0 if result.dropped == 0 else 1


# -- the probes: each answers "seen yet?" for one round's job ------------------------------------------
def _json(url: str) -> object:
    status, body = http_get(url, timeout=5.0)
    if status != 200:
        return None
    return json.loads(body)


def _jaeger(stack: Stack, service: str) -> bool:
    query = urllib.parse.urlencode({"service": service, "lookback": "1h", "limit": "20",
                                    "tags": json.dumps({"training.alert.kind": "stuck"})})
    answer = _json(f"{stack.jaeger_url}/api/traces?{query}")
    return isinstance(answer, dict) and bool(answer.get("data"))


def _metric(stack: Stack, job: str) -> bool:
    expr = ('traces_span_metrics_calls_total{span_name="training.alert",training_alert_kind="stuck",'
            f'training_job_id="{job}"}} > 0')
    answer = _json(f"{stack.prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
    return isinstance(answer, dict) and bool(answer["data"]["result"])


def _prometheus(stack: Stack, job: str) -> bool:
    answer = _json(f"{stack.prometheus_url}/api/v1/alerts")
    return isinstance(answer, dict) and any(
        a["labels"].get("alertname") == "TrainingStepStuck" and a["labels"].get("training_job_id") == job
        and a["state"] == "firing" for a in answer["data"]["alerts"])


def _alertmanager(stack: Stack, job: str) -> bool:
    query = urllib.parse.urlencode([("filter", 'alertname="TrainingStepStuck"'), ("filter", f'training_job_id="{job}"')])
    answer = _json(f"{stack.alertmanager_url}/api/v2/alerts?{query}")
    return isinstance(answer, list) and any(a["status"]["state"] == "active" for a in answer)


def _page(stack: Stack, job: str) -> bool:
    path = stack.notifications_file
    if path is None or not path.exists():
        return False
    for line in path.read_text().splitlines():
        note = json.loads(line)
        if note.get("status") == "firing" and any(a["labels"].get("training_job_id") == job for a in note["alerts"]):
            return True
    return False


# -- one round -----------------------------------------------------------------------------------------
def one_round(stack: Stack, work: Path, threshold: float, deadline_s: float) -> dict[str, float]:
    """Seconds from the threshold crossing to each hop (a hop not seen within ``deadline_s`` is absent)."""
    job = f"latency-{uuid.uuid4().hex[:8]}"
    service = f"alert-{job}"  # a service of its own: an earlier round's alert span cannot answer for this one
    start_file, release_file = work / f"{job}.start", work / f"{job}.release"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELCOL_", "JAEGER_"))}
    env.update(stack.client_env(), OTEL_SERVICE_NAME=service, OTEL_TRAINING_JOB_ID=job)
    log = open(work / f"{job}.log", "wb")
    proc = subprocess.Popen([sys.executable, __file__, "child", str(threshold), str(start_file), str(release_file)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    probes: dict[str, Callable[[], bool]] = {
        "jaeger": lambda: _jaeger(stack, service),
        "metric": lambda: _metric(stack, job), "prometheus": lambda: _prometheus(stack, job),
        "alertmanager": lambda: _alertmanager(stack, job), "page": lambda: _page(stack, job),
    }
    seen: dict[str, float] = {}
    try:
        end = time.monotonic() + deadline_s
        while len(seen) < len(HOPS) and time.monotonic() < end:
            if proc.poll() is not None:
                raise StackError(f"the stuck loop exited ({proc.returncode}): {(work / f'{job}.log').read_text()[-2000:]}")
            for hop in HOPS:
                if hop not in seen:
                    try:
                        if probes[hop]():
                            seen[hop] = time.time()
                    except (OSError, ValueError, KeyError):
                        pass  # not up yet, or half-written: asked again next poll
            time.sleep(POLL_S)
    finally:
        release_file.touch()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    if proc.returncode != 0:
        raise StackError(f"the stuck loop failed ({proc.returncode}): {(work / f'{job}.log').read_text()[-2000:]}")
    crossing = float(start_file.read_text()) + threshold
    return {hop: seen[hop] - crossing for hop in HOPS if hop in seen}


def _summary(rounds: list[dict[str, float]]) -> list[str]:
    lines = [f"{'hop':<13} {'median':>8} {'min':>8} {'max':>8}  (seconds after the threshold crossing, "
             f"{len(rounds)} rounds)"]
    for hop in HOPS:
        values = [r[hop] for r in rounds if hop in r]
        if not values:
            lines.append(f"{hop:<13} {'not seen':>8}")
            continue
        missed = f"  ({len(rounds) - len(values)} rounds missed it)" if len(values) < len(rounds) else ""
        lines.append(f"{hop:<13} {statistics.median(values):8.1f} {min(values):8.1f} {max(values):8.1f}{missed}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["child"]:
        return child(float(args_in[1]), Path(args_in[2]), Path(args_in[3]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="hangs to time (default: %(default)s)")
    ap.add_argument("--threshold", type=float, default=2.0, help="the loop's stuck threshold, s (default: %(default)s)")
    ap.add_argument("--deadline", type=float, default=180.0, help="per round, s (default: %(default)s)")
    ap.add_argument("--fast", action="store_true", help="the stack's 1 s intervals (stack.py up --fast) instead of the shipped ones")
    ap.add_argument("--json", type=Path, default=None, help="also write the rounds and settings here")
    args = ap.parse_args(args_in)

    rounds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="alert-latency-") as tmp:
        work = Path(tmp)
        for number in range(1, args.rounds + 1):
            stack = Stack(work / f"stack-{number}", fast=args.fast)
            try:
                stack.start()
            except StackError as exc:
                print(f"the stack did not start: {exc}", file=sys.stderr)
                return 1
            try:
                if number == 1:
                    print(f"{'--fast' if args.fast else 'shipped intervals'}: flush {stack.spanmetrics_flush_interval}, "
                          f"scrape {stack.scrape_interval}, evaluation {stack.evaluation_interval}; stuck threshold "
                          f"{args.threshold:g} s; a fresh stack each round", flush=True)
                result = one_round(stack, work, args.threshold, args.deadline)
            finally:
                stack.stop()
            rounds.append(result)
            print(f"round {number}: " + ", ".join(f"{hop} +{result[hop]:.1f} s" if hop in result else f"{hop} not seen"
                                                 for hop in HOPS), flush=True)
    print("\n".join(_summary(rounds)))
    if args.json is not None:
        args.json.write_text(json.dumps({"fast": args.fast, "threshold_s": args.threshold, "rounds": rounds}, indent=2))
    return 0 if all(len(r) == len(HOPS) for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
