"""Plugins shipped with the core, registered through the same hooks as external ones."""
