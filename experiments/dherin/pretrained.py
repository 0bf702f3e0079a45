"""The single-layer linear-regression block as a pretrained model: built from its config, trained,
evaluated both ways, saved, and loaded again.

linreg_icl trains it and saves RUN_DIR/model.pt; dw_convergence, finetune_compare, factorization and
rnn_context take it from there (`checkpoint=PATH`) or train the same model themselves.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from experiments.core.atomic import write_atomic
from experiments.core.chunks import in_chunks
from experiments.core.errors import UserError
from experiments.core.results import RunContext
from experiments.core.runtime import dtype_name
from experiments.dherin.models.linreg import ContextualBlock, attention_block
from experiments.dherin.patched_forward import predictions_three_ways
from experiments.dherin.training import regression_loss, train_validated, validation_set, zero_predictor_loss


def build_model(cfg: DictConfig) -> ContextualBlock:
    m = cfg.model
    return attention_block(cfg.task.d, d_model=m.d_model, n_heads=m.n_heads, d_mlp=m.d_mlp,
                           mlp_skip=m.mlp_skip, attn_skip=m.attn_skip)


@torch.no_grad()
def predictions(model: ContextualBlock, tokens: torch.Tensor, chunk: int) -> dict[str, torch.Tensor]:
    """ŷ with the context, via ΔW without it, and the control, for every prompt (in chunks)."""
    return in_chunks(lambda t: predictions_three_ways(model, t), tokens, chunk)


def loss_summary(preds: dict[str, torch.Tensor], targets: torch.Tensor) -> dict[str, float]:
    """The three validation losses and the largest |ŷ_ctx − ŷ_ΔW|."""
    out = {f"val_loss_{k}": regression_loss(v, targets).item() for k, v in preds.items()}
    out["val_max_abs_diff"] = (preds["context"] - preds["patched"]).abs().max().item()
    return out


def validation_losses(model: ContextualBlock, val, chunk: int) -> dict[str, float]:
    return loss_summary(predictions(model, val.tokens, chunk), val.targets)


def save_checkpoint(model: ContextualBlock, cfg: DictConfig, path: Path) -> None:
    """Weights + the config that built them, so later experiments can load them (checkpoint=PATH)."""
    blob = {"state_dict": {k: v.cpu() for k, v in model.state_dict().items()},
            "task": dataclasses.asdict(cfg.task), "model": dataclasses.asdict(cfg.model)}
    write_atomic(path, lambda p: torch.save(blob, p))




def checkpoint_file(path: str | Path) -> Path:
    """RUN_DIR/model.pt for a linreg_icl run folder, or the file itself."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "model.pt"
    if not p.is_file():
        raise UserError(f"checkpoint={path}: no such file (give a linreg_icl run folder or its model.pt)")
    return p


def load_checkpoint(path: str | Path) -> tuple[ContextualBlock, DictConfig]:
    """The model saved by linreg_icl.save_checkpoint, and the task/model config that built it."""
    file = checkpoint_file(path)
    try:
        blob = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # a corrupt or foreign file: say so in one line
        raise UserError(f"checkpoint={path}: not a linreg_icl checkpoint ({type(err).__name__})") from None
    if not isinstance(blob, dict) or not {"state_dict", "task", "model"} <= blob.keys():
        raise UserError(f"checkpoint={path}: not a linreg_icl checkpoint (expected keys state_dict, task, model)")
    built = built_config(blob["task"], blob["model"])
    model = build_model(built)
    try:
        model.load_state_dict(blob["state_dict"])
    except RuntimeError as err:
        raise UserError(f"checkpoint={path}: weights do not fit the saved model config ({err})") from None
    return model, built


def built_config(task, model) -> DictConfig:
    """The task and model config that build a block (`task`, `model`: the typed config's nodes, or a
    checkpoint's dicts), as a checkpoint keeps it and load_checkpoint returns it."""
    def plain(node) -> dict:
        return dataclasses.asdict(node) if dataclasses.is_dataclass(node) else node

    return OmegaConf.create({"task": plain(task), "model": plain(model)})


def validate_checkpoint(cfg) -> None:
    if cfg.checkpoint:
        _, built = load_checkpoint(cfg.checkpoint)
        if built.task.d != cfg.task.d:
            raise UserError(f"checkpoint={cfg.checkpoint} was trained with task.d={built.task.d}, "
                            f"not task.d={cfg.task.d}; pass task.d={built.task.d}")


def pretrained_block(cfg: DictConfig, ctx: RunContext) -> tuple[ContextualBlock, DictConfig]:
    """checkpoint=PATH loaded, or linreg_icl's model trained here exactly as linreg_icl trains it
    (same seed → same weights), saved to RUN_DIR/model.pt so the next run can load it. Returns the
    model (eval mode, frozen) and the task/model config that built it.

    Validation losses are logged (at every checkpoint, or once at step −1 for a loaded model) and
    one claim checks the model learned the task, whichever way it came.
    """
    index = dict(seed=cfg.seed, dtype=dtype_name(ctx.dtype))

    def losses(model: ContextualBlock, val) -> dict[str, float]:
        return validation_losses(model, val, cfg.eval.chunk)

    built = built_config(cfg.task, cfg.model)
    if cfg.checkpoint:
        model, built = load_checkpoint(cfg.checkpoint)
        model = model.to(ctx.device, ctx.dtype).eval()
        val = validation_set(cfg, ctx.device, ctx.dtype)
        ctx.log_many(losses(model, val), step=-1, **index)  # step −1: loaded, not trained here
    else:
        torch.manual_seed(cfg.seed)
        model = build_model(cfg).to(ctx.device, ctx.dtype)
        val = train_validated(model, cfg, ctx, index, losses).val
        save_checkpoint(model, cfg, ctx.path("model.pt"))
    for p in model.parameters():
        p.requires_grad_(False)
    final = losses(model, val)["val_loss_context"]
    ctx.check("dherin.sec4_1.model_learned", "Dherin §4.1",
              "the model learned the task: validation loss with context / zero-predictor loss",
              final / zero_predictor_loss(val), "<=", 0.1, measure="val. loss / zero-predictor loss")
    return model, built


def untrained_block(built: DictConfig, seed: int, ctx: RunContext) -> ContextualBlock:
    """The control: the same architecture at its initialization (as linreg_icl builds it for `seed`)."""
    torch.manual_seed(seed)
    init = build_model(built).to(ctx.device, ctx.dtype).eval()
    for p in init.parameters():
        p.requires_grad_(False)
    return init
