"""The exec policy engine and the shipped default policy.

Empty until the exec issue lands: with no engine, the worker offers no exec action
at all (an unknown action), rather than a permissive placeholder.
"""
