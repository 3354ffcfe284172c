"""A stand-in NDIF model worker, run in a fresh interpreter by the loopback tests.

It does what ndif-team/ndif's request path does with a request body, with nnsight's
own code: load the model its key names (``RemoteableMixin.from_model_key``, as an
NDIF deployment does), ``RequestModel.deserialize`` the body against that model's
persistent objects, ``tracer.execute`` the interventions, and hand back the saved
values as ``torch.save`` bytes (zstd-compressed when the request says so). Only the
wire differs: length-prefixed pickles on stdin/stdout instead of HTTP, so nothing
touches the network.

``--block causalab_mini`` (repeatable) makes a package unimportable here, as on a
server that never installed it. This file imports nothing of causalab_mini.

Commands (each a pickled tuple): ``("load", model_key, kwargs)``, ``("env",)``,
``("describe",)``, ``("request", headers, body)``, ``("stub", on)`` (answer requests
with an empty result, deserializing nothing: the tests prove they notice), ``("quit",)``.
"""

from __future__ import annotations

import argparse
import importlib.abc
import io
import os
import pickle
import struct
import sys
import traceback
from typing import Any


class _Blocker(importlib.abc.MetaPathFinder):
    """Raise ModuleNotFoundError for the blocked packages, as if never installed."""

    def __init__(self, names: list[str]) -> None:
        self.names = set(names)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def _read(stream: Any) -> Any:
    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(size))


def _write(stream: Any, message: Any) -> None:
    data = pickle.dumps(message)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--block", action="append", default=[])
    args = parser.parse_args()
    if args.block:
        sys.meta_path.insert(0, _Blocker(args.block))
    # the protocol owns the real stdout; anything printed goes to stderr
    wire_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    wire_in = sys.stdin.buffer

    import torch
    import zstandard
    from nnsight.intervention.tracing.globals import Globals
    from nnsight.modeling.mixins import RemoteableMixin
    from nnsight.ndif import get_local_env
    from nnsight.schema.request import RequestModel

    torch.set_num_threads(1)
    model: Any = None
    model_key: str | None = None
    persistent: dict[str, Any] = {}
    stubbed = False  # ("stub", True): answer requests without deserializing or running them

    while True:
        message = _read(wire_in)
        if message is None or message[0] == "quit":
            wire_out.flush()
            os._exit(0)  # nothing to clean up: skip the interpreter's slow teardown
        try:
            if message[0] == "load":
                _, model_key, kwargs = message
                model = RemoteableMixin.from_model_key(model_key, dispatch=True, **kwargs)
                model._module.requires_grad_(False)
                persistent = model._remoteable_persistent_objects()
                _write(wire_out, ("ok", None))
            elif message[0] == "env":  # what NDIF's /env reports: what it can import
                env = get_local_env()
                env["packages"] = {
                    name: version
                    for name, version in env["packages"].items()
                    if name.split(".")[0] not in args.block
                }
                _write(wire_out, ("ok", env))
            elif message[0] == "describe":
                config = model._module.config
                described = {
                    "attn_implementation": config._attn_implementation,
                    "dtype": str(next(model._module.parameters()).dtype),
                    "modules": sorted(m for m in sys.modules if "." not in m),
                }
                _write(wire_out, ("ok", described))
            elif message[0] == "stub":
                stubbed = bool(message[1])
                _write(wire_out, ("ok", None))
            elif message[0] == "request" and stubbed:
                buffer = io.BytesIO()
                torch.save({}, buffer)
                data = buffer.getvalue()
                compress = message[1].get("nnsight-compress", "True").lower() == "true"
                if compress:
                    data = zstandard.ZstdCompressor(level=6).compress(data)
                _write(wire_out, ("ok", data))
            elif message[0] == "request":
                _, headers, body = message
                sent_key = headers.get("nnsight-model-key")
                if sent_key != model_key:
                    raise ValueError(
                        f"Model mismatch: this server serves {model_key}, the request is for "
                        f"{sent_key}"
                    )
                compress = headers.get("nnsight-compress", "True").lower() == "true"
                request = RequestModel.deserialize(body, persistent, compress)
                enter = getattr(Globals, "enter", None)  # nnsight < 0.7 keeps a stack
                if enter is not None:
                    Globals.stack = 0
                    enter()
                try:
                    saves = request.tracer.execute(request.interventions)
                finally:
                    if enter is not None:
                        Globals.exit()
                    Globals.saves.clear()
                buffer = io.BytesIO()
                torch.save(saves, buffer)
                data = buffer.getvalue()
                if compress:
                    data = zstandard.ZstdCompressor(level=6).compress(data)
                _write(wire_out, ("ok", data))
            else:
                raise ValueError(f"unknown command {message[0]!r}")
        except BaseException as exc:  # the worker answers every request, as NDIF does
            _write(wire_out, ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


if __name__ == "__main__":
    main()
