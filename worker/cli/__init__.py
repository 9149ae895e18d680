"""The `agentworker` command line."""
