"""``python -m evaluation distill``: the target's own answers to a prompt set, written as chats to build a datastore.

The model's outputs are the corpus that fits it token for token: a datastore built from them drafts what it will say.

What it does:

1. **Prompts**: each conversation's opening (system turns, first user turn) in any chat file ``--source chat`` reads, or
   JSON Lines of ``{"prompt": "..."}``, rendered with the target's chat template.
2. **Skipped, each counted by reason**: a prompt already in ``--out`` (the run resumes), a repeat, one the contamination
   screen flags (:func:`ingest.contamination.screen_documents`; so is a flagged answer), one too long.
3. **Answers**: vLLM's offline engine (the ``vllm`` extra), in chunks of ``--chunk``, greedy or at ``--temperature`` /
   ``--top-p`` (seeded), up to ``--max-new-tokens`` each and ``--token-budget`` in all.
4. **Output**: one JSON line ``{"messages": [...], "distilled": {...}}`` per prompt, appended to ``--out`` (``*.zst``,
   ``*.gz``) one whole frame per chunk, for ``python -m ingest build --source chat --path OUT``.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from toolkit.options import float_in, int_in

if TYPE_CHECKING:
    from vllm.inputs import TokensPrompt

__all__ = ["Prompt", "build_parser", "main", "opening", "read_conversations", "read_prompts", "rendered_prompts"]


@dataclass(frozen=True)
class Prompt:
    """One prompt to answer.

    Attributes:
        messages: the conversation's opening, ``[{"role", "content"}]``: its system turns, then one user turn.
        key: its identity (SHA-256 of the messages as JSON), what deduplication and resuming compare.
    """

    messages: tuple[dict, ...]
    key: str

    @classmethod
    def of(cls, messages: list[dict]) -> Prompt:
        blob = json.dumps(messages, sort_keys=True, ensure_ascii=False).encode("utf-8")
        return cls(tuple(messages), hashlib.sha256(blob).hexdigest())

    @property
    def user_text(self) -> str:
        """The user turn's text (what the contamination screen reads, as the sets are screened: no template)."""
        return self.messages[-1]["content"]


def opening(messages: list[dict]) -> list[dict] | None:
    """A conversation's opening: the system turns before its first user turn, and that turn (``None``: it opens
    otherwise). ``messages``: ``[{"role", "content"}]`` as :func:`ingest.chats.chat_messages` reads them."""
    out = []
    for m in messages:
        out.append(m)
        if m["role"] == "user":
            return out
        if m["role"] != "system":
            return None
    return None


def read_conversations(paths: list[Path], skipped: Counter, chat_field: str | None = None) -> Iterator[list[dict]]:
    """Each conversation in ``paths`` (files, folders, globs; the chat formats of the module docstring) as
    ``[{"role", "content"}]`` messages (:func:`ingest.chats.chat_messages`), in file order; a record that yields none
    is counted in ``skipped`` by reason.

    Raises:
        ingest.errors.SourceError: when a path does not exist or nothing matches.
    """
    from ingest.chat_files import read_chat_file
    from ingest.chats import chat_messages
    from ingest.files import list_files
    from ingest.sources import CHAT_PATTERNS

    for file in list_files(tuple(paths), CHAT_PATTERNS):
        for item in read_chat_file(file, chat_field):
            if item.reason is not None or item.note is not None:
                skipped[item.reason or "file cut off"] += 1
                continue
            record = item.record
            if isinstance(record, dict) and isinstance(record.get("prompt"), str) and "messages" not in record:
                record = {"messages": [{"role": "user", "content": record["prompt"]}]}
            read = chat_messages(record, item.fields)
            if read.messages is None:
                skipped[read.reason or "unreadable"] += 1
                continue
            yield read.messages


def read_prompts(paths: list[Path], skipped: Counter, chat_field: str | None = None) -> Iterator[Prompt]:
    """Each conversation's opening in ``paths`` (:func:`read_conversations`), in file order; a record that yields
    none is counted in ``skipped`` by reason.

    Raises:
        ingest.errors.SourceError: when a path does not exist or nothing matches.
    """
    for messages in read_conversations(paths, skipped, chat_field):
        turns = opening(messages)
        if turns is None:
            skipped["no user turn first"] += 1
            continue
        yield Prompt.of(turns)


def answered(out: Path) -> set[str]:
    """The keys of the prompts ``out`` holds answers to (empty when it does not exist): a rerun skips them.

    Raises:
        ValueError: when ``out`` holds a line that is not a distilled chat (another file: name another ``--out``), or
            is cut off or corrupt (nothing is rewritten: move it aside, or name another ``--out``).
    """
    from ingest.files import STREAM_ERRORS, open_corpus_file

    if not out.exists():
        return set()
    keys = set()
    n = 0
    try:
        with open_corpus_file(out) as f:
            for n, line in enumerate(f, 1):
                try:
                    messages = json.loads(line)["messages"]
                except (ValueError, KeyError, TypeError) as exc:
                    raise ValueError(f"--out {out}: line {n} is not a distilled chat ({exc}); name another --out") \
                        from exc
                keys.add(Prompt.of(messages[:-1]).key)
    except STREAM_ERRORS as exc:
        raise ValueError(f"--out {out}: the file is cut off or corrupt after {n} chats ({type(exc).__name__}: {exc}); "
                         "it is left as it is: move it aside, or name another --out") from exc
    return keys


def append_chunk(out: Path, lines: list[str]) -> None:
    """Append ``lines`` to ``out`` as one whole compressed frame (zstd for ``*.zst``, gzip member for ``*.gz``), in
    one write: a reader sees every earlier chunk whole."""
    import zstandard

    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if out.name.endswith(".zst"):
        data = zstandard.ZstdCompressor(level=10).compress(data)
    elif out.name.endswith(".gz"):
        data = gzip.compress(data)
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def build_parser() -> argparse.ArgumentParser:
    """This command's options."""
    p = argparse.ArgumentParser(prog="python -m evaluation distill", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[2:4]))
    p.add_argument("--path", type=Path, nargs="+", required=True, metavar="PATH",
                   help="chat files, folders or glob patterns to take the prompts from (the formats of "
                        "`python -m ingest build --source chat`, and JSON Lines of {\"prompt\": ...}).")
    p.add_argument("--out", type=Path, required=True, metavar="FILE",
                   help="the JSON Lines file the chats are appended to (*.zst: zstd, *.gz: gzip); prompts it already "
                        "answers are skipped, so a rerun resumes.")
    p.add_argument("--chat-field", default=None, metavar="FIELD",
                   help="the field a record's turns are under (default: messages, else conversations).")
    p.add_argument("--limit", type=int_in(1), default=None, metavar="N",
                   help="answer at most N prompts in this run (default: every prompt).")
    p.add_argument("--token-budget", type=int_in(1), default=None, metavar="TOKENS",
                   help="stop after the chunk that takes the answers' tokens in this run to TOKENS (default: none).")
    p.add_argument("--max-new-tokens", type=int_in(1), default=512, metavar="N",
                   help="tokens per answer at most (default: %(default)s).")
    p.add_argument("--temperature", type=float_in(0), default=0.0,
                   help="sampling temperature (default: 0, greedy: the answers a greedy deployment gives).")
    p.add_argument("--top-p", type=float_in(0, 1), default=1.0, help="nucleus sampling's p (default: 1).")
    p.add_argument("--seed", type=int_in(0), default=0,
                   help="each sampled request's seed is this plus its position in the run (default: 0).")
    p.add_argument("--chunk", type=int_in(1), default=256, metavar="N",
                   help="prompts per engine call and per frame written (default: %(default)s).")
    p.add_argument("--max-num-seqs", type=int_in(1), default=32, metavar="N",
                   help="requests the engine runs at once (default: %(default)s).")
    p.add_argument("--max-model-len", type=int_in(16), default=4096, metavar="TOKENS",
                   help="prompt and answer tokens at most; a longer prompt is skipped (default: %(default)s).")
    p.add_argument("--model", default=None, metavar="DIR",
                   help="the model (default: the SmolLM2-135M-Instruct checkpoint exported from its GGUF).")
    p.add_argument("--dtype", default="float32",
                   help="the engine's dtype (default: float32, in which greedy output equals plain greedy decoding).")
    p.add_argument("--enforce-eager", action="store_true",
                   help="run the engine eager, without compiling the model: a faster start, slower tokens (for short "
                        "runs; default: compiled, vLLM's default).")
    p.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                   help="the evaluation sets the prompts are screened against (default: CREST_EVAL_DATA or the "
                        "packaged sets).")
    return p


@dataclass
class _Run:
    """What a run did: prompts answered, answer tokens, seconds generating, prompts skipped by reason."""

    answered: int = 0
    tokens: int = 0
    seconds: float = 0.0
    skipped: Counter = field(default_factory=Counter)


def rendered_prompts(paths: list[Path], tokenizer, items, skipped: Counter, *, max_tokens: int,
                     limit: int | None = None, done: frozenset[str] | set[str] = frozenset(),
                     chat_field: str | None = None) -> list[tuple[Prompt, list[int]]]:
    """The openings of ``paths`` (:func:`read_prompts`), rendered with the target's chat template and tokenized: each
    prompt once, none in ``done`` (keys answered already), none the screen flags against ``items``
    (:func:`ingest.contamination.screen_items`), none of more than ``max_tokens`` tokens; at most ``limit`` (reading
    stops there). Each one left out is counted in ``skipped`` by reason.

    Raises:
        ingest.errors.SourceError: when a path does not exist or nothing matches.
    """
    seen: set[str] = set()
    fresh: list[Prompt] = []
    todo: list[tuple[Prompt, list[int]]] = []
    for prompt in read_prompts(paths, skipped, chat_field):
        if prompt.key in done:
            skipped["answered in --out already"] += 1
        elif prompt.key in seen:
            skipped["repeat"] += 1
        else:
            seen.add(prompt.key)
            fresh.append(prompt)
        if len(fresh) == _SCREENED_AT_ONCE:
            todo += _screened(fresh, tokenizer, items, skipped, max_tokens)
            fresh = []
            if limit is not None and len(todo) >= limit:
                break
    todo += _screened(fresh, tokenizer, items, skipped, max_tokens)
    return todo if limit is None else todo[:limit]


_SCREENED_AT_ONCE = 1024


def _screened(fresh: list[Prompt], tokenizer, items, skipped: Counter, max_tokens: int
              ) -> list[tuple[Prompt, list[int]]]:
    """``fresh`` without the prompts the screen flags or that render longer than ``max_tokens``, rendered."""
    from ingest.contamination import screen_documents
    from toolkit.tokenizer import render_chat

    flags = screen_documents([np.asarray(tokenizer(p.user_text, add_special_tokens=False)["input_ids"], np.int64)
                              for p in fresh], items)
    kept = []
    for prompt, flag in zip(fresh, flags):
        ids = tokenizer(render_chat(tokenizer, list(prompt.messages), add_generation_prompt=True),
                        add_special_tokens=False)["input_ids"]
        if flag is not None:
            skipped["contaminated (evaluation sets)"] += 1
        elif len(ids) > max_tokens:
            skipped["too long"] += 1
        else:
            kept.append((prompt, ids))
    return kept


def _distill(args, todo: list[tuple[Prompt, list[int]]], tokenizer, items, run: _Run) -> None:
    """Answer ``todo`` chunk by chunk, appending each chunk's chats to ``--out``; an answer the screen flags against
    ``items`` is not written."""
    from tqdm import tqdm
    from vllm import LLM, SamplingParams

    from decoder.model import export_checkpoint
    from ingest.contamination import screen_documents

    llm = LLM(model=args.model or export_checkpoint(), dtype=args.dtype, max_model_len=args.max_model_len,
              seed=args.seed, max_num_seqs=args.max_num_seqs, enforce_eager=args.enforce_eager)
    settings = {"model": args.model or "SmolLM2-135M-Instruct", "temperature": args.temperature, "top_p": args.top_p,
                "max_new_tokens": args.max_new_tokens}
    with tqdm(total=len(todo), unit="prompt", desc="distill", dynamic_ncols=True) as bar:
        for start in range(0, len(todo), args.chunk):
            chunk = todo[start:start + args.chunk]
            params = [SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_new_tokens,
                                     seed=args.seed + start + i) for i in range(len(chunk))]
            t0 = time.perf_counter()
            prompts: list[TokensPrompt] = [{"prompt_token_ids": ids} for _, ids in chunk]
            outs = llm.generate(prompts, params, use_tqdm=False)
            run.seconds += time.perf_counter() - t0
            answers = [o.outputs[0] for o in outs]
            texts = [tokenizer.decode(a.token_ids, skip_special_tokens=True) for a in answers]
            flags = screen_documents([np.asarray(a.token_ids, dtype=np.int64) for a in answers], items)
            lines = []
            for (prompt, _), answer, text, flag in zip(chunk, answers, texts, flags):
                run.tokens += len(answer.token_ids)
                if flag is not None:
                    run.skipped["answer contaminated (evaluation sets)"] += 1
                    continue
                messages = [*prompt.messages, {"role": "assistant", "content": text}]
                meta = settings | {"output_tokens": len(answer.token_ids), "finish_reason": answer.finish_reason}
                lines.append(json.dumps({"messages": messages, "distilled": meta}, ensure_ascii=False))
            append_chunk(args.out, lines)
            run.answered += len(lines)
            bar.update(len(chunk))
            bar.set_postfix(tokens=run.tokens, tok_s=f"{run.tokens / max(run.seconds, 1e-9):.0f}")
            if args.token_budget is not None and run.tokens >= args.token_budget:
                break


def main(argv: list[str] | None = None) -> int:
    """Entry point (``python -m evaluation distill``): exit 0 with a JSON summary on stdout; 2 for bad options, an
    unreadable ``--path`` or ``--out``, or a missing ``vllm`` extra.

    Raises:
        SystemExit: as argparse does for bad options.
    """
    from ingest.contamination import screen_items
    from ingest.errors import SourceError
    from toolkit import load_tokenizer
    from toolkit.console import EXIT_USAGE, error
    from toolkit.extras import MissingExtra, require

    raw = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(raw)
    if not args.out.parent.is_dir():
        error(f"--out {args.out}: the folder {args.out.parent} does not exist; create it or write elsewhere")
        return EXIT_USAGE
    tokenizer = load_tokenizer()
    run = _Run()
    try:
        items = screen_items(tokenizer, args.data_dir)
        todo = rendered_prompts(args.path, tokenizer, items, run.skipped, max_tokens=args.max_model_len -
                                args.max_new_tokens, limit=args.limit, done=answered(args.out),
                                chat_field=args.chat_field)
    except (SourceError, ValueError, FileNotFoundError) as exc:
        error(str(exc))
        return EXIT_USAGE
    if todo:
        try:
            require("vllm", "vllm", "python -m evaluation distill (the engine that answers)")
        except MissingExtra as exc:
            error(f"{exc}; on this machine: bash scripts/setup-vllm.sh")
            return EXIT_USAGE
        import torch

        if "VLLM_CPU_KVCACHE_SPACE" not in os.environ and not torch.cuda.is_available():
            from serving.server import cpu_env  # vLLM-CPU reads its settings at start-up: start again with them

            os.execve(sys.executable, [sys.executable, "-m", "evaluation", "distill", *raw],
                      cpu_env(in_process=True))
        _distill(args, todo, tokenizer, items, run)
    print(json.dumps({"out": str(args.out), "answered": run.answered, "answer_tokens": run.tokens,
                      "tokens_per_s": round(run.tokens / run.seconds, 1) if run.seconds else None,
                      "skipped": dict(run.skipped)}))
    return 0
