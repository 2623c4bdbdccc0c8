"""`python -m phyfarm_mail` is `phyfarm watch`."""

import sys

from .watch import main

sys.exit(main())
