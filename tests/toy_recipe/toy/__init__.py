"""Orchard-Toy: a fourth recipe in one folder, to prove the seam (`tests/test_toy_recipe.py`).

It follows `docs/architecture.md`'s checklist for a new recipe: a task kind (`wordcount`: count
the words of a file the image ships, write the number to `answer.txt`), a harness (`line`: one
shell command per reply, `DONE` to submit), an image (`orchard/toy:words`: the static busybox
image with the files, built offline) and one line in `orchard.recipes.RECIPES`.
"""

from orchard.recipes import Recipe

RECIPE = Recipe(
    name="toy",
    title="Orchard-Toy",
    about="word counts",
    kinds={"wordcount": "toy.task:WordCountTask"},
    harnesses={"line": "toy.harness:LineHarness"},
    images={"toy": "toy.image:build_image"},
)
