"""`python -m protogen`: regenerate what is stale (protogen.codegen)."""

import sys

from protogen.codegen import main

sys.exit(main())
