"""Karbevski & Mijoski, *W_K, W_V is probably all you need*: W_Q = I reparametrizations, the attention
scale, MLP basis transfer, GPT pretraining."""
