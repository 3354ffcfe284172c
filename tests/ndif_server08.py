"""A stand-in NDIF server for nnsight 0.8's client, run in a fresh interpreter by the
loopback tests: real HTTP and a real websocket on 127.0.0.1, nnsight's own request
path behind them.

It serves what NDIF's API and model actor serve, with nnsight's code where NDIF uses
nnsight's code (ndif-team/ndif ``docs/developing/nnsight-integration.md``):

- ``GET /subscribe`` (websocket): the first frame is ``{"session_id": ...}``; the
  statuses of that session's jobs follow (JSON text frames, or a binary frame holding
  a pickled ``ResponseModel`` whose ``data`` is the result itself).
- ``POST /request`` (multipart: ``data`` = ``RequestModel.metadata()``, ``blob`` = the
  payload): answered RECEIVED with the job id; the job then runs on the model actor
  (one thread): ``_remoteable_set_env(request.env)``, ``RequestModel.deserialize``
  against the model's persistent objects, ``tracer.execute`` under ``inc()``/``dec()``,
  the saved locals ``torch.save``d (zstd when the request was compressed). COMPLETED
  carries the result inline when it is at most ``inline_limit`` bytes, else a URL.
- ``GET /results/{id}``: a result, once. ``GET /response/{id}``: a job's latest status,
  for ``blocking=False`` clients (404 before the first).
- ``GET /env``: what it can import (``nnsight.ndif.get_local_env``, less the blocked
  packages), or 503 while ``env`` is switched off.
- ``POST /control`` (JSON: ``stub``, ``env``, ``inline_limit``) and ``GET /stats``:
  for the tests (``stub`` answers every request with an empty result, deserializing
  nothing: the tests prove they notice).

``--block causalab_mini`` (repeatable) makes a package unimportable here, as on a
server that never installed it; this file imports nothing of causalab_mini. The server
stops itself when its standard input closes (the test process ended) or after
``--lifetime`` seconds, whichever is first. It prints one JSON line, ``{"port": N}``,
once it serves.
"""

from __future__ import annotations

import argparse
import email.parser
import email.policy
import importlib.abc
import io
import itertools
import json
import linecache
import os
import queue
import select
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Blocker(importlib.abc.MetaPathFinder):
    """Raise ModuleNotFoundError for the blocked packages, as if never installed."""

    def __init__(self, names: list[str]) -> None:
        self.names = set(names)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


class Server:
    """The model actor and the state the API keeps: sessions, statuses, results."""

    def __init__(self, model_key: str, block: list[str]) -> None:
        from nnsight.modeling.mixins.remotable import Remotable

        self.model_key = model_key
        self.block = block
        self.model = Remotable.from_model_key(model_key, dispatch=True, device_map="cpu")
        self.model._module.requires_grad_(False)
        self.persistent = self.model._remoteable_persistent_objects()
        self.port = 0
        self.ids = itertools.count()
        self.lock = threading.Lock()
        self.sessions: dict[str, queue.Queue[str | bytes]] = {}
        self.statuses: dict[str, str] = {}  # job id -> latest status JSON (non-blocking)
        self.results: dict[str, bytes] = {}
        self.jobs: queue.Queue[tuple[str, Any, bytes]] = queue.Queue()
        self.settings: dict[str, Any] = {"stub": False, "env": True, "inline_limit": 0}
        self.stats = {"requests": 0, "downloads": 0, "inline": 0, "polls": 0, "subscribed": 0}
        threading.Thread(target=self._actor, daemon=True).start()

    # ------------------------------------------------------------ statuses

    def publish(self, request: Any, response: Any, inline: bool = False) -> None:
        """A status of a job: on its session's websocket, or stored to poll."""
        session = self.sessions.get(request.session_id) if request.session_id else None
        if session is not None:
            session.put(response.pickle() if inline else response.model_dump_json())
        else:
            self.statuses[response.id] = response.model_dump_json()

    # ------------------------------------------------------------ the actor

    def _actor(self) -> None:
        from nnsight.schema.response import ResponseModel, Status

        while True:
            job, request, blob = self.jobs.get()
            self.publish(request, ResponseModel(id=job, status=Status.RUNNING))
            try:
                data = self._run(request, blob)
            except BaseException as exc:  # the actor answers every request, as NDIF's does
                text = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
                self.publish(request, ResponseModel(id=job, status=Status.ERROR, description=text))
                continue
            inline = request.session_id and len(data) <= self.settings["inline_limit"]
            if inline:
                self.stats["inline"] += 1
                done = ResponseModel(id=job, status=Status.COMPLETED, data=data)
            else:
                self.results[job] = data
                url = f"http://127.0.0.1:{self.port}/results/{job}"
                done = ResponseModel(id=job, status=Status.COMPLETED, data=url)
            self.publish(request, done, inline=bool(inline))

    def _run(self, request: Any, blob: bytes) -> bytes:
        import torch
        import zstandard
        from nnsight.schema.request import RequestModel
        from nnsight.tracing import globals as memo
        from nnsight.tracing.tracer import _saves, dec, inc

        saved: dict[str, Any] = {}
        if not self.settings["stub"]:
            # NDIF restores these around every request: they memoize compiled blocks by
            # (filename, line), which a later request from the same site would reuse
            kept = (dict(linecache.cache), dict(memo.SOURCES), dict(memo.BLOCKS))
            try:
                self.model._remoteable_set_env(request.env)
                tracer = RequestModel.deserialize(blob, self.persistent, request.compress)
                inc()
                try:
                    tracer.execute(tracer.info.code)
                    saves = _saves()
                    saved = {
                        name: value
                        for name, value in tracer.info.frame.f_locals.items()
                        if id(value) in saves
                    }
                finally:
                    dec()
            finally:
                for table, before in zip(
                    (linecache.cache, memo.SOURCES, memo.BLOCKS), kept, strict=True
                ):
                    table.clear()
                    table.update(before)
        buffer = io.BytesIO()
        torch.save(saved, buffer)
        data = buffer.getvalue()
        if request.compress:
            data = zstandard.ZstdCompressor(level=6).compress(data)
        return data

    # ------------------------------------------------------------ the API

    def submit(self, fields: dict[str, bytes]) -> str:
        from nnsight.schema.request import RequestModel
        from nnsight.schema.response import ResponseModel, Status

        request = RequestModel.model_validate_json(fields["data"])
        if request.model_key != self.model_key:
            raise LookupError(
                f"this server serves {self.model_key}, the request is for {request.model_key}"
            )
        job = f"job-{next(self.ids)}"
        self.stats["requests"] += 1
        received = ResponseModel(id=job, status=Status.RECEIVED)
        if not request.session_id:
            self.statuses[job] = received.model_dump_json()
        self.jobs.put((job, request, fields["blob"]))
        return received.model_dump_json()

    def env(self) -> dict[str, Any]:
        from nnsight.ndif import get_local_env

        env = get_local_env()
        env["packages"] = {
            name: version
            for name, version in env["packages"].items()
            if name.split(".")[0] not in self.block
        }
        return env


def _multipart(content_type: str, body: bytes) -> dict[str, bytes]:
    """The fields of a multipart/form-data body, by name."""
    head = f"Content-Type: {content_type}\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    fields: dict[str, bytes] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        fields[str(name)] = part.get_payload(decode=True) or b""
    return fields


def handler(server: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return None  # quiet: the tests read their own figures

        def _reply(self, code: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, value: Any) -> None:
            self._reply(code, json.dumps(value).encode())

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/subscribe":
                self._subscribe()
            elif path == "/env":
                if server.settings["env"]:
                    self._json(200, server.env())
                else:
                    self._json(503, {"detail": "/env is switched off on this server"})
            elif path == "/stats":
                self._json(200, server.stats)
            elif path.startswith("/results/"):
                data = server.results.pop(path.rsplit("/", 1)[-1], None)
                if data is None:
                    self._json(404, {"detail": "no such result (each is served once)"})
                    return
                server.stats["downloads"] += 1
                self._reply(200, data, "application/octet-stream")
            elif path.startswith("/response/"):
                server.stats["polls"] += 1
                status = server.statuses.get(path.rsplit("/", 1)[-1])
                if status is None:
                    self._json(404, {"detail": "no status recorded yet"})
                else:
                    self._reply(200, status.encode())
            else:
                self._json(404, {"detail": f"no route GET {path}"})

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/request":
                try:
                    answer = server.submit(_multipart(self.headers["Content-Type"], body))
                except Exception as exc:
                    self._json(400, {"detail": f"{type(exc).__name__}: {exc}"})
                    return
                self._reply(200, answer.encode())
            elif self.path == "/control":
                server.settings.update(json.loads(body))
                self._json(200, server.settings)
            else:
                self._json(404, {"detail": f"no route POST {self.path}"})

        def _subscribe(self) -> None:
            """The websocket: a session id, then that session's statuses, until the
            client closes it (websockets' sans-I/O protocol does the framing)."""
            from websockets.server import ServerProtocol

            protocol = ServerProtocol(max_size=None)
            # the handshake as it came (http.server has read it off the socket): the
            # protocol parses it, then frames what follows
            head = "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
            protocol.receive_data(f"{self.requestline}\r\n{head}\r\n".encode("latin-1"))
            (request,) = protocol.events_received()
            response = protocol.accept(request)
            protocol.send_response(response)
            sock = self.connection
            sock.sendall(b"".join(protocol.data_to_send()))
            self.close_connection = True
            if response.status_code != 101:
                return
            session = f"session-{next(server.ids)}"
            outbox: queue.Queue[str | bytes] = queue.Queue()
            server.sessions[session] = outbox
            server.stats["subscribed"] += 1
            protocol.send_text(json.dumps({"session_id": session}).encode())
            try:
                while True:
                    try:
                        message = outbox.get(timeout=0.02)
                    except queue.Empty:
                        pass
                    else:
                        if isinstance(message, bytes):
                            protocol.send_binary(message)
                        else:
                            protocol.send_text(message.encode())
                    out = b"".join(protocol.data_to_send())
                    if out:
                        sock.sendall(out)
                    if select.select([sock], [], [], 0)[0]:
                        data = sock.recv(65536)
                        if not data:
                            return
                        protocol.receive_data(data)
                        protocol.events_received()  # the client sends nothing but its close
                        out = b"".join(protocol.data_to_send())  # with the reply to a close
                        if out:
                            sock.sendall(out)
                        if protocol.close_rcvd is not None:
                            return
            except OSError:
                return
            finally:
                server.sessions.pop(session, None)

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-key", required=True)
    parser.add_argument("--block", action="append", default=[])
    parser.add_argument("--lifetime", type=float, default=900.0)
    args = parser.parse_args()
    if args.block:
        sys.meta_path.insert(0, _Blocker(args.block))

    import torch

    torch.set_num_threads(1)
    server = Server(args.model_key, args.block)
    http = ThreadingHTTPServer(("127.0.0.1", 0), handler(server))
    http.daemon_threads = True
    server.port = http.server_address[1]

    def stop_when_orphaned() -> None:
        # the test process holds our stdin: EOF means it is gone
        sys.stdin.buffer.read()
        os._exit(0)

    def stop_at_deadline() -> None:
        time.sleep(args.lifetime)
        os._exit(0)

    threading.Thread(target=stop_when_orphaned, daemon=True).start()
    threading.Thread(target=stop_at_deadline, daemon=True).start()
    print(json.dumps({"port": server.port}), flush=True)
    http.serve_forever(poll_interval=0.1)


if __name__ == "__main__":
    main()
