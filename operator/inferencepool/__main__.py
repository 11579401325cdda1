import sys

from inferencepool.cli import main

sys.exit(main())
