"""``otel-training report --jaeger``: its memory as the job grows, spooled and streamed against held in memory.

A job from ``bench/report_job.py`` (the file exporter's format) is served by a
stand-in for Jaeger's query API in another process: the spans cut into traces
of ``--trace-spans`` spans (as ``trace_max_spans`` segments a long run), each
trace's process the span's resource, answered newest first and ``limit``
traces at a time up to ``end``, as Jaeger's search pages. Two readers run
under ``/usr/bin/time -v`` on each size, side by side:

* ``spooled``: ``otel-training report --jaeger URL`` (pages sorted and merged
  into one file in end order, streamed: ``report.jaeger.spool``);
* ``in memory``: ``report.jaeger.fetch`` then ``build_report`` (every span a
  record in memory; what the report did before).

It prints seconds, seconds per million spans, the peak RSS, and whether the two
summaries are identical. The stand-in's own memory is not counted.

Usage:
    .venv/bin/python bench/bench_report_jaeger.py [--sizes 250K,1M] [--ranks 8] [--trace-spans 100]
"""

from __future__ import annotations

import argparse
import bisect
import http.server
import json
import multiprocessing
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_report import _count
from report_job import generate

ROOT = Path(__file__).resolve().parent.parent
IN_MEMORY = """
import sys
from otel_training.report import build_report, render_summary
from otel_training.report.jaeger import fetch
records, problems = fetch(sys.argv[1], "bench", limit=10**9)
print(render_summary(build_report(records, problems)))
"""


def _tag(key: str, value: dict[str, Any]) -> dict[str, Any]:
    (kind, raw), = value.items()
    if kind == "intValue":
        return {"key": key, "type": "int64", "value": int(raw)}
    if kind == "doubleValue":
        return {"key": key, "type": "float64", "value": raw}
    if kind == "boolValue":
        return {"key": key, "type": "bool", "value": raw}
    return {"key": key, "type": "string", "value": raw}


def jaeger_traces(directory: Path, trace_spans: int) -> list[tuple[int, bytes]]:
    """(latest start µs, the trace as Jaeger's JSON) of every trace, newest first."""
    traces: list[tuple[int, bytes]] = []
    serial = 0
    for path in sorted(directory.iterdir()):
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                for resource_spans in json.loads(line)["resourceSpans"]:
                    tags = [_tag(item["key"], item["value"]) for item in resource_spans["resource"]["attributes"]]
                    service = next(tag["value"] for tag in tags if tag["key"] == "service.name")
                    process = {"p1": {"serviceName": service, "tags": [t for t in tags if t["key"] != "service.name"]}}
                    spans = [span for scope in resource_spans["scopeSpans"] for span in scope["spans"]]
                    for first in range(0, len(spans), trace_spans):
                        serial += 1
                        trace_id = format(serial, "032x")
                        chunk = [{
                            "traceID": trace_id, "spanID": span["spanId"], "operationName": span["name"],
                            "references": [], "processID": "p1",
                            "startTime": int(span["startTimeUnixNano"]) // 1000,
                            "duration": (int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])) // 1000,
                            "tags": [_tag(item["key"], item["value"]) for item in span.get("attributes", ())]
                            + ([{"key": "otel.status_code", "type": "string", "value": "ERROR"}]
                               if span.get("status", {}).get("code") == 2 else []),
                        } for span in spans[first:first + trace_spans]]
                        latest = max(span["startTime"] for span in chunk)
                        traces.append((latest, json.dumps({"traceID": trace_id, "processes": process,
                                                           "spans": chunk}).encode()))
    traces.sort(key=lambda item: -item[0])
    return traces


def serve(directory: Path, trace_spans: int, ready: Any) -> None:
    traces = jaeger_traces(directory, trace_spans)
    negated = [-latest for latest, _ in traces]  # ascending, for bisect

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = dict(item.split("=", 1) for item in self.path.split("?", 1)[1].split("&"))
            first = bisect.bisect_left(negated, -int(query.get("end", 2**62)))
            page = [body for _, body in traces[first:first + int(query["limit"])]]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"data":[' + b",".join(page) + b'],"errors":null}')

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ready.send((server.server_address[1], len(traces)))
    server.serve_forever()


def timed(command: list[str]) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-v", *command], capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))  # type: ignore[union-attr]
    return {"seconds": seconds, "rss_mb": rss / 1024, "summary": done.stdout}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="250K,1M", help="spans per job (default: %(default)s)")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--trace-spans", type=int, default=100, help="spans per trace (default: %(default)s)")
    args = parser.parse_args()
    rows = []
    for size in (_count(text) for text in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix="bench-report-jaeger-") as scratch:
            spans = generate(Path(scratch), size, args.ranks, 1, workers=2)
            receive, send = multiprocessing.Pipe(duplex=False)
            server = multiprocessing.Process(target=serve, args=(Path(scratch), args.trace_spans, send), daemon=True)
            server.start()
            port, traces = receive.recv()
            url = f"http://127.0.0.1:{port}"
            try:
                spooled = timed([sys.executable, "-m", "otel_training.cli.main", "report", "--jaeger", url,
                                 "--service", "bench", "--limit", str(10**9), "--no-html", "--no-progress"])
                memory = timed([sys.executable, "-c", IN_MEMORY, url])
            finally:
                server.terminate()
        same = spooled["summary"] == memory["summary"]
        print(f"{spans:,} spans in {traces:,} traces: spooled {spooled['seconds']:.1f} s, {spooled['rss_mb']:.0f} MB; "
              f"in memory {memory['seconds']:.1f} s, {memory['rss_mb']:.0f} MB; summaries "
              f"{'identical' if same else 'DIFFERENT'}", flush=True)
        rows.append((spans, traces, spooled, memory, same))
    print(f"\n{'spans':>9} {'traces':>7}  {'spooled s':>9} {'s/M':>5} {'MB':>5}  {'in memory s':>11} {'s/M':>5} {'MB':>6}")
    for spans, traces, spooled, memory, same in rows:
        print(f"{spans:>9,} {traces:>7,}  {spooled['seconds']:9.1f} {spooled['seconds'] / spans * 1e6:5.1f} "
              f"{spooled['rss_mb']:5.0f}  {memory['seconds']:11.1f} {memory['seconds'] / spans * 1e6:5.1f} "
              f"{memory['rss_mb']:6.0f}{'' if same else '  (summaries differ)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
