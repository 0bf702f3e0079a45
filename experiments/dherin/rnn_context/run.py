"""rnn_context — Dherin et al. App. D.1, Fig. 6.

Setup. Replace the attention layer by an RNN: Φ = φ_W ∘ RNN, RNN feature dimension d_model = 64
(read out linearly to the token width d+1), MLP φ_W(z) = W′ReLU(Wz + b) + b′ with d_mlp = 128.
Train it on in-context linear regression (d = 2, N = 200), batch 32, learning rate 0.005, 10,000
steps; every 100 steps the validation loss on a held-out set two ways, Φ_W(C, x) and
Φ_{W+ΔW}(x), with the control Φ_W(x) beside them. After training, for 100 fresh tasks, the
prefix patches (ΔW)_i of the contexts C_i = the first i examples and the increments
‖(ΔW)_{i+1} − (ΔW)_i‖₂ against i (Fig. 6 right), beside the same curve for the single-layer
attention model of §4 (Fig. 3) on the same tasks.

The attention model is trained in this run (`attention.*`: linreg_icl's architecture on this run's
task, a short schedule, since single-layer attention learns the task within a few hundred steps),
or loaded with `attention.checkpoint=PATH` from a linreg_icl run (its model.pt).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from experiments.core.config_schema import node_values
from experiments.core.errors import UserError
from experiments.core.plotting import mean_band, mean_sem, metric, new_figure, save_figure
from experiments.core.progress import progress
from experiments.core.results import RunContext
from experiments.core.runtime import dtype_name
from experiments.core.validation import require_positive
from experiments.data.linreg import sample_prompts
from experiments.dherin.dynamics import LEARNED_DECAY_BAR, decay_summary, increment_norms, prefix_patches
from experiments.dherin.loss_panels import draw_loss_panels
from experiments.dherin.models.linreg import ContextualBlock
from experiments.dherin.models.rnn import rnn_block
from experiments.dherin.pretrained import build_model as build_attention_block
from experiments.dherin.pretrained import built_config, load_checkpoint, predictions, validation_losses
from experiments.dherin.rnn_context import RnnContextConfig
from experiments.dherin.schema import LinregTrain
from experiments.dherin.training import TrainSettings, claim_losses_agree, train, train_validated

SOURCE = "Dherin App. D.1 Fig 6"


# -- the patched RNN block ------------------------------------------------------------------------


# -- the two models -------------------------------------------------------------------------------


def attention_model(cfg: RnnContextConfig, ctx: RunContext) -> tuple[ContextualBlock, str, ContextualBlock]:
    """The §4 single-layer attention block: loaded from attention.checkpoint, or trained here on this
    run's task with attention.train.* (its validation loss is logged as `attention_val_loss`); and the
    control, the same architecture untrained (its initial weights, or a fresh init beside a checkpoint)."""
    a = cfg.attention
    if a.checkpoint:
        model, built = load_checkpoint(a.checkpoint)
        torch.manual_seed(cfg.seed)
        init = build_attention_block(built).to(ctx.device, ctx.dtype).eval()
        return model.to(ctx.device, ctx.dtype).eval(), "loaded", init
    built = built_config(cfg.task, a.model)
    torch.manual_seed(cfg.seed)
    model = build_attention_block(built).to(ctx.device, ctx.dtype)
    init = copy.deepcopy(model).eval()
    settings = TrainSettings(**node_values(a.train, LinregTrain), eval_every=a.train.steps,
                             n_examples=cfg.task.n_examples, d=cfg.task.d)
    train(model, settings, torch.Generator().manual_seed(cfg.seed + 1), ctx.device, ctx.dtype,
          lambda step, loss: None, lambda step: None)
    return model.eval(), "trained here", init


def increments(model: ContextualBlock, tokens: torch.Tensor) -> np.ndarray:
    """‖(ΔW)_{i+1} − (ΔW)_i‖₂ (operator norm), i = 1..N−1, per task: (tasks, N−1), float64."""
    return increment_norms(prefix_patches(model, tokens))["op2"].double().cpu().numpy()


# -- the run --------------------------------------------------------------------------------------


def run(cfg: RnnContextConfig, ctx: RunContext) -> None:
    device, dtype = ctx.device, ctx.dtype
    index = dict(seed=cfg.seed, dtype=dtype_name(dtype), nonlinearity=cfg.model.nonlinearity)
    torch.manual_seed(cfg.seed)
    model = rnn_block(cfg.task.d, d_model=cfg.model.d_model, d_mlp=cfg.model.d_mlp,
                      nonlinearity=cfg.model.nonlinearity).to(device, dtype)
    rnn_init = copy.deepcopy(model).eval()  # the control: the same RNN block before training
    trained = train_validated(model, cfg, ctx, index,  # linreg_icl's keys: train.*, task.*, eval.*
                              lambda m, val: validation_losses(m, val, cfg.eval.chunk))
    val, zero_loss = trained.val, trained.zero_loss
    final = predictions(model, val.tokens, cfg.eval.chunk)

    attention, origin, attention_init = attention_model(cfg, ctx)
    attention_val = validation_losses(attention, val, cfg.eval.chunk)
    ctx.log("attention_val_loss", attention_val["val_loss_context"], contextual="attention", **index)
    tasks = sample_prompts(cfg.dynamics.n_tasks, cfg.task.n_examples, cfg.task.d,
                           torch.Generator().manual_seed(cfg.dynamics.data_seed)).to(device, dtype)
    curves = {}  # (layer, variant) -> increments (tasks, N−1)
    models = {("rnn", "trained"): model, ("attention", "trained"): attention,
              ("rnn", "untrained"): rnn_init, ("attention", "untrained"): attention_init}
    with progress(len(models), "prefix patches") as bar:
        for (layer, variant), net in models.items():
            curves[layer, variant] = increments(net, tasks.tokens)
            for (task, i), v in np.ndenumerate(curves[layer, variant]):
                ctx.log("increment_norm_op2", v, context_length=i + 1, task=task, contextual=layer,
                        variant=variant, **index)
            summary = decay_summary(curves[layer, variant].mean(0), cfg.dynamics.tail_fraction)
            ctx.log_many(summary, contextual=layer, variant=variant, **index)
            bar.advance(1, info=f"{layer} {variant}")
    check_claims(ctx, cfg, dtype, final, zero_loss, curves, origin, attention_val["val_loss_context"])


def check_claims(ctx: RunContext, cfg: RnnContextConfig, dtype: torch.dtype, final: dict[str, torch.Tensor],
                 zero_loss: float, curves: dict[str, np.ndarray], origin: str, attention_loss: float) -> None:
    val = claim_losses_agree(ctx, dtype, "dherin.fig6.val_loss_context_equals_patch", SOURCE + " left/middle")
    eps = torch.finfo(dtype).eps
    y = final["context"].double()
    err = (final["patched"].double() - y).abs()
    ctrl = (final["no_context"].double() - y).abs()
    scale = max(1.0, float(y.abs().max()))
    ctx.check("dherin.fig6.patch_equals_context", SOURCE + " middle",
              "RNN contextual layer: |Φ_W(C,x) − Φ_(W+ΔW)(x)| on the validation set after training, max over tasks "
              "(bound 100 eps × max(1, max|ŷ|))", err.max(), "<=", 100 * eps * scale,
              measure="max |Φ_W(C, x) − Φ_(W+ΔW)(x)|")
    ctx.check("dherin.fig6.control_far_off", SOURCE + " (control)",
              "control (unpatched, no context) is worse than the patch by orders of magnitude "
              "(log10 ratio of mean |differences| on the validation set)",
              math.log10(float(ctrl.mean()) / max(float(err.mean()), 1e-300)), ">=", 3.0,
              measure="log10(control diff / patch error)")
    ctx.check("dherin.fig6.model_learned", SOURCE + " left",
              "the RNN model learned the task: final validation loss / zero-predictor loss",
              val.iloc[-1]["val_loss_context"] / zero_loss, "<=", 0.5, measure="val. loss / zero-predictor loss")
    pct = round(100 * cfg.dynamics.tail_fraction)
    ratio = {k: decay_summary(v.mean(0), cfg.dynamics.tail_fraction)["decay_ratio_tail_to_head"]
             for k, v in curves.items()}
    ctx.check("dherin.fig6.attention_model_learned", "Dherin §4.1",
              f"the attention model ({origin}) learned the task: its validation loss / zero-predictor loss",
              attention_loss / zero_loss, "<=", 0.1, measure="val. loss / zero-predictor loss")
    # Fig. 6's contrast (RNN increments stay, attention's vanish) holds at initialisation already (softmax
    # averaging decays whatever the weights): each claim is judged against the untrained models (same
    # architectures, same tasks); the raw tail/head ratios are in metrics.csv (decay_ratio_tail_to_head).
    contrast = {v: ratio["rnn", v] / ratio["attention", v] for v in ("trained", "untrained")}
    ctx.check("dherin.fig6.rnn_increments_do_not_decay", SOURCE + " right",
              f"RNN: the increments ‖(ΔW)_(i+1) − (ΔW)_i‖₂ do NOT decay where the attention model's do, and "
              f"training made that contrast: tail/head ratio (mean over the last {pct}% of i / the first {pct}%, "
              "mean over tasks) of the RNN over that of the attention model, trained over untrained, at least 2",
              contrast["trained"] / contrast["untrained"], ">=", 1 / LEARNED_DECAY_BAR,
              measure="(RNN ratio / attention ratio) trained / the same untrained")
    ctx.check("dherin.fig6.attention_increments_decay", SOURCE + " right (vs Fig 3)",
              f"attention ({origin}), same tasks: the increments decay because it learned: its tail/head ratio "
              "over the untrained attention model's, at most one half",
              ratio["attention", "trained"] / ratio["attention", "untrained"], "<=", LEARNED_DECAY_BAR,
              measure="tail/head ratio trained / tail/head ratio untrained")


# -- figure ---------------------------------------------------------------------------------------

LAYERS = {"rnn": dict(color="C3", label="RNN contextual layer"),
          "attention": dict(color="C0", ls="--", label="self-attention contextual layer")}


def plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    metrics = metrics.copy()
    # one series per (dtype, RNN nonlinearity) configuration; seeds are averaged
    metrics["config"] = metrics["dtype"].astype(str) + ", " + metrics["nonlinearity"].astype(str) + " RNN"
    fig, axes = new_figure(3, width=3.8, height=3.1)
    ax_loss, ax_close, ax_dw = axes[0]
    draw_loss_panels(ax_loss, ax_close, metrics[metrics["metric"] != "attention_val_loss"])
    inc = metric(metrics, "increment_norm_op2")
    if "variant" not in inc:  # runs from before the untrained controls
        inc = inc.assign(variant="trained")
    inc = inc.assign(variant=inc["variant"].fillna("trained"))
    for ci, config in enumerate(sorted(inc["config"].unique()) if not inc.empty else []):
        suffix = f" [{config}]" if inc["config"].nunique() > 1 else ""
        for (layer, style), variant in ((ls, v) for ls in LAYERS.items() for v in ("trained", "untrained")):
            s = inc[(inc["config"] == config) & (inc["contextual"] == layer) & (inc["variant"] == variant)]
            s = s[s["context_length"] > 2]  # as in the paper: context length i > 2
            if s.empty:
                continue
            agg = mean_sem(s, "context_length")  # over tasks (and seeds)
            color = style["color"] if ci == 0 else f"C{ci + 3}"
            trained = variant == "trained"
            label = style["label"] + ("" if trained else " (control: untrained)") + suffix
            mean_band(ax_dw, agg, "context_length", band=trained, band_alpha=0.25, color=color,
                      ls=style.get("ls", "-") if trained else ":", lw=1.2 if trained else 0.9,
                      alpha=1.0 if trained else 0.7, label=label)
    ax_dw.set(yscale="log", xlabel="context length i", ylabel=r"$\|(\Delta W)_{i+1} - (\Delta W)_i\|_2$",
              title="ΔW increments (mean ± s.e. over tasks)")
    if not inc.empty:
        ax_dw.legend(loc="lower left", fontsize=6.5)
    return save_figure(fig, figures_dir, "fig6_rnn_context")


def validate(cfg: RnnContextConfig) -> None:
    require_positive(cfg, "train.steps", "train.batch_size", "train.eval_every", "task.n_examples",
                     "eval.n_val_tasks", "eval.chunk", "dynamics.n_tasks", "attention.train.steps",
                     "attention.train.batch_size")
    if cfg.task.n_examples < 3:
        raise UserError(f"task.n_examples={cfg.task.n_examples}: Fig. 6 right needs contexts longer than 2")
    if not 0 < cfg.dynamics.tail_fraction <= 0.5:
        raise UserError(f"dynamics.tail_fraction={cfg.dynamics.tail_fraction} must be in (0, 0.5]")
    if cfg.attention.checkpoint:
        _, built = load_checkpoint(cfg.attention.checkpoint)
        if built.task.d != cfg.task.d:
            raise UserError(f"attention.checkpoint={cfg.attention.checkpoint} was trained with task.d={built.task.d}, "
                            f"not task.d={cfg.task.d}")
