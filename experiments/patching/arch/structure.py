"""A family without an adapter file, described from its module tree and put to the check (check.py).

Goldwaser et al.'s argument needs, of a block, only this: the residual v before the MLP, the MLP's input z,
the matrices that read z, and one parameter after them that can move the branch by any r (Table 1's output
rules). So a `model_type` with no adapter file is read here from the model built on the meta device (no
weight is read or allocated):
- the decoder layers: the ModuleList of `num_hidden_layers` layers;
- the mixer, by its role: the child of the layer that mixes positions, whatever its name (Falcon's
  `self_attention`): its forward is handed the attention mask, the cache or the positions (attention, linear
  attention, a short convolution, a state-space mixer all are), or it is a convolution of width > 1. The
  patch never reads the mixer (only a parallel block's v = x + its output), so any mixer will do; two of
  them in one layer are refused, naming both: which one a parallel block adds is undecided;
- the MLP, by its role: the weighted path that does not mix positions and reads d features; a child holding
  such matrices (named mlp, feed_forward, ffn, ... the names only break a tie with an MoE beside it), or the
  layer's own bare matrices where it has no MLP module (OPT's `fc1`, `fc2`: z is fc1's input). None at all (a
  pure state-space block) is refused: the theorem needs an MLP after the mixer; two candidates are refused,
  naming both; so is an MLP holding a module that mixes positions (a convolution, a state-space layer: Thm 7
  needs the MLP to read the query's z alone);
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
  attention output (Thm 12);
- the attention implementation the float64 check needs: eager where the config soft-caps attention logits
  (Gemma 2: sdpa refuses soft-capping), said in the form's `load_kwargs` so the loader builds it so.
The names suggest the order; they prove nothing. `candidates(config)` lists the forms that fit the tree,
most likely first, and the check against the stock layer in float64 (check.py) chooses: the first form
whose three steps hold is the family's adapter ("structural (TYPE)" in tables); if none does, the first
form's failure is the one line the user reads. An adapter file always wins over the guess.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace

from torch import nn

from experiments.patching.arch.base import CONV1D, EXPERTS, EXPERTS_IN_OUT, LINEAR, BlockAdapter
from experiments.patching.rules import MOE, MOE_BIAS, OUTER_BIAS, OUTER_WEIGHT, SCALE

MLP_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe", "moe", "mlp_block")
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
# what a module's forward is handed when it mixes positions (the mask, the cache, the positions): arguments of
# the forward, not names of modules; attention, linear attention, convolutions and state-space mixers take one
# (or a recurrent `state` carried from position to position: RWKV's time and channel mixing, xLSTM's cells)
MIXING_ARGUMENTS = frozenset({"attention_mask", "position_embeddings", "position_ids", "cache", "past_key_values",
                              "past_key_value", "layer_past", "cache_params", "cache_position", "alibi", "state"})
# config keys under which only eager attention runs the block as configured (soft-capped attention logits)
EAGER_ATTENTION = ("attn_logit_softcapping",)


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
    eager_attention: bool = False  # the config soft-caps attention logits: the check needs eager attention


def candidates(config) -> list[BlockAdapter]:
    """The Table 1 forms that fit `config.model_type`'s module tree, most likely first; NoForm (one line)
    when it has none (no causal-LM class, no decoder layers, no MLP after the mixer)."""
    model = _meta_model(config)
    reading = read_tree(model, config)
    layer = _layers(model, reading)[0]
    return list(_forms(reading, layer, config.model_type))


def _meta_model(config) -> nn.Module:
    from experiments.zoo.loading import meta_model

    try:
        return meta_model(config)  # the one the memory checks count next
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
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    eager = any(getattr(text, k, None) for k in EAGER_ATTENTION)
    return replace(reading, absolute_positions=absolute, branch_scale=scale, eager_attention=eager)


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


def mixes_positions(module: nn.Module) -> bool:
    """Whether `module` mixes positions: its forward is handed the mask, the cache or the positions, or it is a
    convolution wider than one position."""
    if isinstance(module, nn.Conv1d | nn.Conv2d) and max(module.kernel_size) > 1:
        return True
    try:
        arguments = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):  # a forward Python cannot read the signature of: no evidence either way
        return False
    return not MIXING_ARGUMENTS.isdisjoint(arguments)


def _named(children: dict[str, nn.Module], names: list[str]) -> str:
    return ", ".join(f"{n} ({type(children[n]).__name__})" for n in names)


def _bare(module: nn.Module) -> bool:
    """A matrix hung on the layer itself (OPT's fc1, fc2), not a module holding an MLP."""
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


def _read_layer(layer: nn.Module, decoder_path: str, layers_attr: str, d: int) -> Reading:
    children = dict(layer.named_children())
    norms = tuple(n for n, m in children.items() if _is_norm(m))
    weighted = [n for n, m in children.items() if n not in norms and _weighted(m)]
    mixers = [n for n in weighted if mixes_positions(children[n])]
    if len(mixers) > 1:
        raise NoForm(f"its decoder layer has {len(mixers)} candidates for the mixer, modules that mix positions "
                     f"({_named(children, mixers)}): which one a parallel block adds to v, or which the MLP "
                     "follows, is undecided")
    mixer = mixers[0] if mixers else None
    after = [n for n in AFTER_THE_SUM if n in children]
    others = [n for n in weighted if n != mixer and n not in after]
    mlp, extra = _find_mlp(children, others, d)
    if mlp is None:
        what = f"its token mixer ({mixer}) " if mixer else "its decoder layer "
        raise NoForm(f"{what}has no MLP after it: the theorem needs an MLP after the mixer (a pure state-space "
                     "block has none)")
    beside = _moe_beside(children, extra, d)
    if extra and beside is None:
        raise NoForm(f"its decoder layer has {len(extra) + 1} candidates for the MLP, weighted paths that do not "
                     f"mix positions ({_named(children, [mlp, *extra])}): which one reads z, and what the others "
                     "read or add, no form of Table 1 decides")
    if mlp in children:
        inner = [path for path, m in children[mlp].named_modules() if path and mixes_positions(m)]
        if inner:
            kind = type(children[mlp].get_submodule(inner[0])).__name__
            raise NoForm(f"its MLP candidate {mlp} holds a module that mixes positions and is not the layer's mixer "
                         f"({mlp}.{inner[0]}, {kind}): Thm 7 needs an MLP that reads the query's z alone, and no "
                         "form of Table 1 says what it reads")
        inputs, outer, bias, router = _matrices(children[mlp], d)
        if not inputs or outer is None:
            raise NoForm(f"its MLP ({mlp}, {type(children[mlp]).__name__}) has no matrices reading z and writing "
                         "the residual that a Table 1 rule knows")
        inputs = {f"{mlp}.{k}": v for k, v in inputs.items()}
        outer, bias, router = f"{mlp}.{outer}", f"{mlp}.{bias}" if bias else None, f"{mlp}.{router}" if router else None
    else:  # the layer's own matrices: the MLP is no module, z is its first input matrix's input
        inputs, outer, bias = _bare_matrices(children, [n for n in others if _bare(children[n])], d)
        router = None
        mlp = next(iter(inputs)).rsplit(".", 1)[0]
    input_at = {}
    for part in extra:  # the MoE beside the MLP: each matrix reads its own module's input
        for k, layout in _matrices(children[part], d)[0].items():
            inputs[f"{part}.{k}"] = layout
            input_at[f"{part}.{k}"] = f"{part}.{k}".rsplit(".", 1)[0]
    buffers = dict(layer.named_buffers(recurse=False))
    scale = next((n for n in OUTPUT_SCALES if n in buffers and buffers[n].numel() == 1), None)
    norms = tuple(n for n in norms if "per_layer" not in n)  # the per-layer inputs' own norm reads no v
    return Reading(decoder_path, layers_attr, mlp, mixer, norms, inputs, outer, bias, beside or router,
                   False, sum_at=after[0] if after else None, output_scale=scale, input_at=input_at)


_FLAT = "\0flat"  # _find_mlp's answer when the MLP is the layer's own bare matrices


def _find_mlp(children: dict[str, nn.Module], others: list[str], d: int) -> tuple[str | None, list[str]]:
    """(the MLP, the weighted parts beside it) among the layer's weighted children that do not mix positions.
    A child holding matrices that read d is the MLP; where several do, the one an MLP's usual name marks, when
    the rest may be an MoE beside it (Gemma 4's router and experts; `_moe_beside` decides), else all are
    returned as candidates. No such child but bare matrices on the layer: the MLP is those (`_FLAT`)."""
    modules = [n for n in others if not _bare(children[n]) and _matrices(children[n], d)[0]]
    bare = [n for n in others if _bare(children[n])]
    if not modules and bare:
        return (_FLAT, []) if len(bare) == len(others) else (bare[0], [n for n in others if n != bare[0]])
    if not modules:
        return None, []
    named = [n for n in MLP_NAMES if n in modules]
    mlp = (named or modules)[0]
    return mlp, [n for n in others if n != mlp]


def _bare_matrices(children: dict[str, nn.Module], bare: list[str], d: int):
    """(input matrices -> layout, the outer matrix, its bias) of an MLP made of the layer's own matrices: those
    reading d features and writing another width are the input matrices, the one writing d the outer one (in
    registration order where the widths cannot tell: the last)."""
    def width(name: str) -> tuple[int, int]:  # (in, out)
        m = children[name]
        w = m.weight
        return (w.shape[0], w.shape[1]) if type(m).__name__ == "Conv1D" else (w.shape[1], w.shape[0])

    layout = lambda name: CONV1D if type(children[name]).__name__ == "Conv1D" else LINEAR  # noqa: E731
    outer = next((n for n in bare if width(n)[1] == d and width(n)[0] != d), bare[-1])
    inputs = {f"{n}.weight": layout(n) for n in bare if n != outer and width(n)[0] == d}
    if not inputs:
        raise NoForm(f"its decoder layer's own matrices ({', '.join(bare)}) have none reading z beside the outer "
                     f"one ({outer}): no MLP a Table 1 rule knows")
    return inputs, f"{outer}.weight", _bias(children[outer], outer)


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
    for out in map(_attention_kwargs(r), outputs):
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
        out = _attention_kwargs(r)(out)
        for at in (*pre, r.mlp):
            yield BlockAdapter(**common, **out, residual_at=at)


def _attention_kwargs(r: Reading):
    """A form's keywords with the attention implementation the block needs added (eager under soft-capping:
    the loader builds the model so, and the float64 check runs the layer so)."""
    def add(out: dict) -> dict:
        if not r.eager_attention:
            return out
        return dict(out, load_kwargs={**out.get("load_kwargs", {}), "attn_implementation": "eager"})

    return add


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
