"""The budgets each method is measured at: the values of its budget option (the method class's
``budget_option``) at a sequence length, and the comparable budget size d of the Skeinformer paper
(Chen, Zeng et al., NAACL 2022: sampled rows/columns, features, landmarks)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

from ...registry import get_method_class, list_methods

#: Budget sizes d of the Skeinformer paper, section 5: "from 2^3 to 2^8" sampled columns / rows / features /
#: projection dimension.
SIZES = (8, 16, 32, 64, 128, 256)
#: MRA-2 budgets: high-resolution blocks per block row (MRA paper, Alg. 1); the default is 4.
MRA_BLOCKS = (1, 2, 4, 8, 16, 32)
#: YOSO budgets: number of hashes m (YOSO paper); the default is 32.
YOSO_HASHES = (4, 8, 16, 32, 64, 128)


def _sizes(seq_len: int) -> list[int]:
    return [d for d in SIZES if d < seq_len]


def _informer_factors(seq_len: int) -> list[float]:
    """Informer's ``factor`` c giving u = ceil(c ceil(ln n)) = d selected queries, for each d."""
    return [(d - 0.5) / math.ceil(math.log(seq_len)) for d in _sizes(seq_len)]


def _informer_size(factor: float, seq_len: int) -> int:
    return min(seq_len, math.ceil(factor * math.ceil(math.log(seq_len))))


def _mra_blocks(seq_len: int, block_size: int = 32) -> list[int]:
    return [b for b in MRA_BLOCKS if b < -(-seq_len // block_size)]  # all blocks = exact


def _identity(value: Any, seq_len: int) -> Any:
    return value


@dataclass(frozen=True)
class BudgetOption:
    """How a budget option is swept: its values at a sequence length, and the comparable budget
    size of a value (the Skeinformer paper's d: sampled rows/columns, features, landmarks)."""

    values: Any  # seq_len -> list of option values
    size: Any = _identity  # (value, seq_len) -> budget size


#: How a budget option (a method class's ``budget_option``) is swept: over the sizes d themselves
#: (sampled rows/columns, features, landmarks, projection dimension), except for the options of
#: :data:`SWEEPS`. Methods without a budget option (``softmax``, ``vmean``, exact kernels) are
#: measured at their defaults only.
SIZE_SWEEP = BudgetOption(_sizes)
SWEEPS: dict[str, BudgetOption] = {
    # Informer's option is c of u = c ln n (Skeinformer paper, section 3.3.1); c is set so that u = d.
    "factor": BudgetOption(_informer_factors, _informer_size),
    "block_per_row": BudgetOption(_mra_blocks),
    "num_hash": BudgetOption(lambda seq_len: list(YOSO_HASHES)),
}


def budget_grid(methods: Iterable[str] | None = None, seq_len: int = 512) -> dict[str, tuple[str | None, list[Any]]]:
    """method -> (budget option name, values at ``seq_len``) for the registered ``methods``
    (all by default). Budgets of n or more (nothing left to approximate) are left out.

    A method without a budget option (``softmax``, ``vmean``, exact kernels) maps to
    ``(None, [None])``: one measurement with its defaults.
    """
    known = list_methods()
    methods = known if methods is None else list(methods)
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; registered methods: {known}")
    grid: dict[str, tuple[str | None, list[Any]]] = {}
    for method in methods:
        option = get_method_class(method).budget_option
        grid[method] = (option, list(sweep_of(option).values(seq_len))) if option else (None, [None])
    return grid


def budget_size(method: str, value: Any, seq_len: int) -> Any:
    """The comparable budget d of ``method`` at option value ``value`` (None without budget)."""
    return None if value is None else sweep_of(get_method_class(method).budget_option).size(value, seq_len)


def sweep_of(option: str) -> BudgetOption:
    return SWEEPS.get(option, SIZE_SWEEP)
