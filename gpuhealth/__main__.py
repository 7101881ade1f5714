import sys

from gpuhealth.cli import main

sys.exit(main())
