"""Real English text available offline, from the test data that ships in the ``gensim`` wheel.

- :func:`wikipedia_articles`: the articles of gensim's shortened English Wikipedia dump
  (``enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2``, ~100 full
  articles, several thousand words each), wiki markup stripped.
- :func:`news_sentences`: sentences of the Lee news corpus (``lee_background.cor``,
  300 Australian news articles, one per line).
- :func:`movie_review_sentences`: 200 labelled movie-review sentences (Pang & Lee's sentence
  polarity data, the source of SST; ``pang_lee_polarity.cor``).
- :func:`newsgroup_posts`: 200 labelled Usenet posts of 20 Newsgroups (``mini_newsgroup``).

Both are cached: the dump takes a few seconds to parse.
"""

from __future__ import annotations

import bz2
import functools
import io
import pickle
import re
import zlib

WIKI_DUMP = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
NEWS_CORPUS = "lee_background.cor"
MOVIE_REVIEWS = "pang_lee_polarity.cor"
NEWSGROUPS = "mini_newsgroup"

#: A paragraph line shorter than this (in words) is a table cell, caption or list stub; dropped.
MIN_LINE_WORDS = 5


def _gensim_test_data(name: str) -> str:
    try:
        from gensim.test.utils import datapath
    except ImportError as err:  # pragma: no cover - exercised only without gensim
        raise ModuleNotFoundError(
            "hf_efficient_attn.tasks.common.corpus reads the real text bundled with gensim's test data; "
            "install it with `pip install gensim`"
        ) from err
    return datapath(name)


_BOLD_ITALIC = re.compile(r"'{2,}")
_HEADING = re.compile(r"^\s*(={2,}).*\1\s*$")
_EMPTY_PARENS = re.compile(r"\(\s*[,;]?\s*\)")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:])")
_SPACES = re.compile(r"[ \t\u00a0]+")


def clean_wiki_text(raw: str) -> str:
    """Plain text of one article's wikitext.

    ``gensim.corpora.wikicorpus.filter_wiki`` removes templates, links, references, tables'
    markup and comments; what it leaves (bold/italic quotes, ``==Heading==`` lines, table cells
    as short lines, gallery captions, empty parentheses of removed pronunciations) is removed
    here. Paragraphs are
    separated by a blank line.
    """
    from gensim.corpora.wikicorpus import filter_wiki

    text = filter_wiki(raw)
    paragraphs = []
    for line in text.splitlines():
        if _HEADING.match(line) or line.lstrip()[:1] in {"|", "!", ":", "*", "#", "+", "{", "}"}:
            continue  # headings, table rows, indented formulas, list bullets
        if "|" in line:
            continue  # gallery entries and image captions ("File:x.jpg|caption")
        line = _BOLD_ITALIC.sub("", line)
        line = _EMPTY_PARENS.sub("", line)
        line = _SPACES.sub(" ", line).strip()
        line = _SPACE_BEFORE_PUNCT.sub(r"\1", line)
        if len(line.split()) >= MIN_LINE_WORDS and "[[" not in line and "{{" not in line:
            paragraphs.append(line)
    return "\n\n".join(paragraphs)


@functools.lru_cache(maxsize=None)
def _all_wikipedia_articles() -> tuple[tuple[str, str], ...]:
    from gensim.corpora.wikicorpus import IGNORED_NAMESPACES, extract_pages

    articles = []
    with bz2.open(_gensim_test_data(WIKI_DUMP), "rb") as dump:
        for title, raw, _page_id in extract_pages(dump):
            if any(title.startswith(ns + ":") for ns in IGNORED_NAMESPACES):
                continue
            if raw.lstrip().lower().startswith("#redirect"):
                continue
            text = clean_wiki_text(raw)
            if text:
                articles.append((title, text))
    return tuple(articles)


def wikipedia_articles(min_words: int = 0, with_titles: bool = False) -> list:
    """Plain English text of the articles in gensim's shortened English Wikipedia dump,
    redirects, non-article namespaces and empty pages dropped, in dump order.

    ``min_words`` keeps only articles with at least that many whitespace-separated words
    (2000 leaves ~60 long articles, enough for 2048+ token inputs). With ``with_titles`` the
    items are ``(title, text)`` pairs.
    """
    kept = [(t, x) for t, x in _all_wikipedia_articles() if len(x.split()) >= min_words]
    return kept if with_titles else [x for _, x in kept]


# A sentence ends at . ! or ? (optionally followed by a closing quote or bracket) followed by
# whitespace and an upper-case letter, digit or opening quote; common abbreviations do not end one.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]?\s+(?=[\"'(A-Z0-9])")
_ABBREVIATIONS = {
    "mr",
    "mrs",
    "ms",
    "dr",
    "prof",
    "sen",
    "gen",
    "col",
    "lt",
    "sgt",
    "capt",
    "st",
    "jr",
    "sr",
    "inc",
    "co",
    "corp",
    "ltd",
    "no",
    "vs",
    "etc",
    "jan",
    "feb",
    "mar",
    "apr",
    "jun",
    "jul",
    "aug",
    "sep",
    "sept",
    "oct",
    "nov",
    "dec",
    "u.s",
    "u.n",
    "u.k",
    "e.g",
    "i.e",
    "mt",
    "ft",
}


def split_sentences(text: str) -> list[str]:
    """Split English prose into sentences (rule-based; abbreviations and initials aware)."""
    sentences: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        head = text[start : match.start()].rstrip("\"')] ")
        last_word = head.rsplit(None, 1)[-1] if head.split() else ""
        token = last_word.rstrip(".!?").lower().lstrip("\"'(")
        if last_word.endswith(".") and (token in _ABBREVIATIONS or (len(token) == 1 and token.isalpha())):
            continue  # "Mr. Howard", "John W. Howard"
        sentences.append(text[start : match.start() + len(match.group(0).rstrip())].strip())
        start = match.end()
    sentences.append(text[start:].strip())
    return [s for s in sentences if s]


@functools.lru_cache(maxsize=None)
def _news_articles() -> tuple[str, ...]:
    with open(_gensim_test_data(NEWS_CORPUS), encoding="utf-8", errors="replace") as f:
        return tuple(_SPACES.sub(" ", line).strip() for line in f if line.strip())


def news_articles() -> list[str]:
    """The 300 real English news articles of the Lee corpus (``lee_background.cor``), one
    string each (about 60 to 1000 words: varied lengths, for padded batches)."""
    return list(_news_articles())


@functools.lru_cache(maxsize=None)
def _news_sentences() -> tuple[str, ...]:
    return tuple(s for doc in _news_articles() for s in split_sentences(doc) if len(s.split()) >= 3)


def news_sentences() -> list[str]:
    """Real English news sentences: the Lee corpus (``lee_background.cor``, 300 Australian
    news articles) split into sentences; fragments of fewer than three words dropped."""
    return list(_news_sentences())


def movie_review_sentences() -> list[tuple[str, int]]:
    """The 200 real movie-review sentences of Pang & Lee's sentence polarity data (the corpus
    SST was built from; ``pang_lee_polarity.cor``, lower-cased and tokenised) as ``(sentence,
    label)``, label 1 positive, 0 negative; 100 of each, negatives first."""
    rows = []
    with open(_gensim_test_data(MOVIE_REVIEWS), encoding="cp1252") as f:  # the original release's encoding
        for line in f:
            tag, _, sentence = line.strip().partition(" ")
            rows.append((sentence, 1 if tag == "__label__pos" else 0))
    return rows


class _BunchAsDict(pickle.Unpickler):
    """Reads the scikit-learn ``Bunch`` pickled in gensim's ``mini_newsgroup`` (written by a
    scikit-learn whose ``sklearn.datasets.base`` no longer exists) as a plain dict."""

    def find_class(self, module: str, name: str):
        if (module, name) == ("sklearn.datasets.base", "Bunch"):
            return dict
        return super().find_class(module, name)


def newsgroup_posts() -> list[tuple[str, str]]:
    """200 real Usenet posts of 20 Newsgroups (gensim's ``mini_newsgroup``: 100 from
    alt.atheism, 100 from sci.space, about 40 to 5000 words) as ``(text, newsgroup)``, the
    headers (which name the newsgroup) removed."""
    with open(_gensim_test_data(NEWSGROUPS), "rb") as f:
        bunch = _BunchAsDict(io.BytesIO(zlib.decompress(f.read())), encoding="latin1").load()
    names = bunch["target_names"]
    posts = []
    for text, target in zip(bunch["data"], bunch["target"]):
        body = text.split("\n\n", 1)[1] if "\n\n" in text else text
        posts.append((_SPACES.sub(" ", body).strip(), names[int(target)]))
    return posts
