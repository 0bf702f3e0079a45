"""An RNN as the contextual layer (Dherin et al. App. D.1): Φ = φ_W ∘ RNN.

A(C, x) = R h_T + r with h_t = σ(W_ih z_t + b_ih + W_hh h_{t−1} + b_hh), h_0 = 0: torch.nn.RNN
(one layer, feature dimension d_model = 64, σ = ReLU or tanh) followed by a linear read-out R back to
the token width d+1. The paper's W ∈ R^{d_mlp × (d+1)} says the MLP reads (d+1)-wide vectors, so the RNN's
state must be read out to that width; a linear map is the least that does it. The layer maps
(B, T, d+1) to (B, T, d+1) and reads causally (position t sees z_1..z_t), like the attention layer,
so `ContextualBlock`, the rank-1 patch and the prefix dynamics apply to it unchanged.

The paper says "an RNN" and no more. σ matters for whether it learns: the prediction ωᵀx_query is a
product of the context and the query, and it must pass the (d+1)-wide read-out, so the RNN itself
has to form it. tanh is odd, so near its operating point it has no second-order term to make
products from, and at the paper's learning rate it stayed at the zero predictor (measured: 4,000
steps at N = 200 and 3,000 at N = 20 without any progress); ReLU learned (val loss / zero-predictor
loss 0.12 after 2,000 steps at N = 20). Both are available (`model.nonlinearity`).

torch.nn.RNN is the fused library kernel (fast to train on CPU) but has no vmap rule, so the layer
says `supports_vmap = False` and a patched RNN block is run task by task (patching.linreg.forward_with).
"""

from __future__ import annotations

from torch import Tensor, nn

from experiments.dherin.models.linreg import MLP, ContextualBlock


class RNNContextual(nn.Module):
    """A(z_1..z_T) at every position t: R h_t + r, the read-out of the RNN state after z_t."""

    supports_vmap = False  # aten::rnn_relu / rnn_tanh have no batching rule

    def __init__(self, d_in: int, d_model: int = 64, nonlinearity: str = "relu"):
        super().__init__()
        self.rnn = nn.RNN(d_in, d_model, nonlinearity=nonlinearity, batch_first=True)
        self.read_out = nn.Linear(d_model, d_in)

    def forward(self, tokens: Tensor) -> Tensor:
        states, _ = self.rnn(tokens)  # (B, T, d_model), h_0 = 0
        return self.read_out(states)


def rnn_block(d: int, d_model: int = 64, d_mlp: int = 128, nonlinearity: str = "relu") -> ContextualBlock:
    """App. D.1's model for inputs of dimension d: φ_W(z) = W′ReLU(Wz + b) + b′ on RNN(z), no MLP skip."""
    d_in = d + 1
    return ContextualBlock(RNNContextual(d_in, d_model, nonlinearity), MLP(d_in, d_mlp, d_in))
