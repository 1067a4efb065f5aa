"""Task pipelines built on the library with Trainer: shared pieces (``common``), conversion to long
positions (``convert``), masked-LM pretraining and the method comparison (``mlm``), GLUE
fine-tuning (``glue``) and WikiHop (``wikihop``). Task modules import from ``common`` and the
library, never from each other."""
