"""Quick start: run real commands in sandboxes through a running `orchard up` service.

    orchard up && python examples/quickstart.py && orchard down

The same code runs embedded (no service) when ORCHARD_URL is unset and no service runs:
`Client()` then starts its own manager on the local Docker engine.
"""

from orchard.config import BASE_IMAGE
from orchard.env import Client
from orchard.env.discovery import running_service_url

BUSYBOX = "orchard/busybox:static"  # no Python, no libc: the agent brings its own runtime

with Client(url=running_service_url()) as client:
    print(f"talking to {client.url or 'an embedded manager'}")
    for image in (BASE_IMAGE, BUSYBOX):
        with client.create(image) as box:
            result = box.exec(
                "echo hello from $(hostname); ls /bin | wc -l; (python3 --version || echo 'no python3') 2>&1"
            )
            print(f"[{image}] sandbox {box.id}, exit {result.exit_code}:")
            print("   " + result.stdout.strip().replace("\n", "\n   "))
    with client.create(BASE_IMAGE) as box:
        box.write_file("hello.py", "print('hi from a file written by the SDK')\n")
        print(box.exec(["python3", "hello.py"]).stdout.strip())
        interfaces = box.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | xargs").stdout.split()
        print(f"network interfaces (blocked by default): {interfaces}")
