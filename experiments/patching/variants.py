"""The patch variants: where each layer's patch is computed, from what, and what its agreement proves.

One small class per variant, in VARIANTS below; the patcher asks the variant for a layer's patch and never
branches on its name. A variant declares:
- `loop`: OPEN, the patch is computed from the with-context pass alone (Algorithm 1 and App. B: the
  paper's method, so its agreement is evidence for Theorem 1), or CLOSED, the patch is solved inside the
  patched pass for the with-context output itself (a construction: one layer's rank-1 patches can force
  any output, so the closed loop agrees by design, whatever the targets);
- `unsupported(adapter)`: None, or one line saying why the block cannot take it (App. B needs a post-MLP
  norm); the adapters offer what their data supports, no name is checked;
- `exact_open_loop(adapter)`: whether this open loop is exact on trained weights of that block, which
  picks `patch export`'s default (`export_default`);
- `patches_layer(index, n_layers)`: every layer, except for the closed loop's control, which patches the
  last layer alone (`closed_loop_last`: it reaches the same logits, so logit agreement is no evidence).

Torch-free on purpose: the typed config's Enum of variant names is built from VARIANTS before any
composition (experiments/goldwaser/schema.py, PatchVariant), and start-up must not import torch. The per-layer work is
in open_loop.py and closed_loop.py, imported when a layer is patched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, NamedTuple

from experiments.patching.kinds import ACTION, APPLY_MODES, CONV1D, LINEAR

if TYPE_CHECKING:  # types only: the adapters import torch
    from experiments.patching.arch.base import BlockAdapter

OPEN = "open loop"
CLOSED = "closed loop"


class Style(NamedTuple):
    """How a figure draws one variant's line: what tells two variants apart at a glance."""

    color: str
    marker: str
    width: float


DEFAULT_STYLE = Style("0.3", "d", 1.0)  # a variant the registry does not know (an old run's): drawn all the same


class Variant:
    name: ClassVar[str]
    loop: ClassVar[str]
    source: ClassVar[str]  # where it comes from, for tables: "Alg. 1", "App. B", "construction"
    summary: ClassVar[str]  # one line for --help and the yaml comments
    label: ClassVar[str]  # its name in a figure's legend
    style: ClassVar[Style] = DEFAULT_STYLE
    # what the experiments' claims ask of a variant, declared here so that none of them compares its name:
    paper_algorithm: ClassVar[bool] = False  # Algorithm 1 as the paper writes it (its claims are the paper's)
    conditioned: ClassVar[bool] = False  # a post-norm block's W_down gets App. B's sign-target step
    control: ClassVar[bool] = False  # another variant's control, not a method (the closed loop at one layer)

    @property
    def evidence(self) -> bool:
        """Open loop: the patches come from the with-context pass alone, so agreement tests Theorem 1.
        Closed loop: solved for the very output it is compared with: agreement holds by design."""
        return self.loop == OPEN

    def unsupported(self, adapter: BlockAdapter) -> str | None:
        return None

    def exact_open_loop(self, adapter: BlockAdapter) -> bool:
        """True where this open loop is exact on trained weights of the block (none for a closed loop)."""
        return False

    def patches_layer(self, index: int, n_layers: int) -> bool:
        return True

    def open_counterpart(self, adapter: BlockAdapter) -> str | None:
        """A closed loop: the open loop that computes the same patch in exact arithmetic (the two differ only
        by what rounding the closed loop feeds back), so how far apart their patches are can be measured."""
        return None

    def patch(self, patcher, layer, target, args: tuple, kwargs: dict):
        """Run `layer` patched for the with-context values `target` (a LayerCapture) on the input the
        model passed it: (the values it read, its output, LayerPatchStats). Buffers: `patcher.bufs`."""
        raise NotImplementedError


def _needs_post_norm(variant: str, adapter: BlockAdapter) -> str | None:
    if adapter.post_norm_block:
        return None
    have = ", ".join(_families_with_post_norm())
    return (f"variant={variant} (App. B) needs a post-MLP norm, which {adapter.family} does not have "
            f"(only {have}); use variant=naive or closed_loop")


def _scaled_branch(variant: str, adapter: BlockAdapter) -> str | None:
    """App. B's steps and the closed loop solve for the branch's output as if T = v + g; a branch scaled by
    α (rules/scaled_branch.py), or a layer that goes on after v + g with the token's own data (Gemma 4's
    per-layer inputs, its layer scalar), is taken by the open loop only."""
    if adapter.branch_scale != 1.0:
        return (f"variant={variant} solves for T = v + g, and {adapter.family} scales its branch by "
                f"{adapter.branch_scale:g}; use variant=naive")
    if adapter.sum_at or adapter.output_scale:
        after = ", ".join(x for x in (adapter.sum_at, adapter.output_scale) if x)
        return (f"variant={variant} solves for T = v + g, and {adapter.family}'s layer goes on after v + g "
                f"({after}); use variant=naive")
    return None


IN_PASS = "updates every input matrix in the pass from the MLP's input"  # the closed loop (closed_loop.py)
DOWN_STEP = "moves the one matrix before the post-MLP norm (W_down)"  # App. B (app_b.py)


def _own_inputs(variant: str, adapter: BlockAdapter, does: str) -> str | None:
    """Per-matrix inputs (Gemma 4's router and experts beside its MLP, each reading its own norm of v): the
    closed loop updates every input matrix in the MLP's pre-hook from the MLP's input z′ (the router's and
    the experts' inputs are other vectors), and App. B moves W_down, while the post-MLP norm here normalizes
    the sum of the MLP's and the experts' branches. The open loop takes it: each update reads its own input."""
    if not adapter.input_at:
        return None
    return (f"variant={variant} {does}, and in {adapter.family} {', '.join(adapter.input_at)} read their own "
            "inputs beside the MLP, whose output the post-MLP norm sums with theirs; use variant=naive")


def _shared_expert(variant: str, adapter: BlockAdapter) -> str | None:
    """The closed loop solves an MoE's routed experts in the pass for T − v as if they were the whole MLP; a
    shared expert beside them (Qwen3-Next) adds its own output, which that solve does not see (measured: 75 %
    top-1, logits 0.53 off on the tiny model, its last-layer control alike). The open loop takes it: the
    shared expert's matrices get the input update, and the routed experts absorb r."""
    if adapter.rule.routed_experts and any("shared_expert" in name for name in adapter.input_matrices):
        return (f"variant={variant} solves the routed experts for T − v as if they were the whole MLP, and "
                f"{adapter.family}'s MLP adds a shared expert beside them; use variant=naive")
    return None


def _families_with_post_norm() -> list[str]:
    from experiments.patching.arch import FAMILIES

    return sorted({a.family for a in FAMILIES if a.post_norm_block})


class OpenLoop(Variant):
    """Patches from the with-context pass alone (open_loop.py); subclasses give the output step."""

    loop = OPEN

    def output_step(self):
        raise NotImplementedError

    def fill(self, patcher, layer, target, hidden, args: tuple, kwargs: dict):
        """Only fill `patcher.bufs` with the layer's patched tensors (for tests and the per-layer analyses)."""
        from experiments.patching.open_loop import fill

        return fill(patcher, layer, target, hidden, args, kwargs, self.output_step())

    def patch(self, patcher, layer, target, args, kwargs):
        from experiments.patching.open_loop import patch_and_run

        return patch_and_run(patcher, layer, target, args, kwargs, self.output_step())


class Naive(OpenLoop):
    name, source = "naive", "Alg. 1"
    summary = "Algorithm 1 (open loop): input updates and Table 1's output rule, from the with-context pass"
    label = "naive (Alg. 1, open loop)"
    # closed_loop_scale computes the same Thm-10 update (their gains and max |Δm| coincide): distinct markers
    # and widths keep both visible where the lines lie on each other
    style = Style("tab:red", "o", 2.2)
    paper_algorithm = True

    def exact_open_loop(self, adapter):
        # Thm 10 divides by MLP outputs near 0 on trained weights (Gemma 3 270M: 0/480 tokens), and learned
        # absolute positions put the query alone at another input than the one the patch was computed for
        return not adapter.rule.post_norm and not adapter.absolute_positions

    def output_step(self):
        from experiments.patching.open_loop import output_rule_step

        return output_rule_step


class Stable(OpenLoop):
    name, source = "stable", "App. B"
    summary = "App. B (open loop): W_down from the RMSNorm inversion, then Δm for the remainder"
    label = "stable (App. B, open loop)"
    style = Style("tab:orange", "^", 1.2)
    sign_target: ClassVar[bool] = False

    def unsupported(self, adapter):
        return (_own_inputs(self.name, adapter, DOWN_STEP) or _needs_post_norm(self.name, adapter)
                or _scaled_branch(self.name, adapter))

    def output_step(self):
        from experiments.patching.open_loop import stable_step

        return stable_step(self.sign_target)


class Conditioned(Stable):
    name, source = "conditioned", "App. B, conditioned"
    summary = "open loop: W_down to C·sign(d_C), so Eq. 4's Δm divides by ±1, not by MLP outputs near 0"
    label = "conditioned (open loop)"
    style = Style("tab:blue", "v", 1.2)
    sign_target = True
    conditioned = True

    def exact_open_loop(self, adapter):
        return self.unsupported(adapter) is None and not adapter.absolute_positions


class ClosedLoop(Variant):
    name, loop, source = "closed_loop", CLOSED, "construction"
    summary = ("construction: each layer solved, inside the patched pass, for the with-context output itself "
               "(a post-norm block's W_down conditioned as above)")
    label = "closed loop, W_down conditioned (construction)"
    style = Style("tab:green", "s", 1.2)
    conditioned = True  # a post-norm block's W_down gets its sign-target step too

    def open_counterpart(self, adapter):
        return "conditioned" if self.conditioned and adapter.post_norm_block else "naive"

    def unsupported(self, adapter):
        return (_own_inputs(self.name, adapter, IN_PASS) or _scaled_branch(self.name, adapter)
                or _shared_expert(self.name, adapter))

    def patch(self, patcher, layer, target, args, kwargs):
        from experiments.patching.closed_loop import patched_layer_forward

        return patched_layer_forward(patcher.adapter, layer, target, args, kwargs, patcher.bufs, patcher.cdt,
                                     conditioned=self.conditioned)


class ClosedLoopScale(ClosedLoop):
    name = "closed_loop_scale"
    summary = "construction: the closed loop with Thm 10 alone (no W_down step; post-norm blocks only)"
    label = "closed loop, Thm 10 alone (construction)"
    style = Style("tab:purple", "x", 1.0)
    conditioned = False

    def unsupported(self, adapter):
        why = _own_inputs(self.name, adapter, IN_PASS) or _scaled_branch(self.name, adapter)
        if why:
            return why
        if adapter.rule.post_norm and adapter.pre_norm_matrix:
            return None
        return (f"variant={self.name} (Thm 10 alone in the closed loop) is the post-norm closed loop without its "
                f"W_down step; {adapter.family} has no post-MLP norm: use variant=closed_loop")


class ClosedLoopLastLayer(ClosedLoop):
    """The closed loop's control: every layer but the last runs unpatched, the last is solved in the pass.
    It reaches the with-context logits as well as the full closed loop, from hidden states that are far from
    the with-context ones at every other layer: what logit agreement of a closed loop is worth."""

    name = "closed_loop_last"
    summary = "the closed loop's control: the last layer alone solved in the pass, every other layer unpatched"
    label = "closed loop at the last layer alone (control)"
    style = Style("tab:brown", "+", 1.0)
    control = True

    def patches_layer(self, index, n_layers):
        return index == n_layers - 1


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Naive(), Stable(), Conditioned(), ClosedLoop(), ClosedLoopScale(), ClosedLoopLastLayer())}
EXPORT_PREFERENCE = ("conditioned", "naive")  # open loops, best conditioned first; else the closed loop


def label(name: str) -> str:
    """A variant's legend entry; an unknown one (an old run's) is named as it is, never dropped."""
    return VARIANTS[name].label if name in VARIANTS else name


def style(name: str) -> Style:
    """A variant's line style; an unknown one gets DEFAULT_STYLE."""
    return VARIANTS[name].style if name in VARIANTS else DEFAULT_STYLE


def in_registry_order(names) -> list[str]:
    """`names` (a run's variants) in the registry's order, the ones it does not know after them as they came."""
    names = list(dict.fromkeys(names))
    return [n for n in VARIANTS if n in names] + [n for n in names if n not in VARIANTS]


def variant_for(name: str) -> Variant:
    from experiments.core.errors import UserError

    try:
        return VARIANTS[name]
    except KeyError:
        raise UserError(f"variant={name!r} is not one of {', '.join(VARIANTS)}") from None


def check_variant(adapter: BlockAdapter, name: str) -> Variant:
    """The variant, or one line saying why the block cannot take it."""
    from experiments.core.errors import UserError

    variant = variant_for(name)
    why = variant.unsupported(adapter)
    if why:
        raise UserError(why)
    return variant


def check_apply(adapter: BlockAdapter, variant: Variant, apply: str) -> str:
    """`apply` (kinds.APPLY_MODES), or one line saying why this variant or block cannot take it: the action
    is the open loop's (a closed loop solves each layer for its rounded weights), on 2-D matrices (an MoE's
    stacked experts are not)."""
    from experiments.core.errors import UserError

    if apply not in APPLY_MODES:
        raise UserError(f"apply={apply!r} is not one of {', '.join(APPLY_MODES)}")
    if apply == ACTION and not variant.evidence:
        raise UserError(f"apply=action is for the open loop (naive, stable, conditioned): variant={variant.name} "
                        "solves each layer inside the pass for its rounded weights; use apply=materialized")
    if apply == ACTION and (adapter.rule.routed_experts
                            or any(layout not in (LINEAR, CONV1D) for layout in adapter.input_matrices.values())):
        raise UserError(f"apply=action keeps rank-1 updates of 2-D matrices; {adapter.family}'s stacked experts "
                        "(MoE) are not: use apply=materialized")
    return apply


def supported_variants(adapter: BlockAdapter) -> list[str]:
    """The variants this block takes (docs/python.md lists them for a model)."""
    return [name for name, v in VARIANTS.items() if v.unsupported(adapter) is None]


def export_default(adapter: BlockAdapter) -> str:
    """An open loop that is exact on the block where one exists (evidence), else the closed loop
    (a construction), e.g. for GPT-2's learned absolute positions."""
    for name in EXPORT_PREFERENCE:
        if VARIANTS[name].unsupported(adapter) is None and VARIANTS[name].exact_open_loop(adapter):
            return name
    return ClosedLoop.name
