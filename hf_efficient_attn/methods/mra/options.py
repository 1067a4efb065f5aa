"""MRA-2's options (``attn_config``): the block size, the budget, the priors and the backend."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..base import MethodOptions, check_choice, check_int

BACKENDS = ("auto", "flex", "gather", "pairs", "triton")


@dataclass
class MraOptions(MethodOptions):
    block_size: int = field(
        default=32,
        metadata={
            "help": (
                "b in R = {b, 1} (section 5; 32 is the paper's and the only size of the official CUDA kernels). Any "
                "positive integer works (exact at full budget for 1, 7 and 64, tested); a smaller b makes the (n/b)² part dearer."
            )
        },
    )
    block_per_row: int = field(
        default=4,
        metadata={
            "help": (
                "Exact blocks per query block on average (the budget of Alg. 1); 4 = Transformers' `MraConfig` default and "
                "the official RoBERTa-512 config. The official 4096-token runs use 16 with priors "
                "(`configs/methods/mra2-4096.json`)."
            )
        },
    )
    initial_prior_first_n_blocks: int = field(
        default=0,
        metadata={
            "help": (
                'Alg. 1 "prespecified via priors": the first n query-block rows and key-block columns (global tokens); '
                "0 = off, as in `MraConfig`."
            )
        },
    )
    initial_prior_diagonal_n_blocks: int = field(
        default=0, metadata={"help": ("Priors on the band |x − y| ≤ n // 2 around the diagonal; 0 = off, as in `MraConfig`.")}
    )
    backend: str = field(
        default="auto",
        metadata={
            "help": (
                '`"gather"` (plain PyTorch, training and inference), `"pairs"` (plain PyTorch, static shapes), '
                '`"flex"` (compiled FlexAttention, inference on CPU), `"triton"` (fused Triton kernels, CUDA) or `"auto"` '
                "(on CUDA `triton` where it supports the inputs, else `pairs`; `gather` elsewhere)."
            )
        },
    )

    def validate(self) -> None:
        check_int("block_size", self.block_size, 1)
        check_int("block_per_row", self.block_per_row, 1)
        check_int("initial_prior_first_n_blocks", self.initial_prior_first_n_blocks, 0)
        check_int("initial_prior_diagonal_n_blocks", self.initial_prior_diagonal_n_blocks, 0)
        check_choice("backend", self.backend, BACKENDS)
