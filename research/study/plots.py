"""The studies' figures (matplotlib, Agg backend): accept length against bytes, tree size against top-t, accept length
against corpus tokens."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)
from matplotlib.ticker import FuncFormatter  # noqa: E402

from .runner import StudyRow  # noqa: E402
from .scaling import AcceptRow  # noqa: E402

_STYLE = {"rest": ("REST (corpus fraction)", "tab:red", "s", 2.0),
          "merged": ("merged (CREST combined n<={m} + each request's own tokens)", "tab:green", "^", 2.0)}


def _bytes_label(x: float, _pos) -> str:
    for div, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if x >= div:
            return f"{x / div:g} {unit}"
    return f"{x:g} B"


def _finish(fig, ax, path: Path, title: str, legend_size: int) -> Path:
    """Title, grid and the legend outside the axes on the right; save ``fig`` to ``path`` (PNG, folders created)."""
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=legend_size, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_storage(rows: Sequence[StudyRow], path: Path, title: str) -> Path:
    """Accept length (y) against bytes on disk (x, log scale): one line per method.

    REST, CREST combined, merged, and each single-n CREST line (thin, dashed); the
    trie alone (0 bytes) is drawn as a horizontal reference.

    Returns:
        ``path`` (PNG, parent folders created).
    """
    fig, ax = plt.subplots(figsize=(11, 6), dpi=120)
    ms = sorted({r.n for r in rows if r.method == "crest-combined"})
    for method, (label, color, marker, width) in _STYLE.items():
        pts = sorted((r.bytes, r.accept_length) for r in rows if r.method == method)
        if pts:
            ax.plot([b for b, _ in pts], [a for _, a in pts], marker=marker, color=color, lw=width,
                    label=label.format(m=max(ms, default=0)))
    blues = plt.get_cmap("Blues")
    for i, m in enumerate(ms):
        pts = sorted((r.bytes, r.accept_length) for r in rows if r.method == "crest-combined" and r.n == m)
        ax.plot([b for b, _ in pts], [a for _, a in pts], marker="o", color=blues(0.45 + 0.55 * (i + 1) / len(ms)),
                lw=2.0 if m == ms[-1] else 1.4, label=f"CREST combined n<={m}")
    singles = sorted({r.n for r in rows if r.method == "crest-single"})
    cmap = plt.get_cmap("viridis", max(len(singles), 2))
    for i, n in enumerate(singles):
        pts = sorted((r.bytes, r.accept_length) for r in rows if r.method == "crest-single" and r.n == n)
        ax.plot([b for b, _ in pts], [a for _, a in pts], ls="--", lw=1.0, marker=".", color=cmap(i),
                label=f"CREST single n={n}")
    trie = [r.accept_length for r in rows if r.method == "trie"]
    if trie:
        ax.axhline(trie[0], color="gray", ls=":", lw=1.2, label="the N-gram trie alone (0 bytes)")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(_bytes_label))
    ax.set_xlabel("datastore bytes on disk (log scale)")
    ax.set_ylabel("accept length (tokens per verification step)")
    return _finish(fig, ax, path, title, legend_size=8)


def plot_tree_sizes(rows: Sequence[StudyRow], path: Path, title: str) -> Path:
    """Mean stored tree size (nodes) per n against top-t (CREST Table 2 as a figure).

    Returns:
        ``path`` (PNG).
    """
    fig, ax = plt.subplots(figsize=(6.5, 4.5), dpi=120)
    for n in sorted({r.n for r in rows if r.method == "crest-single"}):
        pts = sorted((r.top_t, r.mean_tree_nodes) for r in rows if r.method == "crest-single" and r.n == n)
        ax.plot([t for t, _ in pts], [m for _, m in pts], marker="o", label=f"n={n}")
    ax.set_xscale("log")
    ax.set_xlabel("top-t (n-grams kept per n)")
    ax.set_ylabel("mean nodes per token tree")
    return _finish(fig, ax, path, title, 8)


def plot_corpus_size(rows: Sequence[AcceptRow], path: Path, title: str) -> Path:
    """Accept length (y) against corpus tokens (x, log scale), one line per method and budget (trees solid, chains
    dashed); the fixed top-t lines in full colour, the scaled top-t lines thin and pale.

    Returns:
        ``path`` (PNG, parent folders created).
    """
    fig, ax = plt.subplots(figsize=(11, 6), dpi=120)
    pooled = [r for r in rows if r.category == "all"]
    lines = sorted({(r.method, r.shape, r.budget, rule, r.top_t if rule == "fixed" else 0)
                    for r in pooled for rule in r.top_t_rule.split("+")})
    colours = {"datastore": plt.get_cmap("Blues"), "merged": plt.get_cmap("Greens")}
    budgets = sorted({r.budget for r in pooled})
    for method, shape, budget, rule, top_t in lines:
        pts = sorted((r.tokens, r.accept_length) for r in pooled if (r.method, r.shape, r.budget) ==
                     (method, shape, budget) and rule in r.top_t_rule.split("+") and
                     (rule == "scaled" or r.top_t == top_t))
        shade = 0.45 + 0.5 * (budgets.index(budget) + 1) / len(budgets)
        what = f"top-t {top_t:,}" if rule == "fixed" else "top-t scaled with the corpus"
        ax.plot([t for t, _ in pts], [a for _, a in pts], marker="o" if shape == "tree" else "s",
                ls="-" if shape == "tree" else "--", lw=2.0 if rule == "fixed" else 1.0,
                alpha=1.0 if rule == "fixed" else 0.5, color=colours.get(method, plt.get_cmap("Greys"))(shade),
                label=f"{method}, {shape} budget {budget}, {what}")
    ax.set_xscale("log")
    ax.set_xlabel("corpus tokens (log scale)")
    ax.set_ylabel("accept length (tokens per verification step)")
    return _finish(fig, ax, path, title, legend_size=7)
