# Makes the project root importable when the tests are run with plain `pytest`.
