import sys

from tirbyoc.app.cli import main

sys.exit(main())
