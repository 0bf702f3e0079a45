"""A model by name, for every experiment and for patching: what `model=` accepts.

`load_model(name, dtype, device, seed)` takes
- a hub id or a local checkpoint folder (`from_pretrained`): any causal LM transformers can build; a caller
  above the zoo narrows that and checks the loaded model through its `Catalog` (zoo/catalog.py: patching's,
  patching/load.py, accepts what can be patched and checks the adapter against the stock layers);
- `gemma-3-270m`, `qwen2.5-0.5b`, `qwen2.5-1.5b` (TRAINED_OFFLINE_MODELS: trained weights the package
  registry ships, zoo/bundled_gguf.py) or `PATH.gguf`: a GGUF converted once into a cached checkpoint folder
  (zoo/gguf.py);
- an offline random model (`random_offline(catalog)`): the Gemma 3 ones of zoo/gemma.py (tiny-gemma3,
  gemma3-1b-random, tiny-gemma3-vision), llama3.2-1b-random (Llama 3.2 1B's shape) built here, and those the
  catalog adds (patching's: every family's tiny model, tiny-<family>, its config beside its adapter), all with
  the same byte-level tokenizer and chat template (zoo/tokenizer.py).

Before anything is allocated, the model's size is computed on the meta device and compared with the
memory available: a model that cannot fit fails in one line (a registry model, from its table row, before
its chunks are joined or converted). A hub id is tried only when the hub is reachable (probed once, 3 s)
or the checkpoint is in the local cache: offline, it fails in seconds.
"""

from __future__ import annotations

import copy
import functools
import gc
import os
import socket
from pathlib import Path

import torch

from experiments.core.errors import UserError, first_line
from experiments.core.runtime import RUN_GPUS
from experiments.zoo import gemma, kept_checks
from experiments.zoo.bundle import ModelBundle
from experiments.zoo.bundled_gguf import BUNDLED
from experiments.zoo.catalog import PLAIN, Catalog
from experiments.zoo.float64 import exact_float64_
from experiments.zoo.quiet import quiet_transformers
from experiments.zoo.random_weights import randomize_
from experiments.zoo.tokenizer import byte_tokenizer

TRAINED_OFFLINE_MODELS = tuple(BUNDLED)  # trained weights from the package registry (zoo/bundled_gguf.py)
MEMORY_HEADROOM = 1.3  # the weights plus activations, caches and the patched copies of one layer


def random_offline(catalog: Catalog = PLAIN) -> tuple[str, ...]:
    """The offline random models (built here without the hub): the Gemma ones, the catalog's tiny test models,
    one real shape for benchmarks."""
    extra = (n for n in catalog.offline if n not in gemma.RANDOM_GEMMA_MODELS)
    return (*gemma.RANDOM_GEMMA_MODELS, *extra, "llama3.2-1b-random")


RANDOM_OFFLINE_MODELS = random_offline()  # the zoo's own; a catalog adds its own (patching/load.py)


def fix_hint(where: str, offline: tuple[str, ...] = RANDOM_OFFLINE_MODELS) -> str:
    """What to do when a model cannot be had (`offline`: the offline random models to offer). A local folder
    cannot be gated or unreachable: its fix is its content."""
    if where == "local folder":
        return ("fix: the folder needs what `save_pretrained` writes for the model and its tokenizer "
                "(config.json, model.safetensors or pytorch_model.bin, tokenizer files), or use an offline "
                f"model: model={' | '.join(offline)}")
    return ("fixes: for a gated model accept its licence on huggingface.co and log in (`hf auth login` or "
            "HF_TOKEN=...), pass a local checkpoint folder as model=PATH, or use an offline model: "
            f"model={' | '.join(TRAINED_OFFLINE_MODELS + offline)} "
            "(or preset=cpu, which runs one offline)")


# -- offline random models ---------------------------------------------------------------------------
def tiny_config(name: str, vocab_size: int, catalog: Catalog = PLAIN):
    """The transformers config of a tiny random model the catalog names (patching's: 4 layers, d = 64, 4 heads,
    untied output layer, each beside its adapter)."""
    if name not in catalog.offline:
        raise UserError(f"unknown offline model {name!r}; known: {', '.join(random_offline(catalog))}")
    return catalog.offline[name](vocab_size)


def llama32_1b_config(vocab_size: int = 128256):
    """meta-llama/Llama-3.2-1B-Instruct's config.json, typed out (the checkpoint is gated; the shape is public)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                       rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                       rope_scaling={"rope_type": "llama3", "factor": 32.0, "high_freq_factor": 4.0,
                                     "low_freq_factor": 1.0, "original_max_position_embeddings": 8192},
                       bos_token_id=2, eos_token_id=1, pad_token_id=0)


def offline_config(name: str, catalog: Catalog = PLAIN):
    """The config of an offline model (Gemma ones included), without building it."""
    tok_len = len(byte_tokenizer())
    if name == "tiny-gemma3":
        return gemma.tiny_text_config(tok_len)
    if name == "gemma3-1b-random":
        return gemma.gemma3_1b_config()
    if name == "tiny-gemma3-vision":
        return gemma.tiny_vision_config(tok_len)
    if name == "llama3.2-1b-random":
        return llama32_1b_config()
    return tiny_config(name, tok_len, catalog)


def build_offline(name: str, seed: int, catalog: Catalog = PLAIN):
    """(model, tokenizer, processor) of an offline random model, in float32, weights drawn from `seed`."""
    if name in gemma.RANDOM_GEMMA_MODELS:
        return gemma.build_offline(name, seed)
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = offline_config(name, catalog)
    model = AutoModelForCausalLM.from_config(config, **catalog.load_kwargs(config))
    return randomize_(model, seed), byte_tokenizer(), None


# -- memory ------------------------------------------------------------------------------------------
_last_meta: list = []  # [(config, its meta model)]: the last one built, for the same config object only


def meta_model(config):
    """The causal LM `config` describes, on the meta device (shapes only, nothing allocated). The checks before
    a run read one config several times (its structure, its parameters, what a patch writes): the model is
    built once for a config object (about 0.5 s for a 1.5B) and handed out again while it is the last one
    asked for. Callers only read it."""
    if _last_meta and _last_meta[0][0] is config:
        return _last_meta[0][1]
    from transformers import AutoModelForCausalLM

    with torch.device("meta"), quiet_transformers():
        if config.model_type == "gemma3":
            from transformers import Gemma3ForConditionalGeneration

            model = Gemma3ForConditionalGeneration(config)
        else:
            model = AutoModelForCausalLM.from_config(config)
    _last_meta[:] = [(config, model)]
    return model


def parameter_count(config) -> int:
    """Parameters of the causal LM `config` describes, counted on the meta device (nothing allocated)."""
    return sum(p.numel() for p in meta_model(config).parameters())


def available_bytes(device: torch.device | str) -> int:
    """Memory a model about to be loaded on `device` can have. A GPU a run in this process takes
    (runtime.RUN_GPUS: the run's, or a plain run's from the CLI's checks on): its free memory plus what
    PyTorch's caching allocator holds but no tensor uses (a model freed before, as layer_errors frees its
    float32 model before the float64 one, or an earlier job of a parallel launcher's lane), after collecting
    garbage so that a freed model's tensors are back there. Any other GPU (the CLI's checks of a sweep or a
    torchrun rank, whose jobs may run in other processes or on other GPUs): its total memory, since reading
    the free memory would create a CUDA context there (several hundred MiB, kept for the life of the
    process: the whole sweep, and on GPU 0 once per torchrun rank); the job checks its free memory before
    it loads."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in RUN_GPUS:
            return torch.cuda.get_device_properties(index).total_memory  # no context needed
        gc.collect()
        cached = torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
        return torch.cuda.mem_get_info(index)[0] + cached
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 1 << 62  # unknown: do not refuse


def check_fits(name: str, config, dtype: torch.dtype, device: torch.device | str) -> None:
    """One line, before any allocation, when the model cannot fit in the memory available."""
    require_memory(name, parameter_count(config), dtype, device)


def require_memory(name: str, n: int, dtype: torch.dtype, device: torch.device | str, why: str = "") -> None:
    """One line when `n` parameters in `dtype` (and their headroom) exceed the memory available on `device`."""
    need = n * torch.tensor([], dtype=dtype).element_size() * MEMORY_HEADROOM
    have = available_bytes(device)
    if need > have:
        raise UserError(f"model {name!r} ({n / 1e9:.2f}B parameters) needs about {need / 2**30:.1f} GiB in "
                        f"{str(dtype).removeprefix('torch.')} on {torch.device(device).type}{why}, but only "
                        f"{have / 2**30:.1f} GiB is available; use a smaller model or dtype=bfloat16")


def check_bundled_fits(name: str, dtype: torch.dtype, device: torch.device | str) -> None:
    """A registry model's memory need from its table row (zoo/bundled_gguf.py), before its chunks are joined
    or converted: a model that cannot fit is refused with nothing cached. Its first use converts it in
    float32 on the CPU (zoo/gguf.py: 9.0 GB peak for the 1.5B's 7.1 GB of weights), which is checked too."""
    from experiments.zoo import gguf

    n = BUNDLED[name].parameters
    require_memory(name, n, dtype, device)
    if not gguf.is_converted(name):
        require_memory(name, n, torch.float32, "cpu", " to be converted once, on its first use")


# -- loading -----------------------------------------------------------------------------------------
@functools.cache
def hub_reachable(timeout: float = 3.0) -> bool:
    """One TCP connection to the hub (no retries); False when HF_HUB_OFFLINE is set."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def resolve_config(name: str, catalog: Catalog = PLAIN):
    """(config, local_files_only) for a hub id or a folder; one UserError line when it cannot be had. Resolved
    once a process for each name (a folder: each version of its config.json): the command line's check, the
    job's own check and the loader ask for the same one, and a hub id costs a request each time. A copy is
    returned, so that no caller changes another's."""
    path = Path(name).expanduser()
    stamp = (path / "config.json").stat().st_mtime_ns if (path / "config.json").is_file() else None
    config, local_only = _resolve_config(name, stamp, random_offline(catalog))
    return copy.deepcopy(config), local_only


@functools.lru_cache(maxsize=64)
def _resolve_config(name: str, stamp: int | None, offline: tuple[str, ...]):
    from transformers import AutoConfig

    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir() or not (path / "config.json").is_file():
            raise UserError(f"model={name!r} is a local path without config.json; give a Hugging Face checkpoint "
                            f"folder (config.json + weights), a hub id, or an offline model "
                            f"({', '.join(offline)})")
        where, local_only = "local folder", True
    else:
        where, local_only = "hub id", not hub_reachable()
    try:
        with quiet_transformers():
            config = AutoConfig.from_pretrained(name, local_files_only=local_only)
    except Exception as err:  # OSError (no network / gated / not found), ValueError, HTTP errors...
        why = "the hub is unreachable and it is not in the local cache" if local_only and where == "hub id" \
            else first_line(err)
        raise UserError(f"cannot load model {name!r} ({where}): {why}; {fix_hint(where, offline)}") from None
    return config, local_only


def weights_kind(name: str, catalog: Catalog = PLAIN) -> str:
    """Where a model's weights come from, in a word: trained (offline, from the package registry), random (an
    offline test model), local (a folder or GGUF here) or hub. A failed claim reads differently on each."""
    if name in random_offline(catalog):
        return "random"
    if name in TRAINED_OFFLINE_MODELS:
        return "trained"
    return "local" if Path(name).expanduser().exists() else "hub"


def model_label(name: str, catalog: Catalog = PLAIN) -> str:
    """`gemma-3-270m (trained)`: what run.json and the report say a run's claims were measured on."""
    return f"{name} ({weights_kind(name, catalog)})"


def local_checkpoint(name: str, catalog: Catalog = PLAIN) -> str:
    """`name` itself, or for a GGUF (a registry model such as qwen2.5-0.5b, or PATH.gguf) its converted folder in
    the cache (its architecture put to `catalog.require` before any weight is read)."""
    from experiments.zoo import gguf

    return str(gguf.checkpoint_folder(name, catalog=catalog)) if gguf.is_gguf_model(name) else name


def _checked_config(name: str, dtype: torch.dtype, device: torch.device | str, catalog: Catalog):
    name = str(name)
    if not name.strip():  # every experiment's model= comes here first: the one place that says so
        raise UserError("model= is empty: give a hub id, a local folder, or an offline model such as tiny-llama")
    if name in random_offline(catalog):
        config = offline_config(name, catalog)
    else:
        if name in BUNDLED:
            check_bundled_fits(name, dtype, device)
        config, _ = resolve_config(local_checkpoint(name, catalog), catalog)
    catalog.require(config)
    check_fits(name, config, dtype, device)
    return config


def check_model(name: str, dtype: torch.dtype, device: torch.device | str, catalog: Catalog = PLAIN):
    """Everything that can be checked before a run folder exists: the config can be had, the catalog accepts it
    (`catalog.require`: patching's asks whether it can be patched), the model fits in memory. Returns the
    config, kept for the load of the same job (zoo/kept_checks.py)."""
    config = _checked_config(name, dtype, device, catalog)
    kept_checks.keep(_check_key(name, dtype, device, catalog), config)
    return config


def _check_key(name: str, dtype: torch.dtype, device, catalog: Catalog) -> tuple:
    return str(name), dtype, str(torch.device(device)), id(catalog)


def _from_pretrained(name: str, dtype: torch.dtype, local_only: bool, catalog: Catalog):
    from transformers import AutoModelForCausalLM, AutoProcessor, AutoTokenizer

    where = "local folder" if Path(name).expanduser().exists() else "hub id"
    try:
        with quiet_transformers():
            config, _ = resolve_config(name, catalog)
            if config.model_type == "gemma3":
                from transformers import Gemma3ForConditionalGeneration

                model = Gemma3ForConditionalGeneration.from_pretrained(name, dtype=dtype, local_files_only=local_only)
                processor = AutoProcessor.from_pretrained(name, local_files_only=local_only)
                return model, processor.tokenizer, processor
            model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, local_files_only=local_only,
                                                         **catalog.load_kwargs(config))
            return model, AutoTokenizer.from_pretrained(name, local_files_only=local_only), None
    except UserError:
        raise
    except Exception as err:
        hint = fix_hint(where, random_offline(catalog))
        raise UserError(f"cannot load model {name!r} ({where}): {first_line(err)}; {hint}") from None


def load_model(name: str, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
               seed: int = 0, catalog: Catalog = PLAIN) -> ModelBundle:
    """The model `name` (see the module docstring) in `dtype` on `device`, in eval mode, checked by `catalog`
    before and after loading (patching/load.py's `load_checked` passes patching's)."""
    name = str(name)
    config = kept_checks.take(_check_key(name, dtype, device, catalog)) or _checked_config(name, dtype, device, catalog)
    if name in random_offline(catalog):
        model, tok, processor = build_offline(name, seed, catalog)
        model = model.to(dtype)
        is_random = True
    else:
        path = local_checkpoint(name, catalog)
        _, local_only = resolve_config(path, catalog) if not Path(path).expanduser().exists() else (config, True)
        model, tok, processor = _from_pretrained(path, dtype, local_only, catalog)
        is_random = False
    model = exact_float64_(model.to(device).eval())  # float64 models: no float32 step left (zoo/float64.py)
    model.requires_grad_(False)
    catalog.check_loaded(model)  # patching's: the adapter against the stock layers, once per layer structure
    return ModelBundle(name=name, model=model, tokenizer=tok, processor=processor, is_random=is_random)
