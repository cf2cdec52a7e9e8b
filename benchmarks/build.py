"""Full default build, timed: seconds per stage, tokens/s and peak RSS.

Runs ``python -m ingest build --top-t 2M --json`` (plus any extra flags) in a child process and
prints what it measured: seconds per stage, tokens/s, and peak RSS both of the largest process
and summed over the build's process tree (sampled every 0.2 s). Postgres's own memory is not
included.

    python -m benchmarks.build [--name sharegpt] [extra ingest flags...]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path

from ._child import run_sampled


def build_parser() -> argparse.ArgumentParser:
    """This script's command line; every other option goes to ``python -m ingest build``."""
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--name", default="sharegpt", help="the datastore built (default: sharegpt).")
    ap.add_argument("--top-t", default="2M", help="n-grams kept per n (default: 2M).")
    return ap


def child_command(args, extra: list[str]) -> list[str]:
    """The build's command line: ``python -m ingest build`` with this script's options and the extra flags."""
    return [sys.executable, "-m", "ingest", "build", "--json", "--quiet", "--name", args.name, "--top-t", args.top_t,
            *extra]


def main() -> None:
    args, extra = build_parser().parse_known_args()
    out, wall, _, peak_tree = run_sampled(child_command(args, extra), cwd=Path(__file__).resolve().parents[1])
    if out.returncode != 0:
        sys.exit(f"build failed:\n{out.stderr[-4000:]}")
    r = json.loads(out.stdout)
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB
    print(f"documents {r['documents']:,}; tokens {r['tokens']:,}; n-grams stored {r['ngrams']:,}")
    for stage, sec in r["timings"].items():
        print(f"  {stage:<9} {sec:8.1f} s")
    print(f"end to end {wall:.1f} s (build wall {r['wall_seconds']:.1f} s); {r['tokens'] / wall:,.0f} tokens/s")
    print(f"peak RSS: largest single process {rss:.2f} GiB; whole process tree (sampled) {peak_tree / 2**30:.2f} GiB")
    print(f"bytes on disk {r['bytes_on_disk']:,}; bytes per n-gram {r['bytes_per_ngram']:.1f}")
    for n, s in r["ngram_stats"].items():
        print(f"  n={n}: kept {s['kept']:,} of {s['distinct']:,} (min count {s['min_kept_count']}), "
              f"mean tree {s['nodes'] / max(s['kept'], 1):.1f} nodes")
    c = r["corpus"]
    print(f"corpus: {c['documents']:,} documents; malformed {c['malformed']}; notes: {c['notes']}")


if __name__ == "__main__":
    main()
