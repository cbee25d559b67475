"""What a fleet of sandboxes costs: managed sandbox services against a self-hosted cluster.

`orchard cost` prints the paper's comparison for a fleet (sandboxes x hours x vCPU x memory): a
managed sandbox service at its list prices, and a cluster of one's own on on-demand and on spot
nodes. Every offer charges per vCPU-hour and per GiB-hour a sandbox is given, for as long as it
exists; so a fleet costs `sandboxes * hours * (cpu * vcpu_hour + memory_gib * gib_hour)`.

The prices live in an editable TOML file (`DEFAULT_PRICES`, shipped with the package: its
comments say where each default comes from). The defaults reproduce the paper's table for its
fleet (`PAPER_FLEET`): 128 sandboxes x 240 h of 2 vCPU and 8 GiB each cost $7,078 managed,
$3,362 on-demand and $673 on spot.

What it leaves out: storage, network egress, a managed service's plan fees, a cluster's control
plane, spare capacity, and the people who run it. Spot nodes can be reclaimed: sandboxes on them
must be restartable (an eval's attempt is; a long interactive session may not be).
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchard.errors import ConfigError

DEFAULT_PRICES = Path(__file__).resolve().parent / "cost_prices.toml"
"""The shipped prices file: the paper's table; copy and edit it for your provider."""
FIELDS = {"name": str, "description": str, "vcpu_hour": float, "gib_hour": float, "source": str}
REQUIRED = ("name", "vcpu_hour", "gib_hour")


@dataclass(frozen=True)
class Fleet:
    """Sandboxes of one size, each existing for the same number of hours."""

    sandboxes: int
    hours: float
    cpu: float
    """vCPUs a sandbox is given."""
    memory_gib: float
    """GiB of memory a sandbox is given."""

    @property
    def sandbox_hours(self) -> float:
        """Sandboxes times hours: what every offer multiplies its sandbox-hour price by."""
        return self.sandboxes * self.hours


PAPER_FLEET = Fleet(sandboxes=128, hours=240, cpu=2, memory_gib=8)
"""The fleet of the paper's table, and the defaults of `orchard cost`."""


@dataclass(frozen=True)
class Offer:
    """One way to pay for sandboxes: dollars per vCPU-hour and per GiB-hour."""

    name: str
    vcpu_hour: float
    gib_hour: float
    description: str = ""
    source: str = ""
    """Where the prices come from."""

    def sandbox_hour(self, cpu: float, memory_gib: float) -> float:
        """Dollars for one sandbox of that size for one hour."""
        return cpu * self.vcpu_hour + memory_gib * self.gib_hour


def load_prices(path: Path | None = None) -> list[Offer]:
    """The offers of a prices file (default `DEFAULT_PRICES`), in its order; ConfigError naming
    the file and the offer when one is malformed (a missing or unknown field, a negative price)."""
    path = Path(path or DEFAULT_PRICES)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read the prices file {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not TOML: {exc}") from exc
    unknown = set(data) - {"offer"}
    if unknown:
        raise ConfigError(f"{path}: unknown table {sorted(unknown)[0]!r} (a prices file holds [[offer]] tables)")
    raw = data.get("offer")
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{path} has no [[offer]]: give at least one")
    offers = [_offer(path, i, entry) for i, entry in enumerate(raw, 1)]
    names = [o.name for o in offers]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: two offers are named {next(n for n in names if names.count(n) > 1)!r}")
    return offers


def _offer(path: Path, number: int, entry: dict) -> Offer:
    """One [[offer]] table, checked."""
    where = f"{path}, offer {entry.get('name') or number}"
    unknown = set(entry) - set(FIELDS)
    if unknown:
        raise ConfigError(f"{where}: unknown field {sorted(unknown)[0]!r} (fields: {', '.join(FIELDS)})")
    for field in REQUIRED:
        if field not in entry:
            raise ConfigError(f"{where}: {field} is missing")
    values = {}
    for field, value in entry.items():
        if FIELDS[field] is float:
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"{where}: {field} must be a number of dollars >= 0, not {value!r}")
            value = float(value)
        elif not isinstance(value, str):
            raise ConfigError(f"{where}: {field} must be a string, not {value!r}")
        values[field] = value
    if not values["name"] or any(c.isspace() for c in values["name"]):
        raise ConfigError(f"{where}: name must be one word, not {values['name']!r}")
    return Offer(**values)


def fleet_cost(
    sandboxes: int, hours: float, cpu: float, memory_gib: float, prices: Sequence[Offer] | None = None
) -> dict[str, float]:
    """Dollars the fleet costs on each offer (default: `load_prices()`), by offer name, in order.

    >>> fleet_cost(128, 240, 2, 8)
    {'managed': 7077.888, 'on-demand': 3361.9968, 'spot': 673.3824}
    """
    fleet = Fleet(sandboxes, hours, cpu, memory_gib)
    for field in ("sandboxes", "hours", "cpu", "memory_gib"):
        value = getattr(fleet, field)
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{field} must be >= 0, not {value!r}")
    offers = load_prices() if prices is None else prices
    return {o.name: round(fleet.sandbox_hours * o.sandbox_hour(cpu, memory_gib), 6) for o in offers}


def cost_table(fleet: Fleet, offers: Sequence[Offer]) -> str:
    """The comparison as text: one row per offer, its total (to the dollar, to the cent under
    $100) and that total as a share of the first offer's."""
    totals = fleet_cost(fleet.sandboxes, fleet.hours, fleet.cpu, fleet.memory_gib, offers)
    base = totals[offers[0].name]
    header = ["offer", "what", "$/vCPU-h", "$/GiB-h", "$/sandbox-h", "total", f"vs {offers[0].name}"]
    rows = [
        [
            o.name,
            o.description,
            f"{o.vcpu_hour:.5g}",
            f"{o.gib_hour:.5g}",
            f"{o.sandbox_hour(fleet.cpu, fleet.memory_gib):.5g}",
            _dollars(totals[o.name]),
            f"{totals[o.name] / base:.1%}" if base else "-",
        ]
        for o in offers
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    left = {0, 1}  # the words; numbers are right-aligned

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    size = f"{fleet.cpu:g} vCPU and {fleet.memory_gib:g} GiB each"
    lines = [
        f"{fleet.sandboxes:,} sandboxes x {fleet.hours:g} h, {size}: {fleet.sandbox_hours:,.0f} sandbox-hours",
        "",
        line(header),
        *(line(r) for r in rows),
        "",
        *(f"{o.name}: {o.source}" for o in offers if o.source),
    ]
    return "\n".join(lines).rstrip()


def _dollars(amount: float) -> str:
    """`$7,078`; `$4.14` under a hundred dollars, where whole dollars would say too little."""
    return f"${amount:,.0f}" if amount >= 100 else f"${amount:,.2f}"
