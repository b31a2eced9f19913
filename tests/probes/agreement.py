"""What a probe test measured against its independent reference, kept for the
"How each signal was checked" table: each test that compares a signal with a
reference nobody on the team wrote calls record(); `python -m bench.signal_checks`
runs those tests with SLOTUNE_AGREEMENT_FILE set and prints the table. Without
the variable, record() does nothing and the tests run as usual."""
import json
import os

FILE_VARIABLE = "SLOTUNE_AGREEMENT_FILE"


def record(signal: str, reference: str, slotune: float, theirs: float, unit: str = "", bound: str = "") -> None:
    """One comparison: slotune's figure and the reference's, in the same unit; `bound`
    is what the test asserts about them, in words (e.g. "within 5 %", "exact")."""
    path = os.environ.get(FILE_VARIABLE)
    if not path:
        return
    row = {"signal": signal, "reference": reference, "slotune": float(slotune), "theirs": float(theirs),
           "unit": unit, "bound": bound, "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]}
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
