import sys

from benchmarks.gpu_check.driver import main

sys.exit(main())
