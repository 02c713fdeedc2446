"""What the grader protects, as data: rules, a reward's integrity defaults, the settings.

A ground-floor package: it imports nothing else of uniagent, so the contract
(:mod:`uniagent.specs`), the config and the grader can all build on it.
"""
