"""Published dictionaries, loaded from directories written here in each library's
layout (SAELens, sparsify, dictionary_learning) from an SAE trained on a tiny model's
activations: placed, width-checked, spliced with the error term, reported against
its neighbours, and each broken input refused with its reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from causalab_mini import Plan, StandardizedTransformer, locate
from causalab_mini.featurizers import SAE
from causalab_mini.mechanisms import Scale
from causalab_mini.positions import encode
from causalab_mini.saes import DictionaryRefused, figures, sae_report

WORDS = "the cat dog sat ran on under a mat park red blue quick slow fox bird sang at dawn".split()
LAYER = 1


def _texts(n: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(WORDS), (n, 7), generator=g)
    return [" ".join(WORDS[i] for i in row) for row in picks.tolist()]


TRAIN, HELD_OUT = _texts(48, 0), _texts(12, 1)


def _content(model: Any, place: Any, texts: list[str]) -> torch.Tensor:
    got = Plan.of(reads=[place]).run(model, texts)[place]
    frames = encode(model, texts).frames
    return torch.cat([got[r, list(f.content)] for r, f in enumerate(frames)])


@pytest.fixture(scope="module")
def llama() -> Any:
    return StandardizedTransformer("tiny:llama")


@pytest.fixture(scope="module")
def trained(llama: Any) -> dict[str, torch.Tensor]:
    """A ReLU SAE (64 -> 256) trained 300 steps on block_output[1]'s activations."""
    x = _content(llama, locate(llama, "block_output", LAYER), TRAIN).detach()
    torch.manual_seed(0)
    d, m = x.shape[1], 4 * x.shape[1]
    w_enc = torch.nn.Parameter(torch.randn(d, m) / d**0.5)
    w_dec = torch.nn.Parameter(w_enc.detach().T.clone())
    b_enc = torch.nn.Parameter(torch.zeros(m))
    b_dec = torch.nn.Parameter(x.mean(0).clone())
    opt = torch.optim.Adam([w_enc, w_dec, b_enc, b_dec], lr=3e-3)
    for _ in range(300):
        f = torch.relu((x - b_dec) @ w_enc + b_enc)
        loss = (f @ w_dec + b_dec - x).pow(2).sum(-1).mean() + 1e-3 * f.abs().sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {
        n: t.detach().clone()
        for n, t in zip(
            ("W_enc", "W_dec", "b_enc", "b_dec"), (w_enc, w_dec, b_enc, b_dec), strict=True
        )
    }


# ---------------------------------------------------------------------- writers


def write_saelens(
    path: Path, w: dict[str, torch.Tensor], hook: str, arch: str = "standard", **cfg: Any
) -> Path:
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    tensors = dict(w)
    if arch == "jumprelu":
        tensors["threshold"] = torch.full_like(w["b_enc"], 0.05)
    if arch == "gated":  # r_mag = 0, b_mag = b_gate: the same features as ReLU
        tensors = {
            **w,
            "b_gate": w["b_enc"],
            "b_mag": w["b_enc"],
            "r_mag": torch.zeros_like(w["b_enc"]),
        }
        del tensors["b_enc"]
    save_file(
        {n: t.clone().contiguous() for n, t in tensors.items()},
        str(path / "sae_weights.safetensors"),
    )
    d, m = w["W_enc"].shape
    config = {
        "architecture": arch,
        "d_in": d,
        "d_sae": m,
        "dtype": "float32",
        "device": "cpu",
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",
        "metadata": {"model_name": "tiny-llama", "hook_name": hook},
        **cfg,
    }
    (path / "cfg.json").write_text(json.dumps(config))
    return path


def write_sparsify(
    root: Path, w: dict[str, torch.Tensor], hookpoint: str, k: int, transcode: bool = False
) -> Path:
    from safetensors.torch import save_file

    path = root / hookpoint
    path.mkdir(parents=True)
    d, m = w["W_enc"].shape
    save_file(
        {
            "encoder.weight": w["W_enc"].T.contiguous(),
            "encoder.bias": w["b_enc"],
            "W_dec": w["W_dec"].contiguous(),
            "b_dec": w["b_dec"],
        },
        str(path / "sae.safetensors"),
    )
    (path / "cfg.json").write_text(
        json.dumps(
            {
                "expansion_factor": m // d,
                "normalize_decoder": True,
                "num_latents": m,
                "k": k,
                "multi_topk": False,
                "skip_connection": False,
                "transcode": transcode,
                "d_in": d,
            }
        )
    )
    (root / "config.json").write_text(json.dumps({"hookpoints": [hookpoint]}))
    return path


def write_dictionary_learning(
    path: Path, w: dict[str, torch.Tensor], site: str, k: int | None
) -> Path:
    path.mkdir(parents=True)
    d, m = w["W_enc"].shape
    state = {
        "encoder.weight": w["W_enc"].T.contiguous(),
        "encoder.bias": w["b_enc"],
        "decoder.weight": w["W_dec"].T.contiguous(),
    }
    if k:
        state.update({"b_dec": w["b_dec"], "k": torch.tensor(k), "threshold": torch.tensor(-1.0)})
        cls, trainer = "AutoEncoderTopK", "TopKTrainer"
    else:
        state["bias"] = w["b_dec"]
        cls, trainer = "AutoEncoder", "StandardTrainer"
    torch.save(state, path / "ae.pt")
    (path / "config.json").write_text(
        json.dumps(
            {
                "trainer": {
                    "trainer_class": trainer,
                    "dict_class": cls,
                    "activation_dim": d,
                    "dict_size": m,
                    "k": k,
                    "layer": LAYER,
                    "lm_name": "tiny-llama",
                    "submodule_name": site,
                },
                "buffer": {"d_submodule": d, "ctx_len": 16},
            }
        )
    )
    return path


def reference(w: dict[str, torch.Tensor], activation: str = "relu", **kw: Any) -> SAE:
    """The trained SAE as the featurizer computes it (b_dec taken off the input)."""
    bias = w["b_enc"] - w["b_dec"] @ w["W_enc"]
    return SAE(w["W_enc"], w["W_dec"], bias, w["b_dec"], activation=activation, **kw)


# ---------------------------------------------------------------------- loading


def _written(kind: str, tmp: Path, w: dict[str, torch.Tensor]) -> tuple[Path, SAE]:
    hook = f"blocks.{LAYER}.hook_resid_post"
    if kind in ("standard", "jumprelu", "gated"):
        path = write_saelens(tmp / kind, w, hook, kind)
        if kind == "jumprelu":
            return path, reference(
                w, "jumprelu", threshold=torch.full((w["b_enc"].shape[0],), 0.05)
            )
        return path, reference(w)
    if kind == "topk":
        return write_saelens(tmp / kind, w, hook, "topk", k=16), reference(w, "topk", topk=16)
    if kind == "sparsify":
        return write_sparsify(tmp / "sp", w, f"layers.{LAYER}", 16), reference(w, "topk", topk=16)
    if kind == "dictionary_learning":
        path = write_dictionary_learning(tmp / "dl", w, f"resid_post_layer_{LAYER}", None)
        return path, reference(w)
    path = write_dictionary_learning(tmp / "dlk", w, f"resid_post_layer_{LAYER}", 16)
    return path, reference(w, "topk", topk=16)


KINDS = ("standard", "jumprelu", "topk", "gated", "sparsify", "dictionary_learning", "dl_topk")


@pytest.mark.parametrize("kind", KINDS)
def test_each_format_loads_placed_with_the_trained_features(
    kind: str, llama: Any, trained: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    path, expected = _written(kind, tmp_path, trained)
    sae = SAE.load(path, model=llama)
    assert sae.site == locate(llama, "block_output", LAYER)
    x = _content(llama, sae.site, HELD_OUT)
    assert torch.allclose(sae.encode(x), expected.encode(x), atol=1e-5, rtol=1e-5)
    assert (sae.encode(x) != 0).any()


@pytest.mark.parametrize("engine", ["nnsight", "hooks"])
@pytest.mark.parametrize("kind", ["standard", "topk", "sparsify"])
def test_splicing_keeps_the_logits_and_an_ablation_moves_them(
    kind: str, engine: str, llama: Any, trained: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    sae = SAE.load(_written(kind, tmp_path, trained)[0], model=llama)
    at = locate(llama, sae.site.component, sae.site.layer, featurizer=sae)
    logits = locate(llama, "logits")
    # a place the forward reaches before the SAE's: what a write there leaves as it was
    before = locate(llama, "block_input", sae.site.layer)
    assert before.rank < at.rank
    clean_run = Plan.of(reads=[before, logits]).run(llama, HELD_OUT, engine=engine)
    clean = clean_run[logits]
    got = Plan.of(reads=[at, logits], writes=[(at, Scale(torch.ones(sae.k or 0)))]).run(
        llama, HELD_OUT, engine=engine
    )
    assert float((got[logits] - clean).abs().max() / clean.abs().max()) < 1e-6
    features = got[at]
    keep = torch.ones(sae.k or 0)
    keep[int(features[0, -1].argmax())] = 0
    ablated = Plan.of(reads=[before, logits], writes=[(at, Scale(keep))]).run(
        llama, HELD_OUT, engine=engine
    )
    assert not torch.allclose(ablated[logits], clean)  # the ablation reached the model
    assert torch.equal(ablated[before], clean_run[before])  # the read before it kept its value


def test_fvu_is_lowest_at_its_own_place(
    llama: Any, trained: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    sae = SAE.load(
        write_saelens(tmp_path / "own", trained, f"blocks.{LAYER}.hook_resid_post"), model=llama
    )
    report = sae_report(llama, sae, HELD_OUT)
    own = next(r for r in report.rows if r.own)
    others = [r for r in report.rows if not r.own]
    assert others and all(own.fvu < r.fvu for r in others), str(report)
    assert own.fvu < 0.5 and report.flag is None
    assert 0 < own.l0 < sae.k and 0 <= own.dead < 1


def test_a_misplaced_checkpoint_is_flagged(
    llama: Any, trained: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    # trained on block_output[1], saved as if it were the MLP's output there
    path = write_saelens(tmp_path / "mis", trained, f"blocks.{LAYER}.hook_mlp_out")
    sae = SAE.load(path, model=llama)
    report = sae_report(llama, sae, HELD_OUT, engine="hooks")
    assert sae.site.component == "mlp_output"
    assert report.flag is not None and f"block_output[{LAYER}]" in report.flag, str(report)


def test_a_transcoder_maps_both_sites(
    llama: Any, trained: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    path = write_saelens(
        tmp_path / "tc",
        trained,
        f"blocks.{LAYER}.ln2.hook_out",
        hook_name_out=f"blocks.{LAYER}.hook_mlp_out",
    )
    sae = SAE.load(path, model=llama)
    assert (sae.site, sae.site_out) == (
        locate(llama, "mlp_input_norm", LAYER),
        locate(llama, "mlp_output", LAYER),
    )
    sp = SAE.load(
        write_sparsify(tmp_path / "sp", trained, f"layers.{LAYER}.mlp", 16, transcode=True),
        model=llama,
    )
    assert (sp.site, sp.site_out) == (
        locate(llama, "mlp_input", LAYER),
        locate(llama, "mlp_output", LAYER),
    )
    report = sae_report(llama, sp, HELD_OUT)
    assert [r.own for r in report.rows].count(True) == 1 and report.flag is None


def test_figures_measure_what_they_say() -> None:
    sae = SAE(torch.eye(4), torch.eye(4))  # relu(x): exact on positive rows
    x = torch.tensor([[1.0, 2.0, 0.0, 3.0], [2.0, 1.0, 0.0, 1.0]])
    assert figures(sae, x) == (0.0, 3.0, 0.25)
    fvu, _, _ = figures(sae, -x)
    assert fvu > 1


# ---------------------------------------------------------------------- refusals


def test_a_hook_the_family_cannot_serve_is_refused(
    trained: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    gemma = StandardizedTransformer("tiny:gemma2")
    path = write_saelens(tmp_path / "g", trained, f"blocks.{LAYER}.mlp.hook_out")
    with pytest.raises(
        DictionaryRefused, match=r"gemma2 \(sandwich_norm\).*before the post-MLP norm.*mlp_output"
    ):
        SAE.load(path, model=gemma)
    # sparsify's hookpoint is a module: Gemma-2's MLP module output is before its post-norm
    sparse = write_sparsify(tmp_path / "sp", trained, f"layers.{LAYER}.mlp", 16)
    with pytest.raises(DictionaryRefused, match=r"output of model\.layers\.1\.mlp.*no component"):
        SAE.load(sparse, model=gemma)
    neox = StandardizedTransformer("tiny:gpt_neox")
    path = write_saelens(tmp_path / "n", trained, f"blocks.{LAYER}.hook_resid_mid")
    with pytest.raises(DictionaryRefused, match=r"parallel block"):
        SAE.load(path, model=neox)


def test_an_unknown_site_is_refused_as_ambiguous(
    llama: Any, trained: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    path = write_dictionary_learning(tmp_path / "dl", trained, "layer_1_something", None)
    with pytest.raises(DictionaryRefused, match="ambiguous"):
        SAE.load(path, model=llama)
    sae = SAE.load(path, model=llama, site=f"blocks.{LAYER}.hook_resid_post")  # said by the user
    assert sae.site == locate(llama, "block_output", LAYER)
    with pytest.raises(DictionaryRefused, match="no module"):
        SAE.load(write_sparsify(tmp_path / "sp", trained, "layers.9", 16), model=llama)


def test_a_width_mismatch_is_refused(
    llama: Any, trained: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    path = write_saelens(tmp_path / "w", trained, f"blocks.{LAYER}.mlp.hook_post")  # 128 wide
    with pytest.raises(
        DictionaryRefused, match=r"64 wide, and its site mlp_neuron_output\[1\].* is 128 wide"
    ):
        SAE.load(path, model=llama)


def test_corrupt_files_are_refused(
    llama: Any, trained: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    path = write_saelens(tmp_path / "c", trained, f"blocks.{LAYER}.hook_resid_post")
    weights = path / "sae_weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(DictionaryRefused, match="corrupt or truncated"):
        SAE.load(path, model=llama)
    path = write_saelens(tmp_path / "j", trained, f"blocks.{LAYER}.hook_resid_post")
    (path / "cfg.json").write_text("{not json")
    with pytest.raises(DictionaryRefused, match="cannot be read as JSON"):
        SAE.load(path, model=llama)
    path = write_dictionary_learning(tmp_path / "d", trained, f"resid_post_layer_{LAYER}", None)
    (path / "ae.pt").write_bytes(b"PK\x03\x04 broken")
    with pytest.raises(DictionaryRefused, match="torch state dict"):
        SAE.load(path, model=llama)
    with pytest.raises(DictionaryRefused, match="no dictionary"):
        SAE.load(tmp_path, model=llama)


@pytest.mark.parametrize("engine", ["nnsight", "hooks"])
def test_steering_a_loaded_feature_adds_its_decoder_row(
    engine: str, llama: Any, trained: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    from causalab_mini.mechanisms import Add

    sae = SAE.load(_written("standard", tmp_path, trained)[0], model=llama)
    at = locate(llama, "block_output", LAYER, featurizer=sae)
    stream = locate(llama, "block_output", LAYER)
    step = torch.zeros(sae.k or 0)
    step[7] = 5.0  # feature 7 raised by 5 at every token
    clean = Plan.of(reads=[stream]).run(llama, HELD_OUT, engine=engine)[stream]
    steered = Plan.of(reads=[stream], writes=[(at, Add(step))]).run(llama, HELD_OUT, engine=engine)
    moved = steered[stream] - clean
    expected = 5.0 * sae.decoder[7]
    assert torch.allclose(moved, expected.expand_as(moved), atol=1e-4)


@pytest.mark.parametrize("engine", ["nnsight", "hooks"])
def test_a_transcoders_feature_edit_lands_at_its_output(
    engine: str, llama: Any, trained: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    from causalab_mini.saes import transcoder_write

    path = write_saelens(
        tmp_path / "tc",
        trained,
        f"blocks.{LAYER}.hook_resid_post",  # the same width in and out: any pair will do
        hook_name_out=f"blocks.{LAYER + 1}.hook_mlp_out",
    )
    tc = SAE.load(path, model=llama)
    logits, out = locate(llama, "logits"), tc.site_out
    clean = Plan.of(reads=[logits, out]).run(llama, HELD_OUT, engine=engine)
    at, kept = transcoder_write(llama, tc, HELD_OUT, Scale(torch.ones(tc.k or 0)), engine=engine)
    same = Plan.of(reads=[logits], writes=[(at, kept)]).run(llama, HELD_OUT, engine=engine)
    assert torch.equal(same[logits], clean[logits])  # no edit: the output as it was
    x = Plan.of(reads=[tc.site]).run(llama, HELD_OUT, engine=engine)[tc.site]
    f = tc.encode(x)
    keep = torch.ones(tc.k or 0)
    keep[int(f[0, -1].argmax())] = 0
    at, ablated = transcoder_write(llama, tc, HELD_OUT, Scale(keep), engine=engine)
    got = Plan.of(reads=[out, logits], writes=[(at, ablated)]).run(llama, HELD_OUT, engine=engine)
    i = int(f[0, -1].argmax())
    expected = -f[..., i : i + 1] * tc.decoder[i]
    assert torch.allclose(got[out] - clean[out], expected, atol=1e-4)
    assert not torch.allclose(got[logits], clean[logits])
    with pytest.raises(DictionaryRefused, match="no transcoder"):
        transcoder_write(
            llama,
            SAE.load(_written("standard", tmp_path, trained)[0], model=llama),
            HELD_OUT,
            Scale(keep),
        )
