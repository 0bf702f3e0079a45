"""Xu & Fang, "Self-attention as a covariance readout": the math, in small pure functions.

streams       stationary elliptical inputs: i.i.d. Gaussian x = Bz, Gaussian AR(1), ICL tasks
attention     the frozen single-head causal softmax head, its prefix readout, Θ_V Σ Θ_Kᵀ Θ_Q x
gd            the selector head of Cor. 4.1, the residual stack of Eq. 3, the population iterate B^(K)
closed_forms  γ_Σ = 1/√d_k, m_x(q) = Σ Θ_Kᵀ q / √d_k, Σ_wu = βᵀ Σ_uu, the i.i.d. rate constant
collapse      the L-layer stack of §5 and the context-free map F^(L) of Eq. 6
fitting       log-log slope fits and geometric grids

Tokens are rows here (the paper writes them as columns): a stream is (batch, T, d).
"""
