"""The mutations that scripts/mutation_check.py runs: one-line bugs, each with the tests that must catch it,
one module per area. Add one for every promise a new test guards (``tests/project/test_mutation_list.py`` checks
each applies)."""

from . import (
    api_keywords,
    architectures,
    bench_quality,
    cli_docs_options,
    data_flags,
    help_defaults,
    hub_docs,
    methods,
    model_training_flags,
    rules,
    run_output,
    serving,
    tool_flags,
    training,
)
from .base import Mutation

__all__ = ["MUTATIONS", "Mutation"]

MUTATIONS: list[Mutation] = [
    *training.MUTATIONS,
    *methods.MUTATIONS,
    *model_training_flags.MUTATIONS,
    *data_flags.MUTATIONS,
    *tool_flags.MUTATIONS,
    *serving.MUTATIONS,
    *bench_quality.MUTATIONS,
    *api_keywords.MUTATIONS,
    *cli_docs_options.MUTATIONS,
    *help_defaults.MUTATIONS,
    *hub_docs.MUTATIONS,
    *run_output.MUTATIONS,
    *rules.MUTATIONS,
    *architectures.MUTATIONS,
]
