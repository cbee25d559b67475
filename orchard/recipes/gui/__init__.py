"""Orchard-GUI: a browser agent working web pages from screenshots (or the page as text)."""

from orchard.recipes import Recipe

RECIPE = Recipe(
    name="gui",
    title="Orchard-GUI",
    about="browser tasks",
    kinds={"gui": "orchard.gui.task:GuiTask", "miniwob": "orchard.gui.miniwob:MiniWobTask"},
    harnesses={"computer": "orchard.gui.harnesses:ComputerHarness", "bid": "orchard.gui.harnesses:BidHarness"},
    schemes={"miniwob": "orchard.gui.miniwob:read_spec"},
    example_tasks="gui/tasks.json",
    example_config="configs/gui-tiny.yaml",
)
