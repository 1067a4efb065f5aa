"""Training with Trainer: shared arguments and driver pieces (``args``, ``data``, ``driver``,
``loss``, ``masking``, ``metrics``, ``adapters`` for LoRA), the masked-LM pretraining run
(``mlm``) and GLUE fine-tuning (``glue``)."""
