"""``python -m autoloader.cli``: the same as the ``autotune`` console script."""
import sys

from .main import main

sys.exit(main())
