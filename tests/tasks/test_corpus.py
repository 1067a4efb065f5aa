"""Offline real English text from gensim's bundled test data."""

import pytest

pytest.importorskip("gensim")

from hf_efficient_attn.tasks.common.corpus import clean_wiki_text, news_sentences, split_sentences, wikipedia_articles  # noqa: E402


def test_many_long_wikipedia_articles():
    articles = wikipedia_articles()
    long = wikipedia_articles(min_words=2000)
    assert len(articles) >= 90
    assert len(long) >= 20
    assert all(len(text.split()) >= 2000 for text in long)
    assert set(long) <= set(articles)


def test_wikipedia_text_is_plain():
    for title, text in wikipedia_articles(with_titles=True):
        assert text.strip(), title
        for markup in ("[[", "]]", "{{", "}}", "'''", "==", "<ref", "#REDIRECT"):
            assert markup not in text, (title, markup)
        assert ":" not in title or title.split(":")[0] not in {"Wikipedia", "Category", "File", "Template"}
    anarchism = dict(wikipedia_articles(with_titles=True))["Anarchism"]
    assert anarchism.startswith("Anarchism is a political philosophy")


def test_wikipedia_is_cached():
    assert wikipedia_articles()[0] is wikipedia_articles()[0]


def test_clean_wiki_text_strips_what_filter_wiki_leaves():
    raw = (
        "'''Albedo''' ({{IPAc-en|æ|l|ˈ|b|iː|d|oʊ}}) is the [[reflectivity|diffuse reflectivity]] of a surface.\n"
        "==History==\n"
        "{| class=wikitable\n|-\n| cell one || cell two\n|}\n"
        "The term was introduced by Johann Heinrich Lambert in ''Photometria''.<ref>Lambert 1760</ref>\n"
    )
    text = clean_wiki_text(raw)
    assert text == (
        "Albedo is the diffuse reflectivity of a surface.\n\nThe term was introduced by Johann Heinrich Lambert in Photometria."
    )


def test_news_sentences_are_real_sentences():
    sentences = news_sentences()
    assert len(sentences) > 2000
    assert all(s.strip() and len(s.split()) >= 3 for s in sentences)
    assert sentences[0].startswith("Hundreds of people have been forced to vacate their homes")
    ends = sum(s.rstrip("\"' ").endswith((".", "!", "?")) for s in sentences)
    assert ends / len(sentences) > 0.95


def test_split_sentences_keeps_abbreviations_and_initials():
    text = 'Mr. Howard met John W. Smith in Sydney. "It went well," he said. Shares rose 2.5 per cent! Why?'
    assert split_sentences(text) == [
        "Mr. Howard met John W. Smith in Sydney.",
        '"It went well," he said.',
        "Shares rose 2.5 per cent!",
        "Why?",
    ]


def test_news_articles_have_varied_lengths():
    from hf_efficient_attn.tasks.common.corpus import news_articles

    articles = news_articles()
    lengths = sorted(len(a.split()) for a in articles)
    assert len(articles) == 300 and lengths[0] >= 20 and lengths[-1] > 3 * lengths[0]
    assert news_sentences()[0] in articles[0]
