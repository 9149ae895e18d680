"""The Textual TUI: approvals, the live view of calls, plans and grants, the kill switch.

The only package that imports textual (an import-linter contract holds the rest
of the project to it). It sits on the worker's console (worker.console) through a
Link, so the same app runs inside `agentworker up`/`run` and as `agentworker ui`.
"""
