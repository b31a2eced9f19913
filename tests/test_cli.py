"""The command line a user meets first: help texts end with real examples."""
import pytest

from slotune import cli
from tests.conftest import run_slotune

COMMANDS = [m.NAME for m in cli.subcommand_modules()]


def test_top_level_help_ends_with_examples():
    result = run_slotune("--help")
    assert result.returncode == 0
    assert result.stdout.rstrip().splitlines()[-1].strip().startswith("slotune <command> --help")
    assert "examples:" in result.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_help_ends_with_examples(command):
    result = run_slotune(command, "--help")
    assert result.returncode == 0, result.stderr
    tail = result.stdout[result.stdout.index("examples:"):]
    example_lines = [line for line in tail.splitlines()[1:] if line.strip()]
    assert example_lines and all(line.strip().startswith(("slotune", "sudo slotune")) for line in example_lines)


def test_unknown_subcommand_is_refused_with_the_choices():
    result = run_slotune("frobnicate")
    assert result.returncode == 2
    assert "invalid choice: 'frobnicate'" in result.stderr and "doctor" in result.stderr


def test_each_part_of_make_demo_keeps_its_own_report():
    # `make demo` runs `slotune demo` then `slotune demo --llm`: both wrote /tmp/slotune-demo/report.html.
    import argparse
    from slotune.commands import demo
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    dirs = {demo.default_run_dir(parser.parse_args(argv)) for argv in ([], ["--llm"], ["--fleet", "3"])}
    assert len(dirs) == 3
    assert parser.parse_args(["--run-dir", "/x"]).run_dir.as_posix() == "/x"
