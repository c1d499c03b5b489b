"""Any architecture without its weights: ``model: config:PATH`` builds a causal LM from a ``config.json`` with
deterministic random weights, so sweeps run on a real model's shapes where its weights are not on disk.

Speed on random weights is speed on the real shapes (the same matrices, cache and kernels; a decode step's
cost does not depend on the weights' values), but every quality figure is meaningless: the model is marked
(``ModelInfo.random_weights``, the ``random_weights`` row column, ``(random weights)`` in its name) and
quality metrics are switched off by the callers that compute them.

Weights: ``transformers``' own initialisation of the architecture (normal with the config's
``initializer_range``), under ``torch.manual_seed(seed)``: the same config and seed give the same weights on
every machine of one torch version. Tokenizer: the config folder's own when it holds one, else the embedded
default model's (SmolLM2, 49,152 ids), which needs the config's vocabulary to be at least that large.
Shipped configs: ``data/configs/*/config.json`` (:func:`shipped`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from workbench.errors import ParameterError
from workbench.paths import data_dir

PREFIX = "config:"
SEED = 0


def is_config_spec(spec) -> bool:
    """True for a ``config:PATH`` model spec."""
    return isinstance(spec, str) and spec.startswith(PREFIX)


def shipped() -> dict[str, Path]:
    """The configs shipped in ``data/configs``: ``{name: path to config.json}`` (:func:`workbench.paths.data_dir`:
    ``$WORKBENCH_DATA`` or the repository's ``data/``)."""
    data = data_dir()
    return {p.parent.name: p for p in sorted((data / "configs").glob("*/config.json"))}


def config_path(spec: str) -> Path:
    """The ``config.json`` a ``config:PATH`` spec names: a file, a folder holding one, or a shipped name
    (``config:Qwen3-0.6B``).

    Raises:
        ParameterError: nothing there, unreadable JSON, or no ``model_type``.
    """
    raw = spec[len(PREFIX):].strip()
    if not raw:
        raise ParameterError("model: config: needs a path to a config.json (e.g. config:data/configs/Qwen3-0.6B)")
    path = Path(raw).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.exists() and raw in shipped():
        path = shipped()[raw]
    if not path.is_file():
        raise ParameterError(f"model: {spec!r} names no config.json (shipped: {', '.join(shipped()) or 'none'})")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ParameterError(f"model: {spec!r} is not a readable JSON config ({exc})") from None
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise ParameterError(f"model: {spec!r} has no model_type (not a transformers config.json)")
    return path


def read_config(spec: str) -> dict:
    """The config of a ``config:PATH`` spec as a dict (:func:`config_path`)."""
    return json.loads(config_path(spec).read_text())


def _tokenizer(folder: Path, vocab: int, stand_in):
    from transformers import AutoTokenizer

    if any((folder / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        tok = AutoTokenizer.from_pretrained(folder)
    else:
        tok = AutoTokenizer.from_pretrained(stand_in())
        if len(tok) > vocab:
            raise ParameterError(f"model: the config's vocabulary ({vocab}) is smaller than the stand-in tokenizer's "
                                 f"({len(tok)}); put the model's tokenizer files beside its config.json")
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def build(spec: str, device: str, dtype_name: str, attn_implementation: str | None, stand_in, seed: int = SEED):
    """Build the model of a ``config:PATH`` spec with deterministic random weights.

    Args:
        spec: ``config:PATH``.
        device: a resolved device (``cpu``, ``cuda``, ``mps``).
        dtype_name: torch dtype name (``float32``, ``bfloat16``, ``float16``).
        attn_implementation: ``transformers``' attention kernel, or None.
        stand_in: a callable returning the folder of the stand-in tokenizer (the embedded default model's),
            called only when the config's folder has no tokenizer.
        seed: the weights' seed.

    Returns:
        ``(model, tokenizer, config_path, weights_id)``: the model in eval mode on ``device``, its tokenizer
        padding on the left, and ``random-<config hash>-seed<seed>`` standing in for a weights hash.
        :func:`workbench.measure.models.load_model` wraps them in a ``LoadedModel`` marked ``random_weights``.

    Raises:
        ParameterError: a bad spec (:func:`config_path`) or a vocabulary smaller than the stand-in tokenizer.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = config_path(spec)
    config = AutoConfig.from_pretrained(path.parent)
    tok = _tokenizer(path.parent, int(getattr(config, "vocab_size", 0) or 0), stand_in)
    dtype = getattr(torch, dtype_name.replace("torch.", ""))
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, **kwargs)
    model.eval()
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    return model, tok, path, f"random-{digest}-seed{seed}"
