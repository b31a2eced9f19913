"""The installed distribution is one import package, `slotune`, made of the
checkout's folders: daemon/ is slotune, tuners/ slotune.tuners, bpf/ slotune.bpf.
The demo (daemon/demo) and the stack it starts (reference_stack/) run from a
checkout and are not installed. Everything else is in pyproject.toml."""
from pathlib import Path

from setuptools import setup

FOLDERS = {"slotune": "daemon", "slotune.tuners": "tuners", "slotune.bpf": "bpf"}
CHECKOUT_ONLY = ("demo",)


def packages() -> list[str]:
    """Every folder with an __init__.py under the three, by its name in slotune."""
    here = Path(__file__).resolve().parent
    found = []
    for name, folder in FOLDERS.items():
        for init in sorted((here / folder).rglob("__init__.py")):
            parts = init.parent.relative_to(here / folder).parts
            if parts[:1] != CHECKOUT_ONLY:
                found.append(".".join((name, *parts)))
    return found


setup(packages=packages(), package_dir=FOLDERS)
