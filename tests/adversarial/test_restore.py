"""`slotune run --restore-on-exit`, for real: the daemon tunes a live service,
and a clean stop puts back the values in force before it first changed them
(as tuned does on unapply), audited; a plain stop leaves them as tuned."""
import pytest

from reference_stack import launcher
from tests.adversarial.service_double import ServiceDouble, config
from tests.adversarial.test_reload import wait
from tests.e2e.conftest import start_daemon

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("restore", [True, False])
def test_a_clean_stop_puts_back_what_was_in_force(tmp_path, restore):
    double = ServiceDouble({"rate_limit_rps": 500.0, "concurrency_limit": 64})
    port, work = launcher.free_ports(1)[0], tmp_path / "daemon"
    work.mkdir()
    d = start_daemon(config(double, port, work), work, port, *(["--restore-on-exit"] if restore else []))
    try:
        wait(lambda: double.pushed() >= 2 and double.settings["rate_limit_rps"] != 500.0, 20,
             "the daemon to move the rate limit")
        assert d.stop() == 0
        if restore:
            assert double.settings["rate_limit_rps"] == 500.0
            assert d.audit()[-1]["outcome"] == "restored" and d.audit()[-1]["new"] == 500.0
        else:
            assert double.settings["rate_limit_rps"] != 500.0
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
        double.close()
