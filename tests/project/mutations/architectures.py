"""Mutations of the architecture support (issue 55): which encoders are patched, windowed layers,
grouped k and v heads, the model's split of the scale, rotary positions stretched."""

from .base import Mutation, P, T

ARCH = T + "integration/test_architectures.py::"

MUTATIONS = [
    Mutation(
        P + "integration/architectures.py",
        "return _DISPATCH in source",
        'return module_class.__name__.endswith("SelfAttention")',
        (ARCH + "-k softmax_through_the_plugin",),
        "attention modules found by their class names (ALBERT's, ModernBERT's, GTE's ... missed)",
    ),
    Mutation(
        P + "integration/architectures.py",
        "    if is_decoder_only(config):",
        "    if False:",
        (ARCH + "-k decoder_is_refused",),
        "a decoder architecture (GPT-2, Llama) not refused",
    ),
    Mutation(
        P + "integration/architectures.py",
        'return getattr(_model_class(transformers.AutoModel, config_class), "_supports_attention_backend", False)',
        "return _model_class(transformers.AutoModel, config_class) is not None",
        (ARCH + "-k computes_its_own_attention",),
        "a model that computes its own attention (DeBERTa, MPNet, BigBird) patched",
    ),
    Mutation(
        P + "integration/architectures.py",
        'return getattr(config, "rope_parameters", None) is not None or getattr(config, "position_embedding_type", None) == "rotary"',
        'return getattr(config, "rope_parameters", None) is not None',
        (ARCH + "-k rotary_positions_are_recognised",),
        "ESM-2's rotary positions taken for a learned table",
    ),
    Mutation(
        P + "integration/architectures.py",
        '"roberta", "xlm-roberta", "camembert", "longformer", "xlm-roberta-xl"',
        '"roberta", "xlm-roberta", "longformer", "xlm-roberta-xl"',
        (T + "tasks/test_convert.py::-k offset_rows",),
        "CamemBERT's padding offset forgotten",
    ),
    Mutation(
        P + "integration/patching.py",
        "for index, module in enumerate(self_attention_modules(model)) if not is_windowed(module)]",
        "for index, module in enumerate(self_attention_modules(model))]",
        (ARCH + "-k windowed_layers_keep",),
        "a method on ModernBERT's sliding-window layers",
    ),
    Mutation(
        P + "integration/bridge.py",
        '    if kwargs.get("local_size") is not None:',
        "    if False:",
        (ARCH + "-k softmax_through_the_plugin",),
        "the sliding-window mask refused (every ModernBERT fails)",
    ),
    Mutation(
        P + "integration/bridge.py",
        "    if groups > 1:  # grouped-query attention",
        "    if groups > 2:  # grouped-query attention",
        (ARCH + "-k softmax_through_the_plugin",),
        "EuroBERT's grouped k, v heads not repeated",
    ),
    Mutation(
        P + "integration/bridge.py",
        "    if scaling is not None and scaling != standard:",
        "    if False:",
        (ARCH + "-k methods_see_unscaled_q",),
        "ESM's pre-scaled q handed to the methods as it is",
    ),
    Mutation(
        P + "integration/bridge.py",
        "if config is not None and not is_tracing() and not dispatches_attention(type(config)):",
        "if False:",
        (ARCH + "-k would_only_take_its_mask",),
        "plain Transformers runs MPNet with a method's mask silently",
    ),
    Mutation(
        P + "integration/positions.py",
        "        if rope_scaling is not None:\n            _scale_rotary_positions",
        "        if False:\n            _scale_rotary_positions",
        (ARCH + "-k rope_scaling_is_opt_in",),
        "rope_scaling= ignored",
    ),
    Mutation(
        P + "tasks/convert.py",
        "rope_scaling=conversion_args.rope_scaling,",
        "rope_scaling=None,",
        (ARCH + "-k convert_to_long_stretches_rotary",),
        "--rope_scaling ignored",
    ),
]
