"""Each constructive statement of Karbevski & Mijoski, measured once on fresh random float64 weights:
the construction's output error beside a control's (or, for an obstruction the paper states, the
obstruction's error beside the exact construction it is the failing counterpart of).

Every function returns {"error": max |original − reparametrized|, "control": the same for the
control, "scale": max |original|}; the experiment divides by `scale` for relative errors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from experiments.karbevski import layernorm_basis as lnb
from experiments.karbevski import relu_skip as rs
from experiments.karbevski.reparam import (
    block_diagonal,
    drop_queries,
    lemma31_reduce,
    lemma31_transform,
    prop41_merge,
    prop42_absorb,
    thm41_single_layer,
    thm42_attention_skip_only,
    thm43_shared,
)
from experiments.karbevski.toy_transformer import Arch, attention_core, forward, random_weights


@dataclass(frozen=True)
class Shape:
    d_model: int
    heads: int
    layers: int
    d_ff: int
    vocab: int
    seq_len: int
    batch: int
    ln_eps: float
    wq_rank: int | None = None  # bad-input demo: every W_Q of this rank (singular when < d_model)


def _gauss(generator, *shape, scale=1.0):
    return torch.randn(*shape, generator=generator, dtype=torch.float64) * scale


def _diff(a, b) -> float:
    return (a - b).abs().max().item()


def _result(original, construction, control) -> dict:
    return {"error": _diff(original, construction), "control": _diff(original, control),
            "scale": original.abs().max().item()}


def _inputs(s: Shape, g):
    return _gauss(g, s.batch, s.seq_len, s.d_model)


def _square(s: Shape, g):
    return _gauss(g, s.d_model, s.d_model, scale=s.d_model**-0.5)


def _model(s: Shape, g, **kw) -> dict:
    w = random_weights(s.vocab, s.d_model, s.d_ff, s.layers, s.seq_len, g, **kw)
    if s.wq_rank is not None and s.wq_rank < s.d_model:
        for layer in {id(layer): layer for layer in w["layers"]}.values():
            layer["W_Q"] = _gauss(g, s.d_model, s.wq_rank) @ _gauss(g, s.wq_rank, s.d_model) / s.d_model**0.5
    return w


def _tokens(s: Shape, g):
    return torch.randint(0, s.vocab, (s.batch, s.seq_len), generator=g)


# -- one attention layer -----------------------------------------------------------------------

def lemma31_invariance(s: Shape, g) -> dict:
    """Lemma 3.1: S_c(XΘ, Θ⁻¹W_Q, Θ⁻¹W_K, Θ⁻¹W_V) = S_c(X, W_Q, W_K, W_V). Control: XΘ, weights kept."""
    x, wq, wk, wv, theta = _inputs(s, g), _square(s, g), _square(s, g), _square(s, g), _square(s, g)
    original = attention_core(x, wq, wk, wv, s.heads)
    return _result(original, attention_core(*lemma31_transform(x, wq, wk, wv, theta), s.heads),
                   attention_core(x @ theta, wq, wk, wv, s.heads))


def lemma31_query_identity(s: Shape, g) -> dict:
    """Lemma 3.1 with Θ = W_Q: S_c(XW_Q, I, W_Q⁻¹W_K, W_Q⁻¹W_V). Control: (XW_Q, I, W_K, W_V)."""
    x, wq, wk, wv = _inputs(s, g), _square(s, g), _square(s, g), _square(s, g)
    if s.wq_rank is not None:
        wq = _gauss(g, s.d_model, s.wq_rank) @ _gauss(g, s.wq_rank, s.d_model)
    original = attention_core(x, wq, wk, wv, s.heads)
    return _result(original, attention_core(*lemma31_reduce(x, wq, wk, wv), s.heads),
                   attention_core(x @ wq, None, wk, wv, s.heads))


def prop41_single_head(s: Shape, g) -> dict:
    """Prop. 4.1: one head, (I, W_K W_Qᵀ, W_V W_O, I). Control: the same merge with `heads` heads,
    where the proposition does not apply."""
    x, wq, wk, wv, wo = _inputs(s, g), _square(s, g), _square(s, g), _square(s, g), _square(s, g)
    q, k, v, o = prop41_merge(wq, wk, wv, wo)
    one = attention_core(x, wq, wk, wv, 1) @ wo
    many = attention_core(x, wq, wk, wv, s.heads) @ wo
    return {"error": _diff(one, attention_core(x, q, k, v, 1) @ o),
            "control": _diff(many, attention_core(x, q, k, v, s.heads) @ o), "scale": one.abs().max().item()}


def prop42_block_diagonal(s: Shape, g) -> dict:
    """Prop. 4.2: S_c(X, W_Q D, W_K D⁻ᵀ, W_V) for block-diagonal D. Control: a dense D."""
    x, wq, wk, wv = _inputs(s, g), _square(s, g), _square(s, g), _square(s, g)
    d_k = s.d_model // s.heads
    d = block_diagonal([_gauss(g, d_k, d_k, scale=d_k**-0.5) for _ in range(s.heads)])
    dense = _square(s, g)
    original = attention_core(x, wq, wk, wv, s.heads)
    return _result(original, attention_core(x, *prop42_absorb(wq, wk, d), wv, s.heads),
                   attention_core(x, *prop42_absorb(wq, wk, dense), wv, s.heads))


# -- whole models ------------------------------------------------------------------------------

def thm41_single_layer_elimination(s: Shape, g, tied: bool = False) -> dict:
    """Thm 4.1 for every layer j in turn (worst j). Control: W_Q^j := I with nothing else changed.
    With `tied` the input model ties head and embedding; the reduced one is untied (Remark 4)."""
    w, tokens, arch = _model(s, g, tied=tied), _tokens(s, g), Arch(heads=s.heads)
    original = forward(tokens, w, arch)
    errors = [_diff(original, forward(tokens, thm41_single_layer(w, j), arch)) for j in range(s.layers)]
    controls = [_diff(original, forward(tokens, drop_queries(w, [j]), arch)) for j in range(s.layers)]
    return {"error": max(errors), "control": min(controls), "scale": original.abs().max().item()}


def remark4_tied_kept(s: Shape, g) -> dict:
    """Remark 4 (obstruction): Thm 4.1 on a tied model but keeping the head tied to the new embedding.
    Paired with the untied reduction, which is exact."""
    w, tokens, arch = _model(s, g, tied=True), _tokens(s, g), Arch(heads=s.heads)
    original = forward(tokens, w, arch)
    return _result(original, forward(tokens, thm41_single_layer(w, 0, keep_tied=True), arch),
                   forward(tokens, thm41_single_layer(w, 0), arch))


def thm42_all_layers(s: Shape, g, tied: bool = False) -> dict:
    """Thm 4.2: attention-skip-only model, W_Q = I in every layer. Control: every W_Q := I unadjusted."""
    w, tokens, arch = _model(s, g, tied=tied), _tokens(s, g), Arch(heads=s.heads, skips="attention")
    original = forward(tokens, w, arch)
    return _result(original, forward(tokens, thm42_attention_skip_only(w), arch),
                   forward(tokens, drop_queries(w), arch))


def remark1_both_skips(s: Shape, g) -> dict:
    """Remark 1 (obstruction): Thm 4.2's all-layer recipe on the standard block (both skips).
    Paired with the same recipe on the attention-skip-only block, where it is exact."""
    w, tokens = _model(s, g), _tokens(s, g)
    both, attn_only = Arch(heads=s.heads), Arch(heads=s.heads, skips="attention")
    reduced = thm42_attention_skip_only(w)
    original = forward(tokens, w, both)
    exact = forward(tokens, w, attn_only)
    return {"error": _diff(original, forward(tokens, reduced, both)),
            "control": _diff(exact, forward(tokens, reduced, attn_only)), "scale": original.abs().max().item()}


def thm43_weight_shared(s: Shape, g) -> dict:
    """Thm 4.3: a weight-shared model, W_Q = I. Control: the same recipe on a model whose layers
    are not shared."""
    tokens, arch = _tokens(s, g), Arch(heads=s.heads)
    shared, separate = _model(s, g, shared=True), _model(s, g)
    original = forward(tokens, shared, arch)
    other = forward(tokens, separate, arch)
    return {"error": _diff(original, forward(tokens, thm43_shared(shared), arch)),
            "control": _diff(other, forward(tokens, thm43_shared(separate), arch)),
            "scale": original.abs().max().item()}


def remark7_layernorm_model(s: Shape, g) -> dict:
    """Remark 7 / App. 8.2 (obstruction): Thm 4.1's linear basis change in a pre-LayerNorm model.
    Paired with the same construction in the same model without normalization (exact)."""
    w, tokens = _model(s, g), _tokens(s, g)
    ln, plain = Arch(heads=s.heads, norm="layernorm", ln_eps=s.ln_eps), Arch(heads=s.heads)
    reduced = thm41_single_layer(w, 0)
    original = forward(tokens, w, ln)
    exact = forward(tokens, w, plain)
    return {"error": _diff(original, forward(tokens, reduced, ln)),
            "control": _diff(exact, forward(tokens, reduced, plain)), "scale": original.abs().max().item()}


# -- LayerNorm (App. 8.2) ----------------------------------------------------------------------

def _rows(s: Shape, g):
    return _gauss(g, s.batch * s.seq_len, s.d_model)


def lemma81_semi_conjugacy(s: Shape, g) -> dict:
    """Lemma 8.1: L_ε(f(x)) = M₀ L_ε(x) for f = L_ε⁻¹∘M₀∘L_ε + h1, h random. Control: the same recipe
    with M = A/‖A‖₂, i.e. without the Diag(v) that keeps the zero-mean subspace H."""
    a, x = _square(s, g), _rows(s, g)
    shift = _gauss(g, x.shape[0])
    m0, _ = lnb.semi_conjugacy_matrix(a)
    no_diag = a / torch.linalg.matrix_norm(a, ord=2)
    target = lnb.layer_norm(x, s.ln_eps) @ m0.T
    control_target = lnb.layer_norm(x, s.ln_eps) @ no_diag.T
    return {"error": _diff(target, lnb.layer_norm(lnb.semi_conjugate(x, m0, s.ln_eps, shift), s.ln_eps)),
            "control": _diff(control_target, lnb.layer_norm(lnb.semi_conjugate(x, no_diag, s.ln_eps, shift),
                                                            s.ln_eps)),
            "scale": target.abs().max().item()}


def thm82_layernorm_basis(s: Shape, g) -> dict:
    """Thm 8.2: D′ L_ε(x + MLP′(x)) = ΘD L_ε(x + MLP(x)) with Eq. 7's MLP′ and D′ = D̃⁻¹, checked as
    L_ε(x + MLP′(x)) = D̃ΘD L_ε(x + MLP(x)) (relative error); the D′ form's error is returned beside it.
    Control (Remark 7's plain linear fix): x + MLP′(x) := ΘD(x + MLP(x)) and D′ = I, which is exact
    without the LayerNorm."""
    theta, x = _square(s, g), _rows(s, g)
    scale_d = torch.diag(torch.rand(s.d_model, generator=g, dtype=torch.float64) + 0.5)
    w_up = _gauss(g, s.d_model, s.d_ff, scale=s.d_model**-0.5)
    w_down = _gauss(g, s.d_ff, s.d_model, scale=s.d_ff**-0.5)

    def mlp(z):
        return torch.nn.functional.gelu(z @ w_up) @ w_down

    a = theta @ scale_d
    m0, d_tilde = lnb.semi_conjugacy_matrix(a)
    y = x + mlp(x)
    target = lnb.layer_norm(y, s.ln_eps) @ a.T
    shift = _gauss(g, x.shape[0])
    normalized = lnb.layer_norm(x + lnb.thm82_mlp_prime(x, mlp, m0, s.ln_eps, shift), s.ln_eps)
    d_prime = 1 / torch.diagonal(d_tilde)  # D′ = D̃⁻¹
    linear_fix = lnb.layer_norm(y @ a.T, s.ln_eps)
    out = _result(target, normalized * d_prime, linear_fix)
    # Eq. 6 multiplied through by the diagonal D̃ (an equivalent statement): D′'s small entries of D̃
    # (max/min ratio = `d_tilde_condition`) amplify rounding in the form above, not here.
    scaled_target = target * torch.diagonal(d_tilde)
    out.update(error_d_prime_form=out["error"] / out["scale"],
               d_tilde_condition=(d_prime.abs().max() / d_prime.abs().min()).item(),
               error=_diff(scaled_target, normalized) / scaled_target.abs().max().item() * out["scale"])
    return out


# -- ReLU skip absorption (App. 8.4) -----------------------------------------------------------

def thm83_absorb(h: int, m: int, j_size: int, samples: int, g) -> dict:
    """Thm 8.3 (sufficiency): V₁ = (I − 2Π_J)W₁, V₂ = W₂ where W₂[:, J]W₁[J, :] = −I. Control: the same
    V₁, V₂ built from generic (W₁, W₂), for which the condition fails."""
    w1, w2, j = rs.absorbable_pair(h, m, j_size, g)
    x = _gauss(g, samples, h)
    original = rs.skip_relu_mlp(x, w1, w2)
    gw1, gw2 = _gauss(g, m, h), _gauss(g, h, m)
    generic = rs.skip_relu_mlp(x, gw1, gw2)
    return {"error": _diff(original, rs.relu_mlp(x, *rs.absorb_skip(w1, w2, j))),
            "control": _diff(generic, rs.relu_mlp(x, *rs.absorb_skip(gw1, gw2, j))),
            "scale": original.abs().max().item(), "condition": rs.condition_residual(w1, w2, j),
            "condition_generic": min(rs.condition_residual(gw1, gw2, list(c)) for c in _subsets(m, h))}


def _subsets(m: int, h: int):
    import itertools

    return (c for size in range(h, m + 1) for c in itertools.combinations(range(m), size))


def cor841_no_fit(h: int, m: int, j_size: int, samples: int, g) -> dict:
    """Cor. 8.4.1 (obstruction, relative residuals): the best least-squares V₂ReLU(V₁x) fit of a
    generic skip-ReLU-MLP over all kink-aligned V₁, beside the same fit of an absorbable one (≈ 0)."""
    gw1, gw2 = _gauss(g, m, h), _gauss(g, h, m)
    w1, w2, _ = rs.absorbable_pair(h, m, j_size, g)
    x = _gauss(g, samples, h)
    return {"error": rs.best_kink_aligned_fit(gw1, gw2, x)["relative_residual"],
            "control": rs.best_kink_aligned_fit(w1, w2, x)["relative_residual"], "scale": 1.0}


def lemma84_independence(h: int, m: int, samples: int, g) -> dict:
    """Lemma 8.4: smallest singular value of the |w_iᵀx| features (pairwise non-collinear rows),
    beside the control with one row repeated at another scale (collinear: dependent)."""
    w1 = _gauss(g, m, h)
    x = _gauss(g, samples, h)
    collinear = torch.cat([w1[:-1], -2.5 * w1[:1]])
    return {"error": rs.abs_features_conditioning(w1, x), "control": rs.abs_features_conditioning(collinear, x),
            "scale": 1.0}


def remark5_deviation(dims, samples_per_dim: int, eps: float, scale: float, g) -> list[dict]:
    return [dict(d=int(d), **lnb.linearity_deviation(int(d), samples_per_dim * int(d), g, eps, scale)) for d in dims]
