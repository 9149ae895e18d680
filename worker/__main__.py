import sys

from worker.cli.main import entry

sys.exit(entry())
