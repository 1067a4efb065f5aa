"""Continued masked-LM pretraining (``pretrain``, scripts/pretrain_mlm.py) and the comparison of
methods by continued pretraining (``compare``, scripts/compare_methods.py)."""
