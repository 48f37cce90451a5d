"""The report of trace files at job scale: one worker process per file, their parts merged.

The file exporter writes one file per rank (every life of the rank appended), so
a worker that reads a file finishes its ranks alone, and the parent only merges
per-rank aggregates: memory stays flat as the files grow, and every core reads.
Files that share a rank or a process (a collector's output split by time, a
rank's file rotated, a retry or a replay written to another file) are read
again as one stream by one worker, so that a span in two of them counts once and
a life split over them is read in one piece. A rank a worker could not read
exactly as a stream is recomputed from its spans in memory: slower, never
different.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from otel_training.analysis import SpanRecord
from otel_training.analysis.stragglers import DEFAULT_THRESHOLD, WINDOW
from otel_training.report.digest import Intervals, Part, part_from_records
from otel_training.report.gpu_metrics import add_gpu_series
from otel_training.report.job import JobReport, assemble
from otel_training.report.reader import (
    Problem,
    _progress_bar,
    _size,
    _unique,
    duplicates_problem,
    find_trace_files,
    read_file,
)
from otel_training.report.stream import digest_files

#: Bytes a worker reads between two progress messages.
PROGRESS_EVERY = 4 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Options:
    window: int = WINDOW
    evaluation_is_productive: bool = False
    job_id: str | None = None


def workers_available() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class _QueueProgress:
    """A worker's bytes read, sent to the parent's bar in chunks."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.pending = 0

    def update(self, size: int) -> None:
        self.pending += size
        if self.pending >= PROGRESS_EVERY:
            self.queue.put(self.pending)
            self.pending = 0

    def flush(self) -> None:
        if self.pending:
            self.queue.put(self.pending)
            self.pending = 0


_queue: Any = None


def _init_worker(queue: Any) -> None:
    global _queue
    _queue = queue


def _digest(job: tuple[int, Sequence[Path], Options]) -> tuple[int, Part, list[Problem]]:
    index, paths, options = job
    progress = None if _queue is None else _QueueProgress(_queue)
    part, problems = digest_files(paths, window=options.window,
                                  evaluation_is_productive=options.evaluation_is_productive,
                                  job_id=options.job_id, progress=progress)
    if progress is not None:
        progress.flush()
    return index, part, problems


def _digest_of(path: Path, limit: int | None = None) -> bytes | None:
    digest = hashlib.blake2b(digest_size=16)
    try:
        with path.open("rb") as handle:
            if limit is not None:
                digest.update(handle.read(limit))
            else:
                while chunk := handle.read(1 << 20):
                    digest.update(chunk)
    except OSError:
        return None  # reading it says why
    return digest.digest()


def _content_duplicates(files: list[Path]) -> dict[Path, Path]:
    """Files with the same content as an earlier one (a copy): same size, same first MB, then same whole."""
    groups: dict[object, list[Path]] = {}
    for path in files:
        groups.setdefault(_size(path), []).append(path)
    for key in [key for key, same in groups.items() if len(same) > 1 and key]:
        for path in groups.pop(key):
            groups.setdefault((key, _digest_of(path, 1 << 20)), []).append(path)
    duplicates: dict[Path, Path] = {}
    for key, same in groups.items():
        if not isinstance(key, tuple) or len(same) < 2 or key[1] is None:
            continue
        seen: dict[bytes, Path] = {}
        for path in same:
            digest = _digest_of(path)
            if digest is None:
                continue
            if digest in seen:
                duplicates[path] = seen[digest]
            else:
                seen[digest] = path
    return duplicates


def read_parts(groups: Sequence[Sequence[Path]], options: Options, intervals: Intervals | None, *,
               progress: bool | None = None, workers: int | None = None,
               meanwhile: Callable[[], None] | None = None) -> tuple[list[tuple[Part, list[Problem]]], Any]:
    """Each group's part and problems, in the order of ``groups``: a group's files are read as one stream
    by one process, several groups by several.

    Each part's timeline intervals are merged into ``intervals`` as it arrives (a thousand files'
    worth would be the largest thing held), the rest of it kept; None drops them (files read
    again: their intervals were merged the first time, and a span in two files marks the same
    time). ``meanwhile``: work for this process while the workers read (the HTML page's plotting
    library is imported there: a third of a second, otherwise added to the report's time); run
    after the files when there are no workers.
    """
    total = sum(_size(path) for paths in groups for path in paths)
    bar = _progress_bar(total, progress)
    workers = min(workers or workers_available(), len(groups))
    jobs = [(index, tuple(paths), options) for index, paths in enumerate(groups)]
    results: list[Any] = [None] * len(groups)
    try:
        if workers <= 1:
            for index, paths, _ in jobs:
                results[index] = _keep(digest_files(
                    paths, window=options.window, job_id=options.job_id,
                    evaluation_is_productive=options.evaluation_is_productive, progress=bar), intervals)
            if meanwhile is not None:
                meanwhile()
            return results, bar
        context = get_context("fork" if "fork" in _methods() else "spawn")
        queue = context.Queue() if bar is not None else None
        drain = threading.Thread(target=_drain, args=(queue, bar), daemon=True) if queue is not None else None
        if drain is not None:
            drain.start()
        # The largest files first, so that no worker is left with the largest at the end.
        jobs.sort(key=lambda job: -sum(_size(path) for path in job[1]))
        with context.Pool(workers, initializer=_init_worker, initargs=(queue,)) as pool:
            parts = pool.imap_unordered(_digest, jobs, chunksize=1)
            if meanwhile is not None:  # the workers are forked and reading: no import runs across a fork
                meanwhile()
            for index, part, problems in parts:
                results[index] = _keep((part, problems), intervals)
        if queue is not None:
            queue.put(None)
            assert drain is not None
            drain.join(timeout=10)
        return results, bar
    finally:
        if bar is not None:
            bar.close()


def _keep(result: tuple[Part, list[Problem]], intervals: Intervals | None) -> tuple[Part, list[Problem]]:
    part, _ = result
    if intervals is not None:
        intervals.update(part.intervals)
    part.intervals = Intervals()
    return result


def _methods() -> list[str]:
    from multiprocessing import get_all_start_methods

    return get_all_start_methods()


def _drain(queue: Any, bar: Any) -> None:
    while (size := queue.get()) is not None:
        bar.update(size)


def report_files(
    paths: Sequence[str | os.PathLike[str]],
    *,
    job_id: str | None = None,
    evaluation_is_productive: bool = False,
    ideal_step_time_s: float | None = None,
    straggler_threshold: float = DEFAULT_THRESHOLD,
    straggler_window: int = WINDOW,
    progress: bool | None = None,
    workers: int | None = None,
    meanwhile: Callable[[], None] | None = None,
) -> JobReport:
    """The report of the OTLP JSON trace files under ``paths``, streamed (``progress``: as ``read_paths``;
    ``meanwhile``: as ``read_parts``)."""
    files, problems = find_trace_files(paths)
    unique: dict[Path, Path] = {}
    for path in files:  # a file named twice (itself and its directory, ./a and a) is read once
        unique.setdefault(path.resolve(), path)
    files = list(unique.values())
    copies = _content_duplicates(files)
    options = Options(straggler_window, evaluation_is_productive, job_id)
    read = [path for path in files if path not in copies]
    part = Part()
    results, _ = read_parts([[path] for path in read], options, part.intervals, progress=progress, workers=workers,
                            meanwhile=meanwhile)
    owners: dict[int, list[Path]] = {}
    for path, (file_part, file_problems) in zip(read, results):
        problems.extend(file_problems)
        for rank in set(file_part.ranks) | file_part.unfinished:
            owners.setdefault(rank, []).append(path)
        if path in copies.values():
            problems.extend(Problem(str(copy), None, f"the same content as {path}: already read; counted once")
                            for copy, original in copies.items() if original == path)
    groups = _together([file_part for file_part, _ in results])
    grouped = {index for group in groups for index in group}
    parts = [file_part for index, (file_part, _) in enumerate(results) if index not in grouped]
    if groups:  # their problems were said the first time
        again, _ = read_parts([[read[index] for index in group] for group in groups], options, None,
                              progress=progress, workers=workers)
        parts.extend(group_part for group_part, _ in again)
    del results
    for file_part in parts:
        shared = [rank for rank in file_part.ranks if rank in part.ranks or rank in part.unfinished]
        for rank in shared:
            file_part.unfinished.add(rank)
            part.unfinished.add(rank)
            part.ranks.pop(rank, None)
            file_part.ranks.pop(rank)
        part.update(file_part)
    problems.extend(duplicates_problem(str(path), part.duplicates[str(path)]) for path in read
                    if str(path) in part.duplicates)
    if part.unfinished:
        _recompute(part, sorted(part.unfinished), owners, read, options, problems)
    if files and not part.span_count:
        problems.append(Problem(", ".join(str(path) for path in files[:3]) + ("..." if len(files) > 3 else ""),
                                None, "no spans found"))
    report = assemble(part, problems, ideal_step_time_s=ideal_step_time_s,
                      straggler_threshold=straggler_threshold, straggler_window=straggler_window)
    add_gpu_series(report, files, job_id)  # the drain's GPU samples of the plotted ranks, where beside the traces
    return report


def _together(parts: Sequence[Part]) -> list[list[int]]:
    """Files to read again as one stream, by index: those sharing a rank or a process, each group in time order.

    The file exporter writes one file per rank, so there are usually none. A rank in several files
    needs its spans together to be accounted; a process in several (a file rotated, a retry or a
    replay written to another file, a concatenation beside its pieces) may have written the same
    spans to each. In time order (by first span), a rank's rotated files read as one stream.
    """
    parent = list(range(len(parts)))

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    first: dict[object, int] = {}
    for index, part in enumerate(parts):
        for shared in [("rank", rank) for rank in set(part.ranks) | part.unfinished] + list(part.resources):
            parent[root(index)] = root(first.setdefault(shared, index))
    groups: dict[int, list[int]] = {}
    for index in range(len(parts)):
        groups.setdefault(root(index), []).append(index)
    return [sorted(group, key=lambda index: (parts[index].start_ns is None, parts[index].start_ns or 0, index))
            for group in groups.values() if len(group) > 1]


def _recompute(part: Part, ranks: list[int], owners: dict[int, list[Path]], files: list[Path], options: Options,
               problems: list[Problem]) -> None:
    """Ranks that need their spans together: read again from their files, in memory, in the order read."""
    wanted = set(ranks)
    needed = {path for rank in ranks for path in owners.get(rank, [])}
    records: list[SpanRecord] = []
    seen: set[str] = set()
    for path in files:
        if path not in needed:
            continue
        file_records, _ = read_file(path)  # its problems were reported by the first reading
        file_records, _ = _unique([record for record in file_records if record.run.rank in wanted and (
            options.job_id is None or record.run.job_id == options.job_id)], seen)
        records.extend(file_records)
    recomputed = part_from_records(records, evaluation_is_productive=options.evaluation_is_productive,
                                   window=options.window, ranks=wanted)
    part.ranks.update(recomputed.ranks)
    part.unfinished.clear()
