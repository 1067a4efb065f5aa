"""MRA-2 and MRA-2-s (Zeng et al., "Multi Resolution Analysis (MRA) for Approximate Self-Attention",
ICML 2022): masked block means and block-level scores (section 4.1, eqs. 10-12), the budget's
selection of block pairs (Alg. 1 with R = {b, 1}), and the output (Alg. 2, eqs. 13-14, 17-18): exact
attention in the selected blocks merged with the low-resolution part by their log-sum-exps.

The exact part runs on one of three backends: ``gather`` (:mod:`.gather`), ``pairs``
(:mod:`.pairs`) or ``flex`` (:mod:`.flex`); the ``triton`` backend (:mod:`.triton`, its kernels in
:mod:`.triton_kernels`) runs the whole call, selection included, in its own fused kernels. ``auto`` runs ``triton`` on CUDA
where it supports the inputs, else ``pairs``, and ``gather`` elsewhere. What each computes, the
choices made where the paper is vague (ranking, ties, priors, padding), compilation and export:
docs/methods/mra.md.
"""

from .method import Mra2, Mra2Sparse
from .options import MraOptions

__all__ = ["Mra2", "Mra2Sparse", "MraOptions"]
