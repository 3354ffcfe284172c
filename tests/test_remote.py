"""Remote execution: plans as plain nnsight module accesses equal the native plan on
every component; a loopback through nnsight's own client and a stand-in NDIF worker
in a fresh interpreter (one with causalab_mini importable, one without) returns
every read exactly as a local trace; remote loads keep the weights off the client;
an offloaded model reads and writes every place as a resident one."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from causalab_mini import compat, remote
from causalab_mini.components import ComponentAddress, Plan, component_status, locate
from causalab_mini.errors import PlaceUnavailable
from causalab_mini.generated import COMPONENTS
from causalab_mini.model import StandardizedTransformer
from causalab_mini.tools import certify as c

from .conftest import load_model as load
from .ndif_loopback import HttpLoopback, HttpServer, Loopback, Worker

pytestmark = [pytest.mark.slow, pytest.mark.semantic]


def eager(family: str) -> StandardizedTransformer:
    """tiny:<family> with attention probabilities enabled, the session's shared one."""
    return load(f"tiny:{family}", True)


# The NDIF loopback is the installed nnsight's: on 0.6/0.7 a stand-in worker behind
# the client's own wire replaced in-process (ndif_server.py); on 0.8 a real HTTP and
# websocket server on 127.0.0.1 that nnsight's unmodified client talks to
# (ndif_server08.py). The same tests run against either.


def computed(model: StandardizedTransformer, address: ComponentAddress) -> bool:
    """Whether the place is computed from a module's weight (attention_head_output):
    refused in plain programs, which carry no weights (tested below)."""
    if address.accessor not in model.internals:  # an interior of a forward
        return False
    return bool(model.internals[address.accessor].address_at(address.layer).heads_through)


def flat(model: StandardizedTransformer, address: ComponentAddress) -> bool:
    """Whether the block holds the place with batch and sequence in one axis (a
    mixture of experts' router): viewed back with the layer input's batch and
    sequence, which only a local forward records, so refused in plain programs."""
    if address.accessor not in model.internals:  # an interior of a forward
        return False
    return bool(model.internals[address.accessor].address_at(address.layer).flat_tokens)


def every_address(
    model: StandardizedTransformer, heads: bool = True, weights: bool = True
) -> list[ComponentAddress]:
    """Every component the model has, on every layer, and one head of the per-head
    ones (the last: a slice that starts at 0 would hide an offset gone wrong); without
    ``weights``, not the places computed from a module's weight, nor those held flat."""
    out: list[ComponentAddress] = []
    for layer in range(model.num_layers):
        for name, (address, _) in component_status(model, layer).items():
            if address is None or (not COMPONENTS[name].per_layer and layer):
                continue
            if not weights and (computed(model, address) or flat(model, address)):
                continue
            out.append(address)
            if heads and address.heads and (address.head_dim or address.layout == "bhsk"):
                out.append(locate(model, name, layer, address.heads - 1))
    return out


def fresh(value: torch.Tensor) -> torch.Tensor:
    # a model may add into the tensor it was handed (Falcon's parallel MLP output):
    # each run gets its own copy
    return value.clone()


# ---------------------------------------------------------------------- plain == native

PLAIN_FAMILIES = ["llama", "gpt2", "gpt_neox", "gemma2", "mixtral", "granite", "falcon"]


@functools.cache
def family_model(family: str) -> StandardizedTransformer:
    if family in ("granite", "falcon"):  # scaled residuals; a snapshot row, parallel
        return load(f"tiny:{family}", True)
    return eager(family)


@pytest.mark.parametrize("family", PLAIN_FAMILIES)
def test_plain_program_reads_what_the_plan_reads(family: str) -> None:
    model = family_model(family)
    inputs = c.sample_inputs(model)
    plan = Plan.of(every_address(model, weights=False))
    for held in (False, True):
        native = plan.run(model, inputs, held=held)
        plain = remote.run_plan(plan, model, inputs, held=held)
        assert list(plain) == list(native)
        differ = [str(a) for a in native if not torch.equal(native[a], plain[a])]
        assert not differ, (held, differ)
    weighed = [a for a in every_address(model) if computed(model, a)]
    for address in weighed[:2]:  # the places computed from a weight: refused, and why
        with pytest.raises(remote.RemoteRefused, match="does not carry"):
            remote.run_plan(Plan.of([address]), model, inputs)
    for address in [a for a in every_address(model) if flat(model, a)][:2]:
        with pytest.raises(remote.RemoteRefused, match="held flat"):
            remote.run_plan(Plan.of([address]), model, inputs)


WRITE_FAMILIES = ["llama", "granite", "falcon"]


@pytest.mark.parametrize("family", WRITE_FAMILIES)
def test_plain_program_writes_what_the_plan_writes(family: str) -> None:
    """Each writable component of layer 1 (and the whole-model ones), one head too:
    written with half its clean value, then every later place read both ways."""
    model = family_model(family)
    inputs = c.sample_inputs(model)
    addresses = every_address(model, weights=False)
    clean = Plan.of(addresses).run(model, inputs)
    written = [a for a in addresses if a.writable and a.layer in (None, 1)]
    assert len(written) > 10, [str(a) for a in written]
    for address in written:
        value = clean[address] * 0.5
        later = [a for a in addresses if a.rank >= address.rank and a.head is None]
        # read before the write: each keeps its clean value, both ways
        earlier = [a for a in addresses if a.rank < address.rank and a.head is None]
        reads = [*earlier, *later]
        native = Plan.of(reads, [(address, fresh(value))]).run(model, inputs)
        plain = remote.run_plan(Plan.of(reads, [(address, fresh(value))]), model, inputs)
        differ = [str(a) for a in later if not torch.equal(native[a], plain[a])]
        assert not differ, (str(address), differ)
        kept = [
            str(a) for a in earlier for out in (native, plain) if not torch.equal(out[a], clean[a])
        ]
        assert not kept, (str(address), kept)
        moved = [a for a in later if not torch.equal(plain[a], clean[a])]
        assert moved, f"writing {address} changed nothing after it"


# ---------------------------------------------------------------------- loopback


@pytest.fixture(scope="module")
def workers() -> Iterator[dict[str, Any]]:
    """Two stand-in NDIF servers serving tiny:llama from its checkpoint: one where
    causalab_mini and nnterp are importable, and a stock one where they are not (on
    nnsight 0.8 it hands results back inline, the full one by URL)."""
    client = remote_llama()
    remote.ensure_model_key(client)
    started: dict[str, Any]
    if compat.is_08():
        key = remote.plain_model(client).to_model_key()
        started = {"full": HttpServer(key), "stock": HttpServer(key, ("causalab_mini", "nnterp"))}
    else:
        key = "nnsight.modeling.language.LanguageModel:" + client._remoteable_model_key()
        started = {"full": Worker(), "stock": Worker(block=("causalab_mini", "nnterp"))}
    try:
        if compat.is_08():  # both load at once
            for server in started.values():
                server.ready()
            started["stock"].control(inline_limit=1 << 24)
        else:
            for worker in started.values():
                worker.send("load", key, {"device_map": "cpu"})
            for worker in started.values():
                worker.receive()
        yield started
    finally:
        for worker in started.values():
            worker.close()


def loopback(server: Any) -> Any:
    return HttpLoopback(server) if compat.is_08() else Loopback(server)


@functools.cache
def remote_llama(probs: bool = False) -> StandardizedTransformer:
    return StandardizedTransformer("tiny:llama", remote=True, enable_attention_probs=probs)


def local_reads(model: StandardizedTransformer, inputs: Any, write: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with model.trace(inputs):
        if write:
            model.layers_mid[0] = model.layers_mid[0] * 0.5
        out["attribute"] = model.layers_mid[1].save()
        out["internals"] = model.internals["layers_mid"][1].save()
        out["logits"] = model.logits.save()
    return out


def plan_for(model: StandardizedTransformer, local: dict[str, Any] | None) -> Plan:
    reads = [locate(model, "attention_query", 1), locate(model, "block_mid", 1)]
    reads.append(locate(model, "logits"))
    writes = []
    if local is not None:
        writes.append((locate(model, "block_mid", 0), local["mid0"]))
    return Plan.of(reads, writes)


@pytest.mark.parametrize("server", ["full", "stock"])
def test_loopback_returns_every_read_as_a_local_trace(workers: dict[str, Any], server: str) -> None:
    local = load("tiny:llama")
    client = remote_llama()
    inputs = c.sample_inputs(local)
    loop = loopback(workers[server])
    clean = local_reads(local, inputs, write=False)
    written = local_reads(local, inputs, write=True)
    with local.trace(inputs):
        mid0 = local.layers_mid[0].save()
    local_plan = plan_for(local, None).run(local, inputs)
    local_written = plan_for(local, {"mid0": mid0 * 0.5}).run(local, inputs)
    assert not torch.equal(local_written[locate(local, "logits")], clean["logits"])

    with loop.installed():
        got_plan = plan_for(client, None).run(client, inputs, remote=True)
        got_written = plan_for(client, {"mid0": mid0 * 0.5}).run(client, inputs, remote=True)
    for address, value in local_plan.items():
        assert torch.equal(got_plan[locate(client, address.component, address.layer)], value)
    for address, value in local_written.items():
        assert torch.equal(got_written[locate(client, address.component, address.layer)], value)
    # the full server hands results back by URL, the stock one (on 0.8) inline
    assert (loop.downloads, loop.inline) == (
        (0, 2) if server == "stock" and compat.is_08() else (2, 0)
    )

    if server == "stock":
        sent = loop.requests
        with loop.installed(), pytest.raises(remote.RemoteRefused, match=r"causalab-mini==0\.1\.0"):
            with client.trace(inputs, remote=True):
                client.layers_mid[1].save()
        assert loop.requests == sent, "refused before sending: the server said what it has"
        # a server that does not say: sent, and its failure names what to install
        with (
            loop.installed(env=False),
            pytest.raises(remote.RemoteRefused, match="the server has no causalab_mini"),
        ):
            with client.trace(inputs, remote=True):
                client.layers_mid[1].save()
        assert loop.requests == sent + 1
        return

    for write in (False, True):
        attribute = internals = logits = None  # bound before: a trace hands values back by name
        with loop.installed(), client.trace(inputs, remote=True):
            if write:
                client.layers_mid[0] = client.layers_mid[0] * 0.5
            attribute = client.layers_mid[1].save()
            internals = client.internals["layers_mid"][1].save()
            logits = client.logits.save()
        want = written if write else clean
        assert torch.equal(attribute, want["attribute"])
        assert torch.equal(internals, want["internals"])
        assert torch.equal(logits, want["logits"])
    assert not client.dispatched
    assert all(p.device.type == "meta" for p in client._model.parameters())


@pytest.mark.parametrize("server", ["full", "stock"])
def test_loopback_runs_a_plan_at_positions_as_a_local_one(
    workers: dict[str, Any], server: str
) -> None:
    """Positions are resolved on the client (a remote model has its tokenizer) and
    travel as index tensors: a read at the last token, a per-head read at a span and
    a write at one token give what the same plan gives locally."""
    local = load("tiny:llama")
    client = remote_llama()
    texts = ["The quick brown fox", "Hello, world! The fox"]

    def plan(model: StandardizedTransformer, value: Any) -> Plan:
        reads = [
            locate(model, "block_input", 0, position={"index": -1}),  # read before the write
            locate(model, "block_output", 1, position={"index": -1}),
            locate(model, "attention_query", 1, 0, position={"span": "fox"}),
            locate(model, "logits", position={"index": -1}),
        ]
        return Plan.of(reads, [(locate(model, "block_mid", 0, position={"index": 1}), value)])

    value = torch.full((2, 1, local.hidden_size), 0.5)
    want = plan(local, value).run(local, texts)
    with loopback(workers[server]).installed():
        got = plan(client, value).run(client, texts, remote=True)
    assert [a.component for a in got] == [a.component for a in want]
    for (a, v), w in zip(got.items(), want.values(), strict=True):
        assert torch.equal(v, w), a
    # the read before the write keeps its clean value
    before = locate(local, "block_input", 0, position={"index": -1})
    clean = Plan.of([before]).run(local, texts)[before]
    assert torch.equal(got[locate(client, "block_input", 0, position={"index": -1})], clean)


def test_loopback_refuses_a_server_that_runs_other_attention(workers: dict[str, Any]) -> None:
    """The client resolved its places under eager attention; the server runs sdpa. On
    nnsight 0.6/0.7 that is refused; 0.8's request carries the attention implementation
    (``env``), which the server switches its model to first (as NDIF's does), so the run
    is the eager one."""
    client = remote_llama(probs=True)
    inputs = c.sample_inputs(client)
    loop = loopback(workers["full"])
    if not compat.is_08():
        with loop.installed(), pytest.raises(remote.RemoteMismatch, match="'sdpa' attention"):
            plan_for(client, None).run(client, inputs, remote=True)
        with loop.installed(), pytest.raises(remote.RemoteMismatch, match="'sdpa' attention"):
            with client.trace(inputs, remote=True):
                client.layers_mid[1].save()
        return
    local = eager("llama")
    assert local._model.config._attn_implementation == "eager"
    want = plan_for(local, None).run(local, inputs)
    with loop.installed():
        got = plan_for(client, None).run(client, inputs, remote=True)
        attribute = None
        with client.trace(inputs, remote=True):
            attribute = client.layers_mid[1].save()
    for address, value in want.items():
        assert torch.equal(got[locate(client, address.component, address.layer)], value)
    with local.trace(inputs):
        mid = local.layers_mid[1].save()
    assert torch.equal(attribute, mid)
    # and back: a client under sdpa switches the shared server model back
    sdpa = remote_llama()
    with loop.installed():
        back = plan_for(sdpa, None).run(sdpa, inputs, remote=True)
    plain = load("tiny:llama")
    for address, value in plan_for(plain, None).run(plain, inputs).items():
        assert torch.equal(back[locate(sdpa, address.component, address.layer)], value)


def test_loopback_refuses_a_server_that_holds_another_dtype(workers: dict[str, Any]) -> None:
    client = StandardizedTransformer("tiny:llama", remote=True, dtype=torch.bfloat16)
    inputs = c.sample_inputs(client)
    loop = loopback(workers["stock"])
    with loop.installed(), pytest.raises(remote.RemoteMismatch, match=r"dtype=torch\.float32"):
        plan_for(client, None).run(client, inputs, remote=True)


def test_loopback_refuses_a_write_that_does_not_fit(workers: dict[str, Any]) -> None:
    from causalab_mini.components import WriteRefused

    client = remote_llama()
    inputs = c.sample_inputs(client)
    wrong = torch.zeros(1, 3, client.hidden_size)
    plan = Plan.of([locate(client, "logits")], [(locate(client, "block_mid", 0), wrong)])
    with loopback(workers["stock"]).installed(), pytest.raises(WriteRefused, match="nothing is"):
        plan.run(client, inputs, remote=True)


def test_a_server_with_other_versions_is_refused_before_sending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from causalab_mini import __version__

    client = remote_llama()
    nnterp = remote.versions()["nnterp"]
    said = {"packages": {"causalab_mini": "0.0.9", "nnterp": nnterp, "nnsight": "0.7.0"}}
    asked: list[str | None] = []
    monkeypatch.setattr(remote, "server_env", lambda host=None: asked.append(host) or said)
    with pytest.raises(remote.RemoteRefused, match=r"causalab_mini \S+ \(the server has 0\.0\.9\)"):
        remote.preflight_packages(client)
    said["packages"]["causalab_mini"] = __version__
    remote.preflight_packages(client, "http://elsewhere.test")  # the same versions
    assert asked == [None, "http://elsewhere.test"]


def test_a_needle_the_server_forward_does_not_call_is_refused_with_its_operations() -> None:
    """What the shipped code does where a server's transformers calls the needle at
    no operation (or several): refuse, listing the forward's operations."""
    model = load("tiny:llama")
    source = model.layers[0].self_attn.source
    find = remote.shipped()["_find"]
    with pytest.raises(RuntimeError, match=r"(?s)calls 'no_such_call\(' at 0 operations.*o_proj"):
        find(source, "no_such_call(", "layers.0.self_attn")
    assert find(source, "self.o_proj(", "layers.0.self_attn") is not None


def test_loopback_notices_a_stubbed_server_or_download(
    workers: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loopback proves something only if it fails when the server does not run the
    request or its result is not downloaded."""
    from nnsight.intervention.backends.remote import RemoteBackend

    client = remote_llama()
    inputs = c.sample_inputs(client)
    worker = workers["full"]
    loop = loopback(worker)
    worker.call("stub", True)
    try:
        with loop.installed(), pytest.raises(remote.RemoteIncomplete, match="handed back"):
            plan_for(client, None).run(client, inputs, remote=True)
        attribute = None
        with loop.installed(), client.trace(inputs, remote=True):
            attribute = client.layers_mid[1].save()
        assert attribute is None
    finally:
        worker.call("stub", False)
    # the result is "downloaded" as nothing: 0.8's download_result, 0.6/0.7's get_result
    download = "download_result" if compat.is_08() else "get_result"
    monkeypatch.setattr(RemoteBackend, download, lambda self, *a, **k: {})
    with loop.installed(), pytest.raises(remote.RemoteIncomplete, match="handed back"):
        plan_for(client, None).run(client, inputs, remote=True)


def test_remote_runs_are_refused_only_outside_the_supported_ndif_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The installed nnsight (0.6, 0.7 or 0.8) has a client this module speaks: a local
    checkpoint gets its absolute path as its key, and the backend is built. A release
    outside them is refused with the fix, before anything is built."""
    import os

    from packaging.version import Version

    client = remote_llama()
    plan = Plan.of([locate(client, "logits")])
    remote.require_ndif_client()
    assert compat.ndif_client() in compat.NDIF_CLIENTS
    key = remote.plain_model(client).to_model_key() if compat.is_08() else None
    remote.ensure_model_key(client)
    assert compat.model_id_cache()[client.repo_id] == os.path.abspath(client.repo_id)
    if key is not None:
        assert os.path.abspath(client.repo_id) in key
    built = remote.backend(client, host="http://127.0.0.1:9")
    assert built.model_key == remote.plain_model(client).to_model_key()
    if compat.is_08():  # the per-request environment nnsight 0.8 itself sends
        assert built.env == client._remoteable_get_env()
        assert built.env["attn_implementation"] == client._model.config._attn_implementation
    monkeypatch.setattr(compat, "nnsight_version", lambda: Version("0.9.0"))
    for run in (
        lambda: plan.run(client, c.sample_inputs(client), remote=True),
        lambda: client.to_model_key(),
        lambda: remote.backend(client),
    ):
        with pytest.raises(remote.RemoteRefused, match=r"nnsight>=0\.6,<0\.9.*without remote=True"):
            run()


def test_remote_host_strings_go_through_the_explained_backend(
    workers: dict[str, Any],
) -> None:
    """``remote="http://host"`` (0.8's spelling) and ``backend="http://host"`` (0.6/0.7's)
    reach the same backend, with the same explanations, as remote=True: a stock server
    named by URL refuses a trace of a causalab_mini model before anything is sent."""
    client = remote_llama()
    inputs = c.sample_inputs(client)
    with pytest.raises(remote.RemoteRefused, match="names no NDIF host"):
        client.trace(inputs, remote="ndif.example")
    if not compat.is_08():
        assert remote.wants_backend(backend="http://h") and remote.remote_host(backend="http://h")
        return
    server = workers["stock"]
    loop = loopback(server)
    for spelling in ({"remote": server.host}, {"backend": server.host}):
        with pytest.raises(remote.RemoteRefused, match=r"causalab-mini==0\.1\.0"):
            with client.trace(inputs, **spelling):
                client.layers_mid[1].save()
    assert loop.requests == 0
    local = load("tiny:llama")
    want = plan_for(local, None).run(local, inputs)
    got = plan_for(client, None).run(client, inputs, remote=server.host)
    assert loop.requests == 1
    for address, value in want.items():
        assert torch.equal(got[locate(client, address.component, address.layer)], value)


def test_loopback_runs_a_non_blocking_trace(workers: dict[str, Any]) -> None:
    """``blocking=False``: nnsight 0.8 submits over HTTP (no websocket) and each later
    call of the backend polls ``GET /response/{id}`` until the result is there."""
    if not compat.is_08():
        pytest.skip("0.6/0.7's non-blocking client is not served by their loopback")
    import time

    local = load("tiny:llama")
    client = remote_llama()
    inputs = c.sample_inputs(local)
    want = local_reads(local, inputs, write=True)
    loop = loopback(workers["full"])
    subscribed = loop._count("subscribed")
    with loop.installed():
        with client.trace(inputs, remote=True, blocking=False) as tracer:
            client.layers_mid[0] = client.layers_mid[0] * 0.5
            # bound by name: the server hands back saved values under their names
            attribute = client.layers_mid[1].save()  # noqa: F841
            logits = client.logits.save()  # noqa: F841
        backend = tracer.backend
        assert backend.job_id is not None
        result = None
        deadline = time.monotonic() + 120
        while result is None and time.monotonic() < deadline:
            result = backend()
            if result is None:
                time.sleep(0.05)
    assert result is not None, "the job did not complete in 120 s"
    assert sorted(result) == ["attribute", "logits"]
    assert torch.equal(result["attribute"], want["attribute"])
    assert torch.equal(result["logits"], want["logits"])
    assert loop._count("polls") >= 1
    assert loop._count("subscribed") == subscribed, "a non-blocking run opens no websocket"


def _remote_grads(client: StandardizedTransformer, loop: Any, texts: list[str]) -> dict[str, Any]:
    """d logprob(5) at the last token / d (layer 1's output), in a remote trace, spelled
    as nnsight spells a module's and as a place: each read made to require grad (the
    server's weights do not), its .grad read inside ``with loss.backward():``; and the
    place read with ``x.retain_grad()`` and a plain backward, its .grad saved after."""
    got: dict[str, Any] = {}
    for spelling in ("module", "place"):
        g = None  # bound before: the server hands saved values back by name
        with loop.installed(), client.trace(texts, remote=True):
            x = client.model.layers[1].output if spelling == "module" else client.layers_output[1]
            x.requires_grad_()
            loss = torch.log_softmax(client.output.logits[:, -1], -1)[:, 5].sum()
            with loss.backward():
                g = x.grad.save()
        got[spelling] = g
    # x.retain_grad() right after the read and a plain backward, as locally
    g = None
    with loop.installed(), client.trace(texts, remote=True):
        x = client.layers_output[1]
        x.requires_grad_()
        x.retain_grad()
        loss = torch.log_softmax(client.output.logits[:, -1], -1)[:, 5].sum()
        loss.backward()
        g = x.grad.save()
    got["retain_grad"] = g
    return got


def test_loopback_gradients_in_a_remote_trace_are_the_local_ones(
    workers: dict[str, Any],
) -> None:
    """On the NDIF loopback a place's gradient is served where nnsight serves a
    module's (a trace with a backward), equal to the local gradient; ``gradients`` and
    ``attribute`` with ``remote=`` are refused before anything is sent, with the trace
    to write instead."""
    if not compat.is_08():
        pytest.skip("the backward trace is nnsight 0.8's")
    from causalab_mini.attribution import attribute, gradients
    from causalab_mini.metrics import logprob

    local = load("tiny:llama")
    client = remote_llama()
    texts = ["The cat sat on the mat"]
    address = locate(local, "block_output", 1)
    want = gradients(local, [address], texts, logprob(5))[address]
    loop = loopback(workers["full"])
    got = _remote_grads(client, loop, texts)
    for spelling, grad in got.items():
        torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-7, msg=spelling)
    sent = loop.requests
    far = locate(client, "block_output", 1)
    with loop.installed():
        with pytest.raises(remote.RemoteRefused, match=r"x\.grad\.save\(\)"):
            gradients(client, [far], texts, logprob(5), remote=True)
        with pytest.raises(remote.RemoteRefused, match="plain steps"):
            attribute(client, [far], texts, texts, logprob(5), remote=True)
    assert loop.requests == sent, "refused before anything was sent"


# ---------------------------------------------------------------------- loading


def test_remote_load_with_attention_probabilities_stays_on_meta() -> None:
    model = remote_llama(probs=True)
    assert not model.dispatched
    assert all(p.device.type == "meta" for p in model._model.parameters())
    assert "attention_probabilities" in model.deferred_checks
    assert (
        "remote=True keeps the weights off this machine"
        in model.deferred_checks["attention_probabilities"]
    )
    assert model.attention_probs_enabled
    resident = eager("llama")
    assert model.internals.status() == resident.internals.status()
    assert {k: v[1] for k, v in component_status(model).items()} == {
        k: v[1] for k, v in component_status(resident).items()
    }
    with pytest.raises(ValueError, match="dispatch=True loads them"):
        StandardizedTransformer("tiny:llama", remote=True, dispatch=True)


# ---------------------------------------------------------------------- offloading


def test_offloaded_layers_read_and_write_every_place_as_resident(tmp_path: Any) -> None:
    """Layers 1 and 2 of tiny:llama offloaded to disk by accelerate (device_map with
    max_memory): every place reads and writes as on the resident model."""
    resident = load("tiny:llama")
    size = sum(p.numel() * p.element_size() for p in resident._model.parameters())
    layer = sum(p.numel() * p.element_size() for p in resident._model.model.layers[0].parameters())
    embed = resident._model.model.embed_tokens.weight
    budget = embed.numel() * embed.element_size() + 2 * layer  # embeddings + room for one layer
    offloaded = StandardizedTransformer(
        "tiny:llama",
        device_map="auto",
        max_memory={"cpu": budget},
        offload_folder=str(tmp_path),
    )
    assert budget < size
    assert offloaded.internals.status() == resident.internals.status()
    assert {k: v[1] for k, v in component_status(offloaded).items()} == {
        k: v[1] for k, v in component_status(resident).items()
    }
    inputs = c.sample_inputs(resident)
    addresses = every_address(resident, weights=False)
    # a place computed from a weight offloaded to disk: refused where it is not in memory
    with pytest.raises(PlaceUnavailable, match="offloaded"):
        Plan.of([locate(offloaded, "attention_head_output", 1)]).run(
            offloaded, c.sample_inputs(resident)
        )
    twin = {a: locate(offloaded, a.component, a.layer, a.head) for a in addresses}
    clean = Plan.of(addresses).run(resident, inputs)
    got = Plan.of(twin.values()).run(offloaded, inputs)
    placed = offloaded._model.hf_device_map
    assert "disk" in placed.values(), placed
    assert any(
        placed.get(f"model.layers.{i}", placed.get("model.layers")) == "disk" for i in (1, 2)
    ), placed
    assert [str(a) for a in addresses if not torch.equal(clean[a], got[twin[a]])] == []
    # the hooks engine keeps nnsight's controller on a module accelerate moves (it
    # runs the device-alignment hook): the offloaded layers read as resident there too
    hooked = [a for a in addresses if a.component in ("block_input", "mlp_output", "logits")]
    kept = {id(found[0]) for found in compat.controllers(offloaded._model)}
    moved = [m for m in offloaded._model.modules() if "_hf_hook" in m.__dict__]
    assert moved and not kept & {id(vars(m)) for m in moved}
    on_hooks = Plan.of([twin[a] for a in hooked]).run(offloaded, inputs, engine="hooks")
    assert [str(a) for a in hooked if not torch.equal(clean[a], on_hooks[twin[a]])] == []
    # every writable place of the offloaded layers, each scaled where it is in one
    # trace: a write that did not reach on either model changes what follows it
    edited = [a for a in addresses if a.writable and a.head is None and a.layer in (1, 2)]
    assert len(edited) > 20, [str(a) for a in edited]
    here = scaled(resident, edited, inputs)
    there = scaled(offloaded, [twin[a] for a in edited], inputs)
    assert [str(a) for a in edited if not torch.equal(here[a], there[twin[a]])] == []
    assert torch.equal(here["logits"], there["logits"])
    assert not torch.equal(here["logits"], clean[locate(resident, "logits")])


def scaled(model: StandardizedTransformer, addresses: list[ComponentAddress], inputs: Any) -> Any:
    """Halve each place in turn (``write(read * 0.5)``, forward order) in one trace;
    what each place holds after its write, and the logits."""
    from causalab_mini.components import read, write

    out: dict[Any, Any] = {}
    for layer in {a.layer for a in addresses if a.kind == "interior"}:
        model.layers[layer].self_attn.source  # noqa: B018 - opened before the trace
    with model.trace(inputs):
        for address in sorted(addresses):
            write(model, address, read(model, address) * 0.5)
            out[address] = read(model, address).save()
        out["logits"] = model.logits.save()
    return out


def test_the_server_names_every_registry_needle_as_the_client_does() -> None:
    # plain (shipped to a server, self-contained) spells ops.needle_prefix again without
    # re: every needle of every row, interior, operand and gate must get the same stem
    from causalab_mini import plain
    from causalab_mini.generated import FAMILIES, INTERIORS
    from causalab_mini.generated.places import DEFAULT_ADDRESSES
    from causalab_mini.ops import needle_prefix

    needles = {n for row in DEFAULT_ADDRESSES.values() for n in row.source}
    needles |= {n for interior in INTERIORS.values() for n in interior.needles}
    for family in FAMILIES.values():
        needles |= {n for row in family.addresses.values() for n in row.source}
        needles |= {n for interior in family.interiors.values() for n in interior.needles}
        needles |= {o.needle for o in family.operands.values() if o.needle}
    assert {"nn.Softmax(dim=-1)(", ".sigmoid(", ".transpose("} & needles
    for needle in sorted(needles):
        assert needle_prefix(needle) + "_" in plain._stems(needle), needle
