"""A lookup's context, checked: a sequence of token ids of the tokenizer's vocabulary, nothing coerced.

A context is the sequence so far (prompt and output); lookups read only its last few tokens, so only those
are checked (the cost is a handful of comparisons a lookup). Accepted: a ``list``/``tuple`` (or another
``collections.abc.Sequence``) of Python or numpy integers, or a 1-D integer ``numpy`` array. Refused, with
:class:`datastore.errors.InvalidContext`: floats (a float array would be truncated silently), booleans,
strings and bytes, generators and other non-sequences, ids outside ``[0, vocab_size)``, and, for a batch,
anything but a sequence of contexts.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral

import numpy as np

from .errors import InvalidContext

__all__ = ["TokenIds", "check_context", "check_array", "check_batch", "check_ids", "outside_vocabulary"]

TokenIds = Sequence[int] | np.ndarray
"""What a context (or a prompt, or committed tokens) may be: a sequence of ints or a 1-D integer array."""


def check_context(context, vocab_size: int, tail: int, what: str = "context") -> list[int]:
    """The last ``tail`` token ids of ``context`` as Python ints, checked.

    Args:
        context: the token ids (see the module docstring for what is accepted).
        vocab_size: ids must be in ``[0, vocab_size)``.
        tail: how many trailing ids are used (and checked), >= 0.
        what: how the message names the input.

    Raises:
        InvalidContext: naming the input, what is wrong with it, and the fix.
    """
    if isinstance(context, np.ndarray):
        if context.ndim != 1 or context.dtype.kind not in "iu":
            raise InvalidContext(f"{what} is a {context.ndim}-D numpy array of {context.dtype}; pass a 1-D array "
                                 "(or a list) of integer token ids")
        ids = context[max(len(context) - tail, 0):].tolist() if tail else []
    elif isinstance(context, (str, bytes, bytearray)) or not isinstance(context, Sequence):
        raise InvalidContext(f"{what} is a {type(context).__name__}; pass a list, tuple or 1-D integer numpy array "
                             "of token ids (tokenize text first)")
    else:
        ids = list(context[max(len(context) - tail, 0):]) if tail else []
        if not all(type(t) is int for t in ids):  # Python ints pass at once; anything else is checked one by one
            for t in ids:
                if not isinstance(t, Integral) or isinstance(t, bool):
                    raise InvalidContext(f"{what} holds {t!r} ({type(t).__name__}); token ids are integers")
            ids = [int(t) for t in ids]
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise outside_vocabulary(what, bad[0], vocab_size)
    return ids


def outside_vocabulary(what: str, token: int, vocab_size: int) -> InvalidContext:
    """The error for ``what`` holding ``token``, outside ``[0, vocab_size)``."""
    return InvalidContext(f"{what} holds token id {token}, outside the tokenizer's vocabulary [0, {vocab_size}); "
                          "tokenize with the datastore's tokenizer")


def check_ids(ids, vocab_size: int, what: str) -> np.ndarray:
    """Every id of ``ids`` checked (a prompt, committed tokens), as a ``[N]`` uint32 array (vectorized for arrays).

    Args:
        ids: a list, tuple or 1-D integer array of token ids (see the module docstring).
        vocab_size: ids must be in ``[0, vocab_size)``, ``vocab_size <= 2**32``.
        what: how the message names the input.

    Raises:
        InvalidContext: naming the input, the first id outside the vocabulary (or what is not an id), and the fix.
    """
    if not isinstance(ids, np.ndarray):
        n = len(ids) if isinstance(ids, Sequence) else 0
        return np.asarray(check_context(ids, vocab_size, n, what), dtype=np.uint32)
    arr = check_array(ids, what)
    if len(arr) and int(arr.max()) >= vocab_size:
        raise outside_vocabulary(what, int(arr[np.argmax(arr >= vocab_size)]), vocab_size)
    return arr.astype(np.uint32, copy=False)


def check_array(ids: np.ndarray, what: str = "context") -> np.ndarray:
    """A whole 1-D integer array of non-negative token ids, as it is (no copy; no per-element Python loop).

    Raises:
        InvalidContext: for another dtype or shape, or a negative id.
    """
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise InvalidContext(f"{what} is a {ids.ndim}-D numpy array of {ids.dtype}; pass a 1-D array (or a list) "
                             "of integer token ids")
    if ids.dtype.kind == "i" and len(ids) and int(ids.min()) < 0:
        raise InvalidContext(f"{what} holds token id {int(ids.min())}, outside the tokenizer's vocabulary; token ids "
                             "are >= 0")
    return ids


def check_batch(contexts, vocab_size: int, tail: int) -> list[list[int]]:
    """:func:`check_context` for each context of a batch.

    Raises:
        InvalidContext: when ``contexts`` is not a sequence of contexts or a 2-D integer array (a flat list of
            ids included: use ``lookup`` for one context), or when one context is refused (the message gives
            its index).
    """
    if isinstance(contexts, np.ndarray) and contexts.ndim == 2:
        contexts = list(contexts)  # one context per row
    if isinstance(contexts, (str, bytes, bytearray, np.ndarray)) or not isinstance(contexts, Sequence):
        raise InvalidContext(f"contexts is a {type(contexts).__name__}; lookup_batch takes a list of contexts, each "
                             "a sequence of token ids (or a 2-D integer array, one context per row)")
    if len(contexts) and isinstance(contexts[0], Integral):
        raise InvalidContext("contexts is a flat sequence of token ids; lookup_batch takes a list of contexts "
                             "(use lookup() for one context)")
    return [check_context(c, vocab_size, tail, f"contexts[{i}]") for i, c in enumerate(contexts)]
