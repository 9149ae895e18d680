"""What workerHost.http_fetch (../http_fetch.py) runs on, loaded on its first call:
the request on httpx (`request`), the URL guard (`ssrf`), the transport pinned to
the address the guard approved (`pinned`) and the capped body reader (`body`).

A package, so the worker's start does not import it: `worker.actions.build`
imports each action's module for its SPEC, and httpx was the largest import of a
worker's start.
"""
