"""A measuring process started by :func:`.processes.measure_in_fresh_process`: the JSON request in
``argv[1]``, the answer as one JSON line on stdout."""

import json
import os
import sys

from .processes import measure_request

print(json.dumps({"value": measure_request(json.loads(sys.argv[1])), "pid": os.getpid()}))
