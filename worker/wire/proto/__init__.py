"""Generated from agentworker.proto by `make proto`; do not edit the *_pb2* files."""
