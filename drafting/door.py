"""The drafting API's door: every argument a caller hands a drafter is checked here, once, naming the input and the
fix; what is past the door (the service's table, the methods, the native core) trusts it. Token ids are checked by
:mod:`datastore.context` (:class:`datastore.errors.InvalidContext`, a ``ValueError``), the one rule for them.

Request ids are ``int`` (64-bit) or ``str``, as engines key requests. Budgets are ``int`` in ``0..MAX_BUDGET``
(:data:`crest_native.MAX_BUDGET`, the one limit).
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral, Real

import numpy as np

from crest_native import MAX_BUDGET
from datastore.context import check_ids
from datastore.errors import InvalidContext

from .draft import CostCurve

__all__ = ["ENGINE_ID_LIMIT", "MAX_BUDGET", "RequestId", "budget", "budgets", "chain", "curve", "engine_request_ids",
           "engine_rows", "engine_vocab", "min_score", "request_id", "rows", "token_ids"]

RequestId = int | str
"""How a request is keyed: an ``int`` in the 64-bit range or a ``str``."""
_SMALLEST, _LARGEST = -(1 << 63), 1 << 63
ENGINE_ID_LIMIT = 1 << 31
"""An engine's token ids are below this when it names no vocabulary (``follow_rows``)."""
_ID_TYPES = (int, str, type(None))


def request_id(value: object, what: str = "req_id") -> RequestId:
    """``value`` when it is a request id: an ``int`` in ``[-2**63, 2**63)`` (not a ``bool``) or a ``str``.

    Raises:
        TypeError: for another type. ValueError: for an int outside the 64-bit range.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} {value!r} is a {type(value).__name__}; key requests by an int or a str")
    if not _SMALLEST <= value < _LARGEST:
        raise ValueError(f"{what} {value} is outside the 64-bit integers; key requests by a smaller int or a str")
    return value


def budget(value: object, what: str = "budget") -> int:
    """``value`` when it is a budget: an ``int`` (or numpy integer, not a ``bool``) in ``0..MAX_BUDGET``.

    Raises:
        TypeError: for another type. ValueError: outside ``0..MAX_BUDGET``.
    """
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{what} {value!r} is a {type(value).__name__}; a budget is an int in 0..{MAX_BUDGET} "
                        "(draft nodes)")
    out = int(value)
    if not 0 <= out <= MAX_BUDGET:
        raise ValueError(f"{what} {out} is outside 0..{MAX_BUDGET}; pass the draft nodes to verify (0: none)")
    return out


def budgets(values: object, rows: int) -> np.ndarray:
    """An engine step's budgets, one per row: a 1-D integer numpy array (or a sequence of ints), each in
    ``0..MAX_BUDGET``, as ``[rows]`` int64.

    Raises:
        TypeError: for anything else. ValueError: for another length than ``rows``, or a budget outside
            ``0..MAX_BUDGET`` (naming the first).
    """
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or values.dtype.kind not in "iu":
            raise TypeError(f"budgets is a {values.ndim}-D numpy array of {values.dtype}; pass 1-D integers, one per "
                            "row")
        out = values.astype(np.int64, copy=False)
    else:
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise TypeError(f"budgets is a {type(values).__name__}; pass a 1-D integer array or a list of ints")
        out = np.array([budget(v, f"budgets[{i}]") for i, v in enumerate(values)], dtype=np.int64)
    if len(out) != rows:
        raise ValueError(f"{len(out)} budgets for {rows} rows; pass one budget per row of index")
    given = out.tolist()  # Python's min and max: a numpy reduction costs microseconds a call
    if given and (min(given) < 0 or max(given) > MAX_BUDGET):
        bad = int(np.flatnonzero((out < 0) | (out > MAX_BUDGET))[0])
        raise ValueError(f"budgets[{bad}] {int(out[bad])} is outside 0..{MAX_BUDGET}; pass the draft nodes to verify "
                         "(0: none)")
    return out


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


def curve(value: object, chained: bool) -> CostCurve | None:
    """``value`` when it is a step-cost curve for this step's drafts: ``None``, or a
    :class:`drafting.draft.CostCurve` when the drafts are chains (``chained``); its arrays are checked where they are
    read (:func:`crest_native.goodput_keep`).

    Raises:
        TypeError: for anything but ``None`` or a ``CostCurve``. ValueError: for a curve with ``chain=False``.
    """
    if value is None:
        return None
    if not isinstance(value, CostCurve):
        raise TypeError(f"curve={_describe(value)}: pass a drafting.draft.CostCurve (serving.cost.StepCostModel.curve) "
                        "or None")
    if not chained:
        raise ValueError("a step-cost curve cuts chains: pass chain=True (or curve=None)")
    return value


def engine_vocab(value: object) -> int:
    """The id limit of an engine's rows: its model's vocabulary size, an ``int`` in ``1..2**32`` (as a service's
    ``vocab_size``), or ``None`` (:data:`ENGINE_ID_LIMIT`).

    Raises:
        TypeError / ValueError: for anything else, naming it.
    """
    if value is None:
        return ENGINE_ID_LIMIT
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, Integral)):  # int: at once
        raise TypeError(f"vocab_size={value!r} is a {type(value).__name__}; pass the engine model's vocabulary size "
                        "(an int) or None")
    if not 1 <= int(value) <= 1 << 32:
        raise ValueError(f"vocab_size={value} is outside 1..2**32; pass the engine model's vocabulary size")
    return int(value)


def engine_request_ids(req_ids: object, pairs: int) -> Sequence[RequestId | None]:
    """The request of each of an engine's ``pairs`` rows to follow: a sequence of request ids (as
    :func:`request_id` takes them) or ``None`` (no request: it follows nothing).

    Raises:
        TypeError: for anything but a sequence, or an element that is no request id (a ``bool``, a ``float``, a
            ``list`` ...), naming it. ValueError: for another length than ``pairs``.
    """
    if type(req_ids) is not list and (isinstance(req_ids, (str, bytes)) or not isinstance(req_ids, Sequence)):
        raise TypeError(f"req_ids is a {type(req_ids).__name__}; pass a sequence (a list) of request ids, one per "
                        "row of index")
    if len(req_ids) != pairs:
        raise ValueError(f"{len(req_ids)} req_ids for {pairs} rows; pass one request per row of index")
    if not all(type(r) in _ID_TYPES for r in req_ids):  # the common case at once: the rest names what is wrong
        for i, r in enumerate(req_ids):
            if r is not None:
                request_id(r, f"req_ids[{i}]")
    return req_ids  # an int outside 64 bits names no request (start_request refuses it): it follows nothing


def token_ids(ids: object, vocab_size: int, what: str) -> np.ndarray:
    """A prompt's or committed tokens' ids, every one checked against the vocabulary, as ``[N]`` uint32.

    Raises:
        datastore.errors.InvalidContext: naming ``what`` and the id, for anything but a list, tuple or 1-D integer
            array of ids in ``[0, vocab_size)`` (nothing coerced).
    """
    return check_ids(ids, vocab_size, what)


def rows(batch: object) -> tuple[list[RequestId], np.ndarray]:
    """A ``propose`` batch: its request ids and ``[len(batch)]`` int64 budgets.

    Args:
        batch: a sequence of rows ``(req_id, budget)``.

    Raises:
        TypeError / ValueError: naming the row (``batch[i]``), what is wrong and the fix; nothing is drafted.
    """
    if type(batch) is not list and (isinstance(batch, (str, bytes)) or not isinstance(batch, Sequence)):
        raise TypeError(f"batch is a {type(batch).__name__}; pass a list of rows (req_id, budget)")
    ids: list[RequestId] = []
    sizes: list[int] = []
    for i, row in enumerate(batch):
        if type(row) is tuple and len(row) == 2:  # the common case, checked at once: the rest names what is wrong
            rid, b = row
            if ((type(rid) is int and _SMALLEST <= rid < _LARGEST) or type(rid) is str) and type(b) is int \
                    and 0 <= b <= MAX_BUDGET:
                ids.append(rid)
                sizes.append(b)
                continue
        if not isinstance(row, tuple) or len(row) != 2:
            raise TypeError(f"batch[{i}] is {row!r}; each row is a tuple (req_id, budget)")
        ids.append(request_id(row[0], f"batch[{i}] req_id"))
        sizes.append(budget(row[1], f"batch[{i}] budget"))
    return ids, np.array(sizes, dtype=np.int64)


def engine_rows(tokens: object, lengths: object, index: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An engine's batch as a drafter follows it: ``tokens`` ``[rows, max_len]`` int32 or int64 (C order: each row a
    request's ids so far), ``lengths`` ``[>= rows]`` of the same dtype (each row's count), ``index`` the rows to follow
    (a sequence of ints; a row may be named more than once).

    Returns:
        ``(tokens, lengths, index)``: the arrays as given (``tokens`` C-contiguous) and ``index`` as int64.

    Raises:
        datastore.errors.InvalidContext: for another shape or dtype, a length past a row's end, or an index out of
            range.
    """
    if type(tokens) is not np.ndarray or tokens.ndim != 2 or tokens.dtype.type not in (np.int32, np.int64):
        raise InvalidContext(f"rows is {_describe(tokens)}; pass the engine's [rows, max_len] int32 or int64 token "
                             "array")
    if type(lengths) is not np.ndarray or lengths.ndim != 1 or lengths.dtype != tokens.dtype:
        raise InvalidContext(f"lengths is {_describe(lengths)}; pass a 1-D {tokens.dtype} array, each row's count")
    rows = min(len(tokens), len(lengths))
    if (type(index) is not list and not isinstance(index, Sequence)) or not all(type(i) is int for i in index):
        if not isinstance(index, Sequence) or not all(isinstance(i, (int, np.integer)) and type(i) is not bool
                                                      for i in index):
            raise InvalidContext(f"index is {index!r}; pass a sequence of row numbers (ints)")
        index = [int(i) for i in index]  # numpy integers: the same numbers
    if index and (min(index) < 0 or max(index) >= rows):
        raise InvalidContext(f"index {list(index)!r} names rows outside the {rows} given")
    at = np.array(index, dtype=np.int64)
    used = lengths[at].tolist()  # Python's min and max: a numpy reduction costs microseconds a call
    if used and (min(used) < 0 or max(used) > tokens.shape[1]):
        raise InvalidContext(f"lengths {used} of the rows in index are outside 0..{tokens.shape[1]} (the rows' "
                             "columns); pass each row's count of tokens")
    return np.ascontiguousarray(tokens), lengths, at


def _describe(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"a {value.ndim}-D numpy array of {value.dtype}"
    return f"a {type(value).__name__}"
