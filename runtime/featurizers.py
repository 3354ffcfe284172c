"""The basis a read, a write or an interchange works in: featurizers bound to a place.

A featurizer maps the tensor at a place (width d as a read hands it on: one head's
size at a head) to k features and back. It binds to an address,
``locate(model, component, layer, head=None, position=None, featurizer=f)``, and is
sized by the component table's width for that place; a place without a width, or a
featurizer of another width, is refused with both widths. Then:

- a read returns the features, ``features(x)``;
- a write takes features (or a mechanism applied to them) and puts
  ``x + inverse(f_new) - inverse(features(x))``: what the features do not hold stays
  (for an SAE that is its error term: ``decode(f_new) + (x - decode(encode(x)))``);
- an ``interchange`` patch swaps the selected coordinates from the source,
  ``x' = x_base + F^-1(mask * (F x_src - F x_base))`` (an SAE in feature space, with
  its error term); ``Identity`` hands over the source's tensor itself.

``Identity()``; ``Subspace(k, parametrization=...)``, an orthogonal k x d map trained
through ``torch.nn.utils.parametrizations.orthogonal``; ``Linear(matrix)`` with its
inverse or pseudo-inverse (``inverse_kind`` says which); ``PCA.fit(activations, k)``;
``SAE(encoder, decoder, ...)`` (ReLU, TopK, JumpReLU); ``Gate(featurizer, kind=...)``,
a learnable mask over another featurizer's features (sigmoid, hard-concrete, or a
boundary as in Boundless DAS). A linear featurizer's map is ``.matrix`` (k x d; rows
orthonormal for ``Subspace`` and ``PCA``). ``save``/``load`` keep the parameters as
safetensors with the place they were fitted at in the metadata."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from .errors import CausalabError

# how far from orthonormal the rows of a matrix given as a subspace may be (float32)
ORTHONORMAL_ATOL = 1e-4


class FeaturizerRefused(CausalabError, ValueError):
    """A featurizer that does not fit its place or its parameters (widths, a
    non-orthogonal subspace, a file fitted elsewhere), refused before anything runs."""


def _tensor(value: Any, name: str, where: str = "") -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        value = torch.as_tensor(value)
    if not value.is_floating_point():
        value = value.to(torch.get_default_dtype())
    if not bool(torch.isfinite(value).all()):
        raise FeaturizerRefused(
            f"{where or 'featurizer'}: {name} holds NaN or inf: give finite values"
        )
    out: torch.Tensor = value
    return out


class Featurizer(torch.nn.Module):
    """The base of every featurizer: ``features``/``inverse``, the write and the swap
    that keep what the features do not hold, the mask of the coordinates an
    interchange swaps, binding to a width, equality as data, save and load."""

    kind: ClassVar[str] = "featurizer"

    def __init__(self, width: int | None = None, select: Sequence[int] | None = None):
        super().__init__()
        self.width = width
        self.select = None if select is None else tuple(int(i) for i in select)

    # -- the basis ------------------------------------------------------------

    @property
    def k(self) -> int | None:
        """The number of features (None until a width decides it)."""
        return self.width

    @property
    def dtype(self) -> torch.dtype:
        for t in [*self.parameters(), *self.buffers()]:
            return t.dtype
        return torch.get_default_dtype()

    def features(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def inverse(self, f: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)

    def read(self, x: torch.Tensor) -> torch.Tensor:
        """The features of a place's tensor ``x``, computed in the featurizer's dtype."""
        return self.features(x.to(self.dtype))

    def write(self, x: torch.Tensor, f_new: torch.Tensor) -> torch.Tensor:
        """``x`` with its features set to ``f_new``; what they do not hold stays."""
        xs = x.to(self.dtype)
        out = xs + (self.inverse(f_new.to(self.dtype)) - self.inverse(self.features(xs)))
        return out.to(x.dtype)

    def mask(self) -> torch.Tensor | None:
        """The weight per feature an interchange swaps with (None: every feature)."""
        if self.select is None:
            return None
        assert self.k is not None
        m = torch.zeros(self.k, dtype=self.dtype)
        m[list(self.select)] = 1
        return m

    def swap(self, base: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """``base`` with the selected features taken from ``source`` (same shape):
        ``base + F^-1(mask * (F source - F base))``, the rest of ``base`` kept."""
        b, s = base.to(self.dtype), source.to(self.dtype)
        f_base = self.features(b)
        delta = self.features(s) - f_base
        m = self.mask()
        f_new = f_base + (delta if m is None else delta * m)
        return self.write(b, f_new).to(base.dtype)

    # -- binding --------------------------------------------------------------

    def sized(self, width: int) -> None:
        """Give a featurizer made without a width its parameters (``Subspace(k)``)."""
        self.width = width

    def bind(self, width: int | None, where: str) -> Featurizer:
        """This featurizer at a place ``where`` of ``width`` (sized there if it had no
        width yet), or refused with both widths."""
        if width is None:
            raise FeaturizerRefused(
                f"{where}: a {type(self).__name__} featurizer needs the place's width, and "
                "the component table states none here: address a place with a width "
                "(block_output, attention_z, ...), or read it and featurize the tensor yourself"
            )
        if self.width is None:
            self.sized(width)
        if self.width != width:
            raise FeaturizerRefused(
                f"{where}: {self!r} reads tensors {self.width} wide, and this place is "
                f"{width} wide: fit or build it for width {width} (or address the place it "
                "was made for)"
            )
        if self.k is not None and self.select is not None:
            out = [i for i in self.select if not 0 <= i < self.k]
            if out:
                raise FeaturizerRefused(
                    f"{where}: {type(self).__name__} selects features {out}, and it has "
                    f"{self.k} (0..{self.k - 1}): select features that exist"
                )
        return self

    def lowered_write(self, model: Any, address: Any, value: Any) -> Any:
        """A write of ``value`` (features, or a mechanism on them) at ``address``, bound
        to this featurizer, as the step's ``edit`` a local run applies (a function of
        the place's tensor as a read hands it on); checked first."""
        return _lowered_write(model, address, value)

    # -- data -----------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        """What, beside its tensors, rebuilds this featurizer (JSON)."""
        return {"width": self.width, "select": list(self.select) if self.select else None}

    def tensors(self) -> dict[str, torch.Tensor]:
        """Its parameters as plain tensors by name (what ``save`` writes)."""
        return {}

    @classmethod
    def built(cls, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Featurizer:
        """Rebuild from ``config()`` and ``tensors()`` (what ``load`` does)."""
        raise NotImplementedError  # pragma: no cover - every kind has one

    def _key(self) -> tuple[Any, ...]:
        return (type(self).__name__, self.width, self.k)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Featurizer)
        if self.config() != other.config():
            return False
        mine, theirs = self.tensors(), other.tensors()
        return mine.keys() == theirs.keys() and all(
            mine[n].dtype == theirs[n].dtype and bool(torch.equal(mine[n], theirs[n])) for n in mine
        )

    def __hash__(self) -> int:
        return hash(self._key())

    def __lt__(self, other: object) -> bool:
        return repr(self) < repr(other)

    def __gt__(self, other: object) -> bool:
        return repr(self) > repr(other)

    def __repr__(self) -> str:
        width = "" if self.width is None else f", width={self.width}"
        return f"{type(self).__name__}(k={self.k}{width})"

    def __reduce__(self) -> Any:  # pickles as its data
        return (_rebuilt, (type(self).kind, self.config(), self.tensors()))

    def save(self, path: str, address: Any = None, model: Any = None) -> None:
        """Write the parameters to ``path`` (safetensors) with the place they were
        fitted at: the address's component, layer, head and width, the model's family
        and checkpoint."""
        from safetensors.torch import save_file

        from .mechanisms import checkpoint_of

        meta = {
            "causalab_mini.featurizer": type(self).kind,
            "config": json.dumps(self.config()),
            "width": str(self.width),
            "component": "" if address is None else str(address.component),
            "layer": "" if address is None or address.layer is None else str(address.layer),
            "head": "" if address is None or address.head is None else str(address.head),
            "family": "",
            "checkpoint": "",
        }
        if model is not None:
            resolution = getattr(model, "resolution", None)
            meta["family"] = ",".join(getattr(resolution, "families", ()) or ())
            meta["checkpoint"] = checkpoint_of(model)
        tensors = {n: t.detach().contiguous().cpu() for n, t in self.tensors().items()}
        save_file(tensors, path, metadata=meta)


_KINDS: dict[str, type[Featurizer]] = {}


def _kind(cls: type[Featurizer]) -> type[Featurizer]:
    _KINDS[cls.kind] = cls
    return cls


def _rebuilt(kind: str, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Featurizer:
    return _KINDS[kind].built(config, tensors)


def fitted_at(path: str) -> dict[str, str]:
    """The metadata a saved featurizer carries (kind, config, the place it was fitted
    at: component, layer, head, width, family, checkpoint)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
    if "causalab_mini.featurizer" not in meta:
        raise FeaturizerRefused(
            f"{path} holds no causalab_mini featurizer (its metadata names none): save one "
            "with featurizer.save(path, address, model)"
        )
    return dict(meta)


def load(path: str, onto: Any = None) -> Featurizer:
    """The featurizer saved at ``path``; with ``onto`` (an address), refused unless
    that place has the width it was fitted at."""
    from safetensors.torch import load_file

    meta = fitted_at(path)
    feat = _rebuilt(meta["causalab_mini.featurizer"], json.loads(meta["config"]), load_file(path))
    if onto is not None:
        width = getattr(onto, "width", None)
        if width is None or str(width) != meta["width"]:
            fitted = f"{meta['component']}[{meta['layer']}]" + (
                f".head[{meta['head']}]" if meta["head"] else ""
            )
            raise FeaturizerRefused(
                f"{onto}: {path} was fitted at {fitted} of {meta['checkpoint'] or 'a model'} "
                f"({meta['family'] or 'family not recorded'}), {meta['width']} wide, and this "
                f"place is {width} wide: load it onto a place {meta['width']} wide, or fit one here"
            )
    return feat


# ---------------------------------------------------------------------- kinds


@_kind
class Identity(Featurizer):
    """The place's own coordinates: features are the tensor; a swap hands over the
    source's tensor itself (so an Identity interchange is the plain one, bit for bit)."""

    kind = "identity"

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def inverse(self, f: torch.Tensor) -> torch.Tensor:
        return f

    def read(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def write(self, x: torch.Tensor, f_new: torch.Tensor) -> torch.Tensor:
        return f_new

    def swap(self, base: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        if self.select is None:
            return source
        out = base.clone()
        out[..., list(self.select)] = source[..., list(self.select)]
        return out

    @classmethod
    def built(cls, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Featurizer:
        return cls(width=config.get("width"), select=config.get("select"))


class LinearBasis(Featurizer):
    """A featurizer ``F x = (x - mean) M^T`` with a stated way back ``B`` (d x k):
    writes and swaps move only along ``B``, so what the features leave out stays
    exactly."""

    def matrix_(self) -> torch.Tensor:  # pragma: no cover - every kind has one
        raise NotImplementedError

    def back(self) -> torch.Tensor:
        return self.matrix_().T

    def offset(self) -> torch.Tensor | None:
        return None

    @property
    def matrix(self) -> torch.Tensor:
        """The map, k x d."""
        return self.matrix_()

    @property
    def k(self) -> int | None:
        return None if self.width is None else int(self.matrix_().shape[0])

    def features(self, x: torch.Tensor) -> torch.Tensor:
        mean = self.offset()
        return (x if mean is None else x - mean) @ self.matrix_().T

    def inverse(self, f: torch.Tensor) -> torch.Tensor:
        mean = self.offset()
        out = f @ self.back().T
        return out if mean is None else out + mean

    # writes and swaps are computed in float64 (the map's rounding would otherwise be
    # float32's: a full-rank swap then differs from the plain one by ~d ulp, which deep
    # or scaled models amplify past 1e-5 in the logits) and cast back to the place's dtype

    def write(self, x: torch.Tensor, f_new: torch.Tensor) -> torch.Tensor:
        xs, wide = x.double(), torch.float64
        mean = self.offset()
        f_old = (xs if mean is None else xs - mean.to(wide)) @ self.matrix_().to(wide).T
        return (xs + (f_new.to(wide) - f_old) @ self.back().to(wide).T).to(x.dtype)

    def swap(self, base: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        b, s = base.double(), source.double()
        delta = (s - b) @ self.matrix_().double().T
        m = self.mask()
        moved = delta if m is None else delta * m.double()
        return (b + moved @ self.back().double().T).to(base.dtype)


def orthonormal_rows(matrix: torch.Tensor, where: str) -> None:
    """Refuse a matrix whose rows are not orthonormal (a subspace's map)."""
    k = int(matrix.shape[0])
    gram = matrix.double() @ matrix.double().T
    error = float((gram - torch.eye(k, dtype=torch.float64)).abs().max()) if k else 0.0
    if k > int(matrix.shape[1]) or error > ORTHONORMAL_ATOL:
        raise FeaturizerRefused(
            f"{where}: the matrix given as a subspace ({tuple(matrix.shape)}) does not have "
            f"orthonormal rows (|M M^T - I| reaches {error:.3g}): give one that does "
            "(torch.linalg.qr(A.T).Q.T), or use Linear(matrix) for any basis"
        )


@_kind
class Subspace(LinearBasis):
    """k orthonormal directions of the place, trainable: the map is ``torch.nn.Linear``
    (d -> k) under ``torch.nn.utils.parametrizations.orthogonal`` with the named
    ``parametrization`` ("orthogonal": torch's default map, "cayley", "matrix_exp",
    "householder"). Made without ``width``, it is sized when it binds to a place; its
    start is a random orthonormal basis from ``seed`` (or ``matrix``, checked)."""

    kind = "subspace"
    PARAMETRIZATIONS: ClassVar[dict[str, str | None]] = {
        "orthogonal": None,
        "cayley": "cayley",
        "matrix_exp": "matrix_exp",
        "householder": "householder",
    }

    def __init__(
        self,
        k: int,
        parametrization: str = "orthogonal",
        *,
        width: int | None = None,
        matrix: Any = None,
        seed: int = 0,
        select: Sequence[int] | None = None,
    ):
        if parametrization not in self.PARAMETRIZATIONS:
            raise FeaturizerRefused(
                f"Subspace parametrization {parametrization!r} is not one of "
                f"{', '.join(map(repr, self.PARAMETRIZATIONS))}: write one of those"
            )
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise FeaturizerRefused(f"Subspace(k={k!r}): k is a number of features >= 0")
        super().__init__(None, select)
        self.n = k
        self.parametrization = parametrization
        self.seed = seed
        self.map: torch.nn.Module | None = None
        start = None
        if matrix is not None:
            start = _tensor(matrix, "matrix", "Subspace")
            if start.dim() != 2 or int(start.shape[0]) != k:
                raise FeaturizerRefused(
                    f"Subspace(k={k}): the matrix is {tuple(start.shape)}, not k x d: give a "
                    f"{k} x d matrix with orthonormal rows"
                )
            orthonormal_rows(start, f"Subspace(k={k})")
            width = int(start.shape[1]) if width is None else width
        if width is not None:
            self.sized(width, start)

    @property
    def k(self) -> int | None:
        return self.n

    def sized(self, width: int, start: torch.Tensor | None = None) -> None:
        from torch.nn.utils.parametrizations import orthogonal

        if self.n > width:
            raise FeaturizerRefused(
                f"Subspace(k={self.n}) on a place {width} wide: a subspace has at most as "
                f"many directions as the place's width; give k <= {width}"
            )
        self.width = width
        if start is None:
            g = torch.Generator().manual_seed(self.seed)
            start = torch.linalg.qr(torch.randn(width, self.n, generator=g))[0].T.contiguous()
        if start.shape != (self.n, width):
            raise FeaturizerRefused(
                f"Subspace(k={self.n}): the matrix is {tuple(start.shape)}, and the place is "
                f"{width} wide: give a {self.n} x {width} matrix"
            )
        if self.n == 0:
            self.register_buffer("empty", torch.zeros(0, width))
            return
        # the Linear's own init and the parametrization's internal state draw from the
        # global generator: under this featurizer's seed, so that a seed is one fit
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            linear = torch.nn.Linear(width, self.n, bias=False, dtype=start.dtype)
            mapping = self.PARAMETRIZATIONS[self.parametrization]
            self.map = orthogonal(linear, orthogonal_map=mapping)
            with torch.no_grad():
                self.map.weight = start.to(linear.weight.dtype)

    def matrix_(self) -> torch.Tensor:
        if self.width is None:
            raise FeaturizerRefused(
                f"{self!r} has no width yet: bind it to a place (locate(..., featurizer=f)) "
                "or give width="
            )
        if self.n == 0:
            return self.get_buffer("empty")
        assert self.map is not None
        weight = self.map.weight
        assert isinstance(weight, torch.Tensor)
        return weight

    def config(self) -> dict[str, Any]:
        return {
            **super().config(),
            "k": self.n,
            "parametrization": self.parametrization,
            "seed": self.seed,
        }

    def tensors(self) -> dict[str, torch.Tensor]:
        if self.width is None:
            return {}
        out = {"matrix": self.matrix_().detach().clone()}
        if self.map is not None:  # the parametrization's own state rebuilds it bit for bit
            for name, t in self.map.state_dict().items():
                out[f"state.{name}"] = t.detach().clone()
        return out

    @classmethod
    def built(cls, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Featurizer:
        out = cls(
            config["k"],
            config["parametrization"],
            width=config.get("width"),
            matrix=tensors.get("matrix"),
            seed=config.get("seed", 0),
            select=config.get("select"),
        )
        state = {n.removeprefix("state."): t for n, t in tensors.items() if n.startswith("state.")}
        if out.map is not None and state:
            out.map.load_state_dict(state)
        return out


@_kind
class Linear(LinearBasis):
    """Any basis: ``matrix`` (k x d) and its way back (d x k), the inverse where the
    matrix is square and invertible, else the Moore-Penrose pseudo-inverse, or the
    ``inverse`` given; ``inverse_kind`` says which ("inverse", "pseudo-inverse",
    "given")."""

    kind = "linear"

    def __init__(self, matrix: Any, inverse: Any = None, *, select: Sequence[int] | None = None):
        m = _tensor(matrix, "matrix", "Linear")
        if m.dim() != 2:
            raise FeaturizerRefused(f"Linear: the matrix is {tuple(m.shape)}: give a k x d matrix")
        super().__init__(int(m.shape[1]), select)
        if inverse is not None:
            back = _tensor(inverse, "inverse", "Linear")
            if back.shape != (m.shape[1], m.shape[0]):
                raise FeaturizerRefused(
                    f"Linear: the inverse is {tuple(back.shape)} and the matrix "
                    f"{tuple(m.shape)}: give a d x k inverse ({m.shape[1]} x {m.shape[0]})"
                )
            self.inverse_kind = "given"
        elif m.shape[0] == m.shape[1] and bool(torch.linalg.matrix_rank(m) == m.shape[0]):
            back = torch.linalg.inv(m)
            self.inverse_kind = "inverse"
        else:
            back = torch.linalg.pinv(m)
            self.inverse_kind = "pseudo-inverse"
        self.register_buffer("weight", m.clone())
        self.register_buffer("inverse_weight", back.to(m.dtype).clone())

    def matrix_(self) -> torch.Tensor:
        return self.get_buffer("weight")

    def back(self) -> torch.Tensor:
        return self.get_buffer("inverse_weight")

    def config(self) -> dict[str, Any]:
        return {**super().config(), "inverse_kind": self.inverse_kind}

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"matrix": self.matrix_().clone(), "inverse": self.back().clone()}

    @classmethod
    def built(cls, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Featurizer:
        out = cls(tensors["matrix"], tensors["inverse"], select=config.get("select"))
        out.inverse_kind = config.get("inverse_kind", "given")
        return out


@_kind
class PCA(LinearBasis):
    """The top-k principal directions of harvested activations (rows orthonormal),
    centred on their mean: ``PCA.fit(activations, k)``."""

    kind = "pca"

    def __init__(self, components: Any, mean: Any, *, select: Sequence[int] | None = None):
        c = _tensor(components, "components", "PCA")
        mu = _tensor(mean, "mean", "PCA")
        if c.dim() != 2 or mu.shape != (c.shape[1],):
            raise FeaturizerRefused(
                f"PCA: components {tuple(c.shape)} and mean {tuple(mu.shape)}: give k x d "
                "components and a mean of width d"
            )
        orthonormal_rows(c, "PCA")
        super().__init__(int(c.shape[1]), select)
        self.register_buffer("components", c.clone())
        self.register_buffer("mean", mu.clone())

    @classmethod
    def fit(cls, activations: Any, k: int) -> PCA:
        """The top ``k`` principal directions of ``activations`` (..., d): every row of
        every token is one sample."""
        x = _tensor(activations, "activations", "PCA.fit")
        x = x.reshape(-1, x.shape[-1])
        if not 0 <= k <= min(x.shape):
            raise FeaturizerRefused(
                f"PCA.fit: k={k} from {x.shape[0]} samples of width {x.shape[1]}: give k "
                f"<= {min(x.shape)}"
            )
        mean = x.mean(0)
        _, _, vh = torch.linalg.svd((x - mean).double(), full_matrices=False)
        return cls(vh[:k].to(x.dtype), mean)

    def matrix_(self) -> torch.Tensor:
        return self.get_buffer("components")

    def offset(self) -> torch.Tensor | None:
        return self.get_buffer("mean")

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"components": self.matrix_().clone(), "mean": self.get_buffer("mean").clone()}

    @classmethod
    def built(cls, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Featurizer:
        return cls(tensors["components"], tensors["mean"], select=config.get("select"))


@_kind
class SAE(Featurizer):
    """A sparse autoencoder: ``encode(x) = act(x @ encoder + encoder_bias)`` (encoder
    d x m), ``decode(f) = f @ decoder + decoder_bias`` (decoder m x d); ``activation``
    "relu", "topk" (keeping the ``topk`` largest), "jumprelu" (zero below
    ``threshold``, per feature) or "gated" (a feature is on where ``x @ encoder +
    encoder_bias`` is positive, and then ``relu(x @ encoder * magnitude_scale +
    magnitude_bias)``: a gated SAE's magnitude path shares the gate's directions).
    ``SAE.load(path, model=...)`` reads a published checkpoint (SAELens, sparsify,
    dictionary_learning; ``causalab_mini.saes``) and places it on the model. A write keeps the error term:
    ``decode(f_new) + (x - decode(encode(x)))``, computed as
    ``x + (decode(f_new) - decode(encode(x)))`` (``Featurizer.write``): the same sum,
    whose rounding touches only the edit (no edit gives x back exactly)."""

    kind = "sae"
    ACTIVATIONS = ("relu", "topk", "jumprelu", "gated")
    # where a loaded checkpoint sits on its model (``SAE.load``): its place, a
    # transcoder's output place, and where it came from (``causalab_mini.saes.Origin``)
    site: Any = None
    site_out: Any = None
    origin: Any = None

    def __init__(
        self,
        encoder: Any,
        decoder: Any,
        encoder_bias: Any = None,
        decoder_bias: Any = None,
        *,
        activation: str = "relu",
        topk: int | None = None,
        threshold: Any = None,
        magnitude_scale: Any = None,
        magnitude_bias: Any = None,
        select: Sequence[int] | None = None,
    ):
        enc = _tensor(encoder, "encoder", "SAE")
        dec = _tensor(decoder, "decoder", "SAE")
        if enc.dim() != 2 or dec.shape != (enc.shape[1], enc.shape[0]):
            raise FeaturizerRefused(
                f"SAE: encoder {tuple(enc.shape)} and decoder {tuple(dec.shape)}: give an "
                "encoder d x m and a decoder m x d"
            )
        d, m = int(enc.shape[0]), int(enc.shape[1])
        if activation not in self.ACTIVATIONS:
            raise FeaturizerRefused(
                f"SAE activation {activation!r}: write one of {', '.join(self.ACTIVATIONS)}"
            )
        if activation == "topk" and (not isinstance(topk, int) or not 0 < topk <= m):
            raise FeaturizerRefused(f"SAE(activation='topk') needs topk= between 1 and {m}")
        super().__init__(d, select)
        self.activation, self.topk = activation, topk
        b_enc = torch.zeros(m) if encoder_bias is None else _tensor(encoder_bias, "encoder_bias")
        b_dec = torch.zeros(d) if decoder_bias is None else _tensor(decoder_bias, "decoder_bias")
        if b_enc.shape != (m,) or b_dec.shape != (d,):
            raise FeaturizerRefused(
                f"SAE: biases {tuple(b_enc.shape)} and {tuple(b_dec.shape)}: give an encoder "
                f"bias of width {m} and a decoder bias of width {d}"
            )
        self.encoder = torch.nn.Parameter(enc.clone())
        self.decoder = torch.nn.Parameter(dec.clone())
        self.encoder_bias = torch.nn.Parameter(b_enc.to(enc.dtype).clone())
        self.decoder_bias = torch.nn.Parameter(b_dec.to(enc.dtype).clone())
        if activation == "jumprelu":
            t = torch.zeros(m) if threshold is None else _tensor(threshold, "threshold")
            self.register_buffer("threshold", t.to(enc.dtype).expand(m).clone())
        if activation == "gated":
            for name, value in (
                ("magnitude_scale", magnitude_scale),
                ("magnitude_bias", magnitude_bias),
            ):
                v = torch.ones(m) if value is None else _tensor(value, name, "SAE")
                if v.shape != (m,):
                    raise FeaturizerRefused(
                        f"SAE: {name} is {tuple(v.shape)}: give one of width {m}"
                    )
                self.register_buffer(name, v.to(enc.dtype).clone())

    @property
    def k(self) -> int | None:
        return int(self.encoder.shape[1])

    def features(self, x: torch.Tensor) -> torch.Tensor:
        pre = x @ self.encoder + self.encoder_bias
        if self.activation == "relu":
            return torch.relu(pre)
        if self.activation == "jumprelu":
            return pre * (pre > self.get_buffer("threshold"))
        if self.activation == "gated":
            scaled = (pre - self.encoder_bias) * self.get_buffer("magnitude_scale")
            magnitude = torch.relu(scaled + self.get_buffer("magnitude_bias"))
            return magnitude * (pre > 0)
        assert self.topk is not None
        top = pre.topk(self.topk, dim=-1)
        return torch.zeros_like(pre).scatter(-1, top.indices, torch.relu(top.values))

    encode = features

    def inverse(self, f: torch.Tensor) -> torch.Tensor:
        return f @ self.decoder + self.decoder_bias

    decode = inverse

    def config(self) -> dict[str, Any]:
        return {**super().config(), "activation": self.activation, "topk": self.topk}

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {
            "encoder": self.encoder.detach().clone(),
            "decoder": self.decoder.detach().clone(),
            "encoder_bias": self.encoder_bias.detach().clone(),
            "decoder_bias": self.decoder_bias.detach().clone(),
        }
        if self.activation == "jumprelu":
            out["threshold"] = self.get_buffer("threshold").clone()
        if self.activation == "gated":
            out["magnitude_scale"] = self.get_buffer("magnitude_scale").clone()
            out["magnitude_bias"] = self.get_buffer("magnitude_bias").clone()
        return out

    @classmethod
    def built(cls, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Featurizer:
        return cls(
            tensors["encoder"],
            tensors["decoder"],
            tensors["encoder_bias"],
            tensors["decoder_bias"],
            activation=config["activation"],
            topk=config.get("topk"),
            threshold=tensors.get("threshold"),
            magnitude_scale=tensors.get("magnitude_scale"),
            magnitude_bias=tensors.get("magnitude_bias"),
            select=config.get("select"),
        )

    @classmethod
    def load(cls, path: Any, model: Any, *, site: Any = None, site_out: Any = None) -> SAE:
        """The dictionary saved in the directory ``path`` (SAELens, sparsify or
        dictionary_learning), its site placed on ``model`` (``site``, ``site_out`` for a
        transcoder's output: a hook name or a component address, where the
        checkpoint's own name is ambiguous) and its width checked there
        (``causalab_mini.saes``)."""
        from .saes import DictionaryRefused, placed, read

        parts, origin = read(path)
        try:
            sae = cls(
                parts.encoder,
                parts.decoder,
                parts.encoder_bias,
                parts.decoder_bias,
                activation=parts.activation,
                **parts.options,
            ).requires_grad_(False)
        except FeaturizerRefused as error:
            raise DictionaryRefused(f"{path}: the weights do not make an SAE: {error}") from error
        sae.site, sae.site_out = placed(model, parts, origin, site, site_out)
        sae.origin = origin
        return sae


@_kind
class Gate(Featurizer):
    """A learnable mask over another featurizer's features, which an interchange swaps
    with: "sigmoid" (sigmoid(logits / temperature) per feature), "hard_concrete" (a
    stretched, clamped concrete gate: sampled in training mode, its mean in eval mode),
    or "boundary" (Boundless DAS: feature i weighs sigmoid((boundary - i) /
    temperature), one learnable boundary). Reads and writes are the inner featurizer's."""

    kind = "gate"
    KINDS = ("sigmoid", "hard_concrete", "boundary")
    STRETCH = (-0.1, 1.1)  # hard-concrete's (gamma, zeta)

    def __init__(
        self,
        featurizer: Featurizer,
        kind: str = "sigmoid",
        *,
        temperature: float = 1.0,
        init: float | None = None,
    ):
        if kind not in self.KINDS:
            raise FeaturizerRefused(f"Gate kind {kind!r}: write one of {', '.join(self.KINDS)}")
        if featurizer.k is None:
            raise FeaturizerRefused(
                f"Gate over {featurizer!r}: its number of features is not known until it is "
                "sized: give it width= (or bind it to a place first)"
            )
        super().__init__(featurizer.width, None)
        self.inner = featurizer
        self.gate_kind, self.temperature = kind, float(temperature)
        n = featurizer.k
        if kind == "boundary":
            start = float(n) / 2 if init is None else float(init)
            self.gate = torch.nn.Parameter(torch.tensor([start]))
        else:
            self.gate = torch.nn.Parameter(torch.full((n,), 0.0 if init is None else float(init)))

    @property
    def k(self) -> int | None:
        return self.inner.k

    def sized(self, width: int) -> None:
        self.inner.bind(width, repr(self))
        self.width = width

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner.features(x)

    def inverse(self, f: torch.Tensor) -> torch.Tensor:
        return self.inner.inverse(f)

    def write(self, x: torch.Tensor, f_new: torch.Tensor) -> torch.Tensor:
        return self.inner.write(x, f_new)

    def mask(self) -> torch.Tensor:
        n = self.k
        assert n is not None
        if self.gate_kind == "sigmoid":
            m = torch.sigmoid(self.gate / self.temperature)
        elif self.gate_kind == "boundary":
            index = torch.arange(n, dtype=self.gate.dtype)
            m = torch.sigmoid((self.gate - index) / self.temperature)
        else:
            low, high = self.STRETCH
            if self.training:
                u = torch.rand_like(self.gate).clamp(1e-6, 1 - 1e-6)
                s = torch.sigmoid((u.log() - (-u).log1p() + self.gate) / self.temperature)
            else:
                s = torch.sigmoid(self.gate)
            m = (s * (high - low) + low).clamp(0, 1)
        inner = self.inner.mask()
        return m if inner is None else m * inner

    def swap(self, base: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        inner = self.inner
        if isinstance(inner, LinearBasis):  # in float64, as LinearBasis.swap
            b, s = base.double(), source.double()
            delta = (s - b) @ inner.matrix_().double().T
            return (b + (delta * self.mask().double()) @ inner.back().double().T).to(base.dtype)
        return super().swap(base, source)

    def config(self) -> dict[str, Any]:
        return {
            "width": self.width,
            "gate": self.gate_kind,
            "temperature": self.temperature,
            "inner_kind": self.inner.kind,
            "inner": self.inner.config(),
        }

    def tensors(self) -> dict[str, torch.Tensor]:
        inner = {f"inner.{n}": t for n, t in self.inner.tensors().items()}
        return {**inner, "gate": self.gate.detach().clone()}

    @classmethod
    def built(cls, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Featurizer:
        inner = _rebuilt(
            config["inner_kind"],
            config["inner"],
            {n.removeprefix("inner."): t for n, t in tensors.items() if n.startswith("inner.")},
        )
        out = cls(inner, config["gate"], temperature=config["temperature"])
        with torch.no_grad():
            out.gate.copy_(tensors["gate"])
        return out


# ---------------------------------------------------------------------- binding


class _FeaturizedWrite:
    """A write at a featurized address as the edit a local run applies: the place's
    tensor with its features replaced by ``value`` (features, or a mechanism applied to
    the features)."""

    def __init__(self, featurizer: Featurizer, value: Any):
        self.featurizer, self.value = featurizer, value

    def __call__(self, current: torch.Tensor) -> torch.Tensor:
        from .mechanisms import Mechanism

        f = self.featurizer
        if isinstance(self.value, Mechanism):
            new = self.value.apply(f.read(current))
        else:
            new = self.value
        return f.write(current, new)


def _lowered_write(model: Any, address: Any, value: Any) -> _FeaturizedWrite:
    """A write at a featurized ``address`` as a plain edit, its value checked first:
    features (exactly the shape a featurized read returns) or a mechanism on them."""
    from .mechanisms import Mechanism, check, model_dtype

    f = address.featurizer
    dtype = model_dtype(model) if isinstance(f, Identity) else f.dtype
    where = str(address)
    features = f"the {f.k} features of {f!r}"
    if isinstance(value, Mechanism):
        check(value, where, f.k, dtype, what=features)
    elif isinstance(value, torch.Tensor):
        if not bool(torch.isfinite(value).all()):
            raise FeaturizerRefused(f"{where}: the features written hold NaN or inf")
        if value.dim() == 0 or int(value.shape[-1]) != f.k:
            raise FeaturizerRefused(
                f"{where}: a featurized write takes {features}, and the value is "
                f"{tuple(value.shape)}: give (..., {f.k}) as a featurized read returns it"
            )
        if dtype is not None and value.dtype != dtype:
            raise FeaturizerRefused(
                f"{where}: the features written are {value.dtype}, and {f!r} computes in "
                f"{dtype}: write v.to({dtype})"
            )
    else:
        raise FeaturizerRefused(
            f"{where}: a featurized write takes a tensor of features or a mechanism, not a "
            f"{type(value).__name__}"
        )
    return _FeaturizedWrite(f, value)


__all__ = [
    "PCA",
    "SAE",
    "Featurizer",
    "FeaturizerRefused",
    "Gate",
    "Identity",
    "Linear",
    "LinearBasis",
    "Subspace",
    "fitted_at",
    "load",
]
