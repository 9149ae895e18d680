"""The Textual TUI: approvals, live invocations, kill switch, grants.

Only this package imports `textual`; the headless worker never loads it.
"""
