"""The `workerHost` actions: exec, files and HTTP fetches on this machine."""
