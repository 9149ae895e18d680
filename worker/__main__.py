import sys

from worker.cli.main import main

sys.exit(main())
