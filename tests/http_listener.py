"""A local HTTP listener that records every request it gets: the target a client-chosen URL
would point the server at. The tests that say "the server never fetches it" assert it saw
nothing; answering 200 with a JSON schema is what would make a fetch succeed."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_BODY = b'{"type": "integer"}'


class RecordingListener:
    """An HTTP server on 127.0.0.1 (a free port) that answers every GET or POST with a JSON
    schema and records the path in `hits`."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        hits = self.hits

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                hits.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(_BODY)))
                self.end_headers()
                self.wfile.write(_BODY)

            do_GET = _answer  # noqa: N815 - the stdlib's names
            do_POST = _answer  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
