"""Query embeddings for the vector cache and the intent gate, with no model
download: character 3- and 4-grams plus words of the normalised text, hashed
(crc32, stable across processes) with a sign into 256 dimensions, L2-normalised.
Surface paraphrases ("what's the weather in Paris?" / "what is the weather in
paris") land above cosine 0.91; a different city or topic lands well below."""
from __future__ import annotations

import re
import zlib

import numpy as np

DIM = 256
_CONTRACTIONS = {"what's": "what is", "it's": "it is", "how's": "how is", "i'm": "i am", "can't": "can not",
                 "don't": "do not", "who's": "who is", "where's": "where is"}
_FILLER = {"please", "hey", "ok", "so", "now", "quick", "quickly", "me", "the", "a", "an", "tell", "could", "you",
           "can", "would", "kindly", "just", "right"}


def normalise(text: str) -> list[str]:
    """Lower-cased words, contractions expanded, filler words dropped."""
    words = []
    for w in re.findall(r"[a-z0-9']+", text.lower()):
        w = _CONTRACTIONS.get(w, w).replace("'", "")
        words.extend(x for x in w.split() if x not in _FILLER)
    return words


def _features(words: list[str], entities: frozenset[str]):
    """(feature, weight): whole words weigh more than their n-grams, and numbers
    and named entities most, so one changed city or number moves even a long
    query below the threshold."""
    for w in words:
        yield "w:" + w, (10.0 if w[0].isdigit() or w in entities else 3.0)
        padded = f" {w} "
        for n in (3, 4):
            for i in range(len(padded) - n + 1):
                yield padded[i:i + n], 1.0


def embed(text: str, entities: frozenset[str] = frozenset()) -> np.ndarray:
    """The unit vector of text; entities are lower-case words that name things (cities, products)."""
    vec = np.zeros(DIM, dtype=np.float32)
    for feat, weight in _features(normalise(text), entities):
        h = zlib.crc32(feat.encode())
        vec[h % DIM] += weight if (h >> 16) & 1 else -weight
    norm = float(np.linalg.norm(vec))
    return vec / norm if norm else vec
