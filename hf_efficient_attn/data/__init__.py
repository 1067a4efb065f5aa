"""Offline real text for measurements and tests (gensim's bundled test corpora)."""
