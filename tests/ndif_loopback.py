"""The client half of the NDIF loopback: nnsight's real ``RemoteBackend`` talks to a
stand-in NDIF worker in a separate, fresh interpreter. On nnsight 0.6/0.7
(``Worker``, ``Loopback``) the worker is ``ndif_server.py`` and the wire is replaced
in-process, as below; on nnsight 0.8 (``HttpServer``, ``HttpLoopback``, at the end)
the server is ``ndif_server08.py``, on real HTTP and a real websocket, and nothing of
the client is replaced.

0.6/0.7:
Only the wire is replaced, in-process: the backend's HTTP client gets an
``httpx.MockTransport`` (POST /request, GET of the result URL) and its Socket.IO
client a queue of the pickled ``ResponseModel`` messages an NDIF API would push
(RUNNING, then COMPLETED with the result's URL, or ERROR with the server's
traceback). Serialization, deserialization, execution and the result download are
nnsight's own code on both ends.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import pickle
import struct
import subprocess
import sys
import types
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

HOST = "http://ndif.loopback.test"
SERVER = Path(__file__).with_name("ndif_server.py")


class ServerError(RuntimeError):
    pass


class Worker:
    """The stand-in NDIF worker process."""

    def __init__(self, block: tuple[str, ...] = ()) -> None:
        args = [sys.executable, str(SERVER)]
        for name in block:
            args += ["--block", name]
        self.block = block
        self.process = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.requests = 0

    def send(self, *message: Any) -> None:
        assert self.process.stdin is not None
        data = pickle.dumps(message)
        self.process.stdin.write(struct.pack("<Q", len(data)) + data)
        self.process.stdin.flush()

    def receive(self) -> Any:
        assert self.process.stdout is not None
        head = self.process.stdout.read(8)
        if len(head) < 8:
            raise ServerError(f"the worker exited with {self.process.wait()}")
        (size,) = struct.unpack("<Q", head)
        status, payload = pickle.loads(self.process.stdout.read(size))
        if status == "error":
            raise ServerError(payload)
        return payload

    def call(self, *message: Any) -> Any:
        self.send(*message)
        return self.receive()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send("quit")
        with contextlib.suppress(Exception):
            self.process.stdin.close()  # type: ignore[union-attr]
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class _Socket:
    """Socket.IO's SimpleClient as the backend uses it, fed by the loopback."""

    def __init__(self, loop: Loopback) -> None:
        self.loop = loop
        self.sid = "loopback-session"

    def __enter__(self) -> _Socket:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def connect(self, *args: Any, **kwargs: Any) -> None:
        return None

    def emit(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("the loopback streams nothing back to the server")

    def receive(self, timeout: float | None = None) -> list[Any]:
        if not self.loop.pushed:
            raise AssertionError("the backend waits for a message the server never sent")
        return ["blocking_response", self.loop.pushed.popleft()]


class Loopback:
    """Route nnsight's RemoteBackend to ``worker``; count what crossed the wire."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.pushed: deque[bytes] = deque()
        self.results: dict[str, bytes] = {}
        self.ids = itertools.count()
        self.sent: list[dict[str, Any]] = []
        self.downloads = 0
        self.inline = 0  # 0.6/0.7's client downloads every result

    @property
    def requests(self) -> int:
        return len(self.sent)

    # ------------------------------------------------------------ the wire

    def handle(self, request: httpx.Request) -> httpx.Response:
        from nnsight.schema.response import ResponseModel

        if request.method == "POST" and request.url.path == "/request":
            job = f"job-{next(self.ids)}"
            headers = dict(request.headers)
            body = request.read()
            self.sent.append({"headers": headers, "bytes": len(body)})
            running = ResponseModel(id=job, status=ResponseModel.JobStatus.RUNNING)
            self.pushed.append(running.pickle())
            try:
                data = self.worker.call("request", headers, body)
            except ServerError as exc:
                error = ResponseModel(
                    id=job, status=ResponseModel.JobStatus.ERROR, description=str(exc)
                )
                self.pushed.append(error.pickle())
            else:
                self.results[job] = data
                done = ResponseModel(
                    id=job,
                    status=ResponseModel.JobStatus.COMPLETED,
                    data=(f"{HOST}/results/{job}", len(data)),
                )
                self.pushed.append(done.pickle())
            received = ResponseModel(id=job, status=ResponseModel.JobStatus.RECEIVED)
            return httpx.Response(200, json=json.loads(received.model_dump_json()))
        if request.method == "GET" and request.url.path.startswith("/results/"):
            job = request.url.path.rsplit("/", 1)[-1]
            data = self.results.pop(job)
            self.downloads += 1
            return httpx.Response(200, content=data, headers={"Content-length": str(len(data))})
        return httpx.Response(404, json={"detail": f"no route {request.method} {request.url}"})

    @contextlib.contextmanager
    def installed(self, env: bool = True) -> Iterator[Loopback]:
        """nnsight's remote client, with this loopback as its network. With ``env``,
        the server's environment is what ``nnsight.ndif.get_remote_env`` answers (as
        NDIF's /env does); without, asking fails as on a server that does not say."""
        import nnsight.ndif as ndif
        from nnsight import CONFIG
        from nnsight.intervention.backends import remote

        transport = httpx.MockTransport(self.handle)

        def client(*args: Any, **kwargs: Any) -> httpx.Client:
            return httpx.Client(*args, transport=transport, **kwargs)

        wire = types.SimpleNamespace(**{k: getattr(httpx, k) for k in ("Timeout", "Response")})
        wire.Client = client
        sockets = types.SimpleNamespace(
            SimpleClient=lambda *a, **k: _Socket(self),
            exceptions=remote.socketio.exceptions,
        )
        saved = (remote.httpx, remote.socketio, ndif.NDIF_ENV, ndif.get_remote_env)
        saved_host, saved_logging = CONFIG.API.HOST, CONFIG.APP.REMOTE_LOGGING
        remote.httpx, remote.socketio = wire, sockets  # type: ignore[assignment]
        CONFIG.API.HOST, CONFIG.APP.REMOTE_LOGGING = HOST, False
        if env:
            ndif.NDIF_ENV = self.worker.call("env")
        else:

            def unreachable(force_refresh: bool = False) -> dict[str, Any]:
                raise Exception("Failed to fetch NDIF environment: not served here")

            ndif.NDIF_ENV = None
            ndif.get_remote_env = unreachable  # type: ignore[assignment]
        try:
            yield self
        finally:
            remote.httpx, remote.socketio, ndif.NDIF_ENV, ndif.get_remote_env = saved
            CONFIG.API.HOST, CONFIG.APP.REMOTE_LOGGING = saved_host, saved_logging
            self.pushed.clear()


# ---------------------------------------------------------------------- nnsight 0.8

SERVER_08 = Path(__file__).with_name("ndif_server08.py")


class HttpServer:
    """nnsight 0.8: the stand-in NDIF server (``ndif_server08.py``) in a fresh
    interpreter, serving ``model_key`` on 127.0.0.1 over real HTTP and a real
    websocket; nnsight's unmodified client talks to it. It stops when this process
    closes its stdin (or dies), or after ``lifetime`` seconds."""

    def __init__(self, model_key: str, block: tuple[str, ...] = (), lifetime: float = 900) -> None:
        args = [sys.executable, str(SERVER_08), "--model-key", model_key]
        args += ["--lifetime", str(lifetime)]
        for name in block:
            args += ["--block", name]
        self.block = block
        self.process = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.port: int | None = None

    def ready(self) -> HttpServer:
        """Wait for the server's ``{"port": N}`` line (it has loaded the model)."""
        if self.port is None:
            assert self.process.stdout is not None
            line = self.process.stdout.readline()
            if not line:
                raise ServerError(f"the server exited with {self.process.wait()}")
            self.port = int(json.loads(line)["port"])
        return self

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.ready().port}"

    def control(self, **settings: Any) -> dict[str, Any]:
        answer: dict[str, Any] = httpx.post(f"{self.host}/control", json=settings).json()
        return answer

    def stats(self) -> dict[str, int]:
        answer: dict[str, int] = httpx.get(f"{self.host}/stats").json()
        return answer

    def call(self, command: str, on: Any) -> None:
        """The stand-in worker's ``("stub", on)``, as a setting of this server."""
        self.control(**{command: on})

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.process.stdin.close()  # type: ignore[union-attr]
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class HttpLoopback:
    """nnsight 0.8's remote client pointed at an ``HttpServer`` (its configured host),
    with what crossed the wire counted by the server itself."""

    def __init__(self, server: HttpServer) -> None:
        self.worker = server
        self.base = server.stats()

    def _count(self, name: str) -> int:
        return self.worker.stats()[name] - self.base[name]

    @property
    def requests(self) -> int:
        return self._count("requests")

    @property
    def downloads(self) -> int:
        return self._count("downloads")

    @property
    def inline(self) -> int:
        return self._count("inline")

    @contextlib.contextmanager
    def installed(self, env: bool = True) -> Iterator[HttpLoopback]:
        """nnsight's configured host is this server. Without ``env`` the server's /env
        answers 503, as a server that does not say (the client's per-host memory of
        /env answers is set aside meanwhile, so it asks)."""
        from nnsight import CONFIG

        from causalab_mini import remote

        host = self.worker.host
        saved_host, saved_logging = CONFIG.API.HOST, CONFIG.APP.REMOTE_LOGGING
        CONFIG.API.HOST, CONFIG.APP.REMOTE_LOGGING = host, False
        answer = remote._ANSWERS.pop(host, None)
        if not env:
            self.worker.control(env=False)
        try:
            yield self
        finally:
            if not env:
                self.worker.control(env=True)
                remote._UNANSWERED.discard(host)
                remote._ANSWERS.pop(host, None)
            if answer is not None:
                remote._ANSWERS[host] = answer
            CONFIG.API.HOST, CONFIG.APP.REMOTE_LOGGING = saved_host, saved_logging
