"""What `slotune status` prints from the daemon's /status document."""
from slotune.export.status_table import render


def service(p99_s, top="", shares=None, reachable=True):
    return {"p50_s": 0.1, "p99_s": p99_s, "slo_p99_s": 0.6, "rate_rps": 40.0, "settings": {"concurrency_limit": 32},
            "control_reachable": reachable, "attribution": {"top_cause": top, "shares": shares or {}}}


def test_the_table_flags_slo_misses_names_the_top_cause_and_a_down_control_api():
    table = render({"services": {"gateway": service(0.9, "downstream:inference", {"downstream:inference": 0.62}),
                                 "inference": service(0.2, reachable=False)},
                    "decisions": [{"t": 0, "service": "gateway", "setting": "concurrency_limit", "old": 40,
                                   "new": 32, "outcome": "pushed", "reason": "queue P99 over budget"}],
                    "dry_run": True})
    gateway, inference = (line for line in table.splitlines() if line.startswith(("gateway", "inference")))
    assert "900!" in gateway and "downstream:inference 62%" in gateway and "concurrency_limit=32" in gateway
    assert "200 " in inference and "no dominant cause" in inference and "(control API down)" in inference
    assert "(dry-run: nothing pushed)" in table
    assert "gateway.concurrency_limit 40 -> 32 [pushed] queue P99 over budget" in table


def test_settings_read_to_three_significant_digits():
    # The demo's table printed degrade_ratio=0.97226 trace_sample_rate=0.00355218.
    gateway = service(0.2)
    gateway["settings"] = {"degrade_ratio": 0.97226, "trace_sample_rate": 0.00355218, "concurrency_limit": 1024.0}
    row = next(line for line in render({"services": {"gateway": gateway}, "decisions": []}).splitlines()
               if line.startswith("gateway"))
    assert "concurrency_limit=1024 degrade_ratio=0.972 trace_sample_rate=0.00355" in row


def test_token_objectives_show_only_where_a_service_declares_them():
    llm = {**service(4.0), "slo_p99_s": 30.0, "slo_ttft_p99_s": 0.5, "ttft_p99_s": 0.8,
           "slo_tpot_p99_s": 0.05, "tpot_p99_s": 0.03}
    table = render({"services": {"inference": llm, "gateway": service(0.2)}, "decisions": []})
    assert "TTFT/TPOT P99/SLO ms" in table
    inference = next(line for line in table.splitlines() if line.startswith("inference"))
    assert "TTFT 800!/500 TPOT 30/50" in inference
    assert "TTFT" not in render({"services": {"gateway": service(0.2)}, "decisions": []})


ATTACK = "\x1b[2J\x1b]0;owned\x07\x9b31m\x00\r\n\u2028\u202e"   # clear, title, BEL, C1 CSI, NUL, CR LF, LS, RLO
INERT = "\\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\x00\\r\\n\\u2028\\u202e"


def test_text_services_wrote_is_shown_with_its_escapes_never_sent_to_the_terminal():
    gateway = service(0.9, "downstream:" + ATTACK, {"downstream:" + ATTACK: 0.62})
    gateway["settings"] = {"limit" + ATTACK: 3}
    gateway["attribution"]["tokens"] = {"ttft": {"verdict": "TTFT " + ATTACK}}
    table = render({"services": {"gw" + ATTACK: gateway},
                    "decisions": [{"t": 0, "service": "gw" + ATTACK, "setting": "limit" + ATTACK, "old": 4, "new": 3,
                                   "outcome": "refused" + ATTACK, "detail": "HTTP 500: " + ATTACK,
                                   "reason": "queue " + ATTACK}]})
    assert all(c == "\n" or c.isprintable() for c in table)
    assert f"[refused{INERT}: HTTP 500: {INERT}] queue {INERT}" in table
    assert f"limit{INERT}=3" in table and f"TTFT {INERT}" in table and table.count("\n") == 7
