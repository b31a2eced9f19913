"""The queries users send the agent: tool-needing ones (weather, search,
arithmetic, trips that fan out to several tools) and chit-chat, drawn with a
Zipf-like popularity so some repeat, and sometimes reworded, so the LRU, Redis
and vector caches each see realistic hits. Also the gateway's gazetteer."""
from __future__ import annotations

import random

CITIES = ["Paris", "Berlin", "Rome", "Madrid", "Lisbon", "Tokyo", "Kyoto", "Seoul", "Beijing", "Shanghai",
          "Singapore", "Sydney", "Cairo", "Nairobi", "Lagos", "Toronto", "Chicago", "Denver", "Boston", "Austin",
          "Seattle", "Oslo", "Vienna", "Prague", "Dublin", "Mumbai", "Delhi", "Lima", "Bogota", "Santiago"]
TOPICS = ["GPU prices", "CPU prices", "python asyncio", "rust borrow checker", "kubernetes autoscaling",
          "redis persistence", "ebpf tracing", "transformer attention", "vector databases", "tls handshakes",
          "service mesh latency", "prometheus histograms", "linux schedulers", "quantum computing",
          "solar panels", "electric cars", "coffee brewing", "marathon training", "chess openings", "jazz history"]
ENTITIES = frozenset(w.lower() for name in CITIES + TOPICS for w in name.split()
                     if w.lower() not in {"prices", "history", "training", "openings"})

TOOL_TEMPLATES = [
    "what is the weather in {c1}",
    "will it rain in {c1} tomorrow",
    "search for {t1}",
    "find the latest news about {t1}",
    "what is {n1} plus {n2}",
    "compute the average of {n1}, {n2} and {n3}",
    "compare the weather in {c1} and {c2}",
    "find the latest news about {t1} and the weather in {c1}",
    "plan a trip to {c1}, {c2} and {c3}: weather and top sights",
]
CHITCHAT = [
    "hello", "hi there", "how are you", "good morning", "thanks a lot", "tell me a joke", "who are you",
    "what can you do", "that was helpful", "nice to meet you", "have a good day", "you are funny",
    "I am bored", "say something nice", "goodbye", "how was your day", "do you like music", "sing a song",
    "what is your name", "are you a robot",
]


def rewordings(query: str) -> list[str]:
    """Surface paraphrases a user might type for the same request."""
    q = query.strip()
    variants = [q[0].upper() + q[1:] + "?", "please " + q, q.replace("what is", "what's")
                if "what is" in q else q + " please", "hey, " + q + "!"]
    return [v for v in variants if v != q]


def tool_queries(rng: random.Random, n_tool: int = 300) -> list[str]:
    """A fixed pool of distinct tool queries, in random order."""
    pool = set()
    while len(pool) < n_tool:
        c1, c2, c3 = rng.sample(CITIES, 3)
        t1 = rng.choice(TOPICS)
        n1, n2, n3 = (rng.randint(2, 99) for _ in range(3))
        pool.add(rng.choice(TOOL_TEMPLATES).format(c1=c1, c2=c2, c3=c3, t1=t1, n1=n1, n2=n2, n3=n3))
    out = sorted(pool)
    rng.shuffle(out)
    return out


class QueryStream:
    """Endless queries: chat_share of them chit-chat, the rest tool queries with popularity
    ~ 1/rank^zipf_s over the pool; reword_prob of all of them reworded."""

    def __init__(self, seed: int = 7, zipf_s: float = 1.0, reword_prob: float = 0.2, chat_share: float = 0.2,
                 n_tool: int = 300):
        self.rng = random.Random(seed)
        self.pool = tool_queries(self.rng, n_tool)
        self.weights = [1.0 / (rank + 1) ** zipf_s for rank in range(len(self.pool))]
        self.reword_prob, self.chat_share = reword_prob, chat_share

    def next(self) -> str:
        if self.rng.random() < self.chat_share:
            q = self.rng.choice(CHITCHAT)
        else:
            q = self.rng.choices(self.pool, self.weights)[0]
        if self.rng.random() < self.reword_prob:
            q = self.rng.choice(rewordings(q))
        return q


def training_examples() -> list[tuple[str, int]]:
    """Labelled queries for the intent gate: 1 = needs tools, 0 = chit-chat."""
    rng = random.Random(11)
    tool = tool_queries(rng, 200)
    chat = CHITCHAT + [v for q in CHITCHAT for v in rewordings(q)]
    return [(q, 1) for q in tool] + [(q, 0) for q in chat]
