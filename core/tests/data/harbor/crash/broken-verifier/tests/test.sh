#!/bin/bash
# Broken for everyone: it crashes (no reward file) whether or not the task is solved.
echo "verifier broke: cannot import its test library" >&2
exit 3
