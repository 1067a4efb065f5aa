"""WikiHop examples in the original qangaroo schema (``id``, ``query``, ``answer``,
``candidates``, ``supports``), available offline.

- :func:`real_examples`: the two real WikiHop development examples shipped as a test fixture in the
  ``allennlp==0.9.0`` wheel (``allennlp/tests/fixtures/data/qangaroo.json``), read from the wheel
  itself; get it once with :data:`FETCH_COMMAND` (its dependencies are not needed, nor installed).
- :func:`synthetic_examples`: a learnable set in the same schema (the answer is the one candidate
  that the documents mention), with real English news sentences (gensim's test data) as filler.
"""

from __future__ import annotations

import json
import os
import random
import re
import zipfile

#: Where the allennlp wheel is looked for (override with the environment variable HEA_DATA_DIR).
DATA_DIR = os.environ.get("HEA_DATA_DIR", os.path.join(os.path.expanduser("~"), ".cache", "hf_efficient_attn"))
ALLENNLP_WHEEL = "allennlp-0.9.0-py3-none-any.whl"
QANGAROO_FIXTURE = "allennlp/tests/fixtures/data/qangaroo.json"
#: The one-time download of the wheel (pip's ordinary client; no dependencies, nothing installed).
FETCH_COMMAND = f"pip download allennlp==0.9.0 --no-deps -d {DATA_DIR}"

#: Candidate answers of the synthetic examples (words of the small test vocabulary's news corpus).
SYNTHETIC_PLACES = (
    "sydney", "melbourne", "brisbane", "perth", "adelaide", "canberra", "hobart", "darwin",
    "london", "paris", "tokyo", "moscow", "washington", "jakarta", "kabul", "jerusalem",
)  # fmt: skip
#: The people the synthetic queries ask about.
SYNTHETIC_PEOPLE = (
    "john", "mary", "peter", "anna", "james", "sarah", "david", "helen",
    "paul", "emma", "mark", "alice", "george", "lucy", "tom", "kate",
)  # fmt: skip
#: The WikiHop relation of every synthetic query.
SYNTHETIC_RELATION = "place_of_birth"


def real_examples(data_dir: str = DATA_DIR) -> list[dict]:
    """The two real WikiHop development examples (``WH_dev_0``, ``WH_dev_1``), read from the
    allennlp wheel in ``data_dir``; ``FileNotFoundError`` naming the download command if absent."""
    wheel = os.path.join(data_dir, ALLENNLP_WHEEL)
    if not os.path.isfile(wheel):
        raise FileNotFoundError(f"{wheel} is missing; get it once with: {FETCH_COMMAND}")
    with zipfile.ZipFile(wheel) as archive:
        return json.loads(archive.read(QANGAROO_FIXTURE).decode("utf-8"))


def _filler_sentences() -> list[str]:
    """Real news sentences that mention none of the synthetic places."""
    from ..common.corpus import news_sentences

    place = re.compile(r"\b(" + "|".join(SYNTHETIC_PLACES) + r")\b", re.IGNORECASE)
    return [s for s in news_sentences() if not place.search(s)]


def synthetic_examples(
    count: int, seed: int = 0, num_candidates: int = 4, num_supports: int = 2, sentences_per_support: int = 1
) -> list[dict]:
    """``count`` examples in the qangaroo schema: the query asks where a person was born, the candidates
    are ``num_candidates`` places, and the answer is the only candidate that the supports mention
    (in one sentence, "<person> was born in <answer>.", placed at random among real news sentences).
    Learning it takes the documents: every place is a distractor as often as an answer."""
    for name, value, low, high in (
        ("count", count, 0, None),
        ("num_candidates", num_candidates, 2, len(SYNTHETIC_PLACES)),
        ("num_supports", num_supports, 1, None),
        ("sentences_per_support", sentences_per_support, 0, None),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high and value > high):
            raise ValueError(f"{name} must be an integer in {low}..{high or 'any'}, got {value!r}")
    rng = random.Random(seed)
    filler = _filler_sentences()
    examples = []
    for index in range(count):
        person = rng.choice(SYNTHETIC_PEOPLE)
        candidates = rng.sample(SYNTHETIC_PLACES, num_candidates)
        answer = rng.choice(candidates)
        sentences = [rng.choice(filler) for _ in range(num_supports * sentences_per_support)]
        sentences.insert(rng.randrange(len(sentences) + 1), f"{person.capitalize()} was born in {answer.capitalize()}.")
        supports = [" ".join(sentences[i::num_supports]) for i in range(num_supports)]
        examples.append(
            {
                "id": f"synthetic_{seed}_{index}",
                "query": f"{SYNTHETIC_RELATION} {person}",
                "answer": answer,
                "candidates": sorted(candidates),
                "supports": supports,
            }
        )
    return examples


def write_qangaroo_json(path: str, examples: list[dict]) -> str:
    """Write ``examples`` as one JSON array, the original qangaroo file format."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(examples, f)
    return path


def write_wikihop_files(output_dir: str, train_examples: int = 256, dev_examples: int = 64) -> dict[str, int]:
    """``train.json`` (synthetic examples) and ``dev.json`` (the two real development examples,
    then synthetic ones) in ``output_dir``, for a WikiHop run that needs no download beyond the
    allennlp wheel. Returns the number of examples of each file."""
    dev = real_examples() + synthetic_examples(dev_examples, seed=1)
    write_qangaroo_json(os.path.join(output_dir, "train.json"), synthetic_examples(train_examples, seed=0))
    write_qangaroo_json(os.path.join(output_dir, "dev.json"), dev)
    return {"train": train_examples, "dev": len(dev)}
