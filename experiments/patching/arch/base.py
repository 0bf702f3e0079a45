"""What an architecture adapter says about its decoder block (DESIGN.md, "Architectures").

The shared engine (`experiments/patching/patcher.py`) needs, per block:
- where the layers are (`decoder`, `layers_attr`) and which module is the MLP (its input is z);
- where the residual before the MLP, v, can be read (`residual_at`: a module whose input is v), or, for a
  parallel block, the attention module whose output A is added to x (v = x + A);
- the input matrices that read z (each gets the rank-1 input update, Thms 6–7) and their layout;
- the output rule (Thm 8–11) with the parameter it changes and what it reads (`captures`);
- whether App. B's stable update applies (it needs a post-MLP norm).
Everything else is shared. An adapter is a few lines of data; see gemma3.py, llama.py, gpt2.py,
mixtral.py, gptj.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

# Layouts of an input matrix W that reads z:
LINEAR = "linear"  # nn.Linear weight (out, in): y = W z
CONV1D = "conv1d"  # GPT-2's Conv1D weight (in, out): y = z W, so the effective matrix is Wᵀ
EXPERTS = "experts"  # an MoE's stacked expert weights (E, out, in): y_e = W_e z

# Output rules (Table 1):
OUTER_BIAS = "outer_bias"  # Thm 8: Δb = r
OUTER_WEIGHT = "outer_weight"  # Thm 9: ΔW′ = r yᵀ / ‖y‖², y = the input of the outer matrix
SCALE = "scale"  # Thm 10: Δm = r ⊘ h, h = the normalized output before the scale
MOE = "moe"  # Thm 11: each active expert's outer matrix adds r / S


@dataclass(frozen=True)
class BlockAdapter:
    model_types: tuple[str, ...]  # transformers `config.model_type` values this adapter reads
    family: str  # a short name for tables and figures
    decoder: Callable[[nn.Module], nn.Module]  # the model -> the module holding the decoder layers
    layers_attr: str  # attribute of the decoder holding the layers
    input_matrices: dict[str, str]  # parameter (relative to a layer) -> layout, every matrix reading z
    output_rule: str  # OUTER_BIAS | OUTER_WEIGHT | SCALE | MOE
    output_param: str  # the parameter the output rule changes (relative to a layer)
    residual_at: str | None = None  # a module whose input is v (None: parallel block, see `attention`)
    attention: str | None = None  # parallel block: the attention module, v = x + its output
    mlp: str = "mlp"  # the MLP: its input is z
    # capture name -> (module path relative to the layer, "input" | "output"): what the rule reads
    captures: dict[str, tuple[str, str]] = field(default_factory=dict)
    stable: bool = False  # App. B applies: the block ends with a post-MLP norm (Gemma 3)
    # SCALE blocks: the matrix whose output the post-MLP norm normalizes (Gemma's W_down). The closed loop
    # patches it too, so that Thm 10 divides by ±1 (lemmas.sign_pre_norm_target): see closed_loop.py
    pre_norm_matrix: str | None = None
    theorem: str = ""  # which Table 1 rows this block uses, for tables

    def layers(self, model: nn.Module) -> nn.ModuleList:
        return getattr(self.decoder(model), self.layers_attr)
