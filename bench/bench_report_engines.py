"""Which engine should parse the report's OTLP JSON: the standard library, orjson, or a columnar one.

One rank's file (the file exporter's format, ``bench/report_job.py``) is read
by each engine into what the report's accounting consumes per span (name,
start, end, and the attributes of the spans it reads them of), in one
process, and the microseconds per span are printed side by side. The columnar
engines (pyarrow's JSON reader: nested lists of structs, flattened with
compute kernels) hand the accounting Python values in the end, because the
goodput sweep runs span by span in time order; that conversion is part of
their time. An engine not installed is reported as such.

Usage:
    .venv/bin/python bench/bench_report_engines.py [--spans 500000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_job import generate

from otel_training.report.reader import FileScan
from otel_training.report.stream import _convert, digest_file


def _scan(loads: Callable[[bytes], object]) -> Callable[[Path], int]:
    def run(path: Path) -> int:
        return sum(len(spans) for resources in FileScan(path, _convert, loads=loads)  # type: ignore[arg-type]
                   for _key, _service, _role, spans in resources)
    return run


def _pyarrow(path: Path) -> int:
    import pyarrow.compute as pc
    import pyarrow.json as pj

    table = pj.read_json(path)
    scopes = pc.list_flatten(pc.struct_field(pc.list_flatten(table.column("resourceSpans")), "scopeSpans"))
    spans = pc.list_flatten(pc.struct_field(scopes, "spans"))
    names = pc.struct_field(spans, "name").to_pylist()
    starts = pc.cast(pc.struct_field(spans, "startTimeUnixNano"), "int64").to_pylist()
    ends = pc.cast(pc.struct_field(spans, "endTimeUnixNano"), "int64").to_pylist()
    attributes = pc.struct_field(spans, "attributes")
    wanted = pc.is_in(pc.struct_field(spans, "name"), value_set=__import__("pyarrow").array(
        ["training.step", "training.save_checkpoint", "training.load_checkpoint", "training.alert"]))
    attributes.filter(wanted).to_pylist()
    return len(names) + 0 * len(starts) + 0 * len(ends)


def _one_thread(engine: Callable[[Path], int]) -> Callable[[Path], int]:
    """As a worker among one per core would run it: pyarrow's pool limited to one thread."""
    def run(path: Path) -> int:
        import pyarrow

        threads = pyarrow.cpu_count()
        pyarrow.set_cpu_count(1)
        try:
            return engine(path)
        finally:
            pyarrow.set_cpu_count(threads)
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=500_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    engines: dict[str, Callable[[Path], int]] = {"json (standard library)": _scan(json.loads)}
    try:
        import orjson

        engines["orjson"] = _scan(orjson.loads)
    except ImportError:
        print("orjson: not installed")
    try:
        import pyarrow.json  # noqa: F401

        engines["pyarrow.json + compute, to Python (its threads)"] = _pyarrow
        engines["pyarrow.json + compute, to Python (1 thread)"] = _one_thread(_pyarrow)
    except ImportError:
        print("pyarrow: not installed")
    for name in ("polars", "duckdb"):
        try:
            __import__(name)
            print(f"{name}: installed but not measured here")
        except ImportError:
            print(f"{name}: not installed, not measured")
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as scratch:
        spans = generate(Path(scratch), args.spans, 1, 0)
        path = Path(scratch) / "traces-r0.jsonl"
        print(f"{spans:,} spans, {path.stat().st_size / 1e6:.0f} MB, one file; best of {args.repeat}")
        gc.disable()
        best: dict[str, float] = {}
        for name, engine in engines.items():
            timings = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                assert engine(path) == spans
                timings.append(time.perf_counter() - started)
            best[name] = min(timings)
        started = time.perf_counter()
        digest_file(path, window=10)
        best["whole worker (orjson where installed): parse + accounting"] = time.perf_counter() - started
        gc.enable()
    baseline = best["json (standard library)"]
    print(f"\n{'engine':<58} {'us/span':>8} {'vs json':>8}")
    for name, seconds in best.items():
        print(f"{name:<58} {seconds / spans * 1e6:8.2f} {baseline / seconds:7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
