"""The W_Q = I constructions of Karbevski & Mijoski §3-4 (and App. 8.5's proofs), as functions that
return changed weights; run them through toy_transformer.forward to check them.

Row-vector convention: a layer maps X ↦ X W. Each function builds exactly the weights the paper's
proof writes down; nothing is fitted. Solves, not explicit inverses, wherever a Θ⁻¹ appears.
"""

from __future__ import annotations

import torch

from experiments.core.errors import UserError

# Reciprocal condition number below which a matrix counts as singular in float64.
SINGULAR_RCOND = 1e-12


def require_gl(matrix: torch.Tensor, name: str) -> None:
    """The constructions need Θ = W_Q ∈ GL(d); refuse anything numerically singular, in one line.
    Shape-only (meta) tensors, used to count a reduction's parameters at a large shape, have no values."""
    if matrix.is_meta:
        return
    s = torch.linalg.svdvals(matrix.double())
    rcond = (s[-1] / s[0]).item() if s[0] > 0 else 0.0
    if not rcond > SINGULAR_RCOND:
        rank = int((s > s[0] * SINGULAR_RCOND).sum()) if s[0] > 0 else 0
        raise UserError(f"{name} is not invertible (not in GL(d)): rank {rank} < d = {matrix.shape[0]}, "
                        f"smallest/largest singular value {rcond:.1e}; the W_Q = I reparametrization needs "
                        "an invertible W_Q (Θ)")


def left_solve(theta: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Θ⁻¹ W."""
    return torch.linalg.solve(theta, w)


# -- one attention layer -----------------------------------------------------------------------

def lemma31_transform(x, w_q, w_k, w_v, theta):
    """Lemma 3.1: (X, W_Q, W_K, W_V) ↦ (XΘ, Θ⁻¹W_Q, Θ⁻¹W_K, Θ⁻¹W_V) for Θ ∈ GL(d)."""
    require_gl(theta, "Θ")
    return x @ theta, left_solve(theta, w_q), left_solve(theta, w_k), left_solve(theta, w_v)


def lemma31_reduce(x, w_q, w_k, w_v):
    """Lemma 3.1 with Θ = W_Q: (XW_Q, I, W_Q⁻¹W_K, W_Q⁻¹W_V); the query weight is gone (None = I)."""
    require_gl(w_q, "W_Q")
    return x @ w_q, None, left_solve(w_q, w_k), left_solve(w_q, w_v)


def prop41_merge(w_q, w_k, w_v, w_o):
    """Prop. 4.1 (single head): (W_Q, W_K, W_V, W_O) ↦ (I, W_K W_Qᵀ, W_V W_O, I)."""
    return None, w_k @ w_q.T, w_v @ w_o, torch.eye(w_o.shape[0], dtype=w_o.dtype)


def block_diagonal(blocks: list[torch.Tensor]) -> torch.Tensor:
    return torch.block_diag(*blocks)


def prop42_absorb(w_q, w_k, d):
    """Prop. 4.2: (W_Q, W_K) ↦ (W_Q D, W_K D⁻ᵀ) for a block-diagonal D (one d_k×d_k block per head)."""
    require_gl(d, "D")
    return w_q @ d, torch.linalg.solve(d, w_k.T).T  # W_K D⁻ᵀ = (D⁻¹ W_Kᵀ)ᵀ


# -- whole models (toy_transformer weight dicts) -----------------------------------------------

def _copy(weights: dict) -> dict:
    """A copy that keeps shared layers shared (one new dict per distinct layer)."""
    fresh: dict[int, dict] = {}
    layers = [fresh.setdefault(id(layer), dict(layer)) for layer in weights["layers"]]
    return {**weights, "layers": layers}


def _conjugate_layer(layer: dict, theta_in: torch.Tensor, theta_out: torch.Tensor) -> dict:
    """The layer that reads XΘ_in and writes (its original output)·Θ_out (App. 8.5's reduced weights)."""
    out = dict(layer)
    for key in ("W_Q", "W_K", "W_V", "W_up"):
        if layer[key] is not None:
            out[key] = left_solve(theta_in, layer[key])
    out["W_O"] = layer["W_O"] @ theta_in
    out["W_down"] = layer["W_down"] @ theta_out
    return out


def _embed_in(weights: dict, theta: torch.Tensor) -> dict:
    return {**weights, "E": weights["E"] @ theta, "E_P": weights["E_P"] @ theta}


def _untied_head(weights: dict) -> torch.Tensor:
    return weights["E"].T if weights["head"] is None else weights["head"]


def conjugate_all(weights: dict, theta: torch.Tensor) -> dict:
    """Every block made Θ-equivariant (Thm 4.1's proof): the residual stream of the new model is the
    old one times Θ; embeddings ·Θ, head Θ⁻¹· (and untied: Remark 4)."""
    require_gl(theta, "Θ")
    out = _copy(weights)
    done: dict[int, dict] = {}
    out["layers"] = [done.setdefault(id(layer), _conjugate_layer(layer, theta, theta)) for layer in out["layers"]]
    out = _embed_in(out, theta)
    out["head"] = left_solve(theta, _untied_head(weights))
    return out


def thm41_single_layer(weights: dict, j: int, keep_tied: bool = False) -> dict:
    """Thm 4.1: Θ = W_Q^j for every block, then W̃_Q^j = Θ⁻¹W_Q^j = I exactly (stored as None).

    `keep_tied=True` is Remark 4's obstruction: keep the head tied to the new embedding EΘ instead of
    untying it to Θ⁻¹Eᵀ."""
    theta = weights["layers"][j]["W_Q"]
    require_gl(theta, f"W_Q of layer {j}")
    out = conjugate_all(weights, theta)
    out["layers"][j] = {**out["layers"][j], "W_Q": None}
    if keep_tied:
        out["head"] = None
    return out


def thm42_attention_skip_only(weights: dict) -> dict:
    """Thm 4.2 (Lemma 8.5): Θ_i = W_Q^i, block i reads XΘ_i and writes (its output)·Θ_{i+1};
    Θ_{L+1} = I untied, (Θ_1ᵀ)⁻¹ tied (then the reduced model stays tied: W̃_LM = Ẽᵀ)."""
    layers = weights["layers"]
    thetas = []
    for i, layer in enumerate(layers):
        require_gl(layer["W_Q"], f"W_Q of layer {i}")
        thetas.append(layer["W_Q"])
    tied = weights["head"] is None
    eye = torch.eye(thetas[0].shape[0], dtype=thetas[0].dtype)
    thetas.append(torch.linalg.inv(thetas[0].T) if tied else eye)
    new_layers = []
    for i, layer in enumerate(layers):
        reduced = _conjugate_layer(layer, thetas[i], thetas[i + 1])
        reduced["W_Q"] = None
        new_layers.append(reduced)
    out = _embed_in({**weights, "layers": new_layers}, thetas[0])
    out["head"] = None if tied else weights["head"]
    return out


def thm43_shared(weights: dict) -> dict:
    """Thm 4.3 (Lemma 8.6): one Θ = W_Q for the shared block; every W̃_Q = I (stored as None).

    Applied to a model whose layers are not shared, this is the recipe used where the theorem does
    not hold (each layer's W_Q is then declared I without being so): the control."""
    theta = weights["layers"][0]["W_Q"]
    require_gl(theta, "the shared W_Q")
    out = conjugate_all(weights, theta)
    done: dict[int, dict] = {}
    out["layers"] = [done.setdefault(id(layer), {**layer, "W_Q": None}) for layer in out["layers"]]
    return out


def drop_queries(weights: dict, layers: list[int] | None = None) -> dict:
    """The un-adjusted control: W_Q := I in the given layers (all by default), nothing else changed."""
    out = _copy(weights)
    chosen = range(len(out["layers"])) if layers is None else layers
    for i in chosen:
        out["layers"][i] = {**out["layers"][i], "W_Q": None}
    return out
