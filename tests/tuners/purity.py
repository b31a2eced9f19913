"""The purity check every tuner test applies: same inputs give the same decisions, and
decide() never changes the state it was given."""


def assert_pure(policies, settings, observations):
    for name, p in policies.items():
        runs = []
        for _ in range(2):
            state, decisions = p.initial_state(settings), []
            for o in observations:
                before = repr(state)
                nxt, d = p.decide(state, o)
                assert repr(state) == before, f"{name} changed the state it was given"
                state = nxt
                decisions.append(d)
            runs.append(decisions)
        assert runs[0] == runs[1], f"{name} gave different decisions for the same inputs"
