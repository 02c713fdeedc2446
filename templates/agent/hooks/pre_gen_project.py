"""Stop early, with instructions, when the plugin name cannot become Python names."""

import re
import sys

RECORD_NAME = "{{ cookiecutter.__record_name }}"

if not re.fullmatch(r"[a-z][a-z0-9_]*", RECORD_NAME):
    sys.exit(
        "error: plugin_name must start with a letter and use letters, digits, spaces, "
        f"'-' or '_' (e.g. hello or hello_world); got {RECORD_NAME!r}"
    )
