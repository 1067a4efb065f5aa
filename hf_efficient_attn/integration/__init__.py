"""The seam with Transformers: auto classes (``auto``), patching a built model (``patching``), the
attention and mask functions registered with Transformers (``bridge``), Longformer's
self-attention (``longformer``) and the position table (``positions``)."""
