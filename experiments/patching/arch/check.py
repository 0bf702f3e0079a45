"""An adapter checked against the stock decoder layer it describes, before it patches anything.

An adapter is data (where v and z are, which matrices read z, which parameter absorbs r); the engine
trusts it. So when a model is loaded, each distinct decoder layer (one per module structure: most models
have one) is copied to float64 and run by its own forward on a random input, twice (a "with-context"
input H_C and another input H; only the query, the last position, is compared), and the adapter's reading
of the block is tested where Algorithm 1 relies on it:
1. decomposition: the layer's output is T = v + (the output of the module whose parameter the rule
   changes, or of the MLP when that module is inside it: a shared expert may run beside the experts): the
   residual is where the adapter reads it, and nothing scales or normalizes the branch after;
2. input update (Thms 6–7): with the adapter's input matrices updated from z to z_C, the MLP's output on H
   is its output on H_C: every matrix that reads z is named, and z is what the MLP reads; so is the output
   of each module beside the MLP holding a matrix that reads its own input (per-matrix inputs: Gemma 4's
   router, experts): that input is where the adapter reads it;
3. output rule (Thms 8–12): with the rule's update for r = v_C − v added, the layer's output on H is its
   output on H_C;
4. the alone pass's stand-ins (`capture.StandIns`): with the MLP and the modules beside it answering by their
   outputs kept from H_C, the pass on H reads the same v and inputs, bit for bit: none of them is made from
   what the MLP returns, which is what lets the open loop skip running it. (Step 2 refuses most blocks that
   fail it first, since its patched MLP moves such an input; step 4 holds the stand-ins themselves: a module
   called twice, an output read stale.)
The first step that fails is the one line the user reads (what differed, by how much). In float64 a right
adapter agrees to ~1e-15; a wrong one is off by O(1) (tolerance 1e-9). Each (layer class, structure,
adapter) is checked once a process.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.func import functional_call

from experiments.core.errors import UserError, first_line
from experiments.patching.arch.base import BlockAdapter
from experiments.patching.capture import first_output, last_position, register_captures, residual
from experiments.patching.rounded import input_update_rounded
from experiments.patching.rules import LayerPatchStats

TOLERANCE = 1e-9  # relative, float64: a right adapter is at ~1e-15, a wrong one at O(1)
TOKENS = 5  # the random input's length: a context of 4 and the query
_checked: set = set()


class _Stop(Exception):
    """Raised once the layers to check have been called: the rest of the forward is not needed."""


def check_adapter(model: nn.Module, adapter: BlockAdapter) -> None:
    """One line (UserError) when `adapter` misdescribes a decoder layer of `model`; silent when it fits."""
    layers = adapter.layers(model)
    groups = _structures(layers)
    todo = {key: index for key, index in groups.items() if (type(layers[index]), key, id(adapter)) not in _checked}
    if not todo:
        return
    calls = _layer_calls(model, layers, sorted(todo.values()))
    for key, index in todo.items():
        why = _check_layer(layers[index], adapter, *calls[index])
        if why:
            raise UserError(f"model_type {model.config.model_type!r}: the {adapter.family} adapter does not describe "
                            f"its decoder layer {index} ({type(layers[index]).__name__}): {why}; refused")
        _checked.add((type(layers[index]), key, id(adapter)))


def choose_adapter(model: nn.Module, forms: list[BlockAdapter]) -> BlockAdapter:
    """The first of `forms` (a structural guess's candidates, most likely first) that the check accepts on
    `model`; when none does, the first form's failure in one line, naming the form tried."""
    first: UserError | None = None
    for form in forms:
        try:
            check_adapter(model, form)
            return form
        except UserError as err:
            first = first or UserError(f"{str(err).removesuffix('; refused')} (form tried: {describe(form)}); "
                                       "no form of Table 1 fits it; refused")
    raise first if first else UserError(f"model_type {model.config.model_type!r}: no form of Table 1 to try")


def describe(adapter: BlockAdapter) -> str:
    """A form in words: its theorems, where v is read, which matrices read z, what absorbs r."""
    at = f"v read at the input of {adapter.residual_at}" if adapter.residual_at else \
        f"parallel block, v = x + {adapter.attention}"
    scaled = "" if adapter.branch_scale == 1.0 else f" (the branch scaled by {adapter.branch_scale:g}: r / it)"
    after = ", ".join(x for x in (adapter.sum_at, adapter.output_scale) if x)
    scaled += f"; after v + branch, token data only ({after})" if after else ""
    if adapter.absolute_positions:  # Table 1's forms hold; the open loop's premise does not (docs: GPT-2)
        scaled += ("; learned absolute positions: the query alone sits at another position than after its "
                   "context, so no open loop is exact and the export takes the closed loop (a construction)")
    own = ", ".join(f"{name} its input at {path}" for name, path in adapter.input_at.items())
    reads = [name for name in adapter.input_matrices if name not in adapter.input_at]
    return (f"{adapter.theorem}; {at}; z read by {', '.join(reads)}{'; ' + own if own else ''}; "
            f"r absorbed by {adapter.output_param}{scaled}")


def _structures(layers: nn.ModuleList) -> dict[tuple, int]:
    """One layer index per distinct structure (submodule names and classes, parameter names and shapes)."""
    groups: dict[tuple, int] = {}
    for index, layer in enumerate(layers):
        key = (tuple((n, type(m).__name__) for n, m in layer.named_modules()),
               tuple((n, tuple(p.shape)) for n, p in layer.named_parameters()))
        groups.setdefault(key, index)
    return groups


def _layer_calls(model: nn.Module, layers: nn.ModuleList, indices: list[int]) -> dict[int, tuple]:
    """The arguments the model's own forward passes to each layer in `indices` (positions, masks, rotary
    tables), from one forward of TOKENS random tokens, stopped after the last of them."""
    calls: dict[int, tuple] = {}

    def keep(index: int) -> Callable:
        def hook(_module, args, kwargs):
            calls[index] = (args, kwargs)
            if len(calls) == len(indices):
                raise _Stop

        return hook

    handles = [layers[i].register_forward_pre_hook(keep(i), with_kwargs=True) for i in indices]
    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.randint(0, min(vocab, 1000), (1, TOKENS), generator=torch.Generator().manual_seed(0))
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            model(input_ids=ids.to(device), use_cache=False)
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    return calls


def _float64(value):
    """A layer call's arguments in float64 (floating tensors only; integer positions and bool masks kept)."""
    if isinstance(value, Tensor):
        return value.double() if value.is_floating_point() else value
    if isinstance(value, tuple | list):
        return type(value)(_float64(v) for v in value)
    if isinstance(value, dict):
        return {k: _float64(v) for k, v in value.items()}
    return value


def _layer64(layer: nn.Module) -> nn.Module:
    from experiments.zoo.float64 import exact_float64_

    copy64 = copy.deepcopy(layer).to(torch.float64).requires_grad_(False)
    return exact_float64_(copy64) if any(True for _ in copy64.parameters()) else copy64


def _run(adapter: BlockAdapter, layer: nn.Module, args: tuple, kwargs: dict, hidden: Tensor,
         params: dict) -> dict:
    """The layer's own forward on `hidden` with `params` substituted: the adapter's values at the query,
    the MLP's output and the output rule's module output ("branch") included."""
    values: dict = {"x_in": last_position(hidden)}
    handles = register_captures(adapter, layer, values)
    keep_out = lambda name: lambda _m, _a, out: values.__setitem__(name, last_position(first_output(out)))  # noqa: E731
    handles.append(layer.get_submodule(adapter.mlp).register_forward_hook(keep_out("mlp_out")))
    handles.append(adapter.owner(layer).register_forward_hook(keep_out("branch")))
    for path in adapter.input_owners:  # what a module beside the MLP makes of its own input (step 2)
        handles.append(layer.get_submodule(path).register_forward_hook(keep_out(f"out@{path}")))
    if adapter.sum_at:  # u = v + branch, read where the layer goes on with the token's own data
        keep_in = lambda _m, args: values.__setitem__("sum", last_position(args[0]))  # noqa: E731
        handles.append(layer.get_submodule(adapter.sum_at).register_forward_pre_hook(keep_in))
    call_args, call_kwargs = ((hidden, *args[1:]), kwargs) if args else (args, dict(kwargs, hidden_states=hidden))
    try:
        with torch.no_grad():
            values["out"] = last_position(first_output(functional_call(layer, params, call_args, call_kwargs)))
    finally:
        for h in handles:
            h.remove()
    return values


def _rel(a: Tensor, b: Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _check_layer(layer: nn.Module, adapter: BlockAdapter, args: tuple, kwargs: dict) -> str | None:
    """What differs between the adapter's reading of `layer` and the layer itself (None: nothing)."""
    missing = _missing(layer, adapter)
    if missing:
        return missing
    layer = _layer64(layer)
    args, kwargs = _float64(args), _float64(kwargs)
    hidden = args[0] if args else kwargs["hidden_states"]
    gen = torch.Generator().manual_seed(1)  # on the CPU, the same draws on any device; then where the layer is
    h_c, h = (torch.randn(hidden.shape, generator=gen, dtype=torch.float64).to(hidden.device) for _ in range(2))
    try:
        with_c, alone = _run(adapter, layer, args, kwargs, h_c, {}), _run(adapter, layer, args, kwargs, h, {})
    except Exception as err:
        return f"its forward failed in float64 ({first_line(err)})"
    never = [name for name in (*_expected(adapter), "mlp_out", "branch", *(["sum"] if adapter.sum_at else []))
             if name not in with_c]
    if never:
        return f"its forward never reached what the adapter reads there ({', '.join(never)})"
    try:
        return (_compare(layer, adapter, args, kwargs, h, with_c, alone)
                or _stand_ins_change(adapter, layer, args, kwargs, h_c, h, alone))
    except Exception as err:  # shapes that do not fit the rule's algebra, a division by zero, ...
        return f"the adapter's algebra does not fit it ({first_line(err)})"


def _compare(layer: nn.Module, adapter: BlockAdapter, args: tuple, kwargs: dict, h: Tensor, with_c: dict,
             alone: dict) -> str | None:
    """Steps 1–3 of the module doc on the float64 layer: the first that differs, in words."""
    owner = adapter.output_param.rsplit(".", 1)[0]
    v, branch = residual(with_c), with_c["branch"]
    if branch.shape != v.shape:
        return f"the output of {owner} has {branch.shape[-1]} features, the residual {v.shape[-1]}: not the branch"
    if owner.startswith(adapter.mlp + "."):  # the owner inside the MLP: beside it may run a shared expert
        owner, branch = adapter.mlp, with_c["mlp_out"]
    scale = "" if adapter.branch_scale == 1.0 else f"{adapter.branch_scale:g} · "
    err = _rel(v + adapter.branch_scale * branch, _sum(layer, adapter, with_c))
    if err > TOLERANCE:
        return (f"its output is not v + {scale}the output of {owner} (relative difference "
                f"{err:.1e}): the residual is elsewhere, or the branch is scaled or normalized after it")
    params: dict[str, Tensor] = {}
    for name, layout in adapter.input_matrices.items():
        W, key = layer.get_parameter(name), adapter.input_key(name)
        params[name] = torch.empty_like(W)
        input_update_rounded(W, layout, with_c[key], alone[key], params[name], torch.float64)
    patched = _run(adapter, layer, args, kwargs, h, params)
    err = _rel(patched["mlp_out"], with_c["mlp_out"])
    if err > TOLERANCE:
        return (f"with {', '.join(adapter.input_matrices)} updated to read z_C (Thm 7), the MLP's output still "
                f"differs by {err:.1e} (relative): another matrix reads z, or the MLP reads something else")
    for path in adapter.input_owners:
        err = _rel(patched[f"out@{path}"], with_c[f"out@{path}"])
        if err > TOLERANCE:
            return (f"with {', '.join(adapter.input_matrices)} updated to read their inputs' with-context values "
                    f"(Thm 7), the output of {path} still differs by {err:.1e} (relative): another matrix reads "
                    f"its input, or its input is read elsewhere")
    P = layer.get_parameter(adapter.output_param)
    params[adapter.output_param] = torch.empty_like(P)
    r = residual(with_c) - residual(alone)
    adapter.rule.open_loop(adapter, layer, r, with_c, P, params[adapter.output_param], torch.float64,
                           LayerPatchStats())
    err = _rel(_run(adapter, layer, args, kwargs, h, params)["out"], with_c["out"])
    if err > TOLERANCE:
        return (f"with the output rule's update of {adapter.output_param} ({adapter.rule.theorem}) the layer's "
                f"output differs from the with-context one by {err:.1e} (relative)")
    return None


def _stand_ins_change(adapter: BlockAdapter, layer: nn.Module, args: tuple, kwargs: dict, h_c: Tensor, h: Tensor,
                      alone: dict) -> str | None:
    """Step 4: the alone pass on H with the MLP's (and beside it) outputs kept from H_C reads what the full pass
    on H read."""
    from experiments.patching.capture import StandIns
    from experiments.patching.open_loop import run_layer

    stand_ins = StandIns()
    with torch.no_grad():
        run_layer(adapter, layer, args, kwargs, h_c, {}, stand_ins)  # keeps H_C's outputs: stale for H
        stood, _ = run_layer(adapter, layer, args, kwargs, h, {}, stand_ins)
    for key in ("v" if adapter.residual_at else "attn", "z", *(f"z@{path}" for path in adapter.input_modules)):
        if key == "attn":  # a parallel block's v = x + A: A as read
            same = torch.equal(residual(stood), residual(alone))
        else:
            same = torch.equal(stood[key], alone[key])
        if not same:
            return (f"with the MLP and the modules beside it answering by kept outputs, {key} differs from "
                    "the full forward's: it is made from what they return, and the open loop's alone pass "
                    "cannot skip them")
    return None


def _sum(layer: nn.Module, adapter: BlockAdapter, values: dict) -> Tensor:
    """u = v + branch as the layer computes it: the input of `sum_at` (the scalar comes after it), or the
    layer's output over `output_scale`."""
    if adapter.sum_at:
        return values["sum"]
    u = values["out"]
    return u / layer.get_buffer(adapter.output_scale).reshape(()) if adapter.output_scale else u


def _expected(adapter: BlockAdapter) -> tuple[str, ...]:
    return ("z", "v" if adapter.residual_at else "attn", *adapter.captures,
            *(f"z@{path}" for path in adapter.input_modules), *(f"out@{path}" for path in adapter.input_owners))


def _missing(layer: nn.Module, adapter: BlockAdapter) -> str | None:
    """The first module or parameter the adapter names that the layer does not have."""
    modules = [adapter.mlp, adapter.residual_at or adapter.attention, *(p for p, _ in adapter.captures.values()),
               *([adapter.sum_at] if adapter.sum_at else []), *adapter.input_modules]
    for path in modules:
        try:
            layer.get_submodule(path)
        except AttributeError:
            return f"it has no module {path!r}"
    for name in (*adapter.input_matrices, adapter.output_param):
        try:
            layer.get_parameter(name)
        except AttributeError:
            return f"it has no parameter {name!r}"
    return None
