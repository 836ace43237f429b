import sys

from jaxtop.cli import main

sys.exit(main())
