"""The MoE rule's least-squares fit builds its router-weight matrix where the experts are: made on the CPU,
context_compile and system_compile died on CUDA for every MoE model. No second real device here: the meta
device stands in (shapes only), with tiny-mixtral's experts module and adapter."""

from __future__ import annotations

import torch

from experiments.patching.arch import mixtral
from experiments.patching.rules.moe import MixtureOfExperts


def test_the_moe_fit_runs_where_the_experts_are():
    from experiments.patching.load import load_checked

    adapter = mixtral.ADAPTER
    layer = adapter.layers(load_checked("tiny-mixtral", torch.float64).model)[0]
    experts = layer.get_submodule(adapter.output_param.rsplit(".", 1)[0]).to("meta")
    P = experts.get_parameter(adapter.output_param.rsplit(".", 1)[1])
    E, d = P.shape[0], P.shape[1]
    k = 3
    hidden = torch.empty(k, d, dtype=torch.float64, device="meta")
    index = torch.zeros(k, 2, dtype=torch.long, device="meta")
    weights = torch.empty(k, 2, dtype=torch.float64, device="meta")
    R = torch.empty(k, d, dtype=torch.float64, device="meta")
    delta, fitted = MixtureOfExperts().fit_positions(adapter, experts, P, (hidden, index, weights), {}, R)
    assert delta.device.type == "meta" and fitted.device.type == "meta"
    assert delta.shape[0] == E and fitted.shape == R.shape
