"""The S4C draft model: three heads over the target's last hidden state (S4C §3.1.1, He et al., "S4C: Speculative
Sampling with Syntactic and Semantic Coherence for Efficient Inference of Large Language Models").

Each head computes ``h = Linear(concat[e, f])`` from a token embedding ``e`` and a feature ``f`` (eq. 3), then one
decoder layer of the target's own architecture gives the next feature (eq. 4); its token is the argmax of the target's
frozen LM head (eq. 5), embedded by the target's frozen embedding (eq. 6). Head 1 reads the target's feature; head
``k + 1`` reads head ``k``'s feature and token: the heads are autoregressive between each other. Within a head every
position is computed at once under a causal mask (its own keys and values at earlier positions): parallel within each.

Positions. ``F[t]`` is the target's final-normed hidden state at position ``t`` (the LM head's input: its argmax is
the target's choice for ``x[t + 1]``). Head 1's input at ``t`` is ``[E(x[t + 1]), F[t]]`` and its output ``G1[t]``
stands for ``F[t + 1]``; head ``k + 1``'s input at ``t`` is ``[E(argmax LM(Gk[t])), Gk[t]]`` and ``G(k+1)[t]`` stands
for ``F[t + k + 1]``. So after ``x[0..T]`` with features ``F[0..T-1]`` (the last committed token's feature is computed
by the next verification), the heads at position ``T - 1`` predict ``x[T + 1]``, ``x[T + 2]`` and ``x[T + 3]``.

The layer is written here, not taken from transformers, because drafting needs what a causal LM's cache does not
offer: one shared cache of committed positions per head, queried by several branches at the same position without
being extended (:mod:`research.s4c.state`). It is the Llama decoder layer (RMSNorm, grouped-query attention with rotary
position embeddings, SwiGLU MLP) with the target's sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import cast

import torch
from torch import nn
from torch.nn import functional

__all__ = ["DraftLMHead", "HeadsConfig", "S4CHeads"]


@dataclass(frozen=True)
class HeadsConfig:
    """The heads' shapes: the target's decoder-layer sizes and the number of heads.

    Attributes:
        hidden_size: the target's hidden size ``d`` (576 for SmolLM2-135M).
        num_attention_heads / num_key_value_heads / head_dim: the target's attention shape.
        intermediate_size: the target's MLP width. rms_norm_eps / rope_theta: the target's.
        vocab_size: the target's vocabulary (the LM head's rows).
        num_heads: draft heads (3 in the paper).

    Raises:
        ValueError: for a size below 1 or attention heads that do not split into key/value groups.
    """

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    num_heads: int = 3

    def __post_init__(self) -> None:
        sizes = (self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim,
                 self.intermediate_size, self.vocab_size, self.num_heads)
        if min(sizes) < 1:
            raise ValueError(f"heads config {self}: every size must be >= 1")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}")

    @classmethod
    def of_target(cls, config, num_heads: int = 3) -> HeadsConfig:
        """The heads' config for a transformers Llama-family config (the target's ``model.config``)."""
        rope = getattr(config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.hidden_size, config.num_attention_heads, config.num_key_value_heads, head_dim,
                   config.intermediate_size, float(config.rms_norm_eps), float(theta), config.vocab_size, num_heads)

    def to_json(self) -> dict:
        """The fields as a JSON-ready dict (what a checkpoint stores)."""
        return asdict(self)


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (computed in float32), as Llama's."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotary(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin``: ``[..., head_dim]`` float32 rotary tables for integer ``positions`` (Llama's default RoPE)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = positions.to(torch.float32)[..., None] * inv_freq
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + turned * sin


class LayerCache:
    """One head's keys and values at committed positions, ``[kv_heads, length, head_dim]`` views of one buffer that
    grows by doubling (appending a step's positions copies only them)."""

    def __init__(self) -> None:
        self._kv = torch.empty((2, 0, 0, 0))  # [keys/values, kv_heads, capacity, head_dim]
        self.length = 0

    @property
    def keys(self) -> torch.Tensor:
        return self._kv[0, :, : self.length]

    @property
    def values(self) -> torch.Tensor:
        return self._kv[1, :, : self.length]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Append ``[kv_heads, n, head_dim]`` keys and values."""
        n = keys.shape[1]
        if self.length + n > self._kv.shape[2]:
            grown = keys.new_empty((2, keys.shape[0], max(64, 2 * (self.length + n)), keys.shape[2]))
            if self.length:
                grown[:, :, : self.length] = self._kv[:, :, : self.length]
            self._kv = grown
        self._kv[0, :, self.length: self.length + n] = keys
        self._kv[1, :, self.length: self.length + n] = values
        self.length += n


class DecoderLayer(nn.Module):
    """One Llama decoder layer (pre-norm attention and SwiGLU MLP, both residual)."""

    def __init__(self, c: HeadsConfig) -> None:
        super().__init__()
        self.c = c
        d, h, kv, hd = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.input_layernorm = RMSNorm(d, c.rms_norm_eps)
        self.q_proj = nn.Linear(d, h * hd, bias=False)
        self.k_proj = nn.Linear(d, kv * hd, bias=False)
        self.v_proj = nn.Linear(d, kv * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d, c.rms_norm_eps)
        self.gate_proj = nn.Linear(d, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, d, bias=False)

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries ``[B, heads, S, hd]``, keys and values ``[B, kv_heads, S, hd]`` of ``x`` ``[B, S, d]`` at
        ``positions`` ``[B, S]`` (rotated)."""
        c = self.c
        b, s, _ = x.shape
        n = self.input_layernorm(x)
        q = self.q_proj(n).view(b, s, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(n).view(b, s, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(n).view(b, s, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        cos, sin = rotary(positions, c.head_dim, c.rope_theta)
        cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def finish(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
        """The layer's output ``[B, S, d]`` for input ``x`` given its queries and the keys/values it attends to
        (``mask``: ``[B or 1, 1, S, K]`` bool, True where visible; ``None``: causal over ``S == K``)."""
        c = self.c
        groups = c.num_attention_heads // c.num_key_value_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        attn = functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        b, _, s, _ = attn.shape
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, s, -1))
        n = self.post_attention_layernorm(x)
        return x + self.down_proj(functional.silu(self.gate_proj(n)) * self.up_proj(n))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Causal self-attention over ``x`` ``[B, S, d]`` alone (training): ``[B, S, d]``."""
        q, k, v = self.project(x, positions)
        return self.finish(x, q, k, v, None)

    def step(self, x: torch.Tensor, positions: torch.Tensor, past: LayerCache | None, visible: int,
             branches: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One row of queries ``x`` ``[1, S, d]`` at ``positions`` ``[1, S]`` after the first ``visible`` cached
        positions of ``past`` (drafting). The first ``S - branches`` rows are new committed positions, causal among
        themselves; the last ``branches`` rows are other inputs at the last of those positions (the tree's other
        branches): each sees the committed positions before it and itself, and no other branch.

        Returns:
            The output ``[1, S, d]`` and the queries' keys and values ``[1, kv_heads, S, hd]`` (only the committed
            rows' belong in the cache).
        """
        q, k, v = self.project(x, positions)
        s = x.shape[1]
        n = s - branches
        keys, values = k, v
        seen = min(visible, past.length) if past is not None else 0
        if past is not None and seen > 0:
            keys = torch.cat([past.keys[None, :, :seen], k], dim=2)
            values = torch.cat([past.values[None, :, :seen], v], dim=2)
        mask = torch.zeros((1, 1, s, seen + s), dtype=torch.bool, device=x.device)
        mask[..., :seen] = True
        new = mask[0, 0, :, seen:]
        new[:n, :n] = torch.ones((n, n), dtype=torch.bool, device=x.device).tril()
        new[n:, : n - 1] = True
        new[n:, n:] = torch.eye(branches, dtype=torch.bool, device=x.device)
        return self.finish(x, q, keys, values, mask), k, v


class DraftLMHead:
    """The target's LM head as drafting computes it: only the rows of a draft vocabulary (the most frequent tokens of
    the heads' training text, as FR-Spec restricts a drafter's LM head: Zhao et al. 2025,
    https://arxiv.org/abs/2502.14856, §3), in ``dtype``.

    On this CPU a drafting step's cost is the LM head's (49,152 x 576 weights read per product, a fifth of the
    target's weights); a draft vocabulary of the 16,384 most frequent tokens reads a third of them (0.7 ms for up to 3
    rows here, against 2.5 ms), and a token outside it is never drafted (verification decides what is accepted, so
    output never changes).

    Args:
        weight: ``[V, d]`` the target's LM head. ids: ``[V']`` int64 token ids of the draft vocabulary (``None``: all).
        dtype: the product's dtype (``torch.float32``, or ``torch.bfloat16`` on CPUs with fast bfloat16 units).
    """

    def __init__(self, weight: torch.Tensor, ids: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        self.ids = ids
        rows = weight if ids is None else weight[ids]
        self.weight = rows.detach().to(dtype).contiguous()

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """``[n, V']`` float32 logits over the draft vocabulary for features ``g`` ``[n, d]``."""
        return functional.linear(g.to(self.weight.dtype), self.weight).float()

    def tokens(self, index: torch.Tensor) -> torch.Tensor:
        """Token ids of positions ``index`` (any shape, int64) in the draft vocabulary."""
        return index if self.ids is None else self.ids[index]


class Head(nn.Module):
    """One draft head: ``Linear(concat[e, f])`` then a decoder layer (S4C eqs. 3-4)."""

    def __init__(self, c: HeadsConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(2 * c.hidden_size, c.hidden_size)
        self.layer = DecoderLayer(c)

    def inputs(self, embeddings: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """``h = Linear(concat[e, f])``: ``[B, S, d]`` from two ``[B, S, d]``."""
        return self.fc(torch.cat([embeddings, features], dim=-1))


class S4CHeads(nn.Module):
    """The draft heads, over a target's frozen embedding and LM head (which are not parameters of this module).

    Args:
        config: the shapes (:meth:`HeadsConfig.of_target`).
        embedding: ``[vocab_size, d]`` the target's token embedding (frozen; shared, not copied).
        lm_head: ``[vocab_size, d]`` the target's LM head weight (frozen; tied to the embedding for SmolLM2).

    Initialisation (seed with ``torch.manual_seed``): each head's ``Linear`` starts as the identity on the feature and
    small on the embedding, and each layer's output projections start small, so every head starts near "repeat the
    feature" and training moves it from there.

    Raises:
        ValueError: when the embedding or LM head is not ``[config.vocab_size, config.hidden_size]``.
    """

    def __init__(self, config: HeadsConfig, embedding: torch.Tensor, lm_head: torch.Tensor) -> None:
        super().__init__()
        shape = (config.vocab_size, config.hidden_size)
        for name, w in (("embedding", embedding), ("lm_head", lm_head)):
            if tuple(w.shape) != shape:
                raise ValueError(f"{name} is {tuple(w.shape)}; the heads config needs {shape}")
        self.config = config
        self.heads = nn.ModuleList(Head(config) for _ in range(config.num_heads))
        self.blocks: list[Head] = [cast(Head, h) for h in self.heads]  # typed access to the same modules
        self._embedding = embedding.detach()
        self._lm_head = lm_head.detach()
        self.draft_head = DraftLMHead(self._lm_head)
        self._init_weights()

    def _init_weights(self) -> None:
        d = self.config.hidden_size
        for head in self.blocks:
            nn.init.normal_(head.fc.weight, std=0.02)
            with torch.no_grad():
                head.fc.weight[:, d:] += torch.eye(d)
            nn.init.zeros_(head.fc.bias)
            layer = head.layer
            for lin in (layer.q_proj, layer.k_proj, layer.v_proj, layer.gate_proj, layer.up_proj):
                nn.init.normal_(lin.weight, std=0.02)
            for lin in (layer.o_proj, layer.down_proj):
                nn.init.normal_(lin.weight, std=0.002)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The target's embedding of ``tokens`` (int64, any shape): ``[..., d]``."""
        return functional.embedding(tokens, self._embedding)

    @property
    def lm_head(self) -> torch.Tensor:
        """``[vocab_size, d]`` the target's LM head weight (frozen)."""
        return self._lm_head

    def forward(self, tokens: torch.Tensor, features: torch.Tensor,
                read: Callable[[int, torch.Tensor], torch.Tensor]) -> None:
        """Every head at every position at once (training and the held-out accuracy).

        Args:
            tokens: ``[B, L]`` int64, the sequence.
            features: ``[B, L, d]`` the target's features ``F`` of the same positions.
            read: called as ``read(k, g)`` with head ``k``'s features ``g`` ``[B, L - 1, d]`` (``k`` from 1; at ``t``
                it stands for ``F[t + k]``); returns the head's tokens ``[B, L - 1]`` int64 (the argmax of the LM
                head, eq. 5), which head ``k + 1`` reads. What the caller does with ``g`` (a loss, an accuracy) is
                its own.
        """
        b, length = tokens.shape
        positions = torch.arange(length - 1, device=tokens.device).expand(b, -1)
        inputs_e, inputs_f = self.embed(tokens[:, 1:]), features[:, :-1]
        for k, head in enumerate(self.blocks, start=1):
            g = head.layer(head.inputs(inputs_e, inputs_f), positions)
            inputs_e, inputs_f = self.embed(read(k, g)), g
