"""Tools around the library: speed and memory against SDPA (``benchmark``), the quality study
(``quality``), the attention-swap demo (``demo``), the README's first command (``quickstart``) and
the offline MiniLM checkpoint they use (``minilm``)."""
