"""The agent's entry: ``python3 -s -S -B /.orchard/agent/__main__.py (--unix PATH | --tcp HOST:PORT | --pod POD_IP:PORT) [--workdir DIR]``.

Sandboxes run this file by its path (`orchard.env.bundle`: the bundle holds this package as
``/.orchard/agent``), so here it is a script, not a module of its package: it takes its own
folder off ``sys.path`` (its modules are the package's, not top-level ones), puts the folder
holding the package after the standard library (which nothing of it may shadow), and imports
the package by its folder's name. As ``python -m orchard.env.agent`` it imports its own package.
"""

import os
import sys

if __package__:  # python -m orchard.env.agent
    from .server import main
else:  # run by its path, as sandboxes do
    package = os.path.dirname(os.path.realpath(__file__))
    if sys.path and os.path.realpath(sys.path[0]) == package:
        del sys.path[0]
    sys.path.append(os.path.dirname(package))
    main = __import__(f"{os.path.basename(package)}.server", fromlist=["main"]).main

if __name__ == "__main__":
    sys.exit(main())
