"""Orchard: build, train and evaluate LLM agents on isolated sandboxes."""

__version__ = "0.1.0"
