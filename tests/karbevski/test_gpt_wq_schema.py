"""gpt_wq's typed schema names the variants gpt/variants.py defines, and rejects the others while
composing."""

from __future__ import annotations

from experiments.karbevski.gpt.variants import VARIANTS
from experiments.karbevski.schema import GptVariant


def test_schema_variants_are_table_2s():
    assert [v.value for v in GptVariant] == [*VARIANTS, "all"]


def test_a_variant_that_does_not_exist_fails_while_composing():
    import pytest

    from cli.overrides import validate
    from experiments.core.errors import UserError

    with pytest.raises(UserError, match="variant='baseline' is not one of baseline_small_mlp, .*, all"):
        validate("gpt_wq", ["preset=smoke", "variant=baseline"], multirun=False)


def test_train_settings_are_the_schema_node_resolved(monkeypatch):
    """TrainSettings is built on the `train:` node's schema (GptTrain), not copied from it field by field:
    every key of the node reaches the loop, grad_accum is split over the ranks, a null weight decay
    becomes the variant's and a null decay horizon the run's length."""
    from dataclasses import fields

    from cli.overrides import validate
    from experiments.core import distributed
    from experiments.karbevski.gpt.train import TrainSettings
    from experiments.karbevski.gpt_wq import run as gpt_wq
    from experiments.karbevski.schema import GptTrain

    assert issubclass(TrainSettings, GptTrain)
    cfg = validate("gpt_wq", ["preset=smoke", "train.grad_accum=4", "train.decay_steps=null",
                              "train.weight_decay=null", "train.beta2=0.9"], multirun=False)
    monkeypatch.setattr(distributed, "info", lambda: distributed.DistInfo(rank=0, local_rank=0, world_size=2))
    s = gpt_wq.settings(cfg, "baseline_124m")
    assert {f.name for f in fields(GptTrain)} <= {f.name for f in fields(s)}
    assert (s.grad_accum, s.decay_steps, s.beta2) == (2, cfg.train.steps, 0.9)
    assert s.weight_decay == VARIANTS["baseline_124m"].weight_decay
    assert s.eval_batch == cfg.train.eval_batch and s.compile == cfg.train.compile
