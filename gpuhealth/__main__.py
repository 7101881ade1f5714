"""`python -m gpuhealth`: the `gpuhealth` command, whose parser lives above every layer.

The one import from the core upwards, declared in the layers contract (pyproject.toml): a
`__main__` module is only ever run, never imported, so nothing in the core depends on it.
"""

import sys

from gpuhealth_cli.main import main

sys.exit(main())
