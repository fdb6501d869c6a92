import sys

from tirbyoc.app.commands.cli import main

if __name__ == "__main__":  # a worker process (spawned by a sweep's engine) imports this module too
    sys.exit(main())
