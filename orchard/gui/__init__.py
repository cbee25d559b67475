"""Orchard-GUI: browser agents on web pages served inside their sandbox.

Chromium runs inside a sandbox (the `orchard/browser` image, its network `blocked`); the host drives
it over the DevTools protocol, carried by the sandbox's exec agent (`Sandbox.connect`), never
through a host port: `cdp` is the protocol client and `browser` the `Browser` an agent acts on
(clicks and keys at viewport coordinates, screenshots, tabs, the page's interactive elements).
Everything the browser sends is the sandbox's, bounded and checked on the host.
"""
