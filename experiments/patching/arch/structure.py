"""A family without an adapter file, described from its module tree and put to the check (check.py).

Goldwaser et al.'s argument needs, of a block, only this: the residual v before the MLP, the MLP's input z,
the matrices that read z, and one parameter after them that can move the branch by any r (Table 1's output
rules). So a `model_type` with no adapter file is read here from the model built on the meta device (no
weight is read or allocated):
- the decoder layers: the ModuleList of `num_hidden_layers` layers;
- the MLP: the one child of the layer holding the matrices that read d features (named mlp, feed_forward,
  ffn, ... or any weighted child that has them); none at all (a pure state-space block) is refused: the
  theorem needs an MLP after the mixer;
- the matrices reading z: every matrix of the MLP with d inputs except the outer ones (down_proj, w2,
  c_proj, ...): gate and up, split or fused, an MoE's router and stacked experts, a shared expert and its
  gate (all read the same z, so all get the input update, Thm 7);
- a sparse MoE beside the MLP (Gemma 4's MoE sizes: a router and stacked experts that are children of the
  layer, not of the MLP): each of their matrices reads its own function of v (its module's input), so each
  gets the input update from that input (per-matrix inputs, `BlockAdapter.input_at`); any other weighted
  part beside the MLP is refused;
- the output rule: a post-MLP norm's scale (Thm 10, its offset probed on a copy of the norm), else the
  outer matrix's bias (Thm 8) or the outer matrix itself (Thm 9), or each active expert's outer matrix
  (Thm 11);
- where v is read: each norm of the layer, or the MLP's own input (no pre-MLP norm), or a parallel block's
  attention output (Thm 12).
The names suggest the order; they prove nothing. `candidates(config)` lists the forms that fit the tree,
most likely first, and the check against the stock layer in float64 (check.py) chooses: the first form
whose three steps hold is the family's adapter ("structural (TYPE)" in tables); if none does, the first
form's failure is the one line the user reads. An adapter file always wins over the guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from experiments.patching.arch.base import CONV1D, EXPERTS, EXPERTS_IN_OUT, LINEAR, BlockAdapter
from experiments.patching.rules import MOE, MOE_BIAS, OUTER_BIAS, OUTER_WEIGHT, SCALE

MLP_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe", "moe", "mlp_block")
MIXER_NAMES = ("self_attn", "attention", "attn", "linear_attn", "conv", "mixer", "mamba", "token_mixer")
OUTER_NAMES = ("down_proj", "w2", "c_proj", "fc_out", "dense_4h_to_h", "fc2", "wo", "down", "out_proj", "proj_out")
# a pre-MLP norm's usual names, most likely first; a post-MLP norm's
PRE_MLP_NORM = ("post_attention_layernorm", "pre_feedforward_layernorm", "ffn_norm", "ln_2", "norm2",
                "pre_mlp_layernorm", "post_attention_norm")
POST_MLP_NORM = ("post_feedforward_layernorm", "post_mlp_layernorm", "post_ffw_norm", "post_ffn_norm",
                 "post_feedforward_norm")
POSITION_EMBEDDINGS = ("wpe", "embed_positions", "position_embeddings")
BRANCH_SCALES = ("residual_multiplier",)  # config keys scaling each branch before the residual: T = v + α g
# parts after v + branch that read the token's own data (per-layer inputs: Gemma 4, Gemma 3n), the first of
# them reading u = v + branch; a stored scalar multiplying the layer's output
AFTER_THE_SUM = ("per_layer_input_gate", "per_layer_projection")
OUTPUT_SCALES = ("layer_scalar",)


CANNOT_BUILD = "transformers cannot build it as a causal LM"


class NoForm(Exception):
    """The module tree has no form of Table 1: the message says what is missing (one line)."""


@dataclass(frozen=True)
class Reading:
    """What the module tree says of one decoder layer."""

    decoder_path: str
    layers_attr: str
    mlp: str
    mixer: str | None
    norms: tuple[str, ...]  # weighted or not, in registration order
    inputs: dict[str, str]  # parameter -> layout, relative to the layer
    outer: str  # the outer matrix's weight (relative to the layer), or the experts' stacked outer matrices
    outer_bias: str | None
    router: str | None  # an MoE's router module (its output: logits, gates, indices)
    absolute_positions: bool
    branch_scale: float = 1.0  # the config's multiplier of each branch before the residual (Granite's)
    sum_at: str | None = None  # the first part after v + branch (per-layer inputs)
    output_scale: str | None = None  # a buffer scaling the layer's output
    input_at: dict[str, str] = field(default_factory=dict)  # a matrix beside the MLP -> the module it reads at


def candidates(config) -> list[BlockAdapter]:
    """The Table 1 forms that fit `config.model_type`'s module tree, most likely first; NoForm (one line)
    when it has none (no causal-LM class, no decoder layers, no MLP after the mixer)."""
    model = _meta_model(config)
    reading = read_tree(model, config)
    layer = _layers(model, reading)[0]
    return list(_forms(reading, layer, config.model_type))


def _meta_model(config) -> nn.Module:
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    except Exception as err:
        from experiments.core.errors import first_line

        raise NoForm(f"{CANNOT_BUILD} ({first_line(err)})") from None


def _layers(model: nn.Module, reading: Reading) -> nn.ModuleList:
    return getattr(model.get_submodule(reading.decoder_path), reading.layers_attr)


def read_tree(model: nn.Module, config) -> Reading:
    decoder_path, layers_attr = _find_layers(model, config)
    layers = getattr(model.get_submodule(decoder_path), layers_attr)
    d = _hidden(layers[0], config)
    every = [_read_layer(layer, decoder_path, layers_attr, d) for layer in layers]
    mixers = {r.mixer for r in every}  # a hybrid's mixers differ (attention, convolution): no parallel form
    mixer = mixers.pop() if len(mixers) == 1 else None
    every = [replace(r, mixer=mixer) for r in every]
    distinct = {repr(r): (r, layer) for r, layer in zip(every, layers, strict=True)}
    readings = [r for r, _ in distinct.values()]
    if len(readings) > 1:
        kinds = sorted({f"{type(layer.get_submodule(r.mlp)).__name__} reading z by {', '.join(r.inputs)}"
                        for r, layer in distinct.values()})
        # the theorem is per layer; the engine (patcher, check, variants) holds one adapter per model
        raise NoForm(f"its decoder layers have different MLPs ({'; '.join(kinds)}): the theorem holds layer by "
                     "layer, but the engine patches every layer through one adapter (one set of input matrices, "
                     "one output rule), and a dense layer's rule (its W_down) is not a sparse layer's (each "
                     "active expert's); it has no per-layer adapters")
    reading = readings[0]
    decoder = model.get_submodule(decoder_path)
    absolute = any(isinstance(getattr(decoder, n, None), nn.Embedding) for n in POSITION_EMBEDDINGS)
    scale = next((float(getattr(config, k)) for k in BRANCH_SCALES if isinstance(getattr(config, k, None), float)), 1.0)
    return replace(reading, absolute_positions=absolute, branch_scale=scale)


def _find_layers(model: nn.Module, config) -> tuple[str, str]:
    """(the decoder's path, the attribute holding its layers): the first ModuleList of num_hidden_layers."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config  # a multimodal model's
    n = getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", None)
    for path, module in model.named_modules():
        for attr, child in module.named_children():
            if isinstance(child, nn.ModuleList) and len(child) == n and len(child) and \
                    any(True for _ in child[0].parameters()):
                return path, attr
    raise NoForm("no list of decoder layers found in its module tree")


def _hidden(layer: nn.Module, config) -> int:
    """The residual's width: the config's, else the width most of the layer's norms have."""
    for key in ("hidden_size", "n_embd", "d_model"):
        if isinstance(getattr(config, key, None), int):
            return getattr(config, key)
    sizes = [m.normalized_shape[-1] if isinstance(m, nn.LayerNorm) else m.weight.shape[-1]
             for _, m in layer.named_children() if _is_norm(m) and getattr(m, "weight", None) is not None]
    if not sizes:
        raise NoForm("its decoder layer has no norm to read the hidden size from")
    return max(set(sizes), key=sizes.count)


def _is_norm(m: nn.Module) -> bool:
    return isinstance(m, nn.LayerNorm) or "norm" in type(m).__name__.lower()


def _weighted(m: nn.Module) -> bool:
    return any(True for _ in m.parameters())


def _read_layer(layer: nn.Module, decoder_path: str, layers_attr: str, d: int) -> Reading:
    children = dict(layer.named_children())
    norms = tuple(n for n, m in children.items() if _is_norm(m))
    mixer = next((n for n in MIXER_NAMES if n in children), None)
    named = [n for n in MLP_NAMES if n in children and _weighted(children[n])]
    others = [n for n, m in children.items() if n not in norms and n != mixer and _weighted(m) and n not in named]
    mlp = (named or [n for n in others if _matrices(children[n], d)[0]] or [None])[0]
    if mlp is None:
        what = f"its token mixer ({mixer}) " if mixer else "its decoder layer "
        raise NoForm(f"{what}has no MLP after it: the theorem needs an MLP after the mixer (a pure state-space "
                     "block has none)")
    after = [n for n in AFTER_THE_SUM if n in children]
    extra = [n for n in others if n != mlp and n not in after]
    beside = _moe_beside(children, extra, d)
    if extra and beside is None:
        raise NoForm(f"its decoder layer has weighted parts that are neither its mixer, a norm nor its MLP "
                     f"({', '.join(extra)}): no form of Table 1 here says what they read or add")
    inputs, outer, bias, router = _matrices(children[mlp], d)
    if not inputs or outer is None:
        raise NoForm(f"its MLP ({mlp}, {type(children[mlp]).__name__}) has no matrices reading z and writing "
                     "the residual that a Table 1 rule knows")
    inputs = {f"{mlp}.{k}": v for k, v in inputs.items()}
    input_at = {}
    for part in extra:  # the MoE beside the MLP: each matrix reads its own module's input
        for k, layout in _matrices(children[part], d)[0].items():
            inputs[f"{part}.{k}"] = layout
            input_at[f"{part}.{k}"] = f"{part}.{k}".rsplit(".", 1)[0]
    buffers = dict(layer.named_buffers(recurse=False))
    scale = next((n for n in OUTPUT_SCALES if n in buffers and buffers[n].numel() == 1), None)
    norms = tuple(n for n in norms if "per_layer" not in n)  # the per-layer inputs' own norm reads no v
    return Reading(decoder_path, layers_attr, mlp, mixer, norms, inputs,
                   f"{mlp}.{outer}", f"{mlp}.{bias}" if bias else None,
                   beside or (f"{mlp}.{router}" if router else None),
                   False, sum_at=after[0] if after else None, output_scale=scale, input_at=input_at)


def _moe_beside(children: dict[str, nn.Module], extra: list[str], d: int) -> str | None:
    """The router's name when the weighted parts beside the MLP are exactly a sparse MoE, a router (one matrix
    reading d features, a router by its name or class) and stacked experts, as Gemma 4's MoE sizes have;
    else None (what such parts read or add is then unknown)."""
    kinds: dict[str, str] = {}
    for name in extra:
        inputs = _matrices(children[name], d)[0]
        layouts = set(inputs.values())
        if layouts and layouts <= {EXPERTS, EXPERTS_IN_OUT}:
            kinds.setdefault("experts", name)
        elif layouts == {LINEAR} and len(inputs) == 1 and "router" in (name + type(children[name]).__name__).lower():
            kinds.setdefault("router", name)
    return kinds["router"] if len(extra) == 2 and len(kinds) == 2 else None


def _matrices(mlp: nn.Module, d: int) -> tuple[dict[str, str], str | None, str | None, str | None]:
    """(input matrices -> layout, the outer matrix, its bias, the router) inside `mlp`, hidden size d."""
    inputs: dict[str, str] = {}
    outer = bias = router = stacked = stacked_bias = None
    for path, module in mlp.named_modules():
        leaf = path.rsplit(".", 1)[-1]
        w = module._parameters.get("weight")
        if type(module).__name__ == "Conv1D" and w is not None:  # GPT-2's (in, out)
            if leaf in OUTER_NAMES:
                outer, bias = f"{path}.weight", _bias(module, path)
            elif w.shape[0] == d:
                inputs[f"{path}.weight"] = CONV1D
        elif isinstance(module, nn.Linear):
            if leaf in OUTER_NAMES:
                outer, bias = f"{path}.weight", _bias(module, path)
            elif w.shape[-1] == d:
                inputs[f"{path}.weight"] = LINEAR
        elif w is not None and w.ndim == 2 and w.shape[-1] == d and "router" in type(module).__name__.lower() \
                or w is not None and w.ndim == 2 and w.shape[-1] == d and leaf in ("gate", "router"):
            inputs[f"{path}.weight"] = LINEAR  # an MoE's router: it reads z, its output picks the experts
            router = path
        for pname, p in module._parameters.items():  # stacked experts: (E, out, in), or (E, in, out)
            if p is None:
                continue
            name = f"{path}.{pname}".lstrip(".")
            if p.ndim == 3 and pname in ("gate_up_proj", "w1", "gate_up"):
                if p.shape[-1] == d:
                    inputs[name] = EXPERTS
                elif p.shape[1] == d:
                    inputs[name] = EXPERTS_IN_OUT
            elif p.ndim == 3 and pname in ("down_proj", "w2") and d in (p.shape[1], p.shape[2]):
                stacked = name
            elif p.ndim == 2 and pname in ("down_proj_bias", "w2_bias") and p.shape[-1] == d:
                stacked_bias = name
    if stacked:  # the experts' outer matrices (Thm 11) or biases absorb r; a shared expert's W_down is left
        return inputs, stacked, stacked_bias, router
    return inputs, outer, bias, router


def _bias(module: nn.Module, path: str) -> str | None:
    return f"{path}.bias" if module._parameters.get("bias") is not None else None


def _forms(r: Reading, layer: nn.Module, model_type: str):
    """Every Table 1 form the reading allows, most likely first (check.py picks the first that holds)."""
    experts = any(layout in (EXPERTS, EXPERTS_IN_OUT) for name, layout in r.inputs.items() if name not in r.input_at)
    if experts and r.router is None:
        return
    post = [n for n in POST_MLP_NORM if n in r.norms]
    pre = sorted((n for n in r.norms if n not in post), key=lambda n: PRE_MLP_NORM.index(n)
                 if n in PRE_MLP_NORM else len(PRE_MLP_NORM))
    common = dict(model_types=(model_type,), family=f"structural ({model_type})", branch_scale=r.branch_scale,
                  sum_at=r.sum_at, output_scale=r.output_scale,
                  decoder=_Path(r.decoder_path), layers_attr=r.layers_attr, mlp=r.mlp,
                  input_matrices=dict(r.inputs), absolute_positions=r.absolute_positions,
                  tiny_model=None, tiny_config=None, input_at=dict(r.input_at))
    if r.input_at:
        yield from _moe_beside_forms(r, layer, common, pre, post)
        return
    outputs: list[dict] = []
    down = r.outer
    for norm in post:  # a post-MLP norm's scale (Thm 10)
        if experts:
            continue
        outputs.append(dict(output_rule=SCALE, output_param=f"{norm}.weight",
                            captures={"d": (norm, "input"), "h": (down.rsplit(".", 1)[0], "input")},
                            pre_norm_matrix=down, scale_offset=_scale_offset(layer.get_submodule(norm)),
                            theorem="Thm 7 + Thm 10 (post-norm scale)"))
    eager = {"experts_implementation": "eager"}  # the experts' own loop: the MoE rules follow it
    if experts and r.outer_bias:  # experts with biases: each active one's bias absorbs r / S
        outputs.append(dict(output_rule=MOE_BIAS, output_param=r.outer_bias, captures={"router": (r.router, "output")},
                            theorem="Thm 7 (router too) + Thm 11 with Thm 8 (experts' biases)", load_kwargs=eager))
    if experts and all(layout != EXPERTS_IN_OUT for layout in r.inputs.values()):
        outputs.append(dict(output_rule=MOE, output_param=down, captures={"router": (r.router, "output")},
                            theorem="Thm 7 (router too) + Thm 11 (MoE)",
                            load_kwargs={"experts_implementation": "eager"}))  # the MoE rule's own loop
    elif r.outer_bias:
        outputs.append(dict(output_rule=OUTER_BIAS, output_param=r.outer_bias, theorem="Thm 7 + Thm 8 (outer bias)"))
    else:
        outputs.append(dict(output_rule=OUTER_WEIGHT, output_param=down,
                            captures={"y": (down.rsplit(".", 1)[0], "input")},
                            theorem="Thm 7 + Thm 9 (outer weight)"))
    for out in outputs:
        for at in (*pre, r.mlp):
            yield BlockAdapter(**common, **out, residual_at=at)
        if r.mixer:  # a parallel block: v = x + the mixer's output
            yield BlockAdapter(**common, **dict(out, theorem="Thm 12 (parallel block) + " + out["theorem"]),
                               attention=r.mixer)


def _moe_beside_forms(r: Reading, layer: nn.Module, common: dict, pre: list[str], post: list[str]):
    """An MoE beside the MLP: the branch is a sum of the MLP's and the experts' outputs, each normalized on its
    own (Gemma 4), so only a parameter after the sum moves the branch by any r: a post-MLP norm's scale (Thm
    10). The MLP's and the experts' outer matrices move one summand each, before a norm: no form, and App. B's
    W_down step has no one matrix before the post-MLP norm (`pre_norm_matrix` None)."""
    for norm in post:
        out = dict(output_rule=SCALE, output_param=f"{norm}.weight",
                   captures={"d": (norm, "input"), "router": (r.router, "output")},  # the routing, for its stats
                   scale_offset=_scale_offset(layer.get_submodule(norm)),
                   theorem="Thm 7 (per-matrix inputs: MLP, router, experts) + Thm 10 (post-norm scale)",
                   load_kwargs={"experts_implementation": "eager"})  # the grouped kernel has no float64
        for at in (*pre, r.mlp):
            yield BlockAdapter(**common, **out, residual_at=at)


@dataclass(frozen=True)
class _Path:
    """The model -> its decoder module (a picklable, comparable `decoder` for a structural adapter)."""

    path: str

    def __call__(self, model: nn.Module) -> nn.Module:
        return model.get_submodule(self.path) if self.path else model


def _scale_offset(norm: nn.Module) -> float:
    """1.0 when the norm scales by 1 + weight (Gemma 1-3), 0.0 when by the weight (asked of the norm itself)."""
    from experiments.zoo.float64 import scales_by_one_plus

    return 1.0 if scales_by_one_plus(norm) else 0.0
