"""What every task shares: arguments and checks (``args``), data loading (``data``) and the bundled
real text (``corpus``), the Trainer driver with crash-safe checkpoints (``driver``), the loss
(``loss``), deterministic masking (``masking``), metrics (``metrics``), LoRA (``adapters``) and the
provenance record read by the model card (``provenance``)."""
