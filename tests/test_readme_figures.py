"""Every figure the README quotes is one of docs/results.md's: each number in a row
of its "What the figures say" table, and the row's date, are on that page, so a
rerun updates one place and a stale headline fails here."""
import re

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()
RESULTS = (ROOT / "docs" / "results.md").read_text()


def figure_rows() -> list[tuple[str, str, str]]:
    section = README[README.index("## What the figures say"):]
    section = section[:section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| claim")]
    return [tuple(cell.strip() for cell in row.strip("|").split("|"))[:3] for row in rows]


def test_the_readme_quotes_figures():
    assert len(figure_rows()) >= 5


def test_each_readme_figure_and_its_date_are_in_results_md():
    for claim, figure, date in figure_rows():
        text = re.sub(r"\]\([^)]*\)", "]", figure)                 # link targets are not figures
        for number in re.findall(r"\d+(?:[.,]\d+)?", text):
            assert re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", RESULTS), \
                f"README's {claim!r}: {number} is not in docs/results.md"
        assert date in RESULTS, f"README's {claim!r}: {date} is not in docs/results.md"
