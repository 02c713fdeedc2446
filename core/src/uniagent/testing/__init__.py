"""Helpers for testing uniagent and its plugins (the conformance kit)."""
