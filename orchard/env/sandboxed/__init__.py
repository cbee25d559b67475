"""Modules Orchard's programs import *inside* sandboxes, where they run on the bundle's interpreter.

Everything here is standard library only, one file a module, importing its modules at the top (the
bundle carries what they import: `orchard.env.bundle.SERVER_MODULES`). A program in a sandbox (the
Claw services, a GUI site) is copied in with the modules it imports beside it and started with
`orchard.env.bundle.sandbox_python`, so the image needs no Python of its own; it imports them as
`orchard.env.sandboxed.NAME` on the host and as `NAME` there.

* `httpd`: the HTTP/1.1 server of the Claw services (`orchard/recipes/claw/server.py`) and the
  GUI sites (`orchard/recipes/gui/site.py`).
"""
