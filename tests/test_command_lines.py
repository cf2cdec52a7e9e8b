"""Every command line at once, the benchmarks' included: each help text and description is a whole sentence, the
defaults each subcommand's ``--help`` states are the values its options get, and no subcommand's defaults leak into
another's. (Each command's bad input is tested beside it: ``tests/<package>/test_cli.py``.)"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pytest

from support import REPO

BENCHMARKS = sorted(f"benchmarks.{p.stem}" for p in (REPO / "benchmarks").glob("*.py") if not p.stem.startswith("_"))
EXPERIMENTS = sorted(f"research.experiments.{p.stem}" for p in (REPO / "research" / "experiments").glob("*.py")
                     if not p.stem.startswith("_"))


def _texts(parser: argparse.ArgumentParser, where: str):
    """``(where, what, text)`` of every help text and description of ``parser`` and its subcommands."""
    if parser.description:
        yield where, "description", parser.description.split("\n\n")[0]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield where, f"subcommand {choice.dest}", choice.help
            for name, sub in action.choices.items():
                yield from _texts(sub, f"{where} {name}")
        elif action.dest != "help" and action.help != argparse.SUPPRESS:  # a hidden option is no user's
            yield where, "/".join(action.option_strings) or action.dest, action.help


def test_every_help_text_is_a_whole_sentence():
    """No option, subcommand or command is left undocumented or cut off mid-sentence (a description made of a
    docstring's first line once stopped at "...for the peer")."""
    import importlib

    parsers = {**_parsers(), "serving": importlib.import_module("serving.server").build_parser()}
    for name in BENCHMARKS + EXPERIMENTS:
        module = importlib.import_module(name)
        if hasattr(module, "build_parser"):
            parsers[f"python -m {name}"] = module.build_parser()
        else:
            assert "argparse" not in (REPO / f"{name.replace('.', '/')}.py").read_text(), name
    checked = 0
    for cli, parser in parsers.items():
        for where, what, text in _texts(parser, cli):
            assert text and text.rstrip().endswith((".", "?", "!", ":")), (where, what, text)
            checked += 1
    assert checked > 250 and len(parsers) > 15


def _parsers():
    from datastore.admin.cli import build_parser as datastore_parser
    from evaluation.cli import build_parser as evaluation_parser
    from ingest.cli import build_parser as ingest_parser
    from live.cli import build_parser as live_parser
    from research.hf_bench.cli import build_parser as hf_bench_parser
    from research.s4c.cli import build_parser as s4c_parser
    from research.study.cli import build_parser as study_parser

    return {"ingest": ingest_parser(), "datastore": datastore_parser(), "evaluation": evaluation_parser(),
            "live": live_parser(), "research.hf_bench": hf_bench_parser(), "research.study": study_parser(),
            "research.s4c": s4c_parser()}


def _spellings(value) -> set[str]:
    """The ways a help text may spell one value: as is; a count as 2M or 500K; a fraction as 4%."""
    out = {str(value)}
    if isinstance(value, int) and not isinstance(value, bool):
        for unit, size in (("K", 1_000), ("M", 1_000_000)):
            if value >= size and value % size == 0:
                out.add(f"{value // size}{unit}")
    if isinstance(value, float) and 0 < value <= 1:
        out.add(f"{value * 100:g}%")
    return out


def _says(stated: str, value) -> bool:
    """Whether a help text's ``default: ...`` states ``value`` (a list may be elided: ``1K 2K ... 512K``)."""
    if not isinstance(value, (list, tuple)):
        return any(stated == s or stated.startswith((s + ",", s + " ", s + ":", s + ";")) for s in _spellings(value))
    if not value:
        return stated.startswith("none")
    if len(value) == 2 and stated == "both":
        return True
    words = stated.split()
    if "..." in words:
        head, tail = words[:words.index("...")], words[words.index("...") + 1:]
        return (all(w in _spellings(v) for w, v in zip(head, value)) and
                all(w in _spellings(v) for w, v in zip(tail[::-1], value[::-1])))
    return len(words) == len(value) and all(w in _spellings(v) for w, v in zip(words, value))


def test_every_default_is_what_help_says():
    """Each subcommand parsed with no options: every default a help text states is the value the option gets, and
    no subcommand's defaults leak into another's (``evaluation bench`` drafts with ``merged``)."""
    required = {"drop": ["x"], "grant-reader": ["r"], "revoke-reader": ["r"], "grant-appender": ["r"],
                "stats": ["--name", "x"], "replica": ["--name", "x"], "head-pack": ["--out", "x"]}
    checked = 0
    for cli, parser in _parsers().items():
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        for name, subparser in sub.choices.items():
            args = vars(parser.parse_args([name, *required.get(name, [])]))
            for action in subparser._actions:
                text = (action.help or "").replace("%(default)s", str(action.default)).replace("%%", "%")
                m = re.search(r"\(default: ([^)]*)\)|default: ([^;)]*)\)?$", text)
                if not m or action.dest == "help":
                    continue
                stated = m.group(1) or m.group(2)
                value = args[action.dest]
                if value is None or isinstance(value, bool):
                    continue  # None: the help names where the value comes from instead (an env var, a cache ...)
                assert _says(stated.strip(), value), (cli, name, action.dest, value, stated)
                checked += 1
    assert checked > 40
    from research.hf_bench.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["bench"]).drafter == ["merged"] == parser.parse_args(["replay"]).drafter
    assert parser.parse_args(["budget"]).drafter == []


def _numbers(parser: argparse.ArgumentParser):
    """The options of ``parser`` that take numbers: ``(flag, type, default)``."""
    for action in parser._actions:
        if action.type in (int, float) or getattr(action.type, "__name__", "") in ("integer", "number",
                                                                                    "positive_float", "percent"):
            yield "/".join(action.option_strings), action.type, action.default


def test_every_benchmark_number_is_checked_by_range_and_its_default_is_in_it(capsys):
    """No benchmark option takes a bare ``int`` or ``float`` (argparse would take ``--workers 0`` or ``--seconds nan``
    and fail later, or not at all): each takes a :mod:`toolkit.options` type, and its default is a value that type
    accepts. A value outside the range exits 2 naming the option."""
    import importlib

    checked = 0
    for name in BENCHMARKS:
        module = importlib.import_module(name)
        if not hasattr(module, "build_parser"):
            continue
        parser = module.build_parser()
        for flag, parse, default in _numbers(parser):
            assert parse not in (int, float), (name, flag)
            for value in default if isinstance(default, list) else [] if default is None else [default]:
                assert parse(str(value)) == value, (name, flag, value)
                checked += 1
    assert checked > 40
    from benchmarks import peers

    for bad, named in ((["--workers", "0"], "--workers: 0: must be >= 1"),
                       (["--node-cost", "1.5"], "--node-cost: 1.5 is outside [0, 1]"),
                       (["--budgets", "4", "nan"], "--budgets: 'nan' is not an integer")):
        with pytest.raises(SystemExit) as exit_:
            peers.build_parser().parse_args(bad)
        assert exit_.value.code == 2 and named in capsys.readouterr().err


def test_every_command_line_a_benchmark_builds_for_its_children_parses():
    """A benchmark that runs children builds their command lines itself: each one, at the benchmark's defaults and for
    every method it runs, is taken by the child's own parser (a child once stopped at once: ``--k 0`` for the method
    without speculation, after its parser began refusing 0)."""
    from benchmarks import build, spark_build, vllm_serving
    from ingest.cli import build_parser as ingest_parser

    def child_args(command: list[str]) -> list[str]:
        assert command[0] == sys.executable
        return command[3:] if command[1] == "-m" else command[2:]

    parsed = 0
    serving = vllm_serving.build_parser()
    for extra in ([], ["--temperature", "0.7", "--k", "4", "--accounting"]):
        args = serving.parse_args(extra)
        for method in args.methods:
            for c in args.concurrency:
                child = serving.parse_args(child_args(vllm_serving.child_command(args, method, c, Path("x.json"))))
                assert child.child and child.method == method and child.concurrency == [c]
                assert child.temperature == args.temperature and child.accounting == args.accounting
                assert (child.k is None) == (method == "none")
                parsed += 1
    args, extra = build.build_parser().parse_known_args(["--limit", "10"])
    assert ingest_parser().parse_args(child_args(build.child_command(args, extra))).limit == 10
    for _, name, command in spark_build.builds(spark_build.build_parser().parse_args(["--masters", "local[1]",
                                                                                      "local[2]"])):
        assert ingest_parser().parse_args(child_args(command)).name == name
        parsed += 1
    assert parsed == 2 * 4 * 3 + 3
