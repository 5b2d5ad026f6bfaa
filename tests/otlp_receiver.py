"""A real OTLP/HTTP trace receiver for the tests: `POST /v1/traces` with an
`ExportTraceServiceRequest` protobuf (what the replicas' OTLP exporters send), decoded with
`opentelemetry-proto` into flat `ReceivedSpan`s kept in memory."""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str | None
    name: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    links: tuple[tuple[str, str], ...] = ()  # (trace id, span id) of each linked span


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind)


def _attributes(items: Iterable[KeyValue]) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in items}


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    out: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(ReceivedSpan(
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex() or None,
                    name=span.name,
                    attributes=_attributes(span.attributes),
                    resource=resource,
                    status_code=span.status.code,
                    links=tuple((link.trace_id.hex(), link.span_id.hex())
                                for link in span.links),
                ))
    return out


class OtlpReceiver:
    """`start()` listens on a free loopback port; `url` is the OTEL_EXPORTER_OTLP_ENDPOINT."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self.requests = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                try:
                    spans = decode(body)
                except Exception:  # noqa: BLE001 - a bad body is the sender's bug: say so
                    self.send_error(400, "not an ExportTraceServiceRequest")
                    return
                with receiver._lock:
                    receiver._spans.extend(spans)
                    receiver.requests += 1
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return None

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="otlp-receiver")

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def spans(self, trace_id: str | None = None) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]

    def wait_for(
        self, trace_id: str, names: Iterable[str], timeout_s: float = 60.0, settle_s: float = 2.0
    ) -> list[ReceivedSpan]:
        """The trace's spans once every name in `names` arrived and nothing new came for
        `settle_s` (or whatever came by the deadline: the caller's assertions say what is
        missing)."""
        wanted = set(names)
        deadline = time.monotonic() + timeout_s
        count, quiet_since = -1, time.monotonic()
        while True:
            spans = self.spans(trace_id)
            now = time.monotonic()
            if len(spans) != count:
                count, quiet_since = len(spans), now
            if now > deadline or (
                wanted <= {s.name for s in spans} and now - quiet_since >= settle_s
            ):
                return spans
            time.sleep(0.2)
