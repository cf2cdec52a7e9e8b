"""The native drafting core (C++, nanobind), built by the package's own build (scikit-build-core, ``CMakeLists.txt``).

Two names: :class:`Core` (each request's suffix automaton, the process-wide index of finished outputs and the
calibrated merge, one call a step: :class:`decoder.core.NativeCore` drives it) and :func:`parse_tree_payload`
(token-tree payloads, codec v1: :func:`datastore.codec.decode_tree` calls it). Each has a Python reference that
computes the same results (``decoder.core.PythonCore``, ``datastore.codec._parse_payload``).
"""

from ._core import Core, parse_tree_payload

__all__ = ["Core", "parse_tree_payload"]
