"""`lemur-eval serve`: an OpenAI-compatible HTTP server over a lemur model, so lm-eval's
`local-completions` / `local-chat-completions` (or any OpenAI client) evaluates it.

    lemur-eval serve CHECKPOINT [--host 127.0.0.1] [--port 8000] [--api-key KEY]
                     [--max-prompt-tokens N] [--max-tokens N] [--max-queue N] [--batch-size N]

Endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health.
The standard library's ThreadingHTTPServer: a thread per connection parses and checks a
request (lemur.eval.serve_api) and waits while the one worker (lemur.eval.serve_engine)
runs it batched with whatever else came in. Bad requests get a 4xx with OpenAI's one-line
JSON error; a bug gets a 500 with one line (its traceback goes to the server's log).

It binds 127.0.0.1; any other `--host` needs `--api-key` (a model server on a network
without a key is anyone's), then checked on every request as a Bearer token in constant
time. SIGTERM or Ctrl-C drains: no new connection is accepted, requests in flight are
answered, idle keep-alive connections are closed, the worker finishes, and the command
exits 0 (SIGTERM: stopping is what a supervisor asks of a server) or 130 (Ctrl-C).
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import http.server
import json
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from lemur.cli_common import EXIT_SIGINT, die, positive_int
from lemur.eval import cli_args
from lemur.eval import serve_api as api

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_BODY_BYTES = 64 * 2**20  # a request body above this is refused unread (413)
DEFAULT_PORT = 8000
IDLE_TIMEOUT_S = 600


def add_parser(sub: Any) -> None:
    """The `serve` subcommand."""
    p = sub.add_parser("serve", help="an OpenAI-compatible server (/v1/completions, chat)")
    cli_args.model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (others need --api-key)")
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="0: any free port (the log says which)"
    )
    p.add_argument("--api-key", default=None, help="Bearer token every request must carry")
    p.add_argument(
        "--max-prompt-tokens",
        type=positive_int,
        default=None,
        help="longest prompt (default the model's context); longer ones get a 400",
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=None,
        help="most new tokens of one choice (default the model's context)",
    )
    p.add_argument(
        "--max-queue",
        type=positive_int,
        default=256,
        help="rows (prompts x n) held at once; more get a 429, a larger request a 400",
    )
    p.add_argument("--batch-size", type=positive_int, default=16, help="rows decoded together")
    p.add_argument(
        "--name", default=None, help="the model's id in /v1/models (default: its folder)"
    )


class Server(http.server.ThreadingHTTPServer):
    """The HTTP server: its engine, key and the connections open (closed when draining)."""

    daemon_threads = False  # server_close() joins them: requests in flight get answered
    request_queue_size = 1024  # the listen backlog: socketserver's 5 resets a burst of clients
    block_on_close = True

    def __init__(self, address: tuple[str, int], engine: Any, api_key: str | None) -> None:
        self.engine = engine
        self.api_key = api_key
        self.draining = False
        self.started = int(time.time())
        self._open: dict[socket.socket, bool] = {}  # connection -> mid-request
        self._open_lock = threading.Lock()
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.address_family = family
        super().__init__(address, Handler)

    def mark(self, conn: socket.socket, busy: bool | None) -> bool:
        """Note a connection busy, idle or (None) gone; False when draining (close it)."""
        with self._open_lock:
            if busy is None:
                self._open.pop(conn, None)
            else:
                self._open[conn] = busy
            return not self.draining

    def drain(self) -> None:
        """Stop accepting, close idle connections, wait for the requests in flight."""
        self.shutdown()  # serve_forever returns: no new connection is accepted
        with self._open_lock:
            self.draining = True
            idle = [c for c, busy in self._open.items() if not busy]
        for conn in idle:  # a thread waiting for its next request reads EOF and ends
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self.server_close()  # joins every connection's thread


class Handler(http.server.BaseHTTPRequestHandler):
    """One connection: each request checked, run and answered as JSON."""

    protocol_version = "HTTP/1.1"  # keep-alive: lm-eval's clients reuse connections
    # A connection silent this long (between requests, or mid-request: a client that sends
    # half a body) is closed, so none holds its thread for ever. A request's own answer is
    # waited for without a socket read, however long the decode takes.
    timeout = IDLE_TIMEOUT_S
    server: Server

    def setup(self) -> None:
        """Register the connection (idle until a request line arrives)."""
        super().setup()
        self.server.mark(self.connection, False)

    def finish(self) -> None:
        """Forget the connection."""
        self.server.mark(self.connection, None)
        super().finish()

    def parse_request(self) -> bool:
        """http.server's parse of the request line and headers; the connection is now busy
        (and closes after this request when the server is draining)."""
        if not self.server.mark(self.connection, True):
            self.close_connection = True
        return super().parse_request()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """Access log lines are left out (a harness sends thousands); errors are logged."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        """/health and /v1/models."""
        self._answer(lambda: self._get())

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        """/v1/completions and /v1/chat/completions."""
        self._answer(lambda: self._post())

    def _get(self) -> dict[str, Any]:
        """The answer to a GET."""
        path = self.path.split("?")[0].rstrip("/")
        if path == "/health":
            return {"status": "ok", "rows": self.server.engine.held}
        if path == "/v1/models":
            return api.models_list(self.server.engine.model.name, self.server.started)
        raise api.ApiError(404, f"no such endpoint: GET {path}", "not_found_error")

    def _post(self) -> dict[str, Any]:
        """The answer to a POST."""
        path = self.path.split("?")[0].rstrip("/")
        engine = self.server.engine
        if path == "/v1/completions":
            return engine.answer_completion(api.completion_request(self._body(), engine.limits))
        if path == "/v1/chat/completions":
            return engine.answer_chat(api.chat_request(self._body(), engine.limits))
        raise api.ApiError(404, f"no such endpoint: POST {path}", "not_found_error")

    def _body(self) -> Any:
        """The request's JSON body (400 when it is not JSON, 413 when too long)."""
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise api.ApiError(411, "a request body needs a Content-Length")
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True  # the body is left unread
            raise api.ApiError(413, f"a request body over {MAX_BODY_BYTES} bytes")
        raw = self.rfile.read(int(length))
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, ValueError) as e:
            raise api.bad(f"the body is not valid JSON: {e}") from None

    def _authorized(self) -> bool:
        """Whether the request carries the server's key (always, without one)."""
        key = self.server.api_key
        if key is None:
            return True
        given = self.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        # compare_digest: the time taken says nothing about how much of the key matched.
        ok = hmac.compare_digest(token.strip().encode(), key.encode())
        return scheme.lower() == "bearer" and ok

    def _answer(self, make: Any) -> None:
        """Run `make` and send its JSON, or the error it raised as OpenAI's error object."""
        try:
            if not self._authorized():
                raise api.ApiError(
                    401,
                    "a valid API key is needed (Authorization: Bearer KEY)",
                    "authentication_error",
                )
            status, body = 200, make()
        except api.ApiError as e:
            status, body = e.status, e.body()
        except ValueError as e:  # a check of the library's (UserError among them)
            status, body = 400, api.bad(str(e).splitlines()[0]).body()
        except Exception as e:  # noqa: BLE001 - a bug: one line to the client, the log has it
            traceback.print_exc(file=sys.stderr)
            status = 500
            body = api.ApiError(500, f"internal error: {type(e).__name__}", "server_error").body()
        if self.command == "POST" and self.headers.get("Content-Length") is None:
            self.close_connection = True
        self._send(status, body)
        self.server.mark(self.connection, False)
        if self.server.draining:
            self.close_connection = True

    def _send(self, status: int, body: dict[str, Any]) -> None:
        """Write one JSON response."""
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 429:
            self.send_header("Retry-After", "1")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        with contextlib.suppress(OSError):  # the client went away: nothing to tell it
            self.wfile.write(data)


def _check_host(args: argparse.Namespace) -> None:
    """Refuse a non-loopback address without a key, and an empty key."""
    if args.api_key is not None and not args.api_key.strip():
        die("--api-key: an empty key")
    if args.host not in LOOPBACK and args.api_key is None:
        die(f"--host {args.host}: serving beyond this machine needs --api-key KEY")
    if not 0 <= args.port <= 65535:
        die(f"--port {args.port}: not a port (0 .. 65535; 0 picks a free one)")


def _engine(args: argparse.Namespace) -> Any:
    """The loaded model and its engine, with the limits of the command line."""
    from lemur.eval.serve_engine import Engine, Model
    from lemur.model.decode import split_layers

    model = cli_args.load_checkpoint(args)
    cli_args.need_tokenizer(args, model)
    context = model.config.max_seq_len
    limits = api.Limits(
        context=context,
        max_prompt_tokens=min(args.max_prompt_tokens or context, context),
        max_tokens=min(args.max_tokens or context, context),
        max_rows=args.max_queue,
    )
    name = args.name or Path(args.checkpoint).resolve().name
    # Scoring runs the stacked layers (one scan), decoding per-layer weights: both are kept.
    served = Model(model.config, model.params, split_layers(model.params), model.tokenizer, name)
    return Engine(served, limits, args.batch_size)


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or Ctrl-C, then drain and exit 0 (130 for Ctrl-C)."""
    _check_host(args)
    engine = _engine(args)
    try:
        server = Server((args.host, args.port), engine, args.api_key)
    except OSError as e:
        die(f"--host {args.host} --port {args.port}: cannot listen: {e.strerror or e}")
    stop = threading.Event()
    got: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        got.append(signum)
        stop.set()

    before = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        engine.start()
        thread = threading.Thread(target=server.serve_forever, name="serve-accept", daemon=True)
        thread.start()
        host, port = server.server_address[:2]
        cli_args.say(
            f"serving {engine.model.name} on http://{host}:{port}/v1 "
            f"(context {engine.limits.context}, batch {args.batch_size})"
        )
        while not stop.wait(0.5):
            pass
        cli_args.say("draining: answering the requests in flight")
        server.drain()
        engine.stop()
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
    cli_args.say(f"stopped after {engine.jobs} requests in {engine.passes} batches")
    return EXIT_SIGINT if got and got[0] == signal.SIGINT else 0
