"""Performer / FAVOR+ (Choromanski et al., "Rethinking Attention with Performers", ICLR 2021).

A baseline of the Skeinformer paper (Chen, Zeng et al., NAACL 2022; its appendix: 256 features).
Section numbers refer to the Performer paper (arXiv 2009.14794). softmax(Q K^T * scaling) V is estimated with
positive random features (section 2.3, Lemma 1)::

    exp(x^T y) = E_w[phi(x)^T phi(y)],  phi(x) = exp(w^T x - |x|^2 / 2) / sqrt(m),  w ~ N(0, I_d)
    out = D^-1 phi(Q) (phi(K)^T V),  D = diag(phi(Q) (phi(K)^T 1))   # section 2.2, O(n m d)

with q and k each multiplied by scaling**0.5 (d^-1/4), so that x^T y = q^T k * scaling, and the
m projections w drawn as orthogonal random features (paper section 2.4): blocks of d mutually
orthogonal directions whose norms follow the chi distribution of a Gaussian vector's norm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..registry import register_method
from .base import AttentionMethod, MethodOptions, Paper, check_int, compute_dtype, seed_field

#: Added to every feature (the official code's ``numerical_stabilizer`` passed to its positive
#: softmax features in ``make_fast_softmax_attention``); keeps the normaliser positive.
FEATURE_EPS = 1e-6


@dataclass
class PerformerOptions(MethodOptions):
    num_features: int = field(
        default=256,
        metadata={"help": ("m (official `nb_features=256`, also Performer's setting in the Skeinformer paper's appendix).")},
    )
    seed: int = seed_field()
    redraw: bool = field(
        default=False,
        metadata={
            "help": (
                "Redraw the features at every training forward (official `redraw_features`); eval always uses the fixed ones."
            )
        },
    )

    def validate(self) -> None:
        check_int("num_features", self.num_features, 1)
        check_int("seed", self.seed, 0)
        if not isinstance(self.redraw, bool):
            raise ValueError(f"option 'redraw' must be True or False, got {self.redraw!r}")


def orthogonal_gaussian_features(
    num_features: int,
    dim: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """(num_features, dim) orthogonal random features (Performer section 2.4).

    Rows come in blocks of ``dim`` exactly orthogonal directions (the last block truncated),
    each block a Haar-random orthogonal matrix; every row is then rescaled to the norm of an
    independent N(0, I_dim) vector, so each row is marginally N(0, I_dim) and the estimator of
    Lemma 1 stays unbiased (official ``GaussianOrthogonalRandomMatrix`` with ``scaling=0``).
    """
    num_blocks = math.ceil(num_features / dim)
    gaussian = torch.randn(num_blocks, dim, dim, generator=generator, device=device)
    q, r = torch.linalg.qr(gaussian)
    # Sign fix: make diag(R) positive so that Q is exactly Haar distributed (plain QR is not).
    signs = torch.where(torch.diagonal(r, dim1=-2, dim2=-1) < 0, -1.0, 1.0)
    directions = (q * signs.unsqueeze(-2)).transpose(-1, -2).reshape(num_blocks * dim, dim)[:num_features]
    norms = torch.randn(num_features, dim, generator=generator, device=device).norm(dim=1)
    return directions * norms.unsqueeze(1)


def positive_random_features(
    x: torch.Tensor, features: torch.Tensor, is_query: bool, key_padding_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """exp(w^T x - |x|^2/2 - c) + eps for x (B, H, N, d) -> (B, H, N, m), i.e. phi(x) up to factors
    that cancel in D^-1 (phi(Q) phi(K)^T) V: the 1/sqrt(m) of Lemma 1 and exp(-c).

    The shift c (official code) is, for queries, the max over the row, for keys the max over all
    real keys of each (batch, head). Our choice: c is the max of the whole exponent
    w^T x - |x|^2/2 (the official code takes the max of w^T x only), so the largest feature is
    exactly 1 and neither underflows nor lets eps become a sizeable bias. c is detached (it is a
    constant of the estimator); a key's own |k|^2/2 is part of phi(k) and keeps its gradient.
    Padded keys get features 0 and do not enter c.
    """
    projected = x @ features.transpose(0, 1)
    if is_query:
        # |x|^2/2 and the row max are constant along the row: they cancel in D^-1.
        offset = projected.detach().amax(dim=-1, keepdim=True)
    else:
        half_norm = x.square().sum(-1, keepdim=True) / 2
        row_max = (projected - half_norm).detach().amax(dim=-1, keepdim=True)  # (B, H, N, 1)
        if key_padding_mask is not None:
            row_max = row_max.masked_fill(~key_padding_mask[:, None, :, None], float("-inf"))
        offset = half_norm + row_max.amax(dim=-2, keepdim=True)
    phi = torch.exp(projected - offset) + FEATURE_EPS
    if not is_query and key_padding_mask is not None:
        phi = phi.masked_fill(~key_padding_mask[:, None, :, None], 0.0)
    return phi


@register_method
class Performer(AttentionMethod):
    """FAVOR+ linear attention with positive orthogonal random features."""

    name = "performer"
    paper = Paper("Rethinking Attention with Performers", "Choromanski et al., ICLR 2021", "2009.14794")
    cost = "O(n r d)"
    budget_option = "num_features"
    options_cls = PerformerOptions
    samples = True  # random features (fixed from ``seed``; redrawn in training with ``redraw``)

    def seeded_draws(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        # Regenerated from ``seed`` (saved in config.attn_config), so checkpoints stay free of extra
        # tensors. One matrix per layer, shared by the heads, as in the official code.
        return {"features": orthogonal_gaussian_features(self.options.num_features, self.shape.head_dim, generator)}

    def attend(self, q, k, v, key_padding_mask, scaling):
        dtype = compute_dtype(q)  # exponentials and the normaliser need fp32 under fp16/bf16
        if self.options.redraw and self.training:
            features = orthogonal_gaussian_features(self.options.num_features, q.shape[-1], device=q.device)
        else:
            features = self.features
        features = features.to(device=q.device, dtype=dtype)
        data_scale = scaling**0.5  # each of q, k gets scaling^(1/2): x^T y = q^T k * scaling
        phi_q = positive_random_features(q.to(dtype) * data_scale, features, is_query=True)
        phi_k = positive_random_features(k.to(dtype) * data_scale, features, False, key_padding_mask)
        context = phi_k.transpose(-1, -2) @ v.to(dtype)  # phi(K)^T V: (B, H, m, D)
        normaliser = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)  # phi(Q) phi(K)^T 1: (B, H, N, 1)
        # Guards only the degenerate all-padded row (its output is zeroed by the base class).
        return (phi_q @ context) / normaliser.clamp_min(torch.finfo(dtype).tiny)
