"""gpt_wq — Karbevski & Mijoski §5.1, Table 2 and Fig. 1: nanoGPT's GPT-2 small trained from scratch in five
configurations (`variant=`), the reduced W_Q = I models against parameter-matched baselines.

One job trains one variant (`-m variant=a,b,...` sweeps them, and the sweep's combined figure is Fig. 1
plus Table 2); `variant=all` trains the five in one job and records the paper's comparisons as claims.
Parameter counts are checked at the paper's shape (meta device, no memory) whatever the preset trains.
The trained model is exported as a stock transformers GPT-2 checkpoint (hf/<variant>/) and its logits
compared with ours. Under torchrun the job is DDP (experiments.core.distributed).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from experiments.core import distributed
from experiments.core.config_schema import node_values
from experiments.core.errors import UserError
from experiments.core.gpu_rates import compile_missing
from experiments.core.progress import progress
from experiments.core.results import RunContext
from experiments.core.runtime import launched_elsewhere, resolve_device
from experiments.core.validation import require_positive
from experiments.data.cache import cache_root
from experiments.data.corpus import SOURCES, prepare, prepared_folder
from experiments.data.gpt2_bpe import TOKENIZERS, vocab_size_of
from experiments.data.token_bins import META, fixed_windows, is_prepared, load_bins
from experiments.karbevski.gpt import checkpoint as ckpt
from experiments.karbevski.gpt.comparisons import paper_comparisons
from experiments.karbevski.gpt.model import GPT, GPTConfig
from experiments.karbevski.gpt.params import count_formula, count_meta
from experiments.karbevski.gpt.plots import plot  # noqa: F401  (gpt_wq's figures: where the registry looks, run.py)
from experiments.karbevski.gpt.train import LoopState, TrainSettings, make_optimizer, precision, train
from experiments.karbevski.gpt.variants import VARIANTS, model_config
from experiments.karbevski.gpt_wq import GptWqConfig
from experiments.karbevski.schema import GptTrain, GptVariant

REF = "Karbevski & Mijoski §5.1, Table 2"
PAPER_SHAPE = GPTConfig()  # 12 layers, 12 heads, d_model 768, T 1024, vocabulary 50 304


def base_config(cfg: GptWqConfig) -> GPTConfig:
    m = cfg.model
    return GPTConfig(vocab_size=m.vocab_size, block_size=m.block_size, n_layer=m.n_layer, n_head=m.n_head,
                     d_model=m.d_model, mlp_hidden=4 * m.d_model)


def variant_names(cfg: GptWqConfig) -> list[str]:
    return list(VARIANTS) if cfg.variant == GptVariant.all else [cfg.variant.value]  # a name, as saved


def compile_setting(value, device_type: str) -> tuple[bool, str | None]:
    """train.compile (true, false or auto) for a run on `device_type`: whether to compile, and for auto
    where torch.compile cannot work here, why not (validate refuses true there)."""
    if str(value).lower() != "auto":
        return bool(value), None
    missing = compile_missing(device_type)
    return missing is None, missing and f"train.compile=auto: trained without torch.compile, which needs {missing}"


def settings(cfg: GptWqConfig, variant_name: str, device_type: str = "cpu") -> TrainSettings:
    """This rank's training loop: cfg.train with grad_accum split over the ranks and the variant's weight
    decay where the config leaves it null."""
    node = node_values(cfg.train, GptTrain)
    world = distributed.info().world_size
    wd = VARIANTS[variant_name].weight_decay if node["weight_decay"] is None else node["weight_decay"]
    compile_, _ = compile_setting(node["compile"], device_type)
    return TrainSettings(**node | {"grad_accum": node["grad_accum"] // world, "weight_decay": wd, "compile": compile_},
                         seed=cfg.seed, amp=amp_dtype(cfg))


def amp_dtype(cfg: GptWqConfig) -> torch.dtype | None:
    """dtype=bfloat16: bf16 autocast over float32 weights (the paper's mixed precision); float32: none."""
    return torch.bfloat16 if cfg.dtype.torch == torch.bfloat16 else None


def data_key(cfg: GptWqConfig) -> str:
    return cfg.data if cfg.data != "text_file" else f"text_file:{cfg.text_file}"


def identity_of(cfg: GptWqConfig, name: str) -> dict:
    return ckpt.describe(name, model_config(VARIANTS[name], base_config(cfg)), cfg.tokenizer, data_key(cfg))


def checkpoint_dir(run_dir: Path, name: str) -> Path:
    return Path(run_dir) / "checkpoints" / name


def resume_path(cfg: GptWqConfig, name: str) -> str:
    """resume= names a run folder (its checkpoints/<variant>/) or one checkpoint file."""
    p = Path(cfg.resume).expanduser()
    if (checkpoint_dir(p, name) / ckpt.CKPT).is_file():
        return str(checkpoint_dir(p, name))
    if (p / "checkpoints").is_dir():
        held = sorted(d.name for d in (p / "checkpoints").iterdir() if (d / ckpt.CKPT).is_file())
        raise UserError(f"resume={cfg.resume}: the folder holds checkpoints of another variant ({', '.join(held)}), "
                        f"not {name}")
    return str(p)


def load_data(cfg: GptWqConfig):
    cache = cache_root(cfg.cache_dir)
    folder = prepared_folder(cfg.data, cfg.tokenizer, cache, cfg.text_file)
    if distributed.is_main_process():
        prepare(cfg.data, cfg.tokenizer, cache, cfg.text_file, cfg.val_fraction)
    else:
        distributed.wait_for(folder / META)
    return load_bins(folder)


def log_parameter_counts(ctx: RunContext, name: str, model_cfg: GPTConfig) -> None:
    v = VARIANTS[name]
    paper_shape = model_config(v, PAPER_SHAPE)
    counted = count_meta(paper_shape)  # the real module on the meta device: no memory, any laptop
    here = count_meta(model_cfg)
    ctx.log_many({"params_total_paper_shape": counted["total"], "params_non_embedding_paper_shape":
                  counted["non_embedding"], "params_total": here["total"], "params_non_embedding":
                  here["non_embedding"], "mlp_mult": v.mlp_mult, "d_model": model_cfg.d_model,
                  "head_dim": model_cfg.head_dim, "attn_scale": model_cfg.attn_scale,
                  "query_identity": float(v.query == "identity"), "paper_val_loss": v.paper_val_loss},
                 variant=name)
    for key, paper in (("total", v.paper_total_m), ("non_embedding", v.paper_non_embedding_m)):
        ctx.check(f"karbevski.table2.{key}_params.{name}", REF,
                  f"{key.replace('_', '-')} parameters of the {v.label} model at the paper's shape, counted on "
                  f"the meta device, in millions (Table 2 rounds to 0.01M)",
                  counted[key] / 1e6, "within", 0.005, paper_value=paper)
    # the closed formula must agree with the module it describes (an independent count)
    ctx.log("params_formula_minus_module", count_formula(paper_shape)["total"] - counted["total"], variant=name)


def train_variant(cfg: GptWqConfig, ctx: RunContext, name: str, data, device: torch.device) -> float:
    me = distributed.info()
    train_data, val_data, meta = data
    model_cfg = model_config(VARIANTS[name], base_config(cfg))
    log_parameter_counts(ctx, name, model_cfg)
    s = settings(cfg, name, device.type)
    why = compile_setting(cfg.train.compile, device.type)[1]
    if why and why not in ctx.notes:
        ctx.notes.append(why)
    ctx.log("weight_decay", s.weight_decay, variant=name)
    starts = fixed_windows(len(val_data), model_cfg.block_size, cfg.train.val_windows, seed=cfg.train.val_seed)
    torch.manual_seed(cfg.seed)  # every variant starts from its own seeded init, the same on every rank
    model = GPT(model_cfg).to(device)
    optimizer = make_optimizer(model, s, device)
    identity = identity_of(cfg, name)
    state = LoopState(step=0, curve=[])
    if cfg.resume:
        saved = ckpt.load(resume_path(cfg, name), identity, map_location=device)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = LoopState(step=int(saved["step"]), curve=list(saved["curve"]))
        for metric, value, step in state.curve:  # the curve so far, so this run's metrics.csv is whole
            ctx.log(metric, value, step=step, variant=name)

    def log(metric: str, value: float, step: int) -> None:
        ctx.log(metric, value, step=step, variant=name)
        state.curve.append((metric, float(value), int(step)))

    def save(step: int) -> None:
        if me.is_main:
            ckpt.save(checkpoint_dir(ctx.run_dir, name), identity, step, model, optimizer, state.curve)

    t0 = time.perf_counter()
    todo = max(s.steps - state.step, 0)
    args = (model, optimizer, s, train_data, val_data, starts, model_cfg.block_size, device, state, log, save)
    if me.is_main:
        with progress(todo, f"gpt_wq {name}") as bar:
            train(*args, bar)
    else:
        train(*args)  # rank 0 shows the progress
    ctx.log("wall_s", time.perf_counter() - t0, variant=name)
    val = [(step, value) for metric, value, step in state.curve if metric == "val_loss"]
    final = max(val)[1]
    # the tokenizer beside the loss: a byte-level run's loss is per byte, not per GPT-2 token (the figure's unit)
    ctx.log("final_val_loss", final, variant=name, step=max(val)[0], tokenizer=cfg.tokenizer)
    if me.is_main and cfg.export_hf:
        export_and_compare(ctx, name, model, meta, cache_root(cfg.cache_dir))
    return final


def export_and_compare(ctx: RunContext, name: str, model: GPT, meta: dict, cache: Path) -> None:
    """hf/<variant>/: the model as stock transformers GPT-2 plus its tokenizer (AutoTokenizer loads it)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from experiments.data.hf_tokenizer import hf_tokenizer
    from experiments.karbevski.gpt.export import export

    hf_logging.disable_progress_bar()
    eot = vocab_size_of(meta["tokenizer"]) - 1
    folder = export(model.float().cpu().eval(), ctx.path(f"hf/{name}"), eot=eot)
    hf_tokenizer(meta["tokenizer"], cache).save_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    idx = torch.randint(0, eot, (2, min(model.cfg.block_size, 64)), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(idx)[0]
        theirs = hf(idx).logits
    scale = ours.abs().max().item()
    ctx.check(f"karbevski.export.gpt2_logits_match.{name}", "icl-exp (transformers export)",
              "the exported stock transformers GPT-2 checkpoint reproduces the trained model's logits (max |Δ| "
              "relative to the largest logit)", (ours - theirs).abs().max().item() / max(scale, 1e-12), "<=", 1e-5)


def run(cfg: GptWqConfig, ctx: RunContext) -> None:
    require_cuda(cfg, ctx.device.type == "cuda")  # also in a SLURM job, whose node the CLI could not check
    distributed.init()
    device = distributed.local_device(ctx.device)
    ctx.precision = precision(amp_dtype(cfg))  # run.json: what the training ran in
    data = load_data(cfg)
    if data[2]["tokenizer"] != cfg.tokenizer:
        raise UserError(f"prepared data uses tokenizer {data[2]['tokenizer']}, not {cfg.tokenizer}")
    ctx.log("world_size", distributed.info().world_size)
    ctx.log("train_tokens", len(data[0]))
    ctx.log("val_tokens", len(data[1]))
    finals = {name: train_variant(cfg, ctx, name, data, device) for name in variant_names(cfg)}
    for row in paper_comparisons(finals):  # only when the job trained the variants compared
        ctx.check(row["id"], row["ref"], row["description"], row["measured"], row["comparison"], row["tolerance"],
                  paper_value=row["paper_value"])


def check_compile(cfg: GptWqConfig) -> None:
    """train.compile is true, false or auto; true where torch.compile cannot work here is one line (auto
    falls back to eager training instead). A SLURM job's node is not this machine: not checked here."""
    value = cfg.train.compile
    if not isinstance(value, bool) and str(value).lower() != "auto":
        raise UserError(f"train.compile={value} must be true, false or auto")
    if value is True and not launched_elsewhere():
        missing = compile_missing(resolve_device(cfg.device).type)
        if missing:
            raise UserError(f"train.compile=true: torch.compile needs {missing}, not found here; use "
                            f"train.compile=auto (compiles where it can, else trains eagerly) or train.compile=false")


def require_cuda(cfg: GptWqConfig, cuda: bool) -> None:
    if cfg.require_gpu and not cuda:
        tokens = cfg.train.steps * cfg.train.micro_batch * cfg.train.grad_accum * cfg.model.block_size
        raise UserError(f"preset={cfg.preset} trains on {tokens / 1e9:.3g}B tokens per variant and needs CUDA "
                        f"GPUs (e.g. torchrun --nproc_per_node=8 -m cli.main run gpt_wq ...); none here. Use "
                        f"preset=cpu, or require_gpu=false to insist")


def validate(cfg: GptWqConfig) -> None:
    if cfg.dtype.torch not in (torch.float32, torch.bfloat16):
        raise UserError(f"gpt_wq trains in dtype=float32 or dtype=bfloat16 (autocast over float32 weights, the "
                        f"paper's), not dtype={cfg.dtype}: float16 would need loss scaling")
    require_positive(cfg, "model.n_layer", "model.n_head", "model.d_model", "model.block_size", "model.vocab_size",
                     "train.micro_batch", "train.grad_accum", "train.eval_every", "train.log_every",
                     "train.checkpoint_every", "train.val_windows", "train.eval_batch")
    if cfg.train.steps < 0 or cfg.train.warmup_steps < 0:
        raise UserError("train.steps and train.warmup_steps must be at least 0")
    if cfg.model.d_model % cfg.model.n_head:
        raise UserError(f"model.d_model={cfg.model.d_model} is not divisible by model.n_head={cfg.model.n_head}")
    if cfg.tokenizer not in TOKENIZERS:
        raise UserError(f"tokenizer={cfg.tokenizer} is not one of {', '.join(TOKENIZERS)}")
    if cfg.data not in SOURCES:
        raise UserError(f"data={cfg.data} is not one of {', '.join(SOURCES)}")
    if cfg.model.vocab_size < vocab_size_of(cfg.tokenizer):
        raise UserError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the {cfg.tokenizer} tokenizer's "
                        f"{vocab_size_of(cfg.tokenizer)}")
    world = distributed.info().world_size
    if cfg.train.grad_accum % world:
        raise UserError(f"train.grad_accum={cfg.train.grad_accum} (micro-batches per step over all ranks) is not "
                        f"divisible by the {world} ranks")
    if cfg.train.decay_steps is not None and cfg.train.decay_steps < cfg.train.warmup_steps:
        raise UserError(f"train.decay_steps={cfg.train.decay_steps} is shorter than the warmup")
    if not launched_elsewhere():  # a SLURM job checks on its own node (run)
        require_cuda(cfg, torch.cuda.is_available())
    check_compile(cfg)
    if cfg.data == "openwebtext":
        folder = prepared_folder("openwebtext", cfg.tokenizer, cache_root(cfg.cache_dir))
        if not is_prepared(folder):
            from experiments.data.openwebtext import HUB_HOST, hub_reachable

            try:
                import datasets  # noqa: F401
            except ImportError:
                raise UserError("data=openwebtext needs the `datasets` package: pip install 'icl-exp[owt]' "
                                "(or use the offline corpus data=shakespeare)") from None
            if not hub_reachable():
                raise UserError(f"data=openwebtext is not prepared in {folder} and {HUB_HOST} is unreachable: "
                                f"prepare it on a machine with a network and copy the folder, or use data=shakespeare")
    if cfg.resume:
        for name in variant_names(cfg):
            ckpt.check_compatible(resume_path(cfg, name), identity_of(cfg, name))
