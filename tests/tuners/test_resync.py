"""Every policy that holds a setting in its state names the field, so the loop
can make it steer from the value in force (no wind-up after a clip, a hold, a
rollback or a dry run): resync writes exactly that value there."""
import pytest

from slotune.tuners import TUNERS

SETTINGS = {"concurrency_limit": 32.0, "rate_limit_rps": 100.0, "max_batch_size": 8.0, "max_queue_delay_ms": 5.0,
            "trace_sample_rate": 0.5, "trace_keep_slower_than_s": 0.2, "breaker_failure_threshold": 0.5,
            "breaker_consecutive_failures": 5.0, "breaker_open_s": 30.0, "degrade_ratio": 0.5,
            "max_num_seqs": 64.0, "max_num_batched_tokens": 512.0}
IN_FORCE = {k: v * 0.5 for k, v in SETTINGS.items()}
CASES = [(t, name, p) for t, mod in TUNERS.items() for name, p in mod.POLICIES.items() if p.fields]


def field_value(state, path):
    for part in path.split("."):
        state = getattr(state, part)
    return state


def test_the_tuners_that_push_settings_all_name_their_fields():
    assert {t for t, _, _ in CASES} >= {"throttle", "batch", "sampling", "breaker"}


@pytest.mark.parametrize("tuner, name, policy", CASES, ids=[f"{t}-{n}" for t, n, _ in CASES])
def test_resync_writes_the_value_in_force(tuner, name, policy):
    state = policy.initial_state(SETTINGS)
    synced = policy.resync(state, IN_FORCE)
    for setting, path in policy.fields.items():
        assert field_value(state, path) == pytest.approx(SETTINGS[setting])
        assert field_value(synced, path) == pytest.approx(IN_FORCE[setting])
    assert policy.resync(state, {}) == state          # nothing read back: nothing changes
