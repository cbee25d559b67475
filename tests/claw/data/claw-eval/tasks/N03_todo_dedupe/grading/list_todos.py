"""Print the to-do service's final list (run in the sandbox after the agent's turn, for the grader)."""

import json
import urllib.request

request = urllib.request.Request(
    "http://127.0.0.1:9102/todo/tasks", data=b"{}", headers={"Content-Type": "application/json"}, method="POST"
)
print(json.dumps(json.loads(urllib.request.urlopen(request, timeout=10).read())))
