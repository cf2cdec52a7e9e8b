"""A draft head over the target's own state: its weights, the calibration that weighs its scores, and its file.

The head maps a row's last accepted final-normed hidden state and its bonus token to the next position's state
(EAGLE's feature-level step, Li et al. 2024, section 3.1; S4C's head 1, He et al. 2025, section 3.1.1). In the step the
native core runs it (:meth:`DraftHead.native`, ``csrc/head.hpp``: every row of a step in one pass over the weights, on
the step's own thread) and reads its estimate against the LM-head rows of the union's depth-1 tokens only, never the
vocabulary (``csrc/scores.hpp``, ``model_features``); :attr:`DraftHead.calibration` weighs those model features beside
the others. The trainer's forward, with autograd, is :class:`evaluation.head_module.HeadModule` (torch). A head is
trained per target model (``python -m evaluation train-head``); without one, drafts are exactly those of the
calibration alone.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

import crest_native

from .calibration import Calibration

if TYPE_CHECKING:
    import torch

__all__ = ["DEFAULT_HEAD", "WEIGHTS", "DraftHead", "row_norms", "target_rows"]

DEFAULT_HEAD = Path(__file__).with_name("data") / "head.npz"
"""The head shipped for the default target (SmolLM2-135M-Instruct), where one was trained and is small."""

FORMAT = 1
"""The head file's format version (:meth:`DraftHead.save`)."""
WEIGHTS = ("up", "up_bias", "down", "down_bias", "state_gain", "token_gain")
"""The names of a head's weight arrays, as :class:`DraftHead` takes them and its file holds them."""


def row_norms(lm_head: np.ndarray, rows: int = 16) -> list[float]:
    """The L2 norms of the LM head's first ``rows`` rows (what names the target in :attr:`DraftHead.target`)."""
    return [float(v) for v in np.linalg.norm(np.asarray(lm_head[:rows], dtype=np.float64), axis=1)]


def target_rows(embedding: torch.Tensor, lm_head: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The target's token embedding and LM head as the drafter reads them (:meth:`DraftHead.native`,
    :meth:`drafting.DraftingService.set_model`): ``(embedding, lm_head)``, each ``[vocab, d]`` float32 in C order,
    from torch tensors of any float dtype on any device. Where the model ties them (the two tensors share storage)
    both are one array, copied once.

    Raises:
        ValueError: when the two are not ``[vocab, d]`` of one shape.
    """
    if embedding.dim() != 2 or tuple(embedding.shape) != tuple(lm_head.shape):
        raise ValueError(f"the target's embedding {tuple(embedding.shape)} and LM head {tuple(lm_head.shape)} must "
                         "both be [vocab, d]: pass the weights of its get_input_embeddings() and "
                         "get_output_embeddings()")
    lm = np.ascontiguousarray(lm_head.detach().float().cpu().numpy())
    tied = embedding.data_ptr() == lm_head.data_ptr()
    return (lm if tied else np.ascontiguousarray(embedding.detach().float().cpu().numpy())), lm


@dataclass(frozen=True)
class DraftHead:
    """A trained head: ``f^ = f + down(silu(up([rms(f) * state_gain ; rms(E[x]) * token_gain])))``
    (``csrc/head.hpp`` computes it in the step: :meth:`native`).

    Attributes:
        up: ``[2d, hidden]`` float32. up_bias: ``[hidden]``. down: ``[hidden, d]``. down_bias: ``[d]``.
        state_gain / token_gain: ``[d]`` float32, the gains of the normed state and the normed token embedding.
        calibration: the with-model calibration (:attr:`Calibration.with_model`) fitted with this head's estimates.
        target: what it was trained for: ``{"vocab_size": V, "hidden_size": d, "model": spec, "row_norms": the L2
            norms of the LM head's first 16 rows}`` (:meth:`fits`).
        meta: how it was trained (positions, minutes, held-out figures).

    Raises:
        ValueError: when the shapes do not fit one width ``d``, a weight is not finite (``up`` and ``down`` in float16,
            as the core holds them), or the calibration does not weigh the model features.
    """

    up: np.ndarray
    up_bias: np.ndarray
    down: np.ndarray
    down_bias: np.ndarray
    state_gain: np.ndarray
    token_gain: np.ndarray
    calibration: Calibration
    target: dict
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in WEIGHTS:
            object.__setattr__(self, name, np.ascontiguousarray(getattr(self, name), dtype=np.float32))
        d, hidden = self.width, self.up.shape[1]
        shapes = {"up": (2 * d, hidden), "up_bias": (hidden,), "down": (hidden, d), "down_bias": (d,),
                  "state_gain": (d,), "token_gain": (d,)}
        for name, shape in shapes.items():
            if getattr(self, name).shape != shape:
                raise ValueError(f"head {name} is {getattr(self, name).shape}, expected {shape} (width {d})")
        for name in WEIGHTS:  # up and down as the core holds them: in float16 (csrc/head.hpp)
            half = name in ("up", "down")
            with np.errstate(over="ignore"):  # beyond float16's range is infinite: refused below
                held = getattr(self, name).astype(np.float16) if half else getattr(self, name)
            if not np.isfinite(held).all():
                raise ValueError(f"head {name} holds values that are not finite{' in float16' if half else ''}; the "
                                 "file is damaged or the training diverged: copy it again or retrain it with python -m "
                                 "evaluation train-head")
        if not self.calibration.with_model:
            raise ValueError("a head's calibration must weigh the model features; refit it with python -m evaluation "
                             "train-head")

    @property
    def width(self) -> int:
        """The target's hidden size ``d``."""
        return int(self.down.shape[1])

    def fits(self, lm_head: np.ndarray) -> bool:
        """Whether it was trained for the target whose LM head is ``lm_head`` (``[V, d]``): the same shape, and the
        first rows' norms within 1% (a bf16 copy of the same weights fits)."""
        norms = self.target.get("row_norms", [])
        return (lm_head.shape == (self.target.get("vocab_size"), self.target.get("hidden_size")) and len(norms) > 0
                and bool(np.allclose(row_norms(lm_head)[:len(norms)], norms, rtol=1e-2)))

    def native(self, embedding: np.ndarray) -> crest_native.Head:
        """The head as the native core runs it (:meth:`drafting.DraftingService.set_model`'s ``head``): its weights
        copied (``up`` and ``down`` rounded to float16, as its file stores them: a head read from its file runs
        exactly), ``embedding`` (the target's ``[vocab, d]`` float32 token embedding, C order) read in place and kept
        alive by it. ``Head.estimates(states [n, d] float32, tokens [n] uint32)`` gives ``[n, d]`` float32.

        Raises:
            TypeError: for an embedding that is no C-ordered float32 array. ValueError: for one of another width.
        """
        return crest_native.Head(self.up, self.up_bias, self.down, self.down_bias, self.state_gain, self.token_gain,
                                 embedding)

    def save(self, path: str | Path) -> None:
        """Write it as one ``.npz`` (float16 weights; the calibration, target and meta as JSON)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        record = {"format": FORMAT, "calibration": self.calibration.to_json(), "target": self.target,
                  "meta": self.meta}
        with open(path, "wb") as f:
            np.savez_compressed(f, record=np.array(json.dumps(record)),
                                **{name: getattr(self, name).astype(np.float16) for name in WEIGHTS})

    @classmethod
    def load(cls, path: str | Path) -> DraftHead:
        """Read a head written by :meth:`save`.

        Raises:
            FileNotFoundError: when the file is missing (train one: ``python -m evaluation train-head``).
            ValueError: when it is not a head file of this format.
        """
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no draft head at {path}: train one with python -m evaluation train-head")
        try:
            # the file opened here: numpy leaks the one it opens when a truncated file is no zip
            with open(path, "rb") as f, np.load(f, allow_pickle=False) as z:
                record = json.loads(str(z["record"]))
                arrays = {name: z[name].astype(np.float32) for name in WEIGHTS}
        except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:  # a truncated file is no zip
            raise ValueError(f"{path} is not a draft head file ({e}); retrain it with python -m evaluation "
                             "train-head") from e
        if record.get("format") != FORMAT:
            raise ValueError(f"{path} is a draft head of format {record.get('format')}, this package reads {FORMAT}; "
                             "retrain it with python -m evaluation train-head")
        return cls(**arrays, calibration=Calibration.from_json(record["calibration"], str(path)),
                   target=record["target"], meta=record.get("meta", {}))
