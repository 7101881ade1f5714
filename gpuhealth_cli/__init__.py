"""The `gpuhealth` command line: the top of the layers, above every part it dispatches to.

`main` registers the product's subcommands always and the test harness's only where its
packages import (a source checkout set up with `make setup`); `docs/ARCHITECTURE.md`,
"Packaging", says what the wheel, the extras and the image hold. Nothing imports this package
except `gpuhealth/__main__.py`, the `python -m gpuhealth` door.
"""
