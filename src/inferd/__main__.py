import sys

from inferd.cli.main import main

sys.exit(main())
