"""Training with Trainer: shared arguments and driver pieces (``args``, ``data``, ``driver`` with
the crash-safe checkpoints, ``loss``, ``masking``, ``metrics``, ``adapters`` for LoRA,
``provenance`` for the model card), masked-LM pretraining (``mlm``), GLUE fine-tuning (``glue``)
and WikiHop fine-tuning (``wikihop``)."""
