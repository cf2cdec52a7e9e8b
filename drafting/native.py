"""The native core the merged drafter steps (:class:`crest_native.Core`), made from a calibration and the core's
settings (:class:`crest_native.Options`)."""

from __future__ import annotations

from collections.abc import Sequence

import crest_native
from crest_native import Options

from .calibration import RETRIEVAL_SOURCES, Calibration

__all__ = ["core_options", "native_core"]


def core_options(calibration: Calibration, sources: Sequence[str] = RETRIEVAL_SOURCES, outputs_bytes: int | None = None,
                 back_off_min_budget: int | None = None, max_tokens: int = 0, online_strength: float | None = None,
                 online_memory: float | None = None, online_share: int | None = None) -> Options:
    """The core's settings (:class:`crest_native.Options`; any left ``None``: the core's default), whose ranges the
    core checks when it is made; the requests' automata as deep as ``calibration`` was fitted with.

    Raises:
        TypeError: naming a setting that is not an int (a float for the online ones). ValueError: for a negative
            ``outputs_bytes`` (a byte count).
    """
    options = Options()
    options.local_depth = calibration.local_depth
    options.sources = list(sources)
    for name, value in (("outputs_bytes", outputs_bytes), ("back_off_min_budget", back_off_min_budget),
                        ("max_tokens", max_tokens), ("online_share", online_share)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name}={value!r} is a {type(value).__name__}; pass an int")
        if name == "outputs_bytes" and value < 0:
            raise ValueError(f"outputs_bytes={value}: must be >= 0 (0: no output index)")
        setattr(options, name, value)
    for name, real in (("online_strength", online_strength), ("online_memory", online_memory)):
        if real is None:
            continue
        if isinstance(real, bool) or not isinstance(real, (int, float)):
            raise TypeError(f"{name}={real!r} is a {type(real).__name__}; pass a number")
        setattr(options, name, float(real))
    return options


def native_core(calibration: Calibration, options: Options) -> crest_native.Core:
    """The native core scoring with ``calibration`` (its weights and its token term) under ``options``.

    Raises:
        ValueError: naming a setting out of range (``crest::Core``'s constructor).
    """
    term = calibration.token_bias
    return crest_native.Core(calibration.coef, calibration.intercept, calibration.prior, options,
                             None if term is None else term.tokens, None if term is None else term.bias)
