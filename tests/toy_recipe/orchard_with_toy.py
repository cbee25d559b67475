"""`orchard` with the toy recipe in the table: `python orchard_with_toy.py ARGS...` is `orchard ARGS...`.

Adding a recipe is one line in `orchard.recipes.RECIPES`; this makes that line at run time, before
anything reads the table, so the test need not edit the source tree."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import orchard.recipes

orchard.recipes.RECIPES["toy"] = "toy:RECIPE"  # the one line

from orchard.cli import main  # noqa: E402

main()
