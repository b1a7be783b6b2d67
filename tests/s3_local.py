"""A real S3 server on 127.0.0.1 for tests (moto's), and a fault proxy in front of it.

As s3fs's own tests do: `ThreadedMotoServer(ip_address="127.0.0.1", port=0)`, dummy
credentials, empty AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE (no profile of the machine
is read), the endpoint given through `client_kwargs`. `FaultProxy` forwards HTTP to it,
logs every request (so a test can count LIST and GET requests) and answers the first
requests with the faults it is given: 503 SlowDown, 429, or a connection reset.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

KEY, SECRET = "lemur-test-key", "lemur-test-secret-do-not-write-me-0123456789"
FAULT_BODY = {
    "503": (
        503,
        b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>",
    ),
    "429": (
        429,
        b"<Error><Code>TooManyRequests</Code><Message>Too many requests</Message></Error>",
    ),
}


@contextlib.contextmanager
def moto_s3(tmp: Path) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 for the block, with dummy credentials; its endpoint."""
    from moto.server import ThreadedMotoServer

    (tmp / "empty").write_text("")
    env = {
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "empty"),
        "AWS_CONFIG_FILE": str(tmp / "empty"),
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def options(endpoint: str) -> dict:
    """s3fs storage options for the local server, the credentials given explicitly."""
    return {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint}}


def upload(endpoint: str, bucket: str, files: dict[str, bytes]) -> None:
    """Create `bucket` and put each `key: bytes` into it."""
    import boto3

    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET
    )
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)
    for key, data in files.items():
        client.put_object(Bucket=bucket, Key=key, Body=data)


def upload_tree(endpoint: str, bucket: str, root: Path, prefix: str = "") -> None:
    """Upload every file under `root` to `bucket/prefix/...`, keeping relative paths."""
    files = {
        (prefix + "/" if prefix else "") + str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
    upload(endpoint, bucket, files)


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of `target`: logs requests, injects faults.

    `faults` is consumed one per request, first to last: "503" and "429" answer with that
    status and an S3 error body; "reset" closes the connection with a TCP RST and no answer;
    "stall" waits `stall_s` before forwarding (a read timeout for a client that waits less);
    None forwards the request. Once it is empty every request is forwarded. With
    `only_reads`, only ranged object GETs (a task's reads, not the listing) take faults.
    """

    def __init__(self, target: str) -> None:
        self.target = target.removeprefix("http://")
        self.faults: list[str | None] = []
        self.only_reads = False
        self.stall_s = 0.0
        self.faulted = 0  # requests answered with a fault
        self.requests: list[tuple[str, str]] = []  # (method, path with query)
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _any(self) -> None:
                proxy.handle(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        """The proxy's URL."""
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def count(self, method: str, needle: str = "") -> int:
        """Requests of `method` whose path contains `needle` (e.g. `list-type=2`)."""
        with self.lock:
            return sum(1 for m, p in self.requests if m == method and needle in p)

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        """Answer one request: a fault, or moto's answer."""
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        with self.lock:
            self.requests.append((h.command, h.path))
            takes = not self.only_reads or (h.command == "GET" and "Range" in h.headers)
            fault = self.faults.pop(0) if self.faults and takes else None
            self.faulted += fault is not None
        if fault == "stall":
            time.sleep(self.stall_s)
        if fault == "reset":
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.connection.close()
            h.close_connection = True
            return
        if fault in FAULT_BODY:
            status, payload = FAULT_BODY[fault]
            h.send_response(status)
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(payload)
            return
        conn = http.client.HTTPConnection(self.target, timeout=60)
        headers = {k: v for k, v in h.headers.items() if k.lower() != "connection"}
        conn.request(h.command, h.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        h.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                h.send_header(k, v)
        h.send_header(
            "Content-Length",
            str(len(data)) if h.command != "HEAD" else resp.getheader("Content-Length", "0"),
        )
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)
        conn.close()

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
