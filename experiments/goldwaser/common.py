"""What the Goldwaser experiments share, so that none imports another: the prompts of a config, the checks
of a model before any run folder exists, the context-length check, and how a token, a model and its weights
are named on the console and in the notes. (The logit metrics live in patching/compare.py, the generation
loop in patching/generate.py.)"""

from __future__ import annotations

from pathlib import Path

from experiments.core.errors import UserError
from experiments.core.results import RunContext


def text_list(value, key: str, item: str):
    """A list key's value, or for a string the lines of that text file (blank lines skipped): `prompts=`,
    `queries=` take either. The list itself is returned as given (a ListConfig stays one)."""
    if not isinstance(value, str):
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise UserError(f"{key}={value!r}: no such file (give a list like [a,b] or a file, one {item} a line)")
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def prompt_list(cfg) -> list[str]:
    """The Fig. 3 prompt first, then `prompts` (a list, or a text file with one prompt per line)."""
    extra = text_list(cfg.prompts or [], "prompts", "prompt")
    return [cfg.prompt, *[str(p) for p in extra]]  # a list given on the command line may hold numbers


def validate_model(cfg, prompts: list[str], max_new_tokens: int) -> None:
    """The model, before any run folder (patch_match's, patch_export's typed config): its config can be had,
    its architecture has an adapter, the variant applies, it fits in memory beside the witness's reference
    forward of `prompts` and `max_new_tokens` more (`check_witness_fits`), an image comes with a vision
    model. The variant's name the schema's Enum has checked."""
    from experiments.core.runtime import resolve_device
    from experiments.patching.arch import adapter_for
    from experiments.patching.load import check_patchable
    from experiments.patching.variants import check_apply, check_variant

    dtype, device = cfg.dtype.torch, resolve_device(cfg.device)  # the typed config's Dtype
    config = check_patchable(cfg.model, dtype, device)
    if cfg.variant is not None:  # None: the experiment picks one for the family (patch_export)
        variant = check_variant(adapter_for(config.model_type), cfg.variant)
        if hasattr(cfg, "apply"):  # patch_export has no apply=: it exports materialized weights
            check_apply(adapter_for(config.model_type), variant, cfg.apply)
    if getattr(cfg, "image", None) and not multimodal(config):  # only patch_match takes an image
        raise UserError(f"image=... needs a multimodal Gemma 3 (e.g. model=google/gemma-3-4b-it or "
                        f"model=tiny-gemma3-vision); {cfg.model} is text-only")
    from experiments.patching.kinds import MATERIALIZED

    check_witness_fits(cfg, config, dtype, device, prompts, max_new_tokens, image=bool(getattr(cfg, "image", None)),
                       copies=getattr(cfg, "apply", MATERIALIZED) == MATERIALIZED)  # an export materializes


TEMPLATE_TOKENS = 64  # more than any chat template adds around one user turn (Gemma's, Qwen's: under 30)


def check_witness_fits(cfg, config, dtype, device, prompts: list[str], max_new_tokens: int,
                       image: bool = False, copies: bool = True) -> None:
    """Before any run folder: the model, with `copies` every layer's MLP patched at once (a materialized
    update holds a copy of each patched matrix: 9 GB beside the 12 GB of Qwen 1.5B in float64, which was killed
    for memory before this counted it), and the witness's reference forward of the longest prompt and its
    reply (patching/witness.py) fit in the memory available, or one line naming the memory needed. First
    from the prompts' bytes (a byte-level tokenizer makes at most one token of a byte, plus the template and
    an image's tokens): an upper bound, so what fits there fits. Only when it does not, the model is loaded
    and the prompts encoded as the run will, so no run is refused for a bound."""
    import torch

    from experiments.patching.load import patched_parameter_count
    from experiments.patching.witness import reference_bytes, too_large
    from experiments.zoo.loading import MEMORY_HEADROOM, available_bytes, parameter_count

    width = torch.tensor([], dtype=dtype).element_size()
    weights = int(parameter_count(config) * width * MEMORY_HEADROOM)
    patched = patched_parameter_count(config) * width if copies else 0
    free = available_bytes(device)
    if weights + patched > free:
        raise UserError(f"model {cfg.model!r} needs about {(weights + patched) / 2**30:.1f} GiB in "
                        f"{str(dtype).removeprefix('torch.')} with every layer's MLP patched at once "
                        f"({patched / 2**30:.1f} GiB of it), but only {free / 2**30:.1f} GiB is available: use a "
                        f"smaller model or dtype, or apply=action")
    weights += patched
    extra = TEMPLATE_TOKENS + (getattr(config, "mm_tokens_per_image", 0) if image else 0)
    bound = max(len(p.encode("utf-8")) for p in prompts) + extra + max_new_tokens
    if weights + reference_bytes(config, bound, max_new_tokens, width) <= free:
        return
    from experiments.patching.load import load_checked
    from experiments.zoo.prompts import encode_prompt
    from experiments.zoo.vision import load_image

    bundle = load_checked(cfg.model, dtype, device, seed=cfg.seed)
    picture = load_image(cfg.image, cfg.seed) if image else None
    length = max(encode_prompt(bundle, p, picture, cfg.chat_template, device)["input_ids"].shape[1]
                 for p in prompts) + max_new_tokens
    need = reference_bytes(config, length, max_new_tokens, width)
    if weights + need > free:
        raise UserError(too_large(length, need, max(free - weights, 0), device))


def multimodal(config) -> bool:
    """The model reads images: its config carries a vision tower's (Gemma 3's 4B and up, tiny-gemma3-vision).
    Asked of the config, not of its `model_type`'s name."""
    return getattr(config, "vision_config", None) is not None


def text_only(cfg, config) -> None:
    """One line when the model is multimodal (`multimodal`): a compiled checkpoint is text-only."""
    if multimodal(config):
        raise UserError(f"the compiled checkpoint is text-only (e.g. Gemma3ForCausalLM); {cfg.model} is multimodal")


def check_context_length(config, prompt_lengths: list[int], max_new_tokens: int) -> None:
    """One line, before any generation, when a prompt plus its reply would run past the model's
    positions (a learned position table, as GPT-2's, has no row for them)."""
    text = config.get_text_config()
    limit = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    if not limit:
        return
    for p, n in enumerate(prompt_lengths):
        if n + max_new_tokens > limit:
            raise UserError(f"prompt {p} is {n} tokens and max_new_tokens={max_new_tokens}: {n + max_new_tokens} "
                            f"positions, the model has {limit}; use a shorter prompt or fewer new tokens")


# stop_at_eos= is a string key, not an Enum: the command line's `true` and `false` compose as booleans, which
# an Enum node refuses, and a string node keeps as "True" and "False"
def check_stop_at_eos(cfg) -> None:
    """stop_at_eos= is auto, true or false, in any case (`auto` is neither boolean)."""
    if cfg.stop_at_eos.lower() not in ("auto", "true", "false"):
        raise UserError(f"stop_at_eos={cfg.stop_at_eos} must be auto, true or false")


def stop_ids(cfg, bundle) -> set[int]:
    """End of reply tokens; stop_at_eos=auto: only for trained models (a random one has no notion of a reply's end)."""
    from experiments.zoo.prompts import stop_token_ids

    value = cfg.stop_at_eos.lower()
    stop = (not bundle.is_random) if value == "auto" else value == "true"
    return stop_token_ids(bundle) if stop else set()


def token_text(tokenizer, token_id: int) -> str:
    """The token as text; its raw vocabulary entry when it is a fragment of a multi-byte character."""
    text = tokenizer.decode([token_id])
    return str(tokenizer.convert_ids_to_tokens(token_id)) if "\ufffd" in text else text


def weights_origin(model: str) -> str:
    """Where the weights come from, for the console: a failed claim reads differently on random weights."""
    from experiments.patching.load import weights_kind

    return {"random": "random weights (offline)", "trained": "trained weights (offline, from the package registry)",
            "local": "weights from a local folder", "hub": "weights from the hub"}[weights_kind(model)]


def describe_model(patcher) -> str:
    """`Gemma 3, 4 layers, d=64`: the family and the size of what ran."""
    config = patcher.text_config
    return f"{patcher.adapter.family}, {config.num_hidden_layers} layers, d={config.hidden_size}"


def flag_random_weights(ctx: RunContext, model: str) -> None:
    """The goldwaser claims state what the paper measured on a trained Gemma 3: on an offline model with
    random weights a failure describes those weights (e.g. the open loop's amplification), not the paper.
    Said after the claims, with the way to trained weights."""
    from experiments.patching.load import RANDOM_OFFLINE_MODELS

    claims = ctx.claims()
    failed = claims.loc[~claims["passed"].astype(bool), "id"].tolist() if len(claims) else []
    if model in RANDOM_OFFLINE_MODELS and failed:
        ctx.notes.append(f"model={model} has random weights: the claims state what the paper measured on a trained "
                         f"Gemma 3, so {', '.join(failed)} failing here describes these random weights, as it may by "
                         "design; model=gemma-3-270m runs a trained Gemma 3 offline")
