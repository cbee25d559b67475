"""Orchard-GUI: a browser agent working web pages from screenshots (or the page as text).

Chromium runs inside a sandbox (the `orchard/browser` image, its network `blocked`); the host drives
it over the DevTools protocol, carried by the sandbox's exec agent (`Sandbox.connect`), never
through a host port: `cdp` is the protocol client and `browser` the `Browser` an agent acts on
(clicks and keys at viewport coordinates, screenshots, tabs, the page's interactive elements).
Everything the browser sends is the sandbox's, bounded and checked on the host.
"""

from orchard.recipes import Example, Recipe

RECIPE = Recipe(
    name="gui",
    title="Orchard-GUI",
    about="browser tasks",
    kinds={"gui": "orchard.recipes.gui.task:GuiTask", "miniwob": "orchard.recipes.gui.miniwob:MiniWobTask"},
    harnesses={
        "computer": "orchard.recipes.gui.harnesses:ComputerHarness",
        "bid": "orchard.recipes.gui.harnesses:BidHarness",
    },
    schemes={"miniwob": "orchard.recipes.gui.miniwob:read_spec"},
    images={"browser": "orchard.recipes.gui.image:build_image", "miniwob": "orchard.recipes.gui.miniwob:build_image"},
    example=Example(tasks="gui/tasks.json", config="configs/gui-tiny.yaml", images=("browser",)),
)
