"""`orchard cost`: the paper's comparison of a managed sandbox service with a cluster of one's own
(on-demand and spot), from an editable prices file, through typer's CliRunner."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard.cli import app
from orchard.env import cost
from orchard.errors import ConfigError

runner = CliRunner()
PAPER = ["--sandboxes", "128", "--hours", "240", "--cpu", "2", "--memory", "8"]


def _totals(output: str) -> dict[str, str]:
    """{offer: total as printed} from the table's rows."""
    rows = re.findall(r"^(\S+) .*?(\$[\d,.]+)\s+[\d.]+%$", output, re.MULTILINE)
    return dict(rows)


def test_the_papers_table_is_reproduced() -> None:
    """128 sandboxes x 240 h: $7,078 managed, $3,362 on-demand, $673 spot (the paper's table)."""
    result = runner.invoke(app, ["cost", *PAPER])
    assert result.exit_code == 0, result.output
    assert _totals(result.stdout) == {"managed": "$7,078", "on-demand": "$3,362", "spot": "$673"}
    assert result.stdout.startswith("128 sandboxes x 240 h, 2 vCPU and 8 GiB each: 30,720 sandbox-hours\n")
    assert str(cost.DEFAULT_PRICES) in result.stdout
    # the defaults are the paper's fleet
    assert runner.invoke(app, ["cost"]).stdout == result.stdout


def test_fleet_cost_is_linear_in_every_dimension() -> None:
    offers = cost.load_prices()
    base = cost.fleet_cost(128, 240, 2, 8, offers)
    assert list(base) == ["managed", "on-demand", "spot"]
    assert cost.fleet_cost(256, 240, 2, 8, offers) == pytest.approx({k: 2 * v for k, v in base.items()})
    assert cost.fleet_cost(128, 24, 2, 8, offers) == pytest.approx({k: v / 10 for k, v in base.items()})
    only_cpu = cost.fleet_cost(1, 1, 1, 0, offers)
    only_memory = cost.fleet_cost(1, 1, 0, 1, offers)
    assert only_cpu == {o.name: o.vcpu_hour for o in offers}
    assert only_memory == {o.name: o.gib_hour for o in offers}
    assert cost.fleet_cost(0, 240, 2, 8) == {"managed": 0, "on-demand": 0, "spot": 0}
    with pytest.raises(ConfigError, match="hours must be >= 0"):
        cost.fleet_cost(1, -1, 2, 8)


def test_an_edited_prices_file_changes_the_table(tmp_path: Path) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text(
        '[[offer]]\nname = "spot"\nvcpu_hour = 0.01\ngib_hour = 0\n\n'
        '[[offer]]\nname = "vendor"\ndescription = "another managed service"\nvcpu_hour = 0.1\ngib_hour = 0.01\n'
        'source = "its price list, 2026"\n'
    )
    result = runner.invoke(
        app, ["cost", "--sandboxes", "10", "--hours", "100", "--cpu", "1", "--memory", "2", "--prices", str(prices)]
    )
    assert result.exit_code == 0, result.output
    assert _totals(result.stdout) == {"spot": "$10.00", "vendor": "$120"}
    assert "vs spot" in result.stdout and "1200.0%" in result.stdout
    assert "vendor: its price list, 2026" in result.stdout and f"prices: {prices}" in result.stdout


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[offer]]\nname = "x"\nvcpu_hour = 1\n', "offer x: gib_hour is missing"),
        ('[[offer]]\nname = "x"\nvcpu_hour = 1\ngib_hour = -0.5\n', "gib_hour must be a number of dollars >= 0"),
        ('[[offer]]\nname = "x"\nvcpu_hour = "1"\ngib_hour = 0\n', "vcpu_hour must be a number of dollars >= 0"),
        ('[[offer]]\nname = "x"\nvcpu_hour = 1\ngib_hour = 0\ncpu_hour = 1\n', "unknown field 'cpu_hour'"),
        ('[[offer]]\nname = "a b"\nvcpu_hour = 1\ngib_hour = 0\n', "name must be one word"),
        ('[[offer]]\nname = "x"\nvcpu_hour = 1\ngib_hour = 0\n' * 2, "two offers are named 'x'"),
        ("[fleet]\nsandboxes = 1\n", "unknown table 'fleet'"),
        ("", "has no [[offer]]"),
        ("offer = [", "is not TOML"),
    ],
)
def test_a_wrong_prices_file_is_one_error_line(tmp_path: Path, text: str, message: str) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text(text)
    result = runner.invoke(app, ["cost", "--prices", str(prices)])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {prices}") and message in result.stderr
    assert result.stderr.count("\n") == 1


def test_a_missing_prices_file_and_a_negative_fleet_are_refused(tmp_path: Path) -> None:
    missing = runner.invoke(app, ["cost", "--prices", str(tmp_path / "none.toml")])
    assert missing.exit_code == 1 and missing.stderr.startswith("error: cannot read the prices file")
    negative = runner.invoke(app, ["cost", "--hours", "-1"])
    assert negative.exit_code == 1 and negative.stderr.startswith("error: ")


def test_the_prices_file_ships_with_the_package() -> None:
    """A wheel holds only the package data pyproject names: the default prices must be among it."""
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["orchard"]
    relative = cost.DEFAULT_PRICES.relative_to(Path(cost.__file__).resolve().parents[1]).as_posix()
    assert any(fnmatch.fnmatch(relative, p) for p in patterns)
