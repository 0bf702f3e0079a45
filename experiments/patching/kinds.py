"""The names Table 1 is written in: how an input matrix stores W, how a patch is applied, how text advances.

Plain constants in a module of their own, so that the adapters (arch/), the rules (rules/) and the rounded
updates (rounded.py) can all name them without importing one another. The output rules are objects
(`patching/rules/`), each with its name as `key`.
"""

# Layouts of an input matrix W that reads z:
LINEAR = "linear"  # nn.Linear weight (out, in): y = W z
CONV1D = "conv1d"  # GPT-2's Conv1D weight (in, out): y = z W, so the effective matrix is Wᵀ
EXPERTS = "experts"  # an MoE's stacked expert weights (E, out, in): y_e = W_e z
EXPERTS_IN_OUT = "experts_in_out"  # stacked the other way, (E, in, out): y_e = z W_e (gpt-oss)

# How a matrix's rank-1 patch reaches the patched forward (`apply=`, Patcher; rounded.RankOneAction):
MATERIALIZED = "materialized"  # W + ΔW rounded once to the model's dtype: the paper's reading of a weight update
ACTION = "action"  # W·z + c (vᵀz) in the model's dtype: W untouched, the update applied as a low-rank action
APPLY_MODES = (MATERIALIZED, ACTION)

# Which token the text goes on with when the two models are compared (`advance=`, generate.compare_generation):
ADVANCE_CONTEXT = "context"  # the with-context model's (§4.1)
ADVANCE_PATCHED = "patched"  # the patched model's own: an early miss changes every later context
ADVANCE_MODES = (ADVANCE_CONTEXT, ADVANCE_PATCHED)
