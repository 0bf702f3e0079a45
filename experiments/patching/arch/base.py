"""What an architecture adapter says about its decoder block (docs/design.md, "Context patching: the engine").

The shared engine (`experiments/patching/patcher.py`) needs, per block:
- where the layers are (`decoder`, `layers_attr`) and which module is the MLP (its input is z);
- where the residual before the MLP, v, can be read (`residual_at`: a module whose input is v), or, for a
  parallel block, the attention module whose output A is added to x (v = x + A);
- the input matrices that read z (each gets the rank-1 input update, Thms 6–7) and their layout; a matrix
  that reads its own function of v instead of the MLP's input (per-matrix inputs, `input_at`) gets its
  update from where it reads;
- the output rule (Thm 8–11) with the parameter it changes and what it reads (`captures`);
- for a post-norm block, the matrix before the norm and how the norm stores its scale (App. B's variants
  and the closed loop's conditioning follow from these: `patching/variants.py`);
- whether positions are learned absolute embeddings (then no open loop is exact: the query alone sits at
  another position than after its context);
- its tiny random test model: an offline name and the transformers config it is built from, beside the
  block it exercises (as transformers keeps each test model's config with its architecture).
Everything else is shared. An adapter is a few lines of data; see gemma3.py, llama.py, gpt2.py,
mixtral.py, gptj.py, olmo2.py. The output rule is an object of `patching/rules/` (`output_rule`), which
declares what the variants and the fit ask of it: the engine asks the adapter for its `rule` and never
branches on a rule's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

# the layouts, re-exported: an adapter imports them from here (and its rule from patching/rules)
from experiments.patching.kinds import CONV1D, EXPERTS, EXPERTS_IN_OUT, LINEAR  # noqa: F401
from experiments.patching.rules import OutputRule


@dataclass(frozen=True)
class BlockAdapter:
    model_types: tuple[str, ...]  # transformers `config.model_type` values this adapter reads
    family: str  # a short name for tables and figures
    decoder: Callable[[nn.Module], nn.Module]  # the model -> the module holding the decoder layers
    layers_attr: str  # attribute of the decoder holding the layers
    input_matrices: dict[str, str]  # parameter (relative to a layer) -> layout, every matrix reading z
    output_rule: OutputRule  # Table 1's row: OUTER_BIAS | OUTER_WEIGHT | SCALE | MOE | MOE_BIAS (patching/rules)
    output_param: str  # the parameter the output rule changes (relative to a layer)
    residual_at: str | None = None  # a module whose input is v (None: parallel block, see `attention`)
    attention: str | None = None  # parallel block: the attention module, v = x + its output
    mlp: str = "mlp"  # the MLP: its input is z
    # capture name -> (module path relative to the layer, "input" | "output"): what the rule reads
    captures: dict[str, tuple[str, str]] = field(default_factory=dict)
    # SCALE blocks: the matrix whose output the post-MLP norm normalizes (Gemma's W_down). App. B's variants
    # patch it (app_b.py), and so does the closed loop, so that Thm 10 divides by ±1 (closed_loop.py)
    pre_norm_matrix: str | None = None
    scale_offset: float = 0.0  # SCALE blocks: the norm's scale is scale_offset + weight (Gemma: 1 + weight)
    absolute_positions: bool = False  # learned position embeddings added to the input (GPT-2)
    theorem: str = ""  # which Table 1 rows this block uses, for tables
    # the offline tiny random model of this family (tests, smoke runs) and its config for a vocabulary size
    tiny_model: str | None = None
    tiny_config: Callable[[int], Any] | None = None
    # extra `from_pretrained` / `from_config` keywords the rules need (an MoE's experts run eagerly)
    load_kwargs: dict[str, str] = field(default_factory=dict)
    # T = v + branch_scale · (the branch): the output rule moves the branch by r / branch_scale (Granite's
    # residual_multiplier; rules/scaled_branch.py)
    branch_scale: float = 1.0
    # after u = v + branch the layer may go on with data of the token alone, never of the context: a module
    # whose input is u (Gemma 4's per-layer inputs: u + N(W_proj(act(W_gate u) ⊙ e_token))), and a stored
    # scalar multiplying the layer's output (Gemma 4's layer_scalar). T is then a function of u and the token:
    # the patch makes u = u_C, so T = T_C; only the check reads these (where to compare v + branch)
    sum_at: str | None = None
    output_scale: str | None = None
    # per-matrix inputs: an input matrix that does not read the MLP's input z but its own function of v (Gemma
    # 4's router and experts beside its dense MLP, each behind a norm of v of its own) -> the module whose input
    # it reads. Thm 7 needs of a matrix only that its input be a function of v alone: each gets the update from
    # its own input, z_i -> z_i,C. Matrices not named here read z
    input_at: dict[str, str] = field(default_factory=dict)

    def input_key(self, name: str) -> str:
        """The capture that holds what the input matrix `name` reads: "z", or "z@MODULE" (`input_at`)."""
        return f"z@{self.input_at[name]}" if name in self.input_at else "z"

    @property
    def input_modules(self) -> tuple[str, ...]:
        """The modules beside the MLP whose input an input matrix reads (`input_at`), each once."""
        return tuple(dict.fromkeys(self.input_at.values()))

    @property
    def input_owners(self) -> tuple[str, ...]:
        """The modules that hold the matrices reading their own inputs (`input_at`), each once: what the check
        compares after the input update."""
        return tuple(dict.fromkeys(name.rsplit(".", 1)[0] for name in self.input_at))

    def layers(self, model: nn.Module) -> nn.ModuleList:
        return getattr(self.decoder(model), self.layers_attr)

    def owner(self, layer: nn.Module) -> nn.Module:
        """The module whose parameter the output rule changes (post-MLP norm, W_down, c_proj, the experts)."""
        return layer.get_submodule(self.output_param.rsplit(".", 1)[0])

    @property
    def post_norm_block(self) -> bool:
        """A block ending in m ⊙ RMSNorm(W_down h) (Gemma 3, OLMo 2): App. B's steps apply (patching/variants.py),
        and its record in patching/families.py says `post_norm=True`."""
        return self.rule.post_norm and self.pre_norm_matrix is not None

    @property
    def rule(self) -> OutputRule:
        """The output rule the engine runs: `output_rule`, wrapped so that it moves the branch by r / α where
        the block scales its branch by α (`branch_scale`)."""
        if self.branch_scale != 1.0:
            from experiments.patching.rules.scaled_branch import ScaledBranch

            return ScaledBranch(self.output_rule, self.branch_scale)
        return self.output_rule


def tiny_common(vocab_size: int) -> dict:
    """What every tiny random config shares: the byte tokenizer's vocabulary and special ids, and an
    untied output layer (with a tied one a random model's top token is the query token itself)."""
    return dict(vocab_size=vocab_size, pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=False)
