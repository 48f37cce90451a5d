"""A span written twice counts once in the streamed report: within a file, across files, at any distance.

Duplicates happen in practice: an exporter retries a batch after a timeout that had in fact
delivered it (the same spans again, a line later), a spool is replayed (the whole file again),
rotated files are concatenated or read beside the concatenation (the same lines in two files).
Whatever the layout, the figures must be those of the spans written once, and the report must
say how many it dropped.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from report_figures import figures
from report_job import generate  # bench/report_job.py (pythonpath in pyproject.toml)

import otel_training
from otel_training import semconv as sc
from otel_training.report import dedupe, read_paths
from otel_training.report.files import report_files
from otel_training.report.machine import report_json


def _figures(report: Any) -> dict[str, Any]:
    """Every figure of a report, and the pieces ``figures`` leaves out that duplicates would move."""
    return json.loads(json.dumps(figures(report) | {
        "data_wait_s": report.data_wait_s, "hang": list(report.hang),
        "mads": {rank: stats.mad for rank, stats in report.rank_steps.items()},
        "alert_span_ids": [alert.span_id for alert in report.alerts]}))


def _library_job(configure: Callable[..., Any], directory: Path) -> Path:
    """Ten ``trainer.step()`` spans in a ``trainer.train()``, written by the library's file exporter."""
    telemetry = configure(exporter="file", output_dir=str(directory), job_id="dup-job")
    trainer = otel_training.TrainerProcess()
    with trainer.train():
        for step in range(10):
            with trainer.step(global_step=step):
                pass
    telemetry.shutdown(timeout_s=5)
    return Path(telemetry.trace_path)


def _dropped(report: Any) -> dict[str, int]:
    """path -> spans the report says it dropped as read before."""
    out = {}
    for problem in report.problems:
        if "already read" in problem.message:
            out[problem.path] = int(problem.message.split()[0])
    return out


def _respans(lines: list[str], keep: Callable[[dict[str, Any]], bool], batch: int) -> str:
    """The spans of ``lines`` that ``keep`` keeps, exported again in batches of ``batch`` (other lines)."""
    out = []
    for line in lines:
        request = json.loads(line)
        for resource_spans in request["resourceSpans"]:
            for scope_spans in resource_spans["scopeSpans"]:
                spans = [span for span in scope_spans["spans"] if keep(span)]
                for first in range(0, len(spans), batch):
                    out.append(json.dumps({"resourceSpans": [{
                        "resource": resource_spans["resource"],
                        "scopeSpans": [{"scope": scope_spans.get("scope", {}), "spans": spans[first:first + batch]}]}]},
                        indent=None, separators=(", ", ": ")) + "\n")
    return "".join(out)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_librarys_spans_written_three_times_in_one_file_count_once(
        configure: Callable[..., Any], tmp_path: Path, workers: int) -> None:
    written = _library_job(configure, tmp_path / "once")
    once = report_files([written], workers=workers, progress=False)
    assert once.span_count == 11 and once.job_steps is not None and once.job_steps.count == 10
    assert once.problems == []
    tripled = tmp_path / "tripled" / written.name
    tripled.parent.mkdir()
    tripled.write_bytes(written.read_bytes() * 3)
    again = report_files([tripled], workers=workers, progress=False)
    assert _figures(again) == _figures(once)
    assert _dropped(again) == {str(tripled): 22}
    assert again.duplicate_spans == 22 and report_json(again)["duplicate_spans"] == 22
    assert report_json(once)["duplicate_spans"] == 0


def test_a_subset_exported_again_into_another_file_counts_once(configure: Callable[..., Any], tmp_path: Path) -> None:
    written = _library_job(configure, tmp_path / "traces")
    once = report_files([written], workers=1, progress=False)
    retried = written.parent / "traces-r0-retry.jsonl"  # steps 3-6 again, batched otherwise: not a copy
    retried.write_text(_respans(written.read_text().splitlines(), lambda span: span["name"] == sc.SPAN_STEP and any(
        item["key"] == sc.STEP and int(item["value"]["intValue"]) in range(3, 7) for item in span["attributes"]), 3))
    for workers in (1, 2):
        report = report_files([written.parent], workers=workers, progress=False)
        assert _figures(report) == _figures(once)
        assert _dropped(report) == {str(retried): 4}
    in_memory = read_paths([written.parent], progress=False)
    assert len(in_memory.records) == 11


def test_the_command_line_on_a_tripled_file_prints_the_figures_of_once(
        configure: Callable[..., Any], tmp_path: Path) -> None:
    written = _library_job(configure, tmp_path / "once")
    tripled = tmp_path / "tripled" / written.name
    tripled.parent.mkdir()
    tripled.write_bytes(written.read_bytes() * 3)

    def summary(path: Path) -> list[str]:
        done = subprocess.run([sys.executable, "-m", "otel_training.cli.main", "report", str(path), "--no-html"],
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    once, again = summary(written), summary(tripled)
    assert once[0].startswith("job dup-job: 11 spans, 1 rank(s)")
    problems = again.index("input problems (1); everything else was used:")
    assert again[:problems] == once
    assert again[problems + 1].startswith(f"  {tripled}: 22 span(s) already read")


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A generated job (restarts, checkpoints, a stuck and a recovered alert, a straggler), and its figures."""
    directory = tmp_path_factory.mktemp("job") / "traces"
    generate(directory, 6_000, 3, 2, seed=11)
    return directory, _figures(report_files([directory], workers=1, progress=False))


@pytest.mark.parametrize("small_generations", [False, True])
def test_a_job_replayed_retried_and_rotated_gives_the_figures_of_once(
        job: tuple[Path, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        small_generations: bool) -> None:
    """Rank 0 tripled in its file, rank 1's every batch retried a line later, rank 2 rotated with overlap.

    With small windows and generations, spans reach back past the windows and their keys past the
    sets: the compact table is searched too.
    """
    if small_generations:
        monkeypatch.setattr(dedupe, "WINDOW", 5)
        monkeypatch.setattr(dedupe, "HELD", 12)
        monkeypatch.setattr(dedupe, "GENERATION", 7)
    source, expected = job
    out = tmp_path / "traces"
    out.mkdir()
    r0 = (source / "traces-r0.jsonl").read_bytes()
    (out / "traces-r0.jsonl").write_bytes(r0 * 3)
    r1 = (source / "traces-r1.jsonl").read_text().splitlines(keepends=True)
    (out / "traces-r1.jsonl").write_text("".join(line + line for line in r1))
    r2 = (source / "traces-r2.jsonl").read_text().splitlines(keepends=True)
    third = len(r2) // 3
    (out / "traces-r2.jsonl.1").write_text("".join(r2[:2 * third]))  # rotated, then read from the overlap
    (out / "traces-r2.jsonl").write_text("".join(r2[third:]))
    (out / "traces-r2-all.jsonl").write_text("".join(r2[:2 * third] + r2[third:]))  # `cat` of the two
    spans = sum(len(json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]) for line in r2[third:2 * third])
    for workers in (1, 2):
        report = report_files([out, out / "traces-r2.jsonl.1"], workers=workers, progress=False)
        assert _figures(report) == expected
        dropped = _dropped(report)
        assert dropped[str(out / "traces-r0.jsonl")] == 2 * _spans(source, 0)
        assert dropped[str(out / "traces-r1.jsonl")] == _spans(source, 1)
        # Read: a+b, b+c and a+b+b+c (a, b, c: its thirds); kept: a+b+c.
        assert sum(value for path, value in dropped.items() if "traces-r2" in path) == _spans(source, 2) + 2 * spans
        assert report.duplicate_spans == sum(dropped.values())


def _spans(directory: Path, rank: int) -> int:
    return sum(len(scope["spans"]) for line in (directory / f"traces-r{rank}.jsonl").read_text().splitlines()
               for resource in json.loads(line)["resourceSpans"] for scope in resource["scopeSpans"])


def _random_lines(rng: random.Random, lines: int, far: bool) -> list[list[tuple[str, list[tuple[Any, ...]]]]]:
    """Requests of three processes: spans nearly in end order, some ending together, some without a span
    id, ids reused by another trace or process; copies a few spans later (retries), in the same batch,
    and (``far``) from anywhere before (replays)."""
    written: dict[str, list[tuple[Any, ...]]] = {process: [] for process in "abc"}
    clock = dict.fromkeys("abc", 10**18)
    counters: Counter[tuple[str, int]] = Counter()
    out = []
    for _ in range(lines):
        line = []
        for process in rng.sample("abc", rng.randrange(1, 4)):
            spans = written[process]
            batch = []
            for _ in range(rng.randrange(1, 12)):
                roll = rng.random()
                if spans and roll < 0.1:
                    batch.append(spans[-rng.randrange(1, min(len(spans), 6) + 1)])  # a retry
                elif spans and roll < 0.15:
                    batch.append(batch[-1] if batch else spans[-1])  # twice in one batch
                elif far and spans and roll < 0.2:
                    batch.append(rng.choice(spans))  # a replay
                else:
                    clock[process] += rng.choice((0, 0, 1000, 2000))
                    end = clock[process] - rng.choice((0, 0, 0, 1000, 3000))  # a little out of order
                    trace = rng.randrange(1, 4)
                    counters[process, trace] += 1  # sequential ids per trace: the same in every trace and process
                    span_id = "" if roll > 0.97 else format(counters[process, trace], "016x") if roll > 0.6 else \
                        format(rng.getrandbits(64), "016x")
                    trace_id = format(trace, "032x")
                    spans.append(("span", end - 10, end, span_id, False, None, trace_id))
                    batch.append(spans[-1])
            line.append((process, batch))
        out.append(line)
    return out


def _check_against_a_set(lines: list[list[tuple[str, list[tuple[Any, ...]]]]]) -> dedupe.SeenSpans:
    done: list[tuple[str, list[tuple[Any, ...]]]] = []
    seen = dedupe.SeenSpans(lambda: list(done))
    reference: set[tuple[str, str, str]] = set()
    submitted = kept_count = 0
    for line in lines:
        kept = seen.unique(line)
        for (process, spans), spans_kept in zip(line, kept):
            expected = []
            for span in spans:
                key = (process, span[6], span[3])
                if not span[3] or key not in reference:
                    reference.add(key)
                    expected.append(span)
            assert spans_kept == expected
            submitted += len(spans)
            kept_count += len(expected)
        done.extend(line)
    assert seen.dropped == submitted - kept_count
    return seen


@pytest.mark.parametrize("seed", range(4))
def test_spans_in_end_order_are_told_apart_by_their_windows_without_a_key(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dedupe, "WINDOW", 16)
    monkeypatch.setattr(dedupe, "HELD", 3 * (16 + 12))  # each process's window, and a batch beyond it
    seen = _check_against_a_set(_random_lines(random.Random(seed), 400, far=False))
    assert seen.keys is None and seen.dropped > 0  # retries, and repeats in a batch, found in the windows


@pytest.mark.parametrize("seed", range(4))
def test_copies_from_anywhere_before_are_found_by_key(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dedupe, "WINDOW", 16)
    monkeypatch.setattr(dedupe, "HELD", 64)
    monkeypatch.setattr(dedupe, "GENERATION", 32)
    seen = _check_against_a_set(_random_lines(random.Random(seed), 400, far=True))
    assert seen.keys is not None and seen.keys.table is not None  # the old keys searched in the compact table


def test_the_key_store_keeps_eight_bytes_a_span_while_nothing_reaches_back() -> None:
    store = dedupe.KeyStore(generation=1024)
    end, key = 10**18, 0
    for _ in range(200):
        spans, keys = [], []
        for _ in range(512):
            end += 1000
            key += 1
            spans.append(("span", 0, end, "id", False, None, "trace"))
            keys.append(hash(("trace", str(key))))
        assert store.unique(spans, keys) is spans  # nothing dropped: the batch itself, not a copy
    assert store.table is None
    assert len(store.older) == 200 * 512 - len(store.current) - len(store.previous)
    assert store.older.itemsize == 8


def test_a_life_split_out_of_order_over_files_with_repeats_is_recomputed_once_each(
        job: tuple[Path, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two files read as one stream still break the end order: the rank is recomputed in memory, where a
    span in both files counts once too."""
    from otel_training.report import files as files_module
    from otel_training.report import stream

    recomputed: list[int] = []
    recompute = files_module._recompute
    monkeypatch.setattr(files_module, "_recompute", lambda part, ranks, *args: (
        recomputed.extend(ranks), recompute(part, ranks, *args)))
    monkeypatch.setattr(stream, "SETTLE_EVERY", 16)
    monkeypatch.setattr(stream, "REORDER_NS", 10**9)
    source, expected = job
    out = tmp_path / "traces"
    out.mkdir()
    for rank in (0, 2):
        (out / f"traces-r{rank}.jsonl").write_bytes((source / f"traces-r{rank}.jsonl").read_bytes())
    lines = (source / "traces-r1.jsonl").read_text().splitlines(keepends=True)
    (out / "traces-r1.jsonl").write_text("".join(reversed(lines)))  # latest batches first
    (out / "traces-r1-retried.jsonl").write_text("".join(lines[1::2]))
    report = report_files([out], workers=2, progress=False)
    assert recomputed == [1]
    assert _figures(report) == expected
    # Said of the file read second: both begin with the same span (a life's process span), so it is the
    # later of the two by name.
    assert _dropped(report) == {str(out / "traces-r1.jsonl"): sum(
        len(json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]) for line in lines[1::2])}
