"""A uniagent plugin; its hook and example are in ``plugin.py``."""
