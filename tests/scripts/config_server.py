"""Serves its config file's text on every path; refuses to start unless the supervisor wrote that
file and created its data directory first. Exits 0 on SIGTERM.

    python config_server.py PORT CONFIG DATA_DIR
"""

import http.server
import pathlib
import signal
import sys

port, config, data = int(sys.argv[1]), pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
if not data.is_dir():
    sys.exit(f"data dir {data} missing")
body = config.read_bytes()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
print("serving", port, flush=True)
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
