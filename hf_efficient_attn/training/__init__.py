"""Training with Trainer: shared arguments and driver pieces (``args``, ``data``, ``driver``,
``loss``, ``masking``, ``metrics``) and the masked-LM pretraining run (``mlm``)."""
