"""The drafting API's door: what only Python can check about a caller's arguments is checked here, once, naming the
input and the fix: request ids, budgets' and flags' types, token lists (by :mod:`datastore.context`, the one rule for
token ids), probabilities. The values an engine hands a step in arrays (budgets' range, its rows, counts and index) are
checked by the native step itself (``crest::Core::step``), before anything changes: nothing is checked twice.

Request ids are ``int`` (64-bit) or ``str``, as engines key requests. Budgets are ``int`` in ``0..MAX_BUDGET``
(:data:`crest_native.MAX_BUDGET`, the one limit).
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral, Real
from typing import TYPE_CHECKING

import numpy as np

from crest_native import MAX_BUDGET, Curve
from datastore.context import check_ids

if TYPE_CHECKING:
    from .calibration import Calibration

__all__ = ["ENGINE_ID_LIMIT", "MAX_BUDGET", "RequestId", "budgets", "chain", "curve", "datastore_choice",
           "engine_vocab", "min_score", "request_id", "request_ids", "token_ids", "token_lists"]

RequestId = int | str
"""How a request is keyed: an ``int`` in the 64-bit range or a ``str``."""
_SMALLEST, _LARGEST = -(1 << 63), 1 << 63
ENGINE_ID_LIMIT = 1 << 31
"""An engine's token ids are below this when it names no vocabulary."""


def request_id(value: object, what: str = "req_id") -> RequestId:
    """``value`` when it is a request id: an ``int`` in ``[-2**63, 2**63)`` (not a ``bool``) or a ``str``.

    Raises:
        TypeError: for another type. ValueError: for an int outside the 64-bit range.
    """
    if type(value) is str or (type(value) is int and _SMALLEST <= value < _LARGEST):  # the common case at once
        return value
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} {value!r} is a {type(value).__name__}; key requests by an int or a str")
    if not _SMALLEST <= value < _LARGEST:
        raise ValueError(f"{what} {value} is outside the 64-bit integers; key requests by a smaller int or a str")
    return value


def request_ids(values: object) -> list[RequestId]:
    """A step's requests: a sequence of request ids (as :func:`request_id` takes them), as a list.

    Raises:
        TypeError / ValueError: for anything but a sequence of request ids, naming ``requests[i]``.
    """
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"requests is a {type(values).__name__}; pass a list of request ids (or a drafting.Batch)")
    return [request_id(v, f"requests[{i}]") for i, v in enumerate(values)]


def budgets(values: object, rows: int) -> np.ndarray:
    """A step's budgets, one per request: a 1-D integer numpy array or a sequence of ints, as ``[rows]`` int64 (a
    C-ordered native int64 array is passed as it is; any other is copied). Their range, ``0..MAX_BUDGET``, is the
    native step's to check; a value no int64 holds is refused here, by the same words.

    Raises:
        TypeError: for anything else, naming ``budgets[i]``. ValueError: for another length than ``rows``, or a value
            outside the int64 range.
    """
    if type(values) is np.ndarray:
        if values.ndim != 1 or values.dtype.kind not in "iu":
            raise TypeError(f"budgets is a {values.ndim}-D numpy array of {values.dtype}; pass 1-D integers, one per "
                            "request")
        if values.dtype.kind == "u" and values.dtype.itemsize == 8 and len(values) \
                and int(values.max()) > _LARGEST - 1:
            i = int(values.argmax())
            raise ValueError(_outside(i, int(values[i])))
        out = np.ascontiguousarray(values, dtype=np.int64)
    else:
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise TypeError(f"budgets is a {type(values).__name__}; pass a 1-D integer array or a list of ints")
        for i, v in enumerate(values):
            if type(v) is not int and (isinstance(v, bool) or not isinstance(v, Integral)):
                raise TypeError(f"budgets[{i}] {v!r} is a {type(v).__name__}; a budget is an int in 0..{MAX_BUDGET} "
                                "(draft nodes)")
            if not _SMALLEST <= int(v) < _LARGEST:
                raise ValueError(_outside(i, int(v)))
        out = np.array(values, dtype=np.int64)
    if len(out) != rows:
        raise ValueError(f"{len(out)} budgets for {rows} requests; pass one budget per request")
    return out


def _outside(i: int, value: int) -> str:
    """The words of a budget out of range (the native step's, ``crest::Core::step``)."""
    return f"budgets[{i}] = {value} is outside 0..{MAX_BUDGET}; pass the draft nodes to verify (0: none)"


def datastore_choice(datastore: object, shared: object) -> tuple[str | None, bool]:
    """A request's datastores (:meth:`drafting.DraftingService.start_request`): a datastore name or ``None``, and
    whether the shared datastore is on (a ``bool``).

    Raises:
        TypeError: for a name that is no str, or a ``shared`` that is no bool.
    """
    if datastore is not None and type(datastore) is not str:
        raise TypeError(f"datastore={datastore!r} is a {type(datastore).__name__}; pass a datastore's name (a str) or "
                        "None")
    if type(shared) is not bool:
        raise TypeError(f"shared={shared!r} is a {type(shared).__name__}; pass True (also draft from the shared "
                        "datastore) or False")
    return datastore, shared


def min_score(value: object, what: str = "min_score") -> float:
    """``value`` as a float when it is a probability in [0, 1] (a real number, not a ``bool``).

    Raises:
        TypeError: for another type. ValueError: outside [0, 1] (NaN included).
    """
    if type(value) is not float and (isinstance(value, bool) or not isinstance(value, Real)):  # float: at once
        raise TypeError(f"{what} {value!r} is a {type(value).__name__}; pass a probability in [0, 1]")
    out = float(value)
    if not 0.0 <= out <= 1.0:
        raise ValueError(f"{what}={out}: must be a probability in [0, 1]")
    return out


def chain(value: object) -> bool:
    """``value`` when it says whether to draft chains: a ``bool`` (or ``numpy.bool_``, the same two values).

    Raises:
        TypeError: for anything else (``1``, ``"yes"``, ``None``), naming it.
    """
    if type(value) is bool:
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(f"chain={value!r} is a {type(value).__name__}; pass True (each row's best path) or False (a tree)")


def curve(value: object) -> Curve | None:
    """``value`` when it is a step-cost curve: ``None`` or a :class:`drafting.CostCurve` (its points were checked when
    it was made; that it cuts chains only, by the native step).

    Raises:
        TypeError: for anything else.
    """
    if value is None or type(value) is Curve:
        return value
    raise TypeError(f"curve is a {type(value).__name__}; pass a drafting.CostCurve (drafting.cost.StepCostModel.curve) "
                    "or None")


def engine_vocab(value: object) -> int:
    """The id limit of an engine's rows: its model's vocabulary size, an ``int`` in ``1..2**32``, or ``None``
    (:data:`ENGINE_ID_LIMIT`).

    Raises:
        TypeError / ValueError: for anything else, naming it.
    """
    if value is None:
        return ENGINE_ID_LIMIT
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, Integral)):
        raise TypeError(f"vocab_size={value!r} is a {type(value).__name__}; pass the engine model's vocabulary size "
                        "(an int) or None")
    if not 1 <= int(value) <= 1 << 32:
        raise ValueError(f"vocab_size={value} is outside 1..2**32; pass the engine model's vocabulary size")
    return int(value)


def token_ids(ids: object, vocab_size: int, what: str) -> np.ndarray:
    """A prompt's or committed tokens' ids, every one checked against the vocabulary, as ``[N]`` uint32.

    Raises:
        datastore.errors.InvalidContext: naming ``what`` and the id, for anything but a list, tuple or 1-D integer
            array of ids in ``[0, vocab_size)`` (nothing coerced).
    """
    return check_ids(ids, vocab_size, what)


def token_lists(values: object, rows: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Each request's new tokens (``tokens[i]``, as :func:`token_ids` takes them), laid end to end: ``([N] uint32,
    [rows] int64 counts)``.

    Raises:
        TypeError / ValueError: for anything but a sequence of ``rows`` token sequences.
        datastore.errors.InvalidContext: naming ``tokens[i]`` and the id (nothing is followed).
    """
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"tokens is a {type(values).__name__}; pass one list of new token ids per request, or "
                        "drafting.EngineRows")
    if len(values) != rows:
        raise ValueError(f"{len(values)} token lists for {rows} requests; pass one per request (empty: none new)")
    checked = [token_ids(t, vocab_size, f"tokens[{i}]") for i, t in enumerate(values)]
    counts = np.fromiter((len(t) for t in checked), np.int64, rows)
    return (np.concatenate(checked) if checked else np.zeros(0, np.uint32)), counts


def states(values: object, rows_mask: object, rows: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """A step's states (:meth:`drafting.DraftingService.step`'s ``states``) and the rows that have one.

    Args:
        values: ``[rows, width]`` float32, C order (read in place). rows_mask: ``[rows]`` bool, or None (every row).
        rows: the step's rows. width: the model's hidden size (0: no model is set).

    Raises:
        ValueError: when no model is set, or for another shape. TypeError: for another dtype or layout.
    """
    if width == 0:
        raise ValueError("states were given but no model is set: call set_model(lm_head, calibration) first")
    if type(values) is not np.ndarray or values.dtype != np.float32 or not values.flags.c_contiguous:
        raise TypeError("states must be a C-ordered float32 numpy array [rows, hidden_size] (np.ascontiguousarray("
                        "x, dtype=np.float32))")
    if values.shape != (rows, width):
        raise ValueError(f"states is {values.shape}; pass one state per row: ({rows}, {width})")
    if rows_mask is None:
        return values, np.ones(rows, dtype=np.bool_)
    if type(rows_mask) is not np.ndarray or rows_mask.dtype != np.bool_ or rows_mask.shape != (rows,):
        raise TypeError(f"state_rows must be a bool numpy array of shape ({rows},): which rows have a state")
    return values, np.ascontiguousarray(rows_mask)


def model(lm_head: object, calibration: Calibration) -> None:
    """Check :meth:`drafting.DraftingService.set_model`'s arguments.

    Raises:
        TypeError: for an LM head that is no C-ordered float32 ``[vocab, hidden_size]`` array. ValueError: for a
            calibration without the model features.
    """
    if type(lm_head) is not np.ndarray or lm_head.dtype != np.float32 or lm_head.ndim != 2 \
            or not lm_head.flags.c_contiguous:
        raise TypeError("lm_head must be the target's LM head as a C-ordered float32 numpy array [vocab, hidden_size] "
                        "(np.ascontiguousarray(w, dtype=np.float32))")
    if not calibration.with_model:
        raise ValueError("set_model needs a with-model calibration (a DraftHead's): this one weighs no model features")
