"""The exec agent that runs inside every sandbox (`server.py`: stdlib only, one file)."""

from pathlib import Path

AGENT_SOURCE = Path(__file__).with_name("server.py")
"""The agent's source file, which the bundle carries into sandboxes."""
