"""Modules Orchard's programs run *inside* sandboxes.

Everything here is standard library only, one file a module, importing its modules at the top. A
program in a sandbox is copied in with the modules it imports beside it, and imports them as
`orchard.env.sandboxed.NAME` on the host and as `NAME` there.

* `httpd`: the HTTP/1.1 server of the Claw services (`orchard/recipes/claw/server.py`) and the
  GUI sites (`orchard/recipes/gui/site.py`).
"""
