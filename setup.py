"""The one thing pyproject.toml cannot say: the checkout's `examples/` ships in the wheel as
`orchard/_examples/` (the demo's tasks and configs, the GUI sites, the tiny model's vocabulary),
so an install outside a checkout runs what the README shows (`orchard.config.examples_folder`)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["orchard", "orchard.*"]), "orchard._examples"],
    package_dir={"orchard._examples": "examples"},
)
